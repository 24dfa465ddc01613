/* engines.c - see engines.h; the defaults and where they come from are in docs/costmodel.md. */
#include "cost/engines.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "cost/device.h"

enum { E_VLLM, E_TRTLLM, E_SGLANG, E_LLAMACPP, E_CPU };
const char *const ac_engine_names[] = {"vllm", "trtllm", "sglang", "llamacpp", "autocompress-cpu", NULL};

int ac_engine_find(const char *name) {
    for (int i = 0; ac_engine_names[i]; i++)
        if (!strcmp(ac_engine_names[i], name)) return i;
    return -1;
}

/* Static defaults per engine: KV block (tokens), preallocated fraction,
 * per-step overhead, host work per sequence a step carries (SEQ_US),
 * memory outside weights/KV/activations. */
/* 0 for every engine: a per-sequence cost fitted on TensorRT-LLM's H200
 * Llama-3.1-8B rows (4 us) made the other asserted rows worse
 * (docs/costmodel.md, "Validation"); target.engine.seq_overhead_us sets it. */
#define SEQ_US 0.0
static const struct {
    int block_size;
    double mem_util, overhead_ms, seq_us, overhead_gib;
} DEF[] = {
    [E_VLLM] = {16, 0.9, 0.3, SEQ_US, 1.5},    /* block_size 16, gpu_memory_utilization 0.9 */
    [E_TRTLLM] = {32, 0.9, 0.3, SEQ_US, 1.5},  /* tokens_per_block 32, free_gpu_memory_fraction 0.9 */
    [E_SGLANG] = {1, 0.88, 0.3, SEQ_US, 1.5},  /* page_size 1, mem_fraction_static 0.88 at TP 1 */
    [E_LLAMACPP] = {1, 1.0, 0.3, SEQ_US, 0.5}, /* contiguous KV of n_ctx per slot */
    [E_CPU] = {1, 0.8, 0.0, 0.0, 0.0},
};

void ac_engine_profile_named(int index, int is_cpu, ac_engine_profile *p) {
    int named = index >= 0 && index <= E_CPU;
    if (!named) index = is_cpu ? E_CPU : E_VLLM;
    memset(p, 0, sizeof *p);
    p->named = named;
    snprintf(p->name, sizeof p->name, "%s", ac_engine_names[index]);
    p->w_bytes = p->kv_bytes = p->act_bytes = is_cpu ? 4 : 2;
    p->block_size = DEF[index].block_size;
    p->mem_util = DEF[index].mem_util;
    p->overhead_ms = DEF[index].overhead_ms;
    p->seq_overhead_us = DEF[index].seq_us;
    p->overhead_gib = DEF[index].overhead_gib;
    p->tp = 1;
}

/* llama-server: 4 slots (-np auto), n_ctx 4096 per slot, n_batch 2048. */
#define LLAMACPP_SLOTS 4
#define LLAMACPP_CTX 4096

