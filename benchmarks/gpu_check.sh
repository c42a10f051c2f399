#!/usr/bin/env bash
# The one command for a machine with a GPU: bash benchmarks/gpu_check.sh
#
# Builds and installs ringtree with its CUDA library, runs the GPU tests (Python, and the
# C++ ones when GoogleTest is there) and the GPU benchmarks, and writes everything under
# $OUT (default ./gpu_check_out): one log per step (NN-<step>.log), the benchmarks' JSON,
# steps.tsv (step, status, rc, seconds) and summary.md (the table of steps with their key
# numbers, then the details). Sized for 8 minutes on one H200: every step has its own
# timeout, and no step starts past the budget (RINGTREE_GPU_CHECK_BUDGET_S, 480 s); steps
# run in order of importance, so the C++ tests (which repeat the Python kernel tests'
# checks) are the ones left out when time runs short. A failed step never stops the
# others. Uses only what is on the machine: no package is downloaded.
#
# Dry run (RINGTREE_GPU_CHECK_DRY_RUN=1, or automatically when nvidia-smi lists no GPU):
# no pip install (the installed package is used); every step still runs, and the ones
# that need a GPU report "skipped" with the reason.
#
# Prebuilt (RINGTREE_GPU_CHECK_PREBUILT=DIR, made by benchmarks/gpu_prebuild.sh on a machine
# with nvcc but no GPU): the wheel in DIR is installed instead of building one, and DIR's
# reduce_kernels_test (beside its libringtree_cuda.so) is run instead of building the C++
# tests. A wheel that does not import here falls back to the build from source.
#
# Environment: OUT, PYTHON (python, else python3), RINGTREE_GPU_CHECK_BUDGET_S,
# RINGTREE_GPU_CHECK_DRY_RUN, RINGTREE_GPU_CHECK_PREBUILT, RINGTREE_GPU_CHECK_BUILD_DIR (the
# C++ tests' CMake build folder, build/gpu). Exit status: 0 when no step failed or timed
# out, else 1.

