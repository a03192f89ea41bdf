#!/usr/bin/env bash
# Installs the Debian packages qparity builds against. Idempotent: on a machine that already has
# them (a developer machine after the first run, the GPU image) it installs nothing.
# The CUDA toolkit is not a Debian package here: it is found at /usr/local/cuda when present, and
# the build turns QPARITY_CUDA off when nvcc is absent.
set -euo pipefail

required=(cmake make g++ pkg-config libhdf5-dev libeigen3-dev nlohmann-json3-dev libcli11-dev
          libgtest-dev libgmock-dev libpcre2-dev unicode-data bzip2 python3 python3-numpy
          python3-h5py python3-pytest ccache)
# libpcre2-dev: the tokenizer's Unicode pre-tokenizer regexes (core/text); unicode-data (+ bzip2
# for its conformance test) and python3: the NFC tables, generated at configure time from it.
# python3-numpy and python3-h5py run the Python package's tests (python/tests) and write the
# candidates the C++ round-trip test reads; python3-pytest runs the pytest plugin's example tests
# (python/examples). ccache: the build compiles through it
# (cmake/Ccache.cmake), so a second build on the same machine, in any clone, compiles nothing. hdf5-tools (h5dump) is used by golden-file tests;
# clang + libclang-rt-dev build the libFuzzer targets (QPARITY_FUZZ=ON). Missing optional
# packages are installed where apt can reach them.
optional=(hdf5-tools clang libclang-rt-dev)

missing() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}

need=($(missing "${required[@]}"))
want=($(missing "${optional[@]}"))
if [ ${#need[@]} -eq 0 ] && [ ${#want[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "install-deps: no apt-get; install these by other means: ${need[*]} ${want[*]}" >&2
  [ ${#need[@]} -eq 0 ]
  exit $?
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
if [ ${#need[@]} -gt 0 ]; then
  echo "install-deps: installing ${need[*]}"
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
if [ ${#want[@]} -gt 0 ]; then
  echo "install-deps: installing optional ${want[*]}"
  $SUDO apt-get install -y -qq --no-install-recommends "${want[@]}" ||
    echo "install-deps: optional packages unavailable: ${want[*]} (fuzz targets / h5dump checks off)" >&2
fi
