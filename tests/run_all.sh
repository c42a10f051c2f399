#!/usr/bin/env bash
# ringtree's test command: builds and runs the C++ tests (ctest), then a subset of them under
# sanitizers (tests/run_sanitizers.sh), checks the installed C++ SDK with a consumer project
# (tests/cmake/check_consumer.sh), then runs the Python tests against the installed package.
# Needs GoogleTest, cmake, ninja and an installed ringtree (pip install ".[test]"); .ci/run
# installs all of it on a clean machine.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${RINGTREE_TEST_BUILD_DIR:-build/tests}
cmake -S . -B "$build_dir" -G Ninja -DRINGTREE_BUILD_TESTS=ON -DRINGTREE_BUILD_PYTHON=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build_dir" -j 2
# Two tests at a time, as the sanitizer runs do: every test bounds its waits by deadlines
# that hold on 2 cores shared by two tests.
ctest --test-dir "$build_dir" --output-on-failure --timeout 180 -j 2

# The C++ tests again under ThreadSanitizer and AddressSanitizer + UndefinedBehaviorSanitizer
# (a subset chosen by label; see the script).
tests/run_sanitizers.sh

# The C++ SDK as a user consumes it: install (the static library from the build above),
# find_package / add_subdirectory, run (~1 min).
RINGTREE_CONSUMER_STATIC_BUILD="$build_dir" tests/cmake/check_consumer.sh

# The source tree is not on sys.path from here, so the installed package is what runs.
python -m pytest tests/python -q "$@"
