/*
 * test_stream.c - layer-streamed calibration (src/search/stream.c and the
 * CPU methods of importance.c) on the tiny model, against the engine-based
 * method (ENGINE: full-model passes on weight-edited and pruned whole-model
 * copies): the streamed pass gives the same activation statistics,
 * rankings, base loss and hidden-width curve (masks on activations vs
 * pruned copies); EXACT (every point carried through the rest of the
 * network) gives ENGINE's curves; a layer with merged KV heads equals the
 * engine on a KV-merged model; the backward of the loss and of the layers
 * matches finite differences of the forward; the STREAMED (gradient) and
 * ANCHORED curves rank the (layer, point) costs as the exact ones do
 * (Spearman); and STREAMED on the tiny model saved as BF16 and loaded
 * resident (mmap'd, read-only) equals STREAMED on the same weights in fp32.
 * Mixture-of-experts and hybrid (nemotron_h) fixtures: test_moe_layers,
 * test_moe_resident, test_hybrid_layers, test_hybrid_exact (a hybrid's
 * EXACT curves, Mamba heads included, against pruned models; its STREAMED
 * and ANCHORED curves against EXACT's, as test_proxy_ranking's).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "runtime/eval.h"
#include "imp_compare.h"
#include "search/importance.h"
#include "runtime/kernels_cpu.h"
#include "compress/prune.h"
#include "format/safetensors.h"
#include "search/stream.h"
#include "synth.h"

static ac_model M;
static ac_importance EX, ST, EN, AN;
static int *IDS, HAVE;
static size_t NIDS;

static int setup(void) {
    if (HAVE) return HAVE > 0;
    ac_err e;
    HAVE = -1;
    if (ck_load_tiny(&M, &IDS, &NIDS, 4096, &e)) return 0;
    const int mode[4] = {AC_CALIB_ENGINE, AC_CALIB_EXACT, AC_CALIB_STREAMED, AC_CALIB_ANCHORED};
    ac_importance *out[4] = {&EN, &EX, &ST, &AN};
    for (int i = 0; i < 4; i++) {
        double t0 = ck_now();
        if (ac_importance_compute_mode(&M, IDS, NIDS, 64, 32, 0, mode[i], NULL, NULL, out[i], &e)) {
            fprintf(stderr, "  %s\n", e.msg);
            return 0;
        }
        printf("  method %d: %.2f s\n", mode[i], ck_now() - t0);
    }
    if (0) {
        fprintf(stderr, "  %s\n", e.msg);
        return 0;
    }
    HAVE = 1;
    return 1;
}

static int close_rel(double a, double b, double tol) { return fabs(a - b) <= tol * fmax(1e-9, fmax(fabs(a), fabs(b))); }

/* The streamed pass (STREAMED) against the engine's (ENGINE). */
static void test_statistics_match(void) {
    if (!setup()) SKIP("no tiny model (make models)");
    ac_importance EX = EN;
    CHECK(EX.method == AC_CALIB_ENGINE && ST.streamed && ST.method == AC_CALIB_STREAMED, "methods %d %d", EX.method,
          ST.method);
    CHECK(ST.tokens == EX.tokens, "tokens %ld vs %ld", ST.tokens, EX.tokens);
    CHECK(close_rel(ST.base_loss, EX.base_loss, 1e-5), "base loss %.8f vs %.8f", ST.base_loss, EX.base_loss);
    int bad = 0;
    for (int l = 0; l < M.a.n_layers; l++) {
        const ac_layer_arch *la = &M.a.layers[l];
        bad += !close_rel(ST.layer_bi[l], EX.layer_bi[l], 1e-4);
        for (int g = 0; g < la->n_kv_heads; g++) bad += !close_rel(ST.kv_score[l][g], EX.kv_score[l][g], 1e-4);
        for (int c = 0; c < la->ffn; c++) bad += !close_rel(ST.ffn_score[l][c], EX.ffn_score[l][c], 1e-4);
        for (int h = 0; h < la->n_heads; h++) bad += !close_rel(ST.head_score[l][h], EX.head_score[l][h], 1e-4);
        bad += memcmp(ST.kv_order[l], EX.kv_order[l], sizeof(int) * la->n_kv_heads) != 0;
    }
    for (int c = 0; c < M.a.hidden; c++) bad += !close_rel(ST.hid_score[c], EX.hid_score[c], 1e-4);
    CHECK(bad == 0, "%d statistics differ", bad);
    /* masked hidden channels vs pruned copies: the same values, summed in another order */
    for (int i = 0; i < 4; i++)
        CHECK(fabs(ST.hid_sens[i] - EX.hid_sens[i]) < 1e-5 + 1e-4 * EX.hid_sens[i], "hidden curve %d: %g vs %g", i,
              ST.hid_sens[i], EX.hid_sens[i]);
    CHECK(EX.hid_sens[3] > 0.05, "hidden curve too flat to compare: %g", EX.hid_sens[3]);
}

/* EXACT (streamed, masks on activations, every point carried through the
 * rest of the network) gives ENGINE's curves (weights edited, pruned copies). */
static void test_exact_is_engine(void) {
    if (!setup()) SKIP("no tiny model (make models)");
    int bad = 0, n = 0;
    double worst = 0;
    for (int l = 0; l < M.a.n_layers; l++) {
        for (int p = 1; p < AC_SENS_POINTS; p++) {
            double da = fabs(EX.attn_sens[l][p] - EN.attn_sens[l][p]), df = fabs(EX.ffn_sens[l][p] - EN.ffn_sens[l][p]);
            bad += da > 1e-4 + 1e-3 * EN.attn_sens[l][p];
            bad += df > 1e-4 + 1e-3 * EN.ffn_sens[l][p];
            worst = fmax(worst, fmax(da, df));
            n += 2;
        }
        CHECK(EX.merge_n[l] == EN.merge_n[l], "layer %d: %d vs %d merge points", l, EX.merge_n[l], EN.merge_n[l]);
        for (int k = 0; k < EX.merge_n[l] && k < EN.merge_n[l]; k++) {
            double d = fabs(EX.merge_sens[l][k] - EN.merge_sens[l][k]);
            bad += d > 1e-4 + 1e-3 * EN.merge_sens[l][k] || EX.merge_r[l][k] != EN.merge_r[l][k];
            worst = fmax(worst, d);
            n++;
        }
    }
    printf("  exact (streamed) vs engine: %d points, largest |diff| %.2e nats\n", n, worst);
    CHECK(bad == 0, "%d of %d points differ", bad, n);
    CHECK(close_rel(EX.base_loss, EN.base_loss, 1e-5), "base loss %.8f vs %.8f", EX.base_loss, EN.base_loss);
}

/* The backward (loss, then layers) of m on W windows of ctx tokens of ids
 * against central finite differences of the forward along a random
 * direction at the input of layer 1 (the mean of those with the nh step
 * sizes hs). */
static void grad_check(const ac_model *m, const int *ids, int W, int ctx, const double *hs, int nh, const char *tag) {
    int H = m->a.hidden, L = m->a.n_layers;
    size_t S = (size_t)W * ctx * H;
    ac_err e = {{0}};
    ac_stream s = {0};
    float *x1 = malloc(S * 4), *y = malloc(S * 4), *d = malloc(S * 4), *dir = malloc(S * 4);
    float **xin = calloc(L + 1, sizeof *xin);
    int ok = x1 && y && d && dir && xin && ac_stream_init(&s, m, W, ctx, &e) == 0;
    ok = ok && ac_stream_want_grad(&s, &e) == 0;
    CHECK(ok, "%s: init: %s", tag, e.msg);
    if (!ok) {
        free(x1), free(y), free(d), free(dir), free(xin);
        ac_stream_free(&s);
        return;
    }
    CHECK(ac_stream_embed(m, ids, (long)W * ctx, x1, &e) == 0, "%s", e.msg);
    for (int l = 0; l <= L; l++) {
        xin[l] = malloc(S * 4);
        memcpy(xin[l], x1, S * 4);
        if (l < L) ac_stream_layer(&s, l, x1, W, NULL, NULL);
    }
    ac_stream_nll_grad(&s, xin[L], ids, W, NULL, d);
    for (int l = L - 1; l >= 1; l--) ac_stream_layer_backward(&s, l, xin[l], d, W);
    unsigned r = 12345;
    double gd = 0;
    for (size_t i = 0; i < S; i++) {
        r = r * 1103515245u + 12345u;
        dir[i] = ((r >> 9) & 0xffff) / 32768.0f - 1.0f;
        gd += (double)d[i] * dir[i];
    }
    double fd = 0;
    for (int k = 0; k < nh; k++) {
        double h = hs[k], f[2];
        for (int sgn = 0; sgn < 2; sgn++) {
            for (size_t i = 0; i < S; i++) y[i] = xin[1][i] + (sgn ? -h : h) * dir[i];
            for (int l = 1; l < L; l++) ac_stream_layer(&s, l, y, W, NULL, NULL);
            f[sgn] = ac_stream_nll(&s, y, ids, W, NULL, NULL);
        }
        fd += (f[0] - f[1]) / (2 * h) / nh;
    }
    printf("  %s: d loss along a direction at layer 1's input: backward %.6f, finite differences %.6f\n", tag, gd, fd);
    CHECK(fabs(gd - fd) < 2e-3 * fmax(1.0, fabs(fd)), "%s: backward %.6f vs finite differences %.6f", tag, gd, fd);
    CHECK(fabs(fd) > 1e-3, "%s: direction with no slope (%g): the check would prove nothing", tag, fd);
    for (int l = 0; l <= L; l++) free(xin[l]);
    free(xin);
    free(x1);
    free(y);
    free(d);
    free(dir);
    ac_stream_free(&s);
}