void ac_engine_resolve(const ac_engine_profile *p, double mem_gib, const char *device, const ac_workload *w,
                       ac_engine_rt *rt) {
    memset(rt, 0, sizeof *rt);
    int e = ac_engine_find(p->name);
    if (e < 0) e = E_VLLM;
    int offline = w && w->offline;
    rt->tp = p->tp > 1 ? p->tp : 1;
    rt->block_size = p->block_size > 0 ? p->block_size : 1;
    rt->mem_util = p->mem_util;
    rt->chunked = 1;
    switch (e) {
    case E_VLLM: {
        /* EngineArgs.get_batch_defaults: >= 70 GiB and not an A100: 16384
         * tokens offline (LLM class), 8192 served, 1024 sequences; else
         * 8192 / 2048 and 256. Graph capture list 1, 2, 4, 8..min(2
         * max_num_seqs, 512) step 8, piecewise (attention outside) over a
         * step's tokens. */
        int big = mem_gib >= 70 && !(device && strcasestr(device, "A100"));
        rt->budget = big ? (offline ? 16384 : 8192) : (offline ? 8192 : 2048);
        rt->max_seqs = big ? 1024 : 256;
        rt->graph_max = 2 * rt->max_seqs < 512 ? 2 * rt->max_seqs : 512;
        rt->graph_tokens = rt->graph_piecewise = 1;
        break;
    }
    case E_TRTLLM:
        /* the PyTorch backend (1.0): max_num_tokens 8192, max_batch_size
         * 2048, chunked prefill off, GUARANTEED_NO_EVICT, the KV pool a
         * fraction of the free memory; CUDA graphs for decode-only batches
         * up to 128 */
        rt->budget = 8192;
        rt->max_seqs = 2048;
        rt->chunked = 0;
        rt->reserve_all = 1;
        rt->pool_of_free = p->mem_util;
        rt->mem_util = 0;
        rt->graph_max = 128;
        break;
    case E_SGLANG: {
        /* chunked_prefill_size 8192 (2048 under 25 GB), cuda_graph_max_bs
         * 160 (8 under 25 GB), prefill batches before decode (mixed chunks
         * off); mem_fraction_static 0.88, 0.87, 0.85, 0.81 at TP 1, 2, 4, 8 */
        int small = mem_gib * 1.073741824 < 25;
        rt->budget = small ? 2048 : 8192;
        rt->max_seqs = 4096;
        rt->prefill_first = 1;
        rt->graph_max = small ? 8 : 160;
        if (p->mem_util == DEF[E_SGLANG].mem_util)
            rt->mem_util = rt->tp >= 8 ? 0.81 : rt->tp >= 4 ? 0.85 : rt->tp >= 2 ? 0.87 : 0.88;
        break;
    }
    case E_LLAMACPP:
        /* one llama_decode per step over n_batch tokens of prompts and
         * generations; CUDA graphs for single-sequence decode only */
        rt->budget = 2048;
        rt->max_seqs = LLAMACPP_SLOTS;
        rt->graph_max = 1;
        rt->fixed_kv_tokens = (long)LLAMACPP_SLOTS * LLAMACPP_CTX;
        rt->mem_util = 0;
        break;
    default:
        rt->budget = 2048;
        rt->max_seqs = 256;
        break;
    }
    if (p->max_batched_tokens > 0) rt->budget = p->max_batched_tokens;
    /* a GPU serving engine the target names that chunks prompts never holds
     * more than a step's tokens of activations */
    rt->act_step = p->named && rt->chunked && e != E_CPU;
    if (p->max_seqs > 0) rt->max_seqs = p->max_seqs;
    if (p->graph_max < 0)
        rt->graph_max = 0;
    else if (p->graph_max > 0)
        rt->graph_max = p->graph_max;
    /* all-reduce link: the profile's, else the device's NVLink, else PCIe */
    const ac_device_spec *s = device ? ac_device_spec_for_gpu(device) : NULL;
    rt->link_gbs = p->link_gbs > 0 ? p->link_gbs : s ? (s->nvlink_gbs > 0 ? s->nvlink_gbs : s->pcie_gbs) : 20;
    rt->link_nvlink = s ? s->nvlink_gbs > 0 && rt->link_gbs == s->nvlink_gbs : rt->link_gbs >= 100;
    rt->ll_gbs = s && s->ll_gbs > 0 ? s->ll_gbs : 87.7;
    rt->link_us = p->link_us;
    /* the engines' own all-reduce kernels over NVLink (peer-to-peer
     * buffers): vLLM's and SGLang's CustomAllreduce (custom_all_reduce.cuh:
     * up to 8 MiB; one stage at tp 2, below 512 KiB at tp <= 4 and 256 KiB
     * at tp <= 8; two stages above). TensorRT-LLM is priced as NCCL: its
     * v0.17 performance page names an NCCL all-reduce issue "multi-GPU
     * cases could be affected" by, and its 1.0 page's rows fit NCCL's model,
     * not its AUTO kernels' (docs/costmodel.md). llama.cpp has no
     * tensor-parallel all-reduce of its own. */
    if ((e == E_VLLM || e == E_SGLANG) && rt->tp > 1) {
        rt->custom_max = 8 * 1048576.0;
        rt->oneshot_max = rt->tp <= 2 ? rt->custom_max : rt->tp <= 4 ? 524288 : 262144;
    }
}

