/*
 * train.h - the model-level training pass on the CPU (fp32, cblas): a
 * forward that keeps the activations the backward needs, the losses
 * (next-token cross-entropy, temperature-scaled distillation KL) and the
 * backward into gradients of every weight and of the gates, over the same
 * architectures as the engine (per-layer heads, KV heads, FFN width,
 * removed sub-blocks; tied or separate LM head; q/k/v biases; RoPE with
 * llama3 scaling; sliding window).
 *
 * Gates are multiplicative mask parameters (all 1 after init, i.e. the
 * plain model), which the differentiable search relaxes:
 *   head[l][h]  multiplies query head h's attention output before o_proj
 *               (a KV group's gradient is the sum over its query heads);
 *   ffn[l][c]   multiplies FFN channel c (silu(gate) * up) before down_proj;
 *   hidden[c]   multiplies channel c of every RMSNorm output (input,
 *               post-attention and final norm), the activations hidden-
 *               channel importance is measured on;
 *   attn[l], mlp[l]  multiply the attention / FFN sub-block output before
 *               it is added to the residual stream (mlp[l]: the MoE sub-block
 *               of a mixture-of-experts layer; on nemotron_h also a Mamba or
 *               MoE layer's mixer: 0 is the layer removed);
 *   expert[l][e] multiplies expert e's softmax numerator in the router
 *               (block_grad.h: 0 is the expert removed, with the routing
 *               renormalised over the others as in the pruned model); with
 *               nemotron_h's sigmoid router, the chosen expert's sigmoid
 *               weight, a gate of 0 never chosen (ac_moe_route_sigmoid: the
 *               pruned model's routing too);
 *   echan[l][e*Fe + c]  multiplies channel c of expert e (silu(gate) * up)
 *               before its down projection;
 *   ssm[l][h]   Mamba head h of layer l (nemotron_h), inside the gated
 *               norm as ssm_dim below (a channel's weight is its head's
 *               gate times its dim's): a gate of 0 is the head removed;
 *   ssm_dim[l][p] head dim p of every Mamba head of layer l, inside the
 *               gated norm: the channel weighs its gate in its group's
 *               statistic (sum m v^2 / sum m) and its output is multiplied
 *               by it, so gates in {0,1} are exactly the model with a
 *               narrower mamba_head_dim keeping those dims (ssm_cpu_int.h);
 *   shared[l][c] multiplies shared-expert channel c (relu(up)^2) before its
 *               down projection (nemotron_h MoE layers);
 *   latent[l][c] multiplies LatentMoE latent channel c twice: of the
 *               experts' input (the latent down projection's output) and of
 *               their weighted sum (the latent up projection's input), so a
 *               gate of 0 is the channel removed from both.
 *
 * Memory (llm.c's rule): ac_trainer_init makes one allocation for every
 * activation, scratch buffer and gate (ac_trainer_bytes says how much, see
 * docs/architecture.md, "Training engine and distillation"); the gradients
 * are an ac_model of the same shapes.
 * Forward, loss and backward never allocate. Backward ACCUMULATES into the
 * gradients (micro-batches add up); ac_train_zero_grad clears them.
 *
 * Frozen weights (ac_trainer_init_frozen: only the gates learn, e.g. the
 * DNAS gate search): no weight gradient is allocated or computed, and the
 * model may be resident in BF16/F16 (model.h): forward and backward convert
 * one layer's matrices at a time (attention, MLP, a nemotron_h Mamba
 * layer's in and out projections, an MoE layer's router, shared expert and
 * latent projections) into a reusable fp32 scratch (the largest layer's
 * size), the routed experts one expert at a time into a second one (one
 * expert's size: block_grad.h's escr) as its rows reach it, the LM head
 * tile by tile into the first, embedding rows as they are gathered.
 * BF16/F16 to fp32 is exact and the GEMMs are the same calls, so losses
 * and gate gradients equal those on an fp32 copy of the model bit for bit. The LM head's GEMMs run over tiles of
 * ac_trainer_lm_rows rows whatever the dtype (one tile on small models).
 * Attention probabilities are recomputed in backward, not kept (no B*heads*T^2 buffer).
 */
#ifndef AC_TRAIN_H
#define AC_TRAIN_H

#include <stddef.h>

#include "core/err.h"
#include "format/model.h"

typedef struct {
    float **head;  /* [l][n_heads] (NULL when the layer has no attention) */
    float **ffn;   /* [l][ffn]     (NULL when the layer has no FFN) */
    float *hidden; /* [H] */
    float *attn;   /* [l] */
    float *mlp;    /* [l] */
    float **expert; /* [l][n_experts] (NULL without experts; may be NULL as a whole: acc_trainer_gates then leaves them) */
    float **echan;  /* [l][n_experts * expert_ffn]: expert e's channels at e * expert_ffn */
    float **ssm;   /* [l][ssm_heads]: nemotron_h Mamba heads (NULL when the layer has none) */
    float **ssm_dim; /* [l][ssm_head_dim]: nemotron_h Mamba head dims (NULL rows without a Mamba mixer; may be NULL
                      * as a whole) */
    float **shared;  /* [l][shared_ffn]: a nemotron_h MoE layer's shared-expert channels (NULL rows elsewhere; may be
                      * NULL as a whole) */
    float **latent;  /* [l][moe_latent]: a LatentMoE layer's latent channels (NULL rows elsewhere; may be NULL as a
                      * whole) */
} ac_gates;

