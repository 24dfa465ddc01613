/*
 * dnas_int.h - private to dnas.c and dnas_hybrid.c: the hybrid
 * (nemotron_h) side of the differentiable search (dnas.h, "Hybrid
 * Mamba-Transformer models") and the helpers both use.
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
/* The hybrid's starting log_alphas: start's units on (NULL: all), the rest off, ties broken by importance rank. */
void ac_dnas_hyb_init(ac_dnas_gates *g, const ac_arch *b, const ac_arch *start, const ac_importance *imp);
/* Mamba head slot j of group gr in layer l: its head (imp->ssm_head_order, identity without one). */
int ac_dnas_ssm_head(const ac_importance *imp, const ac_arch *b, int l, int gr, int j);

#endif
