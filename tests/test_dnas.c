/*
 * test_dnas.c - the differentiable search through the network (src/search/dnas.c):
 * gates at 1 are the unpruned model bit for bit; hard gates at 0 give the
 * same logits as ac_prune removing those units (KV groups with their query
 * heads, FFN channel groups, whole sub-blocks, hidden channel groups); the
 * gated RMSNorm's gradient (x, w, gates) matches float64 central
 * differences; the expected-cost gradient
 * matches central finite differences of the expected cost; a limit that
 * only removing sub-blocks can meet is met by removing sub-blocks; on the
 * llama target (one gate per layer) a limit only dropping whole layers can
 * meet is met so, and the compacted export reloads as a Llama.
 * deci: a one-hot KV-merge choice is ac_prune's merged model, the merge
 * gradient matches finite differences, the search's result exports.
 * The search on the resident BF16 model equals the search on its fp32 load.
 * With the CUDA plugin (tests/run_all.sh: the CPU emulator): the gate
 * training on the device matches the CPU's.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/backward_cpu.h"
#include "check.h"
#include "runtime/cuda_plugin.h"
#include "format/deci.h"
#include "search/dnas.h"
#include "runtime/eval.h"
#include "pipeline/job.h"
#include "pipeline/jobspec.h"
#include "runtime/kernels_cpu.h"
#include "search/minitron.h"
#include "compress/prune.h"
#include "format/safetensors.h"
#include "synth.h"

static ac_model M;
static ac_importance IMP;
static int *IDS, HAVE;
static size_t NIDS;

static int setup(void) {
    if (HAVE) return HAVE > 0;
    ac_err e;
    HAVE = -1;
    if (ck_load_tiny(&M, &IDS, &NIDS, 8192, &e)) return 0;
    if (ac_importance_compute(&M, IDS, NIDS, 64, 32, 0, NULL, NULL, &IMP, &e)) return 0;
    HAVE = 1;
    return 1;
}

static ac_search_opts opts(ac_export_target t, int hid) {
    return (ac_search_opts){.steps = 200,
                            .seed = 1,
                            .lr = 0.03,
                            .ffn_multiple = 32,
                            .hidden_multiple = 16,
                            .prune_hidden = hid,
                            .target = t};
}

/* Logits of a forward of B x T calibration tokens through model m with
 * gates z (NULL: the trainer's own, all 1). */
static float *logits(ac_model *m, const ac_dnas_gates *g, const double *z, int B, int T) {
    ac_trainer t;
    ac_err e;
    if (ac_trainer_init(&t, m, B, T, &e)) return NULL;
    if (g) ac_dnas_set_gates(g, z, &t.gate, &M.a, &IMP);
    float *out = NULL;
    if (!ac_train_forward(&t, IDS, B, T, &e) && (out = malloc(sizeof(float) * B * T * m->a.vocab)))
        memcpy(out, t.logits, sizeof(float) * B * T * m->a.vocab);
    ac_trainer_free(&t);
    return out;
}

static void test_gates_at_one_are_the_unpruned_model(void) {
    if (!setup()) SKIP("no tiny model or calibration text (make tiny-model)");
    ac_dnas_gates g;
    ac_err e;
    ac_search_opts so = opts(AC_EXPORT_GGUF, 1);
    CHECK(ac_dnas_gates_init(&g, &M.a, &so, &e) == 0, "%s", e.msg);
    double *z = malloc(sizeof(double) * g.np);
    unsigned long long s = 7;
    for (int i = 0; i < g.np; i++) { /* log_alpha 8 gives exactly 1, stochastic (u >= 0.01) or not */
        s = s * 6364136223846793005ULL + 1;
        double u = 0.01 + 0.98 * (s >> 11) / 9007199254740992.0;
        z[i] = ac_dnas_sample(8.0, i % 2 ? u : -1, NULL);
        CHECK(z[i] == 1.0, "gate %d = %.17g", i, z[i]);
    }
    int B = 2, T = 48, n = B * T * M.a.vocab;
    float *a = logits(&M, NULL, NULL, B, T), *b = logits(&M, &g, z, B, T);
    CHECK(a && b && !memcmp(a, b, sizeof(float) * n), "logits with every gate at 1 differ from the plain model");
    CHECK(g.np == 6 * (4 + 12 + 2) + 8, "gate count %d", g.np);
    free(a);
    free(b);
    free(z);
    ac_dnas_gates_free(&g);
}

/* Hard gates at 0 against ac_prune removing the same units. hid: also
 * hidden channel groups 1 and 6 (of 8 x 16 channels) at 0, i.e. a model of
 * hidden 96: the gated RMSNorm averages over the gate mass, so the kept
 * channels see exactly the pruned model's norm; the gated channels still
 * live in the residual stream but reach no projection and no norm. */
static void hard_zero_case(int hid) {
    ac_dnas_gates g;
    ac_err e;
    ac_search_opts so = opts(AC_EXPORT_GGUF, hid);
    CHECK(ac_dnas_gates_init(&g, &M.a, &so, &e) == 0, "%s", e.msg);
    double *z = malloc(sizeof(double) * g.np);
    for (int i = 0; i < g.np; i++) z[i] = 1;
    z[g.kv_off[0] + 1] = 0;                        /* layer 0: KV group 1 (2 query heads) */
    z[g.kv_off[1] + 0] = z[g.kv_off[1] + 2] = 0;   /* layer 1: KV groups 0, 2 */
    z[g.ffn_off[1] + 0] = z[g.ffn_off[1] + 5] = 0; /* layer 1: the most important 32 FFN channels, and rank 160..191 */
    z[g.attn_off + 2] = 0;                         /* layer 2: attention sub-block */
    z[g.mlp_off + 3] = 0;                          /* layer 3: FFN sub-block */
    for (int j = 3; j < 12; j++) z[g.ffn_off[4] + j] = 0; /* layer 4: keep 96 channels */
    if (hid) {
        CHECK(g.nhg == 8 && g.hm == 16, "hidden gate groups %d x %d", g.nhg, g.hm);
        z[g.hid_off + 1] = z[g.hid_off + 6] = 0; /* the 2nd and 7th most important 16 hidden channels */
    }
    for (int i = 0; i < g.np; i++) g.la[i] = z[i] ? 8 : -8;
    int B = 2, T = 48, V = M.a.vocab, N = B * T;
    float *a = logits(&M, &g, z, B, T);
    ac_importance ord;
    CHECK(ac_dnas_orders(&g, &IMP, &M.a, &ord, &e) == 0, "%s", e.msg);
    ac_arch t;
    ac_arch_copy(&t, &M.a, &e);
    t.layers[0] = (ac_layer_arch){6, 3, 384, 0, 0, 0};
    t.layers[1] = (ac_layer_arch){4, 2, 320, 0, 0, 0};
    t.layers[2] = (ac_layer_arch){0, 0, 384, 0, 0, 0};
    t.layers[3] = (ac_layer_arch){8, 4, 0, 0, 0, 0};
    t.layers[4] = (ac_layer_arch){8, 4, 96, 0, 0, 0};
    if (hid) t.hidden = M.a.hidden - 32;
    ac_model pm;
    CHECK(ac_prune(&M, &t, &ord, &pm, &e) == 0, "%s", e.msg);
    CHECK(pm.a.hidden == t.hidden, "pruned hidden %d", pm.a.hidden);
    float *b = logits(&pm, NULL, NULL, B, T);
    double d = 0, mx = 0, la = 0, lb = 0;
    for (int i = 0; a && b && i < N * V; i++) {
        d = fmax(d, fabs(a[i] - b[i]));
        mx = fmax(mx, fabs(a[i]));
    }
    int *tg = malloc(sizeof(int) * N);
    float *dz = malloc(sizeof(float) * N * V);
    if (a && b && tg && dz) { /* the next-token loss of both */
        ac_next_token_targets(tg, IDS, B, T);
        la = ac_loss_backward(dz, a, tg, NULL, N, V, 1, 0, 1, NULL, NULL);
        lb = ac_loss_backward(dz, b, tg, NULL, N, V, 1, 0, 1, NULL, NULL);
    }
    printf("   %s: gated vs pruned logits: max diff %.3g (max |logit| %.3g); loss %.7f vs %.7f\n",
           hid ? "with hidden gates (hidden 128 -> 96)" : "KV/FFN/depth gates", d, mx, la, lb);
    CHECK(a && b && d <= 1e-5 * mx, "hard-zero gates differ from pruning by %g", d);
    CHECK(fabs(la - lb) <= 1e-5 * fabs(lb), "losses %.9g vs %.9g", la, lb);
    free(tg);
    free(dz);
    free(a);
    free(b);
    free(z);
    ac_model_free(&pm);
    ac_arch_free(&t);
    ac_importance_free(&ord);
    ac_dnas_gates_free(&g);
}