static void test_gradient(void) {
    if (!setup()) SKIP("no tiny model (make models)");
    const double h = 1e-2;
    grad_check(&M, IDS, 2, 64, &h, 1, "tiny");
}

/* A streamed layer with KV heads merged to 1 and then the rest of the
 * network gives the loss of the engine on ac_prune's merged model. */
static void test_merge_layer(void) {
    if (!setup()) SKIP("no tiny model (make models)");
    int l = M.a.n_layers - 1, ctx = 64, W = 4, H = M.a.hidden;
    if (M.a.layers[l].n_kv_heads < 2) SKIP("last layer has one KV head");
    ac_err e;
    ac_arch t;
    ac_model pm;
    CHECK(ac_arch_copy(&t, &M.a, &e) == 0, "%s", e.msg);
    t.layers[l].n_kv_heads = 1;
    CHECK(ac_prune(&M, &t, &EX, &pm, &e) == 0, "%s", e.msg);
    ac_ppl_opts o = {.ctx = ctx, .max_windows = W, .batch = 4};
    ac_ppl_result r;
    CHECK(ac_perplexity(&pm, IDS, NIDS, &o, NULL, NULL, NULL, &r, &e) == 0, "%s", e.msg);
    ac_stream s;
    float *x = malloc(sizeof(float) * W * ctx * H);
    CHECK(x && ac_stream_init(&s, &M, W, ctx, &e) == 0, "stream init");
    CHECK(ac_stream_embed(&M, IDS, (long)W * ctx, x, &e) == 0, "%s", e.msg);
    ac_stream_mod mod = {.kv_merge = 1};
    for (int i = 0; i < M.a.n_layers; i++) ac_stream_layer(&s, i, x, W, i == l ? &mod : NULL, NULL);
    long cnt;
    double nll = ac_stream_nll(&s, x, IDS, W, NULL, &cnt) / cnt;
    CHECK(close_rel(nll, r.nll, 1e-5), "merged loss %.8f vs engine on the pruned model %.8f", nll, r.nll);
    ac_stream_free(&s);
    free(x);
    ac_model_free(&pm);
    ac_arch_free(&t);
}

static void ranks(const double *v, int n, double *r) {
    for (int i = 0; i < n; i++) {
        int less = 0, eq = 0;
        for (int j = 0; j < n; j++) less += v[j] < v[i], eq += v[j] == v[i];
        r[i] = less + (eq - 1) / 2.0;
    }
}

/* Spearman correlation of all (layer, sub-block, point) curve values of P
 * against EX's; mean |diff| in *mad. */
static double spearman(const ac_importance *P, double *mad) {
    int L = M.a.n_layers, n = 0;
    static double a[1024], b[1024], ra[1024], rb[1024];
    for (int l = 0; l < L && n < 1000; l++) {
        for (int p = 1; p < AC_SENS_POINTS; p++) {
            a[n] = EX.attn_sens[l][p], b[n++] = P->attn_sens[l][p];
            a[n] = EX.ffn_sens[l][p], b[n++] = P->ffn_sens[l][p];
        }
        for (int k = 0; k < EX.merge_n[l] && k < P->merge_n[l]; k++)
            a[n] = EX.merge_sens[l][k], b[n++] = P->merge_sens[l][k];
    }
    ranks(a, n, ra);
    ranks(b, n, rb);
    double ma = 0, mb = 0, sab = 0, saa = 0, sbb = 0;
    *mad = 0;
    for (int i = 0; i < n; i++) ma += ra[i] / n, mb += rb[i] / n;
    for (int i = 0; i < n; i++) {
        sab += (ra[i] - ma) * (rb[i] - mb), saa += (ra[i] - ma) * (ra[i] - ma), sbb += (rb[i] - mb) * (rb[i] - mb);
        *mad += fabs(b[i] - a[i]) / n;
    }
    return sab / sqrt(saa * sbb);
}

static void test_proxy_ranking(void) {
    if (!setup()) SKIP("no tiny model (make models)");
    int L = M.a.n_layers;
    if (getenv("AC_STREAM_DUMP"))
        for (int l = 0; l < L; l++)
            printf("  layer %d attn %.4f %.4f %.4f %.4f | %.4f %.4f %.4f %.4f  "
                   "ffn %.4f %.4f %.4f %.4f | %.4f %.4f %.4f %.4f\n",
                   l, EX.attn_sens[l][1], EX.attn_sens[l][2], EX.attn_sens[l][3], EX.attn_sens[l][4],
                   ST.attn_sens[l][1], ST.attn_sens[l][2], ST.attn_sens[l][3], ST.attn_sens[l][4], EX.ffn_sens[l][1],
                   EX.ffn_sens[l][2], EX.ffn_sens[l][3], EX.ffn_sens[l][4], ST.ffn_sens[l][1], ST.ffn_sens[l][2],
                   ST.ffn_sens[l][3], ST.ffn_sens[l][4]);
    double ms, ma, rs = spearman(&ST, &ms), ra = spearman(&AN, &ma);
    printf("  vs exact curves (attention, FFN, KV merge points): streamed (gradient) Spearman %.3f, mean |diff| "
           "%.4f nats; anchored Spearman %.3f, mean |diff| %.4f\n",
           rs, ms, ra, ma);
    CHECK(rs > 0.8, "streamed Spearman %.3f", rs);
    CHECK(ra > 0.7, "anchored Spearman %.3f", ra);
    /* the largest exact point (layer 0's whole FFN), underestimated by the
     * second-order term, still ranks first among the streamed ones */
    int bl = 0, bp = 1, bf = 0;
    double best_st = -1;
    for (int l = 0; l < L; l++)
        for (int p = 1; p < AC_SENS_POINTS; p++)
            for (int f = 0; f < 2; f++) {
                double ex = f ? EX.ffn_sens[l][p] : EX.attn_sens[l][p], st = f ? ST.ffn_sens[l][p] : ST.attn_sens[l][p];
                if (ex > (bf ? EX.ffn_sens[bl][bp] : EX.attn_sens[bl][bp])) bl = l, bp = p, bf = f;
                if (st > best_st) best_st = st;
            }
    double ex = bf ? EX.ffn_sens[bl][bp] : EX.attn_sens[bl][bp], st = bf ? ST.ffn_sens[bl][bp] : ST.attn_sens[bl][bp];
    printf("  largest exact point: layer %d %s point %d, %.2f nats exact, %.2f streamed\n", bl, bf ? "FFN" : "attention",
           bp, ex, st);
    CHECK(st >= best_st, "the largest exact point (%.3f) is not the largest streamed one (%.3f < %.3f)", ex, st,
          best_st);
}

/* The tiny model saved as BF16 and loaded resident (matrices left in the
 * read-only mapping): STREAMED runs on it (masks on activations, backward
 * through 16-bit weights) and gives what it gives on the same BF16 values
 * loaded as fp32 (exact GEMMs: AMX off), and so does the ENGINE method,
 * which masks private copies of one matrix at a time. */
