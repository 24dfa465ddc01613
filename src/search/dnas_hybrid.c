/*
 * dnas_hybrid.c - the differentiable search on a hybrid Mamba-Transformer
 * (nemotron_h): the expected cost of its gates and their discretisation,
 * one width per layer type (dnas.h, "Hybrid Mamba-Transformer models").
 * The gates themselves (layout, trainer gates, gradients) are dnas.c's.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "search/constraints.h"
#include "search/ssm_prune.h"
#include "dnas_int.h"

enum { T_MAMBA, T_ATTN, T_MLP, T_MOE, N_TYPES };
static const char *TYPE_NAME[N_TYPES] = {"mamba", "attention", "mlp", "moe"};

static int type_of(const ac_layer_arch *L) {
    return L->ssm_heads ? T_MAMBA : L->n_heads ? T_ATTN : L->n_experts ? T_MOE : T_MLP;
}

static int groups_of(const ac_arch *b) { return b->ssm_groups > 0 ? b->ssm_groups : 1; }
static int grp_of(const ac_layer_arch *L) { return L->n_heads ? L->n_heads / L->n_kv_heads : 1; }
static double kp(const ac_dnas_gates *g, int i) { return ac_dnas_keep_prob(g->la[i]); }

/* The greedy moves (move()): a width one grid step, or (K_DEPTH + t) a layer of type t. */
enum { K_SSM, K_KV, K_FFN, K_EX, K_HID, K_EW, K_SH, K_PD, K_LT, K_DEPTH };

/* Layer l's gates of the model-wide width kind k (K_EW, K_SH, K_PD, K_LT): their count (0: none), *off their first
 * log_alpha, *step the channels of one gate, *max the base's width. */
static int wide_gates(const ac_dnas_gates *g, const ac_arch *b, int k, int l, int *off, int *step, int *max) {
    const ac_layer_arch *bl = &b->layers[l];
    if (k == K_EW) return *off = g->xg_off[l], *step = g->xfm[l], *max = bl->expert_ffn, g->nxg[l];
    if (k == K_SH) return *off = g->shg_off[l], *step = g->shm, *max = b->shared_ffn, g->nshg[l];
    if (k == K_LT) return *off = g->ltg_off[l], *step = g->ltm, *max = b->moe_latent, g->nltg[l];
    return *off = g->pd_off[l], *step = 1, *max = b->ssm_head_dim, g->npd[l];
}

/* Layer l's weight in the model-wide width of its kind: with keep (the discretisation's choice) 1 when kept, else
 * its depth gate's keep probability (the expected cost: a layer the gates remove does not set the width). */
static double wide_weight(const ac_dnas_gates *g, int l, const char *keep) {
    return keep ? keep[l] : g->gate_depth ? kp(g, g->attn_off + l) : 1;
}

/* The model-wide width of kind k (K_EW, K_SH, K_PD, K_LT): the mean over the layers that have such gates of their
 * expected widths, weighted by wide_weight; *n gets how many layers have such gates (0: base returned), *ws the
 * weights' sum, *step and *max their grid. */
static double wide_expect(const ac_dnas_gates *g, const ac_arch *b, int k, double base, const char *keep, int *n,
                          double *ws, int *step, int *max) {
    double sum = 0;
    int off;
    *n = 0, *ws = 0, *step = 1, *max = (int)base;
    for (int l = 0; l < g->L; l++) {
        int ng = wide_gates(g, b, k, l, &off, step, max);
        double w = 0, wl = ng ? wide_weight(g, l, keep) : 0;
        for (int j = 0; j < ng; j++) w += ac_dnas_gsize(*max, *step, j) * kp(g, off + j);
        sum += wl * w, *ws += wl;
        *n += ng > 0;
    }
    return *n && *ws > 0 ? sum / *ws : base;
}

/* grad += dW times d(wide_expect)/d log_alpha (W its value, ws its weights' sum): each gate of layer l through
 * its width, each depth gate through its weight. */
static void wide_grad(const ac_dnas_gates *g, const ac_arch *b, int k, double dW, double W, double ws, double *grad) {
    int off, step, max;
    for (int l = 0; ws > 0 && l < g->L; l++) {
        int ng = wide_gates(g, b, k, l, &off, &step, &max);
        if (!ng) continue;
        double wl = wide_weight(g, l, NULL), w = 0;
        for (int j = 0; j < ng; j++) {
            double q = kp(g, off + j), sz = ac_dnas_gsize(max, step, j);
            w += sz * q;
            grad[off + j] += dW * wl / ws * sz * q * (1 - q);
        }
        if (g->gate_depth) grad[g->attn_off + l] += dW * (w - W) / ws * wl * (1 - wl);
    }
}

int ac_dnas_ssm_head(const ac_importance *imp, const ac_arch *b, int l, int gr, int j) {
    int hpg = b->layers[l].ssm_heads / groups_of(b);
    return imp && imp->ssm_head_order && imp->ssm_head_order[l] ? imp->ssm_head_order[l][gr * hpg + j] : gr * hpg + j;
}

