/*
 * test_minitron.c - the Minitron baseline (src/search/minitron.c) against
 * independent computations: the divisor grid and Model-Optimizer's caps;
 * its importance (o_proj input, down_proj input, norm outputs, layer
 * 1 - cos) against a direct float64 forward written here; head trimming
 * within KV groups equal to masking the dropped heads; the search keeping
 * every KV group, staying on the grid and inside the limits, taking the
 * feasible grid points closest to the binding limit (checked by the test's
 * own enumeration), and keeping the best-scored candidate.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cost/costmodel.h"
#include "runtime/engine.h"
#include "runtime/eval.h"
#include "search/importance.h"
#include "runtime/kernels_cpu.h"
#include "runtime/tasks.h"
#include "search/minitron.h"
#include "compress/prune.h"
#include "synth.h"

static unsigned seed_ = 12345;
static double urand(void) {
    seed_ = seed_ * 1103515245u + 12345u;
    return ((seed_ >> 8) & 0xffffff) / 16777216.0;
}

static void fill(float *w, size_t n, double scale, double offset) {
    for (size_t i = 0; i < n; i++) w[i] = (float)(offset + scale * (2 * urand() - 1));
}

/* A random model: L layers, hidden 16, 8 heads of 4 in 2 KV groups, FFN 24. */
static int mk_model_layers(ac_model *m, int L, ac_err *e) {
    ac_arch a = mk_arch(L, 16, 4, 8, 2, 24, 40);
    int rc = ac_model_alloc(m, &a, e);
    ac_arch_free(&a);
    if (rc) return rc;
    int H = 16, Q = 32, KV = 8, F = 24, V = 40;
    fill(m->embed, (size_t)V * H, 1.0, 0);
    fill(m->lm_head, (size_t)V * H, 0.3, 0);
    fill(m->final_norm, H, 0.2, 1);
    for (int l = 0; l < L; l++) {
        ac_layer_w *w = &m->L[l];
        fill(w->in_norm, H, 0.3, 1);
        fill(w->post_norm, H, 0.3, 1);
        fill(w->wq, (size_t)Q * H, 0.4, 0);
        fill(w->wk, (size_t)KV * H, 0.4, 0);
        fill(w->wv, (size_t)KV * H, 0.4, 0);
        fill(w->wo, (size_t)H * Q, 0.3 * (l + 1), 0);
        fill(w->wg, (size_t)F * H, 0.4, 0);
        fill(w->wu, (size_t)F * H, 0.4, 0);
        fill(w->wd, (size_t)H * F, 0.3, 0);
    }
    return 0;
}

/* The 3-layer one most tests use. */
static int mk_model(ac_model *m, ac_err *e) { return mk_model_layers(m, 3, e); }

/* ---- the direct float64 forward (HF Llama, rotate-half RoPE) ---- */

typedef struct {
    double attn[3][32], ffn[3][24], norm[6][16]; /* sum over windows of (mean_t |x|)^2 */
    double cos_sum[3];
    long tokens;
} ref_stats;

static void rmsnorm(double *y, const double *x, const float *w, int H, double eps) {
    double s = 0;
    for (int i = 0; i < H; i++) s += x[i] * x[i];
    double r = 1 / sqrt(s / H + eps);
    for (int i = 0; i < H; i++) y[i] = x[i] * r * w[i];
}

static void matvec(double *y, const float *W, const double *x, int out, int in) {
    for (int o = 0; o < out; o++) {
        double s = 0;
        for (int i = 0; i < in; i++) s += (double)W[(size_t)o * in + i] * x[i];
        y[o] = s;
    }
}

static void rope(double *v, int nh, int hd, int pos, double theta) {
    for (int h = 0; h < nh; h++)
        for (int i = 0; i < hd / 2; i++) {
            double f = pos * pow(theta, -2.0 * i / hd), c = cos(f), s = sin(f);
            double a = v[h * hd + i], b = v[h * hd + i + hd / 2];
            v[h * hd + i] = a * c - b * s;
            v[h * hd + i + hd / 2] = b * c + a * s;
        }
}

static void window_acc(double *acc, double (*x)[32], int T, int C) {
    for (int c = 0; c < C; c++) {
        double s = 0;
        for (int t = 0; t < T; t++) s += fabs(x[t][c]);
        acc[c] += (s / T) * (s / T);
    }
}

