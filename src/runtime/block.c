/* block.c - see block.h. The one place the decoder layer's structure is
 * written. */
#include "runtime/block.h"

#include <math.h>
#include <stddef.h>

#define OP(k, o, i, i2, i3, w_, di, do_, hd, ac, hk)                                                                   \
    { (k), (o), (i), (i2), (i3), (w_), (di), (do_), (hd), (ac), (hk) }

/* Llama / Qwen2 / Mistral decoder layer (pre-norm):
 *   xn = rmsnorm(x) * in_norm
 *   q = xn Wq^T + bq;  k = xn Wk^T + bk;  v = xn Wv^T + bv     [N][Q] [N][KV] [N][KV]
 *   (KV heads merged)   q, k = rope(q), rope(k)
 *   att = softmax(q k^T / sqrt(hd) + causal) v  per query head, GQA   [N][Q]
 *   (query heads masked)   x += att Wo^T   (hidden masked)
 *   xn = rmsnorm(x) * post_norm
 *   g = xn Wg^T;  u = xn Wu^T;  g = silu(g) * u                       [N][F]
 *   (FFN channels masked)   x += g Wd^T   (hidden masked) */
/* The attention sub-block's projections (and KV merge), then its RoPE,
 * attention and output: shared by the Llama and Qwen3 recipes. */
#define ATTN_PROJECT                                                                                                   \
    OP(AC_OP_RMSNORM, AC_T_XN, AC_T_X, 0, 0, AC_NORM_IN, AC_DIM_H, AC_DIM_H, 0, 0, AC_HOOK_NORMED),                    \
        OP(AC_OP_LINEAR, AC_T_Q, AC_T_XN, 0, 0, AC_W_Q, AC_DIM_H, AC_DIM_Q, 0, 0, AC_HOOK_NONE),                       \
        OP(AC_OP_LINEAR, AC_T_K, AC_T_XN, 0, 0, AC_W_K, AC_DIM_H, AC_DIM_KV, 0, 0, AC_HOOK_NONE),                      \
        OP(AC_OP_LINEAR, AC_T_V, AC_T_XN, 0, 0, AC_W_V, AC_DIM_H, AC_DIM_KV, 0, 0, AC_HOOK_NONE),                      \
        OP(AC_OP_KV_MERGE, AC_T_K, AC_T_V, 0, 0, -1, AC_DIM_KV, AC_DIM_KV, 0, 0, AC_HOOK_NONE)
#define ATTN_ATTEND                                                                                                    \
    OP(AC_OP_ROPE, AC_T_Q, AC_T_Q, 0, 0, -1, AC_DIM_Q, AC_DIM_Q, AC_DIM_Q, 0, AC_HOOK_NONE),                           \
        OP(AC_OP_ROPE, AC_T_K, AC_T_K, 0, 0, -1, AC_DIM_KV, AC_DIM_KV, AC_DIM_KV, 0, AC_HOOK_NONE),                    \
        OP(AC_OP_ATTENTION, AC_T_ATT, AC_T_Q, AC_T_K, AC_T_V, -1, AC_DIM_Q, AC_DIM_Q, 0, 0, AC_HOOK_HEAD_OUT),         \
        OP(AC_OP_MASK, AC_T_ATT, AC_T_ATT, 0, 0, -1, AC_DIM_Q, AC_DIM_Q, 0, 0, AC_HOOK_NONE),                          \
        OP(AC_OP_LINEAR, AC_T_X, AC_T_ATT, 0, 0, AC_W_O, AC_DIM_Q, AC_DIM_H, 0, 1, AC_HOOK_NONE),                      \
        OP(AC_OP_MASK_HIDDEN, AC_T_X, AC_T_X, 0, 0, -1, AC_DIM_H, AC_DIM_H, 0, 0, AC_HOOK_NONE)
