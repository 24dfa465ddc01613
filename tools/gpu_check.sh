#!/usr/bin/env bash
# The GPU checks to run on a lent GPU machine (one short script): build with
# nvcc, run the CUDA tests, the GPU benchmark and a perplexity on the GPU
# against the CPU. Output is the figures the issue asks to record.
#
# The device machine may lack python3-torch, so bring the PyTorch fixtures
# and the tiny model from a machine that has them (the device tool's
# `carry`: build/fixtures, build/models, build/data); the script builds
# everything else itself and generates fixtures only when they are missing.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
if ! make -j"$(nproc)" all >/tmp/ac_build.log 2>&1; then
  echo "build failed:"; tail -30 /tmp/ac_build.log; exit 1
fi
[ -f build/libac_cuda.so ] || { echo "no build/libac_cuda.so (nvcc not found?)"; exit 1; }
[ -d build/fixtures/models ] || make fixtures >/tmp/ac_fixtures.log 2>&1 || echo "fixtures could not be generated (python3-torch?)"
echo "== test_cuda"
./build/tests/test_cuda
echo "== test_block (every block op on the GPU against the CPU)"
./build/tests/test_block
echo "== test_train (the CUDA trainer on the block recipe against the CPU one)"
AC_TRAIN_CUDA_ONLY=1 ./build/tests/test_train
echo "== bench_gpu"
./build/bench/bench_gpu build/gpu_cost.db
echo "== bench_cuda_upload (host memory of the resident upload)"
./build/bench/bench_cuda_upload build/models/tiny
if [ -f build/models/tiny/config.json ] && [ -f build/data/heldout.txt ]; then
  echo "== perplexity of the tiny model, CPU vs GPU"
  for d in cpu cuda; do ./build/autocompress eval build/models/tiny build/data/heldout.txt --ctx 128 --windows 64 --batch 8 --device $d; done
fi
