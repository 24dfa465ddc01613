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

int ac_prune(const ac_model *src, const ac_arch *target, const ac_importance *imp, ac_model *dst, ac_err *e);

/* Least-squares repair of down_proj after FFN pruning: re-fit the kept
 * columns so the layer's output matches the unpruned layer's on calibration
 * activations (ridge-regularised normal equations). Returns the number of
 * layers repaired. */
int ac_repair_ffn(const ac_model *src, ac_model *dst, const ac_importance *imp, const int *ids, size_t n, int ctx,
                  int windows, ac_err *e);

#endif
