#!/usr/bin/env bash
# Installs everything Cohort needs on Debian 12. Idempotent: packages already
# present are skipped, so a second run does no network work at all.
set -euo pipefail

PACKAGES=(
  # toolchain
  gcc g++ cmake make pkg-config
  # tensors, autograd, c10d (Gloo); the Gloo headers c10d includes
  libtorch-dev libgloo-dev
  # a real BLAS under libtorch: without it matmul runs ~20x slower
  libopenblas0-openmp
  # formats: BERT shards, command line + TOML, JSON, gzip'd IDX
  libhdf5-dev libcli11-dev nlohmann-json3-dev zlib1g-dev
  # tests and micro-benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
  # real data: an English corpus and Fashion-MNIST
  dict-gcide dataset-fashion-mnist
  # the PyTorch peer, for benchmarks and golden numbers only
  python3-torch
  # `cohort plot`; network namespaces for the multi-host tests
  gnuplot-nox iproute2
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: error: missing packages: ${missing[*]}" >&2
  echo "install-deps: run as root, or ask an admin to: apt-get install ${missing[*]}" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