static const ac_op llama_attn[] = {ATTN_PROJECT, ATTN_ATTEND};
static const ac_op llama_ffn[] = {
    OP(AC_OP_RMSNORM, AC_T_XN, AC_T_X, 0, 0, AC_NORM_POST, AC_DIM_H, AC_DIM_H, 0, 0, AC_HOOK_NORMED),
    OP(AC_OP_LINEAR, AC_T_G, AC_T_XN, 0, 0, AC_W_G, AC_DIM_H, AC_DIM_F, 0, 0, AC_HOOK_NONE),
    OP(AC_OP_LINEAR, AC_T_U, AC_T_XN, 0, 0, AC_W_U, AC_DIM_H, AC_DIM_F, 0, 0, AC_HOOK_NONE),
    OP(AC_OP_SWIGLU, AC_T_G, AC_T_U, 0, 0, -1, AC_DIM_F, AC_DIM_F, 0, 0, AC_HOOK_FFN_ACT),
    OP(AC_OP_MASK, AC_T_G, AC_T_G, 0, 0, -1, AC_DIM_F, AC_DIM_F, 0, 0, AC_HOOK_NONE),
    OP(AC_OP_LINEAR, AC_T_X, AC_T_G, 0, 0, AC_W_D, AC_DIM_F, AC_DIM_H, 0, 1, AC_HOOK_NONE),
    OP(AC_OP_MASK_HIDDEN, AC_T_X, AC_T_X, 0, 0, -1, AC_DIM_H, AC_DIM_H, 0, 0, AC_HOOK_NONE),
};
static const ac_subblock llama_sub[] = {
    {"attention", AC_DIM_Q, (int)(sizeof llama_attn / sizeof *llama_attn), llama_attn},
    {"ffn", AC_DIM_F, (int)(sizeof llama_ffn / sizeof *llama_ffn), llama_ffn},
};
static const ac_block_recipe llama = {"llama", 2, llama_sub};

/* Qwen3 decoder layer: Llama's, with q and k RMS-normed per head (one
 * [hd] weight each, shared by the heads) after any KV merge and before
 * RoPE, so a merged model's k_norm sees the pooled head as its export does:
 *   q = q_norm(q);  k = k_norm(k)   over head_dim-wide heads */
static const ac_op qwen3_attn[] = {
    ATTN_PROJECT,
    OP(AC_OP_HEAD_NORM, AC_T_Q, AC_T_Q, 0, 0, AC_NORM_Q, AC_DIM_Q, AC_DIM_Q, AC_DIM_Q, 0, AC_HOOK_NONE),
    OP(AC_OP_HEAD_NORM, AC_T_K, AC_T_K, 0, 0, AC_NORM_K, AC_DIM_KV, AC_DIM_KV, AC_DIM_KV, 0, AC_HOOK_NONE),
    ATTN_ATTEND,
};
static const ac_subblock qwen3_sub[] = {
    {"attention", AC_DIM_Q, (int)(sizeof qwen3_attn / sizeof *qwen3_attn), qwen3_attn},
    {"ffn", AC_DIM_F, (int)(sizeof llama_ffn / sizeof *llama_ffn), llama_ffn},
};
static const ac_block_recipe qwen3 = {"qwen3", 2, qwen3_sub};

/* Mixture-of-experts FFN (Mixtral, Qwen3-MoE), in place of the dense one:
 *   xn = rmsnorm(x) * post_norm
 *   r = route(xn Wr^T)                 [N][E], top_k weights per row
 *   x += sum_e r[:,e] * down_e(silu(gate_e(xn)) * up_e(xn))   (hidden masked) */