set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-./gpu_check_out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BUDGET_S=${RINGTREE_GPU_CHECK_BUDGET_S:-480}
BUILD_DIR=${RINGTREE_GPU_CHECK_BUILD_DIR:-build/gpu}
PYTHON=${PYTHON:-$(command -v python || command -v python3)}
PREBUILT=${RINGTREE_GPU_CHECK_PREBUILT:-}
[ -n "$PREBUILT" ] && PREBUILT=$(cd "$PREBUILT" && pwd)
SUMMARY_RESERVE_S=15
STARTED=$(date +%s)
STEPS="$OUT/steps.tsv"
rm -f "$OUT"/[0-9][0-9]-*.log "$OUT"/*.json "$OUT"/test_cuda.xml "$OUT"/summary.md
: > "$STEPS"
STEP_NO=0
export OUT ROOT PYTHON BUILD_DIR PREBUILT

DRY=0
DRY_WHY=""
if [ "${RINGTREE_GPU_CHECK_DRY_RUN:-0}" = "1" ]; then
  DRY=1
  DRY_WHY="RINGTREE_GPU_CHECK_DRY_RUN=1"
elif ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  DRY=1
  DRY_WHY="nvidia-smi lists no GPU"
fi
export DRY DRY_WHY

# run_step NAME TIMEOUT_S FUNCTION: runs FUNCTION (exported) under its own timeout (never
# past the budget), its output in NN-NAME.log (STEP_LOG in its environment), and records
# status, rc and seconds. A function that prints "skipped: <why>" as its last line and
# returns 0 is "skipped".
run_step() {
  local name=$1 limit=$2 fn=$3
  STEP_NO=$((STEP_NO + 1))
  local log
  log=$(printf '%s/%02d-%s.log' "$OUT" "$STEP_NO" "$name")
  local left=$((BUDGET_S - SUMMARY_RESERVE_S - ($(date +%s) - STARTED)))
  if [ "$left" -lt 10 ]; then
    echo "skipped: the time budget (${BUDGET_S} s) is spent" > "$log"
    printf '%s\tskipped: time budget spent\t-\t0\t%s\n' "$name" "$log" >> "$STEPS"
    echo "== $name: skipped (time budget spent)"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (timeout ${limit} s) -> $log"
  local t0 t1 rc status
  t0=$(date +%s.%N)
  STEP_LOG=$log timeout -k 10 "$limit" bash -c "$fn" > "$log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  local secs
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  local last
  last=$(grep -v '^[[:space:]]*$' "$log" | tail -n 1)
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    status="TIMEOUT after ${limit} s"
  elif [ "$rc" -ne 0 ]; then
    status="FAILED"
  elif [[ "$last" == skipped:* ]]; then
    status="$last"
  else
    status="ok"
  fi
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$secs" "$log" >> "$STEPS"
  echo "   $status (rc $rc, ${secs} s)"
}

skip_step() {  # skip_step NAME WHY: records a step that did not run
  STEP_NO=$((STEP_NO + 1))
  local log
  log=$(printf '%s/%02d-%s.log' "$OUT" "$STEP_NO" "$1")
  echo "skipped: $2" > "$log"
  printf '%s\tskipped: %s\t-\t0\t%s\n' "$1" "$2" "$log" >> "$STEPS"
  echo "== $1: skipped ($2)"
}

# --- the steps (each runs in its own bash, in $ROOT) -----------------------------------------

step_env() {
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  host: $(hostname)  cores: $(nproc)"
  [ "$DRY" = 1 ] && echo "dry run: $DRY_WHY"
  nvidia-smi -L || echo "nvidia-smi: no GPU listed"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>/dev/null
  "$PYTHON" - <<'EOF'
import importlib, platform, sys
print("python", platform.python_version(), sys.executable)
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())
    try:
        print("torch's nccl", ".".join(map(str, torch.cuda.nccl.version())))
    except Exception as exc:
        print("torch's nccl: unavailable:", exc)
except ImportError as exc:
    print("torch: not installed:", exc)
for name in ("cupy", "numpy", "pytest", "ringtree"):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", "?"), getattr(module, "__file__", ""))
    except Exception as exc:
        print(f"{name}: not importable: {exc}")
try:
    from importlib import metadata
    for dist in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "scikit-build-core", "pybind11"):
        try:
            print(dist, metadata.version(dist))
        except metadata.PackageNotFoundError:
            print(dist, "not installed")
except Exception as exc:
    print("package metadata:", exc)
EOF
  nvcc --version 2>/dev/null | tail -n 2 || echo "nvcc: not found"
  cmake --version 2>/dev/null | head -n 1 || echo "cmake: not found"
  ninja --version 2>/dev/null | sed 's/^/ninja /' || echo "ninja: not found"
}

step_install() {
  local wheel
  wheel=$(ls "$PREBUILT"/ringtree-*.whl 2>/dev/null | head -n 1)
  if [ -n "$wheel" ]; then
    echo "installing the prebuilt $wheel"
    if "$PYTHON" -m pip install --no-deps --no-index --force-reinstall "$wheel" &&
      (cd /tmp && "$PYTHON" -c "import ringtree._C; print('imports:', ringtree._C.__file__)"); then
      return 0
    fi
    echo "the prebuilt wheel does not install or import here: building from source"
  fi
  export SKBUILD_CMAKE_DEFINE="RINGTREE_USE_CUDA=ON"
  export CMAKE_BUILD_PARALLEL_LEVEL
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
  "$PYTHON" -m pip install --no-build-isolation --no-deps --no-index -v .
}

step_cuda_status() {
  "$PYTHON" - <<'EOF'
import os, sys
import ringtree, ringtree.cuda as cuda
from ringtree import _C
print("ringtree", getattr(ringtree, "__version__", "?"), os.path.dirname(ringtree.__file__))
print("cuda status:", _C._cuda_status())
print("nccl status:", _C._nccl_status())
print("is_available:", cuda.is_available(), " device_count:", cuda.device_count())
print("is_nccl_available:", cuda.is_nccl_available())
if cuda.is_nccl_available():
    print("nccl_version:", ".".join(map(str, cuda.nccl_version())), " nccl_path:", cuda.nccl_path())
reason = cuda.unavailable_reason()
print("unavailable_reason:", reason or "-")
if not cuda.is_available():
    if os.environ.get("DRY") == "1":
        print("skipped: ringtree's CUDA path is unavailable here (see unavailable_reason)")
        sys.exit(0)
    sys.exit(1)  # a GPU machine where ringtree cannot use the GPU
EOF
}

step_python_tests() {
  if "$PYTHON" -c "import pytest" 2>/dev/null; then
    local per_test=()  # a hung test fails alone instead of spending the step
    "$PYTHON" -c "import pytest_timeout" 2>/dev/null && per_test=(--timeout 200)
    "$PYTHON" -m pytest tests/python/test_cuda.py -v -rA -p no:cacheprovider "${per_test[@]}" \
      --junitxml="$OUT/test_cuda.xml"
  else
    echo "pytest is not importable: running the file as a program"
    "$PYTHON" tests/python/test_cuda.py
  fi
  local rc=$?
  # Every test skipped (the module's own skip; pytest then exits with 5, "no tests ran"): say so.
  local log=$STEP_LOG
  if { [ "$rc" -eq 0 ] || [ "$rc" -eq 5 ]; } && ! grep -Eq '(^PASS |[0-9]+ (passed|failed))' "$log" &&
    grep -Eq '(^SKIP |[0-9]+ skipped)' "$log"; then
    rc=0
    local why
    why=$(grep -Eo '(^SKIP [^:]*: .*|SKIPPED \[[0-9]+\] [^:]*:[0-9]+: .*)' "$log" | head -n 1 |
      sed -E 's/^(SKIP [^:]*|SKIPPED \[[0-9]+\] [^:]*:[0-9]+): //')
    echo "skipped: ${why:-every test skipped}"
  fi
  return $rc
}

step_kernel_bench() {
  "$PYTHON" benchmarks/cuda_kernel_bench.py --sizes 16M,64M,256M,1G --dtypes float32,bfloat16,float16,int32 \
    -n 20 -w 3 --json "$OUT/kernel_bench.json"
}

# ringtree-bench stops with status 2 and one line when --device cuda cannot run here
# (after checking the command line); in a dry run that is a skip.
bench() {
  local json=$1
  shift
  "$PYTHON" -m ringtree.bench "$@" -J "$json"
  local rc=$?
  if [ "$rc" -eq 2 ] && [ "$DRY" = 1 ] && ! grep -q '^usage:' "$STEP_LOG"; then
    echo "skipped: $(grep -o 'error: .*' "$STEP_LOG" | tail -n 1 | sed 's/^error: //;s/;.*//') (command line accepted)"
    return 0
  fi
  return $rc
}

