// The public point-to-point calls: send, recv and batches of them.
#include "comm/collective_args.h"
#include "comm/reduce.h"
#include "dtensor/comm_debug.h"
#include "util/check.h"

namespace dtensor {
namespace {

using namespace comm;

Work send_recv_impl(const Group& group, const std::vector<P2POp>& ops) {
  const char* kOp = "batch_send_recv";
  comm::GroupImpl& backend = backend_of(group, kOp);
  std::vector<comm::P2PBuffer> buffers;
  std::vector<Tensor> keep;
  std::vector<Output> copies;  // receives into non-contiguous tensors
  std::vector<FlightToken> records;
  for (const P2POp& op : ops) {
    const bool is_send = op.kind == P2POp::Kind::Send;
    const char* name = is_send ? "send" : "recv";
    check_tensor(group, op.tensor, name, name);
    DT_CHECK_ARG(op.peer >= 0 && op.peer < group.size(), name, "peer must be in [0, ", group.size(), "), got ",
                 op.peer);
    FlightToken record = begin_call(name, group, static_cast<int64_t>(op.tensor.nbytes()),
                                    {.dtype = op.tensor.dtype(),
                                     .in_count = is_send ? op.tensor.numel() : 0,
                                     .out_count = is_send ? 0 : op.tensor.numel(),
                                     .peer = op.peer,
                                     .tag = op.tag,
                                     .async = true});
    if (record) records.push_back(std::move(record));
    Tensor buffer = is_send ? op.tensor.contiguous() : writable(op.tensor).buffer;
    if (!is_send && !op.tensor.is_contiguous()) copies.push_back({op.tensor, buffer});
    keep.push_back(buffer);
    buffers.push_back({is_send, buffer.data_ptr(), static_cast<int64_t>(buffer.nbytes()), buffer.dtype(), op.peer,
                       op.tag, buffer.device()});
  }
  WorkPtr inner;
  try {
    inner = backend.send_recv(buffers);
  } catch (...) {
    for (FlightToken& record : records) record.failed();
    throw;
  }
  return Work(
      std::make_shared<FinishingWork>(std::move(inner), std::move(keep), std::move(copies), std::move(records)));
}

}  // namespace

void send(const Group& group, const Tensor& tensor, int dst, int tag) { send_async(group, tensor, dst, tag).wait(); }

void recv(const Group& group, const Tensor& tensor, int src, int tag) { recv_async(group, tensor, src, tag).wait(); }

Work send_async(const Group& group, const Tensor& tensor, int dst, int tag) {
  return send_recv_impl(group, {P2POp::send(tensor, dst, tag)});
}

Work recv_async(const Group& group, const Tensor& tensor, int src, int tag) {
  return send_recv_impl(group, {P2POp::recv(tensor, src, tag)});
}

Work batch_send_recv_async(const Group& group, const std::vector<P2POp>& ops) { return send_recv_impl(group, ops); }

void batch_send_recv(const Group& group, const std::vector<P2POp>& ops) { send_recv_impl(group, ops).wait(); }

}  // namespace dtensor
