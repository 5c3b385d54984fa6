#!/usr/bin/env bash
# The sanitizer and fuzzing jobs of CI (.ci/run, after scripts/run-tests.sh):
#   asan  Clang with -fsanitize=address,undefined and the libFuzzer targets: a
#         representative subset (the communication, fault, mesh,
#         redistribution and local-layout suites, a sample of the CPU kernels for
#         UBSan, the MPI programs; not the stress and two-host tests and the slowest
#         sweep), then every fuzz target for FUZZ_SECONDS (60) from its seed corpus
#         (the planner's target replays random redistributions on thread ranks).
#         The whole suite (`ASAN_SUITES=all`) costs about 20 CPU-minutes more: its
#         42 test programs compile at ~2.4x their release cost and run 6.4 CPU-min.
#   tsan  GCC with -fsanitize=thread, without MPI: the multi-rank suites of the
#         threads backend (communication, faults, meshes, redistribution, checkpoints
#         with their asynchronous saver thread, ZeRO-Offload with the delayed update's
#         optimizer thread) and
#         TSAN_STRESS_SECONDS (60) of the stress test.
# Any report fails the job. `run-sanitizers.sh asan` or `tsan` runs one.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)
supp=$(pwd)/scripts/sanitizers
which=${1:-all}
common=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTENSOR_BUILD_BENCHMARKS=OFF -DDTENSOR_BUILD_EXAMPLES=OFF
        -DDTENSOR_WITH_CUDA=OFF)

if [ "$which" = all ] || [ "$which" = asan ]; then
  echo "== ASan+UBSan (clang) $(date +%T)"
  CC=clang CXX=clang++ cmake -S . -B build-asan "${common[@]}" "-DDTENSOR_SANITIZE=address;undefined" \
    -DDTENSOR_BUILD_FUZZERS=ON >/dev/null
  asan=detect_stack_use_after_return=1:strict_init_order=1
  export LSAN_OPTIONS=suppressions=$supp/lsan.supp
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  # Redistribute.Sampled2x2x2 takes ~5 minutes under ASan (it runs in the release job);
  # the install check links the instrumented library into an uninstrumented program.
  if [ "${ASAN_SUITES:-}" = all ]; then
    cmake --build build-asan -j "$jobs"
    (cd build-asan && ASAN_OPTIONS=$asan ctest --output-on-failure --timeout 600 -j "$jobs" \
      -LE "mpi|stress|install" -E '^Redistribute\.Sampled2x2x2$')
  else
    targets=(test_comm_threads test_comm_faults test_flight_recorder test_device_mesh test_redistribute test_cross_mesh test_dist_create
             test_local_map test_tensor test_views test_nn_kernels
             fuzz_placements fuzz_mesh_spec fuzz_config fuzz_redistribute fuzz_checkpoint)
    # The MPI programs where the build has MPI.
    grep -q '^build test_comm_mpi:' build-asan/build.ninja && targets+=(test_comm_mpi test_dist_mpi mpi_faults)
    cmake --build build-asan -j "$jobs" --target "${targets[@]}"
    suites='Comm/|CommThreads\.|CommFaults\.|FlightRecorder\.|DeviceMesh|Redistribute\.|CrossMesh\.|DistCreate\.|FromLocal\.'
    suites+='|LocalBoundary\.|LocalMap\.|Tensor\.|Views\.|Activation\.|CrossEntropy\.|Embedding\.|NnErrors\.'
    suites+='|Norm\.|Softmax\.|fuzz_[a-z_]+_corpus$'
    (cd build-asan && ASAN_OPTIONS=$asan ctest --output-on-failure --timeout 600 -j "$jobs" \
      -LE "mpi|stress|install" -R "^($suites)" -E '^Redistribute\.Sampled2x2x2$')
  fi
  # Under mpirun without leak checks: Open MPI's components are unloaded at exit, so
  # LeakSanitizer cannot attribute (or suppress) what they allocated once.
  (cd build-asan && ASAN_OPTIONS=$asan:detect_leaks=0 ctest --output-on-failure --timeout 600 -j "$jobs" \
    -L mpi -LE two_hosts)
  echo "== fuzzing $(date +%T)"
  bash scripts/run-fuzzers.sh build-asan "${FUZZ_SECONDS:-60}"
fi

if [ "$which" = all ] || [ "$which" = tsan ]; then
  echo "== TSan (gcc) $(date +%T)"
  CC=gcc CXX=g++ cmake -S . -B build-tsan "${common[@]}" -DDTENSOR_SANITIZE=thread -DDTENSOR_WITH_MPI=OFF >/dev/null
  cmake --build build-tsan -j "$jobs" --target test_comm_threads test_comm_faults test_flight_recorder test_device_mesh test_redistribute \
    test_stress test_checkpoint test_fsdp
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp"
  export DTENSOR_STRESS_SECONDS=${TSAN_STRESS_SECONDS:-60}
  (cd build-tsan && ctest --output-on-failure --timeout 900 -j "$jobs" \
    -R '^(Comm/|CommThreads\.|CommFaults\.|FlightRecorder\.|DeviceMesh\.|Redistribute\.|Checkpoint[A-Za-z]*\.|FsdpOffload\.|stress$)' \
    -E '^Redistribute\.Sampled2x2x2$')
fi
echo "== sanitizers done $(date +%T)"
