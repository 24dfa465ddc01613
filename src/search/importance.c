/* importance.c - see importance.h. */
#include "importance.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "eval.h"
#include "prune.h"

static const double SENS_R[AC_SENS_POINTS] = {0, 0.25, 0.5, 0.75, 1.0};

void ac_importance_free(ac_importance *imp) {
    for (int l = 0; l < imp->n_layers; l++) {
        if (imp->kv_order) {
            free(imp->kv_order[l]);
            free(imp->kv_score[l]);
        }
        if (imp->ffn_order) {
            free(imp->ffn_order[l]);
            free(imp->ffn_score[l]);
        }
    }
    free(imp->kv_order);
    free(imp->kv_score);
    free(imp->ffn_order);
    free(imp->ffn_score);
    free(imp->hid_order);
    free(imp->hid_score);
    free(imp->layer_bi);
    free(imp->attn_sens);
    free(imp->ffn_sens);
    free(imp->merge_n);
    free(imp->merge_r);
    free(imp->merge_sens);
    for (int l = 0; l < imp->n_layers; l++) {
        if (imp->head_order) {
            free(imp->head_order[l]);
            free(imp->head_score[l]);
        }
        if (imp->mt_ffn_order) {
            free(imp->mt_ffn_order[l]);
            free(imp->mt_ffn_score[l]);
        }
    }
    free(imp->head_order);
    free(imp->head_score);
    free(imp->mt_ffn_order);
    free(imp->mt_ffn_score);
    free(imp->mt_hid_order);
    free(imp->mt_hid_score);
    memset(imp, 0, sizeof *imp);
}

static const double *sort_key;
static int by_score_desc(const void *a, const void *b) {
    double x = sort_key[*(const int *)a], y = sort_key[*(const int *)b];
    if (x != y) return x > y ? -1 : 1;
    return *(const int *)a - *(const int *)b;
}

/* order[] = indices of s sorted by score, best first; sorted scores out. */
static int rank(const double *s, int n, int **order, double **sorted) {
    *order = malloc(sizeof(int) * (n + 1));
    *sorted = malloc(sizeof(double) * (n + 1));
    if (!*order || !*sorted) return -1;
    for (int i = 0; i < n; i++) (*order)[i] = i;
    sort_key = s;
    qsort(*order, n, sizeof(int), by_score_desc);
    for (int i = 0; i < n; i++) (*sorted)[i] = s[(*order)[i]];
    return 0;
}

static double curve(const double *pts, double r) {
    if (r <= 0) return 0;
    if (r >= 1) return pts[AC_SENS_POINTS - 1];
    int i = (int)(r * (AC_SENS_POINTS - 1));
    double u = r * (AC_SENS_POINTS - 1) - i;
    return pts[i] + (pts[i + 1] - pts[i]) * u;
}

double ac_sens_attn(const ac_importance *imp, int l, double r) { return curve(imp->attn_sens[l], r); }
double ac_sens_ffn(const ac_importance *imp, int l, double r) { return curve(imp->ffn_sens[l], r); }

double ac_sens_hidden(const ac_importance *imp, double r) {
    if (r <= 0) return 0;
    double px = 0, py = 0;
    for (int i = 0; i < 4; i++) {
        if (r <= imp->hid_frac[i]) return py + (imp->hid_sens[i] - py) * (r - px) / (imp->hid_frac[i] - px);
        px = imp->hid_frac[i];
        py = imp->hid_sens[i];
    }
    return py * r / px; /* beyond the last point: linear */
}

double ac_sens_merge(const ac_importance *imp, int l, double r) {
    if (r <= 0 || !imp->merge_n) return 0;
    double px = 0, py = 0;
    for (int i = 0; i < imp->merge_n[l]; i++) {
        if (r <= imp->merge_r[l][i]) return py + (imp->merge_sens[l][i] - py) * (r - px) / (imp->merge_r[l][i] - px);
        px = imp->merge_r[l][i];
        py = imp->merge_sens[l][i];
    }
    return py; /* merging can never go below one KV head */
}

