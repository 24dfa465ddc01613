/*
 * block.h - a block type written once, as a recipe: an ordered list of ops
 * over named activation slots and the layer's named weights. Every path that
 * runs a layer (the CPU engine in fp32 and BF16, streamed calibration, ...)
 * walks the recipe and calls its own implementation of each op
 * (block_cpu.h for the CPU); none of them spells the layer's structure out
 * again. docs/blocks.md says what adding a block type costs.
 *
 * Shapes: N rows (B sequences of n tokens, sequence-major); the widths of
 * layer l are named by ac_dim: H hidden, Q = n_heads*head_dim, KV =
 * n_kv_heads*head_dim, F ffn, E routed experts, FE an expert's width. A
 * slot holds N rows of its width.
 *
 * A recipe is a list of sub-blocks (attention, FFN); a sub-block runs only
 * when its `present` width is non-zero in the layer (heterogeneous pruning
 * removes whole sub-blocks). Ops marked as structure points (AC_OP_MASK,
 * AC_OP_KV_MERGE, AC_OP_MASK_HIDDEN) are where pruning acts: a path that
 * simulates a pruned layer (masks) or relaxes it (gates) implements them,
 * a plain forward skips them.
 *
 * Recipes are static const data (no ownership).
 */
#ifndef AC_BLOCK_H
#define AC_BLOCK_H

#include <stddef.h>

#include "format/model.h"