step_bench_nproc1() {
  bench "$OUT/bench_nproc1.json" allreduce allgather reduce_scatter broadcast \
    --device cuda --nproc 1 -b 8 -e 256M -f 4 -n 50 -w 5 --compare nccl --timeout 200
}

step_bench_shared() {
  # One GPU for both ranks (CUDA_VISIBLE_DEVICES=0 even where there are more): the staged path.
  CUDA_VISIBLE_DEVICES=0 RINGTREE_CUDA_BACKEND=auto bench \
    "$OUT/bench_shared_nproc2.json" allreduce allgather \
    --device cuda --nproc 2 --allow-shared-gpu -b 8 -e 16M -f 4 -n 20 -w 3 --timeout 120
}

gtest_found() {  # whether CMake finds GoogleTest (its GTestConfig, or FindGTest's libraries)
  local probe="$OUT/gtest_probe"
  mkdir -p "$probe"
  printf 'cmake_minimum_required(VERSION 3.18)\nproject(probe CXX)\nfind_package(GTest REQUIRED)\n' \
    > "$probe/CMakeLists.txt"
  cmake -S "$probe" -B "$probe/build" > "$probe/cmake.log" 2>&1
}

step_cpp_build() {
  local generator=()
  command -v ninja > /dev/null && generator=(-G Ninja)
  cmake -S . -B "$BUILD_DIR" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DRINGTREE_USE_CUDA=ON \
    -DRINGTREE_BUILD_TESTS=ON -DRINGTREE_BUILD_PYTHON=OFF &&
    cmake --build "$BUILD_DIR" --target reduce_kernels_test cuda_backend_test -j "$(nproc)"
}