static void test_resident(void) {
    if (!setup()) SKIP("no tiny model (make models)");
    char dir[] = "/tmp/ac_test_stream_XXXXXX";
    ac_err e;
    ac_model r, f;
    ac_importance a, b;
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    CHECK(ac_model_save(&M, dir, ST_BF16, &e) == 0, "%s", e.msg);
    CHECK(ac_model_load_resident(dir, &r, &e) == 0 && ac_model_load(dir, &f, &e) == 0, "%s", e.msg);
    CHECK(ac_model_wdt(&r) == ST_BF16 && ac_model_wdt(&f) == ST_F32, "dtypes %d %d", ac_model_wdt(&r),
          ac_model_wdt(&f));
    int rows = ac_bf16_gemm_rows();
    ac_set_bf16_gemm_rows(0);
    CHECK(ac_importance_compute_mode(&r, IDS, NIDS, 64, 32, 0, AC_CALIB_STREAMED, NULL, NULL, &a, &e) == 0, "%s",
          e.msg);
    CHECK(ac_importance_compute_mode(&f, IDS, NIDS, 64, 32, 0, AC_CALIB_STREAMED, NULL, NULL, &b, &e) == 0, "%s",
          e.msg);
    ac_set_bf16_gemm_rows(rows);
    int bad = 0, n = 0;
    for (int l = 0; l < M.a.n_layers; l++) {
        for (int p = 1; p < AC_SENS_POINTS; p++, n += 2) {
            bad += fabs(a.attn_sens[l][p] - b.attn_sens[l][p]) > 1e-5 + 1e-3 * b.attn_sens[l][p];
            bad += fabs(a.ffn_sens[l][p] - b.ffn_sens[l][p]) > 1e-5 + 1e-3 * b.ffn_sens[l][p];
        }
        for (int k = 0; k < b.merge_n[l]; k++, n++)
            bad += fabs(a.merge_sens[l][k] - b.merge_sens[l][k]) > 1e-5 + 1e-3 * b.merge_sens[l][k];
        bad += memcmp(a.ffn_order[l], b.ffn_order[l], sizeof(int) * M.a.layers[l].ffn) != 0;
    }
    for (int i = 0; i < 4; i++, n++) bad += fabs(a.hid_sens[i] - b.hid_sens[i]) > 1e-5 + 1e-3 * b.hid_sens[i];
    CHECK(bad == 0, "resident vs fp32: %d of %d values differ", bad, n);
    CHECK(close_rel(a.base_loss, b.base_loss, 1e-5), "base loss %.8f vs %.8f", a.base_loss, b.base_loss);
    /* the engine method (CUDA) masks a copy of one matrix at a time, in the
     * model's dtype: on the mapping it gives what it gives on the fp32 load
     * of the same values (fp32 GEMMs), and every layer pointer is back */
    ac_importance c, d;
    float *wo0 = r.L[0].wo, *wdl = r.L[r.a.n_layers - 1].wd;
    ac_set_bf16_gemm_rows(0);
    int ok = ac_importance_compute_mode(&r, IDS, NIDS, 64, 32, 0, AC_CALIB_ENGINE, NULL, NULL, &c, &e) == 0;
    CHECK(ok, "engine method on a resident model: %s", e.msg);
    ok = ok && ac_importance_compute_mode(&f, IDS, NIDS, 64, 32, 0, AC_CALIB_ENGINE, NULL, NULL, &d, &e) == 0;
    ac_set_bf16_gemm_rows(rows);
    CHECK(r.L[0].wo == wo0 && r.L[r.a.n_layers - 1].wd == wdl, "layer pointers not restored");
    if (ok) {
        bad = imp_differences(&c, &d, &M.a, 1e-6, 1e-4, &n);
        printf("   engine method, resident vs fp32 load: base loss %.9f / %.9f, o_proj curve of layer 0 at 100 %% "
               "%.9f / %.9f\n",
               c.base_loss, d.base_loss, c.attn_sens[0][AC_SENS_POINTS - 1], d.attn_sens[0][AC_SENS_POINTS - 1]);
        CHECK(c.method == AC_CALIB_ENGINE && bad == 0, "engine method, resident vs fp32: %d of %d values differ", bad,
              n);
        CHECK(close_rel(c.base_loss, d.base_loss, 1e-6), "base loss %.9f vs %.9f", c.base_loss, d.base_loss);
        ac_importance_free(&c);
        ac_importance_free(&d);
    }
    ac_importance_free(&a);
    ac_importance_free(&b);
    ac_model_free(&r);
    ac_model_free(&f);
    CHECK(ck_rmtree(dir) == 0, "cleanup %s", dir);
}

/* MoE fixture `name` loaded in fp32 (dir gets its folder); 0 on success. */
static int load_moe(const char *name, char *dir, size_t dn, ac_model *m, ac_err *e) {
    char rel[256];
    snprintf(rel, sizeof rel, "fixtures/models/%s", name);
    ck_build_path(dir, dn, rel);
    return ac_model_load(dir, m, e);
}

/* n pseudo-random token ids of vocabulary V from seed. */
static void lcg_ids(int *ids, int n, int V, unsigned rng) {
    for (int i = 0; i < n; i++) ids[i] = (int)((rng = rng * 1664525u + 1013904223u) >> 8) % V;
}

/* Mixture-of-experts layers streamed (the fixtures: Mixtral, 3 experts;
 * Qwen3-MoE, 5 experts, a dense layer between): EXACT's base loss is the
 * engine's, experts are ranked, and each MoE layer's last curve point
 * (all experts but top_k removed from the routing by the stream's mask)
 * equals the engine's loss on the model ac_prune slices those experts out
 * of (renormalised routing over the kept ones). The engine method (what a
 * CUDA target runs, here on the CPU engine: the expert curves from pruned
 * copies) gives EXACT's curves within test_exact_is_engine's tolerances. */
static void test_moe_layers(void) {
    const char *names[] = {"mixtral_f32", "qwen3moe_mixed_bf16"};
    for (int f = 0; f < 2; f++) {
        char dir[1200];
        ac_model m;
        ac_err e = {{0}};
        if (load_moe(names[f], dir, sizeof dir, &m, &e)) SKIP("no MoE fixture %s (make fixtures): %s", names[f], e.msg);
        const ac_arch *a = &m.a;
        enum { CTX = 11, NW = 4 };
        int ids[CTX * NW];
        lcg_ids(ids, CTX * NW, a->vocab, 11 + f);
        ac_importance imp;
        CHECK(ac_importance_compute_mode(&m, ids, CTX * NW, CTX, NW, 0, AC_CALIB_EXACT, NULL, NULL, &imp, &e) == 0,
              "%s: %s", names[f], e.msg);
        ac_ppl_opts o = {.ctx = CTX, .max_windows = NW, .batch = 2};
        ac_ppl_result base;
        CHECK(ac_perplexity(&m, ids, CTX * NW, &o, NULL, NULL, NULL, &base, &e) == 0, "%s", e.msg);
        CHECK(close_rel(imp.base_loss, base.nll, 1e-5), "%s: base loss %.8f vs engine %.8f", names[f], imp.base_loss,
              base.nll);
        /* the engine method (a CUDA target's; here on the CPU engine): each expert curve from pruned copies */
        ac_importance en;
        if (ac_importance_compute_mode(&m, ids, CTX * NW, CTX, NW, 0, AC_CALIB_ENGINE, NULL, NULL, &en, &e) == 0) {
            int n = 0, bad = imp_differences(&imp, &en, a, 1e-4, 1e-3, &n);
            printf("   %s: engine method vs exact, %d of %d values differ\n", names[f], bad, n);
            CHECK(en.method == AC_CALIB_ENGINE && bad == 0, "%s: engine method %d, %d of %d values differ", names[f],
                  en.method, bad, n);
            ac_importance_free(&en);
        } else
            CHECK(0, "%s: engine method: %s", names[f], e.msg);
        for (int l = 0; l < a->n_layers; l++) {
            int E = a->layers[l].n_experts;
            if (!E) continue;
            CHECK(imp.expert_order && imp.expert_order[l], "%s layer %d: experts not ranked", names[f], l);
            ac_arch t;
            ac_model pm;
            CHECK(ac_arch_copy(&t, a, &e) == 0, "%s", e.msg);
            t.layers[l].n_experts = a->top_k;
            CHECK(ac_prune(&m, &t, &imp, &pm, &e) == 0, "%s: %s", names[f], e.msg);
            ac_model pb; /* the job's BF16 students: the same weights rounded */
            CHECK(ac_prune_bf16(&m, &t, &imp, &pb, &e) == 0, "%s: %s", names[f], e.msg);
            CHECK(bf16_matches(&pb, &pm), "%s layer %d: BF16 prune differs from the fp32 one rounded", names[f], l);
            ac_model_free(&pb);
            ac_ppl_result pr;
            CHECK(ac_perplexity(&pm, ids, CTX * NW, &o, NULL, NULL, NULL, &pr, &e) == 0, "%s", e.msg);
            /* the curve is monotone and >= 0 (a random model may gain from a removal) */
            double want = fmax(0, fmax(pr.nll - base.nll, imp.ffn_sens[l][3])), got = imp.ffn_sens[l][4];
            printf("   %s layer %d: %d of %d experts kept: +%.5f nats (streamed mask) vs +%.5f (pruned copy)\n",
                   names[f], l, a->top_k, E, got, pr.nll - base.nll);
            CHECK(fabs(got - want) < 1e-5 + 1e-4 * fabs(want), "%s layer %d: %.6f vs %.6f", names[f], l, got, want);
            ac_model_free(&pm);
            ac_arch_free(&t);
        }
        ac_importance_free(&imp);
        ac_model_free(&m);
    }
}

