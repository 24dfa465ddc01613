/*
 * costmodel.c - the serving-workload model: an architecture (continuous
 * widths, ac_carch) walked layer by layer through a cost table gives TTFT,
 * TPOT, throughput, peak memory and the largest batch that fits; and the
 * gradient of any of those with respect to every width. See costmodel.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cost_int.h"
#include "cost/costmodel.h"
#include "cost/engines.h"
#include "serve_int.h"

/* ---------------------------------------------------------------- arch */

int ac_carch_from_arch(const ac_arch *a, ac_carch *c, ac_err *e) {
    memset(c, 0, sizeof *c);
    c->n_layers = a->n_layers;
    c->head_dim = a->head_dim;
    c->vocab = a->vocab;
    c->tie = a->tie_embeddings;
    c->hidden = a->hidden;
    c->qkv_bias = a->qkv_bias;
    c->qk_norm = a->qk_norm;
    c->heads = calloc(a->n_layers, sizeof(double));
    c->kv = calloc(a->n_layers, sizeof(double));
    c->ffn = calloc(a->n_layers, sizeof(double));
    c->ffn_mats = a->hybrid ? 2 : 3;
    c->shared_ffn = a->hybrid ? a->shared_ffn : 0;
    c->moe_latent = a->hybrid ? a->moe_latent : 0;
    int moe = ac_arch_has_moe(a), ssm = 0;
    for (int l = 0; l < a->n_layers; l++) ssm |= a->layers[l].ssm_heads > 0;
    if (ssm) {
        c->ssm = calloc(a->n_layers, sizeof(double));
        c->ssm_head_dim = a->ssm_head_dim, c->ssm_state = a->ssm_state, c->ssm_groups = a->ssm_groups;
        c->ssm_conv = a->ssm_conv, c->ssm_conv_bias = a->ssm_conv_bias;
    }
    if (moe) {
        c->experts = calloc(a->n_layers, sizeof(double));
        c->effn = calloc(a->n_layers, sizeof(double));
        c->top_k = a->top_k;
    }
    c->recipe = calloc(a->n_layers > 0 ? a->n_layers : 1, sizeof *c->recipe);
    if (!c->heads || !c->kv || !c->ffn || !c->recipe || (moe && (!c->experts || !c->effn)) || (ssm && !c->ssm)) {
        ac_carch_free(c);
        return ac_errf(e, "out of memory");
    }
    for (int l = 0; l < a->n_layers; l++) {
        c->heads[l] = a->layers[l].n_heads;
        c->kv[l] = a->layers[l].n_kv_heads;
        c->ffn[l] = a->layers[l].ffn;
        if (ssm) c->ssm[l] = a->layers[l].ssm_heads;
        c->recipe[l] = ac_block_recipe_of(a, l);
        if (moe) {
            c->experts[l] = a->layers[l].n_experts;
            c->effn[l] = a->layers[l].n_experts ? a->layers[l].expert_ffn : 0;
        }
    }
    return 0;
}

double ac_moe_active_experts(double E, double k, double T) {
    if (E <= 0 || k <= 0 || T <= 0) return 0;
    if (k >= E) return E;
    return E * (1 - pow(1 - k / E, T));
}

/* Layer l's experts (0: a dense layer or none), each effn wide. */
static double experts_of(const ac_carch *c, int l) { return c->experts && c->effn[l] > 0 ? c->experts[l] : 0; }

static double ffn_mats(const ac_carch *c) { return c->ffn_mats == 2 ? 2 : 3; }

/* The width experts read and write: the hidden width, or a LatentMoE
 * model's latent width. */
static double expert_io(const ac_carch *c) { return c->moe_latent > 0 ? c->moe_latent : c->hidden; }

/* ---------------------------------------------------------------- Mamba-2 layers */

/* Layer l's Mamba heads (0: none) and its widths: the inner width (heads x
 * head_dim), the conv channels (inner + 2 G N: x, B, C) and in_proj's rows
 * (z, xBC, dt: inner + channels + heads), as format/model.h's ac_ssm_*. */
static double ssm_of(const ac_carch *c, int l) { return c->ssm ? c->ssm[l] : 0; }
static double ssm_inner(const ac_carch *c, int l) { return ssm_of(c, l) * c->ssm_head_dim; }
static double ssm_chans(const ac_carch *c, int l) {
    return ssm_of(c, l) > 0 ? ssm_inner(c, l) + 2.0 * c->ssm_groups * c->ssm_state : 0;
}
static double ssm_in_rows(const ac_carch *c, int l) { return ssm_inner(c, l) + ssm_chans(c, l) + ssm_of(c, l); }

/* Parameters of layer l's mixer: its norm, in_proj, the conv (and bias),
 * dt_bias, A_log and D per head, the gated norm, out_proj. */
static double ssm_params(const ac_carch *c, int l) {
    double H = c->hidden, di = ssm_inner(c, l), C = ssm_chans(c, l), K = c->ssm_conv;
    if (ssm_of(c, l) <= 0) return 0;
    return H + ssm_in_rows(c, l) * H + C * (K + (c->ssm_conv_bias ? 1 : 0)) + 3 * ssm_of(c, l) + di + H * di;
}

/* Floats of one sequence's state in layer l: the conv's last K - 1 inputs
 * of every channel and the SSM state (heads x head_dim x state). */
static double ssm_state_floats(const ac_carch *c, int l) {
    if (ssm_of(c, l) <= 0) return 0;
    return ssm_chans(c, l) * (c->ssm_conv > 1 ? c->ssm_conv - 1 : 0) + ssm_inner(c, l) * c->ssm_state;
}

double ac_carch_state_bytes(const ac_carch *c) {
    double f = 0;
    for (int l = 0; l < c->n_layers; l++) f += ssm_state_floats(c, l);
    return 4 * f;
}

/* The chunk of the prefill scan (Mamba-2's SSD: the tokens of a chunk
 * attend to each other through C B^T; chunks pass the state on). */
#define AC_SSD_CHUNK 256.0

/* The selective scan of every Mamba layer: B sequences, nq new tokens
 * each. A decode step (nq 1) reads and writes each sequence's state
 * (conv window and SSM state, fp32): memory-bound on the state, whatever
 * the context. A prefill runs the chunked scan, linear in the tokens: per
 * chunk of Q tokens and head, C B^T (Q x Q over the state N), those scores
 * times x (Q x P over Q), the chunk's state B^T x and its output C S (P x
 * N each), priced as GEMMs of those shapes over all the tokens, plus the
 * chunk states written and read once. */
static double scan_all_us(const ac_cost_table *t, const ac_carch *c, double B, double nq, int warm) {
    double us = 0;
    for (int l = 0; l < c->n_layers; l++) {
        double h = ssm_of(c, l), di = ssm_inner(c, l), N = c->ssm_state;
        if (h <= 0) continue;
        if (nq <= 1) {
            us += ac_cost_elem_us(t, 2 * B * ssm_state_floats(c, l), 4);
            continue;
        }
        double M = B * nq, Q = fmin(AC_SSD_CHUNK, nq);
        us += ac_cost_gemm_lookup(t, M, h * Q, N, warm) + ac_cost_gemm_lookup(t, M, di, Q, warm) +
              2 * ac_cost_gemm_lookup(t, M, di, N, warm);
        us += ac_cost_elem_us(t, 2 * B * ceil(nq / Q) * di * N, 4);
    }
    return us;
}

