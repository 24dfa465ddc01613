/*
 * test_stream.c - layer-streamed calibration (src/search/stream.c and the
 * STREAMED method of importance.c) against the exact method on the tiny
 * model: the streamed pass gives the same activation statistics, rankings
 * and base loss as the engine's full pass (same arithmetic, one layer at a
 * time); the 50 % points of the curves, which the streamed method measures
 * by propagating the pruned layer's output through the rest of the network,
 * equal the exact full-pass increases; a layer with merged KV heads equals
 * the engine on a KV-merged model; and the proxy curves (error x gain)
 * rank the (layer, point) costs as the exact curves do (Spearman).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "eval.h"
#include "importance.h"
#include "prune.h"
#include "stream.h"
#include "synth.h"

static ac_model M;
static ac_importance EX, ST;
static int *IDS, HAVE;
static size_t NIDS;

static int setup(void) {
    if (HAVE) return HAVE > 0;
    ac_err e;
    HAVE = -1;
    if (ck_load_tiny(&M, &IDS, &NIDS, 4096, &e)) return 0;
    if (ac_importance_compute_mode(&M, IDS, NIDS, 64, 32, 0, AC_CALIB_EXACT, NULL, NULL, &EX, &e) ||
        ac_importance_compute_mode(&M, IDS, NIDS, 64, 32, 0, AC_CALIB_STREAMED, NULL, NULL, &ST, &e)) {
        fprintf(stderr, "  %s\n", e.msg);
        return 0;
    }
    HAVE = 1;
    return 1;
}

static int close_rel(double a, double b, double tol) { return fabs(a - b) <= tol * fmax(1e-9, fmax(fabs(a), fabs(b))); }

static void test_statistics_match(void) {
    if (!setup()) SKIP("no tiny model (make models)");
    CHECK(!EX.streamed && ST.streamed, "methods %d %d", EX.streamed, ST.streamed);
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
    for (int i = 0; i < 4; i++)
        CHECK(close_rel(ST.hid_sens[i], EX.hid_sens[i], 1e-6), "hidden curve %d: %g vs %g", i, ST.hid_sens[i],
              EX.hid_sens[i]);
}

/* The propagated 50 % points are the exact increases (where monotone() did
 * not lift the exact point to its neighbour). */
static void test_half_point_exact(void) {
    if (!setup()) SKIP("no tiny model (make models)");
    int n = 0;
    for (int l = 0; l < M.a.n_layers; l++) {
        if (EX.attn_sens[l][2] > EX.attn_sens[l][1] && M.a.layers[l].n_heads) {
            CHECK(fabs(ST.attn_sens[l][2] - EX.attn_sens[l][2]) < 1e-4 + 1e-3 * EX.attn_sens[l][2],
                  "layer %d attention 50%%: %g vs %g", l, ST.attn_sens[l][2], EX.attn_sens[l][2]);
            n++;
        }
        if (EX.ffn_sens[l][2] > EX.ffn_sens[l][1] && M.a.layers[l].ffn) {
            CHECK(fabs(ST.ffn_sens[l][2] - EX.ffn_sens[l][2]) < 1e-4 + 1e-3 * EX.ffn_sens[l][2],
                  "layer %d ffn 50%%: %g vs %g", l, ST.ffn_sens[l][2], EX.ffn_sens[l][2]);
            n++;
        }
    }
    CHECK(n >= M.a.n_layers, "only %d comparable points", n);
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
    double nll = ac_stream_nll(&s, x, IDS, W, &cnt) / cnt;
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

/* Spearman correlation of all (layer, sub-block, point) curve values. */
static void test_proxy_ranking(void) {
    if (!setup()) SKIP("no tiny model (make models)");
    int L = M.a.n_layers, n = 0;
    static double a[512], b[512], ra[512], rb[512];
    for (int l = 0; l < L && n < 504; l++)
        for (int p = 1; p < AC_SENS_POINTS; p++) {
            a[n] = EX.attn_sens[l][p], b[n++] = ST.attn_sens[l][p];
            a[n] = EX.ffn_sens[l][p], b[n++] = ST.ffn_sens[l][p];
        }
    ranks(a, n, ra);
    ranks(b, n, rb);
    double ma = 0, mb = 0, sab = 0, saa = 0, sbb = 0, rel = 0;
    for (int i = 0; i < n; i++) ma += ra[i] / n, mb += rb[i] / n;
    for (int i = 0; i < n; i++) {
        sab += (ra[i] - ma) * (rb[i] - mb), saa += (ra[i] - ma) * (ra[i] - ma), sbb += (rb[i] - mb) * (rb[i] - mb);
        rel += fabs(b[i] - a[i]) / n;
    }
    if (getenv("AC_STREAM_DUMP"))
        for (int l = 0; l < L; l++)
            printf("  layer %d attn %.4f %.4f %.4f %.4f | %.4f %.4f %.4f %.4f  "
                   "ffn %.4f %.4f %.4f %.4f | %.4f %.4f %.4f %.4f\n",
                   l, EX.attn_sens[l][1], EX.attn_sens[l][2], EX.attn_sens[l][3], EX.attn_sens[l][4],
                   ST.attn_sens[l][1], ST.attn_sens[l][2], ST.attn_sens[l][3], ST.attn_sens[l][4], EX.ffn_sens[l][1],
                   EX.ffn_sens[l][2], EX.ffn_sens[l][3], EX.ffn_sens[l][4], ST.ffn_sens[l][1], ST.ffn_sens[l][2],
                   ST.ffn_sens[l][3], ST.ffn_sens[l][4]);
    double rho = sab / sqrt(saa * sbb);
    printf("  proxy vs exact curves: Spearman %.3f over %d points, mean |diff| %.4f nats\n", rho, n, rel);
    CHECK(rho > 0.8, "Spearman %.3f", rho);
}

int main(void) {
    RUN(test_statistics_match);
    RUN(test_half_point_exact);
    RUN(test_merge_layer);
    RUN(test_proxy_ranking);
    ac_importance_free(&EX);
    ac_importance_free(&ST);
    ac_model_free(&M);
    free(IDS);
    return DONE();
}