/* STREAMED on a resident BF16 mixture-of-experts checkpoint (the Qwen3-MoE
 * fixture, matrices left in the mapping: the router's and every expert's
 * forward and backward through 16-bit weights) against STREAMED on its fp32
 * load (the same values; exact GEMMs, AMX off): it runs as STREAMED (not
 * the anchored fallback), and its curves (the MoE layers' expert curves
 * among them), orders and base loss agree within test_resident's
 * tolerances. */
static void test_moe_resident(void) {
    char dir[1200];
    ac_model r, f;
    ac_err e = {{0}};
    if (load_moe("qwen3moe_mixed_bf16", dir, sizeof dir, &f, &e)) SKIP("no MoE fixture (make fixtures): %s", e.msg);
    CHECK(ac_model_load_resident(dir, &r, &e) == 0 && ac_model_wdt(&r) == ST_BF16, "resident: %s", e.msg);
    enum { CTX = 16, NW = 6 };
    int ids[CTX * NW];
    lcg_ids(ids, CTX * NW, f.a.vocab, 29);
    ac_importance a, b;
    int rows = ac_bf16_gemm_rows();
    ac_set_bf16_gemm_rows(0);
    int ok = ac_importance_compute_mode(&r, ids, CTX * NW, CTX, NW, 0, AC_CALIB_STREAMED, NULL, NULL, &a, &e) == 0;
    CHECK(ok, "streamed on the resident MoE checkpoint: %s", e.msg);
    ok = ok && ac_importance_compute_mode(&f, ids, CTX * NW, CTX, NW, 0, AC_CALIB_STREAMED, NULL, NULL, &b, &e) == 0;
    ac_set_bf16_gemm_rows(rows);
    if (ok) {
        int n = 0, bad = imp_differences(&a, &b, &f.a, 1e-5, 1e-3, &n);
        for (int l = 0; l < f.a.n_layers; l++)
            bad += f.a.layers[l].n_experts &&
                   memcmp(a.expert_order[l], b.expert_order[l], sizeof(int) * f.a.layers[l].n_experts);
        printf("   resident BF16 vs fp32 load, streamed: method %d / %d, base loss %.8f / %.8f, MoE layer 0 curve at "
               "100 %% %.6f / %.6f, %d of %d values differ\n",
               a.method, b.method, a.base_loss, b.base_loss, a.ffn_sens[0][AC_SENS_POINTS - 1],
               b.ffn_sens[0][AC_SENS_POINTS - 1], bad, n);
        CHECK(a.method == AC_CALIB_STREAMED && a.streamed, "the resident checkpoint fell back to method %d", a.method);
        CHECK(bad == 0, "resident vs fp32: %d of %d values differ", bad, n);
        CHECK(close_rel(a.base_loss, b.base_loss, 1e-5), "base loss %.8f vs %.8f", a.base_loss, b.base_loss);
        CHECK(b.ffn_sens[0][AC_SENS_POINTS - 1] > 0, "the MoE layer's curve is not measured");
        ac_importance_free(&a);
        ac_importance_free(&b);
    }
    ac_model_free(&r);
    ac_model_free(&f);
}

/* Value-by-value comparison of two hybrid calibrations: n values (and
 * orders) compared, bad those whose relative difference exceeds tol (or
 * that differ), worst the largest relative difference. */
typedef struct {
    int n, bad;
    double worst, tol;
} hyb_cmp;

static void hyb_vals(hyb_cmp *k, const double *a, const double *b, int n) {
    for (int i = 0; i < n; i++, k->n++) {
        double d = fabs(a[i] - b[i]) / fmax(1e-12, fmax(fabs(a[i]), fabs(b[i])));
        if (!(d <= k->tol)) k->bad++; /* NaN: bad */
        if (d > k->worst) k->worst = d;
    }
}

static void hyb_order(hyb_cmp *k, const int *a, const int *b, int n) {
    k->n++;
    k->bad += n > 0 && (!a || !b || memcmp(a, b, sizeof(int) * n) != 0);
}

/* A row array (NULL rows allowed) present in both or in neither. */
#define HYB_ROWS(k, A, B, f, l, n, fn)                                                                                 \
    do {                                                                                                               \
        if (!(A)->f != !(B)->f || ((A)->f && !(A)->f[l] != !(B)->f[l]))                                                \
            (k)->bad++;                                                                                                \
        else if ((A)->f && (A)->f[l])                                                                                  \
            fn((k), (A)->f[l], (B)->f[l], (n));                                                                        \
    } while (0)

/* Every statistic, score and order of calibration st against en's (a
 * hybrid's STREAMED and ENGINE; their loss curves: hyb_curves). */
static hyb_cmp hyb_compare(const ac_importance *st, const ac_importance *en, const ac_arch *a, double tol) {
    hyb_cmp k = {.tol = tol};
    hyb_vals(&k, &st->base_loss, &en->base_loss, 1);
    hyb_vals(&k, st->layer_bi, en->layer_bi, a->n_layers);
    for (int l = 0; l < a->n_layers; l++) {
        const ac_layer_arch *la = &a->layers[l];
        int nh = la->ssm_heads, fs = la->n_experts ? a->shared_ffn : 0;
        hyb_vals(&k, st->kv_score[l], en->kv_score[l], la->n_kv_heads);
        hyb_order(&k, st->kv_order[l], en->kv_order[l], la->n_kv_heads);
        hyb_vals(&k, st->ffn_score[l], en->ffn_score[l], la->ffn);
        hyb_order(&k, st->ffn_order[l], en->ffn_order[l], la->ffn);
        hyb_vals(&k, st->head_score[l], en->head_score[l], la->n_heads);
        hyb_order(&k, st->head_order[l], en->head_order[l], la->n_heads);
        hyb_vals(&k, st->mt_ffn_score[l], en->mt_ffn_score[l], la->ffn);
        hyb_order(&k, st->mt_ffn_order[l], en->mt_ffn_order[l], la->ffn);
        HYB_ROWS(&k, st, en, ssm_head_score, l, nh, hyb_vals);
        HYB_ROWS(&k, st, en, ssm_head_order, l, nh, hyb_order);
        HYB_ROWS(&k, st, en, ssm_chan_score, l, nh * a->ssm_head_dim, hyb_vals);
        HYB_ROWS(&k, st, en, sh_score, l, fs, hyb_vals);
        HYB_ROWS(&k, st, en, sh_order, l, fs, hyb_order);
    }
    hyb_vals(&k, st->hid_score, en->hid_score, a->hidden);
    hyb_order(&k, st->hid_order, en->hid_order, a->hidden);
    hyb_vals(&k, st->mt_hid_score, en->mt_hid_score, a->hidden);
    hyb_order(&k, st->mt_hid_order, en->mt_hid_order, a->hidden);
    return k;
}

/* Every loss curve of two hybrid calibrations with curves (Mamba heads,
 * attention, KV merges, MLP or experts, hidden width): points that differ
 * by more than tol relative and 1e-7 nats are bad; worst the largest
 * difference in nats. */
static void hyb_near(hyb_cmp *k, const double *a, const double *b, int n) {
    for (int i = 0; i < n; i++, k->n++) {
        double d = fabs(a[i] - b[i]);
        if (!(d <= 1e-7 + k->tol * fmax(fabs(a[i]), fabs(b[i])))) k->bad++; /* NaN: bad */
        if (d > k->worst) k->worst = d;
    }
}

static hyb_cmp hyb_curves(const ac_importance *x, const ac_importance *y, const ac_arch *a, double tol) {
    hyb_cmp k = {.tol = tol};
    k.bad += !x->ssm_sens || !y->ssm_sens || !x->merge_n || !y->merge_n;
    for (int l = 0; !k.bad && l < a->n_layers; l++) {
        hyb_near(&k, x->attn_sens[l], y->attn_sens[l], AC_SENS_POINTS);
        hyb_near(&k, x->ffn_sens[l], y->ffn_sens[l], AC_SENS_POINTS);
        hyb_near(&k, x->ssm_sens[l], y->ssm_sens[l], AC_SENS_POINTS);
        k.bad += x->merge_n[l] != y->merge_n[l];
        if (x->merge_n[l] == y->merge_n[l]) hyb_near(&k, x->merge_sens[l], y->merge_sens[l], x->merge_n[l]);
    }
    hyb_near(&k, x->hid_sens, y->hid_sens, 4);
    return k;
}