void ac_carch_free(ac_carch *c) {
    free(c->heads);
    free(c->kv);
    free(c->ffn);
    free(c->experts);
    free(c->effn);
    free(c->ssm);
    free((void *)c->recipe);
    c->heads = c->kv = c->ffn = c->experts = c->effn = c->ssm = NULL;
    c->recipe = NULL;
}

double ac_carch_params(const ac_carch *c) {
    double H = c->hidden, hd = c->head_dim, p = (double)c->vocab * H * (c->tie ? 1 : 2) + H;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->heads[l] > 0)
            p += H + 2 * H * c->heads[l] * hd + 2 * H * c->kv[l] * hd +
                 (c->qkv_bias ? (c->heads[l] + 2 * c->kv[l]) * hd : 0) + (c->qk_norm ? 2 * hd : 0);
        if (c->ffn[l] > 0) p += H + ffn_mats(c) * H * c->ffn[l];
        double E = experts_of(c, l);
        if (E > 0) /* norm, router, every expert; nemotron_h's correction bias, shared expert, latent projections */
            p += H + H * E + ffn_mats(c) * expert_io(c) * c->effn[l] * E +
                 (c->ffn_mats == 2 ? E + 2 * H * c->shared_ffn + (c->moe_latent > 0 ? 2 * H * c->moe_latent : 0) : 0);
        p += ssm_params(c, l);
    }
    return p;
}

/* ---------------------------------------------------------------- engine profile */

void ac_engine_profile_default(ac_engine_profile *p, int is_cpu) { ac_engine_profile_named(-1, is_cpu, p); }

/* The widths one of tp GPUs holds: query heads, FFN, Mamba heads (vLLM's
 * MambaMixer2 splits heads and their groups tp ways) and vocabulary split
 * tp ways; KV heads split too, or replicated one per GPU when fewer than
 * tp (vLLM's rule); every expert on every GPU with its FFN width split tp
 * ways (vLLM's tensor-parallel MoE, without expert parallelism). out owns
 * its arrays, all in one block at out->heads. */
static int carch_shard(const ac_carch *c, int tp, ac_carch *out) {
    *out = *c;
    size_t n = (size_t)(c->n_layers > 0 ? c->n_layers : 1);
    out->heads = malloc(6 * n * sizeof(double));
    if (!out->heads) return -1;
    out->kv = out->heads + n;
    out->ffn = out->kv + n;
    if (c->experts) {
        out->experts = out->ffn + n;
        out->effn = out->experts + n;
    }
    if (c->ssm) out->ssm = out->ffn + 3 * n;
    for (int l = 0; l < c->n_layers; l++) {
        out->heads[l] = c->heads[l] / tp;
        out->kv[l] = c->kv[l] >= tp ? c->kv[l] / tp : c->kv[l] > 0 && c->heads[l] > 0 ? 1 : 0;
        out->ffn[l] = c->ffn[l] / tp;
        if (c->experts) {
            out->experts[l] = c->experts[l];
            out->effn[l] = c->effn[l] / tp;
        }
        if (c->ssm) out->ssm[l] = c->ssm[l] / tp;
    }
    if (c->ssm) out->ssm_groups = c->ssm_groups >= tp ? c->ssm_groups / tp : 1;
    out->vocab = (c->vocab + tp - 1) / tp;
    return 0;
}

/* ---------------------------------------------------------------- prediction */

/* A mixture-of-experts layer over M tokens: the router's GEMM, then each
 * expert that receives rows (ac_moe_active_experts of them, d) runs its
 * SwiGLU on its share M k / d of the rows, as the engines run it: the CPU
 * engine each expert's path on its gathered rows (ac_block_cpu_expert),
 * priced from the table's measured expert grid where it has one, else as
 * one GEMM per matrix from the GEMM grid; a GPU engine's fused
 * MoE kernel one grouped GEMM over the d experts (priced as one GEMM of
 * M k / d rows by d x Fe columns: the same weight bytes, one kernel's
 * fixed cost, its FLOPs at AC_MOE_GROUPED_FLOPS). Then the elementwise passes (norm, softmax over
 * the experts, each routed row's gate, scatter-add). */
/* The grouped GEMM's FLOPs at 1/1.15 of a dense GEMM's efficiency: token
 * permutation and the busiest expert's last wave, which the mean rows per
 * expert do not see. Chosen on TensorRT-LLM's Mixtral-8x7B FP8 rows
 * (H100/H200, tests/test_gpu_profiles.py), so those rows do not check it:
 * 1.3 when FP8 GEMMs ran at 0.7 of their peak; with FP8 at 0.6
 * (costroofline.c) 1.15 keeps the H200 and TP2 rows where 1.3 had them and
 * brings the H100 rows closer (docs/costmodel.md). */
#define AC_MOE_GROUPED_FLOPS 1.15
/* A weight GEMM of M rows as the engine runs it. With gemm_f16_acc on a
 * roofline table (llama.cpp, F16 weights: ggml_cuda_op_mul_mat_cublas
 * calls cuBLAS with CUBLAS_COMPUTE_16F for more than one row): at the
 * profile's FP16-accumulate rate, plus the two conversions it launches
 * around the GEMM, its F32 input to F16 and its F16 output to F32 (4 + 2
 * bytes an element each). A single row runs ggml's matrix-vector kernel:
 * the table's GEMM. */
static double lin_us(const ac_cost_table *t, const ac_engine_profile *p, double M, double n, double k, int warm) {
    if (!p->gemm_f16_acc || !t->roofline || M <= 1 || n <= 0 || k <= 0) return ac_cost_gemm_lookup(t, M, n, k, warm);
    double peak = t->peak_acc16_tflops > 0 ? t->peak_acc16_tflops : t->peak_tflops;
    return ac_roofline_gemm_peak_us(t, M, n, k, peak) + ac_cost_elem_us(t, M * (k + n), 3) + 2 * t->launch_us;
}

/* FP8 GEMMs on FP8 tensor cores quantise their input first: one
 * elementwise kernel over its M x k values, 2 bytes read and 1 written
 * each (TensorRT-LLM's static_quantize_e4m3_per_tensor, vLLM's
 * scaled_fp8_quant), once per input however many GEMMs read it; its
 * launch is counted with the layer's (layer_launches). */
static int quant_on(const ac_cost_table *t, const ac_engine_profile *p) { return t->fp8_act && p->w_bytes == 1; }
static double quant_us(const ac_cost_table *t, const ac_engine_profile *p, double M, double k) {
    return quant_on(t, p) ? ac_cost_elem_us(t, 0.75 * M * k, 2) : 0;
}

/* Whether t's measured expert grid prices c's experts: a CPU table (no
 * launch cost) measured with one, and SwiGLU experts (the grid's kernel;
 * squared-ReLU ones stay on the GEMM grid). */
