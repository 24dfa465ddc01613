/*
 * model_int.h - the weight matrices of an ac_model, one by one, for the
 * format folder's code that moves or converts them whole (model.c's
 * ac_model_make_bf16, park.c). Private to src/format.
 */
#ifndef AC_MODEL_INT_H
#define AC_MODEL_INT_H

#include <stddef.h>

#include "format/model.h"

/* fn(ud, slot, n) for every matrix of m that is present, in one fixed order:
 * embed, lm_head (left out when tied to embed: after embed's call lm_head
 * is set to embed again, so fn may replace *slot), then per layer q, k, v,
 * o, gate, up, down, the router, each expert's gate, up and down, the
 * Mamba in and out projections, the shared expert's up and down and
 * LatentMoE's projections. n: the matrix's element count (its dtype is
 * ac_model_wdt(m)'s). Norms, biases, the Mamba conv and the per-head
 * vectors (always fp32) are not matrices here. Stops at fn's first
 * nonzero return and returns it; 0 when every call returned 0. */
typedef int (*ac_matrix_fn)(void *ud, float **slot, size_t n);
int ac_model_each_matrix(ac_model *m, ac_matrix_fn fn, void *ud);

#endif
