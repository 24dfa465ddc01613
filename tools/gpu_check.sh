#!/usr/bin/env bash
# The GPU checks to run on a lent GPU machine (one short script): build with
# nvcc, run the CUDA tests and the GPU benchmark. Output is the figures the
# issue asks to record.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
make -j"$(nproc)" all fixtures >/dev/null 2>&1 || make all fixtures
./build/tests/test_cuda
./build/bench/bench_gpu build/gpu_cost.db
