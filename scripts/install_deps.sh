#!/usr/bin/env bash
# Installs what building and testing lattice needs on a Debian/Ubuntu machine, skipping what is
# already there. Pinned to the distribution's versions (Debian 12: torch 1.13.1, numpy 1.24.2,
# pybind11 2.10.3, BLIS 0.9.0, GoogleTest 1.12.1, pytest 7.2.1, hypothesis 6.67.1).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libblis-serial-dev libgtest-dev nlohmann-json3-dev pybind11-dev python3-dev python3-pybind11
  python3-numpy python3-torch python3-pytest python3-hypothesis python3-matplotlib python3-pip
  python3-venv  # scripts/check_pip_install.sh (CI): fresh virtualenvs
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "install_deps: not a Debian-like system; please install: ${missing[*]}" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