/* Hybrid fixture `name` loaded in fp32 (dir its folder) and its ppl.json:
 * the window ids (*ids, malloc'd, *n of them), ctx, windows and the float64
 * reference's perplexity. 0; -1 without the fixture (printed); -2 (ids
 * NULL) without a usable ppl.json. */
static int load_hybrid(const char *name, char *dir, size_t dn, ac_model *m, int **ids, size_t *n, int *ctx, int *nw,
                       double *ppl) {
    char p[1300];
    ac_err e = {{0}};
    *ids = NULL;
    if (load_moe(name, dir, dn, m, &e)) {
        printf("   no hybrid fixture %s (make fixtures): %s\n", name, e.msg);
        return -1;
    }
    snprintf(p, sizeof p, "%s/ppl.json", dir);
    json_t *pj = json_load_file(p, 0, NULL), *jids = json_object_get(pj, "ids");
    *ctx = (int)json_integer_value(json_object_get(pj, "ctx"));
    *nw = (int)json_integer_value(json_object_get(pj, "windows"));
    *ppl = json_real_value(json_object_get(pj, "ppl"));
    *n = json_array_size(jids);
    int ok = pj && m->a.hybrid && *ctx >= 2 && *nw >= 1 && *n >= (size_t)*ctx * *nw;
    if (ok && (*ids = malloc(sizeof(int) * (*n + 1))))
        for (size_t i = 0; i < *n; i++) (*ids)[i] = (int)json_integer_value(json_array_get(jids, i));
    json_decref(pj);
    return *ids ? 0 : -2;
}

/* Hybrid (nemotron_h) models streamed: for each fixture (M-M*-: Mamba-2,
 * squared-ReLU MLP, attention; MEM*E: MoE with the sigmoid router and the
 * shared expert; ME*E: LatentMoE; E*E: top-3 not renormalised), the
 * STREAMED calibration (one layer at a time, stream.c through the block
 * recipe executor) gives the ENGINE pass's calibration (ac_perplexity over
 * the whole model with the statistics hooks): the base loss, every layer's
 * block influence, attention KV-group and MLP channel scores and orders,
 * Minitron's head, MLP and hidden scores and orders, the Mamba heads' and
 * x channels' scores and orders (by group), the shared expert's channel
 * scores and orders, within test_statistics_match's tolerances (the
 * loss curves of both are compared by test_hybrid_exact and test_cuda_job). The base loss is also tests/ref_mamba.py's float64
 * perplexity on the same windows (ppl.json, within 0.1 %), so a change that
 * moves both paths alike (the scan's D term dropped) fails too. The BF16
 * fixtures loaded resident stream to the same values and the same curves
 * (the backward through each layer converted to fp32). On the dense
 * hybrid, the streamed backward (Mamba-2, attention and squared-ReLU
 * layers) against finite differences, as test_gradient. */
static void test_hybrid_layers(void) {
    const char *names[] = {"nemotronh_bf16", "nemotronh_moe_bf16", "nemotronh_latent_bf16", "nemotronh_moe_nonorm_f32"};
    int ran = 0;
    for (int f = 0; f < 4; f++) {
        char dir[1200];
        ac_model m;
        ac_err e = {{0}};
        int *ids, ctx, nw;
        size_t n;
        double want;
        int ld = load_hybrid(names[f], dir, sizeof dir, &m, &ids, &n, &ctx, &nw, &want), ok = ld == 0;
        if (ld == -1) continue;
        const ac_arch *a = &m.a;
        CHECK(ok, "%s: no ppl.json beside the fixture", names[f]);
        ac_importance en, st;
        int oke = ok && ac_importance_compute_mode(&m, ids, n, ctx, nw, 0, AC_CALIB_ENGINE, NULL, NULL, &en, &e) == 0;
        CHECK(!ok || oke, "%s: engine: %s", names[f], e.msg);
        int oks =
            oke && ac_importance_compute_mode(&m, ids, n, ctx, nw, 0, AC_CALIB_STREAMED, NULL, NULL, &st, &e) == 0;
        CHECK(!oke || oks, "%s: streamed: %s", names[f], e.msg);
        if (!oks) {
            if (oke) ac_importance_free(&en);
            free(ids);
            ac_model_free(&m);
            continue;
        }
        CHECK(st.method == AC_CALIB_STREAMED && st.streamed && en.method == AC_CALIB_ENGINE && !en.streamed,
              "%s: methods %d %d", names[f], st.method, en.method);
        CHECK(st.tokens == en.tokens, "%s: tokens %ld vs %ld", names[f], st.tokens, en.tokens);
        CHECK(st.ssm_sens && st.merge_n && en.ssm_sens && en.merge_n, "%s: a pass without curves", names[f]);
        hyb_cmp k = hyb_compare(&st, &en, a, 1e-4);
        int mamba = 0, moe = 0, mlp = 0, attn = 0;
        for (int l = 0; l < a->n_layers; l++) {
            const ac_layer_arch *la = &a->layers[l];
            mamba += la->ssm_heads > 0, moe += la->n_experts > 0, mlp += la->ffn > 0, attn += la->n_heads > 0;
            CHECK(!la->ssm_heads || (st.ssm_head_order && st.ssm_head_order[l]), "%s layer %d: Mamba heads not ranked",
                  names[f], l);
            CHECK(!la->n_experts || (st.sh_order && st.sh_order[l]), "%s layer %d: shared expert not ranked", names[f],
                  l);
        }
        double got = exp(st.base_loss);
        printf("   %s (%d Mamba, %d MLP, %d attention, %d MoE layers%s): streamed vs engine, %d values, largest "
               "relative difference %.2e; ppl %.5f vs the float64 reference %.5f (%.2e)\n",
               names[f], mamba, mlp, attn, moe, a->moe_latent ? ", LatentMoE" : "", k.n, k.worst, got, want,
               fabs(got - want) / want);
        CHECK(k.bad == 0, "%s: %d of %d values differ (largest relative difference %.2e)", names[f], k.bad, k.n,
              k.worst);
        CHECK(fabs(got - want) / want < 1e-3, "%s: streamed ppl %.6f vs reference %.6f", names[f], got, want);
        /* the BF16 checkpoint resident (matrices left in the mapping, GEMMs through 16-bit weights; exact: AMX
         * off): streamed gives what it gives on the fp32 load */
        ac_model r;
        if (strstr(names[f], "bf16") && ac_model_load_resident(dir, &r, &e) == 0) {
            ac_importance sr;
            int rows = ac_bf16_gemm_rows();
            ac_set_bf16_gemm_rows(0);
            int okr = ac_model_wdt(&r) == ST_BF16 &&
                      ac_importance_compute_mode(&r, ids, n, ctx, nw, 0, AC_CALIB_STREAMED, NULL, NULL, &sr, &e) == 0;
            ac_set_bf16_gemm_rows(rows);
            CHECK(okr, "%s: streamed on the resident checkpoint: %s", names[f], e.msg);
            if (okr) {
                hyb_cmp kr = hyb_compare(&sr, &st, a, 1e-4), kc = hyb_curves(&sr, &st, a, 1e-4);
                printf("   %s resident BF16 vs fp32 load, streamed: %d values, largest relative difference %.2e; "
                       "%d curve points (backward through each layer converted to fp32), largest difference %.2e "
                       "nats\n",
                       names[f], kr.n, kr.worst, kc.n, kc.worst);
                CHECK(kr.bad == 0, "%s resident: %d of %d values differ (largest %.2e)", names[f], kr.bad, kr.n,
                      kr.worst);
                CHECK(kc.bad == 0, "%s resident: %d of %d curve points differ (largest %.2e)", names[f], kc.bad, kc.n,
                      kc.worst);
                ac_importance_free(&sr);
            }
            ac_model_free(&r);
        } else if (strstr(names[f], "bf16"))
            CHECK(0, "%s: resident load: %s", names[f], e.msg);
        /* the streamed backward through Mamba-2, attention and squared-ReLU layers (no router: a finite
         * difference across a top-k flip would not be a derivative); one step's difference wanders by 2e-3
         * here (1e-2: -0.9418, 5e-3: -0.9396, 2e-3: -0.9392 against a backward of -0.9397), so their mean */
        const double hs[3] = {1e-2, 5e-3, 2e-3};
        if (!ac_arch_has_moe(a)) grad_check(&m, ids, nw < 2 ? nw : 2, ctx, hs, 3, names[f]);
        ran++;
        ac_importance_free(&en);
        ac_importance_free(&st);
        free(ids);
        ac_model_free(&m);
    }
    if (!ran) SKIP("no hybrid fixture (make fixtures)");
}

