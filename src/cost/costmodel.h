/*
 * costmodel.h - hardware cost tables and the serving-workload model.
 *
 * A cost table holds what one device costs per operator, measured
 * (micro-benchmarks of the kernels a layer is made of: GEMM over an
 * (M, N, K) grid, one attention head over a (queries, keys) grid, an
 * elementwise cost) or derived from a datasheet spec (roofline). Prediction
 * walks an architecture layer by layer, looks operators up (log-log
 * interpolation between grid points, extrapolation by FLOPs beyond it) and
 * adds the engine profile's overheads, giving TTFT, TPOT, output
 * throughput, peak memory and the largest batch that fits.
 *
 * Widths are continuous (ac_carch) so the search can take gradients:
 * ac_cost_grad differentiates the prediction with respect to every
 * per-layer width (central differences of the piecewise log-linear
 * interpolant, exact between grid points).
 *
 * Files: costtable.c (the table, interpolating lookups), costroofline.c
 * (tables from datasheet profiles), costmeasure.c (the local CPU's table,
 * measured quiet: quiet.c),
 * costmodel.c (prediction and gradients), costjson.c (tables as JSON),
 * costsource.c (which table a target gets: cache, measurement, roofline),
 * engines.c (the serving engines' defaults, engines.h), serve.c (the
 * engine's scheduler simulation for served workloads, serve_int.h).
 * The library knows no database: a cache of tables is an ac_cost_cache the
 * caller hands in (the daemon and the CLI back it with SQLite,
 * daemon/costcache.c).
 *
 * Ownership: ac_cost_table owns its arrays (ac_cost_table_free).
 */
#ifndef AC_COSTMODEL_H
#define AC_COSTMODEL_H

#include <jansson.h>

#include "cost/device.h"
#include "core/err.h"
#include "format/model.h"
#include "runtime/block.h"
#include "cost/target.h"

#define AC_CT_VERSION 4
#define AC_CT_MAXG 16

typedef struct {
    char key[384], device[160], dtype[16], engine[48], source[16];
    int version;
    int roofline; /* 1: computed from spec, no grids */
    double peak_tflops, bw_gbs, eta_c, eta_m, launch_us, mem_gib;
    /* roofline tables: the GEMM rate with FP16 accumulate (the profile's
     * fp16acc_tflops, else peak_tflops; 0 in an older table read from JSON:
     * the peak), for an engine whose GEMMs accumulate in FP16 (gemm_f16_acc);
     * fp8_act: FP8 GEMMs on FP8 tensor cores, which quantise their input.
     * Both kept in the table's JSON with sms (costjson.c). */
    double peak_acc16_tflops;
    int sms; /* roofline tables: the profile's SM count (0: no wave model) */
    int fp8_act;
    int nm, nn, nk;
    double gm[AC_CT_MAXG], gn[AC_CT_MAXG], gk[AC_CT_MAXG];
    double *gemm_us;      /* [nm][nn][nk], weights cold (read from memory) */
    double *gemm_warm_us; /* same grid, weights in cache; NULL = use gemm_us */
    double cache_bytes;   /* effective cache: models whose weights fit run warm (prefill) */
    /* CPU decode (costmeasure.c): a step costs the warm-weight tables plus
     * dec_us_mib[i] microseconds per MiB it streams (weights + KV read) when
     * its working set is dec_ws[i] bytes: log-linear between the bands,
     * constant beyond them; measured at batch 1 and (dec_b4) at batch 4
     * (dec_us_mib4), linear in log batch between, constant beyond 4.
     * ndec 0: decode blends warm/cold like prefill.
     * dec_kv 1: the bands are per MiB of weights, and the KV cache a step
     * reads costs dec_kv_us_mib[i] per MiB beyond the warm attention table
     * (measured end to end at a long context, same working-set bands);
     * dec_kv 0 (older tables): the KV cache is charged at the weights' rate. */
    int ndec, dec_b4, dec_kv;
    double dec_ws[AC_CT_MAXG], dec_us_mib[AC_CT_MAXG], dec_us_mib4[AC_CT_MAXG], dec_kv_us_mib[AC_CT_MAXG];
    int nhd, naq, nas;
    double ahd[AC_CT_MAXG], aq[AC_CT_MAXG], as[AC_CT_MAXG];
    double *attn_us;  /* [nhd][naq][nas], one head, one sequence;
                                   * as[] is the grid of "extra keys" e = keys - queries + 1 */
    double elem_ns;   /* per element of elementwise passes */
    /* CPU mixture-of-experts layers (costmeasure.c): one expert as the
     * engine runs it (ac_block_cpu_expert: its rows gathered, the gate and
     * up GEMMs, silu x up, the down GEMM, the rows added back scaled by
     * their routing weight) over a grid of rows routed to it (erows),
     * expert width (effn) and the width it reads and writes (ehid), weights
     * cold (expert_us, rotating through the pool as distinct experts are
     * read once a step) and warm (expert_warm_us). nre 0 (tables measured
     * before them, GPU and roofline tables): the experts are priced on the
     * GEMM grid. */
    int nre, nfe, nhe;
    double erows[AC_CT_MAXG], effn[AC_CT_MAXG], ehid[AC_CT_MAXG];
    double *expert_us, *expert_warm_us; /* [nre][nfe][nhe] */
    double measure_s; /* seconds the measurement took */
    /* Measured CPU tables (quiet.h): the reference probe's time when the
     * machine was quiet (0: not recorded), units measured again because a
     * neighbour slowed them, units still disturbed at the end. */
    double ref_us;
    int quiet_remeasured, quiet_disturbed;
} ac_cost_table;