#ifdef __cplusplus
extern "C" { /* the CUDA plugin compiles block.c as C++ and reads it through ac_cuda.h's C interface too */
#endif

/* Activation slots. */
typedef enum {
    AC_T_X,   /* [N][H] the residual stream (the block's input and output) */
    AC_T_XN,  /* [N][H] a normed copy of x */
    AC_T_Q,   /* [N][Q] */
    AC_T_K,   /* [N][KV] */
    AC_T_V,   /* [N][KV] */
    AC_T_ATT, /* [N][Q] attention output, per query head */
    AC_T_G,   /* [N][F] gate projection, then silu(gate) * up */
    AC_T_U,   /* [N][F] up projection */
    AC_T_R,   /* [N][E] routing weights: each row's top-k experts' weights, 0 elsewhere */
    AC_T_XE,  /* [N][H] rows routed to one expert, gathered (then that expert's output rows) */
    AC_T_EG,  /* [N][FE] an expert's gate projection, then silu(gate) * up */
    AC_T_EU,  /* [N][FE] an expert's up projection */
    AC_T_ZX,  /* [N][SI] Mamba-2 in_proj output: z [SSM], xBC [SC], dt [ssm heads] */
    AC_T_XBC, /* [N][SC] silu(causal depthwise conv of xBC): x [SSM], B [G*Ns], C [G*Ns] */
    AC_T_Y,   /* [N][SSM] the SSM scan's output */
    AC_T_YN,  /* [N][SSM] the gated RMSNorm's output */
    AC_T_SU,  /* [N][FS] the shared expert's up projection (nemotron_h MoE) */
    AC_T_SG,  /* [N][FS] relu(up)^2 of the shared expert */
    AC_T_XL,  /* [N][LT] LatentMoE: the normed input projected to the latent width */
    AC_T_YL,  /* [N][LT] LatentMoE: the routed experts' weighted sum, in the latent width */
    AC_T_COUNT
} ac_slot;

/* Widths of a layer. */
/* SSM: a Mamba-2 mixer's inner width (heads * head dim), SC its conv
 * channels (SSM + 2 * groups * state), SI its in_proj rows (SSM + SC +
 * heads); 0 in a layer without one. */
typedef enum {
    AC_DIM_H,
    AC_DIM_Q,
    AC_DIM_KV,
    AC_DIM_F,
    AC_DIM_E,
    AC_DIM_FE,
    AC_DIM_SSM,
    AC_DIM_SC,
    AC_DIM_SI,
    AC_DIM_FS, /* the shared expert's width (nemotron_h MoE layers); 0 without one */
    AC_DIM_LT, /* LatentMoE: the routed experts' latent width; 0 without */
    AC_DIM_COUNT
} ac_dim;

/* Norm weights of a layer. */
typedef enum { AC_NORM_IN, AC_NORM_POST, AC_NORM_Q, AC_NORM_K, AC_NORM_SSM } ac_normw;

typedef enum {
    AC_OP_RMSNORM,     /* out = rmsnorm(in) * norm weight `w` (ac_normw); in, out: [N][H] */
    AC_OP_LINEAR,      /* out[N][dout] = in[N][din] W^T (+ b) with W = matrix `w` (ac_wmat) and its
                        * bias if the layer has one; acc: out += (the residual add of a sub-block) */
    AC_OP_ROPE,        /* rotate-half RoPE on out in place, over `heads` (ac_dim Q or KV) heads */
    AC_OP_KV_MERGE,    /* structure point: K and V heads mean-pooled in groups (KV-head merging) */
    AC_OP_ATTENTION,   /* out[N][Q] = causal GQA attention of in (q) over in2 (k) and in3 (v) */
    AC_OP_SWIGLU,      /* out = silu(out) * in  (out: gate, in: up), [N][F] */
    AC_OP_MASK,        /* structure point: the units of out multiplied by masks or gates; unit width
                        * head_dim when dout is AC_DIM_Q (query heads), else 1 (FFN channels) */
    AC_OP_MASK_HIDDEN, /* structure point: hidden channels of out ([N][H]) masked after a residual add */
    AC_OP_HEAD_NORM,   /* out = rmsnorm of each head_dim-wide head of in, times norm weight `w` ([hd], shared by
                        * the heads), over `heads` (ac_dim Q or KV) heads; Qwen3's q_norm / k_norm */
    AC_OP_ROUTE,       /* out [N][E] = the routing weights of in [N][H]: p = softmax(in Wr^T) over the E experts,
                        * the top_k largest kept (equal values: the lower expert index first), divided by their
                        * sum when norm_topk, every other weight 0 (Qwen3-MoE, Mixtral); with the arch's
                        * router_sigmoid (nemotron_h) the sigmoid router of ac_moe_route_sigmoid instead */
    AC_OP_EXPERTS,     /* out [N][din] += sum over experts e of R[:,e] * down_e(silu(gate_e(in)) * up_e(in)),
                        * each expert run on the rows routed to it (in2: the routing slot R); in a hybrid
                        * (nemotron_h) model each expert is down_e(relu(up_e(in))^2), no gate; din H, or LT
                        * in a LatentMoE layer; without acc out is zeroed first */
    AC_OP_RELU2,       /* out = relu(in)^2  ([N][dout]: G from U, F wide, in nemotron_h's MLP; SG from SU, FS
                        * wide, in its shared expert) */
    AC_OP_SSM_CONV,    /* out [N][SC] = silu(conv_b + sum_k conv_w[:,k] * xbc[t-K+1+k]) per sequence, xbc the
                        * columns [SSM, SSM+SC) of in (ZX), zero (or the cached state) before the first row */
    AC_OP_SSM_SCAN,    /* out [N][SSM] = the Mamba-2 selective scan of in (XBC: x, B, C) with dt the last heads
                        * columns of in2 (ZX): per head h (group g), dt = softplus(dt + dt_bias[h]),
                        * S = exp(-dt exp(A_log[h])) S + dt x_h B_g^T, y_h = S C_g + D[h] x_h */
    AC_OP_GATED_NORM,  /* out [N][SSM] = rmsnorm per group of (in * silu(z)) * ssm_norm, z the first SSM
                        * columns of in2 (ZX); groups of SSM / ssm_groups channels */
} ac_op_kind;

/* Observation points after an op (engine hooks, engine.h). */
typedef enum {
    AC_HOOK_NONE,
    AC_HOOK_NORMED,
    AC_HOOK_HEAD_OUT,
    AC_HOOK_FFN_ACT,
    AC_HOOK_SSM_IN,
    AC_HOOK_SHARED_ACT /* nemotron_h: the shared expert's relu(up)^2, its down projection's input */
} ac_hook_point;

typedef struct {
    unsigned char kind;              /* ac_op_kind */
    unsigned char out, in, in2, in3; /* ac_slot */
    signed char w;                   /* ac_wmat (LINEAR) or ac_normw (RMSNORM); -1 none */
    unsigned char din, dout;         /* ac_dim of in and out (LINEAR, MASK) */
    unsigned char heads;             /* ac_dim (ROPE) */
    unsigned char acc;               /* LINEAR: add into out */
    unsigned char hook;              /* ac_hook_point */
} ac_op;

/* Ops of one sub-block, at most (the executors' per-op records). */
#define AC_BLOCK_MAX_OPS 32
/* Sub-blocks of one recipe, at most. */
#define AC_BLOCK_MAX_SUB 8

typedef struct {
    const char *name;      /* "attention", "ffn" */
    unsigned char present; /* ac_dim that must be > 0 for the sub-block to run */
    int n_ops;
    const ac_op *ops;
} ac_subblock;

typedef struct {
    const char *name; /* "llama" */
    int n_sub;
    const ac_subblock *sub;
} ac_block_recipe;

/* The recipe of layer l of a: the Llama/Qwen2/Mistral decoder layer, or
 * Qwen3's (the same with q and k normed per head before RoPE), each with
 * a dense SwiGLU FFN or a mixture of experts (Mixtral, Qwen3-MoE); or
 * nemotron_h's hybrid layer (one of attention without RoPE, a squared-ReLU
 * MLP, a Mamba-2 mixer and a mixture of squared-ReLU experts with a shared
 * expert, by which width is non-zero). */
const ac_block_recipe *ac_block_recipe_of(const ac_arch *a, int l);
/* The width (ac_dim) of a slot's rows. */
int ac_block_slot_dim(int slot);
/* The width `d` of layer l. */
int ac_block_dim(const ac_arch *a, int l, ac_dim d);
/* Whether sub-block s of recipe r runs in layer l. */
int ac_block_sub_present(const ac_arch *a, int l, const ac_subblock *s);
/* The widest value of `d` over the layers (at least 1): for sizing slots. */
int ac_block_dim_max(const ac_arch *a, ac_dim d);
/* The backward executors' tape (block_grad.h, the CUDA trainer): whether
 * the forward keeps an op's output per layer (the costly ops: LINEAR other
 * than a residual add, ATTENTION; and HEAD_NORM, in place on a taped LINEAR
 * output that its backward reads) or the backward recomputes it (RMSNORM,
 * SWIGLU, MASK); the floats an op adds to layer l's tape for N rows
 * (RMSNORM: xhat and 1/rms; HEAD_NORM: its output, its input being the
 * LINEAR's taped one; ROUTE: the softmax over the experts and the routing
 * weights; ATTENTION: its output and attn_extra floats
 * per row and query head, e.g. a log-sum-exp) and the layer's total; the
 * scratch an executor needs for N rows: the recomputed outputs of the
 * largest sub-block, then one gradient buffer per slot. */
int ac_block_op_taped(const ac_op *op);
int ac_block_op_recomputed(const ac_op *op);
size_t ac_block_op_tape(const ac_arch *a, int l, const ac_op *op, size_t N, int attn_extra);
size_t ac_block_tape_floats(const ac_arch *a, int l, size_t N, int attn_extra);
size_t ac_block_scratch_floats(const ac_arch *a, size_t N);
/* Channels per unit of an AC_OP_MASK on width d: a query head's head_dim
 * (Q), a Mamba head's ssm_head_dim (SSM), else 1 (FFN channels). */
int ac_block_mask_unit(const ac_arch *a, ac_dim d);
/* The part of that scratch (its end) an EXPERTS op works in: three [N][H]
 * and five [N][FE] buffers (gathered rows, expert outputs and their
 * gradients); 0 without MoE layers. */
size_t ac_block_moe_work_floats(const ac_arch *a, size_t N);
/* The scan's backward work area (block_grad.c): the SSM states of one
 * sequence and head at every step, then one state's gradient and the
 * step sizes; 0 without Mamba layers. It follows the MoE work area at the
 * end of ac_block_scratch_floats. */
size_t ac_block_ssm_work_floats(const ac_arch *a, size_t N);
/* The ROUTE op's rule, for every backend (the CUDA engine runs it on the
 * host): mixture-of-experts routing, in place: each row of r[N][E] holds router
 * logits and becomes softmax over the E experts (in double), the top k kept
 * (the larger first; on equal values the lower expert index), divided by
 * their sum when norm, every other entry 0. p (NULL: not wanted) receives
 * the softmax of every expert. order: E ints of scratch. */
void ac_moe_route(float *r, float *p, int N, int E, int k, int norm, int *order);
/* The same with expert gates z[E] (NULL: all 1; the differentiable
 * search's relaxation of removing experts, block_grad.h): each expert's
 * softmax numerator is multiplied by z[e], so z in {0,1} is exactly the
 * routing of the model without the experts at 0 (a softmax and top-k over
 * the kept ones, as ac_prune's router rows and the engine's -inf masks
 * give); a row whose gates are all 0 routes to nothing (all 0). p then
 * receives exp(logit - max) / sum_e z[e] exp(logit_e - max), so the
 * expert's probability is z[e] p[e] (with z NULL: the softmax). */
void ac_moe_route_gated(float *r, float *p, const float *z, int N, int E, int k, int norm, int *order);
/* The backward of ac_moe_route_gated, for every backend (the CUDA trainer
 * runs it on the host): d[N][E] holds the gradient at the routing weights r
 * and becomes the gradient at the router logits; p, r, z: the forward's
 * softmax, weights and expert gates (z NULL: all 1); dz[E] (NULL: not
 * wanted) accumulates the expert gates' gradient. The selection is
 * piecewise constant (no gradient); norm as in the forward. */
void ac_moe_route_gated_bwd(float *d, const float *p, const float *r, const float *z, float *dz, int N, int E,
                            int norm);
/* The sigmoid router of nemotron_h's MoE layers (Hugging Face
 * NemotronHMoE.route_tokens_to_experts with one expert group), in place:
 * each row of r[N][E] holds router logits; s = sigmoid(logit) in double;
 * the k experts with the largest s + bias[e] are chosen (equal values: the
 * lower expert index; a logit of -inf, a masked expert, is never chosen
 * while k others are left); the chosen weights are s (without the bias),
 * divided by (their sum + 1e-20) when norm, then multiplied by scale;
 * every other entry 0. bias NULL: none. order: E ints of scratch.
 * z[E] (NULL: all 1): expert gates of the differentiable search
 * (block_grad.h): an expert whose gate is 0 is never chosen (as a masked
 * one) and a chosen expert's weight is z[e] s, the sum divided by running
 * over those products; so gates in {0,1} are exactly the routing of the
 * model without the experts at 0 (ac_prune keeps the kept experts' router
 * rows and correction bias: the same choice among them, the same sum). */
void ac_moe_route_sigmoid(float *r, const float *bias, const float *z, int N, int E, int k, int norm, float scale,
                          int *order);
/* Its backward, for every backend (the CUDA trainer runs it on the host):
 * dr[N][E] holds the gradient at the routing weights r and becomes the
 * gradient at the router logits; p: the sigmoid of every logit (the
 * forward's, before the choice); r, z, norm, scale: the forward's (z NULL:
 * all 1); dz[E] (NULL: not wanted) accumulates the expert gates' gradient.
 * The choice is piecewise constant (no gradient through the bias). */
void ac_moe_route_sigmoid_bwd(float *dr, const float *p, const float *r, const float *z, float *dz, int N, int E,
                              int norm, float scale);

/* Layer weights by name: matrix `w` (ac_wmat), its bias (NULL when none),
 * norm weight `w` (ac_normw). */
const void *ac_block_matrix(const ac_layer_w *lw, int w);
const float *ac_block_bias(const ac_layer_w *lw, int w);
const float *ac_block_norm(const ac_layer_w *lw, int w);

#ifdef __cplusplus
}
#endif

#endif
