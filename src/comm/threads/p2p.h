// Point-to-point matching of the threads backend. A posted send or receive waits in
// the receiving rank's mailbox until its partner is posted; whichever side comes
// second copies sender memory to receiver memory directly, so posting never
// blocks and a batch can never deadlock, whatever the order of its operations.
// A wait that fails (timeout, abort, a partner that returned, a deadlock through the
// wait-for graph, another request of the batch that met a partner of another size)
// takes its unmatched requests back out of the mailbox, so no late partner touches
// its buffers and none matches a later call's request.
//
// CUDA buffers (both sides on a GPU; a CPU buffer and a CUDA one do not match):
// posting records `ready` on the poster's current stream; the copy is queued on
// the receiver's stream after the sender's `ready`, then the sender's stream waits
// for it (device_p2p_copy). So a wait() returns once the transfer is ordered on
// the poster's stream, as a CUDA op is, and is_completed() says whether it has run
// on the GPU (then its buffers may be dropped).
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "comm/comm_backend.h"
#include "comm/threads/signal.h"

namespace dtensor::comm::threads {

struct DeviceCall;

struct P2PRequest {
  P2PBuffer buffer;                         // buffer.peer: the other rank
  int owner = 0;                            // the rank that posted it
  std::shared_ptr<Signal> signal;           // its owner's mailbox signal
  std::string error;                        // set before `done` when the partner disagrees
  bool device_failure = false;              // the error is a CUDA call's, not the partners' disagreement
  std::shared_ptr<DeviceCall> device_call;  // a CUDA buffer's stream and events
  std::string user_call;                    // the user-level call it serves (call_context.h), for messages
  std::atomic<bool> done{false};
  // The tensors of a Work dropped before completion: the request lives in the
  // mailbox until matched, and so do they.
  std::shared_ptr<void> buffers;
};

class Mailbox {
 public:
  std::mutex mutex;
  std::deque<std::shared_ptr<P2PRequest>> sends;  // to this rank, not yet matched
  std::deque<std::shared_ptr<P2PRequest>> recvs;  // by this rank, not yet matched
  std::shared_ptr<Signal> signal = std::make_shared<Signal>();
};

}  // namespace dtensor::comm::threads