static void test_hard_zero_gates_equal_pruning(void) {
    if (!setup()) SKIP("no tiny model or calibration text (make tiny-model)");
    hard_zero_case(0);
    hard_zero_case(1);
}

/* The gated RMSNorm against an independent float64 evaluation of
 * y = w gh x / sqrt(sum gh x^2 / sum gh + eps): the forward, and the
 * backward (dx, dw, dgh) against central differences of L = sum dy * y in
 * float64, with gates in [0,1] including exact 0s and 1s (and all gates 1:
 * the plain RMSNorm bit for bit). */
static double norm_ref(const double *x, const double *w, const double *gh, const double *dy, int N, int H, double eps,
                       float *y) {
    double G = 0, L = 0;
    for (int c = 0; c < H; c++) G += gh[c];
    for (int i = 0; i < N; i++) {
        double S = 0;
        for (int c = 0; c < H; c++) S += gh[c] * x[i * H + c] * x[i * H + c];
        double r = 1 / sqrt(S / G + eps);
        for (int c = 0; c < H; c++) {
            double v = w[c] * gh[c] * x[i * H + c] * r;
            if (y) y[i * H + c] = (float)v;
            L += dy[i * H + c] * v;
        }
    }
    return L;
}

static void test_gated_rmsnorm_gradient_matches_finite_differences(void) {
    enum { N = 3, H = 40 };
    float x[N * H], w[H], gh[H], dy[N * H], y[N * H], yr[N * H], xh[N * H], r[N], dx[N * H], dw[H], dgh[H];
    double xd[N * H], wd[H], gd[H], dyd[N * H], eps = 1e-5;
    unsigned long long s = 11;
#define U01() ((s = s * 6364136223846793005ULL + 1442695040888963407ULL) >> 11) / 9007199254740992.0
    for (int i = 0; i < N * H; i++) xd[i] = x[i] = (float)(2 * U01() - 1) * (i % 7 == 0 ? 4.0f : 1.0f);
    for (int i = 0; i < N * H; i++) dyd[i] = dy[i] = (float)(2 * U01() - 1);
    for (int c = 0; c < H; c++) {
        wd[c] = w[c] = (float)(0.5 + U01());
        gd[c] = gh[c] = c % 5 == 0 ? 0.0f : c % 5 == 1 ? 1.0f : (float)U01();
    }
#undef U01
    ac_rmsnorm_fwd(y, xh, r, x, w, gh, N, H, (float)eps);
    norm_ref(xd, wd, gd, dyd, N, H, eps, yr);
    double fe = 0, ymx = 0;
    for (int i = 0; i < N * H; i++) fe = fmax(fe, fabs(y[i] - yr[i])), ymx = fmax(ymx, fabs(yr[i]));
    memset(dx, 0, sizeof dx);
    memset(dw, 0, sizeof dw);
    memset(dgh, 0, sizeof dgh);
    ac_rmsnorm_backward(dx, dw, dgh, dy, xh, r, w, gh, N, H);
    double ex = 0, mxx = 0, ew = 0, mxw = 0, eg = 0, mxg = 0, h = 1e-6;
    for (int k = 0; k < N * H + 2 * H; k++) { /* x, then w, then gh */
        double *p = k < N * H ? &xd[k] : k < N * H + H ? &wd[k - N * H] : &gd[k - N * H - H], v = *p;
        *p = v + h;
        double lp = norm_ref(xd, wd, gd, dyd, N, H, eps, NULL);
        *p = v - h;
        double lm = norm_ref(xd, wd, gd, dyd, N, H, eps, NULL), fd = (lp - lm) / (2 * h);
        *p = v;
        int which = k < N * H ? 0 : k < N * H + H ? 1 : 2;
        double an = which == 0 ? dx[k] : which == 1 ? dw[k - N * H] : dgh[k - N * H - H];
        double *err[3] = {&ex, &ew, &eg}, *mag[3] = {&mxx, &mxw, &mxg};
        *err[which] = fmax(*err[which], fabs(an - fd));
        *mag[which] = fmax(*mag[which], fabs(fd));
    }
    printf("   forward max|diff| %.2e (max|y| %.3g); backward vs float64 central differences: dx %.2e (max %.3g), "
           "dw %.2e (max %.3g), dgh %.2e (max %.3g)\n",
           fe, ymx, ex, mxx, ew, mxw, eg, mxg);
    CHECK(fe <= 1e-6 * ymx, "forward differs by %g", fe);
    CHECK(ex <= 1e-5 * mxx && ew <= 1e-5 * mxw && eg <= 1e-5 * mxg, "gradients differ: dx %g dw %g dgh %g", ex, ew, eg);
    /* every gate 1 is the plain RMSNorm (gh NULL) bit for bit, forward and backward */
    float one[H], y1[N * H], xh1[N * H], r1[N], dx1[N * H], dw1[H];
    for (int c = 0; c < H; c++) one[c] = 1;
    ac_rmsnorm_fwd(y, xh, r, x, w, one, N, H, (float)eps);
    ac_rmsnorm_fwd(y1, xh1, r1, x, w, NULL, N, H, (float)eps);
    memset(dx, 0, sizeof dx);
    memset(dx1, 0, sizeof dx1);
    memset(dw, 0, sizeof dw);
    memset(dw1, 0, sizeof dw1);
    ac_rmsnorm_backward(dx, dw, NULL, dy, xh, r, w, one, N, H);
    ac_rmsnorm_backward(dx1, dw1, NULL, dy, xh1, r1, w, NULL, N, H);
    CHECK(!memcmp(y, y1, sizeof y) && !memcmp(r, r1, sizeof r) && !memcmp(dx, dx1, sizeof dx) &&
              !memcmp(dw, dw1, sizeof dw),
          "gates at 1 are not the plain RMSNorm bit for bit");
}

/* Merge choice index of KV count d in layer l (-1: none). */
static int choice_of(const ac_dnas_gates *g, int l, int d) {
    for (int c = 0; c < g->nmc[l]; c++)
        if (g->mkv[g->mc_off[l] + c] == d) return c;
    return -1;
}

/* z: every gate 1, layer l's merge choices mixed by w[l][3] (NULL rows: keep every KV head). */
static void merge_z(const ac_dnas_gates *g, double *z, const double (*w)[3]) {
    for (int i = 0; i < g->np; i++) z[i] = g->mkv[i] ? 0 : 1;
    for (int l = 0; l < g->L; l++)
        for (int c = 0; c < g->nmc[l]; c++) z[g->mc_off[l] + c] = w ? w[l][c] : c == 0;
}

