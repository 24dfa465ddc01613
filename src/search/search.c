/* search.c - see search.h. */
#include "search/search.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/deci.h"
#include "cost/engines.h"
#include "format/gguf.h"
#include "search_int.h"

/* The limits a problem sets: rows of the constraint table (constraints.h). */
typedef struct {
    const ac_constraint *c;
    double limit;
} cons;

static int constraint_list(const ac_constraints *l, cons *c) {
    int n = 0;
    for (const ac_constraint *t = ac_constraint_table(); t < ac_constraint_table() + AC_NCONSTRAINTS; t++) {
        double v = ac_constraint_limit(t, l);
        if (v > 0) c[n++] = (cons){t, v};
    }
    return n;
}

static double g_of(const cons *c, const ac_cost *k) {
    return ac_constraint_g(c->c, ac_cost_metric(k, c->c->m), c->limit);
}

double ac_constraints_violation(const ac_constraints *l, const ac_cost *k) {
    cons c[AC_NCONSTRAINTS];
    int n = constraint_list(l, c);
    double worst = -1e30;
    for (int i = 0; i < n; i++) worst = fmax(worst, g_of(&c[i], k));
    return n ? worst : -1;
}

static double total_violation(const cons *c, int n, const ac_cost *k) {
    double s = 0;
    for (int i = 0; i < n; i++) s += fmax(0, g_of(&c[i], k));
    return s;
}

json_t *ac_constraints_report(const ac_constraints *l, const ac_cost *k) {
    cons c[AC_NCONSTRAINTS];
    int n = constraint_list(l, c);
    json_t *o = json_object();
    for (int i = 0; i < n; i++)
        json_object_set_new(o, c[i].c->metric, ac_constraint_report(c[i].c, ac_cost_metric(k, c[i].c->m), c[i].limit));
    return o;
}

void ac_search_result_free(ac_search_result *r) {
    ac_arch_free(&r->arch);
    json_decref(r->detail);
    r->detail = NULL;
    if (r->trained) ac_model_free(r->trained);
    free(r->trained);
    r->trained = NULL;
}

/* ---- the continuous problem ---- */

typedef struct {
    const ac_search_problem *p;
    int L, nv;
    cons c[AC_NCONSTRAINTS];
    int nc;
    ac_carch ca;
} ctx_t;

/* A mixture-of-experts layer's FFN variable v is the kept share of the
 * experts that can go (all but top_k): v = 1 keeps every expert, 0 keeps
 * top_k (ac_sens_experts's axis). */
static double experts_at(const ac_arch *a, int l, double v) {
    const ac_layer_arch *b = &a->layers[l];
    return a->top_k + v * (b->n_experts - a->top_k);
}

static void apply_x(ctx_t *x, const double *v) {
    const ac_arch *a = x->p->base;
    for (int l = 0; l < x->L; l++) {
        const ac_layer_arch *b = &a->layers[l];
        int grp = b->n_heads ? b->n_heads / b->n_kv_heads : 1;
        x->ca.kv[l] = v[l] * b->n_kv_heads;
        x->ca.heads[l] = x->ca.kv[l] * grp;
        x->ca.ffn[l] = v[x->L + l] * b->ffn;
        if (b->n_experts) x->ca.experts[l] = experts_at(a, l, v[x->L + l]);
    }
    x->ca.hidden = v[2 * x->L] * a->hidden;
}

static double quality(const ac_search_problem *p, const double *v, int L) {
    double q = 0;
    for (int l = 0; l < L; l++)
        q += ac_sens_attn(p->imp, l, 1 - v[l]) +
             (p->base->layers[l].n_experts ? ac_sens_experts(p->imp, p->base, l, experts_at(p->base, l, v[L + l]))
                                           : ac_sens_ffn(p->imp, l, 1 - v[L + l]));
    return q + ac_sens_hidden(p->imp, 1 - v[2 * L]);
}

int ac_search_has_curves(const ac_search_problem *p) {
    return !ac_arch_is_hybrid(p->base) || (p->imp && p->imp->ssm_sens);
}

