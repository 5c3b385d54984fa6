// Built instead of device_collectives.cu when DTENSOR_WITH_CUDA is off: no tensor
// can be on a GPU then, so only a backend called directly with a CUDA buffer
// device gets here.
#include <stdexcept>
#include <string>

#include "comm/threads/device_collectives.h"

namespace dtensor::comm::threads {

struct DeviceCall {};

namespace {
[[noreturn]] void no_cuda(const std::string& what) {
  throw std::runtime_error("[threads] buffers on " + what +
                           " but this dtensor was built without CUDA; reconfigure with -DDTENSOR_WITH_CUDA=ON");
}
}  // namespace

std::shared_ptr<DeviceCall> begin_device_call(Device device) { no_cuda(device.to_string()); }
// Not reached (no call gets a DeviceCall here); they fail the same way if they were.
void wait_device_call(const DeviceCall&) { no_cuda("a GPU"); }
void device_p2p_copy(const DeviceCall&, const DeviceCall&, void*, const void*, size_t) { no_cuda("a GPU"); }
bool device_call_finished(const DeviceCall&) { no_cuda("a GPU"); }
void device_all_reduce(ThreadsGroup&) { no_cuda("a GPU"); }
void device_all_gather(ThreadsGroup&) { no_cuda("a GPU"); }
void device_reduce_scatter(ThreadsGroup&) { no_cuda("a GPU"); }
void device_all_to_all(ThreadsGroup&) { no_cuda("a GPU"); }
void device_all_to_all_blocks(ThreadsGroup&) { no_cuda("a GPU"); }
void device_broadcast(ThreadsGroup&) { no_cuda("a GPU"); }
void device_gather(ThreadsGroup&) { no_cuda("a GPU"); }
void device_scatter(ThreadsGroup&) { no_cuda("a GPU"); }

}  // namespace dtensor::comm::threads