/* Export arch a of M (units kept in ord's order) as the deci target does:
 * FFN widths zero-padded up to the loaders' 256 grid, ac_deci_check_arch,
 * ac_model_save (config.json with block_configs), reload. 0 when the
 * reloaded model has the padded architecture and n_heads_in_group =
 * n_heads / n_kv_heads in every attention block; *out (may be NULL) gets
 * the reloaded model's logits. */
static int export_deci(const ac_arch *a, const ac_importance *ord, float **out, char *why, size_t wn) {
    ac_err e = {{0}};
    ac_arch t;
    ac_model pm, back;
    char dir[] = "/tmp/ac_test_dnas_deci_XXXXXX", path[256];
    if (ac_arch_copy(&t, a, &e) || !mkdtemp(dir)) return snprintf(why, wn, "setup"), -1;
    for (int l = 0; l < t.n_layers; l++) t.layers[l].ffn = ac_deci_padded(t.layers[l].ffn);
    int rc = ac_deci_check_arch(&t, &e) || ac_prune(&M, &t, ord, &pm, &e) ? -1 : 0;
    if (!rc && (ac_model_save(&pm, dir, ST_F32, &e) || ac_model_load(dir, &back, &e))) {
        ac_model_free(&pm);
        rc = -1;
    }
    if (rc) snprintf(why, wn, "%s", e.msg);
    if (!rc) {
        snprintf(path, sizeof path, "%s/config.json", dir);
        json_t *cfg = json_load_file(path, 0, NULL), *bc = json_object_get(cfg, "block_configs");
        int ok = (int)json_array_size(bc) == t.n_layers;
        for (int l = 0; ok && l < t.n_layers; l++) {
            const ac_layer_arch *L = &t.layers[l];
            json_t *at = json_object_get(json_array_get(bc, l), "attention");
            ok = !memcmp(&back.a.layers[l], L, sizeof *L) &&
                 (L->n_heads ? json_integer_value(json_object_get(at, "n_heads_in_group")) == L->n_heads / L->n_kv_heads
                             : json_is_true(json_object_get(at, "no_op")));
        }
        if (!ok) rc = -1, snprintf(why, wn, "reloaded architecture or block_configs differ");
        if (!rc && out) *out = logits(&back, NULL, NULL, 2, 48);
        json_decref(cfg);
        ac_model_free(&back);
        ac_model_free(&pm);
    }
    snprintf(path, sizeof path, "rm -rf '%s'", dir);
    if (system(path)) rc = -1;
    ac_arch_free(&t);
    return rc;
}

static void test_hard_merge_choice_equals_merging(void) {
    if (!setup()) SKIP("no tiny model or calibration text (make tiny-model)");
    ac_dnas_gates g;
    ac_err e;
    ac_search_opts so = opts(AC_EXPORT_DECI, 0);
    CHECK(ac_dnas_gates_init(&g, &M.a, &so, &e) == 0, "%s", e.msg);
    CHECK(g.nmc[0] == 3 && choice_of(&g, 0, 4) == 0 && choice_of(&g, 0, 2) == 1 && choice_of(&g, 0, 1) == 2 &&
              g.nkv[0] == 0,
          "deci gates: %d merge choices, %d KV gates", g.nmc[0], g.nkv[0]);
    int want[6] = {2, 1, 4, 2, 1, 4};
    double w[6][3] = {{0}}, *z = malloc(sizeof(double) * g.np);
    for (int l = 0; l < 6; l++) w[l][choice_of(&g, l, want[l])] = 1;
    merge_z(&g, z, (const double(*)[3])w);
    ac_model mix, pm;
    CHECK(ac_prune(&M, &M.a, &IMP, &mix, &e) == 0, "%s", e.msg); /* a copy */
    ac_dnas_apply_merge(&g, z, &M, &mix);
    int B = 2, T = 48, V = M.a.vocab;
    float *a = logits(&mix, &g, z, B, T);
    ac_arch t;
    ac_arch_copy(&t, &M.a, &e);
    for (int l = 0; l < 6; l++) t.layers[l].n_kv_heads = want[l];
    CHECK(ac_prune(&M, &t, &IMP, &pm, &e) == 0, "%s", e.msg);
    float *b = logits(&pm, NULL, NULL, B, T);
    double d = 0, mx = 0;
    for (int i = 0; a && b && i < B * T * V; i++) {
        d = fmax(d, fabs(a[i] - b[i]));
        mx = fmax(mx, fabs(a[i]));
    }
    printf("   one-hot merge choices vs ac_prune's merged model: max diff %.3g (max |logit| %.3g)\n", d, mx);
    CHECK(a && b && d <= 1e-5 * mx, "hard merge choice differs from merging by %g", d);
    /* the merged model exports as deci (n_heads_in_group = 8 / KV; FFN padded to the grid, which is exact) */
    char why[512] = "";
    float *c = NULL;
    CHECK(export_deci(&t, &IMP, &c, why, sizeof why) == 0, "export: %s", why);
    double dc = 0;
    for (int i = 0; c && b && i < B * T * V; i++) dc = fmax(dc, fabs(c[i] - b[i]));
    CHECK(c && dc <= 1e-5 * mx, "the exported merged model differs by %g", dc);
    free(a);
    free(b);
    free(c);
    /* the merge gradient: d loss / d z_c = <dL/dW_kv, M_c(W_kv)> against central differences */
    double soft[6][3] = {{0.5, 0.3, 0.2}, {0.2, 0.5, 0.3}, {1, 0, 0}, {0.1, 0.1, 0.8}, {1, 0, 0}, {1, 0, 0}};
    merge_z(&g, z, (const double(*)[3])soft);
    float *teacher = logits(&M, NULL, NULL, B, T);
    ac_trainer tr;
    CHECK(ac_trainer_init(&tr, &mix, B, T, &e) == 0, "%s", e.msg);
    double *an = calloc(g.np, sizeof(double)), num = 0, den = 0, h = 1e-3;
    ac_dnas_set_gates(&g, z, &tr.gate, &M.a, &IMP);
    ac_dnas_apply_merge(&g, z, &M, &mix);
    ac_train_zero_grad(&tr);
    ac_train_forward(&tr, IDS, B, T, &e);
    ac_train_loss(&tr, NULL, teacher, 1, 1, 1, NULL, NULL);
    ac_train_backward(&tr);
    ac_dnas_merge_grads(&g, &M, &tr.g, an);
    for (int i = 0; i < g.np; i++) {
        if (!g.mkv[i] || i >= g.mc_off[2]) continue; /* layers 0, 1 */
        double lv[2], o = z[i];
        for (int k = 0; k < 2; k++) {
            z[i] = o + (k ? -h : h);
            ac_dnas_apply_merge(&g, z, &M, &mix);
            ac_train_forward(&tr, IDS, B, T, &e);
            lv[k] = ac_train_loss(&tr, NULL, teacher, 1, 1, 1, NULL, NULL);
        }
        z[i] = o;
        double fd = (lv[0] - lv[1]) / (2 * h);
        num += (an[i] - fd) * (an[i] - fd);
        den += fd * fd;
    }
    double rel = sqrt(num / (den + 1e-300));
    printf("   merge-choice gradient (layers 0, 1): |grad| %.4g, relative error vs finite differences %.2e\n",
           sqrt(den), rel);
    CHECK(den > 0 && rel < 2e-3, "merge gradient relative error %g", rel); /* docs/testing.md */
    ac_trainer_free(&tr);
    free(an);
    free(teacher);
    free(z);
    ac_model_free(&mix);
    ac_model_free(&pm);
    ac_arch_free(&t);
    ac_dnas_gates_free(&g);
}

/* The merge choices' sample: the soft Gumbel-softmax q sums to 1; the
 * straight-through one-hot (mc_hard) is q's argmax, and by the Gumbel-max
 * trick its frequencies are softmax(theta) at any temperature: the network
 * sees merged models with the probabilities the expected cost assumes. */
