#!/usr/bin/env bash
# pip packaging check (issue 13), run by .ci/run after `make test`: from a clean clone of HEAD (only
# committed files, no build folder, no extension), into a fresh virtualenv that sees the system
# site packages (Debian's python3-torch: torch is a run-time dependency only),
#
#   1. `pip install <clone>`      one full, fresh CMake build through scikit-build-core; then the
#                                 package is imported and runs a MinkUNet18 from outside the repo;
#   2. `pip wheel <clone>`        the wheel holds the package and the extension; installed into a
#                                 second fresh virtualenv, it imports and runs from outside the repo;
#   3. `pip install -e <clone>`   the editable install imports from the clone.
#
# Why it is fast enough for CI (it took ~18 min before: two full builds, wheel then editable): the
# three pip commands share the clone's one build folder (pyproject's build-dir), so 2 and 3
# re-run CMake on an up-to-date tree; the build requirements of pyproject.toml (scikit-build-core,
# pybind11: the exact pins) are installed into the virtualenv from the package index first and
# the builds run with --no-build-isolation, so every command sees the same pybind11 and the build
# folder stays valid (an isolated build env is a new temporary folder per command); only the
# extension target is built (-Cbuild.targets=_lattice: not the runner, the example or the
# tests); CUDA is off (CUDA=OFF default: the CUDA backend's build is make test's business).
# Measured on this project's 2-core machine (shared with other builds): 3 min 7 s wall, 167 s of CPU,
# of which the wheel and the editable install take 6 s and 3 s; 5 min under heavy load
# (docs/testing.md, "pip check").
#
# Usage: scripts/check_pip_install.sh [python] (default /usr/bin/python3). Environment: CUDA=ON|OFF|AUTO
# (default OFF), JOBS (default 2), KEEP=1 keeps the work folder.
set -euo pipefail
PY=${1:-/usr/bin/python3}
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$WORK"' EXIT
start=$(date +%s)
stamp() { echo "check_pip_install: [$(( $(date +%s) - start ))s] $*"; }
export CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-2}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
CFG=(--config-settings=cmake.define.LATTICE_CUDA="${CUDA:-OFF}" --config-settings=build.targets=_lattice)

git clone -q "$REPO" "$WORK/src"
"$PY" -m venv --system-site-packages "$WORK/venv"
V="$WORK/venv/bin/python"
# pyproject.toml's [build-system] requires, verbatim (one line: requires = ["a==1", "b==2"])
mapfile -t REQS < <(sed -n 's/^requires = \[\(.*\)\]$/\1/p' "$WORK/src/pyproject.toml" | tr ',' '\n' | tr -d ' "')
[ "${#REQS[@]}" -gt 0 ] || { echo "check_pip_install: no [build-system] requires in pyproject.toml" >&2; exit 1; }
stamp "build requirements: ${REQS[*]}"
"$V" -m pip install -q "${REQS[@]}"

# the smoke test, run from $WORK (outside the clone): the installed lattice, its extension, a network
smoke() {
  (cd "$WORK" && "$1" - "$2" <<'PY'
import sys, torch, lattice, lattice._lattice
where = sys.argv[1]
assert lattice.__file__.startswith(where), (lattice.__file__, where)
assert lattice._lattice.__file__.startswith(where), lattice._lattice.__file__
c = torch.unique(torch.randint(0, 16, (200, 3)), dim=0)
x = lattice.SparseTensor(torch.cat([torch.zeros(len(c), 1, dtype=torch.long), c], 1).int(), torch.randn(len(c), 4))
y = lattice.models.MinkUNet18(num_classes=3, cr=0.25).eval()(x)  # eval: one voxel at stride 16
assert y.feats.shape == (len(c), 3) and bool(torch.isfinite(y.feats).all())
print("  ok:", lattice.__file__)
PY
  )
}

stamp "1. pip install <clean clone> (full build, CUDA=${CUDA:-OFF})"
"$V" -m pip install -q --no-deps --no-build-isolation "${CFG[@]}" "$WORK/src"
smoke "$V" "$WORK/venv/lib"
stamp "2. pip wheel <clone> (reuses the build folder)"
"$V" -m pip wheel -q --no-deps --no-build-isolation "${CFG[@]}" -w "$WORK/wheel" "$WORK/src"
WHEEL=$(ls "$WORK"/wheel/lattice-*.whl)
# the listing is read whole before it is searched: `zipfile -l | grep -q` under pipefail failed CI
# when grep quit at its first match and zipfile's next print hit the closed pipe (BrokenPipeError)
LISTING=$("$V" -m zipfile -l "$WHEEL")
grep -q "lattice/_lattice" <<<"$LISTING" || { echo "check_pip_install: $WHEEL has no extension" >&2; exit 1; }
"$PY" -m venv --system-site-packages "$WORK/venv2"
"$WORK/venv2/bin/python" -m pip install -q --no-deps "$WHEEL"
smoke "$WORK/venv2/bin/python" "$WORK/venv2/lib"
stamp "3. pip install -e <clone> (reuses the build folder)"
"$V" -m pip uninstall -q -y lattice
"$V" -m pip install -q --no-deps --no-build-isolation "${CFG[@]}" -e "$WORK/src"
(cd "$WORK" && "$V" -c "import lattice, lattice._lattice; assert lattice.__file__.startswith('$WORK/src'), lattice.__file__; print('  ok (editable):', lattice.__file__)")
stamp "pip install . / pip wheel . / pip install -e . passed"
echo "pip_check: 3 passed, 0 failed"
