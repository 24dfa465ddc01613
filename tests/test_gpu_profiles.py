"""GPU spec profiles and engine models against published measurements (issues
16 and 32): for each public figure below, `build/autocompress estimate` on the
same model shape, GPU, tensor parallelism, weight/KV dtype, engine and
workload, and its relative error; each error must stay within BOUND, the
median of the dense rows within MEDIAN_BOUND and that of the mixture-of-experts
rows within MOE_MEDIAN_BOUND. Run as a script with --table to print the table
in docs/costmodel.md.

Sources (stored copies read with the project's search tools):
- TRT_OVERVIEW: NVIDIA/TensorRT-LLM docs/source/performance/perf-overview.md
  (commit 00f37686aa854010d68bcbd0f4ab000221541ca6), tables "Llama 3.1 8B"
  (nvidia/Llama-3.1-8B-Instruct-FP8, H100 and H200 at TP1) and "Llama 3.3 70B"
  (nvidia/Llama-3.3-70B-Instruct-FP8, H200 TP1, H100 TP2): trtllm-bench
  throughput on the PyTorch backend, every request queued at once, CUDA graphs
  for batch sizes up to 8192 with padding (the page's llm_options.yml), total
  output tokens/s; the page's request counts per length pair.
- TRT_PERF_061: NVIDIA/TensorRT-LLM docs/source/performance.md (commit
  138f96d45f90b9667426f7c47297d8c06bafac73): "Peak Throughput, H100 GPUs
  (FP8)" (v0.6.1, gptSessionBenchmark: static batches of the stated size)
  and "Low Latency" (v0.5, batch 1, first-token latency) for LLaMA 7B
  (Llama-2-7B shape); the A100 FP16 rows check the A100 profile the same way.
  The page's other low-latency rows (LLaMA 7B at 128 tokens on the A100,
  LLaMA 70B at TP4) are compared, not asserted (the 128-token ones -22..-37 %).

How a published figure maps onto `estimate`:
- offline runs (TRT_OVERVIEW): a served workload, `offline: true` with the
  page's request count, engine trtllm with cuda_graph_max_bs 8192: the engine
  simulation (src/cost/serve.c) over the roofline step costs;
- static batches (TRT_PERF_061): workload batch = the stated batch size, engine
  trtllm without CUDA graphs (the v0.5/v0.6 C++ runtime);
  throughput = output tokens / (TTFT + (gen - 1) x TPOT), as estimate reports;
- FP8 checkpoints: weights_dtype fp8 and kv_dtype fp8 (the FP8 engines in
  both documents quantise the KV cache too: --fp8_kv_cache in performance.md).

Mixture-of-experts rows (issue 30), shapes from each model's public
config.json (mistralai/Mixtral-8x7B-v0.1: hidden 4096, 32 layers, 32 heads /
8 KV, 8 experts of 14336, top-2, vocab 32000; Qwen/Qwen3-235B-A22B: hidden
4096, 94 layers, 64 heads / 4 KV of 128, 128 experts of 1536, top-8, vocab
151936, every layer sparse):
- TRT_V017: NVIDIA/TensorRT-LLM docs/source/performance/perf-overview.md
  (commit 258c7540c03517def55d9a5aadfa9288af474e1b, "All data in the table
  below was generated using version 0.17"): Mixtral 8x7B FP8 at TP1 on H200
  and H100, trtllm-bench throughput (every request queued at once) on an
  engine built by trtllm-bench, FP8 KV cache, total output tokens/s, the
  page's request counts.
- SGL_B200: a third-party sweep of SGLang v0.5.8.post1 on 8 x B200 (a public
  gist, gist.github.com/BenHamm/78563d0d0a08d7cb61b4737392633384, 2026-02-16):
  Qwen3-235B-A22B in BF16 at TP8, sglang.bench_serving random 1K input / 1K
  output, TPOT at concurrency 1 (6.70 ms): the B200 profile's MoE check.
  Its throughput columns are at an unstated concurrency and are not compared.
Compared but not asserted (REPORTED, printed by --table): TRT_OVERVIEW's
Qwen3-235B-A22B FP8 on H200 "TP8", which the page runs with attention data
parallelism and expert parallelism (its MoE llm_options), neither modelled;
TRT_V017's Llama-3.1-70B FP16 at TP8 on the A100 (decode-heavy rows up to
+34 %), TRT_V017's Mixtral 8x7B at TP4/TP8 (FP8) and TP2-TP8 (FP16, A100), a
check of the all-reduce model added after it was chosen (median 12 %, up to
+28 %), and TRT_PERF_061's 128-token LLaMA 70B first-token latency at TP4 on
H100s (-29 %); see docs/costmodel.md. Asserted since the all-reduce follows
NCCL's cost model (src/cost/engines.c): TRT_V017's Mixtral 8x7B FP8 at TP2,
Llama-3.1-70B FP16 at TP4 on the A100 and FP8 at TP1-TP8 on H200/H100,
TRT_OVERVIEW's Llama-3.1-405B FP8 at TP8 and TRT_PERF_061's other first-token
latencies.
Also asserted: TRT_V017's Llama-3.1-8B FP16 rows on the A100 (TP1), and two
llama-bench figures of llama.cpp (LLAMACPP_4090: ggml-org/llama.cpp pull
request 4766, a comment of 2024-01-10: CodeLlama-7B F16 on one RTX 4090,
pp512 and tg128). TRT_OVERVIEW's B200 MoE rows (and those of the page's
later release/1.2 version) are FP4 (NVFP4 or MXFP4), a dtype no profile
models; the v0.17 page has no B200.
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, Runner, cli_estimate  # noqa: E402

CLI = os.path.join(BUILD, "autocompress")
# The bounds hold what the model reaches today (docs/costmodel.md states the same figures):
BOUND = 0.24  # |predicted / published - 1| of every row (worst: 23.7 %, a batch-1 FP8 TTFT of 7 ms on the H100)
MEDIAN_BOUND = 0.05  # of the median dense row (4.3 % over 167 rows; 3.8 % over the 71 asserted before TP rows were)
TP_MEDIAN_BOUND = 0.05  # of the median tensor-parallel row (TP > 1; 4.8 % over 115 rows)
# The mixture-of-experts rows: the grouped GEMM's FLOPs are priced 1.15x a
# dense GEMM's (src/cost/costmodel.c, AC_MOE_GROUPED_FLOPS, chosen on the
# Mixtral TP1 rows below, so they do not check it): median 7.7 %, worst 19.1 %
# (a TP2 row; the TP1 rows' worst is 18.0 %).
MOE_MEDIAN_BOUND = 0.10
MOE_BOUND = 0.20
# llama.cpp's rows (F16 weights: cuBLAS in FP16 accumulate with its conversions): pp512 +4.1 %, tg128 -8.3 %
LLAMACPP_BOUND = 0.10
B200_MOE_BOUND = 0.05  # |error| of each B200 mixture-of-experts row (SGL_B200: +2.0 %; it chose the all-reduce barrier)

# hidden, layers, heads, kv_heads, ffn, vocab (head_dim 128)
LLAMA31_8B = (4096, 32, 32, 8, 14336, 128256)
LLAMA33_70B = (8192, 80, 64, 8, 28672, 128256)
LLAMA2_7B = (4096, 32, 32, 32, 11008, 32000)
TRT_OVERVIEW = "NVIDIA/TensorRT-LLM docs/source/performance/perf-overview.md"
TRT_PERF_061 = "NVIDIA/TensorRT-LLM docs/source/performance.md (v0.6.1 / v0.5 tables)"

# TRT_OVERVIEW: (ISL, OSL) -> requests, and the published tokens/s per (model, GPU, TP)
OVERVIEW_REQUESTS = {(128, 128): 30000, (128, 2048): 3000, (128, 4096): 1500, (500, 2000): 3000,
                     (1000, 1000): 3000, (1000, 2000): 1500, (2048, 128): 3000, (2048, 2048): 1500,
                     (5000, 500): 1500, (20000, 2000): 1000}
LENGTHS = list(OVERVIEW_REQUESTS)
OVERVIEW = [
    ("Llama-3.1-8B", LLAMA31_8B, "H200", 1,
     [27911, 26221, 18027, 20770, 17744, 16828, 3538, 12194, 3902, 1804]),
    ("Llama-3.1-8B", LLAMA31_8B, "H100", 1,
     [28312, 22714, 14325, 17660, 15220, 13899, 3450, 9305, 3459, 1351]),
    ("Llama-3.3-70B", LLAMA33_70B, "H200", 1,
     [3803, 4336, 2872, 3666, 2909, 2994, 442, 2003, 566, 283]),
    ("Llama-3.3-70B", LLAMA33_70B, "H100", 2,
     [6378, 6651, 4199, 5222, 4205, 4146, 762, 3082, 898, 437]),
]

# (label, shape, device, tp, dtype, workload, engine overrides, metric, published, source)
PUBLISHED = []
for name, shape, dev, tp, figs in OVERVIEW:
    for (isl, osl), pub in zip(LENGTHS, figs):
        PUBLISHED.append((f"{name} offline {isl}/{osl}", shape, dev, tp, "fp8",
                          {"offline": True, "requests": OVERVIEW_REQUESTS[(isl, osl)], "prompt_len": isl,
                           "gen_len": osl}, {"cuda_graph_max_bs": 8192}, "tokens_per_s", pub, TRT_OVERVIEW))
# VLLM_4090: Mistral-7B-Instruct-v0.3 (BF16) on one RTX 4090 with vLLM's OpenAI
# server (version not stated), 256 prompt / 128 output tokens, 300 prompts at an
# infinite rate under a max concurrency of 4-48 (a third-party blog post,
# mushfiqrahman.dev/?p=1668, "Full Concurrency Sweep"): output tokens/s and P99
# TTFT. Its mean and median TTFT are not compared (docs/costmodel.md).
MISTRAL_7B = (4096, 32, 32, 8, 14336, 32768)
VLLM_4090 = "mushfiqrahman.dev/?p=1668 (vLLM, RTX 4090)"
for conc, tok, p99 in [(4, 210, 157), (8, 377, 268), (16, 644, 503), (32, 975, 938), (48, 1190, 1483)]:
    wl = {"concurrency": conc, "requests": 300, "prompt_len": 256, "gen_len": 128}
    PUBLISHED.append((f"Mistral-7B concurrency {conc}, 256/128", MISTRAL_7B, "RTX4090", 1, "bf16", wl,
                      {"name": "vllm"}, "tokens_per_s", tok, VLLM_4090))
    PUBLISHED.append((f"Mistral-7B concurrency {conc}, 256/128, P99 TTFT", MISTRAL_7B, "RTX4090", 1, "bf16", wl,
                      {"name": "vllm"}, "p99_ttft_ms", p99, VLLM_4090))
# Mixture of experts: hidden, layers, heads, kv_heads, dense ffn (0), vocab, experts, expert ffn, top-k
MIXTRAL_8X7B = (4096, 32, 32, 8, 0, 32000, 8, 14336, 2)
QWEN3_235B = (4096, 94, 64, 4, 0, 151936, 128, 1536, 8)
TRT_V017 = "NVIDIA/TensorRT-LLM docs/source/performance/perf-overview.md (v0.17 table)"
SGL_B200 = "gist.github.com/BenHamm/78563d0d0a08d7cb61b4737392633384 (SGLang, 8 x B200)"
V017_LENGTHS = [(128, 128), (128, 2048), (128, 4096), (500, 2000), (1000, 1000), (2048, 128), (2048, 2048),
                (5000, 500), (20000, 2000)]
V017_MIXTRAL = [
    ("H200", 1, [17158, 15095, 9535, 12105, 10371, 2010, 6940, 2309, 1152]),
    ("H100", 1, [15962, 8290, 4785, 6801, 6869, 1893, 3983, 1765, 674]),
]
V017_MIXTRAL_TP2 = [
    ("H200", 2, [27825, 29584, 21565, 23411, 19151, 3383, 14007, 4224, 2299]),
    ("H100", 2, [27451, 22830, 14237, 17036, 15771, 3334, 10686, 3646, 1757]),
]


def _v017_rows(table):
    out = []
    for dev, tp, figs in table:
        for (isl, osl), pub in zip(V017_LENGTHS, figs):
            out.append((f"Mixtral-8x7B offline {isl}/{osl}", MIXTRAL_8X7B, dev, tp, "fp8",
                        {"offline": True, "requests": OVERVIEW_REQUESTS[(isl, osl)], "prompt_len": isl,
                         "gen_len": osl}, {"cuda_graph_max_bs": 8192}, "tokens_per_s", pub, TRT_V017))
    return out


PUBLISHED += _v017_rows(V017_MIXTRAL)
# TRT_V017's dense FP16 rows on the A100 (the page's only non-FP8 Hopper-era
# figures): Llama-3.1-8B at TP1 and Llama-3.1-70B at TP4 (NVLink). The TP1
# rows chose the 16-bit tile efficiency of the wave model (0.75,
# src/cost/costroofline.c), so they do not check it.
LLAMA31_70B = LLAMA33_70B
REPORTED_A100 = []  # the TP8 rows: compared, not asserted (decode-heavy rows up to +34 %, docs/costmodel.md)
V017_A100 = [
    ("Llama-3.1-8B", LLAMA31_8B, 1, [6627.27, 5255.99, 3453.79, 4276.58, 3786.83, 799.61, 2424.16, 825.13, 330.04]),
    ("Llama-3.1-70B", LLAMA31_70B, 4, [2733.48, 2811.27, 1976.49, 2275.79, 1921.77, 325.15, 1393.64, 392.62, 212.08]),
    ("Llama-3.1-70B", LLAMA31_70B, 8, [4717.62, 5241.5, 3724.67, 4445.37, 3320.41, 542.38, 2553.71, 696.34, 413.38]),
]
for name, shape, tp, figs in V017_A100:
    for (isl, osl), pub in zip(V017_LENGTHS, figs):
        (PUBLISHED if tp <= 4 else REPORTED_A100).append((f"{name} offline {isl}/{osl}", shape, "A100", tp, "fp16",
                          {"offline": True, "requests": OVERVIEW_REQUESTS[(isl, osl)], "prompt_len": isl,
                           "gen_len": osl}, {"cuda_graph_max_bs": 8192}, "tokens_per_s", pub, TRT_V017))
# LLAMACPP_4090: llama-bench on one RTX 4090, CodeLlama-7B in F16 (Llama-2-7B
# shape, vocab 32016), all layers on the GPU, a build of January 2024 (before
# llama.cpp's CUDA graphs): pp512 (one 512-token prompt, tokens/s) and tg128
# (128 tokens generated one at a time from an empty context, tokens/s).
CODELLAMA_7B = (4096, 32, 32, 32, 11008, 32016)
LLAMACPP_4090 = "ggml-org/llama.cpp pull 4766 (llama-bench, RTX 4090)"
PUBLISHED += [
    ("CodeLlama-7B llama-bench pp512", CODELLAMA_7B, "RTX4090", 1, "fp16", {"batch": 1, "prompt_len": 512, "gen_len": 1},
     {"name": "llamacpp", "cuda_graph_max_bs": 0}, "prompt_tok_s", 11048.22, LLAMACPP_4090),
    ("CodeLlama-7B llama-bench tg128", CODELLAMA_7B, "RTX4090", 1, "fp16", {"batch": 1, "prompt_len": 1, "gen_len": 128},
     {"name": "llamacpp", "cuda_graph_max_bs": 0}, "decode_tok_s", 61.03, LLAMACPP_4090),
]
PUBLISHED.append(("Qwen3-235B-A22B concurrency 1, 1K/1K, TPOT", QWEN3_235B, "B200", 8, "bf16",
                  {"concurrency": 1, "requests": 16, "prompt_len": 1024, "gen_len": 1024}, {"name": "sglang"},
                  "tpot_ms", 6.70, SGL_B200))
# compared in --table, not asserted (see the docstring)
REPORTED = list(REPORTED_A100)
# TRT_V017's Mixtral 8x7B at TP4 and TP8 (FP8, H200 and H100) and at TP2-TP8 in FP16 on A100s: added after the
# all-reduce model was chosen, as a check of it (docs/costmodel.md)
V017_MIXTRAL_HELD_OUT = [
    ("H200", 4, "fp8", [42551.59, 52291.78, 39513.73, 43818.99, 33580.9, 5467.62, 24980.93, 7084.94, 4236.84]),
    ("H100", 4, "fp8", [41068.23, 41164.73, 27912.48, 34489.34, 27784.74, 5234.98, 19432.08, 6401.56, 3303.83]),
    ("H200", 8, "fp8", [53212.55, 68608.45, 54827.78, 58706.39, 44705.48, 7554.38, 36193.64, 10271.8, 6835.53]),
    ("H100", 8, "fp8", [50849.55, 61607.7, 48280.37, 52583.65, 40631.71, 6988.18, 30983.35, 9210.11, 5602.43]),
    ("A100", 2, "fp16", [5541.47, 4169.78, 2608.05, 3446.37, 3154.52, 649, 2056.58, 724.44, 337.51]),
    ("A100", 4, "fp16", [10324.28, 10911.86, 7666.51, 8456.21, 7122.84, 1237.62, 5222.98, 1500.55, 829.59]),
    ("A100", 8, "fp16", [17043.54, 20277.88, 15282.89, 17184.24, 12851.44, 2165.52, 9809.76, 2761.28, 1592.53]),
]
MIXTRAL_HELD_OUT = []
for dev, tp, dtype, figs in V017_MIXTRAL_HELD_OUT:
    for (isl, osl), pub in zip(V017_LENGTHS, figs):
        MIXTRAL_HELD_OUT.append((f"Mixtral-8x7B offline {isl}/{osl}", MIXTRAL_8X7B, dev, tp, dtype,
                                 {"offline": True, "requests": OVERVIEW_REQUESTS[(isl, osl)], "prompt_len": isl,
                                  "gen_len": osl}, {"cuda_graph_max_bs": 8192}, "tokens_per_s", pub, TRT_V017))
REPORTED += MIXTRAL_HELD_OUT
# TRT_V017's Mixtral 8x7B FP8 at TP2 (asserted since the all-reduce is NCCL's
# cost model, docs/costmodel.md; MoE bound)
PUBLISHED += _v017_rows(V017_MIXTRAL_TP2)
# TRT_V017's Llama-3.1-70B FP8 rows (the C++ runtime of v0.17, a version no
# constant was fitted on), TP1 to TP8: asserted; the TP8 rows were added as a
# check of the all-reduce model after it was chosen (docs/costmodel.md)
V017_70B_FP8 = [
    ("H200", 1, [4020.75, 4165.68, 2651.75, 3018.39, 2823.45, 465.99, 1913.8, 560.16, 279.52]),
    ("H200", 2, [6823.01, 8290.35, 6526.67, 6848.02, 5164.76, 809, 4183.88, 1025.38, 640.62]),
    ("H100", 2, [6645.12, 6169.58, 3897.06, 4972.57, 4390.53, 772.66, 2898.16, 919.73, 443.01]),
    ("H200", 4, [11098.63, 14156, 10574.06, 12452.79, 8911.29, 1358.06, 7130.44, 1811.55, 1199.68]),
    ("H100", 4, [11127.53, 11511.93, 7439.41, 9836.7, 7430.99, 1302.6, 5480.03, 1602.78, 920.19]),
    ("H200", 8, [15355.84, 21195.88, 16941.52, 17278.4, 13181.24, 1983.03, 11142.47, 2717.83, 1920.45]),
    ("H100", 8, [14730.69, 17061.82, 14171.43, 14679.33, 11451.16, 1923.41, 8801.95, 2457.42, 1512.6]),
]
# TRT_OVERVIEW's Llama-3.1-405B FP8 at TP8 (H200, H100): asserted
LLAMA31_405B = (16384, 126, 128, 8, 53248, 128256)
for dev, figs in [("H200", [3814, 5348, 4741, 4724, 3330, 3722, 456, 2948, 650, 505]),
                  ("H100", [3627, 4340, 3116, 3994, 2919, 2895, 453, 2296, 610, 345])]:
    for (isl, osl), pub in zip(LENGTHS, figs):
        PUBLISHED.append((f"Llama-3.1-405B offline {isl}/{osl}", LLAMA31_405B, dev, 8, "fp8",
                         {"offline": True, "requests": OVERVIEW_REQUESTS[(isl, osl)], "prompt_len": isl,
                          "gen_len": osl}, {"cuda_graph_max_bs": 8192}, "tokens_per_s", pub, TRT_OVERVIEW))
for dev, tp, figs in V017_70B_FP8:
    for (isl, osl), pub in zip(V017_LENGTHS, figs):
        PUBLISHED.append((f"Llama-3.1-70B offline {isl}/{osl}", LLAMA31_70B, dev, tp, "fp8",
                         {"offline": True, "requests": OVERVIEW_REQUESTS[(isl, osl)], "prompt_len": isl,
                          "gen_len": osl}, {"cuda_graph_max_bs": 8192}, "tokens_per_s", pub, TRT_V017))
for (isl, osl), pub in zip(LENGTHS, [30429, 42821, 26852, 28026, 23789, 22061, 3331, 16672, 3623, 1876]):
    REPORTED.append((f"Qwen3-235B-A22B offline {isl}/{osl}", QWEN3_235B, "H200", 8, "fp8",
                     {"offline": True, "requests": OVERVIEW_REQUESTS[(isl, osl)], "prompt_len": isl, "gen_len": osl},
                     {"cuda_graph_max_bs": 8192}, "tokens_per_s", pub, TRT_OVERVIEW))
EAGER = {"cuda_graph_max_bs": 0}
PUBLISHED += [
    ("Llama-2-7B batch 768, 128/128", LLAMA2_7B, "H100", 1, "fp8", {"batch": 768, "prompt_len": 128, "gen_len": 128},
     EAGER, "tokens_per_s", 19694, TRT_PERF_061),
    ("Llama-2-7B batch 80, 2048/128", LLAMA2_7B, "H100", 1, "fp8", {"batch": 80, "prompt_len": 2048, "gen_len": 128},
     EAGER, "tokens_per_s", 2244, TRT_PERF_061),
    ("Llama-2-7B batch 1 TTFT, 128 prompt", LLAMA2_7B, "H100", 1, "fp8", {"batch": 1, "prompt_len": 128, "gen_len": 1},
     EAGER, "ttft_ms", 7, TRT_PERF_061),
    ("Llama-2-7B batch 1 TTFT, 2048 prompt", LLAMA2_7B, "H100", 1, "fp8",
     {"batch": 1, "prompt_len": 2048, "gen_len": 1}, EAGER, "ttft_ms", 36, TRT_PERF_061),
    ("Llama-2-7B batch 384, 128/128", LLAMA2_7B, "A100", 1, "fp16", {"batch": 384, "prompt_len": 128, "gen_len": 128},
     EAGER, "tokens_per_s", 5586, TRT_PERF_061),
    ("Llama-2-7B batch 1 TTFT, 2048 prompt", LLAMA2_7B, "A100", 1, "fp16",
     {"batch": 1, "prompt_len": 2048, "gen_len": 1}, EAGER, "ttft_ms", 133, TRT_PERF_061),
]
# the page's other LLaMA 7B TP1 peak-throughput rows (no constant was chosen on them)
for dev, dtype, batch, isl, osl, pub in [("H100", "fp8", 112, 128, 2048, 6818), ("H100", "fp8", 48, 2048, 2048, 2740),
                                         ("A100", "fp16", 60, 128, 2048, 1928), ("A100", "fp16", 52, 2048, 128, 591)]:
    PUBLISHED.append((f"Llama-2-7B batch {batch}, {isl}/{osl}", LLAMA2_7B, dev, 1, dtype,
                      {"batch": batch, "prompt_len": isl, "gen_len": osl}, EAGER, "tokens_per_s", pub, TRT_PERF_061))
# The page's other v0.5 first-token latencies (batch 1): asserted, but for the 128-token LLaMA 70B one at
# TP4 on H100s (-29 %, not asserted); the 128-token ones are under-predicted in FP16 on the A100 as in FP8
# on the H100 (docs/costmodel.md: small-M GEMMs)
LLAMA2_70B = (8192, 80, 64, 8, 28672, 32000)
for label, shape, dev, tp, dtype, isl, pub in [
        ("Llama-2-7B", LLAMA2_7B, "A100", 1, "fp16", 128, 16), ("Llama-2-70B", LLAMA2_70B, "H100", 4, "fp8", 128, 26),
        ("Llama-2-70B", LLAMA2_70B, "H100", 4, "fp8", 2048, 109), ("Llama-2-70B", LLAMA2_70B, "A100", 4, "fp16", 128, 47),
        ("Llama-2-70B", LLAMA2_70B, "A100", 4, "fp16", 2048, 377)]:
    (REPORTED if (dev, tp, isl) == ("H100", 4, 128) else PUBLISHED).append((f"{label} batch 1 TTFT, {isl} prompt",
                                                                          shape, dev, tp, dtype,
                     {"batch": 1, "prompt_len": isl, "gen_len": 1}, EAGER, "ttft_ms", pub, TRT_PERF_061))


# metrics derived from estimate's figures: llama-bench's prompt and generation rates
DERIVED = {"prompt_tok_s": lambda fig, wl: wl["prompt_len"] * 1e3 / fig["ttft_ms"],
           "decode_tok_s": lambda fig, wl: 1e3 / fig["tpot_ms"]}


def estimate(shape, device, tp, dtype, workload, engine):
    H, L, nh, kv, F, V = shape[:6]
    arch = {"hidden": H, "head_dim": 128, "vocab": V, "layers": [{"heads": nh, "kv_heads": kv, "ffn": F}] * L}
    if len(shape) > 6:  # mixture of experts: every layer sparse
        E, Fe, k = shape[6:]
        arch["top_k"] = k
        arch["layers"] = [{"heads": nh, "kv_heads": kv, "ffn": 0, "experts": E, "expert_ffn": Fe}] * L
    req = {"architecture": arch,
           "target": {"device": device, "tp": tp,
                      "engine": dict({"name": "trtllm", "weights_dtype": dtype, "kv_dtype": dtype}, **engine),
                      "workload": workload}}
    return cli_estimate(req)["figures"]


def rows(published=None):
    out = []
    for row in PUBLISHED if published is None else published:
        _, shape, device, tp, dtype, workload, engine, metric, pub, _ = row
        fig = estimate(shape, device, tp, dtype, workload, engine)
        pred = DERIVED[metric](fig, workload) if metric in DERIVED else fig[metric]
        out.append((row, fig, pred, pred / pub - 1))
    return out


def table():
    lines = ["| figure | GPU, TP, dtype | workload | published | estimate | error | source, engine |",
             "|---|---|---|---|---|---|---|"]
    got = rows()
    reported = rows(REPORTED)
    for row, fig, pred, err in got + reported:
        label, _, device, tp, dtype, workload, engine, metric, pub, src = row
        if metric in ("ttft_ms", "p99_ttft_ms"):
            pub_s, pred_s = f"{'P99 ' if metric != 'ttft_ms' else ''}TTFT {pub} ms", f"{pred:.1f} ms"
        elif metric == "tpot_ms":
            pub_s, pred_s = f"TPOT {pub} ms", f"{pred:.2f} ms"
        elif metric in DERIVED:
            pub_s, pred_s = f"{pub:,.1f} tok/s", f"{pred:,.1f} tok/s"
        else:
            pub_s, pred_s = f"{pub:,} tok/s", f"{pred:,.0f} tok/s"
        wl = (f"offline, {workload['requests']} requests" if workload.get("offline")
              else f"concurrency {workload['concurrency']}, {workload['requests']} requests"
              if workload.get("concurrency") else f"batch {workload['batch']}")
        ref = {TRT_OVERVIEW: "[1]", TRT_PERF_061: "[2]", VLLM_4090: "[3]", TRT_V017: "[4]", SGL_B200: "[5]",
               LLAMACPP_4090: "[6]"}[src]
        mark = " (not asserted)" if row in REPORTED else ""
        lines.append(f"| {label}{mark} | {device} TP{tp} {dtype.upper()} | {wl} | {pub_s} | {pred_s} "
                     f"| {100 * err:+.0f}% | {ref} {engine.get('name', 'trtllm')} |")
    dense = [abs(g[3]) for g in got if len(g[0][1]) == 6]
    moe = [abs(g[3]) for g in got if len(g[0][1]) > 6]
    rep = [abs(g[3]) for g in reported]
    tp = [abs(g[3]) for g in got if g[0][3] > 1]
    lines.append("")
    lines.append(f"{len(dense)} dense rows: median |error| {100 * statistics.median(dense):.1f}%, worst "
                 f"{100 * max(dense):.1f}%; {len(moe)} mixture-of-experts rows: median "
                 f"{100 * statistics.median(moe):.1f}%, worst {100 * max(moe):.1f}%; of them {len(tp)} tensor-parallel rows: "
                 f"median {100 * statistics.median(tp):.1f}%, worst {100 * max(tp):.1f}%; {len(rep)} rows not "
                 f"asserted: median {100 * statistics.median(rep):.1f}%, worst {100 * max(rep):.1f}%.")
    return "\n".join(lines)


def test_gpu_profiles_within_bound():
    got = rows()
    for row, fig, pred, err in got:
        print(f"   {row[0]} on {row[2]} TP{row[3]} {row[4]}: published {row[8]}, estimate {pred:.1f} "
              f"({100 * err:+.1f}%)", flush=True)
    dense = [abs(g[3]) for g in got if len(g[0][1]) == 6]
    moe = [abs(g[3]) for g in got if len(g[0][1]) > 6]
    med, moe_med = statistics.median(dense), statistics.median(moe)
    print(f"   {len(dense)} dense rows: median |error| {100 * med:.1f}% (bound {100 * MEDIAN_BOUND:.0f}%); "
          f"{len(moe)} mixture-of-experts rows: median {100 * moe_med:.1f}% (bound {100 * MOE_MEDIAN_BOUND:.0f}%), worst "
          f"{100 * max(moe):.1f}% (bound {100 * MOE_BOUND:.0f}%); "
          f"worst of all {100 * max(dense + moe):.1f}% (bound {100 * BOUND:.0f}%)", flush=True)
    assert len(dense) >= 167 and len(moe) >= 37
    tp = [abs(g[3]) for g in got if g[0][3] > 1]
    print(f"   {len(tp)} tensor-parallel rows: median |error| {100 * statistics.median(tp):.1f}% "
          f"(bound {100 * TP_MEDIAN_BOUND:.0f}%), worst {100 * max(tp):.1f}%", flush=True)
    assert len(tp) >= 115 and statistics.median(tp) <= TP_MEDIAN_BOUND, statistics.median(tp)
    assert any(g[0][9] == LLAMACPP_4090 for g in got), "no llama.cpp row"
    assert any(g[0][2] == "A100" and g[0][5].get("offline") for g in got), "no served A100 row"
    assert any(g[0][2] == "B200" for g in got if len(g[0][1]) > 6), "no B200 mixture-of-experts row"
    # the B200 profile on an MoE model (docs/costmodel.md states its error, +1.8 %, and this bound)
    for row, fig, pred, err in got:
        if row[2] == "B200" and len(row[1]) > 6:
            print(f"   B200 MoE check: {row[0]}: predicted {pred:.2f} against {row[8]} ({100 * err:+.1f}%, "
                  f"bound {100 * B200_MOE_BOUND:.0f}%)")
            assert abs(err) <= B200_MOE_BOUND, (row[0], pred, row[8], err)
    for row, fig, pred, err in got:
        assert abs(err) <= BOUND, (row[0], row[2], pred, row[8], err)
        if row[9] == LLAMACPP_4090:
            assert abs(err) <= LLAMACPP_BOUND, (row[0], pred, row[8], err)
    assert med <= MEDIAN_BOUND, med
    assert moe_med <= MOE_MEDIAN_BOUND, moe_med
    assert max(moe) <= MOE_BOUND, max(moe)


if __name__ == "__main__":
    if "--table" in sys.argv:
        print(table())
        sys.exit(0)
    R = Runner()
    if not os.path.exists(CLI):
        print("SKIP: build/autocompress missing")
        R.skipped += 1
    else:
        R.run(test_gpu_profiles_within_bound)
    R.done()