static void test_merge_sample_is_a_categorical_sample(void) {
    if (!setup()) SKIP("no tiny model or calibration text (make tiny-model)");
    ac_dnas_gates g;
    ac_err e;
    ac_search_opts so = opts(AC_EXPORT_DECI, 0);
    CHECK(ac_dnas_gates_init(&g, &M.a, &so, &e) == 0, "%s", e.msg);
    int o = g.mc_off[0], n = g.nmc[0], N = 40000;
    double th[3] = {0.3, -0.5, 1.0}, pw[3], sum = 0, *q = calloc(g.np, sizeof(double)),
           *z = calloc(g.np, sizeof(double));
    for (int c = 0; c < n; c++) sum += (pw[c] = exp(g.la[o + c] = th[c]));
    for (int c = 0; c < n; c++) pw[c] /= sum;
    double taus[2] = {2.0 / 3.0, 0.1}, worst = 0;
    unsigned long long s = 11;
    int bad = 0;
    for (int k = 0; k < 2; k++) {
        int cnt[3] = {0};
        for (int i = 0; i < N; i++) {
            double u[3];
            for (int c = 0; c < n; c++) {
                s = s * 6364136223846793005ULL + 1442695040888963407ULL;
                u[c] = ((s >> 11) + 0.5) / 9007199254740992.0;
            }
            ac_dnas_merge_sample(&g, 0, u, taus[k], 1, q, z);
            double qs = 0, zs = 0;
            int am = 0, hot = -1;
            for (int c = 0; c < n; c++) {
                qs += q[o + c], zs += z[o + c];
                am = q[o + c] > q[o + am] ? c : am;
                hot = z[o + c] == 1 ? c : hot;
                bad |= z[o + c] != 0 && z[o + c] != 1;
            }
            bad |= fabs(qs - 1) > 1e-12 || zs != 1 || hot != am;
            cnt[hot < 0 ? 0 : hot]++;
        }
        for (int c = 0; c < n; c++) worst = fmax(worst, fabs((double)cnt[c] / N - pw[c]));
        ac_dnas_merge_sample(&g, 0, (double[3]){0.2, 0.5, 0.9}, taus[k], 0, q, z); /* soft: z is q */
        for (int c = 0; c < n; c++) bad |= z[o + c] != q[o + c];
    }
    printf("   straight-through merge samples: max |frequency - softmax(theta)| %.4f over %d draws (tau 2/3, 0.1)\n",
           worst, N);
    CHECK(!bad, "a hard merge sample that is not the one-hot argmax of its soft sample");
    CHECK(worst < 0.012, "hard merge samples off softmax(theta) by %g", worst);
    free(q);
    free(z);
    ac_dnas_gates_free(&g);
}

static void problem(ac_search_problem *p, ac_cost_table *t, ac_workload *w, ac_engine_profile *pr, ac_search_opts so) {
    ac_err e;
    ac_cost_roofline(ac_device_spec_find("H100"), "bf16", t, &e);
    *w = (ac_workload){.batch = 8, .prompt_len = 256, .gen_len = 64};
    ac_engine_profile_default(pr, 0);
    *p = (ac_search_problem){.table = t, .workload = w, .profile = pr, .imp = &IMP, .base = &M.a, .opts = so};
}

static void test_constraint_gradient_matches_finite_differences(void) {
    if (!setup()) SKIP("no tiny model or calibration text (make tiny-model)");
    ac_cost_table t;
    ac_workload w;
    ac_engine_profile pr;
    ac_search_problem p;
    for (int tgt = 0; tgt < 2; tgt++) { /* gguf: KV-group and hidden gates; deci: merge choices */
        problem(&p, &t, &w, &pr, opts(tgt ? AC_EXPORT_DECI : AC_EXPORT_GGUF, !tgt));
        ac_dnas_gates g;
        ac_err e;
        CHECK(ac_dnas_gates_init(&g, &M.a, &p.opts, &e) == 0, "%s", e.msg);
        unsigned long long s = 3;
        for (int i = 0; i < g.np; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            g.la[i] = -2 + 5.0 * (s >> 11) / 9007199254740992.0;
        }
        double *an = malloc(sizeof(double) * g.np), *fd = malloc(sizeof(double) * g.np), h = 1e-4;
        const char *names[] = {"ttft", "tpot", "tok/s", "memory", "params", "p99 ttft", "p99 tpot", "p99 e2e"};
        _Static_assert(sizeof names / sizeof *names == AC_M_COUNT, "a name per metric");
        for (int m = 0; m < AC_M_COUNT; m++) {
            double v = ac_dnas_expected_metric(&g, &p, (ac_metric)m, an), num = 0, den = 0;
            for (int i = 0; i < g.np; i++) {
                double o = g.la[i];
                g.la[i] = o + h;
                double a = ac_dnas_expected_metric(&g, &p, (ac_metric)m, NULL);
                g.la[i] = o - h;
                double b = ac_dnas_expected_metric(&g, &p, (ac_metric)m, NULL);
                g.la[i] = o;
                fd[i] = (a - b) / (2 * h);
                num += (an[i] - fd[i]) * (an[i] - fd[i]);
                den += fd[i] * fd[i];
            }
            double rel = sqrt(num / (den + 1e-300));
            printf("   %s %-7s E=%.5g |grad|=%.4g relative error vs finite differences %.2e\n", tgt ? "deci" : "gguf",
                   names[m], v, sqrt(den), rel);
            CHECK(isfinite(v) && den > 0 && rel < 1e-6, "%s gradient relative error %g", names[m],
                  rel); /* docs/testing.md */
        }
        free(an);
        free(fd);
        ac_dnas_gates_free(&g);
        ac_cost_table_free(&t);
    }
}

static double tpot_of(const ac_search_problem *p, const ac_arch *a) {
    ac_carch c;
    ac_cost k;
    ac_carch_from_arch(a, &c, NULL);
    ac_cost_predict(p->table, &c, p->workload, p->profile, 0, &k);
    ac_carch_free(&c);
    return k.tpot_ms;
}

/* A TPOT limit at batch 1, prompt 64 (per-kernel launch overheads
 * dominate a tiny model on an H100) that the narrowest architecture, every
 * layer as nl, misses by f times what cutting layer L-1 down to cut
 * saves: only removing sub-blocks meets it. 1 when so (printed). */
static int depth_only_limit(ac_search_problem *p, ac_workload *w, ac_layer_arch nl, ac_layer_arch cut, double f,
                            const char *what) {
    ac_arch narrow, less;
    ac_err e;
    int L = M.a.n_layers;
    *w = (ac_workload){.batch = 1, .prompt_len = 64, .gen_len = 16};
    ac_arch_copy(&narrow, &M.a, &e);
    ac_arch_copy(&less, &M.a, &e);
    for (int l = 0; l < L; l++) narrow.layers[l] = nl;
    less.layers[L - 1] = cut;
    double full = tpot_of(p, &M.a), nar = tpot_of(p, &narrow), sub = full - tpot_of(p, &less);
    p->limits.max_tpot_ms = nar - f * sub;
    printf("   tpot full %.4f ms, narrowest %.4f ms, %s %.4f ms; limit %.4f ms\n", full, nar, what, sub,
           p->limits.max_tpot_ms);
    ac_arch_free(&narrow);
    ac_arch_free(&less);
    return nar > p->limits.max_tpot_ms && sub > 0;
}