static int expert_grid(const ac_cost_table *t, const ac_carch *c) {
    return t->nre > 0 && t->expert_us && !t->roofline && t->launch_us == 0 && ffn_mats(c) == 3;
}
static double moe_us(const ac_cost_table *t, const ac_carch *c, const ac_engine_profile *p, int l, double M, int warm) {
    /* H: the experts' input and output width (a LatentMoE layer's latent width; its projections
     * down and up are LINEARs of the recipe); the router reads the hidden width */
    double E = experts_of(c, l), H = expert_io(c), Fe = c->effn ? c->effn[l] : 0, k = fmin(c->top_k, E);
    if (E <= 0 || Fe <= 0 || k <= 0) return 0;
    double d = ac_moe_active_experts(E, k, M), m = M * k / d;
    double us = lin_us(t, p, M, E, c->hidden, warm);
    if (expert_grid(t, c)) /* the engine's whole per-expert path, measured: its activation and scatter-add in it */
        return us + d * ac_cost_expert_us(t, m, Fe, H, warm) + ac_cost_elem_us(t, M * (2 * H + E), p->act_bytes);
    if (t->launch_us > 0) { /* a GPU's fused MoE kernel: one grouped GEMM over the d experts' weights */
        double mg = AC_MOE_GROUPED_FLOPS * m;
        us += (ffn_mats(c) - 1) * ac_cost_gemm_lookup(t, mg, d * Fe, H, warm) +
              ac_cost_gemm_lookup(t, mg, H, d * Fe, warm) + quant_us(t, p, M, H);
    }
    else
        us += d * ((ffn_mats(c) - 1) * ac_cost_gemm_lookup(t, m, Fe, H, warm) + ac_cost_gemm_lookup(t, m, H, Fe, warm));
    return us + ac_cost_elem_us(t, M * (2 * H + E + k * (2 * Fe + H)), p->act_bytes);
}

const char *ac_cost_expert_source(const ac_cost_table *t, const ac_carch *c) {
    int moe = 0;
    for (int l = 0; l < c->n_layers; l++) moe |= experts_of(c, l) > 0;
    return !moe ? NULL : expert_grid(t, c) ? "expert_grid" : t->launch_us > 0 ? "grouped_gemm" : "gemm_grid";
}

/* ---------------------------------------------------------------- a layer, from its recipe */

/* The width `d` (ac_dim, runtime/block.h) of layer l. */
static double carch_dim(const ac_carch *c, int l, int d) {
    switch (d) {
    case AC_DIM_H: return c->hidden;
    case AC_DIM_Q: return c->heads[l] * c->head_dim;
    case AC_DIM_KV: return c->kv[l] * c->head_dim;
    case AC_DIM_F: return c->ffn[l];
    case AC_DIM_E: return experts_of(c, l);
    case AC_DIM_FE: return c->effn ? c->effn[l] : 0;
    case AC_DIM_SSM: return ssm_inner(c, l);
    case AC_DIM_SC: return ssm_chans(c, l);
    case AC_DIM_SI: return ssm_in_rows(c, l);
    case AC_DIM_FS: return experts_of(c, l) > 0 ? c->shared_ffn : 0;
    case AC_DIM_LT: return experts_of(c, l) > 0 ? c->moe_latent : 0;
    default: return 0;
    }
}

/* Layer l's recipe (the one description of its computation, block.h); a
 * carch filled by hand without recipes is a Llama-family dense model (as
 * its ffn_mats 0 reads 3): the recipe of such an arch. */
static const ac_block_recipe *recipe_of(const ac_carch *c, int l) {
    if (c->recipe && c->recipe[l]) return c->recipe[l];
    static const ac_arch dense; /* no layers, no MoE, no Mamba, no QK norm */
    return ac_block_recipe_of(&dense, l);
}

static int sub_present(const ac_carch *c, int l, const ac_subblock *sb) { return carch_dim(c, l, sb->present) > 0; }

/* Values per token an elementwise op passes over: its output's width; two
 * operands' for SwiGLU and the gated norm; each conv tap. Structure points
 * (masks, KV merging) are not in a served model; attention and the scan
 * are priced with their context (attn_all_us, scan_all_us). */
static double op_elems(const ac_carch *c, int l, const ac_op *op) {
    double w = carch_dim(c, l, op->dout);
    switch (op->kind) {
    case AC_OP_MASK:
    case AC_OP_KV_MERGE:
    case AC_OP_MASK_HIDDEN:
    case AC_OP_ATTENTION:
    case AC_OP_SSM_SCAN: return 0;
    case AC_OP_SWIGLU:
    case AC_OP_GATED_NORM: return 2 * w;
    case AC_OP_SSM_CONV: return w * c->ssm_conv;
    default: return w;
    }
}

/* Kernels a serving engine launches for layer l: one GEMM for the LINEARs
 * that read the same input in a row (q, k and v; gate and up), attention,
 * the conv, the scan and the gated norm one each, a router two (its GEMM,
 * top-k) and the experts three (two grouped GEMMs, the weighted sum); norms
 * fuse with the residual add, RoPE with attention, activations with their
 * GEMM. */
static int layer_launches(const ac_carch *c, int l, int quant) {
    const ac_block_recipe *r = recipe_of(c, l);
    int n = 0;
    for (int s = 0; r && s < r->n_sub; s++) {
        if (!sub_present(c, l, &r->sub[s])) continue;
        int prev_in = -1;
        for (int i = 0; i < r->sub[s].n_ops; i++) {
            const ac_op *op = &r->sub[s].ops[i];
            if (op->kind == AC_OP_LINEAR) {
                n += (op->in != prev_in) * (1 + quant);
                prev_in = op->in;
                continue;
            }
            prev_in = -1;
            n += op->kind == AC_OP_ATTENTION || op->kind == AC_OP_SSM_CONV || op->kind == AC_OP_SSM_SCAN ||
                 op->kind == AC_OP_GATED_NORM;
            n += op->kind == AC_OP_ROUTE ? 2 : op->kind == AC_OP_EXPERTS ? 3 + quant : 0;
        }
    }
    return n;
}

/* The weights a decode step of B sequences reads in layer l: every
 * LINEAR's matrix, a router's, and the experts the B tokens reach. */
static double layer_decode_weights(const ac_carch *c, int l, double B) {
    const ac_block_recipe *r = recipe_of(c, l);
    double wb = 0, H = c->hidden;
    for (int s = 0; r && s < r->n_sub; s++) {
        if (!sub_present(c, l, &r->sub[s])) continue;
        for (int i = 0; i < r->sub[s].n_ops; i++) {
            const ac_op *op = &r->sub[s].ops[i];
            double E = experts_of(c, l);
            if (op->kind == AC_OP_LINEAR) wb += carch_dim(c, l, op->din) * carch_dim(c, l, op->dout);
            if (op->kind == AC_OP_ROUTE) wb += H * E;
            if (op->kind == AC_OP_EXPERTS && E > 0)
                wb += ffn_mats(c) * expert_io(c) * c->effn[l] * ac_moe_active_experts(E, fmin(c->top_k, E), B);
        }
    }
    return wb;
}