static const ac_op moe_ffn[] = {
    OP(AC_OP_RMSNORM, AC_T_XN, AC_T_X, 0, 0, AC_NORM_POST, AC_DIM_H, AC_DIM_H, 0, 0, AC_HOOK_NORMED),
    OP(AC_OP_ROUTE, AC_T_R, AC_T_XN, 0, 0, -1, AC_DIM_H, AC_DIM_E, 0, 0, AC_HOOK_NONE),
    OP(AC_OP_EXPERTS, AC_T_X, AC_T_XN, AC_T_R, 0, -1, AC_DIM_H, AC_DIM_H, 0, 1, AC_HOOK_NONE),
    OP(AC_OP_MASK_HIDDEN, AC_T_X, AC_T_X, 0, 0, -1, AC_DIM_H, AC_DIM_H, 0, 0, AC_HOOK_NONE),
};
static const ac_subblock mixtral_sub[] = {
    {"attention", AC_DIM_Q, (int)(sizeof llama_attn / sizeof *llama_attn), llama_attn},
    {"moe", AC_DIM_E, (int)(sizeof moe_ffn / sizeof *moe_ffn), moe_ffn},
};
static const ac_block_recipe mixtral = {"mixtral", 2, mixtral_sub};
static const ac_subblock qwen3_moe_sub[] = {
    {"attention", AC_DIM_Q, (int)(sizeof qwen3_attn / sizeof *qwen3_attn), qwen3_attn},
    {"moe", AC_DIM_E, (int)(sizeof moe_ffn / sizeof *moe_ffn), moe_ffn},
};
static const ac_block_recipe qwen3_moe = {"qwen3_moe", 2, qwen3_moe_sub};

/* Nemotron-H hybrid layer: one RMSNorm and one mixer, x += mixer(rmsnorm(x)),
 * the mixer by which width the layer has (sub-blocks in the trainer's gate
 * order: attention, MLP, then Mamba, whose residual add has no gate):
 *   attention: Llama's without RoPE
 *   MLP:       u = xn Wu^T;  g = relu(u)^2;  (channels masked)  x += g Wd^T
 *   Mamba-2:   zx = xn Win^T                     [N][SI]: z, xBC, dt
 *              xbc = silu(causal_conv(xBC) + b)  [N][SC]: x, B, C
 *              y = scan(x, B, C, dt)             [N][SSM]
 *              yn = groupnorm(y * silu(z)) * w   [N][SSM]  (heads and head dims gated inside the norm)
 *              x += yn Wout^T */
static const ac_op hybrid_attn[] = {
    ATTN_PROJECT,
    OP(AC_OP_ATTENTION, AC_T_ATT, AC_T_Q, AC_T_K, AC_T_V, -1, AC_DIM_Q, AC_DIM_Q, 0, 0, AC_HOOK_HEAD_OUT),
    OP(AC_OP_MASK, AC_T_ATT, AC_T_ATT, 0, 0, -1, AC_DIM_Q, AC_DIM_Q, 0, 0, AC_HOOK_NONE),
    OP(AC_OP_LINEAR, AC_T_X, AC_T_ATT, 0, 0, AC_W_O, AC_DIM_Q, AC_DIM_H, 0, 1, AC_HOOK_NONE),
    OP(AC_OP_MASK_HIDDEN, AC_T_X, AC_T_X, 0, 0, -1, AC_DIM_H, AC_DIM_H, 0, 0, AC_HOOK_NONE),
};
static const ac_op hybrid_mlp[] = {
    OP(AC_OP_RMSNORM, AC_T_XN, AC_T_X, 0, 0, AC_NORM_POST, AC_DIM_H, AC_DIM_H, 0, 0, AC_HOOK_NORMED),
    OP(AC_OP_LINEAR, AC_T_U, AC_T_XN, 0, 0, AC_W_U, AC_DIM_H, AC_DIM_F, 0, 0, AC_HOOK_NONE),
    OP(AC_OP_RELU2, AC_T_G, AC_T_U, 0, 0, -1, AC_DIM_F, AC_DIM_F, 0, 0, AC_HOOK_FFN_ACT),
    OP(AC_OP_MASK, AC_T_G, AC_T_G, 0, 0, -1, AC_DIM_F, AC_DIM_F, 0, 0, AC_HOOK_NONE),
    OP(AC_OP_LINEAR, AC_T_X, AC_T_G, 0, 0, AC_W_D, AC_DIM_F, AC_DIM_H, 0, 1, AC_HOOK_NONE),
    OP(AC_OP_MASK_HIDDEN, AC_T_X, AC_T_X, 0, 0, -1, AC_DIM_H, AC_DIM_H, 0, 0, AC_HOOK_NONE),
};
static const ac_op hybrid_mamba[] = {
    OP(AC_OP_RMSNORM, AC_T_XN, AC_T_X, 0, 0, AC_NORM_IN, AC_DIM_H, AC_DIM_H, 0, 0, AC_HOOK_NORMED),
    OP(AC_OP_LINEAR, AC_T_ZX, AC_T_XN, 0, 0, AC_W_SSM_IN, AC_DIM_H, AC_DIM_SI, 0, 0, AC_HOOK_SSM_IN),
    OP(AC_OP_SSM_CONV, AC_T_XBC, AC_T_ZX, 0, 0, -1, AC_DIM_SI, AC_DIM_SC, 0, 0, AC_HOOK_NONE),
    OP(AC_OP_SSM_SCAN, AC_T_Y, AC_T_XBC, AC_T_ZX, 0, -1, AC_DIM_SC, AC_DIM_SSM, 0, 0, AC_HOOK_NONE),
    OP(AC_OP_GATED_NORM, AC_T_YN, AC_T_Y, AC_T_ZX, 0, AC_NORM_SSM, AC_DIM_SSM, AC_DIM_SSM, 0, 0, AC_HOOK_NONE),
    OP(AC_OP_LINEAR, AC_T_X, AC_T_YN, 0, 0, AC_W_SSM_OUT, AC_DIM_SSM, AC_DIM_H, 0, 1, AC_HOOK_NONE),
    OP(AC_OP_MASK_HIDDEN, AC_T_X, AC_T_X, 0, 0, -1, AC_DIM_H, AC_DIM_H, 0, 0, AC_HOOK_NONE),
};
/* MoE (`E` layers): the sigmoid router, squared-ReLU experts, then the
 * shared expert on the same normed input:
 *   r = route_sigmoid(xn Wr^T)                         [N][E]
 *   x += sum_e r[:,e] * down_e(relu(up_e(xn))^2)
 *   su = xn Wsu^T;  sg = relu(su)^2;  (channels masked)  x += sg Wsd^T     [N][FS]   (hidden masked) */
