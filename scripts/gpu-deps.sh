#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh needs beside a GPU machine's own
# toolchain (nvcc, cmake, a C++ compiler, python3 with torch) into one
# folder, on this Debian 12 machine, for a machine with no network:
# the headers of HDF5, nlohmann-json, CLI11, GoogleTest, Gloo and zlib, and
# HDF5 1.10's libraries (about 6 MB of packages), and Fashion-MNIST for the
# GPU tests: about 40 MB, under the device tool's 64 MiB. Nothing is
# installed here.
#   scripts/gpu-deps.sh [DIR]        (default .gpu-deps, ignored by git)
# The HDF5 library needs libcurl.so.4 and libcrypto.so.3 on the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(realpath -m "${1:-.gpu-deps}")
pkgs=(libhdf5-dev libhdf5-103-1 libhdf5-hl-100 libsz2 libaec0 libaec-dev nlohmann-json3-dev libcli11-dev
      libgtest-dev googletest libgloo-dev=0.0~git20220518.5b14351-3 zlib1g-dev)
rm -rf "$dir" && mkdir -p "$dir/debs" "$dir/root"
(cd "$dir/debs" && apt-get download "${pkgs[@]}" 2>/dev/null)
for deb in "$dir"/debs/*.deb; do dpkg-deb -x "$deb" "$dir/root"; done
rm -rf "$dir/debs" "$dir/root/usr/share/doc" "$dir/root/usr/share/man"
find "$dir/root" -name 'libhdf5*.a' -delete
# The GPU tests train on Fashion-MNIST (dataset-fashion-mnist, 30 MB).
if [ -d /usr/share/datasets/fashion-mnist ]; then cp -r /usr/share/datasets/fashion-mnist "$dir/"; fi
echo "gpu-deps: $(du -sh "$dir" | cut -f1) in $dir"
