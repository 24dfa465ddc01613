#!/usr/bin/env bash
# All benchmarks, each measuring its comparison side by side in one run.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${AC_BUILD:-build}
echo "== engine vs PyTorch (forward tokens/s, 2 threads)"
/usr/bin/python3 bench/bench_engine.py
echo; echo "== training engine vs PyTorch autograd (forward+backward tokens/s, 2 threads)"
/usr/bin/python3 bench/bench_train.py
echo; echo "== distillation: share of the pruning perplexity gap recovered (tiny model, 50% parameter limit, 100k tokens)"
/usr/bin/python3 bench/bench_distill.py 100000 0.5
echo; echo "== tokenizer: C vs Python reference BPE and vs sentencepiece"
/usr/bin/python3 bench/bench_tokenizer.py
echo; echo "== AVX512-BF16 prefill GEMM: wide inputs in k chunks vs whole rows (skips without AVX512-BF16)"
"$B"/bench/bench_gemm_bf16 1 5
echo; echo "== cost model: predicted vs measured latency of the CPU engine"
"$B"/bench/bench_costmodel "$B"/bench_cost.db
echo; echo "== cost model of mixture-of-experts layers: predicted vs measured CPU decode at batch 1-64 (thread clock)"
AC_BENCH_CLOCK=thread "$B"/bench/bench_moe_cost
echo; echo "== differentiable search against its own start (held-out loss, 5 seeds x 300 gate steps, and with the task gradient zeroed)"
AC_DNAS_GAIN_FULL=1 "$B"/tests/test_dnas_gain
echo; echo "== AutoCompress vs Minitron under the same constraint"
/usr/bin/python3 bench/bench_compress.py
echo; echo "== daemon load (loopback)"
/usr/bin/python3 bench/bench_daemon.py
echo; echo "== daemon under hostile load: 1000 event streams, 300 slow-header sockets (loopback)"
/usr/bin/python3 bench/bench_hostile.py