#define T_ 8
static void ref_window(const ac_model *m, const int *tok, ref_stats *st) {
    const int H = 16, hd = 4, nh = 8, grp = 4, F = 24;
    double x[T_][32] = {{0}}, x0[T_][32], xn[T_][32], q[T_][32], k[T_][32], v[T_][32], att[T_][32], a[T_][32];
    for (int t = 0; t < T_; t++)
        for (int i = 0; i < H; i++) x[t][i] = m->embed[tok[t] * H + i];
    for (int l = 0; l < 3; l++) {
        const ac_layer_w *w = &m->L[l];
        memcpy(x0, x, sizeof x);
        for (int t = 0; t < T_; t++) {
            rmsnorm(xn[t], x[t], w->in_norm, H, m->a.eps);
            matvec(q[t], w->wq, xn[t], 32, H);
            matvec(k[t], w->wk, xn[t], 8, H);
            matvec(v[t], w->wv, xn[t], 8, H);
            rope(q[t], nh, hd, t, m->a.rope_theta);
            rope(k[t], 2, hd, t, m->a.rope_theta);
        }
        window_acc(st->norm[2 * l], xn, T_, H);
        for (int t = 0; t < T_; t++)
            for (int h = 0; h < nh; h++) {
                int g = h / grp;
                double sc[T_], mx = -1e300, z = 0;
                for (int s = 0; s <= t; s++) {
                    sc[s] = 0;
                    for (int i = 0; i < hd; i++) sc[s] += q[t][h * hd + i] * k[s][g * hd + i];
                    sc[s] /= sqrt(hd);
                    mx = fmax(mx, sc[s]);
                }
                for (int s = 0; s <= t; s++) z += (sc[s] = exp(sc[s] - mx));
                for (int i = 0; i < hd; i++) {
                    double o = 0;
                    for (int s = 0; s <= t; s++) o += sc[s] / z * v[s][g * hd + i];
                    att[t][h * hd + i] = o;
                }
            }
        window_acc(st->attn[l], att, T_, 32);
        for (int t = 0; t < T_; t++) {
            double o[32];
            matvec(o, w->wo, att[t], H, 32);
            for (int i = 0; i < H; i++) x[t][i] += o[i];
            rmsnorm(xn[t], x[t], w->post_norm, H, m->a.eps);
        }
        window_acc(st->norm[2 * l + 1], xn, T_, H);
        for (int t = 0; t < T_; t++) {
            double g[32], u[32], o[32];
            matvec(g, w->wg, xn[t], F, H);
            matvec(u, w->wu, xn[t], F, H);
            for (int c = 0; c < F; c++) a[t][c] = g[c] / (1 + exp(-g[c])) * u[c];
            matvec(o, w->wd, a[t], H, F);
            for (int i = 0; i < H; i++) x[t][i] += o[i];
            double d = 0, n0 = 0, n1 = 0;
            for (int i = 0; i < H; i++) {
                d += x0[t][i] * x[t][i];
                n0 += x0[t][i] * x0[t][i];
                n1 += x[t][i] * x[t][i];
            }
            st->cos_sum[l] += 1 - d / sqrt(n0 * n1);
        }
        window_acc(st->ffn[l], a, T_, F);
    }
    st->tokens += T_;
}

static int close_rel(double a, double b, double tol) { return fabs(a - b) <= tol * fmax(fabs(b), 1e-6); }

static void test_choices_and_caps(void) {
    /* an independent statement of Model-Optimizer's grid: every c in 1..max
     * with c % divisor == 0, plus max; kept from index int((1 - cap) n) */
    int maxes[] = {128, 384, 6, 100, 1, 4096, 14336, 32};
    for (size_t t = 0; t < sizeof maxes / sizeof *maxes; t++) {
        int max = maxes[t], d = ac_minitron_divisor(max), *v = malloc(sizeof(int) * (max + 2)),
            n = ac_minitron_choices(max, d, v), k = 0;
        CHECK(d >= 1 && (max < 24 || (max / d >= 12 && max / d <= 24)), "max %d: divisor %d leaves %d choices", max, d,
              max / d);
        for (int c = 1; c <= max; c++)
            if (c % d == 0 || c == max) {
                CHECK(k < n && v[k] == c, "max %d: choice %d is %d, expected %d", max, k, k < n ? v[k] : -1, c);
                k++;
            }
        CHECK(k == n, "max %d: %d choices, expected %d", max, n, k);
        free(v);
    }
    CHECK(ac_minitron_divisor(128) == 8 && ac_minitron_divisor(384) == 24 && ac_minitron_divisor(6) == 1, "divisors");
    CHECK(ac_minitron_cap_start(16, 0.40) == 9 && ac_minitron_cap_start(6, 0.20) == 4 &&
              ac_minitron_cap_start(2, 0.40) == 1 && ac_minitron_cap_start(16, 0.20) == 12 &&
              ac_minitron_cap_start(28, 0.40) == 16,
          "caps as Python's int((1 - p) * n)");
}

static void test_importance_matches_direct_forward(void) {
    ac_err e;
    ac_model m;
    CHECK(mk_model(&m, &e) == 0, "%s", e.msg);
    int W = 6, ids[6 * T_];
    for (int i = 0; i < W * T_; i++) ids[i] = (int)(urand() * 40);
    ac_importance imp;
    CHECK(ac_importance_compute(&m, ids, W * T_, T_, W, 0, NULL, NULL, &imp, &e) == 0, "%s", e.msg);
    ref_stats st;
    memset(&st, 0, sizeof st);
    for (int w = 0; w < W; w++) ref_window(&m, ids + w * T_, &st);
    double hid[16] = {0};
    for (int l = 0; l < 3; l++) {
        CHECK(close_rel(imp.layer_bi[l], st.cos_sum[l] / st.tokens, 1e-4), "layer %d: 1-cos %g, direct %g", l,
              imp.layer_bi[l], st.cos_sum[l] / st.tokens);
        for (int h = 0; h < 8; h++) {
            double s = 0;
            for (int i = 0; i < 4; i++) s += st.attn[l][h * 4 + i];
            CHECK(close_rel(imp.head_score[l][h], sqrt(s), 1e-4), "layer %d head %d: %g vs %g", l, h,
                  imp.head_score[l][h], sqrt(s));
        }
        for (int g = 0; g < 2; g++) /* ranked within the group, best first */
            for (int j = 0; j < 4; j++) {
                int h = imp.head_order[l][g * 4 + j];
                CHECK(h / 4 == g, "head %d ranked in group %d", h, g);
                if (j)
                    CHECK(imp.head_score[l][h] <= imp.head_score[l][imp.head_order[l][g * 4 + j - 1]], "group order");
            }
        for (int r = 0; r < 24; r++) {
            int c = imp.mt_ffn_order[l][r];
            CHECK(close_rel(imp.mt_ffn_score[l][r], sqrt(st.ffn[l][c]), 1e-4), "ffn %d/%d: %g vs %g", l, c,
                  imp.mt_ffn_score[l][r], sqrt(st.ffn[l][c]));
            if (r) CHECK(imp.mt_ffn_score[l][r] <= imp.mt_ffn_score[l][r - 1], "ffn sorted");
        }
        for (int c = 0; c < 16; c++) hid[c] += sqrt(st.norm[2 * l][c]) + sqrt(st.norm[2 * l + 1][c]);
    }
    for (int r = 0; r < 16; r++) {
        int c = imp.mt_hid_order[r];
        CHECK(close_rel(imp.mt_hid_score[r], hid[c], 1e-4), "hidden %d: %g vs %g", c, imp.mt_hid_score[r], hid[c]);
    }
    /* layer ranking: descending 1 - cos of the direct computation */
    int order[3];
    ac_minitron_layer_order(&imp, order);
    for (int r = 1; r < 3; r++)
        CHECK(st.cos_sum[order[r]] <= st.cos_sum[order[r - 1]] * (1 + 1e-6),
              "layer rank %d: layer %d (%g) after %d (%g)", r, order[r], st.cos_sum[order[r]], order[r - 1],
              st.cos_sum[order[r - 1]]);
    ac_importance_free(&imp);
    ac_model_free(&m);
}

