#!/usr/bin/env bash
# One GPU-machine call for a performance session (issue 12 / 19 work): build lattice for sm_90,
# TorchSparse 2.1 in the background (../shared/bench/gpu_side_by_side.sh), then the checks and
# measurements a change needs, with at most 8 files back under $OUT (the device tool's limit).
#
# Before the call, on the development machine (once per checkout; .anchors and .deps are ignored):
#   bash scripts/fetch_blis.sh
#   mkdir -p .anchors && cp -r ../shared/bench ../shared/anchors ../shared/data .anchors/
#   echo .anchors/ >> .git/info/exclude
# The call (carry [".deps/blis", ".deps/nlohmann", ".anchors"]; ~330 s of wall with everything):
#   OUT=$OUT bash scripts/device_session.sh
# Environment: SKIP_TS=1 (no TorchSparse, no side by side), SKIP_CTEST=1, SKIP_BN=1 (no
# scripts/gpu_batch_norm_check.py), SANITIZE=1 (memcheck + racecheck of the C++ tests in SAN_FILTER,
# each within SAN_S seconds; SAN_PY: pytest arguments also run under memcheck), PROFILE=0 (no scripts/gpu_network_profile.py), PYT (pytest
# files, default tests/python/test_batch_norm.py), PYT_S (their time limit, 120), ROUNDS, WL, CH,
# NET (gpu_side_by_side.sh's), SBS_S (its time limit, 240), EXTRA (a command run after pytest, output in
# extra.txt, EXTRA_S its time limit, 200).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start ))s] $*" | tee -a "$OUT/log.txt"; }
export PYTHONUNBUFFERED=1
if [ -z "${SKIP_TS:-}" ]; then
  ( OUT=$OUT TS_JOBS=6 STEPS=build bash .anchors/bench/gpu_side_by_side.sh > "$OUT/ts_build_rc.txt" 2>&1 ) &
  TS_PID=$!
fi
BUILD=/tmp/build-device
stamp build
if [ ! -f $BUILD/build.ninja ]; then
  cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DLATTICE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DBLIS_ROOT="$PWD/.deps/blis/usr" -Dnlohmann_json_DIR="$PWD/.deps/nlohmann/usr/share/cmake/nlohmann_json" \
    -DLATTICE_PYTHON_OUTPUT_DIR=$BUILD/py -DPython_EXECUTABLE="$(command -v python3)" > "$OUT/build.txt" 2>&1
fi
cmake --build $BUILD -j 10 >> "$OUT/build.txt" 2>&1; echo "build rc=$?" >> "$OUT/build.txt"; tail -3 "$OUT/build.txt"
export LATTICE_EXTENSION_DIR=$BUILD/py PYTHONPATH=$PWD/python:$PWD/tests:$PWD/tests/python LATTICE_SHARED_DIR=$PWD/.anchors
if [ -z "${SKIP_CTEST:-}" ]; then
  stamp ctest
  (cd $BUILD && ctest -j 8 -R "Cuda" 2>&1 | tail -4) > "$OUT/ctest.txt"; cat "$OUT/ctest.txt"
fi
if [ -n "${SANITIZE:-}" ]; then
  # memcheck and racecheck of the C++ CUDA tests named by SAN_FILTER (default: the batch norm
  # kernels' shared-memory tiles and the implicit GEMM's small racecheck case)
  SAN_FILTER=${SAN_FILTER:-'CudaBatchNorm.EqualsCpu*:CudaBatchNorm.TwoRuns*:CudaConv.ImplicitGemmSm80RacecheckSmall'}
  for tool in memcheck racecheck; do
    stamp "compute-sanitizer $tool"
    extra=""; [ $tool = racecheck ] && extra="--racecheck-report all"
    (cd $BUILD && timeout ${SAN_S:-200} compute-sanitizer --tool $tool $extra --error-exitcode 99 --print-limit 30 \
      ./lattice_cpp_tests --gtest_filter="$SAN_FILTER" 2>&1 | tail -25; echo "$tool rc=${PIPESTATUS[0]}") > "$OUT/$tool.txt"
    tail -3 "$OUT/$tool.txt"
  done
  if [ -n "${SAN_PY:-}" ]; then  # memcheck of the pytest selection SAN_PY (plain cudaMalloc: no pooled blocks)
    stamp "compute-sanitizer memcheck: pytest $SAN_PY"
    (PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout ${SAN_S:-200} compute-sanitizer --tool memcheck --leak-check no \
      --error-exitcode 99 --print-limit 30 python3 -m pytest -q -p no:cacheprovider $SAN_PY 2>&1 | tail -8
      echo "memcheck (pytest) rc=${PIPESTATUS[0]}") >> "$OUT/memcheck.txt"
    tail -2 "$OUT/memcheck.txt"
  fi
fi
if [ -z "${SKIP_BN:-}" ]; then
  stamp gpu_batch_norm_check
  timeout 200 python3 scripts/gpu_batch_norm_check.py > "$OUT/bn_kernels.txt" 2>&1; echo "rc=$?" >> "$OUT/bn_kernels.txt"
  grep -E "bitwise|MISMATCH" "$OUT/bn_kernels.txt" | head -20
fi
stamp pytest
timeout ${PYT_S:-120} python3 -m pytest -q -p no:cacheprovider -x ${PYT:-tests/python/test_batch_norm.py} > "$OUT/pytest.txt" 2>&1
echo "pytest rc=$?" >> "$OUT/pytest.txt"; tail -3 "$OUT/pytest.txt"
if [ -n "${EXTRA:-}" ]; then  # one more command (a measurement script), its output in extra.txt
  stamp "extra: $EXTRA"
  timeout ${EXTRA_S:-200} bash -c "$EXTRA" > "$OUT/extra.txt" 2>&1; echo "extra rc=$?" >> "$OUT/extra.txt"; tail -3 "$OUT/extra.txt"
fi
if [ "${PROFILE:-1}" = 1 ]; then
  stamp profile
  timeout 150 python3 scripts/gpu_network_profile.py --workload kitti --out "$OUT/prof" > "$OUT/profile.txt" 2>&1
  echo "rc=$?" >> "$OUT/profile.txt"
fi
if [ -z "${SKIP_TS:-}" ]; then
  stamp "wait torchsparse"
  wait $TS_PID; cat "$OUT/ts_build_rc.txt"
  stamp side_by_side
  OUT=$OUT WL=${WL:-kitti} CH=${CH:-64} NET=${NET:-kitti,lidar_x2} ROUNDS=${ROUNDS:-2} STEPS=run timeout ${SBS_S:-240} \
    bash .anchors/bench/gpu_side_by_side.sh
fi
stamp done
# at most 8 files come back: the small logs go into all.txt
cd "$OUT" && { for f in log.txt ctest.txt memcheck.txt racecheck.txt pytest.txt ts_build_rc.txt; do [ -f $f ] && { echo "== $f"; cat $f; }; done
  [ -f build.txt ] && { echo "== build.txt (tail)"; tail -30 build.txt; }
  [ -f torchsparse_build.txt ] && { echo "== torchsparse_build.txt (tail)"; tail -5 torchsparse_build.txt; }; } > all.txt
rm -f log.txt ctest.txt memcheck.txt racecheck.txt pytest.txt ts_build_rc.txt build.txt torchsparse_build.txt side_by_side.json \
  prof/cprof_infer.txt prof/prof_infer.txt profile_lidar_x2.txt
ls -R "$OUT"