void ac_cost_table_free(ac_cost_table *t);
json_t *ac_cost_table_to_json(const ac_cost_table *t);
int ac_cost_table_from_json(const json_t *j, ac_cost_table *t, ac_err *e);
/* Validate an imported table; *field names the offending field. */
int ac_cost_table_validate(const json_t *j, const char **field, ac_err *e);

/* The weight dtypes the local CPU's tables are measured in: "fp32" (the
 * engine's fp32 weights) and "bf16" (BF16 weights, resident or a BF16
 * copy: the CPU's BF16 kernel from 32 rows, the decode GEMV up to 8, per
 * tile between). */
int ac_cost_cpu_dtype_ok(const char *dtype);
/* The CPU table dtype for an engine profile's weight dtype
 * (ac_engine_profile_dtype): "bf16" for bf16, else "fp32" (fp16 and fp8
 * have no CPU kernels of their own). */
const char *ac_cost_cpu_table_dtype(const char *profile_dtype);
/* The table key of the local CPU for the autocompress engine on weights of
 * dtype ("bf16", else fp32): the node kind (the CPU model, the instruction
 * sets its kernels choose between, ac_cpu_isa, and the threads), so a table
 * serves every host of that kind and no other. device (when not NULL): the
 * host in words, "cpu: MODEL (N threads)". */
void ac_cost_cpu_key(int threads, const char *dtype, char *key, size_t n, char *device, size_t dn);
/* The table key of a CUDA GPU (name and compute capability as the plugin
 * reports them, major*10+minor) for the cuBLAS engine: the node kind is the
 * GPU model, its compute capability and the driver's version
 * (ac_cuda_driver_version), so tables measured under another driver are
 * measured again rather than shared. */
void ac_cost_cuda_key(const char *gpu_name, int cc, char *key, size_t n);
/* Measure the local CPU (the engine's own kernels) for weights of dtype
 * (ac_cost_cpu_dtype_ok). progress may be NULL. */
int ac_cost_measure_cpu(int threads, const char *dtype, void (*progress)(void *, double), void *ud, ac_cost_table *t,
                        ac_err *e);
/* The reference probe of quiet measurements (quiet.h): microseconds of a
 * fixed compute-bound GEMM on the engine's kernels, at the threads set. */
double ac_cost_ref_probe_us(void);
/* The same as the probe callback of an ac_quiet (ud unused). */
double ac_cost_ref_probe_cb(void *ud);
/* on = 1: ac_cost_measure_cpu times by the calling thread's CPU time, not
 * the wall clock: a diagnostic for a loaded machine, meaningful at 1 thread
 * only (bench_costmodel's AC_BENCH_CLOCK=thread). Not for tables to keep. */
void ac_cost_measure_thread_clock(int on);
/* Roofline table for a named spec profile and weight dtype. */
int ac_cost_roofline(const ac_device_spec *s, const char *dtype, ac_cost_table *t, ac_err *e);