/* Minitron's importance from the mt_* statistics (see importance.h). */
static int minitron_scores(const ac_stats *st, const ac_arch *a, ac_importance *imp, ac_err *e) {
    int L = a->n_layers, H = a->hidden, hd = a->head_dim;
    imp->head_order = calloc(L, sizeof(int *));
    imp->head_score = calloc(L, sizeof(double *));
    imp->mt_ffn_order = calloc(L, sizeof(int *));
    imp->mt_ffn_score = calloc(L, sizeof(double *));
    double *hs = calloc(H, sizeof(double));
    if (!imp->head_order || !imp->head_score || !imp->mt_ffn_order || !imp->mt_ffn_score || !hs) { free(hs); return ac_errf(e, "out of memory"); }
    for (int l = 0; l < L; l++) {
        const ac_layer_arch *la = &a->layers[l];
        int nh = la->n_heads, grp = nh ? nh / la->n_kv_heads : 1, F = la->ffn;
        imp->head_order[l] = malloc(sizeof(int) * (nh + 1));
        imp->head_score[l] = malloc(sizeof(double) * (nh + 1));
        double *fs = malloc(sizeof(double) * (F + 1));
        if (!imp->head_order[l] || !imp->head_score[l] || !fs) { free(fs); free(hs); return ac_errf(e, "out of memory"); }
        for (int h = 0; h < nh; h++) { /* L2 over the head's channels of the per-channel L2 */
            double s = 0;
            for (int i = 0; i < hd; i++) s += st->mt_attn[l][h * hd + i];
            imp->head_score[l][h] = sqrt(s);
        }
        for (int g = 0; nh && g < la->n_kv_heads; g++) { /* ranked within the group */
            int *o;
            double *so;
            if (rank(imp->head_score[l] + g * grp, grp, &o, &so)) { free(o); free(so); free(fs); free(hs); return ac_errf(e, "out of memory"); }
            for (int j = 0; j < grp; j++) imp->head_order[l][g * grp + j] = g * grp + o[j];
            free(o);
            free(so);
        }
        for (int c = 0; c < F; c++) fs[c] = sqrt(st->mt_ffn[l][c]);
        int rc = rank(fs, F, &imp->mt_ffn_order[l], &imp->mt_ffn_score[l]);
        free(fs);
        if (rc) { free(hs); return ac_errf(e, "out of memory"); }
        for (int c = 0; c < H; c++) /* only the norms that feed a sub-block are hooked */
            hs[c] += (nh ? sqrt(st->mt_norm[2 * l][c]) : 0) + (F ? sqrt(st->mt_norm[2 * l + 1][c]) : 0);
    }
    int rc = rank(hs, H, &imp->mt_hid_order, &imp->mt_hid_score);
    free(hs);
    return rc ? ac_errf(e, "out of memory") : 0;
}

/* Calibration loss on a scorer (an engine kept for the source model) or,
 * sc NULL, on a fresh engine for m (CUDA when cuda). */
static int calib_loss(ac_scorer *sc, const ac_model *m, int cuda, const int *ids, size_t n, int ctx, int windows,
                      double *loss, ac_err *e) {
    ac_ppl_opts o = {.ctx = ctx, .stride = 0, .max_windows = windows, .batch = 4, .cuda = cuda};
    ac_ppl_result r;
    if (sc ? ac_scorer_perplexity(sc, ids, n, &o, NULL, NULL, &r, e)
           : ac_perplexity(m, ids, n, &o, NULL, NULL, NULL, &r, e))
        return -1;
    *loss = r.nll;
    return 0;
}

/* Calibration loss of the source model pruned (or KV-merged) to arch t. */
static int pruned_loss(const ac_model *m, int cuda, const ac_arch *t, const ac_importance *imp, const int *ids,
                       size_t n, int ctx, int sw, double *loss, ac_err *e) {
    ac_model pm;
    if (ac_prune(m, t, imp, &pm, e)) return -1;
    int rc = calib_loss(NULL, &pm, cuda, ids, n, ctx, sw, loss, e);
    ac_model_free(&pm);
    return rc;
}

/* Make the curve monotone non-decreasing from 0 (removal never helps in the
 * model, even when noise says it does). */
