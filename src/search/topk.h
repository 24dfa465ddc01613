/*
 * topk.h - top-k (the experts each token is routed to) as a global
 * discrete choice of a mixture-of-experts search (search.min_top_k): the
 * search runs once per choice k in [min_top_k, the model's top_k] on the
 * model routed to k experts, and the feasible result with the least
 * predicted loss increase wins: the search's own prediction at k plus the
 * measured calibration-loss increase of routing every token to k experts
 * instead of the model's top_k (one perplexity pass per choice over the
 * tail of the calibration text, up to 16 windows of p->ctx, as Minitron
 * scores its candidates). The two add as the search's curves do (a
 * first-order model). Minitron keeps the model's top_k: Model-Optimizer
 * has no top-k hyper-parameter.
 *
 * Ownership: r and orders as the per-choice search gives them (the
 * losers are freed); r->detail gains "top_k_choices", and p->emit gets
 * one event {"phase": "top_k", "chosen", "choices"}.
 */
#ifndef AC_TOPK_H
#define AC_TOPK_H

#include "search/search.h"

/* One search at the problem's base (p->base, model m, whose top_k is the
 * choice): the caller's search (e.g. ac_dnas_job_search's). */
typedef int (*ac_topk_search_fn)(const ac_search_problem *p, ac_model *m, void *ud, ac_search_result *r,
                                 ac_importance *orders, ac_err *e);

/* The search over k in [min_top_k, m's top_k] (min_top_k < 1 or >= top_k:
 * the one search at the model's top_k). m is read only (a shallow view with
 * another top_k is searched); p->calib_ids / n_calib / ctx give the loss
 * passes. */
int ac_search_top_k(const ac_search_problem *p, ac_model *m, int min_top_k, ac_topk_search_fn search, void *ud,
                    ac_search_result *r, ac_importance *orders, ac_err *e);

/* The calibration-loss increase of routing m to k experts per token
 * (the measurement above; 0 at m's own top_k). */
int ac_top_k_loss_increase(const ac_search_problem *p, const ac_model *m, int k, double *dloss, ac_err *e);

#endif