/* A hybrid's EXACT calibration (every curve point carried through the rest
 * of the network by the layer streamer) on the same windows: the loss
 * increase of the model ac_prune cuts the same units out of, run through the
 * engine. *base the engine's loss of the unpruned model; the increase of
 * arch t into *inc; 0 on success. */
static int hyb_pruned_inc(const ac_model *m, const ac_arch *t, const ac_importance *imp, const int *ids, size_t n,
                          int ctx, int nw, double base, double *inc, ac_err *e) {
    ac_model pm;
    if (ac_prune(m, t, imp, &pm, e)) return -1;
    ac_ppl_opts o = {.ctx = ctx, .max_windows = nw, .batch = 2};
    ac_ppl_result r;
    int rc = ac_perplexity(&pm, ids, n, &o, NULL, NULL, NULL, &r, e);
    ac_model_free(&pm);
    *inc = r.nll - base;
    return rc;
}

/* One curve against the pruned models' increases (want, monotone as the
 * calibration makes it): counts the points and the ones that differ. */
static void hyb_curve(const char *what, const char *name, int l, const double *got, const double *inc, int np,
                      int *n, int *bad, double *top) {
    double want = 0;
    for (int p = 0; p < np; p++) {
        want = fmax(want, inc[p]);
        int ok = fabs(got[p] - want) <= 1e-5 + 1e-4 * fabs(want);
        if (!ok) printf("   %s layer %d %s point %d: %.7f (exact) vs %.7f (pruned)\n", name, l, what, p, got[p], want);
        *bad += !ok, (*n)++;
        if (inc[p] > *top) *top = inc[p];
    }
}

/* ids[nw*ctx]: nw windows drawn from model m itself (each from its first
 * token, every next one sampled from the engine's softmax, seed): on them
 * the expected increase of a removal is a KL divergence (>= 0), so the
 * curves are not all flattened to 0 as on random ids. 0 on success. */
static int model_ids(const ac_model *m, int *ids, int ctx, int nw, unsigned seed, ac_err *e) {
    ac_engine en;
    if (ac_engine_init(&en, m, 1, ctx, e)) return -1;
    int V = m->a.vocab, rc = 0;
    for (int w = 0; w < nw && !rc; w++)
        for (int t = 0; t < ctx - 1 && !rc; t++) {
            if ((rc = ac_engine_forward(&en, ids + w * ctx + t, 1, 1, t, 1, e))) break;
            const float *lg = en.logits;
            float mx = lg[0];
            for (int i = 1; i < V; i++) mx = fmaxf(mx, lg[i]);
            double z = 0, c = 0;
            for (int i = 0; i < V; i++) z += exp(lg[i] - mx);
            seed = seed * 1664525u + 1013904223u;
            double u = (seed >> 8) / 16777216.0 * z;
            int y = 0;
            for (; y < V - 1 && (c += exp(lg[y] - mx)) <= u; y++) {}
            ids[w * ctx + t + 1] = y;
        }
    ac_engine_free(&en);
    return rc;
}

/* Spearman correlation of every curve point of P (Mamba heads, attention,
 * KV merges, MLP channels, experts: the points each method estimates; the
 * hidden curve is exact in all) against X's; mean |diff| in *mad, and the
 * Mamba points' own correlation in *rs_ssm. */
static double hyb_spearman(const ac_importance *X, const ac_importance *P, const ac_arch *a, double *mad,
                           double *rs_ssm) {
    static double v[2][1024], r[2][1024];
    int n = 0, ns = 0;
    double corr[2];
    for (int pass = 0; pass < 2; pass++) { /* 0: the Mamba points alone; 1: every point */
        n = 0;
        for (int l = 0; l < a->n_layers && n < 1000; l++) {
            const ac_layer_arch *la = &a->layers[l];
            for (int p = 1; p < AC_SENS_POINTS; p++) {
                if (la->ssm_heads) v[0][n] = X->ssm_sens[l][p], v[1][n++] = P->ssm_sens[l][p];
                if (pass && la->n_heads) v[0][n] = X->attn_sens[l][p], v[1][n++] = P->attn_sens[l][p];
                if (pass && (la->ffn || la->n_experts)) v[0][n] = X->ffn_sens[l][p], v[1][n++] = P->ffn_sens[l][p];
            }
            for (int k = 0; pass && la->n_heads && k < X->merge_n[l] && k < P->merge_n[l]; k++)
                v[0][n] = X->merge_sens[l][k], v[1][n++] = P->merge_sens[l][k];
        }
        if (!pass) ns = n;
        ranks(v[0], n, r[0]);
        ranks(v[1], n, r[1]);
        double m0 = 0, m1 = 0, s01 = 0, s00 = 0, s11 = 0;
        for (int i = 0; i < n; i++) m0 += r[0][i] / n, m1 += r[1][i] / n;
        for (int i = 0; i < n; i++)
            s01 += (r[0][i] - m0) * (r[1][i] - m1), s00 += (r[0][i] - m0) * (r[0][i] - m0),
                s11 += (r[1][i] - m1) * (r[1][i] - m1);
        corr[pass] = n > 1 && s00 > 0 && s11 > 0 ? s01 / sqrt(s00 * s11) : 0;
    }
    *mad = 0;
    for (int i = 0; i < n; i++) *mad += fabs(v[1][i] - v[0][i]) / n;
    *rs_ssm = ns > 1 ? corr[0] : 1;
    return corr[1];
}

/* A hybrid's STREAMED (gradient) and ANCHORED curves on model m's windows
 * against its EXACT ones (ex): each method gives every curve of a dense
 * model plus the Mamba-head curves, the statistics and rankings EXACT's,
 * the same hidden curve (exact in all), and the (layer, point) costs in
 * EXACT's order within the dense model's bounds (test_proxy_ranking:
 * Spearman above 0.8 streamed, 0.7 anchored; the Mamba points' own order
 * printed: 4 to 8 points a fixture); and the point STREAMED ranks largest
 * is EXACT's largest (ties allowed). */
static void hyb_proxies(ac_model *m, const char *name, const int *ids, size_t n, int ctx, int nw,
                        const ac_importance *ex) {
    const ac_arch *a = &m->a;
    const int mode[2] = {AC_CALIB_STREAMED, AC_CALIB_ANCHORED};
    const char *what[2] = {"streamed", "anchored"};
    const double bound[2] = {0.8, 0.7};
    for (int i = 0; i < 2; i++) {
        ac_importance p;
        ac_err e = {{0}};
        double t0 = ck_now();
        int ok = ac_importance_compute_mode(m, ids, n, ctx, nw, 0, mode[i], NULL, NULL, &p, &e) == 0;
        CHECK(ok, "%s %s: %s", name, what[i], e.msg);
        CHECK(!ok || (p.method == mode[i] && p.ssm_sens && p.merge_n), "%s %s: method %d, curves %p", name, what[i],
              p.method, (void *)p.ssm_sens);
        if (!ok || !p.ssm_sens || !p.merge_n) {
            if (ok) ac_importance_free(&p);
            continue;
        }
        double dt = ck_now() - t0, mad, rss, rs = hyb_spearman(ex, &p, a, &mad, &rss);
        for (int l = 0; getenv("AC_STREAM_DUMP") && l < a->n_layers; l++)
            printf("    layer %d exact/%s: attn %.4f %.4f %.4f %.4f | %.4f %.4f %.4f %.4f  ffn %.4f %.4f %.4f %.4f | "
                   "%.4f %.4f %.4f %.4f  mamba %.4f %.4f %.4f %.4f | %.4f %.4f %.4f %.4f\n",
                   l, what[i], ex->attn_sens[l][1], ex->attn_sens[l][2], ex->attn_sens[l][3], ex->attn_sens[l][4],
                   p.attn_sens[l][1], p.attn_sens[l][2], p.attn_sens[l][3], p.attn_sens[l][4], ex->ffn_sens[l][1],
                   ex->ffn_sens[l][2], ex->ffn_sens[l][3], ex->ffn_sens[l][4], p.ffn_sens[l][1], p.ffn_sens[l][2],
                   p.ffn_sens[l][3], p.ffn_sens[l][4], ex->ssm_sens[l][1], ex->ssm_sens[l][2], ex->ssm_sens[l][3],
                   ex->ssm_sens[l][4], p.ssm_sens[l][1], p.ssm_sens[l][2], p.ssm_sens[l][3], p.ssm_sens[l][4]);
        hyb_cmp ks = hyb_compare(&p, ex, a, 1e-9);
        int hb = 0;
        for (int k = 0; k < 4; k++) hb += fabs(p.hid_sens[k] - ex->hid_sens[k]) > 1e-9;
        /* the largest point of each */
        double bx = -1, bp = -1, px_at_bp = 0, pp_at_bx = 0;
        for (int l = 0; l < a->n_layers; l++)
            for (int q = 1; q < AC_SENS_POINTS; q++) {
                double xv[3] = {ex->attn_sens[l][q], ex->ffn_sens[l][q], ex->ssm_sens[l][q]},
                       pv[3] = {p.attn_sens[l][q], p.ffn_sens[l][q], p.ssm_sens ? p.ssm_sens[l][q] : 0};
                for (int c = 0; c < 3; c++) {
                    if (xv[c] > bx) bx = xv[c], pp_at_bx = pv[c];
                    if (pv[c] > bp) bp = pv[c], px_at_bp = xv[c];
                }
            }
        printf("   %s %s in %.2f s vs exact: Spearman %.3f over every point (Mamba points alone %.3f), mean |diff| "
               "%.4f nats; largest exact point %.4f (%s %.4f)\n",
               name, what[i], dt, rs, rss, mad, bx, what[i], pp_at_bx);
        CHECK(ks.bad == 0 && hb == 0, "%s %s: %d of %d statistics, %d hidden points not EXACT's", name, what[i],
              ks.bad, ks.n, hb);
        CHECK(rs > bound[i], "%s %s: Spearman %.3f against exact", name, what[i], rs);
        CHECK(i || px_at_bp >= bx * (1 - 1e-9), "%s streamed: its largest point (%.4f) is %.4f exact, below the "
              "largest exact point %.4f (%.4f streamed)", name, bp, px_at_bp, bx, pp_at_bx);
        ac_importance_free(&p);
    }
}

