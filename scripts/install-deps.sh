#!/usr/bin/env bash
# Installs everything Cohort needs on Debian 12, in three parts:
#   1. Debian packages: toolchain, HDF5, CLI11, JSON, zlib, libcurl, tests, real data;
#   2. the Gloo headers that c10d's ProcessGroupGloo.hpp includes, taken from
#      Debian's libgloo-dev package without installing it (its library is
#      never installed or linked: libtorch carries its own Gloo);
#   3. a Python virtual environment outside the repository with the pinned
#      torch wheel (Cohort builds on the libtorch inside it) and the PyPI
#      libraries the tests use as oracles (scripts/requirements.txt).
# Idempotent: what is present is skipped, so a second run does no network work.
#
#   COHORT_VENV   where the environment lives (default /opt/cohort/venv); the
#                 build reads the same variable.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
VENV="${COHORT_VENV:-/opt/cohort/venv}"
REQUIREMENTS="$HERE/requirements.txt"

PACKAGES=(
  # toolchain; python3-venv makes the environment for the torch wheel
  gcc g++ cmake make pkg-config python3 python3-venv
  # formats: BERT shards, command line + TOML, JSON, gzip'd IDX; HTTP for log.mlflow
  libhdf5-dev libcli11-dev nlohmann-json3-dev zlib1g-dev libcurl4-openssl-dev
  # tests and micro-benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
  # real data: an English corpus, Fashion-MNIST, WordNet glosses
  dict-gcide dataset-fashion-mnist wordnet-base
  # `cohort plot`; network namespaces for the multi-host tests
  gnuplot-nox iproute2
)

need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: error: $1" >&2
    echo "install-deps: run as root, or ask an admin to do it" >&2
    exit 1
  fi
}

# --- 1. Debian packages --------------------------------------------------------
missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
apt_updated=0
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} Debian packages present"
else
  need_root "missing packages: ${missing[*]} (apt-get install ${missing[*]})"
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt_updated=1
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# --- 2. Gloo headers -------------------------------------------------------------
# c10d's ProcessGroupGloo.hpp needs only declarations from Gloo: Cohort calls
# ProcessGroupGloo (compiled inside libtorch) and never constructs a Gloo
# class or c10d's GlooStore (whose virtuals follow the Gloo version), so these
# headers of an older Gloo are sound. tests/platform_test.cpp checks that no
# Gloo code is compiled in and no libgloo is linked or loaded.
GLOO_DEB_VERSION="0.0~git20220518.5b14351-3"  # Debian 12's
GLOO_INCLUDE="$VENV/gloo/include"
if [ -f "$GLOO_INCLUDE/gloo/config.h" ]; then
  echo "install-deps: Gloo headers present in $GLOO_INCLUDE"
else
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  chmod 755 "$tmp"
  chown _apt "$tmp" 2>/dev/null || true  # apt-get download writes as _apt
  # apt-get download needs no root; refreshing the package lists does.
  if ! (cd "$tmp" && apt-get download -q "libgloo-dev=$GLOO_DEB_VERSION" 2>/dev/null); then
    need_root "cannot download libgloo-dev $GLOO_DEB_VERSION (apt-get update needs root)"
    [ "$apt_updated" -eq 1 ] || apt-get update -q
    (cd "$tmp" && apt-get download -q "libgloo-dev=$GLOO_DEB_VERSION")
  fi
  dpkg-deb -x "$tmp"/libgloo-dev_*.deb "$tmp/root"
  mkdir -p "$GLOO_INCLUDE"
  cp -r "$tmp/root/usr/include/gloo" "$GLOO_INCLUDE/"
  echo "$GLOO_DEB_VERSION" > "$GLOO_INCLUDE/gloo/DEBIAN_VERSION"
  echo "install-deps: Gloo headers (libgloo-dev $GLOO_DEB_VERSION) in $GLOO_INCLUDE"
fi

# --- 3. the Python environment: torch and the oracles ------------------------------
# requirements.txt names what Cohort uses; constraints.txt pins everything
# they pull in (pip freeze of a working install). A stamp holds both; when it
# matches, nothing (not even pip) runs.
CONSTRAINTS="$HERE/constraints.txt"
STAMP="$VENV/.cohort-requirements"
if [ -x "$VENV/bin/python3" ] && [ -f "$STAMP" ] && cat "$REQUIREMENTS" "$CONSTRAINTS" | cmp -s "$STAMP" -; then
  echo "install-deps: $VENV has $(grep -m1 '^torch==' "$REQUIREMENTS") and the test oracles"
  exit 0
fi
if [ ! -w "$(dirname "$VENV")" ] && [ ! -w "$VENV" ]; then
  need_root "cannot write $VENV; set COHORT_VENV to a directory you own"
fi
echo "install-deps: installing $(grep -c '==' "$REQUIREMENTS") Python packages into $VENV (torch is about 2.7 GB)"
mkdir -p "$VENV"
[ -x "$VENV/bin/python3" ] || /usr/bin/python3 -m venv "$VENV"
"$VENV/bin/python3" -m pip install --no-input --disable-pip-version-check -q -r "$REQUIREMENTS" -c "$CONSTRAINTS"
cat "$REQUIREMENTS" "$CONSTRAINTS" > "$STAMP"
echo "install-deps: done: $("$VENV/bin/python3" -c 'import torch; print("torch", torch.__version__)')"
