#!/usr/bin/env bash
# The sanitizer and fuzzing jobs of CI (.ci/run, after scripts/run-tests.sh):
#   asan  Clang with -fsanitize=address,undefined and the libFuzzer targets: the
#         whole CTest suite (but the stress and two-host tests and the slowest
#         sweep, which the release job runs), then every fuzz target for
#         FUZZ_SECONDS (60) from its seed corpus.
#   tsan  GCC with -fsanitize=thread, without MPI: the multi-rank suites of the
#         threads backend (communication, faults, meshes, redistribution) and
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
  cmake --build build-asan -j "$jobs"
  asan=detect_stack_use_after_return=1:strict_init_order=1
  export LSAN_OPTIONS=suppressions=$supp/lsan.supp
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  # Redistribute.Sampled2x2x2 takes ~5 minutes under ASan (it runs in the release job);
  # the install check links the instrumented library into an uninstrumented program.
  (cd build-asan && ASAN_OPTIONS=$asan ctest --output-on-failure --timeout 600 -j "$jobs" \
    -LE "mpi|stress|install" -E '^Redistribute\.Sampled2x2x2$')
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
  cmake --build build-tsan -j "$jobs" --target test_comm_threads test_comm_faults test_device_mesh test_redistribute \
    test_stress
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp"
  export DTENSOR_STRESS_SECONDS=${TSAN_STRESS_SECONDS:-60}
  (cd build-tsan && ctest --output-on-failure --timeout 900 -j "$jobs" \
    -R '^(Comm/|CommThreads\.|CommFaults\.|DeviceMesh\.|Redistribute\.|stress$)' -E '^Redistribute\.Sampled2x2x2$')
fi
echo "== sanitizers done $(date +%T)"
