/*
 * dnas_int.h - private to dnas.c, dnas_hybrid.c and surrogate_hybrid.c:
 * the hybrid (nemotron_h) side of the differentiable search (dnas.h,
 * "Hybrid Mamba-Transformer models"), the per-type greedy the hybrid
 * surrogate search shares with it, and the helpers they use.
 */
#ifndef AC_DNAS_INT_H
#define AC_DNAS_INT_H

#include "search/dnas.h"

/* Size of group j of n units in groups of m (the last one is the remainder). */
int ac_dnas_gsize(int n, int m, int j);
/* v rounded to a multiple of mult in [0, max] (max itself when max <= mult and v >= max / 2). */
int ac_dnas_round_grid(double v, int mult, int max);
/* The cost model's figure m for the continuous architecture c. */
double ac_dnas_metric_at(const ac_search_problem *p, const ac_carch *c, ac_metric m);

/* Expected metric of a hybrid's gates and d/d log_alpha into grad[np] (may be NULL); NAN out of memory. */
double ac_dnas_hyb_expected_metric(const ac_dnas_gates *g, const ac_search_problem *p, ac_metric m, double *grad);
/* The expected architecture (per layer: type, keep probability, expected widths given kept). */
json_t *ac_dnas_hyb_expected_json(const ac_dnas_gates *g, const ac_arch *b);
/* r->arch (a copy of p->base) discretised per layer type and repaired; r->cost, r->feasible set. */
void ac_dnas_hyb_discretise(const ac_dnas_gates *g, const ac_search_problem *p, ac_search_result *r);
/* The surrogate's greedy on a hybrid (surrogate_hybrid.c): from the base (every unit kept) the discretisation's
 * per-type moves (one width per layer type, the model-wide widths, a type's weakest layer removed: the lowest depth
 * log_alpha of g), each priced by its change of ac_search_pred_loss (the loss curves) instead of gate mass: shrink
 * by least loss per violation removed until feasible, then grow by most loss recovered while feasible. r->arch (a
 * copy of p->base), r->cost, r->feasible set. */
void ac_dnas_hyb_greedy_curves(const ac_dnas_gates *g, const ac_search_problem *p, ac_search_result *r);
/* The hybrid's starting log_alphas: start's units on (NULL: all), the rest off, ties broken by importance rank. */
void ac_dnas_hyb_init(ac_dnas_gates *g, const ac_arch *b, const ac_arch *start, const ac_importance *imp);
/* Mamba head slot j of group gr in layer l: its head (imp->ssm_head_order, identity without one). */
int ac_dnas_ssm_head(const ac_importance *imp, const ac_arch *b, int l, int gr, int j);

#endif