typedef struct {
    ac_model *m; /* borrowed parameters (fp32 master weights), updated in place by an optimizer */
    ac_model g;  /* gradients; g.lm_head == g.embed when embeddings are tied */
    ac_gates gate, dgate;
    int max_B, max_T; /* capacity */
    int B, T;         /* shape of the last forward */
    float *mem;       /* the one allocation (activations, scratch, gates) */
    int *tok, *pos;   /* [max_B*max_T] tokens of the last forward, positions */
    int *moe_rows;    /* MoE models: max(max_B*max_T, experts) ints for the block executor */
    /* per layer (N = B*T rows): what the block's backward needs, kept by
     * its forward (block_grad.h: for the Llama block the normalized inputs
     * and 1/rms of both norms, q and k after RoPE, v, the attention output
     * before gates, the FFN gate and up projections) */
    float **tape;
    float *bscr;              /* the block executor's scratch (ac_block_grad_scratch_floats) */
    float *xhf, *rf;          /* final norm [N,H], [N] */
    float *logits, *dlogits;  /* [N,V] */
    float *x, *dx, *xn, *dxn; /* [N,H] residual stream and scratch */
    float *cos_t, *sin_t;     /* [max_T][head_dim/2] */
    int frozen;               /* ac_trainer_init_frozen: no weight gradients unless the caller points g's fields */
    /* Borrowed per-layer fp32 weights read instead of the model's: the
     * non-NULL matrix and bias fields of ovr[l] (NULL: none), e.g. the deci
     * KV-merge mixture of the gate search, so the model is never written. */
    ac_layer_w *ovr;
    float *wscr;   /* 16-bit models: one layer's matrices (or an LM-head tile) in fp32 */
    float *escr;   /* 16-bit MoE models: one expert's matrices in fp32 (ac_block_grad_expert_floats) */
    ac_layer_w wl; /* the fp32 view of layer wl_at (-1: none; its experts stay the model's: the executor converts) */
    int wl_at, lm_rows;
} ac_trainer;

/* Bytes of ac_trainer_init's buffers plus the gradient model, for batch B x
 * context T on arch a (the parameters themselves are not counted). */
size_t ac_trainer_bytes(const ac_arch *a, int B, int T);
int ac_trainer_init(ac_trainer *t, ac_model *m, int max_B, int max_T, ac_err *e);
/* Frozen weights: m (fp32 or resident 16-bit) is only read. t->g has m's
 * arch (a shallow copy) and its layer array with every field NULL (and no
 * embed, lm_head, norms): no weight
 * gradient is computed unless the caller points a field at its own buffer
 * (borrowed, e.g. the K/V gradients the KV-merge choices need; zeroed by
 * ac_train_zero_grad). Bytes: ac_trainer_bytes_frozen. */
int ac_trainer_init_frozen(ac_trainer *t, ac_model *m, int max_B, int max_T, ac_err *e);
size_t ac_trainer_bytes_frozen(const ac_arch *a, int B, int T);
/* Rows of an LM-head tile (at most the vocabulary). */
int ac_trainer_lm_rows(const ac_arch *a);
void ac_trainer_free(ac_trainer *t);
void ac_train_zero_grad(ac_trainer *t);

/* Forward tokens[B][T] from position 0; logits land in t->logits [B*T][V]. */
int ac_train_forward(ac_trainer *t, const int *tokens, int B, int T, ac_err *e);
/* Loss on the last forward's logits and its gradient into t->dlogits (see
 * ac_loss_backward): target[B*T] (< 0 = not scored; may be NULL), teacher
 * logits [B*T][V] or NULL, temperature tau, kd_weight in [0,1], scale (e.g.
 * 1/accumulation steps). *ce, *kd (may be NULL) get the parts. */
double ac_train_loss(ac_trainer *t, const int *target, const float *teacher, float tau, float kd_weight, float scale,
                     double *ce, double *kd);
/* target[r] = tokens[r+1] within each sequence, -1 at each sequence's end. */
void ac_next_token_targets(int *target, const int *tokens, int B, int T);
/* Backward from t->dlogits through the last forward; accumulates into t->g
 * (its non-NULL fields) and t->dgate. */
void ac_train_backward(ac_trainer *t);

/* Gradient of one gate per KV group of layer l (shared by the group's
 * query heads, as the search prunes them together): out[g] = sum of
 * dgate.head[l][h] over h / (n_heads / n_kv_heads) == g. */
void ac_train_kv_group_grad(const ac_trainer *t, int l, float *out);

#endif
