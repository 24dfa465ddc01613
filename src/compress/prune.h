/*
 * prune.h - slice a model's weights to a smaller architecture, keeping the
 * most important KV groups (with their query heads), FFN channels and hidden
 * channels, and optional least-squares repair of the pruned FFN layers.
 *
 * Ownership: *dst is a new model the caller frees (ac_model_free).
 */
#ifndef AC_PRUNE_H
#define AC_PRUNE_H

#include "importance.h"
#include "model.h"
#include "stats.h"

int ac_prune(const ac_model *src, const ac_arch *target, const ac_importance *imp, ac_model *dst, ac_err *e);
/* The same student with BF16 matrices (wown; norms and biases fp32): each
 * matrix gathered in fp32 as ac_prune does, then rounded to nearest even,
 * so it is bit for bit ac_model_to_bf16 of ac_prune's student (and what
 * ac_model_save's BF16 export of that writes); never more than one layer's
 * matrices in fp32 beside it (the embedding and LM head go a row at a
 * time). A job's students
 * (pipeline/job.c): half the memory of fp32 ones, and the weights its
 * report measures are the ones it exports. */
int ac_prune_bf16(const ac_model *src, const ac_arch *target, const ac_importance *imp, ac_model *dst, ac_err *e);

/* What ac_prune(src, target, imp) keeps, as 0/1 masks over src's units, so
 * that the pruned model's outputs can be computed on src's own weights
 * (stream.h's masks are exactly removal): head_mask[n_heads] and
 * ffn_mask[ffn] of layer l (a target layer without attention or FFN: all 0).
 * Only for layers that keep every KV group (Minitron's head trimming, FFN
 * and hidden width, layer drop): returns 1, masks untouched, for a layer
 * that merges or removes KV groups or that ac_prune refuses; 0 when done.
 * The caller checks what ac_prune checks of the whole architecture (same
 * layers, head_dim and vocabulary, hidden width at most the source's).
 * ac_prune_hidden_mask: hid_mask[hidden] of the kept hidden channels. */
int ac_prune_layer_masks(const ac_arch *src, const ac_arch *target, const ac_importance *imp, int l, float *head_mask,
                         float *ffn_mask);
void ac_prune_hidden_mask(const ac_arch *src, const ac_arch *target, const ac_importance *imp, float *hid_mask);

/* Least-squares repair of down_proj after FFN pruning: re-fit the kept
 * columns so the layer's output matches the unpruned layer's on calibration
 * activations (ridge-regularised normal equations, solved by LAPACK's
 * Cholesky). Layers wider than AC_REPAIR_MAX_FFN are not repaired (their
 * Gram alone would take ffn^2 floats: 1 GiB at the limit).
 *
 * ac_repair_ffn_many repairs every dst[i], pruned from src by ac_prune with
 * imp[i], in one layer-streamed pass (stream.h): the residual stream of the
 * calibration windows (the first min(windows, n / ctx) windows of ctx tokens
 * of ids, as ac_perplexity takes them) walks src layer by layer, up to the
 * last layer some dst repairs; a layer's FFN Gram is gathered only when
 * some dst prunes that FFN, used by each such dst and freed before the
 * next layer: one ffn^2 Gram in memory, not one per layer. repaired[i]: the
 * layers of dst[i] repaired (a layer whose Gram is not positive definite is
 * left as pruned). ac_repair_ffn does it for one model and returns that
 * count, or -1. A BF16 dst (ac_prune_bf16) gets the fp32 solution rounded
 * to nearest even.
 *
 * ac_repair_stats gathers every layer's Gram at once through the engine's
 * hooks (one ac_perplexity pass) into *st (the caller frees it with
 * ac_stats_free; left zeroed, i.e. no Gram, when a layer is too wide): the
 * independent reference the tests check the streamed repair against. */
#define AC_REPAIR_MAX_FFN 16384
int ac_repair_ffn_many(const ac_model *src, ac_model *const *dst, const ac_importance *const *imp, int ndst,
                       const int *ids, size_t n, int ctx, int windows, int *repaired, ac_err *e);
int ac_repair_ffn(const ac_model *src, ac_model *dst, const ac_importance *imp, const int *ids, size_t n, int ctx,
                  int windows, ac_err *e);
int ac_repair_stats(const ac_model *src, const int *ids, size_t n, int ctx, int windows, ac_stats *st, ac_err *e);

#endif
