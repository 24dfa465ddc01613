/*
 * search_int.h - private to src/search: the surrogate search's hybrid
 * (nemotron_h) side (surrogate_hybrid.c), which search.c's
 * ac_search_autocompress and ac_search_pred_loss hand a hybrid to.
 */
#ifndef AC_SEARCH_INT_H
#define AC_SEARCH_INT_H

#include "search/search.h"

/* The surrogate search on a hybrid (search.h, "Hybrid Mamba-Transformer models"); an error when p->imp holds no
 * loss curves. */
int ac_search_hyb_surrogate(const ac_search_problem *p, ac_search_result *r, ac_err *e);
/* A hybrid structure's predicted loss increase from the curves (search.h). */
double ac_search_hyb_pred_loss(const ac_search_problem *p, const ac_arch *a);

#endif
