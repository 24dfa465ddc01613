/*
 * minitron_int.h - the Minitron arm's hybrid grid (minitron_hybrid.c),
 * which ac_search_minitron runs for a nemotron_h base.
 */
#ifndef AC_MINITRON_INT_H
#define AC_MINITRON_INT_H

#include "search/search.h"

/* Grids above this many points are thinned (minitron_hybrid.c, thin). */
#define AC_MINITRON_HYBRID_MAX_GRID 20000
/* p->imp NULL: config only (no weights): layers of a type dropped from the
 * last, nothing scored, the point closest to the binding limit taken. */
int ac_minitron_hybrid(const ac_search_problem *p, ac_search_result *r, ac_err *e);
/* The "search" event of scored candidate i of k (cand: its JSON, taken; p->emit set). */
void ac_minitron_emit_candidate(const ac_search_problem *p, int i, int k, json_t *cand);
/* The arm's closing "search" event (phase minitron): feasibility, grid
 * size, feasible points, the result's limits and predicted figures. */
void ac_minitron_emit_result(const ac_search_problem *p, const ac_search_result *r, int grid, int feasible);

#endif
