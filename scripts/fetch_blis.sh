#!/usr/bin/env bash
# Unpacks Debian's single-threaded BLIS (headers + shared library) into .deps/blis so it can be
# carried to a machine without network access (the GPU machine): cmake -DBLIS_ROOT=.deps/blis/usr
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps && cd .deps
apt-get download libblis4-serial libblis-serial-dev
for f in libblis*.deb; do dpkg -x "$f" blis; done
rm -f libblis*.deb
find blis -name '*.a' -delete