int ac_engine_graph_size(const ac_engine_rt *rt, int n) {
    if (rt->graph_max <= 0 || n > rt->graph_max || n < 1) return 0;
    if (n <= 2) return n;
    if (n <= 4) return 4;
    int g = (n + 7) / 8 * 8;
    return g <= rt->graph_max ? g : rt->graph_max;
}

/* NCCL's cost model of a ring all-reduce in one node (src/graph/tuning.cc,
 * ncclTopoTuneModel): per protocol LL, LL128, Simple a base latency
 * (baseLatencies, Ring) and a latency per step (hwLatencies, NVLink or PCI,
 * Ring), 2 (tp - 1) steps; bus bandwidth: LL half the link's, capped by the
 * generation's llMaxBws; LL128 0.92 of it (enabled over NVLink only);
 * Simple all of it; time = latency + bytes / (bus bandwidth x tp / (2 (tp - 1))),
 * the least over the protocols, as NCCL picks. */
static const double NCCL_BASE_US[3] = {6.6, 14.0, 8.4};
static const double NCCL_HOP_US[2][3] = {{0.6, 1.9, 3.4} /* NVLink */, {1.0, 2.5, 5.7} /* PCIe */};

static double nccl_ring_us(const ac_engine_rt *rt, double bytes) {
    int n = rt->tp, steps = 2 * (n - 1), nv = rt->link_nvlink;
    double bus[3] = {fmin(0.5 * rt->link_gbs, rt->ll_gbs), nv ? 0.92 * rt->link_gbs : 0, rt->link_gbs}, best = INFINITY;
    for (int q = 0; q < 3; q++) {
        if (bus[q] <= 0) continue;
        double us = NCCL_BASE_US[q] + steps * NCCL_HOP_US[!nv][q] + bytes / (bus[q] * 1e3 * n / steps);
        best = fmin(best, us);
    }
    return best;
}

/* One phase of an engine's own all-reduce kernel (its launch, a barrier:
 * flags written to and polled from every peer over NVLink, and the
 * reduction's wait on the slowest GPU): fitted, 6 us, on the one published
 * row such a kernel runs in (SGLang's batch-1 decode over 8 B200s, whose
 * 188 all-reduces a token want 12 us each, docs/costmodel.md). One stage
 * pays two (the barriers before and after), two stages three. */
#define AR_CUSTOM_SYNC_US 6.0

double ac_engine_allreduce_us(const ac_engine_rt *rt, double bytes) {
    if (rt->tp <= 1) return 0;
    int n = rt->tp;
    double ring = 2.0 * (n - 1) / n * bytes / (rt->link_gbs * 1e3);
    if (rt->link_us > 0) return rt->link_us + ring; /* the spec's fixed cost a call */
    if (rt->link_nvlink && rt->custom_max > 0 && bytes <= rt->custom_max) {
        if (bytes < rt->oneshot_max) return 2 * AR_CUSTOM_SYNC_US + (n - 1) * bytes / (rt->link_gbs * 1e3);
        return 3 * AR_CUSTOM_SYNC_US + ring;
    }
    return nccl_ring_us(rt, bytes);
}

int ac_tp_attn_splits(int tp, int heads, int kv) {
    if (tp <= 1 || heads <= 0) return 1;
    return kv > 0 && heads % tp == 0 && (kv >= tp ? kv % tp == 0 : tp % kv == 0);
}

const char *ac_tp_layer_unsplit(int tp, const ac_layer_arch *y, int *v) {
    if (tp <= 1) return NULL;
    if (y->n_heads > 0 && y->n_heads % tp) return *v = y->n_heads, "query heads";
    if (!ac_tp_attn_splits(tp, y->n_heads, y->n_kv_heads))
        return *v = y->n_kv_heads, "KV heads (neither divisible by tp nor dividing it)";
    if (y->ffn > 0 && y->ffn % tp) return *v = y->ffn, "FFN width";
    return NULL;
}