static void monotone(double *p) {
    p[0] = 0;
    for (int i = 1; i < AC_SENS_POINTS; i++)
        if (p[i] < p[i - 1]) p[i] = p[i - 1];
}

/* Loss increase when the lowest-ranked SENS_R[p] of a matrix's units are
 * removed: zeroing the W[rows, cols] columns of a unit (width uw columns,
 * units ordered by `order`, best first) is exactly removing it from the
 * layer's output projection. W (matrix `which` of `layer`, scored by sc) is
 * restored before return. */
static int sens_curve(ac_scorer *sc, int layer, ac_wmat which, const int *ids, size_t n, int ctx, int sw, double base,
                      float *W, int rows, int cols, const int *order, int units, int uw, double *curve, ac_err *e) {
    size_t nb = (size_t)rows * cols;
    float *bk = malloc(nb * 4);
    if (!bk) return ac_errf(e, "out of memory");
    memcpy(bk, W, nb * 4);
    int rc = 0;
    for (int p = 1; p < AC_SENS_POINTS && !rc; p++) {
        int drop = (int)lround(SENS_R[p] * units);
        memcpy(W, bk, nb * 4);
        for (int k = units - drop; k < units; k++)
            for (int r = 0; r < rows; r++) memset(W + (size_t)r * cols + (size_t)order[k] * uw, 0, (size_t)uw * 4);
        double lo = 0;
        rc =
            ac_scorer_weights_changed(sc, layer, which, e) || calib_loss(sc, NULL, 0, ids, n, ctx, sw, &lo, e) ? -1 : 0;
        curve[p] = lo - base;
    }
    memcpy(W, bk, nb * 4);
    free(bk);
    if (!rc) rc = ac_scorer_weights_changed(sc, layer, which, e);
    monotone(curve);
    return rc;
}

/* The passes after the statistics share these. */
typedef struct {
    ac_model *m;
    const int *ids;
    size_t n;
    int ctx, sw, cuda; /* window length, windows per loss, loss passes on the GPU */
    ac_progress_fn progress;
    void *ud;
    ac_importance *imp;
    double base; /* calibration loss of the unpruned model */
} calib;

/* Rank KV groups and FFN channels per layer, and hidden channels, from
 * the activation statistics; block-influence scores of the layers. */
static int rank_units(const ac_model *m, const ac_stats *st, ac_importance *imp, ac_err *e) {
    const ac_arch *a = &m->a;
    int L = a->n_layers, H = a->hidden;
    for (int l = 0; l < L; l++) {
        const ac_layer_arch *la = &a->layers[l];
        imp->layer_bi[l] = st->layer[l] / (double)st->tokens;
        int G = la->n_kv_heads, grp = la->n_heads ? la->n_heads / la->n_kv_heads : 1, F = la->ffn;
        double *gs = calloc(G + 1, sizeof(double)), *fs = calloc(F + 1, sizeof(double));
        int rc = gs && fs ? 0 : -1;
        for (int h = 0; !rc && h < la->n_heads; h++) gs[h / grp] += sqrt(st->head[l][h] / (double)st->tokens);
        for (int c = 0; !rc && c < F; c++) {
            double wn = 0;
            for (int r = 0; r < H; r++) wn += (double)m->L[l].wd[(size_t)r * F + c] * m->L[l].wd[(size_t)r * F + c];
            fs[c] = st->ffn[l][c] / (double)st->tokens * sqrt(wn);
        }
        if (!rc)
            rc = rank(gs, G, &imp->kv_order[l], &imp->kv_score[l]) ||
                 rank(fs, F, &imp->ffn_order[l], &imp->ffn_score[l]);
        free(gs);
        free(fs);
        if (rc) return ac_errf(e, "out of memory");
    }
    double *hs = calloc(H, sizeof(double));
    int rc = hs ? 0 : -1;
    for (int i = 0; !rc && i < H; i++) hs[i] = st->hidden_a[i];
    if (!rc) rc = rank(hs, H, &imp->hid_order, &imp->hid_score);
    free(hs);
    return rc ? ac_errf(e, "out of memory") : 0;
}