/* Layer l's expected widths given it is kept, into c (one layer), and its keep probability. */
static double layer_expect(const ac_dnas_gates *g, const ac_arch *b, int l, ac_carch *c) {
    const ac_layer_arch *bl = &b->layers[l];
    if (c->ssm) {
        double s = g->nsg[l] ? 0 : bl->ssm_heads;
        for (int j = 0; j < g->nsg[l]; j++) s += groups_of(b) * kp(g, g->sg_off[l] + j);
        c->ssm[l] = s;
    }
    double kv = g->nkv[l] ? 0 : bl->n_kv_heads;
    for (int k = 0; k < g->nkv[l]; k++) kv += kp(g, g->kv_off[l] + k);
    c->kv[l] = bl->n_heads ? kv : 0;
    c->heads[l] = c->kv[l] * grp_of(bl);
    double f = 0;
    for (int j = 0; j < g->nfg[l]; j++) f += ac_dnas_gsize(bl->ffn, g->fm, j) * kp(g, g->ffn_off[l] + j);
    c->ffn[l] = f;
    if (c->experts && bl->n_experts) {
        double x = g->nex[l] ? 0 : bl->n_experts;
        for (int k = 0; k < g->nex[l]; k++) x += kp(g, g->ex_off[l] + k);
        c->experts[l] = x;
    }
    if (c->effn && g->nxg[l]) { /* expert width: its channel groups */
        double w = 0;
        for (int j = 0; j < g->nxg[l]; j++) w += ac_dnas_gsize(bl->expert_ffn, g->xfm[l], j) * kp(g, g->xg_off[l] + j);
        c->effn[l] = w;
    }
    return g->gate_depth ? kp(g, g->attn_off + l) : 1;
}

static double hidden_expect(const ac_dnas_gates *g) {
    if (!g->gate_hid) return g->H;
    double h = 0;
    for (int j = 0; j < g->nhg; j++) h += ac_dnas_gsize(g->H, g->hm, j) * kp(g, g->hid_off + j);
    return h;
}

/* Layer l's widths in c: save them into s[6] and zero them (the layer removed), or put them back. */
static void layer_off(ac_carch *c, int l, double *s) {
    s[0] = c->kv[l], s[1] = c->heads[l], s[2] = c->ffn[l];
    s[3] = c->ssm ? c->ssm[l] : 0, s[4] = c->experts ? c->experts[l] : 0, s[5] = c->effn ? c->effn[l] : 0;
    c->kv[l] = c->heads[l] = c->ffn[l] = 0;
    if (c->ssm) c->ssm[l] = 0;
    if (c->experts) c->experts[l] = c->effn[l] = 0;
}

static void layer_on(ac_carch *c, int l, const double *s) {
    c->kv[l] = s[0], c->heads[l] = s[1], c->ffn[l] = s[2];
    if (c->ssm) c->ssm[l] = s[3];
    if (c->experts) c->experts[l] = s[4], c->effn[l] = s[5];
}

/* E[m] = m(cbar) - sum_l (1 - p_l) D_l with D_l = m(cbar) - m(cbar without
 * layer l), every layer one block (one mixer); D[L] (may be NULL) gets D. */
static double expected_at(const ac_search_problem *p, ac_carch *c, const double *pl, int L, ac_metric m, double *D) {
    double m0 = ac_dnas_metric_at(p, c, m), v = m0, save[6];
    for (int l = 0; l < L; l++) {
        layer_off(c, l, save);
        double d = m0 - ac_dnas_metric_at(p, c, m);
        layer_on(c, l, save);
        if (D) D[l] = d;
        v -= (1 - pl[l]) * d;
    }
    return v;
}

/* dE/dv at c by a central difference of h each side (one-sided where v < h); *v2 (may be NULL) moves by r2 per
 * unit of *v (query heads with their KV groups). */
static double slope(const ac_search_problem *p, ac_carch *c, const double *pl, int L, ac_metric m, double *v,
                    double *v2, double r2, double h) {
    double v0 = *v, w0 = v2 ? *v2 : 0, lo = v0 >= h ? h : 0;
    *v = v0 + h;
    if (v2) *v2 = w0 + h * r2;
    double a = expected_at(p, c, pl, L, m, NULL);
    *v = v0 - lo;
    if (v2) *v2 = w0 - lo * r2;
    double d = (a - expected_at(p, c, pl, L, m, NULL)) / (h + lo);
    *v = v0;
    if (v2) *v2 = w0;
    return d;
}

/* The gradient: dE/dp_l = D_l exactly; each width's (and the hidden
 * size's) by a difference of E over half a unit each side (4 channels for
 * the hidden size), exact where the cost model is linear in it (the
 * parameter count). */