/* Trimming heads within groups equals zeroing the dropped heads' o_proj
 * columns in the unpruned model, and keeps each group's best heads. */
static void test_head_trim_equals_masking(void) {
    ac_err e;
    ac_model m, pm, mm;
    CHECK(mk_model(&m, &e) == 0, "%s", e.msg);
    int W = 4, ids[4 * T_];
    for (int i = 0; i < W * T_; i++) ids[i] = (int)(urand() * 40);
    ac_importance imp, view;
    CHECK(ac_importance_compute(&m, ids, W * T_, T_, W, 0, NULL, NULL, &imp, &e) == 0, "%s", e.msg);
    ac_minitron_importance_view(&imp, &view);
    ac_arch t;
    ac_arch_copy(&t, &m.a, &e);
    for (int l = 0; l < 3; l++) t.layers[l] = (ac_layer_arch){4, 2, 24, 0, 0, 0}; /* 2 of 4 heads in each of the 2 groups */
    CHECK(ac_prune(&m, &t, &view, &pm, &e) == 0, "%s", e.msg);
    CHECK(ac_model_alloc(&mm, &m.a, &e) == 0, "%s", e.msg);
    /* the masked copy */
    memcpy(mm.embed, m.embed, sizeof(float) * 40 * 16);
    memcpy(mm.lm_head, m.lm_head, sizeof(float) * 40 * 16);
    memcpy(mm.final_norm, m.final_norm, sizeof(float) * 16);
    for (int l = 0; l < 3; l++) {
        ac_layer_w *d = &mm.L[l], *s = &m.L[l];
        memcpy(d->in_norm, s->in_norm, 64);
        memcpy(d->post_norm, s->post_norm, 64);
        memcpy(d->wq, s->wq, 32 * 16 * 4);
        memcpy(d->wk, s->wk, 8 * 16 * 4);
        memcpy(d->wv, s->wv, 8 * 16 * 4);
        memcpy(d->wo, s->wo, 16 * 32 * 4);
        memcpy(d->wg, s->wg, 24 * 16 * 4);
        memcpy(d->wu, s->wu, 24 * 16 * 4);
        memcpy(d->wd, s->wd, 16 * 24 * 4);
        for (int g = 0; g < 2; g++)
            for (int j = 2; j < 4; j++) { /* the two weakest heads of group g */
                int h = imp.head_order[l][g * 4 + j];
                for (int r = 0; r < 16; r++) memset(d->wo + r * 32 + h * 4, 0, 16);
            }
        /* the pruned q rows are the kept heads' rows, in order */
        for (int g = 0; g < 2; g++) {
            int a0 = imp.head_order[l][g * 4], a1 = imp.head_order[l][g * 4 + 1], lo = a0 < a1 ? a0 : a1,
                hi = a0 < a1 ? a1 : a0;
            CHECK(!memcmp(pm.L[l].wq + (g * 2) * 4 * 16, m.L[l].wq + lo * 4 * 16, 4 * 16 * 4) &&
                      !memcmp(pm.L[l].wq + (g * 2 + 1) * 4 * 16, m.L[l].wq + hi * 4 * 16, 4 * 16 * 4),
                  "layer %d group %d keeps heads %d and %d", l, g, lo, hi);
        }
    }
    ac_engine e1, e2;
    CHECK(ac_engine_init(&e1, &pm, 1, T_, &e) == 0 && ac_engine_init(&e2, &mm, 1, T_, &e) == 0, "%s", e.msg);
    CHECK(ac_engine_forward(&e1, ids, 1, T_, 0, 0, &e) == 0 && ac_engine_forward(&e2, ids, 1, T_, 0, 0, &e) == 0, "%s",
          e.msg);
    double md = 0, mx = 0;
    for (int i = 0; i < T_ * 40; i++) {
        md = fmax(md, fabs(e1.logits[i] - e2.logits[i]));
        mx = fmax(mx, fabs(e2.logits[i]));
    }
    CHECK(md <= 1e-5 * mx, "pruned vs masked logits differ by %g (max %g)", md, mx);
    ac_engine_free(&e1);
    ac_engine_free(&e2);
    ac_model_free(&pm);
    ac_model_free(&mm);
    ac_arch_free(&t);
    ac_importance_free(&imp);
    ac_model_free(&m);
}