double ac_search_pred_loss(const ac_search_problem *p, const ac_arch *a) {
    const ac_arch *b = p->base;
    if (ac_arch_is_hybrid(b)) return ac_search_hyb_pred_loss(p, a); /* surrogate_hybrid.c */
    double q = 0;
    for (int l = 0; l < b->n_layers; l++) {
        const ac_layer_arch *bl = &b->layers[l], *al = &a->layers[l];
        double r = bl->n_kv_heads ? 1 - (double)al->n_kv_heads / bl->n_kv_heads : 0;
        if (al->n_heads && al->n_heads == bl->n_heads && al->n_kv_heads < bl->n_kv_heads)
            q += ac_sens_merge(p->imp, l, r); /* KV merged */
        else if (bl->n_kv_heads)
            q += ac_sens_attn(p->imp, l, r);
        if (bl->ffn) q += ac_sens_ffn(p->imp, l, 1 - fmin(al->ffn, bl->ffn) / bl->ffn); /* padding keeps nothing more */
        if (bl->n_experts) q += ac_sens_experts(p->imp, b, l, al->n_experts ? al->n_experts : b->top_k);
        if (bl->ssm_heads) q += ac_sens_ssm(p->imp, l, 1 - (double)al->ssm_heads / bl->ssm_heads); /* 0 without */
    }
    return q + ac_sens_hidden(p->imp, 1 - (double)a->hidden / b->hidden);
}

static unsigned lcg(unsigned *s) { return *s = *s * 1664525u + 1013904223u; }

/* ---- discrete architecture helpers ---- */

static void predict_arch(const ac_search_problem *p, const ac_arch *a, ac_cost *out) {
    ac_carch c;
    if (ac_carch_from_arch(a, &c, NULL)) {
        memset(out, 0, sizeof *out);
        return;
    }
    ac_cost_predict(p->table, &c, p->workload, p->profile, 0, out);
    ac_carch_free(&c);
}

static int round_mult(double v, int mult, int max) {
    if (max <= mult) return v >= 0.5 * max ? max : 0;
    int r = (int)lround(v / mult) * mult;
    return r < 0 ? 0 : r > max ? max : r;
}

typedef enum { MV_ATTN, MV_FFN, MV_HID } mv_kind;

/* FFN width step: for deci the loaders' grid (ffn_multiple when it is a
 * multiple of it), else ffn_multiple. */
static int ffn_grid(const ac_search_problem *p) {
    int m = p->opts.ffn_multiple;
    if (p->opts.target != AC_EXPORT_DECI) return m;
    return m > 0 && m % AC_DECI_GRID == 0 ? m : AC_DECI_GRID;
}

/* Widest FFN a layer may take: the base width, or for deci the grid width at
 * or above it (keeping every channel, zero-padded, charged padded). */
static int ffn_cap(const ac_search_problem *p, int base_ffn) {
    if (p->opts.target != AC_EXPORT_DECI || base_ffn <= 0) return base_ffn;
    int g = ffn_grid(p);
    return (base_ffn + g - 1) / g * g;
}

/* Deci: the first layer with any sub-block must keep attention (vLLM's
 * nemotron_nas starts its fused residual there); other targets: always 1. */
static int deci_first_ok(const ac_search_problem *p, const ac_arch *a) {
    if (p->opts.target != AC_EXPORT_DECI) return 1;
    for (int l = 0; l < a->n_layers; l++)
        if (a->layers[l].n_heads || a->layers[l].ffn) return a->layers[l].n_heads > 0;
    return 1;
}

/* Deci discretisation of a relaxed FFN width: the nearest kept count among
 * min(k * grid, base), returned as the padded (exported) width. */
static int deci_round_ffn(const ac_search_problem *p, double want, int base_ffn) {
    int g = ffn_grid(p), cap = ffn_cap(p, base_ffn), best = 0;
    for (int w = g; w <= cap; w += g) {
        int k = w < base_ffn ? w : base_ffn, kb = best < base_ffn ? best : base_ffn;
        if (fabs(want - k) < fabs(want - kb)) best = w;
    }
    return best;
}

/* ---- KV counts a layer may take ---- */