double ac_dnas_hyb_expected_metric(const ac_dnas_gates *g, const ac_search_problem *p, ac_metric m, double *grad) {
    const ac_arch *b = p->base;
    int L = g->L;
    ac_carch c;
    if (ac_carch_from_arch(b, &c, NULL)) return NAN;
    double *pl = calloc(2 * L + 1, sizeof(double)), *D = pl + L;
    if (!pl) {
        ac_carch_free(&c);
        return NAN;
    }
    for (int l = 0; l < L; l++) pl[l] = layer_expect(g, b, l, &c);
    c.hidden = hidden_expect(g);
    int nsh, npd, nlt, st, mx;
    double wsh, wpd, wlt;
    c.shared_ffn = wide_expect(g, b, K_SH, c.shared_ffn, NULL, &nsh, &wsh, &st, &mx);
    c.ssm_head_dim = wide_expect(g, b, K_PD, c.ssm_head_dim, NULL, &npd, &wpd, &st, &mx);
    c.moe_latent = wide_expect(g, b, K_LT, c.moe_latent, NULL, &nlt, &wlt, &st, &mx);
    double v = expected_at(p, &c, pl, L, m, D);
    if (grad) {
        memset(grad, 0, sizeof(double) * g->np);
        for (int l = 0; l < L; l++) {
            const ac_layer_arch *bl = &b->layers[l];
            if (g->gate_depth) grad[g->attn_off + l] = D[l] * pl[l] * (1 - pl[l]);
            if (g->nsg[l] && c.ssm) {
                double d = slope(p, &c, pl, L, m, &c.ssm[l], NULL, 0, 0.5) * groups_of(b);
                for (int j = 0; j < g->nsg[l]; j++) {
                    double q = kp(g, g->sg_off[l] + j);
                    grad[g->sg_off[l] + j] = d * q * (1 - q);
                }
            }
            if (g->nkv[l]) {
                double d = slope(p, &c, pl, L, m, &c.kv[l], &c.heads[l], grp_of(bl), 0.5);
                for (int k = 0; k < g->nkv[l]; k++) {
                    double q = kp(g, g->kv_off[l] + k);
                    grad[g->kv_off[l] + k] = d * q * (1 - q);
                }
            }
            if (g->nfg[l]) {
                double d = slope(p, &c, pl, L, m, &c.ffn[l], NULL, 0, 0.5);
                for (int j = 0; j < g->nfg[l]; j++) {
                    double q = kp(g, g->ffn_off[l] + j);
                    grad[g->ffn_off[l] + j] = d * ac_dnas_gsize(bl->ffn, g->fm, j) * q * (1 - q);
                }
            }
            if (g->nex[l] && c.experts) {
                double d = slope(p, &c, pl, L, m, &c.experts[l], NULL, 0, 0.5);
                for (int k = 0; k < g->nex[l]; k++) {
                    double q = kp(g, g->ex_off[l] + k);
                    grad[g->ex_off[l] + k] = d * q * (1 - q);
                }
            }
            if (g->nxg[l] && c.effn) {
                double d = slope(p, &c, pl, L, m, &c.effn[l], NULL, 0, 0.5);
                for (int j = 0; j < g->nxg[l]; j++) {
                    double q = kp(g, g->xg_off[l] + j);
                    grad[g->xg_off[l] + j] = d * ac_dnas_gsize(bl->expert_ffn, g->xfm[l], j) * q * (1 - q);
                }
            }
        }
        /* the model-wide widths: their layers' widths weighted by the layers' keep probabilities */
        if (nsh) wide_grad(g, b, K_SH, slope(p, &c, pl, L, m, &c.shared_ffn, NULL, 0, 0.5), c.shared_ffn, wsh, grad);
        if (npd)
            wide_grad(g, b, K_PD, slope(p, &c, pl, L, m, &c.ssm_head_dim, NULL, 0, 0.5), c.ssm_head_dim, wpd, grad);
        if (nlt) wide_grad(g, b, K_LT, slope(p, &c, pl, L, m, &c.moe_latent, NULL, 0, 0.5), c.moe_latent, wlt, grad);
        if (g->gate_hid) {
            double d = slope(p, &c, pl, L, m, &c.hidden, NULL, 0, 4);
            for (int j = 0; j < g->nhg; j++) {
                double q = kp(g, g->hid_off + j);
                grad[g->hid_off + j] = d * ac_dnas_gsize(g->H, g->hm, j) * q * (1 - q);
            }
        }
    }
    free(pl);
    ac_carch_free(&c);
    return v;
}

json_t *ac_dnas_hyb_expected_json(const ac_dnas_gates *g, const ac_arch *b) {
    ac_carch c;
    if (ac_carch_from_arch(b, &c, NULL)) return NULL;
    json_t *layers = json_array();
    for (int l = 0; l < g->L; l++) {
        const ac_layer_arch *bl = &b->layers[l];
        double p = layer_expect(g, b, l, &c);
        /* the expected widths, the layer's keep probability included (as the dense search reports them) */
        json_t *o = json_pack("{s:s,s:f}", "type", TYPE_NAME[type_of(bl)], "keep", p);
        if (bl->ssm_heads && c.ssm) json_object_set_new(o, "ssm_heads", json_real(p * c.ssm[l]));
        if (bl->n_heads) json_object_set_new(o, "kv_heads", json_real(p * c.kv[l]));
        if (bl->n_heads) json_object_set_new(o, "heads", json_real(p * c.heads[l]));
        if (bl->ffn) json_object_set_new(o, "ffn", json_real(p * c.ffn[l]));
        if (bl->n_experts && c.experts) json_object_set_new(o, "experts", json_real(p * c.experts[l]));
        if (bl->n_experts && c.effn) json_object_set_new(o, "expert_ffn", json_real(p * c.effn[l]));
        json_array_append_new(layers, o);
    }
    int n, st, mx;
    double ws;
    json_t *o = json_pack("{s:f,s:o}", "hidden", hidden_expect(g), "layers", layers);
    if (b->shared_ffn)
        json_object_set_new(o, "shared_ffn", json_real(wide_expect(g, b, K_SH, b->shared_ffn, NULL, &n, &ws, &st, &mx)));
    json_object_set_new(o, "ssm_head_dim", json_real(wide_expect(g, b, K_PD, b->ssm_head_dim, NULL, &n, &ws, &st, &mx)));
    if (b->moe_latent)
        json_object_set_new(o, "moe_latent", json_real(wide_expect(g, b, K_LT, b->moe_latent, NULL, &n, &ws, &st, &mx)));
    ac_carch_free(&c);
    return o;
}

