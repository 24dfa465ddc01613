/*
 * importance.h - activation-based importance (Minitron style) and measured
 * sensitivity curves, from calibration forward passes.
 *
 * Scores: KV groups (sum of the L2 norms of their query heads' outputs),
 * FFN channels (mean |silu(g)*u| times the L2 norm of the channel's
 * down_proj column), hidden channels (mean |normed activation|), layers
 * (1 - cos(input, output), "block influence").
 * Sensitivity: the calibration-loss increase when the lowest-scored 25, 50,
 * 75 and 100 % of a layer's attention (KV groups) or FFN channels are
 * removed, one layer at a time (a mixture-of-experts layer: the lowest-ranked
 * 25 .. 100 % of the experts that can go, all but top_k, by
 * moe_importance_int.h's order), when 12.5 / 25 / 50 / 75 % of the hidden
 * channels are, and when a layer's KV heads are merged (mean-pooled) down to
 * each divisor of their count with every query head kept. The search's quality term interpolates these curves.
 *
 * Minitron's own importance (NVIDIA Model-Optimizer, mcore_minitron): per
 * sequence the mean over tokens of |x| per channel, L2 over sequences, at
 * the o_proj input (heads: L2 over the head's channels, ranked within each
 * KV group), the down_proj input (FFN channels) and the outputs of every
 * layer's two RMSNorms (hidden channels: the per-norm L2s summed); layers by
 * 1 - cos(input, output) (layer_bi). The Minitron baseline prunes with these
 * (src/search/minitron.c, ac_minitron_importance_view).
 *
 * Ownership: ac_importance owns all its arrays (ac_importance_free).
 * A job keeps every field in its calibrate and search checkpoints
 * (src/pipeline/checkpoint.c): a new field is added there too.
 */
#ifndef AC_IMPORTANCE_H
#define AC_IMPORTANCE_H

#include <jansson.h>

#include "format/model.h"

#define AC_SENS_POINTS 5 /* removed fractions 0, .25, .5, .75, 1 */

