#!/usr/bin/env bash
# The GPU check: ONE command for a machine with a GPU, the CUDA toolkit, CMake,
# ninja and g++ (no network). Builds the library and the CUDA tests only (device
# code for DTENSOR_CUDA_ARCHITECTURES, default 90), runs every CUDA test with
# DTENSOR_REQUIRE_GPU=1 (a skip is a failure there) beside the CPU tests of the
# allocator policy and the launch arithmetic, runs gpu_bench, and writes the
# summary to $OUT/gpu-check.md (OUT defaults to ./gpu-check-out). train_gpt runs
# every parallel module on CUDA tensors (ranks sharing the GPU, and nccl with a GPU
# per rank where there are several) against the same run on the CPU.
# What the machine lacks (GoogleTest, OpenBLAS, nlohmann-json, CLI11) comes from
# .gpu-deps/debs, prepared beforehand by scripts/gpu-prepare.sh and carried along
# (carry .gpu-deps/debs only: 13 MB; GoogleTest, Google Benchmark, OpenBLAS,
# nlohmann-json, CLI11, pkgconf); the packages are unpacked into the build
# folder, nothing is installed. $OUT gets gpu-check.md (the summary), tests.txt
# (every test program's output), gpu-check.log (configure and build) and
# gpu-bench.json (gpu_bench's headline figures) and torch-peer.json (the PyTorch peer's).
#   bash scripts/gpu-check.sh            # a few minutes on 16 cores (each part bounded by a timeout)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${OUT:-$root/gpu-check-out}
mkdir -p "$out"
build=${GPU_CHECK_BUILD_DIR:-$root/build-gpu}
archs=${DTENSOR_CUDA_ARCHITECTURES:-90}
jobs=$(nproc)
summary=$out/gpu-check.md
log=$out/gpu-check.log
: >"$log"
say() { echo "$*" | tee -a "$summary"; }
: >"$summary"
start=$(date +%s)

say "# dtensor GPU check $(date -u +%FT%TZ)"
say ""
say "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
say "- GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1 || echo 'nvidia-smi not found')"
say "- CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') ($jobs cores)"
nvcc=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
say "- nvcc: $("$nvcc" --version 2>/dev/null | tail -1), cmake $(cmake --version | head -1 | awk '{print $3}'), architectures $archs"
say "- host: $(g++ --version 2>/dev/null | head -1), $(ldd --version 2>/dev/null | head -1)"

