// Where a tensor's memory lives.
#pragma once

#include <cstdint>
#include <string>

namespace dtensor {

enum class DeviceType : uint8_t { CPU, CUDA };

// The CPU has two devices over the same host memory, counted apart (as JAX's host
// platform devices): cpu:0, where CPU tensors live by default, and cpu:1, which
// stands in for a GPU's host where there is no GPU: offloading (FSDP's
// OffloadPolicy) keeps its host side there, so that a CPU run keeps the device's and
// the host's bytes apart (memory_stats per device) and copies between them as on a GPU.
struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static constexpr int kCpuDevices = 2;

  static Device cpu(int index = 0) { return {DeviceType::CPU, index}; }
  static Device cuda(int index = 0) { return {DeviceType::CUDA, index}; }

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device&) const = default;
  std::string to_string() const;  // "cpu", "cuda:1"
};

// True when this build has CUDA support and a GPU is present; never throws.
bool cuda_is_available();
// Number of visible GPUs (0 without CUDA support or without a driver).
int cuda_device_count();

}  // namespace dtensor