typedef struct {
    int n_layers, hidden;
    int **kv_order; /* [l][n_kv]: KV groups, most important first */
    double **kv_score;
    int **ffn_order; /* [l][ffn] */
    double **ffn_score;
    int *hid_order; /* [hidden] */
    double *hid_score;
    double *layer_bi;                    /* [l] */
    double base_loss;                    /* calibration loss of the unpruned model (nats) */
    double (*attn_sens)[AC_SENS_POINTS]; /* [l][point] loss increase */
    double (*ffn_sens)[AC_SENS_POINTS];
    double hid_frac[4], hid_sens[4]; /* removed hidden fraction -> increase */
    /* KV merging (query heads kept, KV heads mean-pooled to a divisor):
     * per layer up to 8 points (removed KV fraction, loss increase). */
    int *merge_n;
    double (*merge_r)[8], (*merge_sens)[8];
    long tokens;
    /* Minitron (Model-Optimizer) importance; see above. head_order[l]: for
     * each KV group g, entries g*grp .. g*grp+grp-1 are its query heads, most
     * important first (ac_prune trims heads within groups by it). */
    int **head_order;
    double **head_score;   /* [l][head]: score of head h (unsorted) */
    int **mt_ffn_order;    /* [l][ffn], most important first */
    double **mt_ffn_score; /* sorted */
    int *mt_hid_order;     /* [hidden] */
    double *mt_hid_score;  /* sorted */
    int streamed;          /* curves measured by the STREAMED (gradient) method (below) */
    /* MoE layers (moe_importance_int.h; NULL when not measured, NULL rows for
     * dense layers): experts, most important first, and each expert's score */
    int **expert_order;
    double **expert_score;
    /* MoE layers: each expert's channels (Model-Optimizer's expert-width
     * score, moe_importance_int.h): echan_order[l][e*Fe + r] the channel (of
     * 0..Fe-1) of expert e at rank r, most important first; echan_score
     * [l][e*Fe + c] channel c's score (unsorted). NULL as expert_order. */
    int **echan_order;
    double **echan_score;
    int method;            /* the AC_CALIB_* method that measured the curves (never AUTO) */
    /* nemotron_h Mamba layers (search/ssm_prune.h; NULL rows elsewhere):
     * for each of the ssm_groups groups g, entries g*hpg .. g*hpg+hpg-1 are
     * its heads (hpg = heads / groups), most important first; each head's
     * score. A hybrid model's loss curves are measured by every CPU method
     * (below); the engine pass of a CUDA target leaves them zero
     * (docs/hybrid.md). */
    int **ssm_head_order;
    double **ssm_head_score;
    double **ssm_chan_score; /* [l][d_inner]: each x channel's score (the sqrt of its statistic), from which a
                              * narrower mamba_head_dim ranks the head dims and then the heads (ssm_prune.h) */
    /* nemotron_h MoE layers (NULL rows elsewhere): the shared expert's channels by Minitron's statistic at its
     * down_proj input (Model-Optimizer's moe_shared_expert_intermediate_size, scored as a dense MLP's width):
     * sh_order[l][r] the channel at rank r, most important first; sh_score[l][c] channel c's (unsorted) */
    int **sh_order;
    double **sh_score;
    /* nemotron_h Mamba layers, set only by the gate search's orders (dnas.h; NULL otherwise): the head dims best
     * first [l][ssm_head_dim], which a narrower mamba_head_dim keeps instead of ranking them by ssm_chan_score, the
     * heads then in ssm_head_order as is (ssm_prune.h) */
    int **ssm_dim_order;
    /* LatentMoE layers, set only by the gate search's orders (NULL otherwise): the latent channels best first
     * [l][moe_latent], which a narrower moe_latent_size keeps (NULL: the first) */
    int **lat_order;
    /* nemotron_h Mamba layers, the CPU methods (NULL otherwise; zero rows for other layers): [l][point] the loss
     * increase when the lowest-ranked SENS_R[p] of each group's heads are removed (the same count in every group,
     * as ac_ssm_kept_heads keeps them; 100 %: the layer removed) */
    double (*ssm_sens)[AC_SENS_POINTS];
} ac_importance;

typedef void (*ac_progress_fn)(void *ud, const char *what, double frac);

/* ids: calibration tokens; ctx/windows: the forward-pass protocol.
 * m is only read (it may be resident: ac_model_load_resident): the CPU
 * methods mask activations; the ENGINE method (the CUDA one) points one
 * matrix at a time at a masked private copy in the model's dtype during its
 * sensitivity passes (m's layer pointers change meanwhile; every one is put
 * back before return). m's weights are never written or copied whole.
 * Same as ac_importance_compute_mode with AC_CALIB_AUTO. */
int ac_importance_compute(ac_model *m, const int *ids, size_t n, int ctx, int windows, int cuda,
                          ac_progress_fn progress, void *ud, ac_importance *imp, ac_err *e);