# ---- dependencies from the carried packages ------------------------------------------
prefix_args=()
if [ -d .gpu-deps/debs ] && ls .gpu-deps/debs/*.deb >/dev/null 2>&1; then
  # Unpacked beside the build, keyed by its own path: the .pc files get absolute paths.
  p=$build/deps
  # Keyed by its path and the package list: a folder unpacked from fewer packages
  # (an older gpu-prepare.sh) is unpacked again.
  marker="$p $(ls .gpu-deps/debs | tr '\n' ' ')"
  if [ "$(cat "$p/.unpacked" 2>/dev/null)" != "$marker" ]; then
    rm -rf "$p" && mkdir -p "$p"
    for deb in .gpu-deps/debs/*.deb; do
      if command -v dpkg-deb >/dev/null; then
        dpkg-deb -x "$deb" "$p"
      else  # not Debian: a .deb is an ar archive holding data.tar.*
        tmp=$(mktemp -d) && (cd "$tmp" && ar x "$root/$deb" && tar -xf data.tar.* -C "$p") && rm -rf "$tmp"
      fi
    done
    # The .pc files name /usr (prefix=/usr, or libdir=/usr/... outright); point them
    # at the unpacked tree.
    find "$p" -name '*.pc' -exec sed -i "s|^\([A-Za-z_]*\)=/usr|\1=$p/usr|" {} +
    echo "$marker" >"$p/.unpacked"
  fi
  multiarch=$p/usr/lib/x86_64-linux-gnu
  export PKG_CONFIG_PATH=$multiarch/openblas-pthread/pkgconfig:$multiarch/pkgconfig:$p/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export LD_LIBRARY_PATH=$multiarch/openblas-pthread:$multiarch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  prefix_args=(-DCMAKE_PREFIX_PATH="$p/usr")
  if [ -x "$p/usr/bin/pkgconf" ]; then
    prefix_args+=(-DPKG_CONFIG_EXECUTABLE="$p/usr/bin/pkgconf")
    export LD_LIBRARY_PATH=$multiarch:$LD_LIBRARY_PATH
  fi
  say "- dependencies: unpacked from .gpu-deps/debs ($(ls .gpu-deps/debs/*.deb | wc -l) packages)"
else
  say "- dependencies: the system's (no .gpu-deps/debs; scripts/gpu-prepare.sh makes it)"
fi

if ! command -v pkg-config >/dev/null && [ ! -x "${p:-/nonexistent}/usr/bin/pkgconf" ]; then
  say "- pkg-config: missing (the build finds OpenBLAS through it); scripts/gpu-prepare.sh carries pkgconf"
  exit 1
fi

# ---- build: the library, the CUDA tests and gpu_bench only ---------------------------
targets=(dtensor test_cuda_runtime test_cuda_elementwise test_cuda_matmul test_cuda_nn test_cuda_optim test_cuda_factories
         test_cuda_attention test_cuda_comm test_caching_allocator test_offset_calc test_gemm_layout test_row_ops test_attention_tiles
         test_random_shared test_cuda_training test_cuda_conformance test_cuda_nccl test_nccl_support gpu_bench train_gpt bench_collectives)
t0=$(date +%s)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTENSOR_WITH_CUDA=ON \
  -DDTENSOR_CUDA_ARCHITECTURES="$archs" -DCMAKE_CUDA_COMPILER="$nvcc" -DDTENSOR_WITH_MPI=OFF \
  -DDTENSOR_WITH_NCCL=AUTO -DDTENSOR_WITH_ONEDNN=OFF -DDTENSOR_WITH_BLIS=OFF -DDTENSOR_BUILD_EXAMPLES=ON \
  -DDTENSOR_TORCH_PYTHON= "${prefix_args[@]}" >>"$log" 2>&1 &&
  cmake --build "$build" -j "$jobs" --target "${targets[@]}" >>"$log" 2>&1
build_rc=$?
say "- build: $([ $build_rc -eq 0 ] && echo ok || echo FAILED) in $(($(date +%s) - t0)) s (log: gpu-check.log)"
if [ $build_rc -ne 0 ]; then
  tail -40 "$log" | tee -a "$summary"
  exit 1
fi
cu_obj=$(find "$build" -name 'elementwise.cu.o' | head -1)
[ -n "$cu_obj" ] && say "- device code: $(du -k "$cu_obj" | cut -f1) KiB in elementwise.cu.o"

# ---- tests -----------------------------------------------------------------------------
say ""
say "## Tests"
say ""
test_rc=0
: >"$out/tests.txt"
for t in test_cuda_runtime test_cuda_elementwise test_cuda_matmul test_cuda_nn test_cuda_optim test_cuda_factories \
  test_cuda_attention test_cuda_comm test_caching_allocator test_offset_calc test_gemm_layout test_row_ops test_attention_tiles \
  test_random_shared test_cuda_training test_cuda_conformance test_cuda_nccl test_nccl_support; do
  # 90 s each keeps the whole check inside one device call even when a suite hangs.
  DTENSOR_REQUIRE_GPU=1 timeout 90 "$build/tests/$t" >"$build/$t.txt" 2>&1
  rc=$?
  { echo "===== $t (rc $rc)"; cat "$build/$t.txt"; } >>"$out/tests.txt"
  [ $rc -ne 0 ] && test_rc=1
  line=$(grep -E '^\[  (PASSED|FAILED)  \] [0-9]+ tests?[,.]|^\[  SKIPPED \] [0-9]+ tests?,' "$build/$t.txt" | tr '\n' ' ')
  say "- $t: $([ $rc -eq 0 ] && echo ok || echo "FAILED (rc $rc)") $line"
  [ $rc -ne 0 ] && grep -B2 -A12 'Failure' "$build/$t.txt" | head -60 | tee -a "$summary"
done

# ---- train_gpt on the GPU against the same run on the CPU -------------------------------
say ""
say "## train_gpt on CUDA tensors (losses against the CPU run, 8 steps)"
say ""
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
gpus=${gpus:-0}
# train NAME CPU-FLAGS -- GPU-FLAGS: the same model and data, the loss of every step
# compared (FP32 on both; summation orders differ, so within 1e-3 relative).
train() {
  local name=$1; shift
  local cpu=() gpu=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do cpu+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  gpu=("$@")
  local common=(--steps 8 --log plain --warmup 2 --layers 2 --dim 64 --heads 4 --seq-len 32 --batch 16)
  timeout 60 "$build/examples/train_gpt" "${common[@]}" "${cpu[@]}" --out "$build/$name-cpu.csv" >"$build/$name-cpu.txt" 2>&1
  local crc=$?
  timeout 90 "$build/examples/train_gpt" "${common[@]}" "${cpu[@]}" "${gpu[@]}" --out "$build/$name-gpu.csv" \
    >"$build/$name-gpu.txt" 2>&1
  local grc=$?
  { echo "===== train_gpt $name (cpu rc $crc, gpu rc $grc)"; cat "$build/$name-cpu.txt" "$build/$name-gpu.txt"; } >>"$out/tests.txt"
  local verdict
  if [ $crc -ne 0 ] || [ $grc -ne 0 ]; then
    verdict="FAILED (cpu rc $crc, gpu rc $grc): $(grep -h -m1 'train_gpt:' "$build/$name-gpu.txt" "$build/$name-cpu.txt" | head -1)"
    test_rc=1
  else
    # A NaN or inf loss, a step missing on one side or out of step fails (a NaN
    # compares false with everything, so it is looked for by name).
    verdict=$(paste -d, "$build/$name-cpu.csv" "$build/$name-gpu.csv" | awk -F, 'NR > 1 {
      n++
      if ($1 != $5 || $2 ~ /[nN][aA][nN]|[iI][nN][fF]/ || $6 ~ /[nN][aA][nN]|[iI][nN][fF]/) { bad = 1; next }
      d = $2 - $6; if (d < 0) d = -d; r = d / ($2 > 0 ? $2 : 1)
      if (!(r <= 1e-3)) bad = 1
      if (r > worst) worst = r }
      END { if (n != 8) { printf "FAILED (%d steps logged, expected 8)", n; exit }
            printf "%s (largest relative loss difference %.1e over %d steps)", bad ? "FAILED" : "ok", worst, n }')
    case $verdict in FAILED*) test_rc=1 ;; esac
  fi
  say "- $name: $verdict; $(grep -m1 -o 'done: .*tok/s' "$build/$name-gpu.txt")"
}
# Several ranks (threads) on one GPU: every parallel module on CUDA tensors.
train dp2-one-gpu --mesh dp=2 -- --device cuda
train fsdp3-tp-one-gpu --mesh dp=2,tp=2 --fsdp 3 -- --device cuda
train hsdp-one-gpu --mesh replicate=2,dp=2 --fsdp 2 --hsdp -- --device cuda
train offload-one-gpu --mesh dp=2 --fsdp 3 --offload -- --device cuda
train pp-1f1b-one-gpu --mesh pp=2 --microbatches 4 -- --device cuda
train 3d-one-gpu --mesh pp=2,dp=2,tp=2 --microbatches 4 -- --device cuda
train cp-one-gpu --mesh dp=2,cp=2 -- --device cuda
train ep-one-gpu --mesh dp=2,ep=2 --moe-experts 4 -- --device cuda
# nccl: a thread per GPU in this process (a world of one where there is one GPU).
train nccl-world-of-1 --mesh dp=1 -- --backend nccl
if [ "$gpus" -ge 2 ]; then
  train nccl-ddp --mesh dp=2 -- --backend nccl
  train nccl-fsdp3 --mesh dp=2 --fsdp 3 -- --backend nccl
  train nccl-tp --mesh tp=2 --sequence-parallel -- --backend nccl
  train nccl-pp --mesh pp=2 --microbatches 4 -- --backend nccl
fi
if [ "$gpus" -ge 4 ]; then
  train nccl-fsdp-tp --mesh dp=2,tp=2 --fsdp 3 -- --backend nccl
  train nccl-hsdp --mesh replicate=2,dp=2 --fsdp 2 --hsdp -- --backend nccl
fi
if [ "$gpus" -ge 8 ]; then
  train nccl-3d --mesh pp=2,dp=2,tp=2 --microbatches 4 -- --backend nccl
fi
[ "$gpus" -lt 2 ] && say "- nccl across GPUs: not run ($gpus GPU visible)"

# ---- benchmarks ------------------------------------------------------------------------
say ""
say "## gpu_bench"
say ""
# The table is rewritten after every section, so a timeout keeps what was measured.
timeout 200 "$build/bench/gpu_bench" "$build/gpu-bench.md" "$out/gpu-bench.json" >>"$log" 2>&1
bench_rc=$?
if [ -f "$build/gpu-bench.md" ]; then cat "$build/gpu-bench.md" | tee -a "$summary"; else say "gpu_bench FAILED (rc $bench_rc)"; fi

# ---- nccl bandwidth, beside nccl-tests' where it is installed ------------------------------
if [ "$gpus" -ge 2 ]; then
  say ""
  say "## bench_collectives --nccl ($gpus GPUs)"
  say ""
  worlds=2
  [ "$gpus" -gt 2 ] && worlds=2,$gpus
  timeout 150 "$build/bench/bench_collectives" --nccl --max-mib=256 --worlds=$worlds >"$build/nccl-bench.md" 2>>"$log"
  say "(exit status $?)"
  tee -a "$summary" <"$build/nccl-bench.md"
  if command -v all_reduce_perf >/dev/null; then
    say ""
    say "nccl-tests all_reduce_perf, the same sizes:"
    timeout 60 all_reduce_perf -b 4K -e 256M -f 4 -g "$gpus" 2>&1 | grep -v '^#  *Rank' | tee -a "$summary"
  else
    say "nccl-tests (all_reduce_perf) not installed: no figure of its own beside these"
  fi
fi

# ---- the same-run PyTorch peer (its failure does not fail the check) ---------------------
say ""
say "## PyTorch peer (same run)"
say ""
if python3 -c 'import torch' >/dev/null 2>&1; then
  timeout 240 python3 bench/peers/torch_gpu_peer.py --json "$out/torch-peer.json" >"$build/torch-peer.md" 2>>"$log"
  say "(peer exit status $?)"
  tee -a "$summary" <"$build/torch-peer.md"
else
  say "PyTorch not installed: no peer figures"
fi
say ""
say "total: $(($(date +%s) - start)) s; tests $([ $test_rc -eq 0 ] && echo passed || echo FAILED)"
[ $test_rc -eq 0 ] && [ $bench_rc -eq 0 ]
