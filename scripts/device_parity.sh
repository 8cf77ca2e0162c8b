#!/usr/bin/env bash
# One command for the GPU machine (issue 6): build with CUDA for sm_90, run ctest, the whole Python
# suite (CPU tests + the CUDA parity suite), compute-sanitizer memcheck (reduced parity + C++ CUDA
# tests) and racecheck (C++ tests of the shared-memory kernels), and the GPU benchmark rows. Logs and summary.json go to $OUT (or ./device_out):
# at most 8 files (the device tool returns no more): summary.json, build.txt (environment, build,
# backend info), ctest.txt, pytest.txt, memcheck.txt, racecheck.txt, bench.txt, bench_results.json.
#
#   OUT=/tmp/out bash scripts/device_parity.sh            # everything (~10 min budget)
#   SKIP_BENCH=1 SKIP_SANITIZER=1 bash scripts/device_parity.sh
#   SKIP_BENCH=1 SANITIZE=full bash scripts/device_parity.sh   # memcheck / racecheck of every CUDA test
#
# Environment: CUDA_ARCH (default 90), JOBS (default nproc), PYTEST_ARGS (extra pytest arguments),
# LATTICE_SHARED_DIR (the shared/ folder with bench/workloads.py and data/, when carried).
set -uo pipefail
OUT=${OUT:-device_out}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
JOBS=${JOBS:-$(nproc)}
BUILD=build-device
if [ -z "${LATTICE_SHARED_DIR:-}" ] && [ -d shared/bench ]; then export LATTICE_SHARED_DIR=$PWD/shared; fi
export PYTHONUNBUFFERED=1
export LATTICE_EXTENSION_DIR=$PWD/$BUILD/py
export LATTICE_BUILD_DIR=$PWD/$BUILD  # the architecture test's nm symbol check reads this build
export PYTHONPATH=$PWD/python:$PWD/tests
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start ))s] $*"; }

{
  nvidia-smi -L
  python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
  cmake --version | head -1; g++ --version | head -1; nvcc --version | tail -1
  command -v compute-sanitizer || echo "compute-sanitizer: not found"
} > "$OUT/build.txt" 2>&1

stamp "build"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLATTICE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DBLIS_ROOT="$PWD/.deps/blis/usr" -Dnlohmann_json_DIR="$PWD/.deps/nlohmann/usr/share/cmake/nlohmann_json" \
  -DLATTICE_PYTHON_OUTPUT_DIR="$PWD/$BUILD/py" -DPython_EXECUTABLE="$(command -v python3)" >> "$OUT/build.txt" 2>&1 &&
  cmake --build "$BUILD" -j "$JOBS" -- -k 0 >> "$OUT/build.txt" 2>&1
build_rc=$?
echo "build rc=$build_rc" >> "$OUT/build.txt"
python3 -c "import lattice; print(lattice.backend_info()); print(lattice.device_caps())" >> "$OUT/build.txt" 2>&1

ctest_rc=-1
if [ -x "$BUILD/lattice_cpp_tests" ]; then
  stamp "ctest"
  (cd "$BUILD" && ctest -j 8 --output-on-failure) > "$OUT/ctest.txt" 2>&1
  ctest_rc=$?
fi

stamp "pytest (CPU suite + CUDA parity)"
python3 -m pytest -q -p no:cacheprovider -rs --durations=15 tests/oracle tests/python ${PYTEST_ARGS:-} \
  > "$OUT/pytest.txt" 2>&1
pytest_rc=$?
tail -3 "$OUT/pytest.txt"