static int sb_has_moe(const ac_subblock *sb) {
    for (int i = 0; i < sb->n_ops; i++)
        if (sb->ops[i].kind == AC_OP_EXPERTS) return 1;
    return 0;
}

/* Layer l's widths, for telling a layer that repeats the one before it
 * (same recipe, same widths: the same price) from one that does not. */
typedef struct {
    const ac_block_recipe *r;
    double w[6];
} layer_key;

static layer_key key_of(const ac_carch *c, int l) {
    layer_key k = {recipe_of(c, l), {c->heads[l], c->kv[l], c->ffn[l], experts_of(c, l), c->effn ? c->effn[l] : 0,
                                     ssm_of(c, l)}};
    return k;
}

static int same_key(const layer_key *a, const layer_key *b) {
    return a->r == b->r && !memcmp(a->w, b->w, sizeof a->w);
}

/* One layer's token-parallel part (dense_us). Consecutive LINEARs of the
 * same shape (k and v; gate and up) read one lookup. */
static double layer_us(const ac_cost_table *t, const ac_carch *c, const ac_engine_profile *p, int l, double M, int warm,
                       double ar) {
    const ac_block_recipe *r = recipe_of(c, l);
    double us = 0;
    for (int s = 0; r && s < r->n_sub; s++) {
        const ac_subblock *sb = &r->sub[s];
        if (!sub_present(c, l, sb)) continue;
        double elems = 0, pn = -1, pk = -1, pv = 0;
        int moe = sb_has_moe(sb), pin = -1;
        for (int i = 0; i < sb->n_ops; i++) {
            const ac_op *op = &sb->ops[i];
            if (op->kind == AC_OP_LINEAR) {
                double n = carch_dim(c, l, op->dout), k = carch_dim(c, l, op->din);
                if (n != pn || k != pk) pv = lin_us(t, p, M, n, k, warm), pn = n, pk = k;
                us += pv + (op->in != pin ? quant_us(t, p, M, k) : 0);
                pin = op->in;
                continue;
            }
            pin = -1;
            if (op->kind != AC_OP_ROUTE && op->kind != AC_OP_EXPERTS && (op->kind != AC_OP_RMSNORM || !moe))
                elems += op_elems(c, l, op);
        }
        /* a mixture of experts: its router, experts and their passes, its norm with them (a shared
         * expert's GEMMs and activation are the sub-block's own ops) */
        us += (moe ? moe_us(t, c, p, l, M, warm) : 0) + ac_cost_elem_us(t, M * elems, p->act_bytes) + ar;
    }
    return us;
}

/* The token-parallel part of one forward call over M tokens: each layer's
 * recipe walked, its LINEARs through the GEMM tables, its elementwise ops
 * by the values they pass over, a mixture of experts as moe_us prices it;
 * under tensor parallelism, one all-reduce of M x hidden activations per
 * sub-block (its output projection's). */
static double dense_us(const ac_cost_table *t, const ac_carch *c, const ac_engine_profile *p, const ac_engine_rt *rt,
                       double M, int warm) {
    double us = 0, ar = ac_engine_allreduce_us(rt, M * c->hidden * p->act_bytes), last = 0;
    layer_key prev = {0};
    for (int l = 0; l < c->n_layers; l++) {
        layer_key k = key_of(c, l);
        if (l == 0 || !same_key(&k, &prev)) last = layer_us(t, c, p, l, M, warm, ar), prev = k;
        us += last;
    }
    return us;
}

/* Attention of every layer: B sequences, nq new tokens each, context S. */
static double attn_all_us(const ac_cost_table *t, const ac_carch *c, const ac_engine_profile *p, double B, double nq,
                          double S) {
    double us = 0;
    for (int l = 0; l < c->n_layers; l++)
        if (c->heads[l] > 0) us += ac_cost_attn_kv_us(t, c->heads[l], c->kv[l], B, nq, S, c->head_dim, p->kv_bytes);
    return us;
}

static int attn_layers(const ac_carch *c) {
    int n = 0;
    for (int l = 0; l < c->n_layers; l++) n += c->heads[l] > 0;
    return n;
}

/* Launch cost of a forward call (0 for CPU tables): every kernel's
 * launch, or, run as a CUDA graph, one graph launch plus (piecewise
 * graphs) the attention kernels left outside it. */
static double launch_us(const ac_cost_table *t, const ac_carch *c, const ac_engine_profile *p, const ac_engine_rt *rt,
                        int graphed) {
    if (t->launch_us == 0) return 0; /* a CPU table */
    if (graphed) return (rt->graph_piecewise ? attn_layers(c) + 1 : 1) * t->launch_us;
    int launches = 2, last = 0;
    layer_key prev = {0};
    for (int l = 0; l < c->n_layers; l++) {
        layer_key k = key_of(c, l);
        if (l == 0 || !same_key(&k, &prev)) last = layer_launches(c, l, quant_on(t, p)), prev = k;
        launches += last;
    }
    return launches * t->launch_us;
}

/* One forward call of B sequences, nq new tokens each at position pos0. A
 * call the engine runs as a CUDA graph (engines.h: by its tokens, or a
 * decode call by its sequences) computes the padded size and pays one
 * launch. */
static int graph_of(const ac_engine_rt *rt, double B, double nq) {
    return rt->graph_tokens ? ac_engine_graph_size(rt, (int)ceil(B * nq))
           : nq == 1        ? ac_engine_graph_size(rt, (int)ceil(B))
                            : 0;
}

static double forward_us(const ac_cost_table *t, const ac_carch *c, const ac_engine_profile *p, const ac_engine_rt *rt,
                         double B, double nq, double pos0, int last_only, int warm) {
    double M = B * nq, S = pos0 + nq, H = c->hidden, Mrun = M;
    int g = graph_of(rt, B, nq);
    if (g) Mrun = g;
    double us = dense_us(t, c, p, rt, Mrun, warm) + attn_all_us(t, c, p, B, nq, S) + scan_all_us(t, c, B, nq, warm);
    us += lin_us(t, p, last_only ? B : M, c->vocab, H, warm) + ac_cost_elem_us(t, M * H, p->act_bytes);
    us += launch_us(t, c, p, rt, g > 0);
    return us + p->overhead_ms * 1e3 + p->seq_overhead_us * B;
}

double ac_cost_decode_bytes(const ac_carch *c, const ac_engine_profile *p, double B, double S) {
    double H = c->hidden, hd = c->head_dim, wb = (double)c->vocab * H, kvb = 0;
    double last = 0;
    layer_key prev = {0};
    for (int l = 0; l < c->n_layers; l++) {
        if (c->heads[l] > 0) kvb += 2 * c->kv[l] * hd * S;
        layer_key k = key_of(c, l);
        if (l == 0 || !same_key(&k, &prev)) last = layer_decode_weights(c, l, B), prev = k;
        wb += last;
    }
    /* each sequence's Mamba state read and written back, whatever S */
    return wb * p->w_bytes + B * kvb * p->kv_bytes + 2 * B * ac_carch_state_bytes(c);
}

/* Log-linear interpolation of v over the table's working-set bands,
 * constant beyond them. */
