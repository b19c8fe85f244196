#!/usr/bin/env bash
# The main job: train a CNN on Fashion-MNIST for one epoch on this machine and
# print the test accuracy. `make demo` runs this after installing and building.
set -euo pipefail
BUILD_DIR="${1:-build}"
RUN_DIR="${RUN_DIR:-runs/demo-fashion-mnist}"

echo "demo: training examples/fashion-mnist.toml into $RUN_DIR"
"$BUILD_DIR/cohort" train --config examples/fashion-mnist.toml --out "$RUN_DIR" --overwrite
echo "demo: metrics in $RUN_DIR/metrics.jsonl, resolved config in $RUN_DIR/config.toml"