static int tp_of(const ac_search_problem *p) { return p->profile && p->profile->tp > 1 ? p->profile->tp : 1; }

/* Query heads a layer keeps with kv KV heads: deci merges KV heads and keeps
 * every query head; the other targets keep whole groups. */
static int heads_with(const ac_search_problem *p, const ac_layer_arch *bl, int kv) {
    if (kv <= 0) return 0;
    if (p->opts.target == AC_EXPORT_DECI) return bl->n_heads;
    return kv * (bl->n_heads ? bl->n_heads / bl->n_kv_heads : 1);
}

/* A KV count layer bl of the base may be pruned to: 0 (no attention) or
 * up to the base count; for deci a divisor of it (n_heads_in_group stays
 * whole); under tensor parallelism one the serving engine splits tp ways
 * (ac_tp_attn_splits, vLLM's rule). */
static int kv_ok(const ac_search_problem *p, const ac_layer_arch *bl, int kv) {
    if (kv < 0 || kv > bl->n_kv_heads) return 0;
    if (kv == 0) return 1;
    if (p->opts.target == AC_EXPORT_DECI && bl->n_kv_heads % kv) return 0;
    return ac_tp_attn_splits(tp_of(p), heads_with(p, bl, kv), kv);
}

/* The next KV count kv_ok allows from kv in direction dir, or -1. (deci:
 * KV heads move between the divisors of the base count, query heads kept,
 * and below one KV head the attention is removed.) */
static int kv_step(const ac_search_problem *p, const ac_layer_arch *bl, int kv, int dir) {
    for (int k = kv + dir; k >= 0 && k <= bl->n_kv_heads; k += dir)
        if (kv_ok(p, bl, k)) return k;
    return -1;
}

/* The allowed KV count of at least one nearest to want (a tie: the larger);
 * the base count is always allowed (ac_search_check_tp). */
static int kv_nearest(const ac_search_problem *p, const ac_layer_arch *bl, double want) {
    int best = bl->n_kv_heads;
    for (int k = bl->n_kv_heads - 1; k >= 1; k--)
        if (kv_ok(p, bl, k) && fabs(k - want) < fabs(best - want)) best = k;
    return best;
}

/* Layers whose KV count the rules above do not allow (a DNAS discretisation
 * knows no tp) move to the nearest allowed count. */
static void kv_snap(const ac_search_problem *p, ac_arch *a) {
    for (int l = 0; l < a->n_layers; l++) {
        const ac_layer_arch *bl = &p->base->layers[l];
        ac_layer_arch *al = &a->layers[l];
        if (!al->n_kv_heads || kv_ok(p, bl, al->n_kv_heads)) continue;
        int deci_merge = al->n_heads == bl->n_heads; /* query heads kept while KV heads merge */
        al->n_kv_heads = kv_nearest(p, bl, al->n_kv_heads);
        al->n_heads = deci_merge ? bl->n_heads : heads_with(p, bl, al->n_kv_heads);
    }
}

int ac_search_check_tp(const ac_search_problem *p, int check_grid, ac_err *e) {
    int tp = tp_of(p);
    if (tp <= 1) return 0;
    for (int l = 0; l < p->base->n_layers; l++) {
        int v = 0;
        const char *what = ac_tp_layer_unsplit(tp, &p->base->layers[l], &v);
        if (what)
            return ac_errf(e, "search: tensor parallelism over %d GPUs does not split layer %d of the base model: %d %s",
                           tp, l, v, what);
    }
    if (check_grid && (p->opts.ffn_multiple <= 0 || p->opts.ffn_multiple % tp))
        return ac_errf(e, "search: the FFN grid (ffn_multiple %d) is not a multiple of tp %d", p->opts.ffn_multiple,
                       tp);
    return 0;
}

/* A layer with nothing left (dnas's depth gate on the llama target drops whole layers). */
static int dropped(const ac_layer_arch *al) { return !al->n_heads && !al->ffn && !al->n_experts; }

/* One expert more or fewer (dir) in every mixture-of-experts layer kept
 * (a dropped one stays dropped): the export targets (llama.cpp's GGUF,
 * Hugging Face's configs) hold one expert count for the whole model.
 * Between top_k and the base's count. */