static void test_depth_only_limit_is_met_by_removing_sub_blocks(void) {
    if (!setup()) SKIP("no tiny model or calibration text (make tiny-model)");
    ac_cost_table t;
    ac_workload w;
    ac_engine_profile pr;
    ac_search_problem p;
    ac_err e;
    problem(&p, &t, &w, &pr, opts(AC_EXPORT_DECI, 0));
    ac_layer_arch cut = M.a.layers[M.a.n_layers - 1];
    cut.ffn = 0;
    CHECK(depth_only_limit(&p, &w, (ac_layer_arch){8, 1, 32, 0, 0, 0}, cut, 0.5, "one FFN sub-block"),
          "the limit is not depth-only");
    ac_dnas_opts o;
    ac_dnas_defaults(&o);
    o.steps = 40;
    ac_search_result r, r2;
    ac_importance ord, ord2;
    double t0 = ac_now();
    size_t nk;
    float *wk0 = ac_layer_matrix(&M, 0, AC_W_K, &nk), *wk_keep = malloc(sizeof(float) * nk);
    memcpy(wk_keep, wk0, sizeof(float) * nk);
    CHECK(ac_search_dnas(&p, &M, IDS, NIDS, &o, &r, &ord, &e) == 0, "%s", e.msg);
    CHECK(!memcmp(wk_keep, wk0, sizeof(float) * nk), "the search left merged K weights in the model");
    free(wk_keep);
    double secs = ac_now() - t0;
    int removed = 0;
    for (int l = 0; l < M.a.n_layers; l++) removed += (r.arch.layers[l].n_heads == 0) + (r.arch.layers[l].ffn == 0);
    json_t *aj = ac_arch_to_json(&r.arch);
    char *s = json_dumps(aj, JSON_COMPACT);
    printf("   dnas (%d steps, %.1f s): tpot %.4f ms, %d sub-blocks removed: %s\n", r.steps_run, secs, r.cost.tpot_ms,
           removed, s);
    free(s);
    json_decref(aj);
    CHECK(r.feasible && r.cost.tpot_ms <= p.limits.max_tpot_ms * (1 + 1e-9), "infeasible: %g > %g", r.cost.tpot_ms,
          p.limits.max_tpot_ms);
    CHECK(removed >= 1, "no sub-block removed");
    { /* deci: every KV count a merge choice (a divisor), and the pruned result exports and reloads */
        int div = 1;
        char why[512] = "";
        for (int l = 0; l < M.a.n_layers; l++)
            div &= !r.arch.layers[l].n_kv_heads || 4 % r.arch.layers[l].n_kv_heads == 0;
        CHECK(div, "a KV count that is no merge choice");
        CHECK(export_deci(&r.arch, &ord, NULL, why, sizeof why) == 0, "export: %s", why);
    }
    CHECK(ac_search_dnas(&p, &M, IDS, NIDS, &o, &r2, &ord2, &e) == 0, "%s", e.msg);
    int same = 1;
    for (int l = 0; l < M.a.n_layers; l++)
        same &= !memcmp(&r.arch.layers[l], &r2.arch.layers[l], sizeof(ac_layer_arch));
    for (int l = 0; l < M.a.n_layers; l++)
        same &= !memcmp(ord.ffn_order[l], ord2.ffn_order[l], sizeof(int) * M.a.layers[l].ffn);
    CHECK(same, "not deterministic for a seed");
    /* teacher logits recomputed every step instead of cached: the same batches, the same search */
    ac_search_result r3;
    ac_importance ord3;
    o.teacher_cache_mib = 0;
    CHECK(ac_search_dnas(&p, &M, IDS, NIDS, &o, &r3, &ord3, &e) == 0, "%s", e.msg);
    same = 1;
    for (int l = 0; l < M.a.n_layers; l++)
        same &= !memcmp(&r.arch.layers[l], &r3.arch.layers[l], sizeof(ac_layer_arch));
    for (int l = 0; l < M.a.n_layers; l++)
        same &= !memcmp(ord.ffn_order[l], ord3.ffn_order[l], sizeof(int) * M.a.layers[l].ffn);
    CHECK(same, "online teacher gives a different search");
    ac_search_result_free(&r3);
    ac_importance_free(&ord3);
    /* co-trained weights (online teacher): a copy is trained, the model itself is left as it was */
    size_t nw;
    float *w1 = ac_layer_matrix(&M, 1, AC_W_D, &nw), *keep = malloc(sizeof(float) * nw);
    memcpy(keep, w1, sizeof(float) * nw);
    o.cotrain = 1;
    o.w_lr = 1e-2;
    o.steps = 5;
    CHECK(ac_search_dnas(&p, &M, IDS, NIDS, &o, &r3, &ord3, &e) == 0, "%s", e.msg);
    CHECK(r3.feasible && !memcmp(keep, w1, sizeof(float) * nw), "cotrain: infeasible or the source model changed");
    free(keep);
    ac_search_result_free(&r3);
    ac_importance_free(&ord3);
    ac_search_result_free(&r);
    ac_search_result_free(&r2);
    ac_importance_free(&ord);
    ac_importance_free(&ord2);
    ac_cost_table_free(&t);
}

/* llama (uniform) target: one depth gate per layer (attention and FFN
 * together). A TPOT limit below the narrowest uniform model that keeps
 * every layer can only be met by dropping whole layers: the search drops
 * at least one, never half a layer, keeps one width in the layers it keeps,
 * and meets the limit. The pruned model, compacted as the job exports it
 * (ac_minitron_compact), saves as a plain Llama, loads back with fewer
 * layers and gives the in-memory model's perplexity. */
static void test_llama_limit_is_met_by_dropping_layers(void) {
    if (!setup()) SKIP("no tiny model or calibration text (make tiny-model)");
    ac_cost_table t;
    ac_workload w;
    ac_engine_profile pr;
    ac_search_problem p;
    ac_err e;
    problem(&p, &t, &w, &pr, opts(AC_EXPORT_LLAMA, 0));
    int L = M.a.n_layers;
    /* the narrowest uniform model: one KV group, 32 FFN channels per layer */
    CHECK(depth_only_limit(&p, &w, (ac_layer_arch){2, 1, 32, 0, 0, 0}, (ac_layer_arch){0, 0, 0, 0, 0, 0}, 0.5,
                           "one layer"),
          "the limit does not need a layer dropped");
    ac_dnas_opts o;
    ac_dnas_defaults(&o);
    o.steps = 40;
    ac_search_result r;
    ac_importance ord;
    CHECK(ac_search_dnas(&p, &M, IDS, NIDS, &o, &r, &ord, &e) == 0, "%s", e.msg);
    json_t *aj = ac_arch_to_json(&r.arch);
    char *js = json_dumps(aj, JSON_COMPACT);
    printf("   dnas (%d steps): tpot %.4f ms: %s\n", r.steps_run, r.cost.tpot_ms, js);
    free(js);
    json_decref(aj);
    CHECK(r.feasible && r.cost.tpot_ms <= p.limits.max_tpot_ms * (1 + 1e-9), "infeasible: %g > %g", r.cost.tpot_ms,
          p.limits.max_tpot_ms);
    int dropped = 0, first = -1, half = 0, same = 1;
    for (int l = 0; l < L; l++) {
        const ac_layer_arch *al = &r.arch.layers[l];
        if (!al->n_heads && !al->ffn) {
            dropped++;
            continue;
        }
        half |= !al->n_heads || !al->ffn;
        if (first < 0) first = l;
        same &= al->n_heads == r.arch.layers[first].n_heads && al->n_kv_heads == r.arch.layers[first].n_kv_heads &&
                al->ffn == r.arch.layers[first].ffn;
    }
    CHECK(dropped >= 1 && dropped < L, "%d of %d layers dropped", dropped, L);
    CHECK(!half && same, "a half layer or differing widths in the kept layers");
    ac_model pm, back;
    char dir[] = "/tmp/ac_test_dnas_llama_XXXXXX", path[300];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    CHECK(ac_prune(&M, &r.arch, &ord, &pm, &e) == 0, "%s", e.msg);
    ac_minitron_compact(&pm);
    CHECK(pm.a.n_layers == L - dropped && ac_arch_is_uniform(&pm.a), "compacted: %d layers, uniform %d", pm.a.n_layers,
          ac_arch_is_uniform(&pm.a));
    CHECK(ac_model_save(&pm, dir, ST_F32, &e) == 0, "%s", e.msg);
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *cfg = json_load_file(path, 0, NULL);
    const char *arch0 = json_string_value(json_array_get(json_object_get(cfg, "architectures"), 0));
    CHECK(arch0 && !strcmp(arch0, "LlamaForCausalLM") && !json_object_get(cfg, "block_configs") &&
              json_integer_value(json_object_get(cfg, "num_hidden_layers")) == L - dropped,
          "config.json: %s, %lld layers", arch0 ? arch0 : "(none)",
          json_integer_value(json_object_get(cfg, "num_hidden_layers")));
    json_decref(cfg);
    CHECK(ac_model_load(dir, &back, &e) == 0, "%s", e.msg);
    ac_ppl_opts po = {.ctx = 64, .max_windows = 16, .batch = 4};
    ac_ppl_result ra, rb;
    CHECK(ac_perplexity(&pm, IDS, NIDS, &po, NULL, NULL, NULL, &ra, &e) == 0, "%s", e.msg);
    CHECK(ac_perplexity(&back, IDS, NIDS, &po, NULL, NULL, NULL, &rb, &e) == 0, "%s", e.msg);
    printf("   exported Llama: %d layers, perplexity %.5f in memory, %.5f loaded back\n", back.a.n_layers, ra.ppl,
           rb.ppl);
    CHECK(back.a.n_layers == L - dropped && isfinite(ra.ppl) && ra.ppl == rb.ppl, "reloaded: %d layers, ppl %g vs %g",
          back.a.n_layers, rb.ppl, ra.ppl);
    ac_model_free(&back);
    ac_model_free(&pm);
    CHECK(ck_rmtree(dir) == 0, "rm %s", dir);
    ac_search_result_free(&r);
    ac_importance_free(&ord);
    ac_cost_table_free(&t);
}