/* A cache of cost tables, keyed by ac_cost_table.key. get: *found = 0 when
 * absent, -1 with e for an entry that cannot be read. put may be NULL (a
 * read-only cache: the daemon's worker, whose tables the daemon stores from
 * the job's cost_table event). */
typedef struct ac_cost_cache {
    int (*get)(void *ud, const char *key, ac_cost_table *t, int *found, ac_err *e);
    int (*put)(void *ud, const ac_cost_table *t, ac_err *e);
    void *ud;
} ac_cost_cache;
/* get through a cache that may be NULL (then nothing is found). */
int ac_cost_cache_lookup(const ac_cost_cache *c, const char *key, ac_cost_table *t, int *found, ac_err *e);

/* Operator costs (microseconds). */
double ac_cost_gemm_us(const ac_cost_table *t, double m, double n, double k);
/* One SwiGLU expert of fe channels reading and writing width h on m rows
 * routed to it, from the table's measured expert grid (the whole
 * per-expert path: gather, three GEMMs, activation, scatter-add); warm:
 * its weights in cache. 0 when the table has no expert grid. */
double ac_cost_expert_us(const ac_cost_table *t, double m, double fe, double h, int warm);
double ac_cost_attn_us(const ac_cost_table *t, double heads, double kv_heads, double batch, double nq, double s,
                       int head_dim);

/* Continuous architecture: per-layer widths as reals (0 = removed).
 * Mixture-of-experts layers (experts != NULL, in a model with any): a layer
 * with experts[l] > 0 has that many experts of effn[l] channels each, of
 * which each token is routed to top_k (its dense ffn[l] is 0). */
typedef struct {
    int n_layers, head_dim, vocab, tie;
    double hidden;
    double *heads, *kv, *ffn; /* n_layers each, owned */
    double *experts, *effn;   /* n_layers each, owned; NULL in a dense model */
    int top_k;
    int qkv_bias, qk_norm; /* the attention's biases and per-head norms (parameters only) */
    /* Matrices of a dense FFN and of each expert: 3 (SwiGLU: gate, up,
     * down) or 2 (nemotron_h's squared-ReLU MLP: up, down); 0 reads as 3. */
    int ffn_mats;
    /* nemotron_h MoE layers: the shared expert's width (up, down) and, in
     * a LatentMoE model, the latent width the experts read and write
     * between a down and an up projection; 0 without. */
    double shared_ffn, moe_latent;
    /* Mamba-2 mixers (nemotron_h): ssm[l] heads in layer l (0: none; NULL
     * in a model without them), each ssm_head_dim wide; ssm_groups groups
     * share B and C of ssm_state each; a depthwise causal conv of ssm_conv
     * taps (with a bias when ssm_conv_bias). A mixer keeps, per sequence,
     * its conv window and its SSM state, in fp32 whatever the weights are
     * (ac_carch_state_bytes): memory that does not grow with the context. */
    double *ssm; /* n_layers, owned */
    double ssm_head_dim; /* real: the gate search's expected head dim (dnas_hybrid.c) */
    int ssm_state, ssm_groups, ssm_conv, ssm_conv_bias;
    /* Each layer's block recipe (runtime/block.h): the layer's computation,
     * which the model walks (its LINEARs are its GEMMs); n_layers, the
     * array owned, the recipes static. NULL (a carch filled by hand): the
     * Llama recipe. */
    const ac_block_recipe **recipe;
} ac_carch;

int ac_carch_from_arch(const ac_arch *a, ac_carch *c, ac_err *e);
void ac_carch_free(ac_carch *c);
/* Every parameter held (all experts, not only the active ones). */
double ac_carch_params(const ac_carch *c);
/* Bytes one sequence's Mamba state takes (every Mamba layer's conv window,
 * ssm_conv - 1 rows of its conv channels, and SSM state, heads x head_dim
 * x ssm_state, in fp32); 0 without Mamba layers. */
double ac_carch_state_bytes(const ac_carch *c);
/* Experts with at least one of T tokens routed to them, in expectation, in
 * a layer of E experts with top-k routing, each token's k experts drawn
 * uniformly: E (1 - (1 - k/E)^T). A decode step of B sequences (T = B)
 * reads these experts' weights; a prefill of many tokens reads all E. */
double ac_moe_active_experts(double E, double k, double T);

