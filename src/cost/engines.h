/*
 * engines.h - the serving engines a prediction can be for, each with the
 * defaults of the version docs/costmodel.md names: how its scheduler forms
 * an iteration (a token budget, chunked prefill mixed with decodes or
 * prefill first, admission that reserves a request's whole KV cache or
 * grows it and preempts), its KV block size, how much of the device it
 * preallocates, which batch sizes run as CUDA graphs, its per-step
 * overhead. The list of names is the one the job spec's
 * target.engine.name accepts.
 *
 * Two steps: ac_engine_profile_named at spec time (the name's static
 * defaults, which the spec may override), ac_engine_resolve at prediction
 * time (the defaults that depend on the device's memory and the workload,
 * as the engines choose them at start-up).
 */
#ifndef AC_ENGINES_H
#define AC_ENGINES_H

#include "cost/costmodel.h"
#include "core/err.h"

/* The known names, NULL-terminated: vllm, trtllm, sglang, llamacpp,
 * autocompress-cpu (the local CPU engine). */
extern const char *const ac_engine_names[];

/* Index of name in ac_engine_names, or -1. */
int ac_engine_find(const char *name);

/* Fill p with engine `index`'s static defaults (dtype bytes from is_cpu:
 * fp32 on the CPU, else bf16). Scheduler fields the device decides stay 0. */
void ac_engine_profile_named(int index, int is_cpu, ac_engine_profile *p);

/* What a served prediction runs with, every default resolved. */
typedef struct {
    int budget;        /* tokens per iteration */
    int max_seqs;      /* running requests at most */
    int chunked;       /* a prompt longer than the budget left is split (else it waits for a step it fits) */
    int prefill_first; /* a step with prompt work runs no decodes (SGLang without mixed chunks) */
    int reserve_all;   /* admission reserves blocks for prompt + output (TRT-LLM's GUARANTEED_NO_EVICT) */
    int graph_max;     /* largest captured size (0: no CUDA graphs) */
    int graph_tokens; /* graphs keyed by a step's tokens, any step (vLLM's piecewise graphs); else decode-only steps by sequences */
    int graph_piecewise;  /* attention runs outside the graph (its launches stay) */
    double pool_of_free;  /* KV pool: this fraction of the memory left after weights and activations (TRT-LLM) ... */
    double mem_util;      /* ... or this fraction of the device minus weights, activations, overhead (vLLM, SGLang) */
    long fixed_kv_tokens; /* > 0: the KV cache is this many tokens, preallocated whole (llama.cpp's n_ctx x slots) */
    int block_size;
    int tp;
    double link_gbs, link_us;
    int link_nvlink;      /* the link is NVLink (else PCIe) */
    double ll_gbs;        /* NCCL's LL bus-bandwidth cap of the GPU's generation (device.h) */
    double custom_max;    /* bytes up to which the engine's own all-reduce kernels run (0: NCCL only) */
    double oneshot_max;   /* ... in one stage below these bytes, two stages above */
    int act_step; /* memory_gib holds the activations of one step of the budget (a named engine that chunks
                     prompts), not every prompt of the batch at once (docs/costmodel.md) */
} ac_engine_rt;

/* Resolve p for a device of mem_gib named device (a cost table's device
 * string) and the workload w. */
void ac_engine_resolve(const ac_engine_profile *p, double mem_gib, const char *device, const ac_workload *w,
                       ac_engine_rt *rt);

/* Padded size a CUDA graph runs a step of n at (vLLM's capture list:
 * 1, 2, 4, then multiples of 8), or 0 when n is beyond graph_max. */
int ac_engine_graph_size(const ac_engine_rt *rt, int n);

/* Microseconds of one all-reduce of bytes over tp GPUs of one node; 0 at
 * tp <= 1. Over NVLink, up to custom_max bytes, the engine's own kernels
 * (one-shot: each GPU reads the tp - 1 others' whole buffers; two-shot: a
 * reduce-scatter and an all-gather, 2 (tp - 1) / tp of the bytes), each
 * phase behind a barrier; else NCCL's ring, the fastest of its LL, LL128
 * (NVLink only) and Simple protocols by NCCL's own cost model (a base
 * latency, a latency per ring step, the bus bandwidth the protocol gets).
 * docs/costmodel.md, "Tensor parallelism", gives each constant's source. */
double ac_engine_allreduce_us(const ac_engine_rt *rt, double bytes);

/* Tensor parallelism over tp GPUs as vLLM shards a layer (QKVParallelLinear,
 * MergedColumnParallelLinear, RowParallelLinear): the query heads split tp
 * ways; the KV heads too, or, when there are no more of them than GPUs,
 * each GPU holds one and tp must be a multiple of them (replicas); the FFN
 * splits tp ways. A layer without attention (heads 0) or without an FFN
 * has nothing to split there.
 * ac_tp_attn_splits: 1 when heads query and kv KV heads split tp ways.
 * ac_tp_layer_unsplit: NULL when layer y splits tp ways, else what does
 * not ("query heads", "KV heads (...)", "FFN width") with its count in *v. */
int ac_tp_attn_splits(int tp, int heads, int kv);
const char *ac_tp_layer_unsplit(int tp, const ac_layer_arch *y, int *v);

#endif