static double band_interp(const ac_cost_table *t, const double *v, double ws) {
    int n = t->ndec;
    if (ws <= t->dec_ws[0]) return v[0];
    if (ws >= t->dec_ws[n - 1]) return v[n - 1];
    int k = 0;
    while (k < n - 2 && ws > t->dec_ws[k + 1]) k++;
    double u = (log(ws) - log(t->dec_ws[k])) / (log(t->dec_ws[k + 1]) - log(t->dec_ws[k]));
    return v[k] + (v[k + 1] - v[k]) * u;
}

/* Microseconds per MiB a CPU decode step of B sequences streams beyond the
 * warm tables at working set ws: the batch-1 bands, the batch-4 ones when
 * measured (linear in log B between, constant beyond 4), those read at ws4:
 * the working set of a model with the probes' 4 layers of this one's mean
 * bytes per layer (see probe_ws4). */
static double decode_us_mib(const ac_cost_table *t, double ws, double B, double ws4) {
    double r1 = band_interp(t, t->dec_us_mib, ws);
    if (!t->dec_b4 || B <= 1) return r1;
    double r4 = band_interp(t, t->dec_us_mib4, ws4), u = B >= 4 ? 1 : log(B) / log(4.0);
    return r1 + (r4 - r1) * u;
}

/* The batch-4 bands' lookup point: ws scaled to the probes' PROBE_LAYERS
 * layers. At batch 4 most of the excess of a small model is a per-layer
 * cost, not its bytes, so the matching probe is the one with as many bytes
 * per layer (a 6-layer 5 MiB model reads the 4-layer 3.5 MiB probe's rate). */
#define PROBE_LAYERS 4.0
static double probe_ws4(const ac_carch *c, double ws) {
    int n = 0;
    for (int l = 0; l < c->n_layers; l++)
        n += c->heads[l] > 0 || c->ffn[l] > 0 || experts_of(c, l) > 0 || ssm_of(c, l) > 0;
    return n > 0 ? ws * PROBE_LAYERS / n : ws;
}

/* A decode step of B sequences on a table with the expert grid: the
 * experts it reaches cost, beyond their warm points (in forward_us's warm
 * part), their cold points' excess for the share 1 - fw of the weights
 * outside the effective cache; *xbytes: those experts' bytes, which the
 * bands then leave out. The cold point is a distinct expert's weights read
 * from memory by the engine's own path at its rows: small matrices, each
 * step other ones, which stream slower per MiB than the dense probes'
 * large ones (the bands); and consecutive steps reach other experts, so
 * what stays in cache is the share of all the weights the cache holds
 * (fw, as prefill's blend), not of one step's. 0 without the grid. */
static double decode_experts_us(const ac_cost_table *t, const ac_carch *c, const ac_engine_profile *p, double B,
                                double fw, double *xbytes) {
    double us = 0;
    *xbytes = 0;
    if (!expert_grid(t, c)) return 0;
    for (int l = 0; l < c->n_layers; l++) {
        double E = experts_of(c, l), k = fmin(c->top_k, E);
        if (E <= 0 || k <= 0) continue; /* (a dense layer, or a dense model: no effn) */
        double Fe = c->effn[l], H = expert_io(c), d = ac_moe_active_experts(E, k, B), m = B * k / d;
        us += d * (1 - fw) * (ac_cost_expert_us(t, m, Fe, H, 0) - ac_cost_expert_us(t, m, Fe, H, 1));
        *xbytes += d * ffn_mats(c) * H * Fe * p->w_bytes;
    }
    return us;
}

/* One forward call. A measured CPU table with decode bands models a decode
 * step by what bounds it there: the warm tables (per-call fixed costs,
 * compute, attention over hot keys, elementwise) plus the weights streamed
 * at the rate measured for that working set, plus the KV cache the
 * attention reads at its own measured rate (the keys and values of B
 * sequences at context pos0 + 1: ~ ctx x kv_dim per layer; tables without
 * that rate charge it like the weights); with the expert grid, the reached
 * experts' weights are priced by their cold points instead of the bands
 * (decode_experts_us). Otherwise the share of the weights
 * that fits in the table's effective cache is read warm: the warm and cold
 * GEMM tables blended by it. */
static double step_us(const ac_cost_table *t, const ac_carch *c, const ac_engine_profile *p, const ac_engine_rt *rt,
                      double B, double nq, double pos0, double fw) {
    if (nq == 1 && t->ndec > 0 && !t->roofline) {
        double bytes = ac_cost_decode_bytes(c, p, B, pos0 + 1), wbytes = ac_cost_decode_bytes(c, p, B, 0),
               rate = decode_us_mib(t, bytes, B, probe_ws4(c, bytes)),
               kv_rate = t->dec_kv ? band_interp(t, t->dec_kv_us_mib, bytes) : rate, xbytes;
        double warm = forward_us(t, c, p, rt, B, 1, pos0, 1, 1), xus = decode_experts_us(t, c, p, B, fw, &xbytes),
               us = warm + xus + (wbytes - xbytes) / 1048576.0 * rate + (bytes - wbytes) / 1048576.0 * kv_rate;
        /* a band's rate may be negative down to half its probe's warm
         * prediction (costmeasure.c); applied to more bytes than the
         * probe's, it could take more: a step is at least half its warm
         * part (a BF16 table whose batch-4 band sat at that floor once
         * predicted a 6-layer model's step at 0.11 ms where it took 0.67) */
        return us > 0.5 * warm ? us : 0.5 * warm;
    }
    return fw * forward_us(t, c, p, rt, B, nq, pos0, 1, 1) + (1 - fw) * forward_us(t, c, p, rt, B, nq, pos0, 1, 0);
}

static double warm_share(const ac_cost_table *t, const ac_carch *c, const ac_engine_profile *p) {
    double wbytes = ac_carch_params(c) * p->w_bytes;
    return t->cache_bytes > 0 && wbytes > 0 ? fmin(1, t->cache_bytes / wbytes) : 0;
}

double ac_cost_decode_step_us(const ac_cost_table *t, const ac_carch *c, const ac_engine_profile *p, double B,
                              double S) {
    ac_engine_rt rt;
    ac_engine_resolve(p, t->mem_gib, t->device, NULL, &rt);
    ac_carch sc;
    if (rt.tp > 1 && carch_shard(c, rt.tp, &sc) == 0) {
        double us = step_us(t, &sc, p, &rt, B, 1, S - 1, warm_share(t, &sc, p));
        free(sc.heads);
        return us;
    }
    return step_us(t, c, p, &rt, B, 1, S - 1, warm_share(t, c, p));
}

/* ---------------------------------------------------------------- served workloads */

typedef struct {
    const ac_cost_table *t;
    const ac_carch *c; /* one GPU's widths */
    const ac_engine_profile *p;
    const ac_engine_rt *rt;
    double fw;
} step_ctx;

