#!/usr/bin/env bash
# Unpacks Debian's single-threaded BLIS (headers + shared library) into .deps/blis and nlohmann-json into .deps/nlohmann so they can be
# carried to a machine without network access (the GPU machine): cmake -DBLIS_ROOT=.deps/blis/usr
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps && cd .deps
apt-get download libblis4-serial libblis-serial-dev
for f in libblis*.deb; do dpkg -x "$f" blis; done
rm -f libblis*.deb
find blis -name '*.a' -delete
# nlohmann-json (header only; the runtime layer reads graph.json with it):
#   cmake -Dnlohmann_json_DIR=.deps/nlohmann/usr/share/cmake/nlohmann_json
apt-get download nlohmann-json3-dev
for f in nlohmann-json3-dev*.deb; do dpkg -x "$f" nlohmann; done
rm -f nlohmann-json3-dev*.deb
