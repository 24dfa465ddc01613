/*
 * test_dnas.c - the differentiable search through the network (src/search/dnas.c):
 * gates at 1 are the unpruned model bit for bit; hard gates at 0 give the
 * same logits as ac_prune removing those units (KV groups with their query
 * heads, FFN channel groups, whole sub-blocks); the expected-cost gradient
 * matches central finite differences of the expected cost; a limit that
 * only removing sub-blocks can meet is met by removing sub-blocks.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dnas.h"
#include "eval.h"
#include "kernels_cpu.h"
#include "prune.h"

static ac_model M;
static ac_importance IMP;
static int *IDS, HAVE;
static size_t NIDS;

static int setup(void) {
    if (HAVE) return HAVE > 0;
    char tiny[1100], text[1200];
    ck_build_path(tiny, sizeof tiny, "models/tiny");
    ck_build_path(text, sizeof text, "data/calib.txt");
    ac_err e;
    HAVE = -1;
    if (ac_model_load(tiny, &M, &e)) return 0;
    if (ac_load_text_ids(tiny, text, &IDS, &NIDS, M.a.vocab, &e)) return 0;
    if (NIDS > 8192) NIDS = 8192;
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

static void test_hard_zero_gates_equal_pruning(void) {
    if (!setup()) SKIP("no tiny model or calibration text (make tiny-model)");
    ac_dnas_gates g;
    ac_err e;
    ac_search_opts so = opts(AC_EXPORT_GGUF, 0);
    CHECK(ac_dnas_gates_init(&g, &M.a, &so, &e) == 0, "%s", e.msg);
    double *z = malloc(sizeof(double) * g.np);
    for (int i = 0; i < g.np; i++) z[i] = 1;
    z[g.kv_off[0] + 1] = 0;                        /* layer 0: KV group 1 (2 query heads) */
    z[g.kv_off[1] + 0] = z[g.kv_off[1] + 2] = 0;   /* layer 1: KV groups 0, 2 */
    z[g.ffn_off[1] + 0] = z[g.ffn_off[1] + 5] = 0; /* layer 1: the most important 32 FFN channels, and rank 160..191 */
    z[g.attn_off + 2] = 0;                         /* layer 2: attention sub-block */
    z[g.mlp_off + 3] = 0;                          /* layer 3: FFN sub-block */
    for (int j = 3; j < 12; j++) z[g.ffn_off[4] + j] = 0; /* layer 4: keep 96 channels */
    for (int i = 0; i < g.np; i++) g.la[i] = z[i] ? 8 : -8;
    int B = 2, T = 48, V = M.a.vocab;
    float *a = logits(&M, &g, z, B, T);
    ac_importance ord;
    CHECK(ac_dnas_orders(&g, &IMP, &M.a, &ord, &e) == 0, "%s", e.msg);
    ac_arch t;
    ac_arch_copy(&t, &M.a, &e);
    t.layers[0] = (ac_layer_arch){6, 3, 384};
    t.layers[1] = (ac_layer_arch){4, 2, 320};
    t.layers[2] = (ac_layer_arch){0, 0, 384};
    t.layers[3] = (ac_layer_arch){8, 4, 0};
    t.layers[4] = (ac_layer_arch){8, 4, 96};
    ac_model pm;
    CHECK(ac_prune(&M, &t, &ord, &pm, &e) == 0, "%s", e.msg);
    float *b = logits(&pm, NULL, NULL, B, T);
    double d = 0, mx = 0;
    for (int i = 0; a && b && i < B * T * V; i++) {
        d = fmax(d, fabs(a[i] - b[i]));
        mx = fmax(mx, fabs(a[i]));
    }
    printf("   gated vs pruned logits: max diff %.3g (max |logit| %.3g)\n", d, mx);
    CHECK(a && b && d <= 1e-5 * mx, "hard-zero gates differ from pruning by %g", d);
    free(a);
    free(b);
    free(z);
    ac_model_free(&pm);
    ac_arch_free(&t);
    ac_importance_free(&ord);
    ac_dnas_gates_free(&g);
}