/* One iteration of the engine (serve_int.h's callback): the token-parallel
 * part over all its tokens (padded to the CUDA graph it runs as), the
 * attention of its decodes (at their mean context: the cost is linear in
 * it) and of each prompt chunk, the LM head over the rows that produce a
 * token, the launches and the per-step overheads (one per step, one per
 * sequence it carries). Roofline attention pays
 * one kernel's fixed cost per layer, not one per chunk (a varlen kernel
 * takes every sequence). A decode-only step on a measured CPU table is the
 * static model's decode step (its bands). */
static double served_step_us(void *ud, const ac_serve_step *s) {
    const step_ctx *x = ud;
    const ac_cost_table *t = x->t;
    const ac_carch *c = x->c;
    const ac_engine_profile *p = x->p;
    const ac_engine_rt *rt = x->rt;
    double mean_ctx = s->n_decode ? s->decode_ctx / s->n_decode : 0;
    if (!s->n_chunks && t->ndec > 0 && !t->roofline) return step_us(t, c, p, rt, s->n_decode, 1, mean_ctx - 1, x->fw);
    int g = rt->graph_tokens ? ac_engine_graph_size(rt, s->tokens)
            : !s->n_chunks   ? ac_engine_graph_size(rt, s->n_decode)
                             : 0;
    double M = g ? g : s->tokens, H = c->hidden;
    double us = 0;
    for (int warm = 0; warm <= 1; warm++) {
        double share = warm ? x->fw : 1 - x->fw;
        if (share > 0)
            us += share * (dense_us(t, c, p, rt, M, warm) + lin_us(t, p, s->logits, c->vocab, H, warm));
    }
    int calls = 0;
    if (s->n_decode) us += attn_all_us(t, c, p, s->n_decode, 1, mean_ctx) + scan_all_us(t, c, s->n_decode, 1, 1), calls++;
    for (int i = 0; i < s->n_chunks; i++)
        us += attn_all_us(t, c, p, 1, s->chunk[i], s->chunk_end[i]) + scan_all_us(t, c, 1, s->chunk[i], 1), calls++;
    if (t->roofline && calls > 1) us -= (calls - 1) * attn_layers(c) * t->launch_us;
    us += ac_cost_elem_us(t, (double)s->tokens * H, p->act_bytes) + launch_us(t, c, p, rt, g > 0);
    return us + p->overhead_ms * 1e3 + p->seq_overhead_us * (s->n_decode + s->n_chunks);
}

double ac_cost_served_step_us(const ac_cost_table *t, const ac_carch *c, const ac_engine_profile *p,
                              const ac_serve_step *s) {
    ac_engine_rt rt;
    ac_engine_resolve(p, t->mem_gib, t->device, NULL, &rt);
    ac_carch sc;
    if (rt.tp > 1 && carch_shard(c, rt.tp, &sc) == 0) {
        step_ctx x = {t, &sc, p, &rt, warm_share(t, &sc, p)};
        double us = served_step_us(&x, s);
        free(sc.heads);
        return us;
    }
    step_ctx x = {t, c, p, &rt, warm_share(t, c, p)};
    return served_step_us(&x, s);
}

/* ---------------------------------------------------------------- prediction */

/* Run the engine simulation of a served workload into o. */
static void predict_served(const ac_cost_table *t, const ac_carch *c, const ac_workload *w, const ac_engine_profile *p,
                           const ac_engine_rt *rt, double fw, ac_cost *o, double *mean_batch) {
    ac_serve_req *r = NULL;
    int n = 0;
    ac_err e;
    ac_serve_stats st;
    step_ctx x = {t, c, p, rt, fw};
    ac_serve_policy pol = {
        rt->budget,      rt->max_seqs,   rt->chunked,  rt->prefill_first,
        rt->reserve_all, rt->block_size, o->kv_blocks, w->arrival_rate > 0 || w->offline ? 0 : w->concurrency};
    if (w->arrival_rate > 0 && w->concurrency > 0) pol.concurrency = w->concurrency;
    o->served = 1;
    if (ac_serve_requests(w, &r, &n, &e) || ac_serve_run(r, n, &pol, served_step_us, &x, &st, NULL, &e) || st.dropped) {
        /* cannot be served (the pool holds no request of these lengths) */
        o->ttft_ms = o->tpot_ms = o->e2e_ms = 1e12;
        o->p50_ttft_ms = o->p99_ttft_ms = o->p50_tpot_ms = o->p99_tpot_ms = o->p50_e2e_ms = o->p99_e2e_ms = 1e12;
        o->tokens_per_s = o->requests_per_s = 0;
        free(r);
        return;
    }
    free(r);
    if (mean_batch) *mean_batch = st.mean_batch;
    o->ttft_ms = st.mean_ttft_ms, o->tpot_ms = st.mean_tpot_ms, o->e2e_ms = st.mean_e2e_ms;
    o->p50_ttft_ms = st.p50_ttft_ms, o->p99_ttft_ms = st.p99_ttft_ms;
    o->p50_tpot_ms = st.p50_tpot_ms, o->p99_tpot_ms = st.p99_tpot_ms;
    o->p50_e2e_ms = st.p50_e2e_ms, o->p99_e2e_ms = st.p99_e2e_ms;
    o->tokens_per_s = st.tokens_per_s;
    o->requests_per_s = st.requests_per_s;
    o->preempted = st.preemptions;
}

static void predict_all(const ac_cost_table *t, const ac_carch *c0, const ac_workload *w, const ac_engine_profile *p,
                        int smooth, ac_cost *o, double *mean_batch);

void ac_cost_predict(const ac_cost_table *t, const ac_carch *c0, const ac_workload *w, const ac_engine_profile *p,
                     int smooth, ac_cost *o) {
    predict_all(t, c0, w, p, smooth, o, NULL);
}

