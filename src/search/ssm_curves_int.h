/* ssm_curves_int.h - a hybrid's Mamba-head loss curves from pruned copies
 * (the engine method's: a local CUDA target's calibration). Private to
 * src/search (importance.c). */
#ifndef AC_SSM_CURVES_INT_H
#define AC_SSM_CURVES_INT_H

#include "search/importance.h"

/* The calibration loss of the source model pruned to t, minus the base
 * loss, into *inc (importance.c's pruned passes); 0 or -1 with e set. */
typedef int (*ac_pruned_increase_fn)(void *ud, const ac_arch *t, double *inc, ac_err *e);

/* imp->ssm_sens (allocated here, zero rows for layers without Mamba heads):
 * point p of Mamba layer l is inc() of the model with the lowest-ranked
 * lround(r_p x heads per group) heads of every group of layer l removed
 * (imp->ssm_head_order, as ac_ssm_kept_heads keeps them; r_p = 0, .25, .5,
 * .75, 1; at 1 the layer removed), made monotone. The layer-streamed exact
 * method (importance.c's ssm_points) masks the same heads inside the gated
 * norm: the same model. 0, or -1 with e set (imp->ssm_sens then freed). */
int ac_ssm_engine_curves(const ac_arch *a, ac_pruned_increase_fn inc, void *ud, ac_importance *imp, ac_err *e);

#endif