static int in_list(const json_t *arr, int v) {
    size_t i;
    json_t *x;
    json_array_foreach(arr, i, x) if (json_integer_value(x) == v) return 1;
    return 0;
}

static void predict(const ac_cost_table *t, const ac_workload *w, const ac_engine_profile *p, const ac_arch *a,
                    ac_cost *c) {
    ac_carch ca;
    ac_carch_from_arch(a, &ca, NULL);
    ac_cost_predict(t, &ca, w, p, 0, c);
    ac_carch_free(&ca);
}

static void check_options_grid(const ac_cost_table *t, const ac_workload *w, const ac_engine_profile *p,
                               const ac_importance *imp, const ac_arch *a);

/* The search on an 8-layer, 16-head / 4-KV-group model, H100 roofline, for a
 * TPOT, a throughput and a memory limit (unscored: no model given). */
static void test_search_grid_limits(void) {
    ac_cost_table t;
    ac_err e;
    ac_cost_roofline(ac_device_spec_find("H100"), "bf16", &t, &e);
    ac_arch a = mk_arch(8, 1024, 64, 16, 4, 4096, 32000);
    ac_importance imp;
    memset(&imp, 0, sizeof imp);
    imp.n_layers = 8;
    double bi[8] = {0.9, 0.05, 0.3, 0.02, 0.2, 0.1, 0.04, 0.5};
    imp.layer_bi = bi;
    ac_engine_profile p;
    ac_engine_profile_default(&p, 0);
    ac_workload w = {.batch = 64, .prompt_len = 1024, .gen_len = 128};
    ac_cost base;
    predict(&t, &w, &p, &a, &base);
    for (int kind = 0; kind < 3; kind++) {
        ac_search_problem P = {.table = &t, .workload = &w, .profile = &p, .imp = &imp, .base = &a};
        P.opts.prune_hidden = 1;
        if (kind == 0) P.limits.max_tpot_ms = 0.9 * base.tpot_ms;
        if (kind == 1) P.limits.min_tokens_per_s = 1.2 * base.tokens_per_s;
        if (kind == 2) P.limits.max_mem_gib = base.mem_gib - 0.25 * base.weights_gib;
        ac_search_result r;
        CHECK(ac_search_minitron(&P, &r, &e) == 0, "%s", e.msg);
        CHECK(r.feasible && ac_constraints_violation(&P.limits, &r.cost) <= 1e-12,
              "kind %d: feasible within the limit (tpot %g of %g, tok/s %g of %g, mem %g of %g)", kind, r.cost.tpot_ms,
              base.tpot_ms, r.cost.tokens_per_s, base.tokens_per_s, r.cost.mem_gib, base.mem_gib);
        json_t *ax = json_object_get(r.detail, "axes");
        json_t *sh = json_object_get(json_object_get(ax, "hidden_size"), "searched"),
               *sf = json_object_get(json_object_get(ax, "ffn_hidden_size"), "searched"),
               *sa = json_object_get(json_object_get(ax, "num_attention_heads"), "searched"),
               *sl = json_object_get(json_object_get(ax, "num_layers"), "searched");
        CHECK(json_array_size(sh) == 7 && json_integer_value(json_array_get(sh, 0)) == 640,
              "hidden: top 40%% of 16 choices from 640");
        CHECK(json_array_size(sf) == 7 && json_integer_value(json_array_get(sf, 0)) == 2560, "ffn: top 40%% from 2560");
        CHECK(json_array_size(sa) == 2 && json_integer_value(json_array_get(sa, 0)) == 12,
              "heads: 12 and 16 (3 or 4 per group)");
        CHECK(json_array_size(sl) == 2 && json_integer_value(json_array_get(sl, 0)) == 7,
              "layers: top 20%% of 1..8 = 7, 8");
        /* the result: uniform, every KV group kept, on the grid, lowest-scored layers dropped */
        int kept = 0, shape = -1;
        for (int l = 0; l < 8; l++) {
            const ac_layer_arch *L = &r.arch.layers[l];
            if (!L->n_heads && !L->ffn) {
                CHECK(bi[l] <= 0.05, "kind %d: dropped layer %d is not among the lowest-scored", kind, l);
                continue;
            }
            kept++;
            CHECK(L->n_kv_heads == 4 && L->n_heads % 4 == 0 && in_list(sa, L->n_heads) && in_list(sf, L->ffn),
                  "kind %d layer %d: %d heads %d KV ffn %d", kind, l, L->n_heads, L->n_kv_heads, L->ffn);
            int s = L->n_heads * 100000 + L->ffn;
            CHECK(shape < 0 || s == shape, "uniform");
            shape = s;
        }
        CHECK(in_list(sl, kept) && in_list(sh, r.arch.hidden), "kind %d: %d layers, hidden %d on the grid", kind, kept,
              r.arch.hidden);
        /* candidates: the feasible grid points closest to the limit, by the test's own enumeration */
        json_t *cands = json_object_get(r.detail, "candidates");
        int nf = 0;
        double worst_kept = 1e300, best_out = -1e300;
        size_t i1, i2, i3, i4;
        json_t *h, *f, *hh, *nl;
        json_array_foreach(sh, i1, h) json_array_foreach(sf, i2, f) json_array_foreach(sa, i3, hh)
            json_array_foreach(sl, i4, nl) {
            ac_arch c;
            ac_arch_copy(&c, &a, NULL);
            c.hidden = (int)json_integer_value(h);
            for (int l = 0; l < 8; l++)
                c.layers[l] = (ac_layer_arch){(int)json_integer_value(hh), 4, (int)json_integer_value(f), 0, 0, 0};
            int drop = 8 - (int)json_integer_value(nl); /* bi sorted: 0.02 (3), 0.04 (6), ... */
            if (drop >= 1) c.layers[3] = (ac_layer_arch){0, 0, 0, 0, 0, 0};
            ac_cost k;
            predict(&t, &w, &p, &c, &k);
            double v = ac_constraints_violation(&P.limits, &k);
            int listed = 0;
            size_t j;
            json_t *cd;
            json_array_foreach(cands, j, cd) listed |=
                json_integer_value(json_object_get(cd, "hidden_size")) == c.hidden &&
                json_integer_value(json_object_get(cd, "ffn_hidden_size")) == c.layers[0].ffn &&
                json_integer_value(json_object_get(cd, "num_attention_heads")) == c.layers[0].n_heads &&
                json_integer_value(json_object_get(cd, "num_layers")) == json_integer_value(nl);
            if (v <= 1e-12) {
                nf++;
                if (listed)
                    worst_kept = fmin(worst_kept, v);
                else
                    best_out = fmax(best_out, v);
            } else
                CHECK(!listed || json_integer_value(json_object_get(r.detail, "grid_feasible")) == 0,
                      "kind %d: an infeasible grid point is a candidate", kind);
            ac_arch_free(&c);
        }
        CHECK(json_integer_value(json_object_get(r.detail, "grid_size")) == 7 * 7 * 2 * 2, "grid size");
        CHECK(json_integer_value(json_object_get(r.detail, "grid_feasible")) == nf,
              "kind %d: %d feasible, test counts %d", kind,
              (int)json_integer_value(json_object_get(r.detail, "grid_feasible")), nf);
        CHECK((int)json_array_size(cands) == (nf < 10 ? nf : 10), "kind %d: %zu candidates of %d feasible", kind,
              json_array_size(cands), nf);
        CHECK(best_out <= worst_kept + 1e-12,
              "kind %d: a feasible point closer to the limit (%g) was left out (worst kept %g)", kind, best_out,
              worst_kept);
        ac_search_result_free(&r);
    }
    /* an impossible limit: infeasible, the closest point returned */
    ac_search_problem P = {.table = &t, .workload = &w, .profile = &p, .imp = &imp, .base = &a};
    P.limits.max_tpot_ms = 0.1 * base.tpot_ms;
    ac_search_result r;
    CHECK(ac_search_minitron(&P, &r, &e) == 0 && !r.feasible, "infeasible");
    ac_search_result_free(&r);
    check_options_grid(&t, &w, &p, &imp, &a);
    ac_arch_free(&a);
    ac_cost_table_free(&t);
}

