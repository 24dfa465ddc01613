/* importance.c - see importance.h. */
#include "search/importance.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "runtime/engine.h"
#include "runtime/eval.h"
#include "runtime/kernels_cpu.h"
#include "moe_importance_int.h"
#include "ssm_curves_int.h"
#include "search/slice.h"
#include "search/stats.h"
#include "search/ssm_prune.h"
#include "search/stream.h"

static const double SENS_R[AC_SENS_POINTS] = {0, 0.25, 0.5, 0.75, 1.0};

void ac_importance_free(ac_importance *imp) {
    for (int l = 0; l < imp->n_layers; l++) {
        if (imp->expert_order) free(imp->expert_order[l]);
        if (imp->expert_score) free(imp->expert_score[l]);
        if (imp->echan_order) free(imp->echan_order[l]);
        if (imp->echan_score) free(imp->echan_score[l]);
        if (imp->kv_order) {
            free(imp->kv_order[l]);
            free(imp->kv_score[l]);
        }
        if (imp->ffn_order) {
            free(imp->ffn_order[l]);
            free(imp->ffn_score[l]);
        }
    }
    free(imp->expert_order);
    free(imp->expert_score);
    free(imp->echan_order);
    free(imp->echan_score);
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
    free(imp->ssm_sens);
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
    for (int l = 0; imp->ssm_head_order && l < imp->n_layers; l++) {
        free(imp->ssm_head_order[l]);
        free(imp->ssm_head_score[l]);
        if (imp->ssm_chan_score) free(imp->ssm_chan_score[l]);
    }
    for (int l = 0; imp->sh_order && l < imp->n_layers; l++) {
        free(imp->sh_order[l]);
        if (imp->sh_score) free(imp->sh_score[l]);
    }
    free(imp->sh_order);
    free(imp->sh_score);
    for (int l = 0; imp->ssm_dim_order && l < imp->n_layers; l++) free(imp->ssm_dim_order[l]);
    free(imp->ssm_dim_order);
    for (int l = 0; imp->lat_order && l < imp->n_layers; l++) free(imp->lat_order[l]);
    free(imp->lat_order);
    free(imp->ssm_head_order);
    free(imp->ssm_head_score);
    free(imp->ssm_chan_score);
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
double ac_sens_experts(const ac_importance *imp, const ac_arch *base, int l, double kept) {
    double removable = base->layers[l].n_experts - base->top_k;
    if (removable <= 0) return 0;
    double r = (base->layers[l].n_experts - kept) / removable;
    return curve(imp->ffn_sens[l], r < 0 ? 0 : r > 1 ? 1 : r);
}

double ac_sens_hidden(const ac_importance *imp, double r) {
    if (r <= 0) return 0;
    double px = 0, py = 0;
    for (int i = 0; i < 4; i++) {
        if (r <= imp->hid_frac[i]) return py + (imp->hid_sens[i] - py) * (r - px) / (imp->hid_frac[i] - px);
        px = imp->hid_frac[i];
        py = imp->hid_sens[i];
    }
    return px > 0 ? py * r / px : 0; /* beyond the last point: linear; no points: none */
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

double ac_sens_ssm(const ac_importance *imp, int l, double r) { return imp->ssm_sens ? curve(imp->ssm_sens[l], r) : 0; }

/* Minitron's importance from the mt_* statistics (see importance.h). */
static int minitron_scores(const ac_stats *st, const ac_arch *a, ac_importance *imp, ac_err *e) {
    int L = a->n_layers, H = a->hidden, hd = a->head_dim;
    imp->head_order = calloc(L, sizeof(int *));
    imp->head_score = calloc(L, sizeof(double *));
    imp->mt_ffn_order = calloc(L, sizeof(int *));
    imp->mt_ffn_score = calloc(L, sizeof(double *));
    double *hs = calloc(H, sizeof(double));
    if (!imp->head_order || !imp->head_score || !imp->mt_ffn_order || !imp->mt_ffn_score || !hs) {
        free(hs);
        return ac_errf(e, "out of memory");
    }
    for (int l = 0; l < L; l++) {
        const ac_layer_arch *la = &a->layers[l];
        int nh = la->n_heads, grp = nh ? nh / la->n_kv_heads : 1, F = la->ffn;
        imp->head_order[l] = malloc(sizeof(int) * (nh + 1));
        imp->head_score[l] = malloc(sizeof(double) * (nh + 1));
        double *fs = malloc(sizeof(double) * (F + 1));
        if (!imp->head_order[l] || !imp->head_score[l] || !fs) {
            free(fs);
            free(hs);
            return ac_errf(e, "out of memory");
        }
        for (int h = 0; h < nh; h++) { /* L2 over the head's channels of the per-channel L2 */
            double s = 0;
            for (int i = 0; i < hd; i++) s += st->mt_attn[l][h * hd + i];
            imp->head_score[l][h] = sqrt(s);
        }
        for (int g = 0; nh && g < la->n_kv_heads; g++) { /* ranked within the group */
            int *o;
            double *so;
            if (rank(imp->head_score[l] + g * grp, grp, &o, &so)) {
                free(o);
                free(so);
                free(fs);
                free(hs);
                return ac_errf(e, "out of memory");
            }
            for (int j = 0; j < grp; j++) imp->head_order[l][g * grp + j] = g * grp + o[j];
            free(o);
            free(so);
        }
        for (int c = 0; c < F; c++) fs[c] = sqrt(st->mt_ffn[l][c]);
        int rc = rank(fs, F, &imp->mt_ffn_order[l], &imp->mt_ffn_score[l]);
        free(fs);
        if (rc) {
            free(hs);
            return ac_errf(e, "out of memory");
        }
        /* only the norms that feed a sub-block are hooked (nemotron_h: a Mamba layer's in slot 0, an MoE's in 1) */
        int in = nh || la->ssm_heads, post = F || (a->hybrid && la->n_experts);
        for (int c = 0; c < H; c++)
            hs[c] += (in ? sqrt(st->mt_norm[2 * l][c]) : 0) + (post ? sqrt(st->mt_norm[2 * l + 1][c]) : 0);
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
 * layer's output projection. *slot is the model's pointer to that matrix
 * (matrix `which` of `layer`, scored by sc), in the model's weight dtype
 * (wdt: fp32, or BF16/F16 inside a resident model's read-only mapping). The
 * matrix is never edited: each point zeroes columns of a private copy in
 * the same dtype (zero bits are +0 in all three), *slot points at the copy
 * while the point is scored, and the original pointer is put back before
 * return, on errors too. One matrix is copied at a time, never the model. */
static int sens_curve(ac_scorer *sc, int layer, ac_wmat which, const int *ids, size_t n, int ctx, int sw, double base,
                      float **slot, int wdt, int rows, int cols, const int *order, int units, int uw, double *curve,
                      ac_err *e) {
    size_t es = st_dtype_size((st_dtype)wdt), nb = (size_t)rows * cols * es;
    float *orig = *slot;
    unsigned char *cp = malloc(nb);
    if (!cp) return ac_errf(e, "out of memory for a copy of layer %d's matrix (%zu bytes)", layer, nb);
    int rc = 0;
    for (int p = 1; p < AC_SENS_POINTS && !rc; p++) {
        int drop = (int)lround(SENS_R[p] * units);
        memcpy(cp, orig, nb);
        for (int k = units - drop; k < units; k++)
            for (int r = 0; r < rows; r++) memset(cp + ((size_t)r * cols + (size_t)order[k] * uw) * es, 0, uw * es);
        double lo = 0;
        *slot = (float *)cp;
        rc =
            ac_scorer_weights_changed(sc, layer, which, e) || calib_loss(sc, NULL, 0, ids, n, ctx, sw, &lo, e) ? -1 : 0;
        curve[p] = lo - base;
    }
    *slot = orig;
    ac_err e2;
    int rc2 = ac_scorer_weights_changed(sc, layer, which, rc ? &e2 : e); /* the first error is the one reported */
    free(cp);
    monotone(curve);
    return rc || rc2 ? -1 : 0;
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

/* Rank layer l's KV groups and FFN channels from the activation
 * statistics; its block-influence score. */
static int rank_layer(const ac_model *m, const ac_stats *st, int l, ac_importance *imp, ac_err *e) {
    const ac_arch *a = &m->a;
    int H = a->hidden;
    const ac_layer_arch *la = &a->layers[l];
    imp->layer_bi[l] = st->layer[l] / (double)st->tokens;
    int G = la->n_kv_heads, grp = la->n_heads ? la->n_heads / la->n_kv_heads : 1, F = la->ffn;
    double *gs = calloc(G + 1, sizeof(double)), *fs = calloc(F + 1, sizeof(double));
    int rc = gs && fs ? 0 : -1;
    for (int h = 0; !rc && h < la->n_heads; h++) gs[h / grp] += sqrt(st->head[l][h] / (double)st->tokens);
    double *wn = calloc(F + 1, sizeof(double));
    float *row = malloc(sizeof(float) * (F + 1));
    rc = rc || !wn || !row ? -1 : 0;
    for (int r = 0; !rc && F > 0 && r < H; r++) { /* down_proj [H][F] row by row, in its dtype (resident models) */
        ac_row_f32(row, m->L[l].wd, ac_model_wdt(m), (size_t)r, F);
        for (int c = 0; c < F; c++) wn[c] += (double)row[c] * row[c];
    }
    for (int c = 0; !rc && c < F; c++) fs[c] = st->ffn[l][c] / (double)st->tokens * sqrt(wn[c]);
    free(wn);
    free(row);
    if (!rc)
        rc = rank(gs, G, &imp->kv_order[l], &imp->kv_score[l]) || rank(fs, F, &imp->ffn_order[l], &imp->ffn_score[l]);
    free(gs);
    free(fs);
    return rc ? ac_errf(e, "out of memory") : 0;
}

/* Rank hidden channels from the activation statistics. */
static int rank_hidden(const ac_stats *st, ac_importance *imp, ac_err *e) {
    return rank(st->hidden_a, imp->hidden, &imp->hid_order, &imp->hid_score) ? ac_errf(e, "out of memory") : 0;
}

/* Rank every layer's units and the hidden channels. */
static int rank_units(const ac_model *m, const ac_stats *st, ac_importance *imp, ac_err *e) {
    for (int l = 0; l < m->a.n_layers; l++)
        if (rank_layer(m, st, l, imp, e)) return -1;
    return rank_hidden(st, imp, e);
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
            rc = sens_curve(sc, l, AC_W_O, c->ids, c->n, c->ctx, c->sw, c->base, &w->wo, ac_model_wdt(c->m), H,
                            la->n_heads * hd, c->imp->kv_order[l], la->n_kv_heads, grp * hd, c->imp->attn_sens[l], e);
        }
        if (c->progress) c->progress(c->ud, "sensitivity", (double)++done / total);
        if (la->ffn && !rc)
            rc = sens_curve(sc, l, AC_W_D, c->ids, c->n, c->ctx, c->sw, c->base, &w->wd, ac_model_wdt(c->m), H, la->ffn,
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

/* pruned_increase for ac_ssm_engine_curves (ud: the calib). */
static int pruned_increase_ud(void *ud, const ac_arch *t, double *inc, ac_err *e) { return pruned_increase(ud, t, inc, e); }

/* Mixture-of-experts layers in the engine method (on the device with a CUDA
 * target): each MoE layer's curve (its ffn_sens) from pruned copies, point p
 * the model without the lowest-ranked SENS_R[p] of the layer's experts that
 * can go (all but top_k), routed over the kept ones by ac_prune: what the
 * streamed pass's expert mask gives (test_stream's test_moe_layers). */
static int expert_sensitivity(calib *c, ac_err *e) {
    const ac_arch *a = &c->m->a;
    for (int l = 0; l < a->n_layers; l++) {
        int E = a->layers[l].n_experts, removable = E - a->top_k;
        for (int p = 1; E && p < AC_SENS_POINTS; p++) {
            ac_arch t;
            double inc = 0;
            if (ac_arch_copy(&t, a, e)) return -1;
            t.layers[l].n_experts = E - (int)lround(SENS_R[p] * removable);
            int rc = t.layers[l].n_experts < E && pruned_increase(c, &t, &inc, e);
            ac_arch_free(&t);
            if (rc) return -1;
            c->imp->ffn_sens[l][p] = inc;
        }
        if (E) monotone(c->imp->ffn_sens[l]);
    }
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

/* ------------------------------------------------------------ streamed */

/* Layer-streamed calibration (importance.h). X holds the residual stream of
 * every calibration window; layer l runs over it once with the statistics
 * hooks (its output becomes layer l+1's input), and its units are ranked
 * right then. Xin[l] keeps layer l's input on the first sw windows (the loss
 * points' windows), Xin[L] the final residual stream. Each curve point runs
 * layer l alone with its units masked (or KV heads merged) on Xin[l]; the
 * difference delta from the unmodified output Xin[l+1] is turned into a
 * loss increase by the method:
 *   EXACT: the modified output goes through layers l+1..L-1 and the head
 *     (every point: the exact increase);
 *   ANCHORED: only the 50 % and 100 % points go through the rest; between
 *     them the increase is linear in |delta|^2, below 50 % gain * |delta|^2;
 *     KV merging uses attention's gain at 50 %;
 *   STREAMED: g = d(loss)/d(layer output) for the true labels and g~_k
 *     for FISHER_SAMPLES sets of labels drawn from the model's own output
 *     distribution, from backward passes over the sw windows (layer by
 *     layer, L-1 down to 0, each layer's forward recomputed from Xin[l]);
 *     increase = sum_t g_t.delta_t + 1/2 mean_k sum_t (g~_k,t.delta_t)^2:
 *     first order plus the second-order term with the (true, sampled)
 *     Fisher, which is the Gauss-Newton matrix in expectation, per token.
 *     With the empirical Fisher (true labels) instead, Spearman against the
 *     exact curves on the tiny model was 0.72 (first order only: worse).
 * The hidden curve: one more layer-streamed pass over the sw windows with
 * the 4 hidden masks side by side (stream.h's hid_mask, as ac_prune's
 * narrower width computes). */
#define ANCHORS ((1u << 2) | (1u << 4)) /* the ANCHORED method's propagated points */
/* STREAMED: gradients for labels drawn from the model, per window (their
 * mean square is the Fisher term; one sample gives Spearman 0.90-0.93
 * against the exact curves over three seeds on the tiny model, two 0.91-0.97). */
#define FISHER_SAMPLES 2

typedef struct {
    calib *c;
    int how;    /* AC_CALIB_EXACT, _ANCHORED or _STREAMED */
    ac_stream s;
    float *X;       /* [nwin*ctx][H] residual stream of all windows */
    float **Xin;    /* [L+1] -> [S][H] */
    float *Y;       /* [S][H] a modified layer's output */
    float *D;       /* [S][H] gradient at the current layer's output (STREAMED) */
    float *D2;      /* [FISHER_SAMPLES][S][H] the same for labels drawn from the model (STREAMED) */
    float *hm, *fm; /* head and FFN masks (widest layer) */
    float *xm;      /* an expert mask (most experts) */
    float *sm;      /* a Mamba head mask (most heads) */
    long nwin, sw;
    double (*ea)[AC_SENS_POINTS], (*ef)[AC_SENS_POINTS], (*em)[8], (*es)[AC_SENS_POINTS]; /* [l][point] |delta|^2 */
    /* [l][point] propagated summed loss (EXACT, ANCHORED) or estimated summed increase (STREAMED) */
    double (*la)[AC_SENS_POINTS], (*lf)[AC_SENS_POINTS], (*lm)[8], (*ls)[AC_SENS_POINTS];
} streamer;

/* Layers l0..l1-1 over nw windows of x in place (mod applies to l0 only). */
static void run_layers(streamer *t, int l0, int l1, float *x, long nw, const ac_stream_mod *mod,
                       const ac_engine_hooks *hk) {
    size_t rows = (size_t)t->c->ctx * t->c->m->a.hidden;
    for (long w = 0; w < nw; w += t->s.B) {
        int nb = (int)(nw - w < t->s.B ? nw - w : t->s.B);
        for (int l = l0; l < l1; l++) ac_stream_layer(&t->s, l, x + w * rows, nb, l == l0 ? mod : NULL, hk);
    }
}

/* Summed loss over windows w0..nw-1 of x (final residual stream of all windows from 0). */
static double head_loss(streamer *t, const float *x, long w0, long nw, const ac_stream_mod *mod) {
    size_t rows = (size_t)t->c->ctx * t->c->m->a.hidden;
    double sum = 0;
    for (long w = w0; w < nw; w += t->s.B) {
        int nb = (int)(nw - w < t->s.B ? nw - w : t->s.B);
        sum += ac_stream_nll(&t->s, x + w * rows, t->c->ids + w * t->c->ctx, nb, mod, NULL);
    }
    return sum;
}

/* One curve point of layer l: the layer with mod on Xin[l]; returns
 * |delta|^2, and *est as the method has it (see above) when prop (EXACT,
 * ANCHORED) or with the gradient (STREAMED). */
static double point(streamer *t, int l, const ac_stream_mod *mod, int prop, double *est) {
    int H = t->c->m->a.hidden, ctx = t->c->ctx;
    size_t S = (size_t)t->sw * ctx * H;
    const float *y0 = t->Xin[l + 1];
    memcpy(t->Y, t->Xin[l], S * 4);
    run_layers(t, l, l + 1, t->Y, t->sw, mod, NULL);
    double err = 0, fo = 0, fs = 0;
    for (size_t r = 0; r < (size_t)t->sw * ctx; r++) { /* per token: g.delta, and g~.delta per sample */
        double gd = 0, g2[FISHER_SAMPLES] = {0};
        for (size_t i = r * H; i < (r + 1) * H; i++) {
            double d = (double)t->Y[i] - y0[i];
            err += d * d;
            if (t->how == AC_CALIB_STREAMED) {
                gd += t->D[i] * d;
                for (int k = 0; k < FISHER_SAMPLES; k++) g2[k] += t->D2[k * S + i] * d;
            }
        }
        fo += gd;
        for (int k = 0; k < FISHER_SAMPLES; k++) fs += g2[k] * g2[k] / FISHER_SAMPLES;
    }
    if (t->how == AC_CALIB_STREAMED)
        *est = fo + 0.5 * fs;
    else if (prop) {
        run_layers(t, l + 1, t->c->m->a.n_layers, t->Y, t->sw, NULL, NULL);
        *est = head_loss(t, t->Y, 0, t->sw, NULL);
    }
    return err;
}

static int propagated(const streamer *t, int p) {
    return t->how == AC_CALIB_EXACT || (t->how == AC_CALIB_ANCHORED && ((ANCHORS >> p) & 1));
}

/* The points of removing the lowest-ranked SENS_R[p] of a layer's KV groups
 * (ffn = 0: their query heads masked) or FFN channels (ffn = 1). */
static void mask_points(streamer *t, int l, int ffn, const int *order, int units, int uw, double *err, double *est) {
    float *mask = ffn ? t->fm : t->hm;
    for (int p = 1; p < AC_SENS_POINTS; p++) {
        int drop = (int)lround(SENS_R[p] * units);
        for (int k = 0; k < units * uw; k++) mask[k] = 1;
        for (int k = units - drop; k < units; k++)
            for (int j = 0; j < uw; j++) mask[order[k] * uw + j] = 0;
        ac_stream_mod mod = {.head_mask = ffn ? NULL : mask, .ffn_mask = ffn ? mask : NULL};
        err[p] = point(t, l, &mod, propagated(t, p), &est[p]);
    }
}

/* A mixture-of-experts layer's curve (its ffn_sens): point p removes the
 * lowest-ranked SENS_R[p] of the experts that can go (all but top_k:
 * ac_sens_experts), from the routing, as ac_prune removes them. */
static void expert_points(streamer *t, int l) {
    const ac_arch *a = &t->c->m->a;
    int E = a->layers[l].n_experts, removable = E - a->top_k;
    const int *order = t->c->imp->expert_order[l];
    for (int p = 1; p < AC_SENS_POINTS; p++) {
        int drop = (int)lround(SENS_R[p] * removable);
        for (int x = 0; x < E; x++) t->xm[x] = 1;
        for (int k = E - drop; k < E; k++) t->xm[order[k]] = 0;
        ac_stream_mod mod = {.expert_mask = t->xm};
        t->ef[l][p] = point(t, l, &mod, propagated(t, p), &t->lf[l][p]);
    }
}

/* A Mamba layer's curve (its ssm_sens): point p removes the lowest-ranked
 * lround(SENS_R[p] * heads per group) heads of every group (ssm_mask 0
 * inside the gated norm, whose statistic then averages over the kept
 * heads: the same count per group that ac_ssm_kept_heads keeps; 100 %: the
 * layer's output 0, the layer removed). */
static void ssm_points(streamer *t, int l) {
    const ac_arch *a = &t->c->m->a;
    int nh = a->layers[l].ssm_heads, G = a->ssm_groups > 0 ? a->ssm_groups : 1, hpg = nh / G;
    const int *order = t->c->imp->ssm_head_order[l];
    for (int p = 1; p < AC_SENS_POINTS; p++) {
        int drop = (int)lround(SENS_R[p] * hpg);
        for (int h = 0; h < nh; h++) t->sm[h] = 1;
        for (int g = 0; g < G; g++)
            for (int k = hpg - drop; k < hpg; k++) t->sm[order[g * hpg + k]] = 0;
        ac_stream_mod mod = {.ssm_mask = t->sm};
        t->es[l][p] = point(t, l, &mod, propagated(t, p), &t->ls[l][p]);
    }
}

/* Every point of layer l (its units ranked). */
static void layer_points(streamer *t, int l) {
    calib *c = t->c;
    const ac_layer_arch *la = &c->m->a.layers[l];
    if (la->n_heads) {
        int kv = la->n_kv_heads, grp = la->n_heads / kv;
        mask_points(t, l, 0, c->imp->kv_order[l], kv, grp, t->ea[l], t->la[l]);
        for (int d = kv - 1, k = 0; d >= 1 && k < 8; d--) {
            if (kv % d) continue;
            ac_stream_mod mod = {.kv_merge = d};
            c->imp->merge_r[l][k] = 1.0 - (double)d / kv;
            t->em[l][k] = point(t, l, &mod, t->how == AC_CALIB_EXACT, &t->lm[l][k]);
            c->imp->merge_n[l] = ++k;
        }
    }
    if (la->ffn) mask_points(t, l, 1, c->imp->ffn_order[l], la->ffn, 1, t->ef[l], t->lf[l]);
    if (la->n_experts) expert_points(t, l);
    if (la->ssm_heads && c->imp->ssm_sens) ssm_points(t, l);
}

/* One layer of the forward pass: statistics, ranking, and (EXACT,
 * ANCHORED) its points. */
static int stream_layer(streamer *t, ac_stats *st, const ac_engine_hooks *hk, int l, ac_err *e) {
    calib *c = t->c;
    size_t S = (size_t)t->sw * c->ctx * c->m->a.hidden;
    run_layers(t, l, l + 1, t->X, t->nwin, NULL, hk);
    memcpy(t->Xin[l + 1], t->X, S * 4);
    if (rank_layer(c->m, st, l, c->imp, e)) return -1;
    /* a Mamba layer's heads: ranked now (its statistics are complete), before its points */
    if (c->imp->ssm_head_order && ac_ssm_rank_layer(st->mt_ssm[l], &c->m->a, l, c->imp, e)) return -1;
    if (t->how != AC_CALIB_STREAMED) layer_points(t, l);
    return 0;
}

/* STREAMED: the backward pass from the loss, each layer's points scored
 * with the gradient at its output before it is carried to its input. */
static void backward_points(streamer *t) {
    calib *c = t->c;
    int L = c->m->a.n_layers;
    size_t rows = (size_t)c->ctx * c->m->a.hidden;
    for (long w = 0; w < t->sw; w += t->s.B) {
        int nb = (int)(t->sw - w < t->s.B ? t->sw - w : t->s.B);
        ac_stream_nll_grad(&t->s, t->Xin[L] + w * rows, c->ids + w * c->ctx, nb, NULL, t->D + w * rows);
        unsigned rng = 0x5eedu + (unsigned)w; /* reproducible */
        for (int k = 0; k < FISHER_SAMPLES; k++)
            ac_stream_nll_grad(&t->s, t->Xin[L] + w * rows, c->ids + w * c->ctx, nb, &rng,
                               t->D2 + k * t->sw * rows + w * rows);
    }
    for (int l = L - 1; l >= 0; l--) {
        layer_points(t, l);
        if (l) ac_stream_layer_backward(&t->s, l, t->Xin[l], t->D, (int)t->sw);
        for (int k = 0; l && k < FISHER_SAMPLES; k++)
            ac_stream_layer_backward(&t->s, l, t->Xin[l], t->D2 + k * t->sw * rows, (int)t->sw);
        if (c->progress) c->progress(c->ud, "streamed calibration: backward", (double)(2 * L - l) / (2 * L + 1));
    }
}

/* One curve from its points: EXACT, every point's increase; ANCHORED: see
 * above; STREAMED: the estimates. */
static void make_curve(const streamer *t, const double *err, const double *est, double base_sum, double *curve) {
    long cnt = t->sw * (t->c->ctx - 1);
    if (t->how != AC_CALIB_ANCHORED) {
        for (int p = 1; p < AC_SENS_POINTS; p++)
            curve[p] = (t->how == AC_CALIB_EXACT ? est[p] - base_sum : est[p]) / cnt;
        monotone(curve);
        return;
    }
    double pe = 0, pi = 0; /* previous anchor: error, increase */
    int next = 1;
    for (int p = 1; p < AC_SENS_POINTS; p++) {
        if (!((ANCHORS >> p) & 1)) continue;
        double inc = fmax((est[p] - base_sum) / cnt, pi);
        for (int q = next; q <= p; q++) curve[q] = err[p] > pe ? pi + (inc - pi) * (err[q] - pe) / (err[p] - pe) : inc;
        pe = err[p], pi = inc, next = p + 1;
    }
    for (int q = next; q < AC_SENS_POINTS; q++) curve[q] = pe > 0 ? pi * err[q] / pe : pi;
    monotone(curve);
}

static void stream_curves(streamer *t, double base_sum) {
    ac_importance *imp = t->c->imp;
    long cnt = t->sw * (t->c->ctx - 1);
    for (int l = 0; l < imp->n_layers; l++) {
        make_curve(t, t->ea[l], t->la[l], base_sum, imp->attn_sens[l]);
        make_curve(t, t->ef[l], t->lf[l], base_sum, imp->ffn_sens[l]);
        if (imp->ssm_sens) make_curve(t, t->es[l], t->ls[l], base_sum, imp->ssm_sens[l]);
        double ka = t->ea[l][2] > 0 ? imp->attn_sens[l][2] / t->ea[l][2] : 0; /* ANCHORED: gain at 50 % */
        for (int k = 0; k < imp->merge_n[l]; k++) {
            double inc = t->how == AC_CALIB_EXACT      ? (t->lm[l][k] - base_sum) / cnt
                         : t->how == AC_CALIB_STREAMED ? t->lm[l][k] / cnt
                                                       : ka * t->em[l][k];
            imp->merge_sens[l][k] = fmax(inc, k ? imp->merge_sens[l][k - 1] : 0);
        }
    }
}

/* The hidden curve: the sw windows from the embedding through every layer
 * with 12.5 / 25 / 50 / 75 % of the hidden channels (lowest-ranked) masked,
 * the four side by side, one layer at a time. */
static int hidden_points(streamer *t, double base_sum, ac_err *e) {
    static const double HF[4] = {0.125, 0.25, 0.5, 0.75};
    calib *c = t->c;
    int H = c->m->a.hidden, L = c->m->a.n_layers;
    size_t S = (size_t)t->sw * c->ctx * H;
    float *buf = malloc(4 * S * 4), *mask = malloc(4 * (size_t)H * 4);
    if (!buf || !mask) {
        free(buf);
        free(mask);
        return ac_errf(e, "out of memory for the hidden-width curve (4 x %ld windows)", t->sw);
    }
    ac_stream_mod mod[4];
    for (int i = 0; i < 4; i++) {
        int kept = H - (int)lround(HF[i] * H);
        float *m = mask + (size_t)i * H;
        for (int k = 0; k < H; k++) m[c->imp->hid_order[k]] = k < kept;
        mod[i] = (ac_stream_mod){.hid_mask = m, .hid_kept = kept};
        for (size_t j = 0; j < S; j++) buf[i * S + j] = t->Xin[0][j] * m[j % H];
    }
    for (int l = 0; l < L; l++)
        for (int i = 0; i < 4; i++) {
            size_t rows = (size_t)c->ctx * H;
            for (long w = 0; w < t->sw; w += t->s.B) /* every layer masked: run_layers' mod is for l0 only */
                ac_stream_layer(&t->s, l, buf + i * S + w * rows, (int)(t->sw - w < t->s.B ? t->sw - w : t->s.B),
                                &mod[i], NULL);
        }
    long cnt = t->sw * (c->ctx - 1);
    for (int i = 0; i < 4; i++) {
        double inc = (head_loss(t, buf + i * S, 0, t->sw, &mod[i]) - base_sum) / cnt;
        c->imp->hid_frac[i] = HF[i];
        c->imp->hid_sens[i] = fmax(inc, i ? c->imp->hid_sens[i - 1] : 0);
    }
    free(buf);
    free(mask);
    return 0;
}

static void streamer_free(streamer *t) {
    ac_stream_free(&t->s);
    free(t->X);
    if (t->Xin)
        for (int l = 0; l <= t->c->m->a.n_layers; l++) free(t->Xin[l]);
    free(t->Xin);
    free(t->Y);
    free(t->D);
    free(t->D2);
    free(t->hm);
    free(t->fm);
    free(t->xm);
    free(t->sm);
    free(t->es);
    free(t->ls);
    free(t->ea);
    free(t->ef);
    free(t->em);
    free(t->la);
    free(t->lf);
    free(t->lm);
}

static int streamer_init(streamer *t, calib *c, int how, long nwin, ac_err *e) {
    const ac_arch *a = &c->m->a;
    int L = a->n_layers;
    size_t H = a->hidden, mh = 1, mf = 1, ms = 1;
    for (int l = 0; l < L; l++) {
        if ((size_t)a->layers[l].n_heads > mh) mh = a->layers[l].n_heads;
        if ((size_t)a->layers[l].ffn > mf) mf = a->layers[l].ffn;
        if ((size_t)a->layers[l].ssm_heads > ms) ms = a->layers[l].ssm_heads;
    }
    memset(t, 0, sizeof *t);
    t->c = c;
    t->how = how;
    t->nwin = nwin;
    t->sw = c->sw > 0 ? c->sw : 8; /* windows 0 = all: the loss points still take 8 */
    if (t->sw > nwin) t->sw = nwin;
    size_t S = (size_t)t->sw * c->ctx * H;
    if (ac_stream_init(&t->s, c->m, 4, c->ctx, e)) return -1;
    int grad = how == AC_CALIB_STREAMED;
    if (grad && ac_stream_want_grad(&t->s, e)) {
        ac_stream_free(&t->s);
        return -1;
    }
    t->X = malloc((size_t)nwin * c->ctx * H * 4);
    t->Xin = calloc(L + 1, sizeof *t->Xin);
    for (int l = 0; t->Xin && l <= L; l++) t->Xin[l] = malloc(S * 4);
    t->Y = malloc(S * 4);
    t->D = grad ? malloc(S * 4) : malloc(4);
    t->D2 = grad ? malloc(FISHER_SAMPLES * S * 4) : malloc(4);
    t->hm = malloc(mh * 4);
    t->fm = malloc(mf * 4);
    t->xm = malloc((ac_block_dim_max(a, AC_DIM_E) + 1) * 4);
    t->sm = malloc(ms * 4);
    t->es = calloc(L, sizeof *t->es);
    t->ls = calloc(L, sizeof *t->ls);
    if (ac_arch_is_hybrid(a)) c->imp->ssm_sens = calloc(L, sizeof *c->imp->ssm_sens);
    t->ea = calloc(L, sizeof *t->ea);
    t->ef = calloc(L, sizeof *t->ef);
    t->em = calloc(L, sizeof *t->em);
    t->la = calloc(L, sizeof *t->la);
    t->lf = calloc(L, sizeof *t->lf);
    t->lm = calloc(L, sizeof *t->lm);
    c->imp->merge_n = calloc(L, sizeof(int));
    c->imp->merge_r = calloc(L, sizeof *c->imp->merge_r);
    c->imp->merge_sens = calloc(L, sizeof *c->imp->merge_sens);
    int ok = t->X && t->Xin && t->Y && t->D && t->D2 && t->hm && t->fm && t->xm && t->ea && t->ef && t->em && t->la &&
             t->lf && t->lm && c->imp->merge_n && c->imp->merge_r && c->imp->merge_sens && t->sm && t->es && t->ls &&
             (!ac_arch_is_hybrid(a) || c->imp->ssm_sens);
    for (int l = 0; ok && l <= L; l++) ok = t->Xin[l] != NULL;
    if (!ok) {
        streamer_free(t);
        return ac_errf(e, "out of memory for the calibration activations (%ld windows of %d x %zu floats)", nwin,
                       c->ctx, H);
    }
    return 0;
}

/* The layer-streamed calibration (method how): statistics, rankings, every
 * curve, base_loss. */
static int streamed_calibration(calib *c, ac_stats *st, int how, long nwin, ac_err *e) {
    streamer t;
    if (streamer_init(&t, c, how, nwin, e)) return -1;
    int L = c->m->a.n_layers, rc = ac_stream_embed(c->m, c->ids, nwin * c->ctx, t.X, e);
    if (!rc && ac_arch_is_hybrid(&c->m->a)) rc = ac_ssm_rank_alloc(&c->m->a, c->imp, e); /* rows: stream_layer */
    ac_engine_hooks hk;
    ac_stats_hooks(st, &hk);
    hk.rows = NULL;
    st->tokens = nwin * c->ctx;
    if (!rc) memcpy(t.Xin[0], t.X, (size_t)t.sw * c->ctx * c->m->a.hidden * 4);
    int steps = how == AC_CALIB_STREAMED ? 2 * L + 1 : L + 1;
    for (int l = 0; l < L && !rc; l++) {
        rc = stream_layer(&t, st, &hk, l, e);
        if (c->progress) c->progress(c->ud, "streamed calibration", (double)(l + 1) / steps);
    }
    if (!rc) {
        double base_sum = head_loss(&t, t.X, 0, t.sw, NULL), rest = head_loss(&t, t.X, t.sw, nwin, NULL);
        c->imp->base_loss = (base_sum + rest) / (nwin * (c->ctx - 1));
        if (how == AC_CALIB_STREAMED) backward_points(&t);
        stream_curves(&t, base_sum);
        rc = rank_hidden(st, c->imp, e) || hidden_points(&t, base_sum, e) ? -1 : 0;
    }
    streamer_free(&t);
    return rc;
}

/* Full-model passes of the exact method, in FLOPs (2 per parameter per
 * token): statistics over every window, then per loss point sw windows. A
 * hybrid's (hybrid_flops) per layer. */
static double hybrid_flops(const ac_arch *a, long nwin, int ctx, int sw);
double ac_calib_exact_flops(const ac_arch *a, long nwin, int ctx, int sw) {
    if (ac_arch_is_hybrid(a)) return hybrid_flops(a, nwin, ctx, sw);
    double pts = 2 + 4 + 8.0 * a->n_layers;
    for (int l = 0; l < a->n_layers; l++)
        for (int d = a->layers[l].n_kv_heads - 1; d >= 1; d--) pts += a->layers[l].n_kv_heads % d == 0;
    return 2 * ac_arch_params(a) * ((double)nwin * ctx + pts * sw * ctx);
}

/* A hybrid layer's work per token: 2 FLOPs per parameter a token reaches
 * (an MoE layer's top_k experts, not all of them), attention's scores and
 * weighted sum over the window (2 ctx Q), a Mamba layer's selective scan
 * (per head dim and state: the state's decay and update, and C's readout,
 * about 6 FLOPs). */
static double hybrid_layer_flops(const ac_arch *a, int l, int ctx) {
    const ac_layer_arch *la = &a->layers[l];
    double f = 2 * ac_arch_layer_params(a, l);
    if (la->n_experts > a->top_k) {
        double Hin = a->moe_latent ? a->moe_latent : a->hidden;
        f -= 2.0 * (la->n_experts - a->top_k) * 2 * Hin * la->expert_ffn; /* up and down of the experts not run */
    }
    if (la->n_heads) f += 2.0 * ctx * la->n_heads * a->head_dim;
    if (la->ssm_heads) f += 6.0 * la->ssm_heads * a->ssm_head_dim * a->ssm_state;
    return f;
}

/* A hybrid's exact passes: the statistics over every window, the base loss
 * and the 4 hidden points over sw windows (every layer and the head), and
 * each layer's points (4 per sub-block it has, attention's KV merges too)
 * run from that layer through the rest and the head. */
static double hybrid_flops(const ac_arch *a, long nwin, int ctx, int sw) {
    double head = 2.0 * a->hidden * a->vocab, rest = head, pts = 0, S = (double)sw * ctx;
    for (int l = a->n_layers - 1; l >= 0; l--) {
        const ac_layer_arch *la = &a->layers[l];
        rest += hybrid_layer_flops(a, l, ctx);
        int p = 4 * ((la->n_heads > 0) + (la->ffn > 0) + (la->n_experts > 0) + (la->ssm_heads > 0));
        for (int d = la->n_kv_heads - 1; la->n_heads && d >= 1; d--) p += la->n_kv_heads % d == 0;
        pts += p * S * rest;
    }
    return rest * ((double)nwin * ctx + 5 * S) + pts;
}

int ac_calib_method(const ac_arch *a, int mode, long nwin, int ctx, int sw, int cuda) {
    if (mode == AC_CALIB_AUTO)
        mode = !cuda && ac_calib_exact_flops(a, nwin, ctx, sw) > AC_CALIB_EXACT_FLOPS ? AC_CALIB_STREAMED
                                                                                       : AC_CALIB_EXACT;
    if (mode == AC_CALIB_EXACT && cuda) mode = AC_CALIB_ENGINE; /* the loss passes on the GPU */
    /* a hybrid as a dense model: every method measures its loss curves, the Mamba heads' included */
    return mode;
}

static int alloc_importance(ac_importance *imp, int L, ac_err *e) {
    imp->kv_order = calloc(L, sizeof(int *));
    imp->kv_score = calloc(L, sizeof(double *));
    imp->ffn_order = calloc(L, sizeof(int *));
    imp->ffn_score = calloc(L, sizeof(double *));
    imp->layer_bi = calloc(L, sizeof(double));
    imp->attn_sens = calloc(L, sizeof *imp->attn_sens);
    imp->ffn_sens = calloc(L, sizeof *imp->ffn_sens);
    return imp->kv_order && imp->kv_score && imp->ffn_order && imp->ffn_score && imp->layer_bi && imp->attn_sens &&
                   imp->ffn_sens
               ? 0
               : ac_errf(e, "out of memory");
}

int ac_importance_compute(ac_model *m, const int *ids, size_t n, int ctx, int windows, int cuda,
                          ac_progress_fn progress, void *ud, ac_importance *imp, ac_err *e) {
    return ac_importance_compute_mode(m, ids, n, ctx, windows, cuda, AC_CALIB_AUTO, progress, ud, imp, e);
}

int ac_importance_compute_mode(ac_model *m, const int *ids, size_t n, int ctx, int windows, int cuda, int mode,
                               ac_progress_fn progress, void *ud, ac_importance *imp, ac_err *e) {
    memset(imp, 0, sizeof *imp);
    const ac_arch *a = &m->a;
    int L = a->n_layers;
    imp->n_layers = L;
    imp->hidden = a->hidden;
    long nwin = ctx >= 2 ? (long)(n / ctx) : 0;
    if (windows > 0 && nwin > windows) nwin = windows;
    if (nwin < 1) return ac_errf(e, "calibration: %zu tokens do not fill one window of %d", n, ctx);
    calib c = {m, ids, n, ctx, windows < 8 ? windows : 8, cuda, progress, ud, imp, 0};
    mode = ac_calib_method(a, mode, nwin, ctx, c.sw < nwin ? c.sw : (int)nwin, cuda);
    int hybrid = ac_arch_is_hybrid(a);
    imp->method = mode;
    imp->streamed = mode == AC_CALIB_STREAMED;
    ac_stats st;
    if (ac_stats_init(&st, a, e)) return -1;
    int rc = ac_stats_want_minitron(&st, a, e) || alloc_importance(imp, L, e) ? -1 : 0;
    /* experts ranked first (one engine pass): the streamed curves remove the lowest-ranked */
    if (!rc && ac_arch_has_moe(a)) rc = ac_expert_importance(m, ids, n, ctx, windows, imp, e);
    if (!rc && mode != AC_CALIB_ENGINE) {
        rc = streamed_calibration(&c, &st, mode, nwin, e);
        imp->tokens = st.tokens;
        if (!rc) rc = minitron_scores(&st, a, imp, e); /* (the Mamba heads: ranked layer by layer in the pass) */
        if (!rc && hybrid) rc = ac_rank_shared((const double *const *)st.mt_shared, a, imp, e);
        ac_stats_free(&st);
    } else if (!rc) {
        ac_ppl_opts o = {.ctx = ctx, .stride = 0, .max_windows = windows, .batch = 4};
        ac_ppl_result pr;
        if (progress) progress(ud, "activation statistics", 0);
        ac_engine_hooks hk;
        ac_stats_hooks(&st, &hk);
        rc = ac_perplexity(m, ids, n, &o, &hk, NULL, NULL, &pr, e);
        imp->base_loss = pr.nll;
        imp->tokens = st.tokens;
        if (!rc) rc = rank_units(m, &st, imp, e);
        if (!rc) rc = minitron_scores(&st, a, imp, e);
        if (!rc && hybrid) rc = ac_ssm_rank_heads((const double *const *)st.mt_ssm, a, imp, e);
        if (!rc && hybrid) rc = ac_rank_shared((const double *const *)st.mt_shared, a, imp, e);
        ac_stats_free(&st);
        /* the engine method's curves (a CUDA target), a hybrid's as the CPU's exact ones: the dense passes
         * (attention and MLP masks, expert, hidden and KV-merge pruned copies) and the Mamba heads' (ssm_curves.c) */
        if (!rc)
            rc = masking_sensitivity(&c, e) || expert_sensitivity(&c, e) || hidden_sensitivity(&c, e) ||
                         merge_sensitivity(&c, e) ||
                         (hybrid && ac_ssm_engine_curves(a, pruned_increase_ud, &c, imp, e))
                     ? -1
                     : 0;
    } else
        ac_stats_free(&st);
    if (!rc && progress) progress(ud, "sensitivity", 1.0);
    if (rc) ac_importance_free(imp);
    return rc;
}

static const char *method_name(int m) {
    return m == AC_CALIB_STREAMED ? "streamed" : m == AC_CALIB_ANCHORED ? "anchored" : "exact";
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
        json_t *lj = json_pack("{s:f,s:o,s:o,s:o}", "block_influence", imp->layer_bi[l], "attention_loss_curve", as,
                               "ffn_loss_curve", fs, "kv_merge_loss_curve", ms);
        if (lj && imp->ssm_sens && imp->ssm_head_order && imp->ssm_head_order[l]) { /* a hybrid's Mamba layer */
            json_t *ss = json_array();
            for (int p = 0; p < AC_SENS_POINTS; p++) json_array_append_new(ss, json_real(imp->ssm_sens[l][p]));
            json_object_set_new(lj, "mamba_loss_curve", ss);
        }
        json_array_append_new(layers, lj);
    }
    json_t *hs = json_array();
    for (int i = 0; i < 4; i++) json_array_append_new(hs, json_pack("[f,f]", imp->hid_frac[i], imp->hid_sens[i]));
    const char *how = !imp->ssm_head_order || imp->ssm_sens
                          ? method_name(imp->method)
                          : "none (hybrid: activation statistics only, from the engine pass; the curves are zero)";
    return json_pack("{s:f,s:I,s:s,s:o,s:o,s:[f,f,f,f,f]}", "base_loss", imp->base_loss, "tokens",
                     (json_int_t)imp->tokens, "sensitivity_method", how, "layers", layers, "hidden_loss_curve", hs,
                     "removed_fractions", 0.0, 0.25, 0.5, 0.75, 1.0);
}