san_mem_rc=-1; san_race_rc=-1
if [ -z "${SKIP_SANITIZER:-}" ]; then
  if command -v compute-sanitizer > /dev/null; then
    # SANITIZE=full: memcheck over every CUDA Python test (the whole `-k "cuda or Cuda"` selection,
    # parity cases not reduced) and racecheck over every C++ CUDA test plus the implicit-GEMM
    # Python cases; longer than one device call's 10 minutes, so run it in a call of its own.
    # Default: the reduced parity set and the shared-memory kernels' small C++ tests.
    if [ "${SANITIZE:-reduced}" = full ]; then
      stamp "compute-sanitizer memcheck (every CUDA Python test)"
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
        --leak-check no --error-exitcode 99 --print-limit 50 \
        python3 -m pytest -q -p no:cacheprovider -k "cuda or Cuda" tests/python > "$OUT/memcheck.txt" 2>&1
    else
      SAN_TESTS="tests/python/test_cuda_parity.py tests/python/test_cuda_python.py"
      stamp "compute-sanitizer memcheck (reduced parity)"
      # torch's caching allocator hides out-of-bounds accesses inside its pooled blocks: plain cudaMalloc
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 LATTICE_PARITY_REDUCED=1 compute-sanitizer --tool memcheck \
        --leak-check no --error-exitcode 99 --print-limit 50 \
        python3 -m pytest -q -p no:cacheprovider -x $SAN_TESTS > "$OUT/memcheck.txt" 2>&1
    fi
    san_mem_rc=$?
    stamp "compute-sanitizer memcheck (C++ CUDA tests)"
    (cd "$BUILD" && compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 50 \
      ./lattice_cpp_tests --gtest_filter='Cuda*') >> "$OUT/memcheck.txt" 2>&1
    [ $? -ne 0 ] && san_mem_rc=99
    # racecheck (shared-memory hazards) is slow on cuBLAS and on large tests: it runs the C++ tests
    # of every kernel that uses shared memory, at sizes that finish in minutes.
    stamp "compute-sanitizer racecheck (C++ CUDA tests with shared memory)"
    if [ "${SANITIZE:-reduced}" = full ]; then
      RACE_FILTER='Cuda*'
    else
      RACE_FILTER='CudaConv.ImplicitGemmSm80RacecheckSmall:CudaQuantized.LinearMatchesDequantizedMatmul:CudaPool.*:CudaPointVoxel.*:CudaCoords.*:CudaAlgebra.Align*:CudaRelations.AllKindsMatchCpuOnSmall*'
    fi
    (cd "$BUILD" && compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 99 \
      --print-limit 50 ./lattice_cpp_tests --gtest_filter="$RACE_FILTER") > "$OUT/racecheck.txt" 2>&1
    san_race_rc=$?
    if [ "${SANITIZE:-reduced}" = full ]; then
      stamp "compute-sanitizer racecheck (implicit-GEMM Python cases)"
      compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 99 --print-limit 50 \
        python3 -m pytest -q -p no:cacheprovider tests/python/test_gemm_order.py >> "$OUT/racecheck.txt" 2>&1
      [ $? -ne 0 ] && san_race_rc=99
    fi
    tail -2 "$OUT/memcheck.txt" "$OUT/racecheck.txt"
  else
    echo "compute-sanitizer not found: sanitizer runs skipped" | tee "$OUT/memcheck.txt" > "$OUT/racecheck.txt"
  fi
fi

bench_rc=-1
if [ -z "${SKIP_BENCH:-}" ]; then
  stamp "bench (gpu preset)"
  python3 -m lattice.bench --preset gpu --output "${TMPDIR:-/tmp}/lattice_bench_gpu" > "$OUT/bench.txt" 2>&1
  bench_rc=$?
  cp "${TMPDIR:-/tmp}/lattice_bench_gpu/results.json" "$OUT/bench_results.json" 2>/dev/null
  tail -25 "$OUT/bench.txt"
fi

python3 - "$OUT" "$build_rc" "$ctest_rc" "$pytest_rc" "$san_mem_rc" "$san_race_rc" "$bench_rc" "$(( $(date +%s) - start ))" <<'EOF'
import json, re, sys
from pathlib import Path
out = Path(sys.argv[1])
names = ("build", "ctest", "pytest", "memcheck", "racecheck", "bench")
rcs = dict(zip(names, (int(v) for v in sys.argv[2:8])))
def read(name):
    p = out / name
    return p.read_text(errors="replace") if p.exists() else ""
summary = {"rc": rcs, "elapsed_s": int(sys.argv[8])}
m = re.findall(r"=+ (.*?) in ([\d.]+)s", read("pytest.txt"))
summary["pytest"] = m[-1][0] if m else None
parity = re.findall(r"(\d+) (passed|failed|skipped|error)", summary["pytest"] or "")
summary["pytest_counts"] = {k: int(v) for v, k in parity}
for tool in ("memcheck", "racecheck"):
    text = read(f"{tool}.txt")
    e = re.findall(r"ERROR SUMMARY: (\d+) error", text)
    summary[f"{tool}_errors"] = int(e[-1]) if e else None
    t = re.findall(r"=+ (.*?) in ([\d.]+)s", text)
    summary[f"{tool}_pytest"] = t[-1][0] if t else None
bench = out / "bench_results.json"
if bench.exists():
    doc = json.loads(bench.read_text())
    rows = []
    for r in doc.get("results", []):
        row = {"name": r["name"], "status": r["status"], "route": r.get("route")}
        for k, t in (r.get("timings") or {}).items():
            if k in ("hot", "cold", "fwd_bwd", "inference", "train_step"):
                row[k + "_ms"] = round(t["median_ms"], 4)
        for k, a in ((r.get("anchor") or {}).get("ratios") or {}).items():
            row[k + "_anchor_ms"] = a["anchor_ms"]
        rows.append(row)
    summary["bench"] = rows
    summary["ceilings"] = {k: doc.get("ceilings", {}).get(k) for k in ("gemm_flops", "copy_bytes_per_s", "gemm_dtype")}
(out / "summary.json").write_text(json.dumps(summary, indent=1))
print(json.dumps({k: v for k, v in summary.items() if k != "bench"}, indent=1))
EOF