/* Which prices the experts of c's mixture-of-experts layers on table t:
 * "expert_grid" (the table's measured expert grid, ac_cost_expert_us: a
 * CPU table measured with it, SwiGLU experts), "gemm_grid" (one GEMM of
 * its gathered rows per expert, from the GEMM grid: CPU tables measured
 * before the expert grid, nemotron_h's squared-ReLU experts, CPU spec
 * profiles), "grouped_gemm" (a GPU engine's one grouped GEMM over the
 * reached experts: GPU tables and profiles); NULL for a model without
 * experts. */
const char *ac_cost_expert_source(const ac_cost_table *t, const ac_carch *c);

/* A workload: a static batch (batch sequences prefilled together, then
 * decoded together), or a served one (serve_int.h) when arrival_rate,
 * concurrency or offline is set: `requests` requests through the engine's
 * scheduler. */
typedef struct {
    int batch, prompt_len, gen_len;
    double arrival_rate;  /* Poisson requests per second; 0 = none */
    int concurrency;      /* at most this many requests in flight (a closed loop without arrival_rate); 0 = none */
    int offline;          /* every request queued at time 0 */
    int requests;         /* requests simulated (0: AC_SERVE_REQUESTS) */
    double length_spread; /* prompt and output lengths uniform in L (1 +- spread); 0 = fixed */
    int seed;             /* arrivals and lengths */
} ac_workload;

/* Whether w is a served workload (the engine simulation) rather than a static batch. */
static inline int ac_workload_served(const ac_workload *w) {
    return w->arrival_rate > 0 || w->concurrency > 0 || w->offline;
}

/* A serving engine's behaviour (engines.h fills it from the engine's name
 * and the device; 0 in a scheduler field = the engine's default for the
 * device, resolved at prediction). */
typedef struct {
    char name[32];
    int w_bytes, kv_bytes, act_bytes;
    int block_size;
    double mem_util;        /* fraction of device memory the engine may use */
    double overhead_ms;     /* per forward call (scheduler, sampling, launch not in tables) */
    double seq_overhead_us; /* host work per sequence a forward call carries (scheduling, sampling, detokenising) */
    double overhead_gib;    /* runtime memory outside weights/KV/activations */
    int max_batched_tokens; /* tokens one iteration may schedule (the chunked-prefill budget) */
    int max_seqs;           /* requests running at once */
    int graph_max;          /* CUDA graphs captured up to this size (-1: none) */
    int tp;                 /* tensor-parallel GPUs (0 or 1: one) */
    double link_gbs;        /* all-reduce link bandwidth per direction, GB/s (0: the device's) */
    double link_us;         /* all-reduce fixed cost per call, us */
    int named;              /* target.engine.name named this engine (0: the device's default engine) */
    int gemm_f16_acc;       /* llama.cpp with F16 weights: cuBLAS GEMMs in FP16 accumulate, F32 activations
                               converted to F16 before and after each (docs/costmodel.md) */
} ac_engine_profile;

/* Defaults for a device class (jobspec.c then applies a spec's target.engine). */
void ac_engine_profile_default(ac_engine_profile *p, int is_cpu);
/* The CPU engine's default profile with its weights in a CPU table's dtype
 * ("bf16": 2 bytes; else fp32): what a CPU table's bands are per MiB of. */
void ac_engine_profile_cpu(ac_engine_profile *p, const char *dtype);
/* The weight dtype a profile's tables are keyed by: fp32, fp8 or bf16. */
const char *ac_engine_profile_dtype(const ac_engine_profile *p);

typedef struct {
    double ttft_ms, tpot_ms, tokens_per_s, e2e_ms;
    double mem_gib, weights_gib, kv_gib, act_gib;
    double state_gib; /* the Mamba layers' per-sequence state of the batch (ac_carch_state_bytes) */
    double params;
    int max_batch; /* largest batch that fits (memory) */
    double device_mem_gib;
    /* Percentiles over the requests (a static batch: all equal the figures above). */
    double p50_ttft_ms, p99_ttft_ms, p50_tpot_ms, p99_tpot_ms, p50_e2e_ms, p99_e2e_ms;
    double requests_per_s;
    int served;    /* 1: the figures come from the engine simulation */
    int preempted; /* requests the simulation preempted (KV pool full) */
    /* The engine's view of memory (per GPU under tensor parallelism):
     * what it preallocates (mem_util of the device), the KV pool in it, its
     * paged blocks, the tokens they hold, and the requests of the
     * workload's lengths they sustain at once. */
    double engine_mem_gib, kv_pool_gib;
    long kv_blocks;
    double kv_tokens;
    int kv_concurrency;
} ac_cost;

