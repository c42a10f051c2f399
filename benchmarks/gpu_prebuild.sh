#!/usr/bin/env bash
# Builds on a machine with nvcc (no GPU needed) what benchmarks/gpu_check.sh would otherwise
# build on the GPU machine, so that machine's time goes to tests and benchmarks:
#   bash benchmarks/gpu_prebuild.sh DIR [PYTHON]
# DIR gets a ringtree wheel with its CUDA library for PYTHON's version (default python3;
# use the GPU machine's Python version), and reduce_kernels_test beside the
# libringtree_cuda.so it links. Then, there: RINGTREE_GPU_CHECK_PREBUILT=DIR bash
# benchmarks/gpu_check.sh. The wheel is built with build isolation (scikit-build-core and
# pybind11 come from the package index); the C++ test needs GoogleTest found by CMake.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 DIR [PYTHON]" >&2; exit 2; }
DIR=$1
PYTHON=${2:-python3}
BUILD_DIR=build/gpu  # the folder gpu_check.sh builds its C++ tests in
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
rm -f "$DIR"/ringtree-*.whl "$DIR"/reduce_kernels_test "$DIR"/libringtree_cuda.so*

SKBUILD_CMAKE_DEFINE="RINGTREE_USE_CUDA=ON" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
  "$PYTHON" -m pip wheel --no-deps -w "$DIR" .
unzip -l "$DIR"/ringtree-*.whl | grep -q 'libringtree_cuda.so' ||
  { echo "the wheel has no libringtree_cuda.so: is nvcc on the PATH?" >&2; exit 1; }

generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
cmake -S . -B "$BUILD_DIR" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DRINGTREE_USE_CUDA=ON \
  -DRINGTREE_BUILD_TESTS=ON -DRINGTREE_BUILD_PYTHON=OFF
cmake --build "$BUILD_DIR" --target reduce_kernels_test -j "$(nproc)"
cp "$(find "$BUILD_DIR" -type f -name reduce_kernels_test -perm -u+x | head -n 1)" "$DIR/"
cp -L "$(find "$BUILD_DIR" -name 'libringtree_cuda.so' | head -n 1)" "$DIR/"
ls -l "$DIR"