static void problem(ac_search_problem *p, ac_cost_table *t, ac_workload *w, ac_engine_profile *pr, ac_search_opts so) {
    ac_err e;
    ac_cost_roofline(ac_device_spec_find("H100"), "bf16", t, &e);
    *w = (ac_workload){8, 256, 64};
    ac_engine_profile_default(pr, 0);
    *p = (ac_search_problem){.table = t, .workload = w, .profile = pr, .imp = &IMP, .base = &M.a, .opts = so};
}

static void test_constraint_gradient_matches_finite_differences(void) {
    if (!setup()) SKIP("no tiny model or calibration text (make tiny-model)");
    ac_cost_table t;
    ac_workload w;
    ac_engine_profile pr;
    ac_search_problem p;
    problem(&p, &t, &w, &pr, opts(AC_EXPORT_GGUF, 1));
    ac_dnas_gates g;
    ac_err e;
    CHECK(ac_dnas_gates_init(&g, &M.a, &p.opts, &e) == 0, "%s", e.msg);
    unsigned long long s = 3;
    for (int i = 0; i < g.np; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        g.la[i] = -2 + 5.0 * (s >> 11) / 9007199254740992.0;
    }
    double *an = malloc(sizeof(double) * g.np), *fd = malloc(sizeof(double) * g.np), h = 1e-4;
    const char *names[] = {"ttft", "tpot", "tok/s", "memory", "params"};
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
        printf("   %-7s E=%.5g |grad|=%.4g relative error vs finite differences %.2e\n", names[m], v, sqrt(den), rel);
        CHECK(isfinite(v) && den > 0 && rel < 0.03, "%s gradient relative error %g", names[m], rel);
    }
    free(an);
    free(fd);
    ac_dnas_gates_free(&g);
    ac_cost_table_free(&t);
}

static double tpot_of(const ac_search_problem *p, const ac_arch *a) {
    ac_carch c;
    ac_cost k;
    ac_carch_from_arch(a, &c, NULL);
    ac_cost_predict(p->table, &c, p->workload, p->profile, 0, &k);
    ac_carch_free(&c);
    return k.tpot_ms;
}

static void test_depth_only_limit_is_met_by_removing_sub_blocks(void) {
    if (!setup()) SKIP("no tiny model or calibration text (make tiny-model)");
    ac_cost_table t;
    ac_workload w;
    ac_engine_profile pr;
    ac_search_problem p;
    problem(&p, &t, &w, &pr, opts(AC_EXPORT_DECI, 0));
    w = (ac_workload){1, 64, 16};
    /* per-kernel launch overheads dominate a tiny model on an H100: the
     * narrowest architecture that keeps every sub-block is still too slow */
    ac_arch narrow, one;
    ac_err e;
    ac_arch_copy(&narrow, &M.a, &e);
    ac_arch_copy(&one, &M.a, &e);
    for (int l = 0; l < M.a.n_layers; l++) narrow.layers[l] = (ac_layer_arch){8, 1, 32};
    one.layers[5].ffn = 0;
    double full = tpot_of(&p, &M.a), nar = tpot_of(&p, &narrow), sub = full - tpot_of(&p, &one);
    p.limits.max_tpot_ms = nar - 0.5 * sub;
    printf("   tpot full %.4f ms, narrowest %.4f ms, one FFN sub-block %.4f ms; limit %.4f ms\n", full, nar, sub,
           p.limits.max_tpot_ms);
    CHECK(nar > p.limits.max_tpot_ms && sub > 0, "the limit is not depth-only");
    ac_dnas_opts o;
    ac_dnas_defaults(&o);
    o.steps = 40;
    ac_search_result r, r2;
    ac_importance ord, ord2;
    double t0 = ac_now();
    CHECK(ac_search_dnas(&p, &M, IDS, NIDS, &o, &r, &ord, &e) == 0, "%s", e.msg);
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
    ac_arch_free(&narrow);
    ac_arch_free(&one);
    ac_cost_table_free(&t);
}

int main(void) {
    ac_set_threads(2);
    RUN(test_gates_at_one_are_the_unpruned_model);
    RUN(test_hard_zero_gates_equal_pruning);
    RUN(test_constraint_gradient_matches_finite_differences);
    RUN(test_depth_only_limit_is_met_by_removing_sub_blocks);
    if (HAVE > 0) {
        ac_importance_free(&IMP);
        free(IDS);
        ac_model_free(&M);
    }
    return DONE();
}