/* ---- discretisation: one width per layer type ---- */

static const double *g_key;
static int desc(const void *x, const void *y) {
    double a = g_key[*(const int *)x], b = g_key[*(const int *)y];
    return a != b ? (a > b ? -1 : 1) : *(const int *)x - *(const int *)y;
}

/* Keep probability of the k-th best (0-based) of n gates at off; 0 past the end. */
static double kth_prob(const ac_dnas_gates *g, int off, int n, int k) {
    if (k < 0 || k >= n) return 0;
    int *idx = malloc(sizeof(int) * n);
    if (!idx) return 0;
    for (int i = 0; i < n; i++) idx[i] = i;
    g_key = g->la + off;
    qsort(idx, n, sizeof(int), desc);
    double q = kp(g, off + idx[k]);
    free(idx);
    return q;
}

/* Keep probability of the best k of n gates at off, summed. */
static double top_mass(const ac_dnas_gates *g, int off, int n, int k) {
    if (k > n) k = n;
    if (k <= 0) return 0;
    int *idx = malloc(sizeof(int) * n);
    if (!idx) return 0;
    for (int i = 0; i < n; i++) idx[i] = i;
    g_key = g->la + off;
    qsort(idx, n, sizeof(int), desc);
    double q = 0;
    for (int i = 0; i < k; i++) q += kp(g, off + idx[i]);
    free(idx);
    return q;
}

/* Sum of the positive relative violations of every limit by k (0: feasible). */
static double violation(const ac_search_problem *p, const ac_cost *k) {
    double v = 0;
    for (const ac_constraint *t = ac_constraint_table(); t < ac_constraint_table() + AC_NCONSTRAINTS; t++) {
        double lim = ac_constraint_limit(t, &p->limits);
        if (lim > 0) v += fmax(0, ac_constraint_g(t, ac_cost_metric(k, t->m), lim));
    }
    return v;
}

static void predict(const ac_search_problem *p, const ac_arch *a, ac_cost *k) {
    ac_carch c;
    memset(k, 0, sizeof *k);
    if (ac_carch_from_arch(a, &c, NULL)) return;
    ac_cost_predict(p->table, &c, p->workload, p->profile, 0, k);
    ac_carch_free(&c);
}

/* The per-type choice: layers kept, and each type's width (Mamba heads per group, KV groups, FFN, experts), the
 * hidden size, and the widths the export holds once for the model (expert width, shared-expert width, Mamba head
 * dim). */
typedef struct {
    char *keep; /* [L] */
    int ssm_pg, kv, ffn, experts, hidden, effn, shared, pdim, latent;
} hchoice;

static void apply(const ac_dnas_gates *g, const ac_arch *b, const hchoice *h, ac_arch *a) {
    for (int l = 0; l < g->L; l++) {
        const ac_layer_arch *bl = &b->layers[l];
        ac_layer_arch *al = &a->layers[l];
        *al = *bl;
        if (!h->keep[l]) {
            *al = (ac_layer_arch){0};
            continue;
        }
        if (g->nsg[l]) al->ssm_heads = h->ssm_pg * groups_of(b);
        if (g->nkv[l]) al->n_kv_heads = h->kv, al->n_heads = h->kv * grp_of(bl);
        if (g->nfg[l]) al->ffn = h->ffn < bl->ffn ? h->ffn : bl->ffn;
        if (g->nex[l]) al->n_experts = h->experts;
        if (g->nxg[l]) al->expert_ffn = h->effn < bl->expert_ffn ? h->effn : bl->expert_ffn;
    }
    a->hidden = h->hidden;
    a->shared_ffn = h->shared;
    a->ssm_head_dim = h->pdim;
    a->moe_latent = h->latent;
}

/* The gate mass a layer's removal turns off (its return turns on): its depth gate's keep probability p times 1 +
 * the keep probabilities of the units h keeps in it (a layer holds many units, a width step one per layer: the
 * repair must not take a whole layer for the price of one unit), so a layer the gates keep costs its units, one
 * they removed (p near 0) almost nothing. */
