#!/usr/bin/env bash
# Run on a machine with network (Debian 12): downloads the Debian packages that
# scripts/gpu-check.sh needs beyond the CUDA toolkit, CMake, ninja and g++
# (GoogleTest, Google Benchmark, OpenBLAS, nlohmann-json, CLI11, pkg-config) into .gpu-deps/debs
# (ignored by git). Carry .gpu-deps/debs to the GPU machine with the working tree;
# gpu-check.sh unpacks the packages there into its build folder without installing
# anything.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(libgtest-dev libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libopenblas0
          libgfortran5 libquadmath0 nlohmann-json3-dev libcli11-dev pkgconf pkgconf-bin libpkgconf3
          libbenchmark-dev libbenchmark1debian)
mkdir -p .gpu-deps/debs
cd .gpu-deps/debs
rm -f ./*.deb
apt-get download "${packages[@]}"
du -ch ./*.deb | tail -1
echo "gpu-prepare: carry .gpu-deps/debs (under 64 MiB) with the working tree; then run scripts/gpu-check.sh there"
