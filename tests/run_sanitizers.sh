#!/usr/bin/env bash
# The C++ tests under sanitizers (docs/testing.md): for each argument (default: thread,
# then address,undefined), a RINGTREE_SANITIZE build in build/sanitize-<name> of the test
# programs its label needs, then ctest over that label without the long grid cases:
# ThreadSanitizer runs the `threads` tests, AddressSanitizer and UndefinedBehaviorSanitizer
# the `memory` tests (labels: tests/cpp/CMakeLists.txt). Any report fails the test that
# caused it, in a forked child too, and so the run. The library compiles at -O1 (the
# sanitizers' manuals' level), the test programs at -O0 (tests/cpp/CMakeLists.txt); two
# tests run at a time. Run by tests/run_all.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:${TSAN_OPTIONS:-}"
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:${UBSAN_OPTIONS:-}"

[ $# -gt 0 ] || set -- thread address,undefined
for sanitizers in "$@"; do
  case $sanitizers in
    thread) label=threads ;;
    address | address,undefined | undefined) label=memory ;;
    *) echo "run_sanitizers.sh: unknown sanitizers '$sanitizers'" >&2; exit 2 ;;
  esac
  dir=build/sanitize-${sanitizers//,/-}
  cmake -S . -B "$dir" -G Ninja -DRINGTREE_BUILD_TESTS=ON -DRINGTREE_BUILD_PYTHON=OFF -DRINGTREE_BUILD_BENCHMARKS=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g -DNDEBUG" \
    -DRINGTREE_SANITIZE="$sanitizers" >/dev/null
  cmake --build "$dir" -j 2 --target "tests_$label"
  ctest --test-dir "$dir" --output-on-failure --timeout 180 -j 2 -L "$label" -LE long
done
