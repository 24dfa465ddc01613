/*
 * search.h - choose a pruned architecture that meets hardware constraints
 * with the least predicted quality loss.
 *
 * AutoCompress: a continuous relaxation (kept fraction per layer of KV
 * groups and of FFN width, and of the hidden width) optimised by projected
 * Adam on quality loss + Lagrange multipliers x constraint violations, with
 * the cost model's gradient; multipliers by dual ascent. The result is
 * rounded to the export target's granularity and then made exactly feasible
 * by a greedy repair on the discrete architecture (cheapest quality per unit
 * of violation first), then greedily refilled while it stays feasible.
 * Minitron baseline: one uniform width fraction for every layer (and the
 * hidden size), the largest that meets the same constraints.
 * Deterministic for a given seed.
 */
#ifndef AC_SEARCH_H
#define AC_SEARCH_H

#include <jansson.h>

#include "costmodel.h"
#include "importance.h"

typedef struct {
    double max_ttft_ms, max_tpot_ms, min_tok_s, max_mem_gib, max_params; /* <= 0: none */
} ac_constraints;

typedef enum { AC_EXPORT_DECI, AC_EXPORT_LLAMA, AC_EXPORT_GGUF } ac_export_target;

typedef struct {
    int steps;
    unsigned seed;
    double lr;
    int ffn_multiple, hidden_multiple;
    int prune_hidden;
    ac_export_target target;
} ac_search_opts;

typedef struct {
    const ac_cost_table *table;
    const ac_workload *workload;
    const ac_engine_profile *profile;
    const ac_importance *imp;
    const ac_arch *base;
    ac_constraints limits;
    ac_search_opts opts;
    void (*emit)(void *ud, json_t *progress); /* progress events (borrowed) */
    void *ud;
} ac_search_problem;

typedef struct {
    ac_arch arch;          /* owned */
    ac_cost cost;
    double pred_loss;      /* predicted calibration-loss increase */
    int feasible;
    int steps_run;
} ac_search_result;

int ac_search_autocompress(const ac_search_problem *p, ac_search_result *r, ac_err *e);
int ac_search_minitron(const ac_search_problem *p, ac_search_result *r, ac_err *e);
void ac_search_result_free(ac_search_result *r);
/* Worst relative violation of the limits by c (<= 0 when feasible). */
double ac_constraints_violation(const ac_constraints *l, const ac_cost *c);
json_t *ac_constraints_report(const ac_constraints *l, const ac_cost *c);
/* Predicted loss increase of a discrete architecture. */
double ac_search_pred_loss(const ac_search_problem *p, const ac_arch *a);

#endif