/* Scored search on a random model of L layers: each candidate scored (on
 * masks over the source's weights, equal to pruning it for real), the
 * lowest calibration NLL kept, all KV groups kept. cover[0..2] count the
 * compared candidates with fewer hidden channels, fewer heads, fewer
 * layers than the model. */
/* A random model of L layers, its importance on 6 random windows, the L4
 * roofline, and a scored Minitron problem under a 0.9x parameter limit
 * (P points into the struct: it stays where it is). */
typedef struct {
    ac_model m;
    int ids[6 * T_];
    ac_importance imp;
    ac_cost_table t;
    ac_engine_profile p;
    ac_workload w;
    ac_search_problem P;
} scored_env;

static void scored_env_init(scored_env *s, int L) {
    ac_err e;
    int W = 6;
    CHECK(mk_model_layers(&s->m, L, &e) == 0, "%s", e.msg);
    for (int i = 0; i < W * T_; i++) s->ids[i] = (int)(urand() * 40);
    CHECK(ac_importance_compute(&s->m, s->ids, W * T_, T_, W, 0, NULL, NULL, &s->imp, &e) == 0, "%s", e.msg);
    ac_cost_roofline(ac_device_spec_find("L4"), "bf16", &s->t, &e);
    ac_engine_profile_default(&s->p, 0);
    s->w = (ac_workload){.batch = 1, .prompt_len = 64, .gen_len = 16};
    s->P = (ac_search_problem){.table = &s->t,
                               .workload = &s->w,
                               .profile = &s->p,
                               .imp = &s->imp,
                               .base = &s->m.a,
                               .model = &s->m,
                               .calib_ids = s->ids,
                               .n_calib = W * T_,
                               .ctx = T_};
    s->P.opts.prune_hidden = 1;
    s->P.limits.max_params = 0.9 * ac_arch_params(&s->m.a);
}

static void scored_env_free(scored_env *s) {
    ac_cost_table_free(&s->t);
    ac_importance_free(&s->imp);
    ac_model_free(&s->m);
}

/* A candidate of the report (its JSON) as an architecture of m. */
static void cand_arch_json(const ac_model *m, const json_t *c, ac_arch *ca) {
    ac_err e;
    CHECK(ac_arch_copy(ca, &m->a, &e) == 0, "%s", e.msg);
    ca->hidden = (int)json_integer_value(json_object_get(c, "hidden_size"));
    for (int l = 0; l < ca->n_layers; l++) ca->layers[l] = (ac_layer_arch){0, 0, 0, 0, 0, 0};
    size_t k;
    json_t *lk;
    json_array_foreach(json_object_get(c, "layers_kept"), k, lk) {
        ca->layers[json_integer_value(lk)] =
            (ac_layer_arch){(int)json_integer_value(json_object_get(c, "num_attention_heads")),
                            m->a.layers[0].n_kv_heads, (int)json_integer_value(json_object_get(c, "ffn_hidden_size")),
                            0, 0, 0};
    }
}

