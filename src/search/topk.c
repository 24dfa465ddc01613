/* topk.c - see topk.h. */
#include "search/topk.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "runtime/eval.h"

/* Mean NLL of m (routed to its a.top_k) over the calibration tail. */
static int tail_nll(const ac_search_problem *p, const ac_model *m, double *nll, ac_err *e) {
    int ctx = p->ctx > 1 ? p->ctx : 128;
    size_t nw = p->n_calib / ctx < 16 ? p->n_calib / ctx : 16;
    if (!p->calib_ids || nw < 1)
        return ac_errf(e, "top_k: calibration text has %zu tokens, fewer than one window of %d", p->n_calib, ctx);
    ac_ppl_opts o = {.ctx = ctx, .stride = 0, .max_windows = (int)nw, .batch = 4, .cuda = p->cuda};
    ac_ppl_result r;
    if (ac_perplexity(m, p->calib_ids + p->n_calib - nw * ctx, nw * ctx, &o, NULL, NULL, NULL, &r, e)) return -1;
    *nll = r.nll;
    return 0;
}

int ac_top_k_loss_increase(const ac_search_problem *p, const ac_model *m, int k, double *dloss, ac_err *e) {
    *dloss = 0;
    if (k == m->a.top_k) return 0;
    ac_model v = *m; /* a view: the same weights, routed to k experts */
    v.a.top_k = k;
    double base, at;
    if (tail_nll(p, m, &base, e) || tail_nll(p, &v, &at, e)) return -1;
    *dloss = at - base;
    return 0;
}

int ac_search_top_k(const ac_search_problem *p, ac_model *m, int min_top_k, ac_topk_search_fn search, void *ud,
                    ac_search_result *r, ac_importance *orders, ac_err *e) {
    int K = m->a.top_k, k0 = min_top_k >= 1 && min_top_k < K ? min_top_k : K;
    memset(r, 0, sizeof *r);
    memset(orders, 0, sizeof *orders);
    if (k0 == K) return search(p, m, ud, r, orders, e);
    json_t *choices = json_array();
    double best = INFINITY;
    int have = 0, rc = 0;
    for (int k = K; k >= k0 && !rc; k--) {
        ac_model v = *m; /* the model and the problem's base routed to k */
        ac_arch base = *p->base;
        v.a.top_k = base.top_k = k;
        ac_search_problem q = *p;
        q.base = &base;
        ac_search_result rk;
        ac_importance ok;
        double dl = 0;
        if ((rc = ac_top_k_loss_increase(p, m, k, &dl, e)) || (rc = search(&q, &v, ud, &rk, &ok, e))) break;
        rk.arch.top_k = k;
        double score = rk.pred_loss + dl;
        json_array_append_new(choices,
                              json_pack("{s:i,s:f,s:f,s:f,s:b}", "top_k", k, "loss_increase", dl, "search_pred_loss",
                                        rk.pred_loss, "score", score, "feasible", rk.feasible));
        /* the feasible result with the least predicted loss; failing any, the first (the model's top_k) */
        int better = !have || (rk.feasible && (!r->feasible || score < best));
        if (better) {
            if (have) ac_search_result_free(r), ac_importance_free(orders);
            *r = rk;
            *orders = ok;
            best = score;
            have = 1;
        } else {
            ac_search_result_free(&rk);
            ac_importance_free(&ok);
        }
    }
    if (rc) {
        if (have) ac_search_result_free(r), ac_importance_free(orders);
        json_decref(choices);
        memset(r, 0, sizeof *r);
        memset(orders, 0, sizeof *orders);
        return rc;
    }
    if (p->emit) { /* the job's events show the choices */
        json_t *ev = json_pack("{s:s,s:i,s:O}", "phase", "top_k", "chosen", r->arch.top_k, "choices", choices);
        p->emit(p->ud, ev);
        json_decref(ev);
    }
    if (!r->detail) r->detail = json_object();
    json_object_set_new(r->detail, "top_k_choices", choices);
    return 0;
}