static void quiet(void *ud, const char *kind, json_t *data) { (void)ud, (void)kind, (void)data; }

/* The same through a whole job (export_target llama, the job's own cost
 * table and engine profile), with a limit that needs two layers dropped
 * (beyond Minitron's depth cap of 20 %, so AutoCompress's arm is the one
 * exported): the report's AutoCompress arm drops whole layers and meets
 * the limit, and the export is a Llama with that many fewer layers whose
 * perplexity is the report's. */
static void test_llama_job_drops_layers(void) {
    if (!setup()) SKIP("no tiny model or calibration text (make tiny-model)");
    static ac_job_spec spec; /* large: off the stack */
    char tiny[1100], calib[1100], held[1100], out[] = "/tmp/ac_test_dnas_job_XXXXXX", path[300];
    ck_build_path(tiny, sizeof tiny, "models/tiny");
    ck_build_path(calib, sizeof calib, "data/calib.txt");
    ck_build_path(held, sizeof held, "data/heldout.txt");
    CHECK(mkdtemp(out) != NULL, "mkdtemp");
    json_t *js =
        json_pack("{s:s,s:s,s:s,s:s,s:{s:s,s:{s:i,s:i,s:i}},s:{s:f},s:{s:s,s:i,s:i},s:i,s:{s:i,s:i}}", "model", tiny,
                  "calibration", calib, "heldout", held, "output", out, "target", "device", "H100", "workload", "batch",
                  1, "prompt_len", 64, "gen_len", 16, "constraints", "max_tpot_ms", 1.0, "search", "export_target",
                  "llama", "steps", 60, "dnas_steps", 40, "calibration_tokens", 2048, "eval", "ctx", 128, "windows", 8);
    ac_err e;
    ac_cost_table t;
    ac_engine_profile pr;
    ac_workload w;
    int hit = 0;
    CHECK(ac_job_spec_parse(js, &spec, NULL, &e) == 0, "%s", e.msg);
    CHECK(ac_cost_table_for(&spec.target.dev, ac_target_table_dtype(&spec.target, ST_BF16), NULL, 2, 0, NULL, NULL, &t,
                            &hit, &e) == 0,
          "%s", e.msg);
    ac_target_engine_for(&spec.target, ST_BF16, &pr);
    ac_search_problem p = {.table = &t, .workload = &w, .profile = &pr, .imp = &IMP, .base = &M.a};
    CHECK(depth_only_limit(&p, &w, (ac_layer_arch){2, 1, 32, 0, 0, 0}, (ac_layer_arch){0, 0, 0, 0, 0, 0}, 1.5,
                           "one layer"),
          "the limit does not need a layer dropped");
    ac_cost_table_free(&t);
    json_object_set_new(json_object_get(js, "constraints"), "max_tpot_ms", json_real(p.limits.max_tpot_ms));
    json_t *res = NULL;
    ac_job_ctx ctx = {.emit = quiet, .threads = ck_threads()};
    int rc = ac_job_spec_parse(js, &spec, NULL, &e) || ac_job_run(&spec, &ctx, &res, &e);
    CHECK(rc == 0, "job: %s", e.msg);
    json_decref(js);
    if (rc) return;
    json_t *ac = json_object_get(res, "autocompress"),
           *layers = json_object_get(json_object_get(ac, "architecture"), "layers");
    int L = (int)json_array_size(layers), dropped = 0;
    for (int l = 0; l < L; l++) {
        json_t *x = json_array_get(layers, l);
        dropped += !json_integer_value(json_object_get(x, "heads")) && !json_integer_value(json_object_get(x, "ffn"));
    }
    const char *chosen = json_string_value(json_object_get(res, "chosen"));
    printf("   job: autocompress drops %d of %d layers (feasible %d), chosen %s\n", dropped, L,
           json_is_true(json_object_get(ac, "feasible")), chosen ? chosen : "?");
    CHECK(L == M.a.n_layers && dropped >= 2 && json_is_true(json_object_get(ac, "feasible")),
          "autocompress arm: %d of %d layers dropped", dropped, L);
    CHECK(chosen && !strcmp(chosen, "autocompress"), "exported arm %s: Minitron met a limit past its depth cap?",
          chosen ? chosen : "(none)");
    if (chosen && !strcmp(chosen, "autocompress")) {
        ac_model back;
        ac_ppl_opts po = {.ctx = 128, .max_windows = 8, .batch = 4};
        ac_ppl_result r = {0};
        int *ids = NULL;
        size_t n = 0;
        CHECK(ac_model_load(out, &back, &e) == 0, "%s", e.msg);
        snprintf(path, sizeof path, "%s/config.json", out);
        json_t *cfg = json_load_file(path, 0, NULL);
        const char *a0 = json_string_value(json_array_get(json_object_get(cfg, "architectures"), 0));
        CHECK(a0 && !strcmp(a0, "LlamaForCausalLM") && back.a.n_layers == L - dropped, "export: %s, %d layers",
              a0 ? a0 : "?", back.a.n_layers);
        json_decref(cfg);
        CHECK(ac_load_text_ids(tiny, held, &ids, &n, back.a.vocab, &e) == 0 &&
                  ac_perplexity(&back, ids, n, &po, NULL, NULL, NULL, &r, &e) == 0,
              "%s", e.msg);
        double want = json_number_value(json_object_get(ac, "perplexity"));
        printf("   export: %d layers, perplexity %.4f, report %.4f\n", back.a.n_layers, r.ppl, want);
        CHECK(fabs(r.ppl / want - 1) < 1e-3, "export perplexity %g, report %g", r.ppl, want);
        free(ids);
        ac_model_free(&back);
    }
    json_decref(res);
    CHECK(ck_rmtree(out) == 0, "rm %s", out);
}