static void scored_search(int L, int cover[3]) {
    ac_err e;
    static scored_env env;
    scored_env_init(&env, L);
    ac_model m = env.m; /* a shallow view (freed with env) */
    int W = 6, *ids = env.ids;
    ac_importance imp = env.imp;
    ac_search_problem P = env.P;
    ac_search_result r;
    CHECK(ac_search_minitron(&P, &r, &e) == 0, "%s", e.msg);
    json_t *cands = json_object_get(r.detail, "candidates");
    int best = (int)json_integer_value(json_object_get(r.detail, "best_candidate"));
    CHECK(r.feasible && r.cost.params <= P.limits.max_params && json_array_size(cands) > 1, "feasible, %zu candidates",
          json_array_size(cands));
    size_t i;
    json_t *c;
    double bn = json_real_value(json_object_get(json_array_get(cands, best), "calib_nll"));
    json_array_foreach(cands, i, c) {
        CHECK(json_is_real(json_object_get(c, "calib_nll")), "candidate %zu scored", i);
        CHECK(json_real_value(json_object_get(c, "calib_nll")) >= bn, "candidate %zu scores better than the kept one",
              i);
    }
    CHECK(json_integer_value(json_object_get(json_array_get(cands, best), "hidden_size")) == r.arch.hidden,
          "kept the best");
    for (int l = 0; l < L; l++)
        CHECK(r.arch.layers[l].n_heads == 0 || r.arch.layers[l].n_kv_heads == 2, "layer %d keeps both KV groups", l);
    /* every candidate's score (masks on the source's weights, one layer at a
     * time) is what the candidate pruned for real (ac_prune) scores: same
     * function, sums in another order */
    ac_importance view;
    ac_minitron_importance_view(&imp, &view);
    ac_ppl_opts o = {.ctx = T_, .max_windows = 6, .batch = 4};
    double worst = 0;
    json_array_foreach(cands, i, c) {
        ac_arch ca;
        cand_arch_json(&m, c, &ca);
        cover[0] += ca.hidden < m.a.hidden;
        cover[1] += json_integer_value(json_object_get(c, "num_attention_heads")) < m.a.layers[0].n_heads;
        cover[2] += json_array_size(json_object_get(c, "layers_kept")) < (size_t)L;
        ac_model cm;
        ac_ppl_result cr;
        double cn = json_real_value(json_object_get(c, "calib_nll"));
        int ok = ac_prune(&m, &ca, &view, &cm, &e) == 0;
        CHECK(ok && ac_perplexity(&cm, ids, W * T_, &o, NULL, NULL, NULL, &cr, &e) == 0, "candidate %zu: %s", i, e.msg);
        if (ok) {
            worst = fmax(worst, fabs(cr.nll - cn) / cr.nll);
            ac_model_free(&cm);
        }
        ac_arch_free(&ca);
    }
    printf("   %zu candidates: scored on masks vs pruned copies, worst relative difference %.2e\n",
           json_array_size(cands), worst);
    CHECK(worst < 1e-6, "a candidate's score differs from its pruned model's by %.2e", worst);
    /* the kept candidate, pruned and compacted, is the same function */
    ac_model pm;
    CHECK(ac_prune(&m, &r.arch, &view, &pm, &e) == 0, "%s", e.msg);
    ac_ppl_result pr;
    CHECK(ac_perplexity(&pm, ids, W * T_, &o, NULL, NULL, NULL, &pr, &e) == 0 && fabs(pr.nll - bn) < 1e-6 * bn,
          "nll %g vs candidate %g", pr.nll, bn);
    int L0 = pm.a.n_layers, dropped = 0;
    for (int l = 0; l < L0; l++) dropped += !pm.a.layers[l].n_heads && !pm.a.layers[l].ffn;
    ac_minitron_compact(&pm);
    CHECK(pm.a.n_layers == L0 - dropped, "compact removes the %d dropped layers", dropped);
    ac_ppl_result pc;
    CHECK(ac_perplexity(&pm, ids, W * T_, &o, NULL, NULL, NULL, &pc, &e) == 0 && fabs(pc.nll - pr.nll) < 1e-6,
          "compacted model is the same function");
    ac_model_free(&pm);
    ac_search_result_free(&r);
    scored_env_free(&env);
}

/* Q questions of NC choices: a context of 5 random tokens, each choice 2. */
#define TQ 240
#define TNC 3
static void mk_task(ac_mc_task *t, int nq, const int (*toks)[TNC][7], const int *gold) {
    t->ndocs = nq;
    t->nreq = nq * TNC;
    t->gold = malloc(sizeof(int) * nq);
    t->first = malloc(sizeof(int) * (nq + 1));
    t->tok = malloc(sizeof(int) * t->nreq * 7);
    t->off = malloc(sizeof(size_t) * (t->nreq + 1));
    t->ncont = malloc(sizeof(int) * t->nreq);
    t->chars = malloc(sizeof(double) * t->nreq);
    for (int d = 0; d < nq; d++) {
        t->gold[d] = gold[d];
        t->first[d] = d * TNC;
        for (int c = 0; c < TNC; c++) {
            int r = d * TNC + c;
            memcpy(t->tok + (size_t)r * 7, toks[d][c], sizeof(int) * 7);
            t->off[r] = (size_t)r * 7;
            t->ncont[r] = 2;
            t->chars[r] = 2;
        }
    }
    t->first[nq] = t->nreq;
    t->off[t->nreq] = (size_t)t->nreq * 7;
}

static int argmax_choice(const double *ll) {
    int b = 0;
    for (int c = 1; c < TNC; c++)
        if (ll[c] > ll[b]) b = c;
    return b;
}