/* Calibration methods (docs/search.md, "Calibration methods and their
 * cost"). Every CPU method is one layer-streamed pass (stream.h) over the
 * cached residual stream of the windows: activation statistics and unit
 * ranking per layer, then each curve point is layer l alone with the point's
 * units masked (or its KV heads merged) on its cached input over the first
 * S = min(windows, 8) windows; the difference delta of its output from the
 * unmodified one becomes a loss increase:
 * EXACT: delta carried through the rest of the network and the head (the
 *   exact increase; about L^2 / 2 layer runs per kind of point). With cuda
 *   EXACT means ENGINE.
 * STREAMED: backward passes over the S windows (true labels, and 2 sets
 *   of labels drawn from the model) give the gradients g, g~ at every
 *   layer's output; increase = sum_t g_t.delta_t + 1/2 mean sum_t
 *   (g~_t.delta_t)^2 (first order + sampled Fisher, per token): the
 *   full-model passes do not grow with layers x points. CPU only.
 * ANCHORED: the 50 % and 100 % points carried through the rest of the
 *   network, the others interpolated in |delta|^2 (the previous streamed
 *   method, kept for comparison).
 * The hidden curve (12.5 / 25 / 50 / 75 %) is exact in all three: one more
 * layer-streamed pass over the S windows with the 4 hidden masks.
 * ENGINE: the statistics in one engine pass, then one full-model loss pass
 *   per point, on the GPU with cuda (weight columns zeroed in a copy of the
 *   one matrix, in its dtype; KV merges and hidden widths on pruned fp32
 *   models, one at a time, gathered from m by ac_prune).
 * AUTO (ac_importance_compute): EXACT (ENGINE with cuda) when the exact
 *   method's passes cost at most AC_CALIB_EXACT_FLOPS (every model of the
 *   tests), else STREAMED.
 * A hybrid (nemotron_h) model: each CPU method (EXACT, STREAMED,
 *   ANCHORED; AUTO by the same rule, a hybrid's FLOPs counted per layer:
 *   an MoE layer's top_k experts, attention's scores, the Mamba scan) is
 *   the layer-streamed pass above with every curve (attention, KV merges,
 *   MLP channels, experts, hidden width) and a Mamba-head curve per Mamba
 *   layer (ssm_sens: ssm_mask, each group's lowest-ranked heads; each
 *   layer's heads ranked as soon as its statistics are complete); STREAMED
 *   runs the backward of every layer kind (16-bit weights converted to
 *   fp32 a layer at a time). With cuda (not STREAMED) the activation
 *   statistics, rankings and base loss alone, in ENGINE's one pass (no
 *   loss curves), the same values as the streamed pass's. */
enum { AC_CALIB_AUTO, AC_CALIB_EXACT, AC_CALIB_STREAMED, AC_CALIB_ANCHORED, AC_CALIB_ENGINE };
#define AC_CALIB_EXACT_FLOPS 2e12
/* The EXACT method's passes over nwin windows of ctx tokens, sw of them the
 * loss points' (min(windows, 8)), in FLOPs: a dense model's 2 per parameter
 * per token, a full pass per point; a hybrid's per layer (2 per parameter
 * a token reaches: an MoE layer's top_k routed experts, not all; 2 ctx Q
 * for attention's scores; about 6 per head dim and state entry for the
 * Mamba scan), each point from its layer through the rest and the head. */
double ac_calib_exact_flops(const ac_arch *a, long nwin, int ctx, int sw);
/* The method ac_importance_compute_mode runs for mode (AUTO resolved by
 * the rule above, EXACT with cuda the ENGINE method), a hybrid's as a dense
 * model's: every method gives it loss curves. */
int ac_calib_method(const ac_arch *a, int mode, long nwin, int ctx, int sw, int cuda);
int ac_importance_compute_mode(ac_model *m, const int *ids, size_t n, int ctx, int windows, int cuda, int mode,
                               ac_progress_fn progress, void *ud, ac_importance *imp, ac_err *e);
void ac_importance_free(ac_importance *imp);
/* Interpolated loss increase for removing fraction r of a component. */
double ac_sens_attn(const ac_importance *imp, int l, double r);
double ac_sens_ffn(const ac_importance *imp, int l, double r);
/* A mixture-of-experts layer l of base (its ffn_sens curve is over the
 * experts that can go, all but top_k, lowest-ranked first): the loss
 * increase with `kept` experts (real; top_k..n_experts). */
double ac_sens_experts(const ac_importance *imp, const ac_arch *base, int l, double kept);
double ac_sens_hidden(const ac_importance *imp, double r);
double ac_sens_merge(const ac_importance *imp, int l, double r);
/* Mamba layer l: the loss increase for removing fraction r of its heads (0 without a Mamba curve). */
double ac_sens_ssm(const ac_importance *imp, int l, double r);
json_t *ac_importance_to_json(const ac_importance *imp);

#endif