static double layer_mass(const ac_dnas_gates *g, const ac_arch *b, const hchoice *h, int l) {
    double u = 1 + top_mass(g, g->sg_off[l], g->nsg[l], h->ssm_pg) + top_mass(g, g->kv_off[l], g->nkv[l], h->kv) +
               top_mass(g, g->ffn_off[l], g->nfg[l], (h->ffn + g->fm - 1) / g->fm) +
               top_mass(g, g->ex_off[l], g->nex[l], h->experts);
    int wk[4] = {K_EW, K_SH, K_PD, K_LT}, wv[4] = {h->effn, h->shared, h->pdim, h->latent}, off, step, max;
    for (int i = 0; i < 4; i++) {
        int n = wide_gates(g, b, wk[i], l, &off, &step, &max);
        u += top_mass(g, off, n, (wv[i] + step - 1) / step);
    }
    return kp(g, g->attn_off + l) * u;
}

/* v one grid step of `step` down (sh) or up (to at most max): the next multiple of step. */
static int grid_step(int v, int step, int max, int sh) {
    int kept = (v + step - 1) / step, nv = (kept + (sh ? -1 : 1)) * step;
    return nv > max ? max : nv;
}

/* A greedy move on h, shrinking (dir -1) or growing (+1) (kind k: K_SSM Mamba heads per group, K_KV KV groups,
 * K_FFN, K_EX experts, K_HID hidden, K_EW expert width, K_SH shared-expert width, K_PD Mamba head dim, K_LT latent
 * width, K_DEPTH + t:
 * the weakest kept layer of type t removed, or its strongest removed one put back); returns the keep probability of
 * the gates it turns off (on), or -1 when not possible. */
static double move(const ac_dnas_gates *g, const ac_search_problem *p, hchoice *h, int k, int dir) {
    const ac_arch *b = p->base;
    double mass = 0;
    int any = 0, sh = dir < 0;
    if (k == K_HID) {
        int v = h->hidden + dir * g->hm;
        if (!g->gate_hid || v < g->hm || v > b->hidden) return -1;
        mass = kth_prob(g, g->hid_off, g->nhg, (sh ? h->hidden : v) / g->hm - 1);
        h->hidden = v;
        return mass;
    }
    if (k >= K_DEPTH) {
        int t = k - K_DEPTH, kept = 0, pick = -1;
        for (int l = 0; l < g->L; l++) {
            if (type_of(&b->layers[l]) != t) continue;
            kept += h->keep[l];
            if (h->keep[l] == sh && (pick < 0 || (g->la[g->attn_off + l] < g->la[g->attn_off + pick]) == sh))
                pick = l;
        }
        if (!g->gate_depth || pick < 0 || (sh && kept < 2)) return -1;
        h->keep[pick] = !sh;
        return layer_mass(g, b, h, pick);
    }
    if (k >= K_EW) { /* one width for the model, each layer on its own gates */
        int *v = k == K_EW ? &h->effn : k == K_SH ? &h->shared : k == K_LT ? &h->latent : &h->pdim, nv = -1, off,
            step, max;
        for (int l = 0; l < g->L; l++) {
            int n = h->keep[l] ? wide_gates(g, b, k, l, &off, &step, &max) : 0;
            if (!n) continue;
            mass += kth_prob(g, off, n, (*v + step - 1) / step - sh);
            nv = grid_step(*v, step, max, sh);
            if (nv < (step < max ? step : max) || nv == *v) return -1;
        }
        if (nv < 0) return -1;
        *v = nv;
        return mass;
    }
    for (int l = 0; l < g->L; l++) { /* the unit of each kept layer that goes (or comes back) */
        if (!h->keep[l]) continue;
        if (k == K_SSM && g->nsg[l]) any = 1, mass += kth_prob(g, g->sg_off[l], g->nsg[l], h->ssm_pg - sh);
        if (k == K_KV && g->nkv[l]) any = 1, mass += kth_prob(g, g->kv_off[l], g->nkv[l], h->kv - sh);
        if (k == K_FFN && g->nfg[l])
            any = 1, mass += kth_prob(g, g->ffn_off[l], g->nfg[l], (h->ffn + g->fm - 1) / g->fm - sh);
        if (k == K_EX && g->nex[l]) any = 1, mass += kth_prob(g, g->ex_off[l], g->nex[l], h->experts - sh);
    }
    int max[4] = {0}, lo[4] = {1, 1, g->fm, b->top_k}, *v[4] = {&h->ssm_pg, &h->kv, &h->ffn, &h->experts};
    for (int l = 0; l < g->L; l++) {
        const ac_layer_arch *bl = &b->layers[l];
        if (g->nsg[l] && g->nsg[l] > max[0]) max[0] = g->nsg[l];
        if (g->nkv[l] && bl->n_kv_heads > max[1]) max[1] = bl->n_kv_heads;
        if (g->nfg[l] && bl->ffn > max[2]) max[2] = bl->ffn;
        if (g->nex[l] && bl->n_experts > max[3]) max[3] = bl->n_experts;
    }
    int step = k == K_FFN ? g->fm : 1, nv = *v[k] + dir * step;
    if (k == K_FFN && !sh && nv > max[2]) nv = max[2]; /* the FFN's last group is the remainder */
    if (!any || nv < lo[k] || nv > max[k] || nv == *v[k]) return -1;
    *v[k] = nv;
    return mass;
}