/* the router, then the shared expert after the routed ones */
#define HYBRID_ROUTE                                                                                                   \
    OP(AC_OP_RMSNORM, AC_T_XN, AC_T_X, 0, 0, AC_NORM_POST, AC_DIM_H, AC_DIM_H, 0, 0, AC_HOOK_NORMED),                  \
        OP(AC_OP_ROUTE, AC_T_R, AC_T_XN, 0, 0, -1, AC_DIM_H, AC_DIM_E, 0, 0, AC_HOOK_NONE)
#define HYBRID_SHARED                                                                                                  \
    OP(AC_OP_LINEAR, AC_T_SU, AC_T_XN, 0, 0, AC_W_SH_U, AC_DIM_H, AC_DIM_FS, 0, 0, AC_HOOK_NONE),                      \
        OP(AC_OP_RELU2, AC_T_SG, AC_T_SU, 0, 0, -1, AC_DIM_FS, AC_DIM_FS, 0, 0, AC_HOOK_SHARED_ACT),                   \
        OP(AC_OP_MASK, AC_T_SG, AC_T_SG, 0, 0, -1, AC_DIM_FS, AC_DIM_FS, 0, 0, AC_HOOK_NONE),                          \
        OP(AC_OP_LINEAR, AC_T_X, AC_T_SG, 0, 0, AC_W_SH_D, AC_DIM_FS, AC_DIM_H, 0, 1, AC_HOOK_NONE),                   \
        OP(AC_OP_MASK_HIDDEN, AC_T_X, AC_T_X, 0, 0, -1, AC_DIM_H, AC_DIM_H, 0, 0, AC_HOOK_NONE)
static const ac_op hybrid_moe[] = {
    HYBRID_ROUTE,
    OP(AC_OP_EXPERTS, AC_T_X, AC_T_XN, AC_T_R, 0, -1, AC_DIM_H, AC_DIM_H, 0, 1, AC_HOOK_NONE),
    HYBRID_SHARED,
};
/* the sub-blocks of either hybrid recipe, its MoE ops moe */
#define HYBRID_SUB(moe)                                                                                                \
    {"attention", AC_DIM_Q, (int)(sizeof hybrid_attn / sizeof *hybrid_attn), hybrid_attn},                           \
        {"mlp", AC_DIM_F, (int)(sizeof hybrid_mlp / sizeof *hybrid_mlp), hybrid_mlp},                                 \
        {"mamba", AC_DIM_SSM, (int)(sizeof hybrid_mamba / sizeof *hybrid_mamba), hybrid_mamba},                       \
    {                                                                                                                  \
        "moe", AC_DIM_E, (int)(sizeof moe / sizeof *moe), moe                                                          \
    }