step_cpp_reduce_kernels() {
  local binary
  if [ -x "$PREBUILT/reduce_kernels_test" ]; then
    binary=$PREBUILT/reduce_kernels_test
    export LD_LIBRARY_PATH="$PREBUILT${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  else
    binary=$(find "$BUILD_DIR" -type f -name reduce_kernels_test -perm -u+x | head -n 1)
  fi
  [ -n "$binary" ] || { echo "reduce_kernels_test was not built"; return 1; }
  "$binary"
  local rc=$?
  if [ "$rc" -eq 0 ] && [ "$DRY" = 1 ]; then
    echo "skipped: no GPU here (the device tests skipped; the others passed)"
  fi
  return $rc
}

step_cpp_cuda_backend() {
  local binary
  binary=$(find "$BUILD_DIR" -type f -name cuda_backend_test -perm -u+x | head -n 1)
  [ -n "$binary" ] || { echo "cuda_backend_test was not built"; return 1; }
  "$binary"
}

export -f step_env step_install step_cuda_status step_python_tests step_kernel_bench bench step_bench_nproc1 \
  step_bench_shared step_cpp_build step_cpp_reduce_kernels step_cpp_cuda_backend

echo "gpu_check: output in $OUT, budget ${BUDGET_S} s$([ "$DRY" = 1 ] && echo ", DRY RUN: $DRY_WHY")"
run_step env 60 step_env
if [ "$DRY" = 1 ]; then
  skip_step install "dry run: the installed package is used"
else
  run_step install 360 step_install
fi
run_step cuda-status 60 step_cuda_status
run_step python-tests 300 step_python_tests
run_step kernel-bench 120 step_kernel_bench
run_step bench-nproc1 240 step_bench_nproc1
run_step bench-shared-nproc2 150 step_bench_shared
if [ -x "$PREBUILT/reduce_kernels_test" ]; then
  skip_step cpp-build "prebuilt: $PREBUILT/reduce_kernels_test"
  run_step cpp-reduce_kernels_test 180 step_cpp_reduce_kernels
  skip_step cpp-cuda_backend_test "not prebuilt (it runs on the CUDA stand-in, in every ctest run)"
elif gtest_found; then
  run_step cpp-build 300 step_cpp_build
  run_step cpp-reduce_kernels_test 180 step_cpp_reduce_kernels
  run_step cpp-cuda_backend_test 180 step_cpp_cuda_backend
else
  for name in cpp-build cpp-reduce_kernels_test cpp-cuda_backend_test; do
    skip_step "$name" "GoogleTest not found by CMake (see $OUT/gtest_probe/cmake.log)"
  done
fi

# --- summary.md ---------------------------------------------------------------------------------

"$PYTHON" - "$OUT" "$DRY" "$DRY_WHY" "$(( $(date +%s) - STARTED ))" <<'EOF'
import json, os, re, sys
out, dry, dry_why, elapsed = sys.argv[1], sys.argv[2] == "1", sys.argv[3], sys.argv[4]
steps = []
with open(os.path.join(out, "steps.tsv")) as f:
    for line in f:
        name, status, rc, secs, log = line.rstrip("\n").split("\t")
        steps.append({"name": name, "status": status, "rc": rc, "secs": float(secs), "log": log})


def text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def size_text(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):g} {unit}"
    return f"{n} B"