/* minitron score task: the candidates are the same as under loss scoring,
 * each gets its task accuracy, and the kept one is the highest accuracy
 * (the first of equals), not the lowest loss. The task is built so the two
 * disagree: its golds are the answers of the candidate with the worst loss,
 * on questions where the lowest-loss candidate answers otherwise (that one
 * scores 0, the worst-loss one 1). Accuracies are recomputed here from each
 * pruned candidate's log-likelihoods. */
static void test_task_scored_search(void) {
    ac_err e;
    static scored_env env;
    scored_env_init(&env, 3);
    ac_model m = env.m; /* a shallow view (freed with env) */
    ac_importance imp = env.imp;
    ac_search_problem P = env.P;
    ac_search_result rl;
    CHECK(ac_search_minitron(&P, &rl, &e) == 0, "%s", e.msg);
    json_t *cl = json_object_get(rl.detail, "candidates");
    int nc = (int)json_array_size(cl), bl = (int)json_integer_value(json_object_get(rl.detail, "best_candidate"));
    CHECK(nc > 2 && json_equal(json_object_get(rl.detail, "score"), json_string("loss")), "%d candidates", nc);
    int worst = bl == 0 ? 1 : 0;
    for (int i = 0; i < nc; i++)
        if (json_real_value(json_object_get(json_array_get(cl, i), "calib_nll")) >
            json_real_value(json_object_get(json_array_get(cl, worst), "calib_nll")))
            worst = i;
    /* every candidate's log-likelihoods on the random questions */
    static int toks[TQ][TNC][7];
    int gold0[TQ] = {0};
    for (int d = 0; d < TQ; d++) {
        int ctx[5];
        for (int k = 0; k < 5; k++) ctx[k] = (int)(urand() * 40); /* one context per question */
        for (int c = 0; c < TNC; c++)
            for (int k = 0; k < 7; k++) toks[d][c][k] = k < 5 ? ctx[k] : (int)(urand() * 40);
    }
    ac_mc_task all;
    mk_task(&all, TQ, (const int(*)[TNC][7])toks, gold0);
    double *ll = malloc(sizeof(double) * nc * TQ * TNC);
    ac_importance view;
    ac_minitron_importance_view(&imp, &view);
    for (int i = 0; i < nc; i++) {
        ac_arch ca;
        cand_arch_json(&m, json_array_get(cl, i), &ca);
        ac_model cm;
        ac_mc_result mr;
        CHECK(ac_prune(&m, &ca, &view, &cm, &e) == 0 && ac_mc_score(&cm, &all, 4, 0, ll + (size_t)i * TQ * TNC, &mr, &e) == 0,
              "candidate %d: %s", i, e.msg);
        ac_model_free(&cm);
        ac_arch_free(&ca);
    }
    /* the questions where the worst-loss and the lowest-loss candidates answer differently */
    static int sel[TQ][TNC][7];
    int gold[TQ], nq = 0, qi[TQ];
    for (int d = 0; d < TQ; d++) {
        int aw = argmax_choice(ll + ((size_t)worst * TQ + d) * TNC), ab = argmax_choice(ll + ((size_t)bl * TQ + d) * TNC);
        if (aw == ab) continue;
        memcpy(sel[nq], toks[d], sizeof toks[d]);
        gold[nq] = aw;
        qi[nq++] = d;
    }
    CHECK(nq >= 10, "only %d questions where the candidates disagree", nq);
    double acc[64], top = -1;
    int expect = -1;
    for (int i = 0; i < nc && i < 64; i++) {
        int right = 0;
        for (int q = 0; q < nq; q++) right += argmax_choice(ll + ((size_t)i * TQ + qi[q]) * TNC) == gold[q];
        acc[i] = (double)right / nq;
        if (acc[i] > top) top = acc[i], expect = i;
    }
    CHECK(acc[worst] == 1 && acc[bl] == 0 && expect != bl, "acc worst %g, lowest-loss %g", acc[worst], acc[bl]);
    ac_mc_task task;
    mk_task(&task, nq, (const int(*)[TNC][7])sel, gold);
    P.score_task = &task;
    P.score_name = "disagree";
    ac_search_result rt;
    CHECK(ac_search_minitron(&P, &rt, &e) == 0, "%s", e.msg);
    json_t *ct = json_object_get(rt.detail, "candidates");
    int bt = (int)json_integer_value(json_object_get(rt.detail, "best_candidate"));
    printf("   %d candidates, %d questions: loss keeps %d (acc %.3f), task keeps %d (acc %.3f, expected %d)\n", nc, nq, bl,
           acc[bl], bt, bt >= 0 && bt < 64 ? acc[bt] : -1, expect);
    CHECK((int)json_array_size(ct) == nc, "the same candidates");
    for (int i = 0; i < nc; i++) {
        json_t *a = json_array_get(cl, i), *b = json_array_get(ct, i);
        CHECK(json_equal(json_object_get(a, "layers_kept"), json_object_get(b, "layers_kept")) &&
                  json_integer_value(json_object_get(a, "hidden_size")) ==
                      json_integer_value(json_object_get(b, "hidden_size")),
              "candidate %d differs", i);
        CHECK(fabs(json_real_value(json_object_get(b, "task_acc")) - acc[i]) < 1e-12 &&
                  json_integer_value(json_object_get(b, "task_n")) == nq && !json_object_get(b, "calib_nll"),
              "candidate %d: task_acc %g, recomputed %g", i, json_real_value(json_object_get(b, "task_acc")), acc[i]);
    }
    CHECK(bt == expect, "kept candidate %d, the highest accuracy is %d", bt, expect);
    json_t *kept = json_array_get(ct, expect);
    CHECK(rt.arch.hidden == json_integer_value(json_object_get(kept, "hidden_size")), "the result is the kept one");
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(rt.detail, "score"), "task")), "disagree") &&
              !strcmp(json_string_value(json_object_get(json_object_get(rt.detail, "score"), "metric")), "acc"),
          "the report names the task and metric");
    ac_mc_free(&task);
    ac_mc_free(&all);
    free(ll);
    ac_search_result_free(&rt);
    ac_search_result_free(&rl);
    scored_env_free(&env);
}