static const ac_subblock hybrid_sub[] = {HYBRID_SUB(hybrid_moe)};
static const ac_block_recipe nemotron_h = {"nemotron_h", 4, hybrid_sub};
/* LatentMoE (Nemotron 3 Super): the routed experts between a down and an
 * up projection; the router and the shared expert on the hidden width:
 *   xl = xn Wld^T;  yl = sum_e r[:,e] * down_e(relu(up_e(xl))^2);  x += yl Wlu^T   [N][LT]
 *   (latent channels masked twice, xl and yl, by the same gates: a gate of 0 is the channel removed) */
static const ac_op hybrid_moe_latent[] = {
    HYBRID_ROUTE,
    OP(AC_OP_LINEAR, AC_T_XL, AC_T_XN, 0, 0, AC_W_LAT_DOWN, AC_DIM_H, AC_DIM_LT, 0, 0, AC_HOOK_NONE),
    OP(AC_OP_MASK, AC_T_XL, AC_T_XL, 0, 0, -1, AC_DIM_LT, AC_DIM_LT, 0, 0, AC_HOOK_NONE),
    OP(AC_OP_EXPERTS, AC_T_YL, AC_T_XL, AC_T_R, 0, -1, AC_DIM_LT, AC_DIM_LT, 0, 0, AC_HOOK_NONE),
    OP(AC_OP_MASK, AC_T_YL, AC_T_YL, 0, 0, -1, AC_DIM_LT, AC_DIM_LT, 0, 0, AC_HOOK_NONE),
    OP(AC_OP_LINEAR, AC_T_X, AC_T_YL, 0, 0, AC_W_LAT_UP, AC_DIM_LT, AC_DIM_H, 0, 1, AC_HOOK_NONE),
    HYBRID_SHARED,
};
static const ac_subblock hybrid_latent_sub[] = {HYBRID_SUB(hybrid_moe_latent)};
static const ac_block_recipe nemotron_h_latent = {"nemotron_h", 4, hybrid_latent_sub};

const ac_block_recipe *ac_block_recipe_of(const ac_arch *a, int l) {
    if (a->hybrid) return a->moe_latent ? &nemotron_h_latent : &nemotron_h;
    if (a->layers && l >= 0 && l < a->n_layers && a->layers[l].n_experts) return a->qk_norm ? &qwen3_moe : &mixtral;
    return a->qk_norm ? &qwen3 : &llama;
}

int ac_block_slot_dim(int slot) {
    static const unsigned char d[AC_T_COUNT] = {AC_DIM_H,  AC_DIM_H,  AC_DIM_Q,  AC_DIM_KV, AC_DIM_KV,
                                                AC_DIM_Q,  AC_DIM_F,  AC_DIM_F,  AC_DIM_E,  AC_DIM_H,
                                                AC_DIM_FE, AC_DIM_FE, AC_DIM_SI, AC_DIM_SC, AC_DIM_SSM,
                                                AC_DIM_SSM, AC_DIM_FS, AC_DIM_FS, AC_DIM_LT, AC_DIM_LT};
    return slot >= 0 && slot < AC_T_COUNT ? (int)d[slot] : (int)AC_DIM_H;
}