static int move_experts(const ac_search_problem *p, ac_arch *a, int dir) {
    const ac_arch *b = p->base;
    for (int i = 0; i < b->n_layers; i++) {
        int n = a->layers[i].n_experts + dir;
        if (b->layers[i].n_experts && !dropped(&a->layers[i]) &&
            (!p->opts.prune_experts || n < b->top_k || n > b->layers[i].n_experts))
            return 0;
    }
    for (int i = 0; i < b->n_layers; i++)
        if (b->layers[i].n_experts && !dropped(&a->layers[i])) a->layers[i].n_experts += dir;
    return 1;
}

/* Apply a move of sign dir (-1 shrink, +1 grow) to a; returns 0 if not possible. */
static int move(const ac_search_problem *p, ac_arch *a, mv_kind k, int l, int dir) {
    const ac_arch *b = p->base;
    int mult = ffn_grid(p), hm = p->opts.hidden_multiple;
    int uniform = p->opts.target == AC_EXPORT_LLAMA;
    int l0 = uniform && k != MV_HID ? 0 : l, l1 = uniform && k != MV_HID ? b->n_layers : l + 1;
    if (k == MV_HID) {
        if (!p->opts.prune_hidden) return 0;
        int h = a->hidden + dir * hm;
        if (h < hm || h > b->hidden) return 0;
        a->hidden = h;
        return 1;
    }
    if (k == MV_FFN && b->layers[l].n_experts) return move_experts(p, a, dir);
    /* check all first, then apply (uniform moves are all-or-nothing) */
    for (int i = l0; i < l1; i++) {
        if (k == MV_FFN && b->layers[i].n_experts) continue; /* a uniform FFN move leaves MoE layers */
        const ac_layer_arch *bl = &b->layers[i];
        ac_layer_arch *al = &a->layers[i];
        if (uniform && dropped(al)) continue; /* llama: a layer dnas dropped whole stays dropped */
        if (k == MV_ATTN) {
            int kv = kv_step(p, bl, al->n_kv_heads, dir);
            if (kv < 0 || (uniform && kv == 0)) return 0;
        } else {
            int cap = ffn_cap(p, bl->ffn), step = cap <= mult ? cap : mult;
            int f = al->ffn + dir * step;
            if (dir > 0 && al->ffn + step > cap) f = cap == al->ffn ? -1 : cap;
            if (f < 0 || f > cap || (uniform && f == 0)) return 0;
        }
    }
    for (int i = l0; i < l1; i++) {
        const ac_layer_arch *bl = &b->layers[i];
        ac_layer_arch *al = &a->layers[i];
        if (k == MV_FFN && bl->n_experts) continue;
        if (uniform && dropped(al)) continue;
        if (k == MV_ATTN) {
            al->n_kv_heads = kv_step(p, bl, al->n_kv_heads, dir);
            al->n_heads = heads_with(p, bl, al->n_kv_heads);
        } else {
            int cap = ffn_cap(p, bl->ffn), step = cap <= mult ? cap : mult;
            if (dir > 0 && al->ffn + step > cap)
                al->ffn = cap;
            else
                al->ffn += dir * step;
            if (al->ffn < 0) al->ffn = 0;
        }
    }
    if (!deci_first_ok(p, a)) return 0;
    /* keep at least one attention layer: a model without attention is not a language model */
    int any = 0;
    for (int i = 0; i < a->n_layers; i++) any |= a->layers[i].n_heads > 0;
    /* gguf: only what llama.cpp's runtime runs correctly */
    return any && (p->opts.target != AC_EXPORT_GGUF || ac_gguf_check_layers(a, NULL) == 0);
}

/* gguf: make a rounded architecture one llama.cpp runs (attention in layer
 * 0, an FFN wherever attention is kept and in the last layer) by giving
 * back the smallest unit of what is missing; repair then only makes moves
 * that keep to these rules. */