/* Sensitivity: zero the o_proj columns of removed heads (exactly
 * equivalent to removing them) or the down_proj columns of removed FFN
 * channels, measure, restore. Sets c->base. */
static int masking_sensitivity(calib *c, ac_err *e) {
    const ac_arch *a = &c->m->a;
    int L = a->n_layers, H = a->hidden, hd = a->head_dim;
    ac_scorer *sc; /* the source model's engine for the masking passes */
    if (ac_scorer_open(c->m, 4, c->ctx, c->cuda, NULL, &sc, e)) return -1;
    int rc = calib_loss(sc, NULL, 0, c->ids, c->n, c->ctx, c->sw, &c->base, e);
    int total = 2 * L + 1, done = 0;
    for (int l = 0; l < L && !rc; l++) {
        const ac_layer_arch *la = &a->layers[l];
        ac_layer_w *w = &c->m->L[l];
        if (la->n_heads) {
            /* a KV group's query heads are adjacent: grp*hd o_proj columns */
            int grp = la->n_heads / la->n_kv_heads;
            rc = sens_curve(sc, l, AC_W_O, c->ids, c->n, c->ctx, c->sw, c->base, w->wo, H, la->n_heads * hd,
                            c->imp->kv_order[l], la->n_kv_heads, grp * hd, c->imp->attn_sens[l], e);
        }
        if (c->progress) c->progress(c->ud, "sensitivity", (double)++done / total);
        if (la->ffn && !rc)
            rc = sens_curve(sc, l, AC_W_D, c->ids, c->n, c->ctx, c->sw, c->base, w->wd, H, la->ffn,
                            c->imp->ffn_order[l], la->ffn, 1, c->imp->ffn_sens[l], e);
        if (c->progress) c->progress(c->ud, "sensitivity", (double)++done / total);
    }
    ac_scorer_close(sc); /* pruned models get engines of their own */
    return rc;
}

/* Calibration loss of the model pruned to t, minus the base loss. */
static int pruned_increase(calib *c, const ac_arch *t, double *inc, ac_err *e) {
    double lo = 0;
    if (pruned_loss(c->m, c->cuda, t, c->imp, c->ids, c->n, c->ctx, c->sw, &lo, e)) return -1;
    *inc = lo - c->base;
    return 0;
}

/* Hidden width: real pruning (RMSNorm statistics change, so masking is
 * not equivalent). */
static int hidden_sensitivity(calib *c, ac_err *e) {
    static const double HF[4] = {0.125, 0.25, 0.5, 0.75};
    const ac_arch *a = &c->m->a;
    for (int i = 0; i < 4; i++) {
        ac_arch t;
        double inc;
        if (ac_arch_copy(&t, a, e)) return -1;
        t.hidden = a->hidden - (int)lround(HF[i] * a->hidden);
        int rc = pruned_increase(c, &t, &inc, e);
        ac_arch_free(&t);
        if (rc) return -1;
        c->imp->hid_frac[i] = HF[i];
        c->imp->hid_sens[i] = fmax(inc, i ? c->imp->hid_sens[i - 1] : 0);
    }
    return 0;
}

/* KV merging: each divisor of the layer's KV count, largest first. */
static int merge_sensitivity(calib *c, ac_err *e) {
    const ac_arch *a = &c->m->a;
    ac_importance *imp = c->imp;
    int L = a->n_layers;
    imp->merge_n = calloc(L, sizeof(int));
    imp->merge_r = calloc(L, sizeof *imp->merge_r);
    imp->merge_sens = calloc(L, sizeof *imp->merge_sens);
    if (!imp->merge_n || !imp->merge_r || !imp->merge_sens) return ac_errf(e, "out of memory");
    for (int l = 0; l < L; l++) {
        int kv = a->layers[l].n_kv_heads;
        for (int d = kv - 1; d >= 1 && imp->merge_n[l] < 8; d--) {
            if (kv % d) continue;
            ac_arch t;
            double inc;
            if (ac_arch_copy(&t, a, e)) return -1;
            t.layers[l].n_kv_heads = d;
            int rc = pruned_increase(c, &t, &inc, e);
            ac_arch_free(&t);
            if (rc) return -1;
            int k = imp->merge_n[l]++;
            imp->merge_r[l][k] = 1.0 - (double)d / kv;
            imp->merge_sens[l][k] = fmax(inc, k ? imp->merge_sens[l][k - 1] : 0);
        }
    }
    return 0;
}