int ac_block_dim(const ac_arch *a, int l, ac_dim d) {
    const ac_layer_arch *la = &a->layers[l];
    switch (d) {
    case AC_DIM_H: return a->hidden;
    case AC_DIM_Q: return la->n_heads * a->head_dim;
    case AC_DIM_KV: return la->n_kv_heads * a->head_dim;
    case AC_DIM_F: return la->ffn;
    case AC_DIM_E: return la->n_experts;
    case AC_DIM_FE: return la->expert_ffn;
    case AC_DIM_FS: return a->hybrid && la->n_experts ? a->shared_ffn : 0;
    case AC_DIM_LT: return a->hybrid && la->n_experts ? a->moe_latent : 0;
    /* (inline rather than model.c's ac_ssm_*: block.c is compiled into the CUDA plugin without model.c) */
    case AC_DIM_SSM: return la->ssm_heads * a->ssm_head_dim;
    case AC_DIM_SC: return la->ssm_heads ? la->ssm_heads * a->ssm_head_dim + 2 * a->ssm_groups * a->ssm_state : 0;
    case AC_DIM_SI:
        return la->ssm_heads ? 2 * la->ssm_heads * a->ssm_head_dim + 2 * a->ssm_groups * a->ssm_state + la->ssm_heads
                             : 0;
    default: return 0;
    }
}

int ac_block_sub_present(const ac_arch *a, int l, const ac_subblock *s) {
    return ac_block_dim(a, l, (ac_dim)s->present) > 0;
}

int ac_block_dim_max(const ac_arch *a, ac_dim d) {
    int mx = 1;
    for (int l = 0; l < a->n_layers; l++) {
        int v = ac_block_dim(a, l, d);
        if (v > mx) mx = v;
    }
    return mx;
}

const void *ac_block_matrix(const ac_layer_w *lw, int w) {
    switch (w) {
    case AC_W_Q: return lw->wq;
    case AC_W_K: return lw->wk;
    case AC_W_V: return lw->wv;
    case AC_W_O: return lw->wo;
    case AC_W_G: return lw->wg;
    case AC_W_U: return lw->wu;
    case AC_W_D: return lw->wd;
    case AC_W_SSM_IN: return lw->ssm_in;
    case AC_W_SSM_OUT: return lw->ssm_out;
    case AC_W_SH_U: return lw->sh_u;
    case AC_W_SH_D: return lw->sh_d;
    case AC_W_LAT_DOWN: return lw->lat_down;
    case AC_W_LAT_UP: return lw->lat_up;
    default: return NULL;
    }
}

const float *ac_block_bias(const ac_layer_w *lw, int w) {
    switch (w) {
    case AC_W_Q: return lw->bq;
    case AC_W_K: return lw->bk;
    case AC_W_V: return lw->bv;
    default: return NULL;
    }
}

const float *ac_block_norm(const ac_layer_w *lw, int w) {
    switch (w) {
    case AC_NORM_IN: return lw->in_norm;
    case AC_NORM_POST: return lw->post_norm;
    case AC_NORM_Q: return lw->q_norm;
    case AC_NORM_K: return lw->k_norm;
    case AC_NORM_SSM: return lw->ssm_norm;
    default: return NULL;
    }
}

int ac_block_op_taped(const ac_op *op) {
    return (op->kind == AC_OP_LINEAR && !op->acc) || op->kind == AC_OP_ATTENTION || op->kind == AC_OP_HEAD_NORM ||
           op->kind == AC_OP_ROUTE || op->kind == AC_OP_SSM_CONV || op->kind == AC_OP_SSM_SCAN ||
           (op->kind == AC_OP_EXPERTS && !op->acc);
}

int ac_block_mask_unit(const ac_arch *a, ac_dim d) {
    return d == AC_DIM_Q ? a->head_dim : d == AC_DIM_SSM ? a->ssm_head_dim : 1;
}

int ac_block_op_recomputed(const ac_op *op) {
    return op->kind == AC_OP_RMSNORM || op->kind == AC_OP_SWIGLU || op->kind == AC_OP_MASK ||
           op->kind == AC_OP_RELU2 || op->kind == AC_OP_GATED_NORM;
}

size_t ac_block_op_tape(const ac_arch *a, int l, const ac_op *op, size_t N, int attn_extra) {
    if (op->kind == AC_OP_RMSNORM) return N * ((size_t)a->hidden + 1);
    if (op->kind == AC_OP_ROUTE) return 2 * N * (size_t)ac_block_dim(a, l, AC_DIM_E); /* softmax, then the weights */
    if (op->kind == AC_OP_ATTENTION)
        return N * ((size_t)ac_block_dim(a, l, (ac_dim)op->dout) + (size_t)attn_extra * a->layers[l].n_heads);
    return ac_block_op_taped(op) ? N * (size_t)ac_block_dim(a, l, (ac_dim)op->dout) : 0;
}