/* ac_cost_predict, and a served workload's mean batch (mean_batch may be NULL). */
static void predict_all(const ac_cost_table *t, const ac_carch *c0, const ac_workload *w, const ac_engine_profile *p,
                        int smooth, ac_cost *o, double *mean_batch) {
    memset(o, 0, sizeof *o);
    /* smooth: GEMMs without wave quantisation (costroofline.c), whose
     * steps in the widths a finite difference would see as zero or huge */
    ac_cost_table ts;
    if (smooth && t->roofline && t->sms > 0) {
        ts = *t;
        ts.sms = 0;
        t = &ts;
    }
    ac_engine_rt rt;
    ac_engine_resolve(p, t->mem_gib, t->device, w, &rt);
    ac_carch sc;
    const ac_carch *c = c0;
    if (rt.tp > 1 && carch_shard(c0, rt.tp, &sc) == 0) c = &sc;
    double B = w->batch, P = w->prompt_len, G = w->gen_len;
    double fw = warm_share(t, c, p);
    o->params = ac_carch_params(c0);
    /* memory, per GPU */
    double gib = 1073741824.0, kv_tok = 0, widest = 0;
    for (int l = 0; l < c->n_layers; l++) {
        kv_tok += 2 * c->kv[l] * c->head_dim * p->kv_bytes;
        double a = (c->heads[l] + 2 * c->kv[l]) * c->head_dim, f = 2 * c->ffn[l];
        if (experts_of(c, l) > 0) f = fmax(f, experts_of(c, l) + 2 * fmin(c->top_k, experts_of(c, l)) * c->effn[l]);
        if (a > widest) widest = a;
        if (f > widest) widest = f;
        if (ssm_in_rows(c, l) > widest) widest = ssm_in_rows(c, l);
    }
    /* a Mamba layer's state: per sequence, whatever its length */
    double state_seq = ac_carch_state_bytes(c);
    double seq_tokens = P + G;
    if (!smooth && p->block_size > 1) seq_tokens = ceil(seq_tokens / p->block_size) * p->block_size;
    /* activations: a sequence's logits (fp32) and the widest step's values
     * per token: every prompt token of the batch at once (one prefill
     * step), or, on a named engine that chunks prompts, at most its token
     * budget (rt.act_step) */
    double act_tok = (c->hidden + widest) * p->act_bytes;
    double act_seq = (rt.act_step ? 0 : P * act_tok) + (double)c->vocab * 4,
           act_fixed = rt.act_step ? fmin(B * P, rt.budget) * act_tok : 0;
    o->weights_gib = ac_carch_params(c) * p->w_bytes / gib;
    o->kv_gib = B * seq_tokens * kv_tok / gib;
    o->state_gib = B * state_seq / gib;
    o->act_gib = (B * act_seq + act_fixed) / gib;
    o->mem_gib = o->weights_gib + o->kv_gib + o->state_gib + o->act_gib + p->overhead_gib;
    o->device_mem_gib = t->mem_gib;
    double avail = t->mem_gib * p->mem_util - o->weights_gib - p->overhead_gib -
                   (rt.act_step ? rt.budget * act_tok / gib : 0),
           per_seq = (seq_tokens * kv_tok + state_seq + act_seq) / gib;
    o->max_batch = avail > 0 && per_seq > 0 ? (int)fmin(floor(avail / per_seq), 1e9) : 0;
    /* The engine's pool: what it preallocates at start-up, less weights,
     * the activations of its largest step (the token budget) and its
     * runtime's own memory, in blocks. */
    /* (and the Mamba state of its max_seqs sequences, allocated up front) */
    double act_peak = (rt.budget * (c->hidden + widest) * p->act_bytes + (double)rt.max_seqs * c->vocab * 4 +
                       (double)rt.max_seqs * state_seq) / gib,
           rest = o->weights_gib + act_peak + p->overhead_gib, pool;
    if (rt.fixed_kv_tokens > 0) {
        pool = rt.fixed_kv_tokens * kv_tok / gib;
        o->engine_mem_gib = rest + pool;
    } else if (rt.pool_of_free > 0) {
        pool = rt.pool_of_free * (t->mem_gib - rest);
        o->engine_mem_gib = rest + pool;
    } else {
        pool = rt.mem_util * t->mem_gib - rest;
        o->engine_mem_gib = rt.mem_util * t->mem_gib;
    }
    if (pool < 0) pool = 0;
    double block_bytes = rt.block_size * kv_tok;
    o->kv_blocks = block_bytes > 0 ? (long)fmin(floor(pool * gib / block_bytes), 1e15) : 0;
    o->kv_pool_gib = o->kv_blocks * block_bytes / gib;
    o->kv_tokens = (double)o->kv_blocks * rt.block_size;
    long per_req = (long)ceil((P + G) / rt.block_size);
    o->kv_concurrency = per_req > 0 ? (int)fmin(o->kv_blocks / per_req, 1e9) : 0;
    if (ac_workload_served(w)) {
        predict_served(t, c, w, p, &rt, fw, o, mean_batch);
    } else {
        o->ttft_ms = step_us(t, c, p, &rt, B, P, 0, fw) / 1e3;
        /* Decode steps at context P..P+G-1: the cost is close to linear in the
         * context, so Simpson's rule over three points is near exact. */
        double d0 = step_us(t, c, p, &rt, B, 1, P, fw), d1 = step_us(t, c, p, &rt, B, 1, P + (G - 1) / 2, fw),
               d2 = step_us(t, c, p, &rt, B, 1, P + G - 1, fw);
        o->tpot_ms = G > 1 ? (d0 + 4 * d1 + d2) / 6 / 1e3 : 0;
        o->e2e_ms = o->ttft_ms + (G - 1) * o->tpot_ms;
        o->tokens_per_s = B * G / (o->e2e_ms / 1e3);
        o->requests_per_s = B / (o->e2e_ms / 1e3);
        o->p50_ttft_ms = o->p99_ttft_ms = o->ttft_ms;
        o->p50_tpot_ms = o->p99_tpot_ms = o->tpot_ms;
        o->p50_e2e_ms = o->p99_e2e_ms = o->e2e_ms;
    }
    if (c != c0) free(sc.heads);
}

double ac_cost_overhead_share(const ac_cost_table *t, const ac_carch *c, const ac_workload *w,
                              const ac_engine_profile *p, const ac_cost *a) {
    ac_cost_table t0 = *t; /* read only: shares t's arrays */
    ac_engine_profile p0 = *p;
    t0.launch_us = 0;
    p0.overhead_ms = p0.seq_overhead_us = 0;
    ac_cost b;
    ac_cost_predict(&t0, c, w, &p0, 0, &b);
    return a->e2e_ms > 0 && a->e2e_ms < 1e11 ? fmax(0, fmin(1, 1 - b.e2e_ms / a->e2e_ms)) : 0;
}

double ac_cost_metric(const ac_cost *c, ac_metric m) {
    switch (m) {
    case AC_M_TTFT: return c->ttft_ms;
    case AC_M_TPOT: return c->tpot_ms;
    case AC_M_TOKENS_PER_S: return c->tokens_per_s;
    case AC_M_MEM: return c->mem_gib;
    case AC_M_PARAMS: return c->params;
    case AC_M_P99_TTFT: return c->p99_ttft_ms;
    case AC_M_P99_TPOT: return c->p99_tpot_ms;
    case AC_M_P99_E2E: return c->p99_e2e_ms;
    default: return 0;
    }
}

static void grad_fd(const ac_cost_table *t, const ac_carch *c, const ac_workload *w, const ac_engine_profile *p,
                    ac_metric m, double *gh, double *gkv, double *gf, double *ghid, double *ge);
static void grad_all(const ac_cost_table *t, const ac_carch *c, const ac_workload *w, const ac_engine_profile *p,
                     ac_metric m, double *gh, double *gkv, double *gf, double *ghid, double *ge);

/* A served workload's figures come from a simulation whose schedule moves
 * in steps as widths change, and one simulation costs what thousands of
 * static predictions do: its gradient is the static model's at the
 * simulation's mean batch (the sequences a step carries, weighted by
 * time), scaled by the ratio of the simulated figure to that static one.
 * Exact in value at the point, first-order in direction. */
void ac_cost_grad(const ac_cost_table *t, const ac_carch *c, const ac_workload *w, const ac_engine_profile *p,
                  ac_metric m, double *gh, double *gkv, double *gf, double *ghid) {
    grad_all(t, c, w, p, m, gh, gkv, gf, ghid, NULL);
}