/* smooth = 1 drops tile quantisation (for gradients). */
void ac_cost_predict(const ac_cost_table *t, const ac_carch *c, const ac_workload *w, const ac_engine_profile *p,
                     int smooth, ac_cost *out);
/* Bytes one decode step streams, which are also its working set (the
 * weights once, the KV cache of B sequences at context S): the CPU decode
 * model's streamed bytes (S = 0: the weights alone). */
double ac_cost_decode_bytes(const ac_carch *c, const ac_engine_profile *p, double B, double S);
/* Decode bands made physical (costmeasure.c): v[i] x scale[i] (scale NULL:
 * v[i]) non-decreasing in i, by pooling adjacent violators, and >= 0
 * unless signed_ok. The batch-4 rates take scale = MiB of weights: their
 * total excess, not their rate per MiB, must not fall as the working set
 * grows. The weights' rates are signed: they correct the warm tables,
 * which may read a decode step's small GEMMs slower than the step runs
 * them (BF16 tables: -27 to -12 us/MiB up to 14 MiB); the KV cache's rate
 * is a cost on top (>= 0). */
void ac_cost_bands_monotone(double *v, const double *scale, int n, int signed_ok);
/* One decode step (microseconds) of B sequences reading a context of S
 * positions (the new token's included): what ac_cost_predict's TPOT
 * averages over the generated tokens. */
double ac_cost_decode_step_us(const ac_cost_table *t, const ac_carch *c, const ac_engine_profile *p, double B,
                              double S);
/* Metric selector for gradients. */
typedef enum {
    AC_M_TTFT,
    AC_M_TPOT,
    AC_M_TOKENS_PER_S,
    AC_M_MEM,
    AC_M_PARAMS,
    AC_M_P99_TTFT,
    AC_M_P99_TPOT,
    AC_M_P99_E2E,
    AC_M_COUNT
} ac_metric;
double ac_cost_metric(const ac_cost *c, ac_metric m);
/* The share of a request's predicted latency (E2E) that is fixed cost:
 * each kernel's launch and fixed latency (the table's launch_us) and the
 * engine's per-call overhead (the profile's overhead_ms), which no width,
 * head or layer moves: 1 - E2E with both set to zero / E2E (0..1). A
 * workload where it is high cannot tell architectures apart by cost. a
 * is the caller's prediction of (t, c, w, p) (ac_cost_predict, smooth 0);
 * one more prediction (one more simulation for a served workload) gives
 * the zero-overhead E2E: for reports, not for a search's inner loop. */
double ac_cost_overhead_share(const ac_cost_table *t, const ac_carch *c, const ac_workload *w,
                              const ac_engine_profile *p, const ac_cost *a);
/* d metric / d heads[l], kv[l], ffn[l] and d hidden (as grad_hidden). */
void ac_cost_grad(const ac_cost_table *t, const ac_carch *c, const ac_workload *w, const ac_engine_profile *p,
                  ac_metric m, double *g_heads, double *g_kv, double *g_ffn, double *g_hidden);
/* ac_cost_grad, and d metric / d experts[l] into g_experts (0 on layers
 * without experts, and everywhere in a dense model), from one pass (a
 * served workload's simulation runs once). */
void ac_cost_grad_experts(const ac_cost_table *t, const ac_carch *c, const ac_workload *w, const ac_engine_profile *p,
                          ac_metric m, double *gh, double *gkv, double *gf, double *ghid, double *g_experts);
json_t *ac_cost_to_json(const ac_cost *c);
/* {batch, prompt_len, gen_len} and, for a served workload, its serving fields. */
json_t *ac_workload_to_json(const ac_workload *w);

/* The cost table for a target (costsource.c): the local CPU's or GPU's from
 * the cache, else measured (allow_measure; progress may be NULL); a spec
 * profile's roofline for dtype. */
int ac_cost_table_for(const ac_target *target, const char *dtype, const ac_cost_cache *cache, int threads,
                      int allow_measure, void (*progress)(void *, double), void *ud, ac_cost_table *t, int *cache_hit,
                      ac_err *e);

#endif