size_t ac_block_tape_floats(const ac_arch *a, int l, size_t N, int attn_extra) {
    const ac_block_recipe *r = ac_block_recipe_of(a, l);
    size_t n = 0;
    for (int s = 0; s < r->n_sub; s++)
        for (int i = 0; ac_block_sub_present(a, l, &r->sub[s]) && i < r->sub[s].n_ops; i++)
            n += ac_block_op_tape(a, l, &r->sub[s].ops[i], N, attn_extra);
    return n;
}

size_t ac_block_scratch_floats(const ac_arch *a, size_t N) {
    const ac_block_recipe *r = ac_block_recipe_of(a, 0);
    size_t sub = 0, n = 0;
    for (int s = 0; s < r->n_sub; s++) {
        size_t k = 0;
        for (int i = 0; i < r->sub[s].n_ops; i++) {
            const ac_op *op = &r->sub[s].ops[i];
            if (ac_block_op_recomputed(op))
                k += N * (size_t)ac_block_dim_max(a, op->kind == AC_OP_RMSNORM ? AC_DIM_H : (ac_dim)op->dout);
        }
        if (k > sub) sub = k;
    }
    for (int t = 0; t < AC_T_COUNT; t++) n += N * (size_t)ac_block_dim_max(a, (ac_dim)ac_block_slot_dim(t));
    return sub + n + ac_block_moe_work_floats(a, N) + ac_block_ssm_work_floats(a, N);
}

size_t ac_block_ssm_work_floats(const ac_arch *a, size_t N) {
    if (!a->hybrid) return 0;
    size_t st = (size_t)a->ssm_head_dim * a->ssm_state;
    return (N + 2) * st + 2 * N; /* every step's state of one sequence and head, a state's gradient, the steps */
}

size_t ac_block_moe_work_floats(const ac_arch *a, size_t N) {
    int moe = 0; /* (block.c is compiled into the CUDA plugin too, without model.c) */
    for (int l = 0; l < a->n_layers; l++) moe |= a->layers[l].n_experts > 0;
    if (!moe) return 0;
    return N * (3 * (size_t)a->hidden + 5 * (size_t)ac_block_dim_max(a, AC_DIM_FE));
}

void ac_moe_route(float *r, float *p, int N, int E, int k, int norm, int *order) {
    ac_moe_route_gated(r, p, NULL, N, E, k, norm, order);
}

void ac_moe_route_gated(float *r, float *p, const float *z, int N, int E, int k, int norm, int *order) {
    for (int i = 0; i < N; i++) {
        float *q = r + (size_t)i * E;
        double mx = -INFINITY, sum = 0, kept = 0;
        for (int x = 0; x < E; x++)
            if ((!z || z[x] > 0) && q[x] > mx) mx = q[x];
        for (int x = 0; x < E; x++)
            if (!z || z[x] > 0) sum += (z ? z[x] : 1.0) * exp((double)q[x] - mx);
        for (int x = 0; x < E; x++) {
            /* a gated-off expert's p too (its gate's gradient reads it): bounded where its logit is far above the rest */
            double w = sum > 0 ? exp(fmin((double)q[x] - mx, 80.0)) / sum : 0;
            q[x] = z && !(z[x] > 0) ? 0.0f : (float)((z ? z[x] : 1.0) * w);
            if (p) p[(size_t)i * E + x] = (float)w;
            order[x] = x;
        }
        for (int j = 0; j < k; j++) { /* selection: order[j] = the best of order[j..E) */
            int b = j;
            for (int x = j + 1; x < E; x++)
                if (q[order[x]] > q[order[b]] || (q[order[x]] == q[order[b]] && order[x] < order[b])) b = x;
            int t = order[j];
            order[j] = order[b];
            order[b] = t;
            kept += q[order[j]];
        }
        for (int j = k; j < E; j++) q[order[j]] = 0;
        for (int j = 0; norm && kept > 0 && j < k; j++) q[order[j]] = (float)(q[order[j]] / kept);
    }
}

