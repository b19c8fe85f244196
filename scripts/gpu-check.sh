#!/usr/bin/env bash
# One-shot check of Cohort on a single-GPU machine with no network, in under
# 8 minutes: build against that machine's torch, run the GPU tests, measure
# BERT-base and BERT-large phase-1 steps against PyTorch eager.
#
# Prerequisites on the GPU machine: python3 whose torch (2.x, CUDA build)
# sees the GPU, with transformers (the eager peer); nvcc, cmake and a C++17
# compiler; libcurl.so.4 and libcrypto.so.3 (HDF5's). The rest (headers of
# HDF5, nlohmann-json, CLI11, GoogleTest, Gloo, zlib; HDF5's libraries;
# Fashion-MNIST) is carried in one folder made beforehand on a Debian 12
# machine with network:
#   scripts/gpu-deps.sh                # -> .gpu-deps/ (about 40 MB)
# then, on the GPU machine, from the repository root:
#   scripts/gpu-check.sh [DEPS_DIR]    # default .gpu-deps; output in $OUT (default /tmp/cohort-gpu-check)
# A machine that has those packages installed needs no DEPS_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
deps=$(realpath -m "${1:-.gpu-deps}")
out=${OUT:-/tmp/cohort-gpu-check}
build=$out/build
py=${PYTHON:-python3}
jobs=$(nproc)
mkdir -p "$out"
t0=$(date +%s)
say() { echo "gpu-check [$(($(date +%s) - t0))s]: $*"; }
die() { echo "gpu-check: error: $*" >&2; exit 1; }

# 1. What the machine has.
for tool in cmake nvcc c++; do command -v "$tool" > /dev/null || die "$tool is not on PATH (see the prerequisites above)"; done
"$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" ||
  die "$py has no torch that sees a GPU"
torch_dir=$("$py" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'share/cmake/Torch'))")
gpu=$("$py" -c "import torch; print(torch.cuda.get_device_name(0))")
say "$gpu; torch $("$py" -c 'import torch; print(torch.__version__)'); $(nvcc --version | tail -1)"

# 2. Configure and build (the carried folder, when there, ahead of the system).
args=(-DCMAKE_BUILD_TYPE=Release -DTorch_DIR="$torch_dir" -DCOHORT_PYTHON="$(command -v "$py")" -DCOHORT_CUDA=ON)
if [ -d "$deps/root" ]; then
  root=$deps/root/usr
  arch=x86_64-linux-gnu
  args+=(-DCMAKE_PREFIX_PATH="$root" -DCOHORT_GLOO_INCLUDE="$root/include"
         -DHDF5_C_INCLUDE_DIR="$root/include/hdf5/serial" -DHDF5_C_LIBRARY_hdf5="$root/lib/$arch/hdf5/serial/libhdf5.so"
         -DHDF5_C_LIBRARY_sz="$root/lib/$arch/libsz.so" -DHDF5_C_LIBRARY_z="$root/lib/$arch/libz.so"
         -DZLIB_INCLUDE_DIR="$root/include" -DGTest_DIR="$root/lib/$arch/cmake/GTest"
         -Dnlohmann_json_DIR="$root/share/cmake/nlohmann_json")
  export LD_LIBRARY_PATH="$root/lib/$arch:$root/lib/$arch/hdf5/serial${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CPATH="$root/include${CPATH:+:$CPATH}"
  if [ -d "$deps/fashion-mnist" ] && [ ! -d /usr/share/datasets/fashion-mnist ]; then
    mkdir -p /usr/share/datasets && ln -s "$deps/fashion-mnist" /usr/share/datasets/fashion-mnist
  fi
fi
cmake -S . -B "$build" "${args[@]}" > "$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; die "configure failed"; }
cmake --build "$build" -j"$jobs" --target cohort cohort_tests bert_step_bench > "$out/build.log" 2>&1 ||
  { grep -m5 -A5 "error" "$out/build.log"; die "build failed ($out/build.log)"; }
say "built"