static void gguf_fixup(const ac_search_problem *p, ac_arch *a) {
    const ac_arch *b = p->base;
    for (int l = 0; l < a->n_layers; l++) {
        const ac_layer_arch *bl = &b->layers[l];
        ac_layer_arch *al = &a->layers[l];
        int step = bl->ffn <= p->opts.ffn_multiple ? bl->ffn : p->opts.ffn_multiple;
        if (l == 0 && !al->n_heads && bl->n_heads) {
            al->n_kv_heads = kv_nearest(p, bl, 1);
            al->n_heads = heads_with(p, bl, al->n_kv_heads);
        }
        if ((al->n_heads || l == a->n_layers - 1) && !al->ffn && !al->n_experts) al->ffn = step;
    }
}

/* Shrink until feasible (cheapest loss per violation removed), then grow
 * while feasible (largest loss recovered first). */
static void repair(const ac_search_problem *p, const cons *c, int nc, ac_arch *a, ac_cost *cost) {
    int L = a->n_layers;
    ac_arch t;
    kv_snap(p, a);
    predict_arch(p, a, cost);
    for (int it = 0; it < 100000; it++) {
        double viol = total_violation(c, nc, cost);
        if (viol <= 1e-12) break;
        double q0 = ac_search_pred_loss(p, a), best = 1e300;
        int bk = -1, bl = -1;
        for (int k = 0; k < 3; k++)
            for (int l = 0; l < (k == MV_HID ? 1 : L); l++) {
                if (ac_arch_copy(&t, a, NULL)) return;
                if (move(p, &t, (mv_kind)k, l, -1)) {
                    ac_cost ck;
                    predict_arch(p, &t, &ck);
                    double dv = viol - total_violation(c, nc, &ck), dq = ac_search_pred_loss(p, &t) - q0;
                    if (dv > 1e-12) {
                        double score = (dq + 1e-9) / dv;
                        if (score < best) {
                            best = score;
                            bk = k;
                            bl = l;
                        }
                    }
                }
                ac_arch_free(&t);
            }
        if (bk < 0) break; /* infeasible: nothing reduces the violation */
        move(p, a, (mv_kind)bk, bl, -1);
        predict_arch(p, a, cost);
    }
    if (total_violation(c, nc, cost) > 1e-12) return;
    for (int it = 0; it < 100000; it++) {
        double q0 = ac_search_pred_loss(p, a), best = 0;
        int bk = -1, bl = -1;
        for (int k = 0; k < 3; k++)
            for (int l = 0; l < (k == MV_HID ? 1 : L); l++) {
                if (ac_arch_copy(&t, a, NULL)) return;
                if (move(p, &t, (mv_kind)k, l, +1)) {
                    ac_cost ck;
                    predict_arch(p, &t, &ck);
                    double gain = q0 - ac_search_pred_loss(p, &t);
                    if (total_violation(c, nc, &ck) <= 1e-12 && gain > best) {
                        best = gain;
                        bk = k;
                        bl = l;
                    }
                }
                ac_arch_free(&t);
            }
        if (bk < 0) break;
        move(p, a, (mv_kind)bk, bl, +1);
    }
    predict_arch(p, a, cost);
}

int ac_search_repair(const ac_search_problem *p, ac_arch *a, ac_cost *cost) {
    cons c[AC_NCONSTRAINTS];
    int nc = constraint_list(&p->limits, c);
    repair(p, c, nc, a, cost);
    return total_violation(c, nc, cost) <= 1e-12;
}

/* Scratch of the relaxed search: v the relaxed keep fractions (KV groups per
 * layer, FFN per layer, hidden), g their gradient, m1/m2 Adam's moments,
 * gh/gk/gf one constraint's per-layer cost gradient. */
typedef struct {
    double *v, *g, *m1, *m2, *gh, *gk, *gf, *ge; /* ge: the cost gradient per expert (MoE layers) */
    double lambda[AC_NCONSTRAINTS];
} relax_t;

static void relax_free(relax_t *R) {
    free(R->v);
    free(R->g);
    free(R->m1);
    free(R->m2);
    free(R->gh);
    free(R->gk);
    free(R->gf);
    free(R->ge);
}

