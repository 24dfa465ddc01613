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

/* Least-squares repair of down_proj after FFN pruning: re-fit the kept
 * columns so the layer's output matches the unpruned layer's on calibration
 * activations (ridge-regularised normal equations, solved by LAPACK's
 * Cholesky). Layers wider than AC_REPAIR_MAX_FFN are not repaired (their
 * Gram would take ffn^2 floats per layer).
 *
 * ac_repair_stats runs the one calibration pass over src that gathers each
 * layer's FFN activation Gram into *st (the caller frees it with
 * ac_stats_free; left zeroed, i.e. no Gram, when a layer is too wide); every
 * pruned model of src is then repaired from it by ac_repair_ffn_from, which
 * returns the number of layers repaired or -1. ac_repair_ffn does both for
 * one model. ac_repair_needed: does t prune any FFN of src? */
#define AC_REPAIR_MAX_FFN 8192
int ac_repair_stats(const ac_model *src, const int *ids, size_t n, int ctx, int windows, ac_stats *st, ac_err *e);
int ac_repair_ffn_from(const ac_model *src, ac_model *dst, const ac_importance *imp, const ac_stats *st, ac_err *e);
int ac_repair_needed(const ac_model *src, const ac_arch *t);
int ac_repair_ffn(const ac_model *src, ac_model *dst, const ac_importance *imp, const int *ids, size_t n, int ctx,
                  int windows, ac_err *e);

#endif
