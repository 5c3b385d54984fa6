// The MPI backend's group: construction and split, the fingerprint exchange that checks
// calls in the debug mode, and the backend's entry points. Collectives are in
// mpi_collectives.cpp, waits and point-to-point in mpi_requests.cpp.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <numeric>
#include <string_view>

#include "comm/fault_injection.h"
#include "comm/flight_recorder.h"
#include "comm/mpi/mpi_backend.h"
#include "comm/mpi/mpi_group.h"
#include "dtensor/error.h"
#include "util/check.h"

namespace dtensor::comm {
namespace {

bool debug_collectives() {
  static const bool on = [] {
    const char* env = std::getenv("DTENSOR_DEBUG");
    return env && std::string_view(env).find("collectives") != std::string_view::npos;
  }();
  return on;
}

std::string describe_fingerprint(const int64_t* f) {
  if (static_cast<CallKind>(f[0]) == CallKind::AllToAll) {
    if (f[2] == kStridedBlocks)
      return detail::concat("all_to_all(", dtype_name(static_cast<DType>(f[1])), ", strided blocks)");
    if (f[2] < 0) return detail::concat("all_to_all(", dtype_name(static_cast<DType>(f[1])), ", split sizes given)");
    return detail::concat("all_to_all(", dtype_name(static_cast<DType>(f[1])), ", no split sizes, ", f[2],
                          " elements to each rank)");
  }
  return detail::concat(call_kind_name(static_cast<CallKind>(f[0])), "(", dtype_name(static_cast<DType>(f[1])), ", ",
                        f[2], " elements, root ", f[3], ", ", reduce_op_name(static_cast<ReduceOp>(f[4])), ")");
}

}  // namespace

void check_mpi(int code, const char* op) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw std::runtime_error(detail::concat("[", op, "] MPI error: ", std::string(text, length)));
}

int to_int(int64_t v, const char* op) {
  DT_CHECK_SUPPORTED(v <= INT_MAX, op, "the mpi backend moves at most ", INT_MAX, " elements per rank and call, got ",
                     v);
  return static_cast<int>(v);
}

// ---- MPIGroup ----------------------------------------------------------------------------

MPIGroup::MPIGroup(MPI_Comm comm, bool owned, std::string name) : comm_(comm), owned_(owned) {
  name_ = std::move(name);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  {
    MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    MPI_Comm_group(comm_, &mine);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    std::vector<int> ranks(size_);
    std::iota(ranks.begin(), ranks.end(), 0);
    world_ranks_.resize(size_);
    MPI_Group_translate_ranks(mine, size_, ranks.data(), world, world_ranks_.data());
    MPI_Group_free(&mine);
    MPI_Group_free(&world);
  }
  // Errors come back as codes: exceptions for point to point, a job abort naming
  // the call for collectives (instead of MPI's bare abort).
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  if (debug_collectives()) MPI_Comm_dup(comm_, &debug_comm_);
  watched_ = watched_group(name_, rank_, size_);
}

MPIGroup::~MPIGroup() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (debug_comm_ != MPI_COMM_NULL) MPI_Comm_free(&debug_comm_);
  if (owned_) MPI_Comm_free(&comm_);
}

std::shared_ptr<GroupImpl> MPIGroup::split(int color, int key) {
  begin(CallKind::Split, DType::F32, 0, 0, ReduceOp::Sum);
  MPI_Comm child = MPI_COMM_NULL;
  int code = MPI_SUCCESS;
  {
    Watch watch(watched_, "split", calls_, timeout_);
    code = MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &child);
  }
  if (code != MPI_SUCCESS) collective_failed("split", code);
  const int index = splits_++;
  if (child == MPI_COMM_NULL) return nullptr;
  std::string child_name = detail::concat(name_, "/c", color);
  if (index > 0) child_name += detail::concat(".", index);
  auto group = std::make_shared<MPIGroup>(child, true, std::move(child_name));
  group->set_timeout(timeout_);
  return group;
}

// ---- MPIGroup: call fingerprints ---------------------------------------------------------

void MPIGroup::begin(CallKind kind, DType dtype, int64_t count, int root, ReduceOp op) {
  const char* name = call_kind_name(kind);
  check_usable(name);
  reap_abandoned();
  ++calls_;
  if (debug_comm_ == MPI_COMM_NULL || size_ == 1) return;
  // Heap-held: if a peer never comes, the requests may outlive this call (abandoned).
  struct Fingerprints {
    int64_t mine[5];
    std::vector<int64_t> theirs;
  };
  auto f = std::make_shared<Fingerprints>(
      Fingerprints{{static_cast<int64_t>(kind), static_cast<int64_t>(dtype), count, root, static_cast<int64_t>(op)},
                   std::vector<int64_t>(5 * static_cast<size_t>(size_))});
  std::vector<MPI_Request> requests;
  std::vector<int> peers;  // >= 0: a receive from that rank; -1: a send
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    requests.emplace_back();
    MPI_Irecv(&f->theirs[5 * p], 5, MPI_INT64_T, p, 0, debug_comm_, &requests.back());
    peers.push_back(p);
    requests.emplace_back();
    MPI_Isend(f->mine, 5, MPI_INT64_T, p, 0, debug_comm_, &requests.back());
    peers.push_back(-1);
  }
  try {
    wait_all(requests, name, false, [&](size_t i) {
      return peers[i] >= 0 ? detail::concat("rank ", peers[i], " did not arrive; ") : std::string();
    });
  } catch (...) {
    abandon(std::move(requests), f, true);
    throw;
  }
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || std::equal(f->mine, f->mine + 5, &f->theirs[5 * p])) continue;
    throw std::invalid_argument(detail::concat("[", name, "] ranks made different calls in group '", name_, "': rank ",
                                               rank_, " called ", describe_fingerprint(f->mine), ", rank ", p,
                                               " called ", describe_fingerprint(&f->theirs[5 * p])));
  }
}

// ---- entry points ------------------------------------------------------------------------

bool mpi_compiled() { return true; }

bool started_by_mpi_launcher() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"}) {
    if (std::getenv(var)) return true;
  }
  return false;
}

std::shared_ptr<GroupImpl> mpi_world() {
  static const std::shared_ptr<MPIGroup> world = [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "init");
    }
    // The exit handler is registered before `world` is constructed, so it runs after
    // world's destructor; it finalises MPI only when dtensor initialised it.
    install_process_handlers(!initialized);
    auto group = std::make_shared<MPIGroup>(MPI_COMM_WORLD, false, "world");
    group->set_flight_recorder(FlightRecorder::make(group->rank(), group->size(), "mpi"));
    arm_process_faults(fault_spec_from_env(), group->rank());
    return group;
  }();
  return world;
}

}  // namespace dtensor::comm
