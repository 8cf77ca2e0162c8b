#!/usr/bin/env bash
# pip packaging check (issue 13): from a clean clone of HEAD, build a wheel with scikit-build-core,
# install it into a fresh virtualenv that sees the system site packages (Debian's python3-torch),
# and import it from outside the repository; then an editable install. A full C++ rebuild, so it is
# NOT part of `make test`. Usage: scripts/check_pip_install.sh [python] (default /usr/bin/python3);
# CUDA=ON|OFF|AUTO (default OFF), JOBS (default 2).
set -euo pipefail
PY=${1:-/usr/bin/python3}
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
git clone -q "$REPO" "$WORK/src"
export CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-2}
"$PY" -m pip wheel "$WORK/src" --no-deps -w "$WORK/wheel" --config-settings=cmake.define.LATTICE_CUDA="${CUDA:-OFF}"
"$PY" -m venv --system-site-packages "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q --no-deps "$WORK"/wheel/lattice-*.whl
cd "$WORK"
"$WORK/venv/bin/python" - <<'PY'
import torch, lattice
assert "site-packages" in lattice.__file__, lattice.__file__
c = torch.unique(torch.randint(0, 16, (200, 3)), dim=0)
x = lattice.SparseTensor(torch.cat([torch.zeros(len(c), 1, dtype=torch.long), c], 1).int(), torch.randn(len(c), 4))
y = lattice.models.MinkUNet18(num_classes=3, cr=0.25).eval()(x)  # eval: one voxel at stride 16
assert y.feats.shape == (len(c), 3)
print("wheel ok:", lattice.__file__)
PY
"$WORK/venv/bin/python" -m pip install -q --no-deps -e "$WORK/src" --config-settings=cmake.define.LATTICE_CUDA="${CUDA:-OFF}"
"$WORK/venv/bin/python" -c "import lattice, lattice._lattice; assert lattice.__file__.startswith('$WORK/src'); print('editable ok:', lattice.__file__)"