/* Hybrid (nemotron_h) loss curves (EXACT through the layer streamer) on
 * M-M*- (Mamba-2, squared-ReLU MLP, attention), MEM*E (MoE with the
 * sigmoid router and the shared expert) and ME*E (LatentMoE, whose latent
 * is wider than the narrowest hidden point: the engine's and the stream's
 * expert rows are sized for it): every point of every curve equals
 * the calibration-loss increase of the model ac_prune cuts the same units
 * out of, run through the engine on the same windows: the Mamba-head curve
 * (each group's lowest-ranked heads; 100 %: the layer removed), attention
 * KV groups and KV merges, MLP channels, experts (all but top_k at 100 %)
 * and hidden width, on windows drawn from the model (model_ids). The base
 * loss is the engine's, the Mamba curves are in the report's JSON, AUTO on
 * the CPU is EXACT (these models are far below AC_CALIB_EXACT_FLOPS); STREAMED and
 * ANCHORED against EXACT: hyb_proxies. */
static void test_hybrid_exact(void) {
    const char *names[] = {"nemotronh_bf16", "nemotronh_moe_bf16", "nemotronh_latent_bf16"};
    static const double SR[AC_SENS_POINTS] = {0, 0.25, 0.5, 0.75, 1}, HF[4] = {0.125, 0.25, 0.5, 0.75};
    int ran = 0;
    for (int f = 0; f < 3; f++) {
        char dir[1200];
        int *ids, ctx, nw;
        size_t n;
        double ppl;
        ac_model m;
        int ld = load_hybrid(names[f], dir, sizeof dir, &m, &ids, &n, &ctx, &nw, &ppl);
        if (ld == -1) continue;
        CHECK(ld == 0, "%s: no ppl.json beside the fixture", names[f]);
        const ac_arch *a = &m.a;
        ac_err e = {{0}};
        n = (size_t)ctx * nw; /* the fixture's windows, their tokens drawn from the model below */
        CHECK(model_ids(&m, ids, ctx, nw, 7 + f, &e) == 0, "%s: %s", names[f], e.msg);
        ac_importance imp;
        double t0 = ck_now();
        CHECK(ac_importance_compute_mode(&m, ids, n, ctx, nw, 0, AC_CALIB_EXACT, NULL, NULL, &imp, &e) == 0, "%s: %s",
              names[f], e.msg);
        double dt = ck_now() - t0;
        ac_ppl_opts o = {.ctx = ctx, .max_windows = nw, .batch = 2};
        ac_ppl_result base;
        CHECK(ac_perplexity(&m, ids, n, &o, NULL, NULL, NULL, &base, &e) == 0, "%s", e.msg);
        CHECK(imp.method == AC_CALIB_EXACT && imp.ssm_sens, "%s: method %d, Mamba curves %p", names[f], imp.method,
              (void *)imp.ssm_sens);
        CHECK(close_rel(imp.base_loss, base.nll, 1e-5), "%s: base loss %.8f vs %.8f", names[f], imp.base_loss,
              base.nll);
        int np = 0, bad = 0, G = a->ssm_groups > 0 ? a->ssm_groups : 1, kinds = 0;
        double top[5] = {0}; /* largest pruned increase: Mamba, attention, MLP, experts, hidden */
        json_t *js = ac_importance_to_json(&imp), *jl = json_object_get(js, "layers");
        for (int l = 0; l < a->n_layers; l++) {
            const ac_layer_arch *la = &a->layers[l];
            double inc[8] = {0};
            ac_arch t;
            CHECK(ac_arch_copy(&t, a, &e) == 0, "%s", e.msg);
            if (la->ssm_heads) {
                int hpg = la->ssm_heads / G;
                for (int q = 1; q < AC_SENS_POINTS; q++) {
                    t.layers[l].ssm_heads = G * (hpg - (int)lround(SR[q] * hpg));
                    CHECK(hyb_pruned_inc(&m, &t, &imp, ids, n, ctx, nw, base.nll, &inc[q], &e) == 0, "%s: %s",
                          names[f], e.msg);
                }
                hyb_curve("Mamba", names[f], l, imp.ssm_sens[l], inc, AC_SENS_POINTS, &np, &bad, &top[0]);
                CHECK(fabs(ac_sens_ssm(&imp, l, 0.375) - 0.5 * (imp.ssm_sens[l][1] + imp.ssm_sens[l][2])) < 1e-12,
                      "%s layer %d: ac_sens_ssm does not interpolate the curve", names[f], l);
                json_t *jc = json_object_get(json_array_get(jl, l), "mamba_loss_curve");
                for (int q = 0; q < AC_SENS_POINTS; q++)
                    CHECK(json_real_value(json_array_get(jc, q)) == imp.ssm_sens[l][q], "%s layer %d: JSON point %d",
                          names[f], l, q);
            }
            if (la->n_heads) {
                int kv = la->n_kv_heads, grp = la->n_heads / kv;
                for (int q = 1; q < AC_SENS_POINTS; q++) {
                    t.layers[l].n_kv_heads = kv - (int)lround(SR[q] * kv);
                    t.layers[l].n_heads = t.layers[l].n_kv_heads * grp;
                    CHECK(hyb_pruned_inc(&m, &t, &imp, ids, n, ctx, nw, base.nll, &inc[q], &e) == 0, "%s: %s",
                          names[f], e.msg);
                }
                hyb_curve("attention", names[f], l, imp.attn_sens[l], inc, AC_SENS_POINTS, &np, &bad, &top[1]);
                t.layers[l].n_heads = la->n_heads;
                int k = 0;
                for (int d = kv - 1; d >= 1 && k < 8; d--) {
                    if (kv % d) continue;
                    t.layers[l].n_kv_heads = d;
                    CHECK(hyb_pruned_inc(&m, &t, &imp, ids, n, ctx, nw, base.nll, &inc[k++], &e) == 0, "%s: %s",
                          names[f], e.msg);
                }
                CHECK(imp.merge_n && imp.merge_n[l] == k, "%s layer %d: %d KV merges", names[f], l,
                      imp.merge_n ? imp.merge_n[l] : -1);
                hyb_curve("KV merge", names[f], l, imp.merge_sens[l], inc, k, &np, &bad, &top[1]);
            }
            if (la->ffn) {
                for (int q = 1; q < AC_SENS_POINTS; q++) {
                    t.layers[l].ffn = la->ffn - (int)lround(SR[q] * la->ffn);
                    CHECK(hyb_pruned_inc(&m, &t, &imp, ids, n, ctx, nw, base.nll, &inc[q], &e) == 0, "%s: %s",
                          names[f], e.msg);
                }
                hyb_curve("MLP", names[f], l, imp.ffn_sens[l], inc, AC_SENS_POINTS, &np, &bad, &top[2]);
            }
            if (la->n_experts) {
                int E = la->n_experts, removable = E - a->top_k;
                for (int q = 1; q < AC_SENS_POINTS; q++) {
                    t.layers[l].n_experts = E - (int)lround(SR[q] * removable);
                    CHECK(hyb_pruned_inc(&m, &t, &imp, ids, n, ctx, nw, base.nll, &inc[q], &e) == 0, "%s: %s",
                          names[f], e.msg);
                }
                hyb_curve("experts", names[f], l, imp.ffn_sens[l], inc, AC_SENS_POINTS, &np, &bad, &top[3]);
            }
            ac_arch_free(&t);
        }
        double inc[4];
        for (int i = 0; i < 4; i++) {
            ac_arch t;
            CHECK(ac_arch_copy(&t, a, &e) == 0, "%s", e.msg);
            t.hidden = a->hidden - (int)lround(HF[i] * a->hidden);
            CHECK(hyb_pruned_inc(&m, &t, &imp, ids, n, ctx, nw, base.nll, &inc[i], &e) == 0, "%s: %s", names[f],
                  e.msg);
            ac_arch_free(&t);
        }
        hyb_curve("hidden", names[f], -1, imp.hid_sens, inc, 4, &np, &bad, &top[4]);
        for (int k = 0; k < 5; k++) kinds += top[k] > 1e-3;
        printf("   %s: exact in %.2f s, %d points, %d differ from the pruned models; largest increases: Mamba %.4f, "
               "attention %.4f, MLP %.4f, experts %.4f, hidden %.4f\n",
               names[f], dt, np, bad, top[0], top[1], top[2], top[3], top[4]);
        CHECK(bad == 0, "%s: %d of %d points differ from the pruned models", names[f], bad, np);
        CHECK(top[0] > 1e-3 && kinds >= 3, "%s: the pruned increases are too small to tell a mutation", names[f]);
        json_decref(js);
        /* AUTO on the CPU: EXACT, as for a dense model under AC_CALIB_EXACT_FLOPS, the same curves */
        ac_importance au;
        CHECK(ac_importance_compute_mode(&m, ids, n, ctx, nw, 0, AC_CALIB_AUTO, NULL, NULL, &au, &e) == 0, "%s: %s",
              names[f], e.msg);
        hyb_cmp ka = hyb_curves(&au, &imp, a, 0);
        CHECK(au.method == AC_CALIB_EXACT && ka.bad == 0, "%s: AUTO gave method %d, %d of %d points not EXACT's",
              names[f], au.method, ka.bad, ka.n);
        ac_importance_free(&au);
        hyb_proxies(&m, names[f], ids, n, ctx, nw, &imp);
        ac_importance_free(&imp);
        free(ids);
        ac_model_free(&m);
        ran++;
    }
    if (!ran) SKIP("no hybrid fixture (make fixtures)");
}