/* The gate search on the CUDA plugin's trainer (o.cuda, what a local cuda
 * target uses) against the CPU's, on a llama-style target (KV-group,
 * hidden, depth gates) and on deci (merge choices, depth): the first
 * step's task gradient d loss / d log_alpha, the log_alphas after a few
 * steps, and the architecture a whole search picks. */
static void test_cuda_gate_search_matches_cpu(void) {
    const char *why;
    if (!ac_cuda(&why)) SKIP("no CUDA: %s", why);
    if (!setup()) SKIP("no tiny model or calibration text (make tiny-model)");
    ac_export_target tg[2] = {AC_EXPORT_GGUF, AC_EXPORT_DECI};
    for (int k = 0; k < 2; k++) {
        ac_cost_table t;
        ac_workload w;
        ac_engine_profile pr;
        ac_search_problem p;
        ac_err e = {{0}};
        problem(&p, &t, &w, &pr, opts(tg[k], k == 0));
        p.limits.max_params = 0.7 * ac_arch_params(&M.a);
        ac_dnas_opts o;
        ac_dnas_defaults(&o);
        o.batch = 2;
        o.seq_len = 32;
        ac_dnas_gates g0, g1, gs;
        CHECK(ac_dnas_gates_init(&gs, &M.a, &p.opts, &e) == 0, "%s", e.msg);
        int np = gs.np;
        double *a = calloc(np, sizeof(double)), *b = calloc(np, sizeof(double)), num = 0, den = 0, dla = 0;
        o.steps = 1;
        for (int c = 0; c < 2; c++) {
            o.cuda = c;
            CHECK(ac_dnas_train_gates(&p, &M, IDS, NIDS, &o, c ? &g1 : &g0, c ? b : a, &e) == 0, "%s", e.msg);
        }
        for (int i = 0; i < np; i++) num += (a[i] - b[i]) * (a[i] - b[i]), den += a[i] * a[i];
        ac_dnas_gates_free(&g0);
        ac_dnas_gates_free(&g1);
        o.steps = 5;
        for (int c = 0; c < 2; c++) {
            o.cuda = c;
            CHECK(ac_dnas_train_gates(&p, &M, IDS, NIDS, &o, c ? &g1 : &g0, NULL, &e) == 0, "%s", e.msg);
        }
        for (int i = 0; i < np && g0.la && g1.la; i++) dla = fmax(dla, fabs(g0.la[i] - g1.la[i]));
        ac_dnas_gates_free(&g0);
        ac_dnas_gates_free(&g1);
        double dco = 0; /* co-trained weights, teacher recomputed each step (a second trainer on each side) */
        o.steps = 3;
        o.cotrain = 1;
        o.w_lr = 1e-2;
        o.teacher_cache_mib = 0;
        for (int c = 0; c < 2; c++) {
            o.cuda = c;
            CHECK(ac_dnas_train_gates(&p, &M, IDS, NIDS, &o, c ? &g1 : &g0, NULL, &e) == 0, "cotrain: %s", e.msg);
        }
        for (int i = 0; i < np && g0.la && g1.la; i++) dco = fmax(dco, fabs(g0.la[i] - g1.la[i]));
        ac_dnas_gates_free(&g0);
        ac_dnas_gates_free(&g1);
        CHECK(dco < 1e-2, "co-trained: log_alphas after 3 steps differ by %g", dco);
        ac_dnas_defaults(&o);
        o.batch = 2;
        o.seq_len = 32;
        o.steps = 10;
        ac_search_result r[2];
        ac_importance ord[2];
        for (int c = 0; c < 2; c++) {
            o.cuda = c;
            CHECK(ac_search_dnas(&p, &M, IDS, NIDS, &o, &r[c], &ord[c], &e) == 0, "%s", e.msg);
        }
        int same = 1;
        for (int l = 0; l < M.a.n_layers; l++)
            same &= !memcmp(&r[0].arch.layers[l], &r[1].arch.layers[l], sizeof(ac_layer_arch));
        same &= r[0].arch.hidden == r[1].arch.hidden;
        const char *dev = json_string_value(json_object_get(r[1].detail, "gate_trainer"));
        printf("   %s: %d gates; first-step task gradient CUDA vs CPU relative diff %.2e (|grad| %.3g); log_alpha "
               "after 5 steps max |diff| %.2e (3 co-trained steps %.2e); 10-step search: same architecture %s "
               "(trainer %s)\n",
               k ? "deci" : "gguf", np, sqrt(num / (den + 1e-300)), sqrt(den), dla, dco, same ? "yes" : "no",
               dev ? dev : "?");
        CHECK(den > 0 && sqrt(num / den) < 1e-3, "first-step gradients differ by %g", sqrt(num / den));
        CHECK(dla < 1e-2, "log_alphas after 5 steps differ by %g", dla);
        CHECK(same && dev && !strcmp(dev, "cuda"), "the CUDA search picked another architecture (or ran on %s)",
              dev ? dev : "?");
        for (int c = 0; c < 2; c++) {
            ac_search_result_free(&r[c]);
            ac_importance_free(&ord[c]);
        }
        free(a);
        free(b);
        ac_dnas_gates_free(&gs);
        ac_cost_table_free(&t);
    }
}

/* deci, first step: the frozen trainer's merge-choice gradients (K/V
 * gradients into the search's private buffers) against the full trainer's,
 * which co-trains a copy with its own K/V gradients. */
static void frozen_vs_full_first_step(const ac_search_problem *p, ac_model *R, const ac_dnas_opts *o,
                                      const ac_dnas_gates *g) {
    ac_err e = {{0}};
    int np = g->np, ok = 1;
    ac_dnas_opts o1 = *o;
    ac_dnas_gates g1[2];
    double *t1[2] = {calloc(np + 1, sizeof(double)), calloc(np + 1, sizeof(double))}, dn = 0, dd = 0, mn = 0;
    o1.steps = 1;
    for (int c = 0; c < 2 && ok; c++) {
        o1.cotrain = c;
        ok = t1[c] && ac_dnas_train_gates(p, R, IDS, NIDS, &o1, &g1[c], t1[c], &e) == 0;
        if (ok) ac_dnas_gates_free(&g1[c]);
    }
    CHECK(ok, "%s", e.msg);
    for (int i = 0; ok && i < np; i++) {
        dn += t1[1][i] * t1[1][i], dd += (t1[0][i] - t1[1][i]) * (t1[0][i] - t1[1][i]);
        if (g->mkv[i]) mn += t1[0][i] * t1[0][i];
    }
    printf("   deci first step, frozen vs co-trained trainer: task gradient relative diff %.2e, merge-choice "
           "part |g| %.3g\n",
           sqrt(dd / (dn + 1e-300)), sqrt(mn));
    CHECK(ok && mn > 0 && dd <= 1e-8 * dn, "frozen and full trainers' gate gradients differ (%g)",
          sqrt(dd / (dn + 1e-300)));
    free(t1[0]), free(t1[1]);
}

/* The gate search on the resident BF16 tiny model (the frozen trainer reads
 * the mapping; deci KV-merge mixtures in a private buffer) against the same
 * search on its fp32 load (M): the last step's task gradient and the trained
 * log_alphas are equal bit for bit, the searches pick the same architecture,
 * and the mapping's K/V are unchanged; on gguf (KV, FFN, hidden, depth
 * gates) and deci (merge choices) targets, and with cotrain (an fp32 pruned
 * copy trained, the teacher on the mapping). */