/* wide_expect over the layers keep holds, rounded to its grid (at least one step). */
static int wide_mean(const ac_dnas_gates *g, const ac_arch *b, int k, int base, const char *keep) {
    int n, step, max;
    double ws, m = wide_expect(g, b, k, base, keep, &n, &ws, &step, &max);
    if (!n) return base;
    int v = (int)lround(m / step) * step, lo = step < max ? step : max;
    return v < lo ? lo : v > max ? max : v;
}

/* The greedy on h into r->arch (r->cost, r->feasible set): the shrinking move with the least price per violation
 * removed, until feasible or none helps; then the growing move with the highest price (what it gives back) that
 * stays feasible, while one does. The price: with curves, the move's change of the predicted loss increase
 * (ac_search_pred_loss: the calibration's loss curves), else the gate mass move() returns. depth 0: the widths
 * alone (no layer removed or put back). *hp gets the result. */
static void greedy(const ac_dnas_gates *g, const ac_search_problem *p, hchoice *hp, ac_search_result *r, int curves,
                   int depth) {
    const ac_arch *b = p->base;
    int L = g->L;
    hchoice h = *hp, t;
    apply(g, b, &h, &r->arch);
    predict(p, &r->arch, &r->cost);
    t.keep = malloc(L + 1);
    for (int pass = 0; pass < 2 && t.keep; pass++)
        for (int it = 0; it < 100000; it++) {
            double v0 = violation(p, &r->cost), score = 1e300, q0 = curves ? ac_search_pred_loss(p, &r->arch) : 0;
            if (pass == 0 && v0 <= 1e-12) break;
            if (pass == 1 && v0 > 1e-12) break;
            int bk = -1;
            for (int k = 0; k < (depth ? K_DEPTH + N_TYPES : K_DEPTH); k++) {
                char *keep = t.keep;
                t = h;
                t.keep = keep;
                memcpy(t.keep, h.keep, L);
                double mass = move(g, p, &t, k, pass ? 1 : -1);
                if (mass < 0) continue;
                apply(g, b, &t, &r->arch);
                if (curves) mass = (ac_search_pred_loss(p, &r->arch) - q0) * (pass ? -1 : 1);
                ac_cost ck;
                predict(p, &r->arch, &ck);
                double dv = fmin(v0 - violation(p, &ck), v0); /* (removing more than the violation earns nothing) */
                if (pass == 0 && dv > 1e-12 && (fmax(mass, 0) + 1e-9) / dv < score)
                    score = (fmax(mass, 0) + 1e-9) / dv, bk = k;
                if (pass == 1 && violation(p, &ck) <= 1e-12 && (bk < 0 || -mass < score)) score = -mass, bk = k;
            }
            if (bk < 0) break;
            move(g, p, &h, bk, pass ? 1 : -1);
            apply(g, b, &h, &r->arch);
            predict(p, &r->arch, &r->cost);
        }
    apply(g, b, &h, &r->arch);
    predict(p, &r->arch, &r->cost);
    r->feasible = violation(p, &r->cost) <= 1e-12;
    free(t.keep);
    *hp = h; /* (the same keep array) */
}

/* dst = src, keep copied into dst's own array. */
static void hcopy(hchoice *dst, const hchoice *src, int L) {
    char *keep = dst->keep;
    *dst = *src;
    dst->keep = keep;
    memcpy(keep, src->keep, L);
}