static int relax_alloc(relax_t *R, int L, ac_err *e) {
    int nv = 2 * L + 1;
    memset(R, 0, sizeof *R);
    R->v = calloc(nv, sizeof(double)), R->g = calloc(nv, sizeof(double)), R->m1 = calloc(nv, sizeof(double));
    R->m2 = calloc(nv, sizeof(double)), R->gh = calloc(L, sizeof(double)), R->gk = calloc(L, sizeof(double));
    R->gf = calloc(L, sizeof(double)), R->ge = calloc(L, sizeof(double));
    if (R->v && R->g && R->m1 && R->m2 && R->gh && R->gk && R->gf && R->ge) return 0;
    relax_free(R);
    return ac_errf(e, "out of memory");
}

/* The mixture-of-experts layers' FFN variables share one value (their
 * mean): the export targets hold one expert count per model. */
static void share_experts(const ac_arch *b, double *vf) {
    double avg = 0;
    int n = 0;
    for (int l = 0; l < b->n_layers; l++)
        if (b->layers[l].n_experts) avg += vf[l], n++;
    for (int l = 0; n && l < b->n_layers; l++)
        if (b->layers[l].n_experts) vf[l] = avg / n;
}

/* The augmented Lagrangian at v (x.ca already set from v) and its gradient
 * into R->g; the multipliers take one dual-ascent step. Returns the
 * Lagrangian; *q the quality term. */
static double relax_grad(ctx_t *x, relax_t *R, const ac_cost *cost, double mu, double rho, double *q) {
    const ac_search_problem *p = x->p;
    int L = x->L, nv = 2 * L + 1;
    double *v = R->v, *g = R->g;
    /* quality gradient by central differences of the piecewise-linear curves */
    *q = quality(p, v, L);
    for (int i = 0; i < nv; i++) {
        double o = v[i], h = 1e-3;
        v[i] = fmin(1, o + h);
        double qa = quality(p, v, L);
        v[i] = fmax(0, o - h);
        double qb = quality(p, v, L);
        v[i] = o;
        g[i] = (qa - qb) / (fmin(1, o + h) - fmax(0, o - h));
    }
    double lag = *q;
    for (int j = 0; j < x->nc; j++) {
        double gj = g_of(&x->c[j], cost);
        double w = R->lambda[j] + mu * fmax(0, gj); /* d/dgj of lambda g + mu/2 max(0,g)^2 */
        lag += R->lambda[j] * gj + 0.5 * mu * fmax(0, gj) * fmax(0, gj);
        if (w != 0) {
            double ghid;
            ac_cost_grad_experts(p->table, &x->ca, p->workload, p->profile, x->c[j].c->m, R->gh, R->gk, R->gf, &ghid,
                                 R->ge);
            double sgn = ac_constraint_dg(x->c[j].c, x->c[j].limit);
            for (int l = 0; l < L; l++) {
                const ac_layer_arch *b = &p->base->layers[l];
                int grp = b->n_heads ? b->n_heads / b->n_kv_heads : 1;
                g[l] += w * sgn * (R->gk[l] * b->n_kv_heads + R->gh[l] * b->n_kv_heads * grp);
                g[L + l] += w * sgn * (b->n_experts ? R->ge[l] * (b->n_experts - p->base->top_k) : R->gf[l] * b->ffn);
            }
            g[2 * L] += w * sgn * ghid * p->base->hidden;
        }
        R->lambda[j] = fmax(0, R->lambda[j] + rho * gj);
    }
    if (p->opts.target == AC_EXPORT_LLAMA) { /* uniform: one shared value per component (dense FFNs apart) */
        for (int blk = 0; blk < 2; blk++) {
            double avg = 0;
            int n = 0;
            for (int l = 0; l < L; l++)
                if (!blk || !p->base->layers[l].n_experts) avg += g[blk * L + l], n++;
            for (int l = 0; n && l < L; l++)
                if (!blk || !p->base->layers[l].n_experts) g[blk * L + l] = avg / n;
        }
    }
    share_experts(p->base, g + L); /* every target: one expert count */
    if (!p->opts.prune_hidden) g[2 * L] = 0;
    for (int l = 0; !p->opts.prune_experts && l < L; l++)
        if (p->base->layers[l].n_experts) g[L + l] = 0;
    return lag;
}

