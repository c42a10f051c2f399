#!/usr/bin/env bash
# Checks the C++ SDK the way a user consumes it: builds examples/cpp with ringtree's source
# through add_subdirectory (as a shared library, BUILD_SHARED_LIBS=ON), installs ringtree into
# fresh prefixes (static from a top-level build; shared from that add_subdirectory build with
# RINGTREE_INSTALL=ON), builds examples/cpp against each with find_package, and runs every
# build with --nproc 3 and under `ringtree-run --no-python` (skipped only when ringtree-run
# is not installed). For the shared library it also checks that only ringtree:: symbols are
# exported. Everything happens in one temporary directory, removed on exit.
# RINGTREE_CONSUMER_STATIC_BUILD names a build tree of the static library already built
# from this source (tests/run_all.sh passes its test build): the static variant installs
# from it instead of building again.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
jobs=${RINGTREE_CHECK_JOBS:-2}
static_build=${RINGTREE_CONSUMER_STATIC_BUILD:-}
[[ -z $static_build ]] || static_build=$(cd "$static_build" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ringtree-consumer.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

step() { echo "check_consumer: $*"; }

# run_example BINARY: the example must print a line per rank and exit 0 in both launch modes.
run_example() {
  local binary=$1
  "$binary" --nproc 3
  if command -v ringtree-run >/dev/null; then
    ringtree-run --nproc-per-node 2 --no-python "$binary"
  else
    step "ringtree-run not found: skipping the launcher run of $binary"
  fi
}

# The shared library is built once, inside the example project through add_subdirectory
# (with RINGTREE_INSTALL=ON, a subproject's way to install it): that build's example is the
# add_subdirectory check, and its install is the shared prefix find_package is checked on.
step "shared: build ringtree and the example via add_subdirectory"
cmake -S "$root/examples/cpp" -B "$tmp/example-subdir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DRINGTREE_SOURCE_DIR="$root" -DBUILD_SHARED_LIBS=ON -DRINGTREE_INSTALL=ON >/dev/null
cmake --build "$tmp/example-subdir" -j "$jobs" >/dev/null
run_example "$tmp/example-subdir/allreduce_example"

for variant in static shared; do
  if [[ $variant == shared ]]; then
    step "shared: install ringtree from the add_subdirectory build"
    build=$tmp/example-subdir
  elif [[ -n $static_build ]]; then
    step "static: install ringtree from $static_build"
    build=$static_build
  else
    step "static: build and install ringtree"
    build=$tmp/build-static
    cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DRINGTREE_BUILD_TESTS=OFF -DRINGTREE_BUILD_BENCHMARKS=OFF -DRINGTREE_BUILD_PYTHON=OFF >/dev/null
    cmake --build "$build" -j "$jobs" >/dev/null
  fi
  cmake --install "$build" --prefix "$tmp/prefix-$variant" >/dev/null
  cfg=$tmp/prefix-$variant/lib/cmake/ringtree
  for f in ringtreeConfig.cmake ringtreeConfigVersion.cmake ringtreeTargets.cmake; do
    [[ -f $cfg/$f ]] || { echo "check_consumer: $cfg/$f was not installed" >&2; exit 1; }
  done

  if [[ $variant == shared && ! -f $tmp/prefix-shared/lib/libringtree.so ]]; then
    echo "check_consumer: the shared install has no lib/libringtree.so" >&2
    exit 1
  fi
  if [[ $variant == shared ]] && command -v nm >/dev/null && command -v c++filt >/dev/null; then
    leaked=$(nm -D --defined-only "$tmp/prefix-shared/lib/libringtree.so" | c++filt |
      grep -v -E ' (ringtree::|(vtable|typeinfo|typeinfo name) for ringtree::)' || true)
    if [[ -n $leaked ]]; then
      echo "check_consumer: libringtree.so exports symbols outside ringtree::" >&2
      echo "$leaked" >&2
      exit 1
    fi
  fi

  step "$variant: example via find_package"
  cmake -S "$root/examples/cpp" -B "$tmp/example-$variant" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$tmp/prefix-$variant" >/dev/null
  cmake --build "$tmp/example-$variant" -j "$jobs" >/dev/null
  run_example "$tmp/example-$variant/allreduce_example"
done

# add_subdirectory with the defaults (a static library, RINGTREE_INSTALL off): configures,
# and installs nothing of ringtree's (configure only: the build is the static library's,
# checked above).
step "static: configure the example via add_subdirectory with the defaults"
cmake -S "$root/examples/cpp" -B "$tmp/example-subdir-static" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DRINGTREE_SOURCE_DIR="$root" >/dev/null
cmake --install "$tmp/example-subdir-static" --prefix "$tmp/prefix-none" >/dev/null
if [[ -e $tmp/prefix-none/lib/cmake/ringtree ]]; then
  echo "check_consumer: ringtree as a subproject installed itself without RINGTREE_INSTALL=ON" >&2
  exit 1
fi

step "all passed"
