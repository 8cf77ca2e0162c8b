#!/usr/bin/env bash
# Builds lattice on a GPU machine (its own python3 / torch 2.x, no network) and runs the
# Python test suite there. BLIS comes from an unpacked Debian package tree in .deps/blis
# (scripts/fetch_blis.sh makes it on a Debian machine). Results go to $OUT (or ./device_out).
set -uo pipefail
OUT=${OUT:-device_out}
mkdir -p "$OUT"
{
  nvidia-smi -L
  python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
  cmake --version | head -1; g++ --version | head -1; nvcc --version | tail -1
} > "$OUT/env.txt" 2>&1
cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DLATTICE_CUDA=ON \
  -DBLIS_ROOT="$PWD/.deps/blis/usr" -Dnlohmann_json_DIR="$PWD/.deps/nlohmann/usr/share/cmake/nlohmann_json" -DPython_EXECUTABLE="$(command -v python3)" > "$OUT/build.txt" 2>&1 &&
  cmake --build build-device -j "$(nproc)" -- -k 0 >> "$OUT/build.txt" 2>&1
echo "build rc=$?" >> "$OUT/build.txt"
export PYTHONPATH=$PWD/python
python3 -c "import lattice; print(lattice.backend_info()); print(lattice.device_caps())" > "$OUT/info.txt" 2>&1
if [ -x build-device/lattice_cpp_tests ]; then
  (cd build-device && ctest -j 8 2>&1 | tail -5) > "$OUT/ctest.txt"
fi
python3 -m pytest -q -p no:cacheprovider tests/oracle tests/python ${PYTEST_ARGS:-} > "$OUT/pytest.txt" 2>&1
echo "pytest rc=$?" >> "$OUT/pytest.txt"
tail -3 "$OUT/pytest.txt"