int ac_importance_compute(ac_model *m, const int *ids, size_t n, int ctx, int windows, int cuda,
                          ac_progress_fn progress, void *ud, ac_importance *imp, ac_err *e) {
    memset(imp, 0, sizeof *imp);
    const ac_arch *a = &m->a;
    int L = a->n_layers;
    imp->n_layers = L;
    imp->hidden = a->hidden;
    ac_stats st;
    if (ac_stats_init(&st, a, e)) return -1;
    if (ac_stats_want_minitron(&st, a, e)) {
        ac_stats_free(&st);
        return -1;
    }
    ac_ppl_opts o = {.ctx = ctx, .stride = 0, .max_windows = windows, .batch = 4};
    ac_ppl_result pr;
    if (progress) progress(ud, "activation statistics", 0);
    if (ac_perplexity(m, ids, n, &o, &st, NULL, NULL, &pr, e)) {
        ac_stats_free(&st);
        return -1;
    }
    imp->base_loss = pr.nll;
    imp->tokens = st.tokens;
    imp->kv_order = calloc(L, sizeof(int *));
    imp->kv_score = calloc(L, sizeof(double *));
    imp->ffn_order = calloc(L, sizeof(int *));
    imp->ffn_score = calloc(L, sizeof(double *));
    imp->layer_bi = calloc(L, sizeof(double));
    imp->attn_sens = calloc(L, sizeof *imp->attn_sens);
    imp->ffn_sens = calloc(L, sizeof *imp->ffn_sens);
    int rc = imp->kv_order && imp->kv_score && imp->ffn_order && imp->ffn_score && imp->layer_bi && imp->attn_sens &&
                     imp->ffn_sens
                 ? rank_units(m, &st, imp, e)
                 : ac_errf(e, "out of memory");
    if (!rc) rc = minitron_scores(&st, a, imp, e);
    ac_stats_free(&st);
    calib c = {m, ids, n, ctx, windows < 8 ? windows : 8, cuda, progress, ud, imp, 0};
    if (!rc) rc = masking_sensitivity(&c, e) || hidden_sensitivity(&c, e) || merge_sensitivity(&c, e) ? -1 : 0;
    if (!rc && progress) progress(ud, "sensitivity", 1.0);
    if (rc) ac_importance_free(imp);
    return rc;
}

json_t *ac_importance_to_json(const ac_importance *imp) {
    json_t *layers = json_array();
    for (int l = 0; l < imp->n_layers; l++) {
        json_t *as = json_array(), *fs = json_array();
        for (int p = 0; p < AC_SENS_POINTS; p++) {
            json_array_append_new(as, json_real(imp->attn_sens[l][p]));
            json_array_append_new(fs, json_real(imp->ffn_sens[l][p]));
        }
        json_t *ms = json_array();
        for (int k = 0; imp->merge_n && k < imp->merge_n[l]; k++)
            json_array_append_new(ms, json_pack("[f,f]", imp->merge_r[l][k], imp->merge_sens[l][k]));
        json_array_append_new(layers,
                              json_pack("{s:f,s:o,s:o,s:o}", "block_influence", imp->layer_bi[l],
                                        "attention_loss_curve", as, "ffn_loss_curve", fs, "kv_merge_loss_curve", ms));
    }
    json_t *hs = json_array();
    for (int i = 0; i < 4; i++) json_array_append_new(hs, json_pack("[f,f]", imp->hid_frac[i], imp->hid_sens[i]));
    return json_pack("{s:f,s:I,s:o,s:o,s:[f,f,f,f,f]}", "base_loss", imp->base_loss, "tokens", (json_int_t)imp->tokens,
                     "layers", layers, "hidden_loss_curve", hs, "removed_fractions", 0.0, 0.25, 0.5, 0.75, 1.0);
}
