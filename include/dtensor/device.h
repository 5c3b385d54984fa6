// Where a tensor's memory lives.
#pragma once

#include <cstdint>
#include <string>

namespace dtensor {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
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