void ac_cost_grad_experts(const ac_cost_table *t, const ac_carch *c, const ac_workload *w, const ac_engine_profile *p,
                          ac_metric m, double *gh, double *gkv, double *gf, double *ghid, double *g_experts) {
    for (int l = 0; l < c->n_layers; l++) g_experts[l] = 0;
    grad_all(t, c, w, p, m, gh, gkv, gf, ghid, g_experts);
}

static void grad_all(const ac_cost_table *t, const ac_carch *c, const ac_workload *w, const ac_engine_profile *p,
                     ac_metric m, double *gh, double *gkv, double *gf, double *ghid, double *ge) {
    if (!ac_workload_served(w) || m == AC_M_MEM || m == AC_M_PARAMS) {
        grad_fd(t, c, w, p, m, gh, gkv, gf, ghid, ge);
        return;
    }
    ac_cost served, base;
    double mean_batch = 0;
    predict_all(t, c, w, p, 1, &served, &mean_batch);
    ac_workload sw = {
        .batch = mean_batch >= 1 ? (int)lround(mean_batch) : 1, .prompt_len = w->prompt_len, .gen_len = w->gen_len};
    ac_cost_predict(t, c, &sw, p, 1, &base);
    /* Under Poisson arrivals the output rate is N G / (last finish - first
     * send), the last finish the last arrival plus its latency: it moves
     * with the latency, -rate / duration per millisecond of E2E, not with
     * the engine's capacity (an unsaturated server serves what arrives). */
    ac_metric gm = m;
    double scale = 1;
    if (m == AC_M_TOKENS_PER_S && w->arrival_rate > 0 && !w->offline && served.requests_per_s > 0) {
        int n = w->requests > 0 ? w->requests : AC_SERVE_REQUESTS;
        double duration_ms = n / served.requests_per_s * 1e3;
        gm = AC_M_P99_E2E; /* a static batch's E2E */
        scale = -served.tokens_per_s / duration_ms;
    }
    double v = gm == AC_M_P99_E2E && gm != m ? served.e2e_ms : ac_cost_metric(&served, gm),
           b = ac_cost_metric(&base, gm), r = b != 0 && v < 1e11 ? scale * v / b : 0;
    grad_fd(t, c, &sw, p, gm, gh, gkv, gf, ghid, ge);
    double *outs[4] = {gh, gkv, gf, ge};
    for (int k = 0; k < 4; k++)
        for (int l = 0; outs[k] && l < c->n_layers; l++) outs[k][l] *= r;
    if (ghid) *ghid *= r;
}

/* Central differences: heads and KV heads by 0.25, FFN widths by 2
 * channels, experts by 0.25 expert (layers without experts: 0). */
static void grad_fd(const ac_cost_table *t, const ac_carch *c, const ac_workload *w, const ac_engine_profile *p,
                    ac_metric m, double *gh, double *gkv, double *gf, double *ghid, double *ge) {
    ac_cost a, b;
    ac_carch x = *c;
    double *vars[4] = {c->heads, c->kv, c->ffn, c->experts}, *outs[4] = {gh, gkv, gf, c->experts ? ge : NULL};
    for (int v = 0; v < 4; v++) {
        if (!outs[v]) continue;
        for (int l = 0; l < c->n_layers; l++) {
            if (v == 3 && c->experts[l] <= 0) {
                outs[v][l] = 0;
                continue;
            }
            double orig = vars[v][l], step = v == 2 ? 2.0 : 0.25;
            double lo = orig - step < 0 ? 0 : orig - step, hi = orig + step;
            vars[v][l] = hi;
            ac_cost_predict(t, &x, w, p, 1, &a);
            vars[v][l] = lo;
            ac_cost_predict(t, &x, w, p, 1, &b);
            vars[v][l] = orig;
            outs[v][l] = (ac_cost_metric(&a, m) - ac_cost_metric(&b, m)) / (hi - lo);
        }
    }
    if (ghid) {
        double orig = c->hidden;
        x.hidden = orig + 4;
        ac_cost_predict(t, &x, w, p, 1, &a);
        x.hidden = orig - 4;
        ac_cost_predict(t, &x, w, p, 1, &b);
        *ghid = (ac_cost_metric(&a, m) - ac_cost_metric(&b, m)) / 8;
    }
}

json_t *ac_cost_to_json(const ac_cost *c) {
    json_t *o = json_pack("{s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:i,s:f}", "ttft_ms", c->ttft_ms, "tpot_ms", c->tpot_ms,
                          "tokens_per_s", c->tokens_per_s, "e2e_ms", c->e2e_ms, "memory_gib", c->mem_gib, "weights_gib",
                          c->weights_gib, "kv_cache_gib", c->kv_gib, "activations_gib", c->act_gib, "params", c->params,
                          "max_batch", c->max_batch, "device_memory_gib", c->device_mem_gib);
    if (o && c->state_gib > 0) json_object_set_new(o, "ssm_state_gib", json_real(c->state_gib));
    json_t *x = json_pack("{s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:b,s:i,s:f,s:f,s:I,s:f,s:i}", "p50_ttft_ms", c->p50_ttft_ms,
                          "p99_ttft_ms", c->p99_ttft_ms, "p50_tpot_ms", c->p50_tpot_ms, "p99_tpot_ms", c->p99_tpot_ms,
                          "p50_e2e_ms", c->p50_e2e_ms, "p99_e2e_ms", c->p99_e2e_ms, "requests_per_s", c->requests_per_s,
                          "served", c->served, "preempted", c->preempted, "engine_memory_gib", c->engine_mem_gib,
                          "kv_pool_gib", c->kv_pool_gib, "kv_blocks", (json_int_t)c->kv_blocks, "kv_tokens",
                          c->kv_tokens, "kv_concurrency", c->kv_concurrency);
    if (!o || !x || json_object_update(o, x)) {
        json_decref(o);
        o = NULL;
    }
    json_decref(x);
    return o;
}

json_t *ac_workload_to_json(const ac_workload *w) {
    json_t *o = json_pack("{s:i,s:i,s:i}", "batch", w->batch, "prompt_len", w->prompt_len, "gen_len", w->gen_len);
    if (o && ac_workload_served(w)) {
        json_object_set_new(o, "served", json_true());
        if (w->offline) json_object_set_new(o, "offline", json_true());
        if (w->arrival_rate > 0) json_object_set_new(o, "arrival_rate", json_real(w->arrival_rate));
        if (w->concurrency > 0) json_object_set_new(o, "concurrency", json_integer(w->concurrency));
        json_object_set_new(o, "requests", json_integer(w->requests > 0 ? w->requests : AC_SERVE_REQUESTS));
        json_object_set_new(o, "length_spread", json_real(w->length_spread));
        json_object_set_new(o, "seed", json_integer(w->seed));
    }
    return o;
}

void ac_engine_profile_cpu(ac_engine_profile *p, const char *dtype) {
    ac_engine_profile_default(p, 1);
    if (dtype && !strcmp(dtype, "bf16")) p->w_bytes = 2;
}

const char *ac_engine_profile_dtype(const ac_engine_profile *p) {
    return p->w_bytes == 4 ? "fp32" : p->w_bytes == 1 ? "fp8" : "bf16";
}