/* cuda: the same through the CUDA plugin's trainer, which takes the
 * resident weights in their dtype and converts each tensor on the device. */
/* search.keep_weights: the kept co-trained copies of the resident and the
 * fp32 searches are the same weights (q projections compared), trained
 * (not M's); on deci, whose every layer has merge choices, K and V are M's
 * originals (the copy held the last mixture; keep puts them back). */
static void kept_copies(const ac_search_result *a, const ac_search_result *b, int deci) {
    CHECK(a->trained && b->trained, "keep: no co-trained copy handed over");
    if (!a->trained || !b->trained) return;
    size_t nq = (size_t)M.a.layers[0].n_heads * M.a.head_dim * M.a.hidden;
    size_t nk = (size_t)M.a.layers[0].n_kv_heads * M.a.head_dim * M.a.hidden;
    int same = 1, moved = 0, kv_orig = 1;
    for (int l = 0; l < M.a.n_layers; l++) {
        same &= !memcmp(a->trained->L[l].wq, b->trained->L[l].wq, nq * sizeof(float));
        moved |= memcmp(b->trained->L[l].wq, M.L[l].wq, nq * sizeof(float)) != 0;
        kv_orig &= !memcmp(b->trained->L[l].wk, M.L[l].wk, nk * sizeof(float)) &&
                   !memcmp(b->trained->L[l].wv, M.L[l].wv, nk * sizeof(float)) &&
                   !memcmp(a->trained->L[l].wk, M.L[l].wk, nk * sizeof(float));
    }
    printf("   kept copies: resident = fp32 %s, trained %s, K/V the originals %s\n", same ? "yes" : "no",
           moved ? "yes" : "no", kv_orig ? "yes" : "no");
    CHECK(same && moved, "keep: the resident and fp32 searches' kept weights differ, or are M's");
    CHECK(!deci || kv_orig, "keep on deci: the merge layers' K/V are not the original ones");
    CHECK(deci || !kv_orig, "keep on gguf: K/V were not trained");
}

static void resident_search_equals_fp32(int cuda) {
    const char *why;
    if (cuda && !ac_cuda(&why)) SKIP("no CUDA: %s", why);
    if (!setup()) SKIP("no tiny model or calibration text (make tiny-model)");
    char tiny[1100];
    ck_build_path(tiny, sizeof tiny, "models/tiny");
    ac_model R;
    ac_err e = {{0}};
    if (ac_model_load_resident(tiny, &R, &e)) {
        CHECK(0, "%s", e.msg);
        return;
    }
    CHECK(ac_model_wdt(&R) == ST_BF16, "tiny model resident in BF16");
    size_t nk = (size_t)R.a.layers[0].n_kv_heads * R.a.head_dim * R.a.hidden;
    uint16_t *k0 = malloc(nk * 2);
    if (k0) memcpy(k0, R.L[0].wk, nk * 2);
    ac_export_target tg[2] = {AC_EXPORT_GGUF, AC_EXPORT_DECI};
    for (int k = 0; k < 4; k++) {
        ac_cost_table t;
        ac_workload w;
        ac_engine_profile pr;
        ac_search_problem p;
        problem(&p, &t, &w, &pr, opts(tg[k % 2], k % 2 == 0));
        p.limits.max_params = 0.7 * ac_arch_params(&M.a);
        ac_dnas_opts o;
        ac_dnas_defaults(&o);
        o.batch = 2;
        o.seq_len = 32;
        o.steps = k < 2 && !cuda ? 12 : 3; /* the emulated plugin is slow: 3 steps there */
        o.cotrain = o.keep = k >= 2; /* keep: ac_search_dnas hands the co-trained copy over */
        o.teacher_cache_mib = k == 3 ? 0 : o.teacher_cache_mib; /* deci cotrain: online teacher (a second trainer) */
        o.cuda = cuda;
        ac_dnas_gates g[2];
        ac_search_result r[2];
        ac_importance ord[2];
        double *tgr[2] = {0};
        int ok = 1;
        ac_model *ms[2] = {&R, &M};
        for (int c = 0; c < 2 && ok; c++) {
            tgr[c] = calloc(4096, sizeof(double));
            ok = tgr[c] && ac_dnas_train_gates(&p, ms[c], IDS, NIDS, &o, &g[c], tgr[c], &e) == 0;
        }
        CHECK(ok, "%s", e.msg);
        if (!ok) break;
        int np = g[0].np, same = np == g[1].np && np <= 4096 && !memcmp(g[0].la, g[1].la, sizeof(double) * np) &&
                                 !memcmp(tgr[0], tgr[1], sizeof(double) * np);
        double gn = 0;
        for (int i = 0; i < np; i++) gn += tgr[0][i] * tgr[0][i];
        ok = ac_search_dnas(&p, &R, IDS, NIDS, &o, &r[0], &ord[0], &e) == 0 &&
             ac_search_dnas(&p, &M, IDS, NIDS, &o, &r[1], &ord[1], &e) == 0;
        CHECK(ok, "%s", e.msg);
        int arch = ok && r[0].arch.hidden == r[1].arch.hidden;
        for (int l = 0; ok && l < M.a.n_layers; l++)
            arch &= !memcmp(&r[0].arch.layers[l], &r[1].arch.layers[l], sizeof(ac_layer_arch));
        printf("   %s%s%s: %d gates, %d steps: resident vs fp32 log_alphas and task gradient (|g| %.3g) %s; "
               "same architecture %s\n",
               cuda ? "cuda " : "", k % 2 ? "deci" : "gguf", k >= 2 ? " cotrain" : "", np, o.steps, sqrt(gn),
               same ? "identical" : "DIFFER", arch ? "yes" : "no");
        CHECK(same && gn > 0, "resident and fp32 gate training differ");
        if (k == 1 && !cuda) frozen_vs_full_first_step(&p, &R, &o, &g[0]);
        CHECK(arch, "resident and fp32 searches picked different architectures");
        if (ok && k >= 2) kept_copies(&r[0], &r[1], k == 3);
        for (int c = 0; c < 2; c++) {
            ac_dnas_gates_free(&g[c]);
            free(tgr[c]);
            if (ok) ac_search_result_free(&r[c]), ac_importance_free(&ord[c]);
        }
        ac_cost_table_free(&t);
    }
    CHECK(k0 && !memcmp(k0, R.L[0].wk, nk * 2), "the mapping's K is unchanged");
    free(k0);
    ac_model_free(&R);
}

static void test_resident_search_equals_fp32(void) { resident_search_equals_fp32(0); }
static void test_cuda_resident_search_equals_fp32(void) { resident_search_equals_fp32(1); }

int main(void) {
    ac_set_threads(ck_threads());
    if (getenv("AC_DNAS_CUDA_ONLY")) { /* tests/run_all.sh: the gate search on the emulated plugin */
        RUN(test_cuda_gate_search_matches_cpu);
        RUN(test_cuda_resident_search_equals_fp32);
        return DONE();
    }
    RUN(test_gates_at_one_are_the_unpruned_model);
    RUN(test_hard_zero_gates_equal_pruning);
    RUN(test_gated_rmsnorm_gradient_matches_finite_differences);
    RUN(test_constraint_gradient_matches_finite_differences);
    RUN(test_hard_merge_choice_equals_merging);
    RUN(test_merge_sample_is_a_categorical_sample);
    RUN(test_depth_only_limit_is_met_by_removing_sub_blocks);
    RUN(test_llama_limit_is_met_by_dropping_layers);
    RUN(test_llama_job_drops_layers);
    RUN(test_resident_search_equals_fp32);
    RUN(test_cuda_gate_search_matches_cpu);
    if (HAVE > 0) {
        ac_importance_free(&IMP);
        free(IDS);
        ac_model_free(&M);
    }
    return DONE();
}