# 3. The GPU tests: CUDA vs CPU losses, bf16 and fp16 training, 2 ranks on the one GPU (Gloo on CUDA tensors)
#    against 1 rank; steps between log points under CUDA's sync debug mode ("error"); the batch feed on its
#    side stream and the event clock; the zero-read count of host_reads_test (its CPU runs, on this build);
#    NCCL across GPUs and an elastic NCCL generation aborted when a member leaves, when there are 2 or more.
"$build/tests/cohort_tests" --gtest_filter='Gpu.*:Comm*:GradSync*:HostReads.*:DeviceTally.*:DeviceFeed.*' 2>&1 |
  tee "$out/gpu-tests.log" | grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|PASSED|FAILED" || true
grep -q "FAILED" "$out/gpu-tests.log" && die "GPU tests failed ($out/gpu-tests.log)"
# An elastic kill on the GPU: a node of 2 ranks is killed and the other goes on from memory. One GPU cannot
# hold two NCCL ranks, so these ranks share it over Gloo on CUDA tensors (the NCCL generation test above
# needs 2 GPUs).
COHORT_TEST_CUDA=1 "$build/tests/cohort_tests" --gtest_filter='Elastic.MultiRankNodeIsLostAsAWhole' 2>&1 |
  tee "$out/gpu-elastic.log" | grep -E "^\[ +(OK|FAILED|SKIPPED) +\]" || true
grep -q "FAILED" "$out/gpu-elastic.log" && die "the elastic kill on the GPU failed ($out/gpu-elastic.log)"
say "tests done"

# 3b. The sync parts' state on CUDA tensors: PowerSGD (its Qs and remainders), local steps (the outer
#     momentum) and a sharded optimizer with gradient clipping (the norm of its pieces), each trained on 2
#     ranks sharing the GPU (Gloo on CUDA tensors) and resumed on 1 rank: the checkpoint's state is read on
#     the CPU and must be placed on the GPU, and the local steps' open window merged there.
common=(--model.name mlp --train.device cuda --log.tensorboard=false --quiet --eval.every-steps 0
        --ckpt.every-steps 10 --data.global-batch 64)
for mode in "powersgd|--dist.grad-compression powersgd" "local|--dist.sync local --dist.local-steps 4" \
            "shard|--optim.name adamw --dist.shard gradients --optim.clip-norm 1"; do
  name=${mode%%|*}
  read -r -a flags <<< "${mode#*|}"
  run=$out/runs/$name
  "$build/cohort" train "${common[@]}" "${flags[@]}" --nproc-per-node 2 --oversubscribe --dist.backend gloo \
    --train.max-steps 15 --out "$run" > "$out/$name.log" 2>&1 || { tail -5 "$out/$name.log"; die "$name on 2 ranks failed"; }
  "$build/cohort" train --resume "$run" --train.max-steps 25 >> "$out/$name.log" 2>&1 ||
    { tail -5 "$out/$name.log"; die "$name resumed on 1 rank failed"; }
  say "$name: 15 steps on 2 ranks, resumed to 25 on 1"
done

# 4. BERT phase 1 (S=128, 20 predictions), bf16, one GPU: Cohort's model step
#    against Hugging Face BertForPreTraining in eager PyTorch, the same batch.
peak=${PEAK_TFLOPS:-989}  # H200 dense bf16; set PEAK_TFLOPS for another GPU
bench() {  # name hidden layers heads batch
  local name=$1 h=$2 l=$3 heads=$4 b=$5
  local shape="--hidden $h --layers $l --heads $heads --intermediate $((4 * h)) --seq 128 --predictions 20 --batch $b"
  local c p
  c=$("$build/bench/bert_step_bench" $shape --steps 40 --precision bf16 --device cuda --dropout-rng rank --peak-tflops "$peak")
  p=$("$py" bench/peers/bert_pretrain.py $shape --steps 40 --precision bf16 --device cuda --model hf)
  "$py" - "$name" "$b" "$c" "$p" <<'PY'
import json, sys
name, b, c, p = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4])
print(f"{name:10s} batch {b:3d}  cohort {c['samples_per_s']:8.1f} seq/s  MFU {c['mfu']:.3f}   "
      f"pytorch eager (HF) {p['samples_per_s']:8.1f} seq/s   cohort/eager {c['samples_per_s'] / p['samples_per_s']:.2f}")
PY
}
{
  bench bert-base 768 12 12 128
  bench bert-large 1024 24 16 64
} | tee "$out/bert.txt"
say "done in $(($(date +%s) - t0)) s; logs in $out"
