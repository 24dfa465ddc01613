/*
 * prune.h - pruning: the slicing of search/slice.h (ac_prune, ac_prune_bf16,
 * the masks) and the optional least-squares repair of the pruned FFN layers.
 */
#ifndef AC_PRUNE_H
#define AC_PRUNE_H

#include "search/importance.h"
#include "format/model.h"
#include "search/slice.h"
#include "search/stats.h"

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