void ac_dnas_hyb_discretise(const ac_dnas_gates *g, const ac_search_problem *p, ac_search_result *r) {
    const ac_arch *b = p->base;
    int L = g->L, n[N_TYPES] = {0}, best[N_TYPES], kept[N_TYPES] = {0};
    double sum[N_TYPES] = {0};
    hchoice h = {.keep = calloc(L + 1, 1), .hidden = b->hidden};
    ac_carch c;
    if (!h.keep || ac_carch_from_arch(b, &c, NULL)) {
        free(h.keep);
        predict(p, &r->arch, &r->cost);
        r->feasible = violation(p, &r->cost) <= 1e-12;
        return;
    }
    for (int k = 0; k < N_TYPES; k++) best[k] = -1;
    for (int l = 0; l < L; l++) { /* each type's mean expected width; its layers with keep probability >= 0.5 */
        int ty = type_of(&b->layers[l]);
        double pl = layer_expect(g, b, l, &c);
        /* kept: its depth gate at least even, and its own width not below half a unit (a layer whose heads, KV
         * groups or channels the gates turned off is removed, not kept to narrow its type's other layers) */
        double w = ty == T_MAMBA ? (c.ssm ? c.ssm[l] : 1) / groups_of(b)
                   : ty == T_ATTN ? c.kv[l]
                   : ty == T_MLP  ? c.ffn[l] / (b->layers[l].ffn < g->fm ? b->layers[l].ffn : g->fm)
                                  : 1;
        h.keep[l] = !g->gate_depth || (pl >= 0.5 && w >= 0.5);
        kept[ty] += h.keep[l];
        if (best[ty] < 0 || g->la[g->attn_off + l] > g->la[g->attn_off + best[ty]]) best[ty] = l;
        n[ty]++;
    }
    for (int k = 0; k < N_TYPES; k++)
        if (n[k] && !kept[k]) h.keep[best[k]] = 1; /* never a type's last layer */
    int nk[N_TYPES] = {0};
    for (int l = 0; l < L; l++) { /* the mean over the layers kept (a removed layer does not set its type's width) */
        int ty = type_of(&b->layers[l]);
        if (!h.keep[l]) continue;
        layer_expect(g, b, l, &c);
        nk[ty]++;
        sum[ty] += ty == T_MAMBA ? (c.ssm ? c.ssm[l] : 0) / groups_of(b)
                   : ty == T_ATTN ? c.kv[l]
                   : ty == T_MLP  ? c.ffn[l]
                                  : (c.experts ? c.experts[l] : 0);
    }
    for (int l = 0; l < L; l++) { /* the widths, on each type's grid */
        const ac_layer_arch *bl = &b->layers[l];
        int ty = type_of(bl);
        double mean = nk[ty] ? sum[ty] / nk[ty] : 0;
        if (ty == T_MAMBA) {
            int hpg = bl->ssm_heads / groups_of(b), v = (int)lround(mean);
            h.ssm_pg = g->nsg[l] ? (v < 1 ? 1 : v > hpg ? hpg : v) : hpg;
        } else if (ty == T_ATTN) {
            int v = (int)lround(mean);
            h.kv = v < 1 ? 1 : v > bl->n_kv_heads ? bl->n_kv_heads : v;
        } else if (ty == T_MLP) {
            int v = ac_dnas_round_grid(mean, g->fm, bl->ffn), lo = bl->ffn < g->fm ? bl->ffn : g->fm;
            h.ffn = v < lo ? lo : v;
        } else {
            int v = (int)lround(mean);
            h.experts = !g->nex[l] ? bl->n_experts : v < b->top_k ? b->top_k : v > bl->n_experts ? bl->n_experts : v;
        }
    }
    int fe = 0; /* the base's expert width (uniform over the MoE layers of a hybrid) */
    for (int l = 0; l < L; l++) fe = b->layers[l].n_experts ? b->layers[l].expert_ffn : fe;
    h.effn = wide_mean(g, b, K_EW, fe, h.keep);
    h.shared = wide_mean(g, b, K_SH, b->shared_ffn, h.keep);
    h.pdim = wide_mean(g, b, K_PD, b->ssm_head_dim, h.keep);
    h.latent = wide_mean(g, b, K_LT, b->moe_latent, h.keep);
    if (g->gate_hid) {
        int v = (int)lround(hidden_expect(g) / g->hm) * g->hm;
        h.hidden = v < g->hm ? g->hm : v > b->hidden ? b->hidden : v;
    }
    ac_carch_free(&c);
    greedy(g, p, &h, r, 0, 1);
    free(h.keep);
}

void ac_dnas_hyb_greedy_curves(const ac_dnas_gates *g, const ac_search_problem *p, ac_search_result *r) {
    const ac_arch *b = p->base;
    hchoice h = {.keep = malloc(g->L + 1), .hidden = b->hidden, .shared = b->shared_ffn, .pdim = b->ssm_head_dim,
                 .latent = b->moe_latent, .experts = b->top_k};
    if (!h.keep) {
        predict(p, &r->arch, &r->cost);
        r->feasible = violation(p, &r->cost) <= 1e-12;
        return;
    }
    memset(h.keep, 1, g->L);
    for (int l = 0; l < g->L; l++) { /* every unit kept: each type's base width (one per type in a hybrid) */
        const ac_layer_arch *bl = &b->layers[l];
        if (g->nsg[l]) h.ssm_pg = g->nsg[l];
        if (bl->n_heads) h.kv = bl->n_kv_heads;
        if (bl->ffn > h.ffn) h.ffn = bl->ffn;
        if (bl->n_experts) h.experts = bl->n_experts, h.effn = bl->expert_ffn;
    }
    greedy(g, p, &h, r, 1, 1);
    /* local search: each single move (either way) and each pair of layer moves from the result, then the greedy
     * again (shrink to feasible, grow while feasible; after a layer move, the widths alone); the best feasible
     * result by predicted loss is kept, until no move improves it. It finds what one-step prices miss: a whole
     * layer removed so that the widths grow back (a layer frees many parameters at once, which the shrink phase,
     * pricing per unit of violation removed up to the violation, does not prefer). */
    hchoice t = {.keep = malloc(g->L + 1)}, best = {.keep = malloc(g->L + 1)};
    double q = r->feasible ? ac_search_pred_loss(p, &r->arch) : INFINITY;
    for (int it = 0, better = 1; better && it < 64 && t.keep && best.keep; it++) {
        better = 0;
        hcopy(&best, &h, g->L);
        /* the perturbations: one move of any kind either way (i < NM), or two layer moves (NM <= i: the pair
         * (a, b) of the 2 N_TYPES layer moves, a <= b: two layers of types removed, or one removed and one put back) */
        enum { NM = 2 * (K_DEPTH + N_TYPES), ND = 2 * N_TYPES };
        for (int i = 0; i < NM + ND * ND; i++) {
            int a = i < NM ? i : 2 * K_DEPTH + (i - NM) / ND, c = i < NM ? -1 : 2 * K_DEPTH + (i - NM) % ND;
            if (c >= 0 && c < a) continue;
            hcopy(&t, &h, g->L);
            if (move(g, p, &t, a / 2, a % 2 ? 1 : -1) < 0 || (c >= 0 && move(g, p, &t, c / 2, c % 2 ? 1 : -1) < 0))
                continue;
            greedy(g, p, &t, r, 1, a / 2 < K_DEPTH); /* (after a layer's move the widths alone: not it undone) */
            double qt = r->feasible ? ac_search_pred_loss(p, &r->arch) : INFINITY;
            if (qt < q - 1e-12) q = qt, hcopy(&best, &t, g->L), better = 1;
        }
        hcopy(&h, &best, g->L);
    }
    apply(g, b, &h, &r->arch);
    predict(p, &r->arch, &r->cost);
    r->feasible = violation(p, &r->cost) <= 1e-12;
    free(t.keep);
    free(best.keep);
    free(h.keep);
}