/* One projected Adam step (step s, 1-based) on R->v. */
static void relax_adam(relax_t *R, int L, int s, double lr) {
    for (int i = 0; i < 2 * L + 1; i++) {
        R->m1[i] = 0.9 * R->m1[i] + 0.1 * R->g[i];
        R->m2[i] = 0.999 * R->m2[i] + 0.001 * R->g[i] * R->g[i];
        double mh = R->m1[i] / (1 - pow(0.9, s)), vh = R->m2[i] / (1 - pow(0.999, s));
        R->v[i] -= lr * mh / (sqrt(vh) + 1e-8);
        R->v[i] = fmin(1, fmax(i == 2 * L ? 0.125 : 0, R->v[i]));
    }
}

static void relax_emit(const ctx_t *x, int s, int steps, double lag, double q, double now, const ac_cost *cost) {
    const ac_search_problem *p = x->p;
    json_t *arch = json_array();
    for (int l = 0; l < x->L; l++)
    {
        json_t *o = json_pack("{s:f,s:f,s:f}", "kv_heads", x->ca.kv[l], "heads", x->ca.heads[l], "ffn", x->ca.ffn[l]);
        if (x->ca.experts && x->ca.experts[l] > 0) json_object_set_new(o, "experts", json_real(x->ca.experts[l]));
        json_array_append_new(arch, o);
    }
    json_t *ev =
        json_pack("{s:s,s:i,s:i,s:f,s:f,s:f,s:o,s:o,s:{s:f,s:o}}", "phase", "autocompress", "step", s, "steps", steps,
                  "loss", lag, "quality_loss", q, "seconds", now, "metrics", ac_constraints_report(&p->limits, cost),
                  "predicted", ac_cost_to_json(cost), "architecture", "hidden", x->ca.hidden, "layers", arch);
    p->emit(p->ud, ev);
    json_decref(ev);
}

/* The relaxed fractions v to an architecture on the export target's grid
 * (a: a copy of the base). */
static void relax_discretise(const ac_search_problem *p, const double *v, ac_arch *a) {
    int L = p->base->n_layers;
    for (int l = 0; l < L; l++) {
        const ac_layer_arch *b = &p->base->layers[l];
        int grp = b->n_heads ? b->n_heads / b->n_kv_heads : 1;
        int kv =
            p->opts.target == AC_EXPORT_DECI ? (v[l] >= 0.5 ? b->n_kv_heads : 0) : (int)lround(v[l] * b->n_kv_heads);
        if (p->opts.target == AC_EXPORT_LLAMA && kv < 1) kv = 1;
        if (kv > 0 && !kv_ok(p, b, kv)) kv = kv_nearest(p, b, fmax(1, v[l] * b->n_kv_heads)); /* one tp splits */
        a->layers[l].n_kv_heads = kv;
        a->layers[l].n_heads = kv * grp;
        int f = p->opts.target == AC_EXPORT_DECI ? deci_round_ffn(p, v[L + l] * b->ffn, b->ffn)
                                                 : round_mult(v[L + l] * b->ffn, p->opts.ffn_multiple, b->ffn);
        if (p->opts.target == AC_EXPORT_LLAMA && f < 1)
            f = b->ffn < p->opts.ffn_multiple ? b->ffn : p->opts.ffn_multiple;
        a->layers[l].ffn = b->n_experts ? 0 : f;
        if (b->n_experts) /* one count for the model (share_experts keeps v equal across MoE layers) */
            a->layers[l].n_experts = p->opts.prune_experts ? (int)lround(experts_at(p->base, l, v[L + l])) : b->n_experts;
    }
    if (p->opts.target == AC_EXPORT_LLAMA) /* enforce exact uniformity: attention, dense FFNs, experts apart */
        for (int l = 1; l < L; l++) {
            int same = -1;
            for (int k = 0; k < l && same < 0; k++)
                if (!p->base->layers[k].n_experts == !p->base->layers[l].n_experts) same = k;
            a->layers[l].n_heads = a->layers[0].n_heads;
            a->layers[l].n_kv_heads = a->layers[0].n_kv_heads;
            if (same >= 0) a->layers[l].ffn = a->layers[same].ffn, a->layers[l].n_experts = a->layers[same].n_experts;
        }
    if (p->opts.prune_hidden) {
        int h = (int)lround(v[2 * L] * p->base->hidden / p->opts.hidden_multiple) * p->opts.hidden_multiple;
        a->hidden = h < p->opts.hidden_multiple ? p->opts.hidden_multiple : h > p->base->hidden ? p->base->hidden : h;
    }
    int any = 0;
    for (int l = 0; l < L; l++) any |= a->layers[l].n_heads > 0;
    if (!any) { /* keep the most influential layer's attention */
        int best = 0;
        for (int l = 1; l < L; l++)
            if (p->imp->layer_bi[l] > p->imp->layer_bi[best]) best = l;
        a->layers[best] = p->base->layers[best];
        a->layers[best].ffn = ffn_cap(p, a->layers[best].ffn);
    }
    if (p->opts.target == AC_EXPORT_GGUF) gguf_fixup(p, a);
    if (!deci_first_ok(p, a)) /* give the first active layer its attention back */
        for (int l = 0; l < L; l++)
            if (a->layers[l].n_heads || a->layers[l].ffn) {
                a->layers[l].n_heads = p->base->layers[l].n_heads;
                a->layers[l].n_kv_heads = p->base->layers[l].n_kv_heads;
                break;
            }
}

