// The threads backend on CUDA buffers (internal): ranks sharing one process move
// data between their GPU buffers with device-to-device copies and reduce with a
// kernel (threads/cuda/device_collectives.cu), queued on each rank's current
// stream. In a build without CUDA begin_device_call throws (the _stub.cpp).
//
// Ordering, per collective call: begin_device_call records `ready` on the caller's stream when
// the call is made (the rank's input and output are then safe to touch from any
// stream); the algorithm makes its stream wait for every peer's `ready`, queues
// its copies or kernel, records `done`, meets its peers at a barrier and makes its
// stream wait for every peer's `done` (a peer may have written this rank's output
// or still read its input), then records `complete`. So everything the caller
// queues on its stream afterwards sees the finished result, and no peer's work on
// this rank's buffers can overlap it. A synchronous call returns once the work is
// queued (stream-ordered, as CUDA ops are); an async one's Work is done once
// `complete` has run on the GPU.
#pragma once

#include <memory>

#include "comm/threads/threads_group.h"

namespace dtensor::comm::threads {

// One rank's CUDA state of one call (the stream and its events).
struct DeviceCall;

// Captures the calling thread's current stream of `device` and records `ready` on it.
std::shared_ptr<DeviceCall> begin_device_call(Device device);
// Blocks until `complete` of the call has run on the GPU.
void wait_device_call(const DeviceCall& call);

// A matched send/recv pair of CUDA buffers (p2p.h), from either poster's thread:
// queues the copy on the receiver's stream after the sender's `ready` and records
// the receiver's `done`; makes the sender's stream wait for it and records the
// sender's `done`. So what either rank queues on its stream afterwards is ordered
// after the transfer (the sender may overwrite or free its buffer; the receiver
// reads the data).
void device_p2p_copy(const DeviceCall& send, const DeviceCall& recv, void* dst, const void* src, size_t bytes);
// Whether `done` of a send or receive has run on the GPU (never blocks).
bool device_call_finished(const DeviceCall& call);

// The algorithms of algorithms.h on CUDA buffers (every rank of the call on CUDA).
void device_all_reduce(ThreadsGroup& group);
void device_all_gather(ThreadsGroup& group);
void device_reduce_scatter(ThreadsGroup& group);
void device_all_to_all(ThreadsGroup& group);
void device_all_to_all_blocks(ThreadsGroup& group);
void device_broadcast(ThreadsGroup& group);
void device_gather(ThreadsGroup& group);
void device_scatter(ThreadsGroup& group);

}  // namespace dtensor::comm::threads