def test_counts(log):
    lines = [l for l in log.splitlines() if re.search(r"\d+ (passed|failed|skipped)", l)]
    if not lines:
        return ""
    found = re.findall(r"(\d+) (passed|failed|skipped|xfailed|xpassed|errors?)", lines[-1])
    return ", ".join(f"{n} {w}" for n, w in found)


def gtest_counts(log):
    parts = []
    for label, word in (("PASSED", "passed"), ("FAILED", "failed"), ("SKIPPED", "skipped")):
        m = re.search(r"\[\s*" + label + r"\s*\] (\d+) tests?\b", log)
        parts.append(f"{m.group(1) if m else 0} {word}")
    return ", ".join(parts)


def kernel_numbers(result, details):
    if not result:
        return ""
    if "skipped" in result:
        return f"skipped: {result['skipped']}"
    keep = [r for r in result["rows"] if r["bytes"] >= 64 << 20 and r["dtype"] in result["goal"]["dtypes"]]
    best = {}
    for r in keep:
        best[(r["dtype"], r["bytes"])] = r
    big = [r for r in keep if r["bytes"] == max(x["bytes"] for x in keep)] if keep else []
    numbers = "; ".join(f"{r['dtype']} SUM {size_text(r['bytes'])}: {r['reduce_gbps']:.0f} GB/s = "
                        f"{100 * r['ratio']:.0f}% of copy ({r['copy_gbps']:.0f})" for r in big)
    worst = min(keep, key=lambda r: r["ratio"]) if keep else None
    goal = result.get("goal", {})
    verdict = "goal met" if goal.get("met") else "goal MISSED"
    if worst:
        verdict += f" (lowest: {worst['dtype']} {size_text(worst['bytes'])} {100 * worst['ratio']:.1f}%)"
    details.append("### Reduction kernel vs copy (benchmarks/cuda_kernel_bench.py)\n")
    details.append("| dtype | size | reduce GB/s | copy GB/s | % of copy |\n|---|---|---|---|---|")
    for r in result["rows"]:
        details.append(f"| {r['dtype']} {r['op'].upper()} | {size_text(r['bytes'])} | {r['reduce_gbps']:.0f} | "
                       f"{r['copy_gbps']:.0f} | {100 * r['ratio']:.1f}% |")
    details.append("")
    return f"{numbers}; {verdict}"


def bench_numbers(result, title, details, one_rank):
    if not result:
        return ""
    systems = result.get("systems", {})
    rows = {name: s.get("rows") or [] for name, s in systems.items() if s.get("status") == "ok"}
    notes = [f"{name}: {s.get('status')} {' '.join(s.get('notes') or [])}".strip()
             for name, s in systems.items() if s.get("status") != "ok"]
    if "ringtree" not in rows:
        return "; ".join(notes) or "no ringtree rows"
    bw = "algbw" if one_rank else "busbw"  # at one rank busbw is 0 by definition
    details.append(f"### {title}\n")
    head = ["collective", "size", f"ringtree {bw} GB/s", "ringtree time us"]
    for n in rows:
        if n != "ringtree":
            head += [f"{n} {bw} GB/s", f"{n} time us", f"{n} time / ringtree time"]
    head.append("#wrong")
    details.append("| " + " | ".join(head) + " |")
    details.append("|" + "---|" * len(head))
    numbers = []
    for collective in dict.fromkeys(r["collective"] for r in rows["ringtree"]):
        mine = {r["size"]: r for r in rows["ringtree"] if r["collective"] == collective}
        others = {n: {r["size"]: r for r in rs if r["collective"] == collective} for n, rs in rows.items()
                  if n != "ringtree"}
        for size in sorted(mine):
            r = mine[size]
            cells = [collective, size_text(size), f"{(r.get(bw) or 0):.2f}", f"{r['time_us']:.1f}"]
            for n, o in others.items():
                x = o.get(size)
                cells += ([f"{(x.get(bw) or 0):.2f}", f"{x['time_us']:.1f}", f"{x['time_us'] / r['time_us']:.2f}x"]
                          if x else ["-", "-", "-"])
            cells.append(str(r.get("wrong", "-")))
            details.append("| " + " | ".join(cells) + " |")
        small, large = mine[min(mine)], mine[max(mine)]
        text_ = (f"{collective}: {size_text(large['size'])} {(large.get(bw) or 0):.1f} GB/s {bw}, "
                 f"{size_text(small['size'])} {small['time_us']:.1f} us")
        for n, o in others.items():
            x_large, x_small = o.get(large["size"]), o.get(small["size"])
            if x_large and x_small:
                text_ += (f" (vs {n}: {(x_large.get(bw) or 0):.1f} GB/s, {x_small['time_us']:.1f} us)")
        wrong = sum(int(r.get("wrong") or 0) for r in mine.values())
        if wrong:
            text_ += f", {wrong} WRONG elements"
        numbers.append(text_)
    details.append("")
    return "; ".join(numbers + notes)