/* AUTO's rule on a hybrid, on the architecture alone: Nemotron 3 Nano
 * 30B-A3B's published config (tests/configs/nemotron3-nano) cut to one
 * layer of each kind (ME*, the scale job's shapes, docs/hybrid.md). The
 * exact passes' FLOPs (ac_calib_exact_flops) equal a count by hand from the
 * config's fields (an MoE layer's top_k routed experts, not its 128; the
 * Mamba scan; attention's scores), each layer's points (4, attention's one
 * KV merge too) from that layer through the rest and the head; AUTO on the
 * CPU is STREAMED at the scale job's protocol (2 windows of 128 tokens) and
 * EXACT on one window of 32 tokens, where 2 FLOPs per parameter of every
 * expert (the dense count, 2 P a token, a full pass a point) is past the
 * threshold; with cuda, as a dense model, AUTO and EXACT the ENGINE method. */
static void test_hybrid_auto_rule(void) {
    char path[1200];
    const char *root = getenv("AC_TEST_ROOT");
    snprintf(path, sizeof path, "%s/tests/configs/nemotron3-nano/config.json", root ? root : ".");
    json_t *cfg = json_load_file(path, 0, NULL);
    if (!cfg) SKIP("no %s", path);
    json_object_set_new(cfg, "num_hidden_layers", json_integer(3));
    json_object_set_new(cfg, "hybrid_override_pattern", json_string("ME*"));
    json_object_del(cfg, "num_nextn_predict_layers");
    ac_arch a;
    ac_err e = {{0}};
    int ok = ac_arch_from_config(cfg, &a, &e) == 0;
    CHECK(ok, "%s", e.msg);
    if (!ok) {
        json_decref(cfg);
        return;
    }
#define CI(k) ((double)json_integer_value(json_object_get(cfg, k)))
    double H = CI("hidden_size"), V = CI("vocab_size"), nh = CI("mamba_num_heads"), P = CI("mamba_head_dim"),
           N = CI("ssm_state_size"), G = CI("n_groups"), K = CI("conv_kernel"), E = CI("n_routed_experts"),
           k = CI("num_experts_per_tok"), Fe = CI("moe_intermediate_size"),
           Fs = CI("moe_shared_expert_intermediate_size"), Q = CI("num_attention_heads") * CI("head_dim"),
           KV = CI("num_key_value_heads") * CI("head_dim"), conv_b = json_is_true(json_object_get(cfg, "use_conv_bias"));
    CHECK(CI("num_key_value_heads") == 2 && !json_is_true(json_object_get(cfg, "attention_bias")) &&
              json_object_get(cfg, "moe_latent_size") == NULL,
          "the config's shapes changed: the count below assumes 2 KV heads (one merge), no biases, no latent");
    for (int w = 0; w < 2; w++) {
        int ctx = w ? 32 : 128;
        long nwin = w ? 1 : 2;
        double S = (double)nwin * ctx, head = 2 * H * V;
        double fm = 2 * (H + (2 * nh * P + 2 * G * N + nh) * H + (nh * P + 2 * G * N) * (K + conv_b) + 3 * nh +
                         nh * P + nh * P * H) +
                    6 * nh * P * N;
        double fe = 2 * (H + E * H + E + k * 2 * Fe * H + 2 * Fs * H);
        double fa = 2 * (H + 2 * H * Q + 2 * H * KV) + 2.0 * ctx * Q;
        double r2 = head + fa, r1 = r2 + fe, r0 = r1 + fm; /* from each layer through the rest and the head */
        double want = r0 * (S + 5 * S) + 5 * S * r2 + 4 * S * r1 + 4 * S * r0;
        double got = ac_calib_exact_flops(&a, nwin, ctx, (int)nwin), dense = 2 * ac_arch_params(&a) * (S + 31 * S);
        int m = ac_calib_method(&a, AC_CALIB_AUTO, nwin, ctx, (int)nwin, 0);
        printf("   Nano shapes ME*, %ld x %d tokens: exact passes %.3g FLOPs (by hand %.3g; every expert counted, "
               "a full pass a point: %.3g): AUTO %s\n",
               nwin, ctx, got, want, dense, m == AC_CALIB_STREAMED ? "streamed" : m == AC_CALIB_EXACT ? "exact" : "?");
        CHECK(fabs(got - want) <= 1e-9 * want, "%ld x %d: %.6g FLOPs, by hand %.6g", nwin, ctx, got, want);
        CHECK(m == (w ? AC_CALIB_EXACT : AC_CALIB_STREAMED), "%ld x %d: AUTO gave %d", nwin, ctx, m);
        CHECK(w == 0 || dense > AC_CALIB_EXACT_FLOPS, "the one-window case does not tell the counts apart (%.3g)",
              dense);
    }
#undef CI
    /* with a CUDA target as a dense model: AUTO and EXACT the engine method (its curves: test_cuda_job's
     * test_gpu_hybrid_curves), STREAMED and ANCHORED the CPU passes */
    CHECK(ac_calib_method(&a, AC_CALIB_AUTO, 1, 32, 1, 1) == AC_CALIB_ENGINE &&
              ac_calib_method(&a, AC_CALIB_ANCHORED, 1, 32, 1, 1) == AC_CALIB_ANCHORED &&
              ac_calib_method(&a, AC_CALIB_EXACT, 1, 32, 1, 1) == AC_CALIB_ENGINE &&
              ac_calib_method(&a, AC_CALIB_STREAMED, 1, 32, 1, 1) == AC_CALIB_STREAMED &&
              ac_calib_method(&a, AC_CALIB_ANCHORED, 1, 32, 1, 0) == AC_CALIB_ANCHORED,
          "a hybrid's methods with and without cuda");
    ac_arch_free(&a);
    json_decref(cfg);
}

int main(void) {
    RUN(test_statistics_match);
    RUN(test_exact_is_engine);
    RUN(test_gradient);
    RUN(test_merge_layer);
    RUN(test_proxy_ranking);
    RUN(test_resident);
    RUN(test_moe_layers);
    RUN(test_moe_resident);
    RUN(test_hybrid_layers);
    RUN(test_hybrid_exact);
    RUN(test_hybrid_auto_rule);
    ac_importance_free(&EX);
    ac_importance_free(&ST);
    ac_importance_free(&EN);
    ac_importance_free(&AN);
    ac_model_free(&M);
    free(IDS);
    return DONE();
}