int ac_search_autocompress(const ac_search_problem *p, ac_search_result *r, ac_err *e) {
    memset(r, 0, sizeof *r);
    if (ac_arch_is_hybrid(p->base)) return ac_search_hyb_surrogate(p, r, e); /* surrogate_hybrid.c */
    ctx_t x = {.p = p, .L = p->base->n_layers};
    x.nc = constraint_list(&p->limits, x.c);
    if (x.nc == 0) return ac_errf(e, "search: no constraints given");
    if (ac_search_check_tp(p, 1, e)) return -1;
    int L = x.L, nv = 2 * L + 1;
    relax_t R;
    if (relax_alloc(&R, L, e)) return -1;
    if (ac_carch_from_arch(p->base, &x.ca, e)) {
        relax_free(&R);
        return -1;
    }
    unsigned seed = p->opts.seed * 2654435761u + 12345;
    for (int i = 0; i < nv; i++) R.v[i] = 1.0 - 0.02 * (lcg(&seed) >> 8) / 16777216.0;
    if (!p->opts.prune_hidden) R.v[2 * L] = 1.0;
    share_experts(p->base, R.v + L);
    int steps = p->opts.steps, every = steps / 30 > 0 ? steps / 30 : 1;
    double mu = 10.0, rho = 0.5, t0 = ac_now(), last_emit = 0;
    for (int s = 1; s <= steps; s++) {
        apply_x(&x, R.v);
        ac_cost cost;
        ac_cost_predict(p->table, &x.ca, p->workload, p->profile, 1, &cost);
        double q, lag = relax_grad(&x, &R, &cost, mu, rho, &q);
        relax_adam(&R, L, s, p->opts.lr);
        r->steps_run = s;
        double now = ac_now() - t0;
        if (p->emit && (s % every == 0 || s == steps || now - last_emit > 2.0)) {
            last_emit = now;
            relax_emit(&x, s, steps, lag, q, now, &cost);
        }
    }
    ac_arch a;
    int rc = ac_arch_copy(&a, p->base, e);
    if (!rc) {
        relax_discretise(p, R.v, &a);
        repair(p, x.c, x.nc, &a, &r->cost);
        r->arch = a;
        if (p->opts.target == AC_EXPORT_DECI && !ac_arch_is_uniform(&a) && ac_deci_check_arch(&a, e))
            rc = ac_errctx(e, "search produced an architecture the deci target cannot express");
        r->pred_loss = ac_search_pred_loss(p, &a);
        r->feasible = total_violation(x.c, x.nc, &r->cost) <= 1e-12;
    }
    relax_free(&R);
    ac_carch_free(&x.ca);
    return rc;
}