details = []
lines = []
header = "dry run (" + dry_why + ")" if dry else "full run"
env_log = text(next((s["log"] for s in steps if s["name"] == "env"), ""))
gpu = next((l for l in env_log.splitlines() if l.startswith("GPU ")), "no GPU listed")
lines.append(f"# GPU check: {header}\n")
lines.append(f"{gpu}; total {elapsed} s; logs and JSON in `{out}`\n")
lines.append("| step | status | rc | seconds | key numbers |\n|---|---|---|---|---|")
for s in steps:
    log = text(s["log"])
    key = ""
    if s["name"] == "env":
        picks = [l for l in log.splitlines() if l.startswith(("torch ", "torch's nccl", "cupy", "python "))]
        key = "; ".join(p.split(" /")[0] for p in picks)
    elif s["name"] == "cuda-status":
        picks = [l for l in log.splitlines() if l.startswith(("nccl_version", "is_available", "unavailable_reason"))]
        key = "; ".join(picks)
    elif s["name"] == "python-tests":
        key = test_counts(log)
        failed = re.findall(r"^(?:FAILED |FAIL  )(\S+)", log, re.M)
        if failed:
            key += "; failed: " + ", ".join(failed[:10])
    elif s["name"].startswith("cpp-") and s["name"] != "cpp-build" and "[==========]" in log:
        key = gtest_counts(log)
    elif s["name"] == "kernel-bench":
        key = kernel_numbers(load("kernel_bench.json"), details)
    elif s["name"] == "bench-nproc1":
        key = bench_numbers(load("bench_nproc1.json"), "ringtree vs NCCL, 1 rank (ringtree-bench, algbw)",
                            details, True)
    elif s["name"] == "bench-shared-nproc2":
        key = bench_numbers(load("bench_shared_nproc2.json"), "2 ranks sharing one GPU, staged (ringtree-bench)",
                            details, False)
    if not key and (s["status"] == "FAILED" or s["status"].startswith("TIMEOUT")):
        errors = [l.strip() for l in log.splitlines() if re.search(r"error|Error|FAIL", l)]
        rest = [l.strip() for l in log.splitlines() if l.strip()]
        key = "first error: " + errors[0] if errors else ("last line: " + rest[-1] if rest else "no output")
    key = key if len(key) <= 300 else key[:297] + "..."
    status = s["status"] if len(s["status"]) <= 100 else s["status"][:97] + "..."
    lines.append(f"| {s['name']} | {status} | {s['rc']} | {s['secs']:.0f} | {key.replace('|', '/')} |")
bad = [s["name"] for s in steps if s["status"] == "FAILED" or s["status"].startswith("TIMEOUT")]
lines.append("")
lines.append(f"**{'FAILED: ' + ', '.join(bad) if bad else 'No step failed.'}**\n")
with open(os.path.join(out, "summary.md"), "w") as f:
    f.write("\n".join(lines + details) + "\n")
print("\n".join(lines))
sys.exit(1 if bad else 0)
EOF
exit $?