/* The default divisors are Model-Optimizer's on 8B-class axes and about
 * 16 choices on small ones (the given ones: check_options_grid). */
static void test_default_divisors(void) {
    CHECK(ac_minitron_default_divisor(AC_MINITRON_HIDDEN_DIVISOR, 4096) == 256 &&
              ac_minitron_default_divisor(AC_MINITRON_FFN_DIVISOR, 14336) == 512 &&
              ac_minitron_default_divisor(AC_MINITRON_LAYERS_DIVISOR, 32) == 2 &&
              ac_minitron_default_divisor(AC_MINITRON_EXPERTS_DIVISOR, 128) == 8 &&
              ac_minitron_default_divisor(AC_MINITRON_HIDDEN_DIVISOR, 8192) == 256,
          "Model-Optimizer's divisors on 8B-class and larger axes");
    CHECK(ac_minitron_default_divisor(AC_MINITRON_HIDDEN_DIVISOR, 128) == 8 &&
              ac_minitron_default_divisor(AC_MINITRON_FFN_DIVISOR, 384) == 24 &&
              ac_minitron_default_divisor(AC_MINITRON_LAYERS_DIVISOR, 6) == 1,
          "small axes keep about 16 choices");
}

/* The given caps, divisors and top_k on test_search_grid_limits' problem
 * (Model-Optimizer's defaults are what that test checks). */
static void check_options_grid(const ac_cost_table *t, const ac_workload *w, const ac_engine_profile *p,
                               const ac_importance *imp, const ac_arch *a) {
    ac_err e;
    ac_search_problem P = {.table = t, .workload = w, .profile = p, .imp = imp, .base = a};
    P.opts.prune_hidden = 1;
    P.limits.max_params = 0.5 * ac_arch_params(a);
    P.minitron = (ac_minitron_opts){.max_width_pruning = 0.6, .max_depth_pruning = 0.5, .top_k = 3,
                                    .hidden_divisor = 256, .ffn_divisor = 512, .layers_divisor = 2};
    ac_search_result r;
    CHECK(ac_search_minitron(&P, &r, &e) == 0, "%s", e.msg);
    json_t *ax = json_object_get(r.detail, "axes");
    json_t *h = json_object_get(ax, "hidden_size"), *f = json_object_get(ax, "ffn_hidden_size"),
           *l = json_object_get(ax, "num_layers");
    /* hidden 256..1024: 4 choices, from int(0.4 * 4) = 1; ffn 512..4096: 8, from int(0.4 * 8) = 3;
     * layers 2..8: 4, from int(0.5 * 4) = 2 */
    CHECK(json_integer_value(json_object_get(h, "divisor")) == 256 &&
              json_array_size(json_object_get(h, "choices")) == 4 &&
              json_integer_value(json_array_get(json_object_get(h, "searched"), 0)) == 512,
          "hidden divisor 256, cap 0.6");
    CHECK(json_integer_value(json_object_get(f, "divisor")) == 512 &&
              json_array_size(json_object_get(f, "choices")) == 8 &&
              json_integer_value(json_array_get(json_object_get(f, "searched"), 0)) == 2048,
          "ffn divisor 512, cap 0.6");
    CHECK(json_integer_value(json_object_get(l, "divisor")) == 2 &&
              json_integer_value(json_array_get(json_object_get(l, "searched"), 0)) == 6,
          "layers divisor 2, cap 0.5");
    CHECK(json_integer_value(json_object_get(r.detail, "top_k")) == 3 &&
              (json_int_t)json_array_size(json_object_get(r.detail, "candidates")) ==
                  (json_integer_value(json_object_get(r.detail, "grid_feasible")) < 3
                       ? json_integer_value(json_object_get(r.detail, "grid_feasible"))
                       : 3) &&
              json_real_value(json_object_get(r.detail, "max_width_pruning")) == 0.6,
          "top_k 3 and the caps reported");
    ac_search_result_free(&r);
}

/* 3 layers (no depth choice under Model-Optimizer's 20 % cap) and 10 (9
 * or 10 kept): between them the candidates compared with their pruned
 * models narrow the hidden width, trim heads and drop layers. */
static void test_scored_search_keeps_best(void) {
    int cover[3] = {0, 0, 0};
    scored_search(3, cover);
    scored_search(10, cover);
    printf("   candidates compared: %d with fewer hidden channels, %d with fewer heads, %d with fewer layers\n",
           cover[0], cover[1], cover[2]);
    CHECK(cover[0] > 0 && cover[1] > 0 && cover[2] > 0, "the candidates do not cover every axis");
}

int main(void) {
    ac_set_threads(1);
    RUN(test_choices_and_caps);
    RUN(test_importance_matches_direct_forward);
    RUN(test_head_trim_equals_masking);
    RUN(test_search_grid_limits);
    RUN(test_scored_search_keeps_best);
    RUN(test_task_scored_search);
    RUN(test_default_divisors);
    return DONE();
}