/* From start (Minitron's structure; NULL: every unit kept): its kept units on (log_alpha 2), the others off (-3),
 * as dnas.c starts a dense model from the surrogate's structure; plus under 0.01 by importance rank within each set
 * of gates (KV groups, Mamba slots, FFN and hidden groups, experts, layers by block influence): where the network's
 * gradient does not tell units apart, the gates keep the importance order Minitron prunes by. */
void ac_dnas_hyb_init(ac_dnas_gates *g, const ac_arch *b, const ac_arch *start, const ac_importance *imp) {
    const double on = 2.0, off = -3.0;
    for (int i = 0; i < g->np; i++) g->la[i] = on;
    for (int l = 0; l < g->L; l++) {
        const ac_layer_arch *sl = start ? &start->layers[l] : &b->layers[l];
        int kept = sl->n_heads || sl->ffn || sl->ssm_heads || sl->n_experts;
        const int *eo = imp->expert_order ? imp->expert_order[l] : NULL;
        if (g->gate_depth) g->la[g->attn_off + l] = kept ? on : off;
        for (int r = 0; r < g->nkv[l]; r++) {
            int i = g->kv_off[l] + (imp->kv_order ? imp->kv_order[l][r] : r);
            g->la[i] = (kept && r < sl->n_kv_heads ? on : off) + 0.01 * (g->nkv[l] - r) / g->nkv[l];
        }
        for (int j = 0; j < g->nsg[l]; j++)
            g->la[g->sg_off[l] + j] =
                (kept && j < sl->ssm_heads / groups_of(b) ? on : off) + 0.01 * (g->nsg[l] - j) / g->nsg[l];
        for (int j = 0; j < g->nfg[l]; j++)
            g->la[g->ffn_off[l] + j] = (kept && j * g->fm < sl->ffn ? on : off) + 0.01 * (g->nfg[l] - j) / g->nfg[l];
        for (int r = 0; r < g->nex[l]; r++)
            g->la[g->ex_off[l] + (eo ? eo[r] : r)] =
                (kept && r < sl->n_experts ? on : off) + 0.01 * (g->nex[l] - r) / g->nex[l];
        for (int j = 0; j < g->nxg[l]; j++) /* expert width, shared width: groups of each ranking */
            g->la[g->xg_off[l] + j] =
                (kept && j * g->xfm[l] < sl->expert_ffn ? on : off) + 0.01 * (g->nxg[l] - j) / g->nxg[l];
        int Fs = start ? start->shared_ffn : b->shared_ffn, P = start ? start->ssm_head_dim : b->ssm_head_dim;
        int Lt = start ? start->moe_latent : b->moe_latent;
        for (int j = 0; j < g->nshg[l]; j++)
            g->la[g->shg_off[l] + j] = (kept && j * g->shm < Fs ? on : off) + 0.01 * (g->nshg[l] - j) / g->nshg[l];
        for (int j = 0; j < g->nltg[l]; j++)
            g->la[g->ltg_off[l] + j] = (kept && j * g->ltm < Lt ? on : off) + 0.01 * (g->nltg[l] - j) / g->nltg[l];
        int *dord = g->npd[l] ? malloc(sizeof(int) * g->npd[l]) : NULL; /* head dims: their rank over the heads */
        for (int r = 0; dord && r < g->npd[l]; r++) dord[r] = r;
        if (dord) ac_ssm_dim_order(b, imp, l, dord);
        for (int r = 0; dord && r < g->npd[l]; r++)
            g->la[g->pd_off[l] + dord[r]] = (kept && r < P ? on : off) + 0.01 * (g->npd[l] - r) / g->npd[l];
        free(dord);
    }
    int H = start ? start->hidden : b->hidden;
    for (int j = 0; j < g->nhg; j++) g->la[g->hid_off + j] = (j * g->hm < H ? on : off) + 0.01 * (g->nhg - j) / g->nhg;
    for (int l = 0; g->gate_depth && imp->layer_bi && l < g->L; l++) { /* a layer's rank by block influence */
        int r = 0;
        for (int k = 0; k < g->L; k++) r += imp->layer_bi[k] > imp->layer_bi[l];
        g->la[g->attn_off + l] += 0.01 * (g->L - r) / g->L;
    }
}