void ac_moe_route_gated_bwd(float *d, const float *p, const float *r, const float *z, float *dz, int N, int E,
                            int norm) {
    for (int i = 0; i < N; i++) {
        const float *pi = p + (size_t)i * E, *ri = r + (size_t)i * E;
        float *di = d + (size_t)i * E;
        double S = 0, rd = 0, pd = 0;
        for (int x = 0; x < E; x++)
            if (ri[x] != 0) S += (z ? z[x] : 1.0f) * pi[x], rd += (double)di[x] * ri[x];
        for (int x = 0; x < E; x++) /* d q over the routed experts (through the renormalisation) */
            di[x] = ri[x] == 0 ? 0.0f : norm ? (float)((di[x] - rd) / S) : di[x];
        for (int x = 0; x < E; x++) pd += (double)di[x] * (z ? z[x] : 1.0f) * pi[x];
        for (int x = 0; dz && x < E; x++) dz[x] += (float)(pi[x] * (di[x] - pd));
        for (int x = 0; x < E; x++) di[x] = (float)((z ? z[x] : 1.0f) * pi[x] * (di[x] - pd)); /* softmax */
    }
}

void ac_moe_route_sigmoid(float *r, const float *bias, const float *z, int N, int E, int k, int norm, float scale,
                          int *order) {
    for (int i = 0; i < N; i++) {
        float *q = r + (size_t)i * E;
        double kept = 0;
        for (int x = 0; x < E; x++) order[x] = x;
        for (int x = 0; z && x < E; x++) /* a gate at 0 is the expert removed: never chosen, as a masked one */
            if (!(z[x] > 0)) q[x] = -INFINITY;
        for (int j = 0; j < k; j++) { /* selection on s + bias: order[j] = the best of order[j..E) */
            int b = j;
            double cb = 0;
            for (int x = j; x < E; x++) {
                float lg = q[order[x]];
                double c = lg == -INFINITY ? -INFINITY : 1.0 / (1.0 + exp(-(double)lg)) + (bias ? bias[order[x]] : 0);
                if (x == j || c > cb || (c == cb && order[x] < order[b])) b = x, cb = c;
            }
            int t = order[j];
            order[j] = order[b];
            order[b] = t;
        }
        for (int j = k; j < E; j++) q[order[j]] = 0;
        for (int j = 0; j < k; j++) { /* the chosen experts' sigmoid (times the gate), without the bias */
            float lg = q[order[j]];
            double zx = z ? z[order[j]] : 1.0;
            q[order[j]] = lg == -INFINITY ? 0.0f : (float)(zx * (1.0 / (1.0 + exp(-(double)lg))));
            kept += q[order[j]];
        }
        for (int j = 0; j < k; j++) q[order[j]] = (float)((norm ? q[order[j]] / (kept + 1e-20) : q[order[j]]) * scale);
    }
}

void ac_moe_route_sigmoid_bwd(float *dr, const float *p, const float *r, const float *z, float *dz, int N, int E,
                              int norm, float scale) {
    for (int i = 0; i < N; i++) { /* p: the sigmoid s; r = scale q / (Q + 1e-20) or scale q, q = z s where chosen */
        const float *pi = p + (size_t)i * E, *ri = r + (size_t)i * E;
        float *d = dr + (size_t)i * E;
        double S = 0, rd = 0, sc = scale;
        for (int x = 0; x < E; x++)
            if (ri[x] != 0) S += (z ? z[x] : 1.0f) * pi[x], rd += (double)d[x] * ri[x];
        for (int x = 0; x < E; x++) {
            double dq = ri[x] == 0 ? 0 : norm ? (sc * d[x] - rd) / (S + 1e-20) : sc * d[x];
            if (dz) dz[x] += (float)(dq * pi[x]); /* d q / d z = s (only where chosen: the choice is discrete) */
            d[x] = (float)(dq * (z ? z[x] : 1.0f) * pi[x] * (1 - pi[x])); /* sigmoid */
        }
    }
}
