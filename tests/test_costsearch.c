/* test_costsearch.c - cost model (interpolation, gradients, JSON round
 * trip, CPU decode bands, memory accounting), search (feasibility, determinism, uniform
 * baseline, infeasible detection), pruning (equivalence with masking) and
 * least-squares repair. */
#include <math.h>

#include "check.h"
#include "cost/costmodel.h"
#include "format/deci.h"
#include "cost/device.h"
#include "runtime/engine.h"
#include "runtime/eval.h"
#include "search/importance.h"
#include "runtime/kernels_cpu.h"
#include "search/minitron.h"
#include "compress/prune.h"
#include "search/search.h"
#include "synth.h"
#include "synth_cost.h"

/* A worker on GPU slot cuda:N sees that GPU as its device 0. */
static void test_cuda_pin(void) {
    char v[64];
    CHECK(ac_cuda_pin(NULL, 1, v, sizeof v) == 0 && !strcmp(v, "1"), "unset: '%s'", v);
    CHECK(ac_cuda_pin("", 0, v, sizeof v) == 0 && !strcmp(v, "0"), "empty: '%s'", v);
    CHECK(ac_cuda_pin("2,3", 1, v, sizeof v) == 0 && !strcmp(v, "3"), "list: '%s'", v);
    CHECK(ac_cuda_pin("GPU-aa11, GPU-bb22", 1, v, sizeof v) == 0 && !strcmp(v, "GPU-bb22"), "uuids: '%s'", v);
    CHECK(ac_cuda_pin("2", 1, v, sizeof v) == -1, "ordinal beyond the list accepted");
    CHECK(ac_cuda_pin("2,3", -1, v, sizeof v) == -1, "negative ordinal accepted");
    CHECK(ac_cuda_pin("GPU-aa11", 0, v, 4) == -1, "truncated value accepted");
}

static void test_interpolation_hits_grid_points(void) {
    ac_cost_table t;
    synth_table(&t);
    CHECK(fabs(ac_cost_gemm_us(&t, 16, 64, 256) - (1 + 16 * 64 * 256 * 1e-5)) < 1e-9, "grid point");
    double mid = ac_cost_gemm_us(&t, 32, 64, 256), lo = ac_cost_gemm_us(&t, 16, 64, 256),
           hi = ac_cost_gemm_us(&t, 64, 64, 256);
    CHECK(mid > lo && mid < hi, "between neighbours: %g %g %g", lo, mid, hi);
    CHECK(fabs(ac_cost_gemm_us(&t, 2048, 64, 256) / ac_cost_gemm_us(&t, 1024, 64, 256) - 2) < 1e-9,
          "extrapolation linear in m");
    CHECK(ac_cost_gemm_us(&t, 16, 0, 256) == 0, "removed op costs nothing");
    double a32 = ac_cost_attn_us(&t, 1, 1, 1, 16, 16 + 63, 32), a128 = ac_cost_attn_us(&t, 1, 1, 1, 16, 16 + 63, 128);
    CHECK(fabs(a32 - t.attn_us[(0 * 3 + 1) * 3 + 1]) < 1e-9 && fabs(a128 - t.attn_us[(1 * 3 + 1) * 3 + 1]) < 1e-9,
          "attention grid");
    double a80 = ac_cost_attn_us(&t, 1, 1, 1, 16, 16 + 63, 80);
    CHECK(fabs(a80 - (a32 + a128) / 2) < 1e-9, "head_dim linear");
    CHECK(fabs(ac_cost_attn_us(&t, 8, 2, 3, 16, 79, 32) - 24 * a32) < 1e-9, "heads x batch");
    ac_cost_table_free(&t);
}

static void test_gradients_match_finite_differences(void) {
    ac_cost_table tabs[2];
    ac_err e;
    CHECK(ac_cost_roofline(ac_device_spec_find("H100"), "bf16", &tabs[0], &e) == 0, "%s", e.msg);
    synth_table(&tabs[1]);
    ac_arch a = mk_arch(4, 512, 64, 8, 4, 1536, 2000);
    a.layers[2] = (ac_layer_arch){4, 2, 700, 0, 0, 0};
    ac_carch c;
    ac_carch_from_arch(&a, &c, &e);
    ac_workload w = {.batch = 4, .prompt_len = 300, .gen_len = 50};
    for (int ti = 0; ti < 2; ti++) {
        ac_engine_profile p;
        ac_engine_profile_default(&p, ti == 1);
        for (int m = 0; m < AC_M_COUNT; m++) {
            double gh[4], gk[4], gf[4], ghid;
            ac_cost_grad(&tabs[ti], &c, &w, &p, (ac_metric)m, gh, gk, gf, &ghid);
            for (int l = 0; l < 4; l++) {
                /* independent check: a central difference with another step
                 * (memory has a kink where layers tie for the widest) */
                ac_cost k0, k1;
                double o = c.ffn[l];
                c.ffn[l] = o - 0.5;
                ac_cost_predict(&tabs[ti], &c, &w, &p, 1, &k0);
                c.ffn[l] = o + 0.5;
                ac_cost_predict(&tabs[ti], &c, &w, &p, 1, &k1);
                c.ffn[l] = o;
                double fd = (ac_cost_metric(&k1, m) - ac_cost_metric(&k0, m)) / 1.0;
                CHECK(fabs(fd - gf[l]) <= 0.05 * fabs(fd) + 1e-9 * (1 + fabs(ac_cost_metric(&k0, m))),
                      "table %d metric %d layer %d: grad %g fd %g", ti, m, l, gf[l], fd);
            }
            if (m == AC_M_PARAMS) {
                CHECK(fabs(gf[0] - 3.0 * 512) < 1e-6, "d params / d ffn = 3H: %g", gf[0]);
                CHECK(fabs(gk[0] - 2.0 * 512 * 64) < 1e-6 && fabs(gh[0] - 2.0 * 512 * 64) < 1e-6,
                      "d params / d heads, kv");
                /* d params / d hidden = 2V + 1 + sum over sub-blocks (1 + their widths) */
                double want = 2 * 2000.0 + 1;
                for (int l = 0; l < 4; l++)
                    want +=
                        1 + 2 * a.layers[l].n_heads * 64 + 2 * a.layers[l].n_kv_heads * 64 + 1 + 3.0 * a.layers[l].ffn;
                CHECK(fabs(ghid - want) < 1e-6 * want, "d params / d hidden %g want %g", ghid, want);
            }
        }
    }
    ac_carch_free(&c);
    ac_arch_free(&a);
    ac_cost_table_free(&tabs[0]);
    ac_cost_table_free(&tabs[1]);
}

/* CPU decode bands: a decode step costs the warm tables plus the bytes it
 * streams (weights once, the KV cache read) times the band's cost per MiB
 * at that working set (constant beyond the bands, log-linear between),
 * never less than half the warm part; prefill does not change; the bands
 * survive a JSON round trip. */
static void test_decode_bands(void) {
    ac_cost_table t;
    synth_table(&t);
    ac_arch a = mk_arch(2, 64, 16, 4, 2, 128, 256);
    ac_carch c;
    ac_err e;
    CHECK(ac_carch_from_arch(&a, &c, &e) == 0, "carch");
    ac_engine_profile p;
    ac_engine_profile_default(&p, 1);
    ac_workload w = {.batch = 1, .prompt_len = 16, .gen_len = 2};
    /* independent byte count: lm head + per layer q,k,v,o and gate,up,down, fp32; KV fp32 at context S */
    double wb = (256.0 * 64 + 2 * (2 * 64 * (4 + 2) * 16 + 3 * 64 * 128)) * 4;
#define BYTES(S) (wb + 2 * 2 * 2 * 16 * (S)*4.0)
    double bytes16 = BYTES(16.0);
    CHECK(fabs(ac_cost_decode_bytes(&c, &p, 1, 16) - bytes16) < 1e-6, "bytes %g vs %g",
          ac_cost_decode_bytes(&c, &p, 1, 16), bytes16);
    ac_cost warm, banded;
    t.cache_bytes = 1e30;
    ac_cost_predict(&t, &c, &w, &p, 0, &warm);
    t.cache_bytes = 0;
    t.ndec = 2;
    t.dec_ws[0] = 1e3;
    t.dec_ws[1] = 2e3;
    t.dec_us_mib[0] = 10;
    t.dec_us_mib[1] = 50;
    ac_cost_predict(&t, &c, &w, &p, 0, &banded);
    /* Simpson over the step contexts 17, 17.5, 18 (position + 1), all beyond the bands: 50 us/MiB */
    double extra = (BYTES(17.0) + 4 * BYTES(17.5) + BYTES(18.0)) / 6 / 1048576.0 * 50 / 1e3;
    CHECK(fabs(banded.tpot_ms - warm.tpot_ms - extra) < 1e-9, "beyond the bands: %g vs %g + %g", banded.tpot_ms,
          warm.tpot_ms, extra);
    /* bands around the working set: at the log midpoint, the mean of the two */
    t.dec_ws[0] = BYTES(17.5) / 2;
    t.dec_ws[1] = BYTES(17.5) * 2;
    ac_cost_predict(&t, &c, &w, &p, 0, &banded);
    extra = BYTES(17.5) / 1048576.0 * 30 / 1e3;
    CHECK(fabs(banded.tpot_ms - warm.tpot_ms - extra) < 1e-3 * extra, "between the bands: %g vs %g + %g",
          banded.tpot_ms, warm.tpot_ms, extra);
    /* batch-4 bands: batch 4 takes them, batch 2 the mean in log batch */
    t.dec_ws[0] = 1e3;
    t.dec_ws[1] = 2e3;
    t.dec_b4 = 1;
    t.dec_us_mib4[0] = t.dec_us_mib4[1] = 90;
    ac_workload w4 = {.batch = 4, .prompt_len = 16, .gen_len = 2}, w2 = {.batch = 2, .prompt_len = 16, .gen_len = 2};
    ac_cost warm4, b4, warm2, b2;
    t.ndec = 0;
    t.cache_bytes = 1e30;
    ac_cost_predict(&t, &c, &w4, &p, 0, &warm4);
    ac_cost_predict(&t, &c, &w2, &p, 0, &warm2);
    t.ndec = 2;
    t.cache_bytes = 0;
    ac_cost_predict(&t, &c, &w4, &p, 0, &b4);
    ac_cost_predict(&t, &c, &w2, &p, 0, &b2);
    double x4 = ac_cost_decode_bytes(&c, &p, 4, 17.5) / 1048576.0 * 90 / 1e3,
           x2 = ac_cost_decode_bytes(&c, &p, 2, 17.5) / 1048576.0 * 70 / 1e3;
    CHECK(fabs(b4.tpot_ms - warm4.tpot_ms - x4) < 1e-9, "batch 4: %g vs %g + %g", b4.tpot_ms, warm4.tpot_ms, x4);
    CHECK(fabs(b2.tpot_ms - warm2.tpot_ms - x2) < 1e-9, "batch 2: %g vs %g + %g", b2.tpot_ms, warm2.tpot_ms, x2);
    /* a negative band never takes a step below half its warm part */
    t.dec_us_mib4[0] = t.dec_us_mib4[1] = -1e6;
    ac_cost_predict(&t, &c, &w4, &p, 0, &b4);
    CHECK(fabs(b4.tpot_ms - 0.5 * warm4.tpot_ms) < 1e-12 * warm4.tpot_ms, "floor: %g vs half of %g", b4.tpot_ms,
          warm4.tpot_ms);
    t.dec_us_mib4[0] = t.dec_us_mib4[1] = 90;
    t.dec_b4 = 0;
    t.dec_ws[0] = BYTES(17.5) / 2;
    t.dec_ws[1] = BYTES(17.5) * 2;
#undef BYTES
    ac_cost cold;
    t.ndec = 0;
    ac_cost_predict(&t, &c, &w, &p, 0, &cold);
    t.ndec = 2;
    CHECK(fabs(banded.ttft_ms - cold.ttft_ms) < 1e-12, "prefill unchanged by the bands");
    json_t *j = ac_cost_table_to_json(&t);
    ac_cost_table u;
    CHECK(ac_cost_table_from_json(j, &u, &e) == 0, "round trip: %s", e.msg);
    CHECK(u.ndec == 2 && u.dec_ws[1] == t.dec_ws[1] && u.dec_us_mib[0] == 10 && !u.dec_b4, "bands kept");
    ac_cost_table_free(&u);
    t.dec_b4 = 1;
    json_t *j4 = ac_cost_table_to_json(&t);
    CHECK(ac_cost_table_from_json(j4, &u, &e) == 0 && u.dec_b4 && u.dec_us_mib4[1] == 90, "batch-4 bands kept");
    json_decref(j4);
    ac_cost_table_free(&u);
    json_array_set_new(json_object_get(json_object_get(j, "decode_bands"), "working_set_bytes"), 1, json_real(1));
    const char *field = NULL;
    CHECK(ac_cost_table_validate(j, &field, &e) == -1 && field && strstr(field, "decode_bands"),
          "decreasing working sets accepted");
    json_decref(j);
    ac_carch_free(&c);
    ac_arch_free(&a);
    ac_cost_table_free(&t);
}

static void test_memory_accounting(void) {
    ac_cost_table t;
    ac_err e;
    ac_cost_roofline(ac_device_spec_find("H200"), "bf16", &t, &e);
    /* Llama-3-8B-like: KV bytes per token = 32 layers x 2 x 8 heads x 128 x 2 B = 128 KiB */
    ac_arch a = mk_arch(32, 4096, 128, 32, 8, 14336, 128256);
    ac_carch c;
    ac_carch_from_arch(&a, &c, &e);
    ac_engine_profile p;
    ac_engine_profile_default(&p, 0);
    p.block_size = 16;
    ac_workload w = {.batch = 10, .prompt_len = 1000, .gen_len = 24}; /* 1024 tokens a sequence, a multiple of 16 */
    ac_cost k;
    ac_cost_predict(&t, &c, &w, &p, 0, &k);
    CHECK(fabs(k.kv_gib - 10 * 1024 * 131072.0 / 1073741824.0) < 1e-9, "kv %g", k.kv_gib);
    CHECK(fabs(k.params - 8.03e9) / 8.03e9 < 0.01, "params %g", k.params);
    CHECK(fabs(k.weights_gib - k.params * 2 / 1073741824.0) < 1e-9, "weights");
    CHECK(k.max_batch > 100 && k.max_batch < 2000, "max batch %d", k.max_batch);
    /* decode on H200 is memory-bound: TPOT near weights / bandwidth */
    double floor_ms = k.weights_gib * 1073741824.0 / (4800e9) * 1e3;
    CHECK(k.tpot_ms > floor_ms && k.tpot_ms < 2 * floor_ms, "tpot %g vs floor %g", k.tpot_ms, floor_ms);
    json_t *j = ac_cost_table_to_json(&t);
    ac_cost_table t2;
    CHECK(ac_cost_table_from_json(j, &t2, &e) == 0, "%s", e.msg);
    ac_cost k2;
    ac_cost_predict(&t2, &c, &w, &p, 0, &k2);
    CHECK(fabs(k2.tpot_ms - k.tpot_ms) < 1e-12 && fabs(k2.ttft_ms - k.ttft_ms) < 1e-12, "roofline JSON round trip");
    json_decref(j);
    ac_cost_table_free(&t2);
    ac_cost_table s;
    synth_table(&s);
    j = ac_cost_table_to_json(&s);
    CHECK(ac_cost_table_from_json(j, &t2, &e) == 0, "%s", e.msg);
    CHECK(fabs(ac_cost_gemm_us(&t2, 33, 77, 500) - ac_cost_gemm_us(&s, 33, 77, 500)) < 1e-12,
          "measured JSON round trip");
    json_object_set_new(json_object_get(j, "gemm"), "us", json_array());
    const char *field = NULL;
    CHECK(ac_cost_table_validate(j, &field, &e) != 0 && field && !strcmp(field, "gemm.us"),
          "validation names the field");
    json_decref(j);
    ac_cost_table_free(&t2);
    ac_cost_table_free(&s);
    ac_carch_free(&c);
    ac_arch_free(&a);
    ac_cost_table_free(&t);
}

/* Importance with hand-made curves: layer l's attention costs l+1 units to
 * remove, FFN costs (L-l) units; orders are identity. */
static void fake_importance(ac_importance *imp, const ac_arch *a) {
    memset(imp, 0, sizeof *imp);
    int L = a->n_layers;
    imp->n_layers = L;
    imp->hidden = a->hidden;
    imp->kv_order = calloc(L, sizeof(int *));
    imp->kv_score = calloc(L, sizeof(double *));
    imp->ffn_order = calloc(L, sizeof(int *));
    imp->ffn_score = calloc(L, sizeof(double *));
    imp->attn_sens = calloc(L, sizeof *imp->attn_sens);
    imp->ffn_sens = calloc(L, sizeof *imp->ffn_sens);
    imp->layer_bi = calloc(L, sizeof(double));
    for (int l = 0; l < L; l++) {
        imp->kv_order[l] = calloc(a->layers[l].n_kv_heads + 1, sizeof(int));
        imp->kv_score[l] = calloc(a->layers[l].n_kv_heads + 1, sizeof(double));
        imp->ffn_order[l] = calloc(a->layers[l].ffn + 1, sizeof(int));
        imp->ffn_score[l] = calloc(a->layers[l].ffn + 1, sizeof(double));
        for (int i = 0; i < a->layers[l].n_kv_heads; i++) imp->kv_order[l][i] = i;
        for (int i = 0; i < a->layers[l].ffn; i++) imp->ffn_order[l][i] = i;
        for (int p = 0; p < AC_SENS_POINTS; p++) {
            double r = p / 4.0;
            imp->attn_sens[l][p] = 0.1 * (l + 1) * r * r;
            imp->ffn_sens[l][p] = 0.1 * (L - l) * r * r;
        }
        imp->layer_bi[l] = 1.0 / (l + 1);
    }
    imp->hid_order = calloc(a->hidden, sizeof(int));
    imp->hid_score = calloc(a->hidden, sizeof(double));
    for (int i = 0; i < a->hidden; i++) imp->hid_order[i] = i;
    double hf[4] = {0.125, 0.25, 0.5, 0.75};
    for (int i = 0; i < 4; i++) {
        imp->hid_frac[i] = hf[i];
        imp->hid_sens[i] = 5 * hf[i];
    }
    /* KV merging costs half of removing the same share of KV groups */
    imp->merge_n = calloc(L, sizeof(int));
    imp->merge_r = calloc(L, sizeof *imp->merge_r);
    imp->merge_sens = calloc(L, sizeof *imp->merge_sens);
    for (int l = 0; l < L; l++) {
        int kv = a->layers[l].n_kv_heads;
        for (int d = kv - 1; d >= 1; d--)
            if (kv % d == 0) {
                int k = imp->merge_n[l]++;
                imp->merge_r[l][k] = 1.0 - (double)d / kv;
                imp->merge_sens[l][k] = 0.05 * (l + 1) * imp->merge_r[l][k] * imp->merge_r[l][k];
            }
    }
}

/* An 8-layer model on the H100 roofline table at batch 64, 1024/128
 * tokens, with synthetic importance, and its unpruned cost: the setup of
 * the search tests below. */
typedef struct {
    ac_cost_table t;
    ac_arch a;
    ac_importance imp;
    ac_engine_profile p;
    ac_workload w;
    ac_cost base;
} h100_case;

static void h100_case_init(h100_case *k, int ffn) {
    ac_err e;
    ac_carch c;
    ac_cost_roofline(ac_device_spec_find("H100"), "bf16", &k->t, &e);
    k->a = mk_arch(8, 1024, 64, 16, 8, ffn, 32000);
    fake_importance(&k->imp, &k->a);
    ac_engine_profile_default(&k->p, 0);
    k->w = (ac_workload){.batch = 64, .prompt_len = 1024, .gen_len = 128};
    ac_carch_from_arch(&k->a, &c, &e);
    ac_cost_predict(&k->t, &c, &k->w, &k->p, 0, &k->base);
    ac_carch_free(&c);
}

static void h100_case_free(h100_case *k) {
    ac_importance_free(&k->imp);
    ac_arch_free(&k->a);
    ac_cost_table_free(&k->t);
}

static void test_search_feasible_deterministic_heterogeneous(void) {
    h100_case k;
    h100_case_init(&k, 4096);
    ac_err e;
    for (int target = 0; target < 3; target++) {
        ac_search_problem P = {.table = &k.t, .workload = &k.w, .profile = &k.p, .imp = &k.imp, .base = &k.a};
        P.limits.max_tpot_ms = 0.7 * k.base.tpot_ms;
        P.opts = (ac_search_opts){.steps = 150,
                                  .seed = 4,
                                  .lr = 0.03,
                                  .ffn_multiple = 64,
                                  .hidden_multiple = 64,
                                  .prune_hidden = 1,
                                  .target = (ac_export_target)target};
        ac_search_result r1, r2; /* the Minitron baseline is tested in test_minitron.c */
        CHECK(ac_search_autocompress(&P, &r1, &e) == 0, "%s", e.msg);
        CHECK(ac_search_autocompress(&P, &r2, &e) == 0, "%s", e.msg);
        CHECK(r1.feasible && r1.cost.tpot_ms <= P.limits.max_tpot_ms, "target %d: tpot %g limit %g", target,
              r1.cost.tpot_ms, P.limits.max_tpot_ms);
        int same = r1.arch.hidden == r2.arch.hidden;
        for (int l = 0; l < 8; l++) same &= !memcmp(&r1.arch.layers[l], &r2.arch.layers[l], sizeof(ac_layer_arch));
        CHECK(same, "same seed, same architecture");
        for (int l = 0; l < 8; l++) {
            const ac_layer_arch *L = &r1.arch.layers[l];
            CHECK(L->ffn % 64 == 0 || L->ffn == 4096, "ffn multiple");
            if (target == AC_EXPORT_DECI) /* DeciLM: all query heads or none; KV heads merged to a divisor */
                CHECK((L->n_heads == 0 && L->n_kv_heads == 0) ||
                          (L->n_heads == 16 && L->n_kv_heads > 0 && 8 % L->n_kv_heads == 0),
                      "deci layer %d: %d heads, %d KV", l, L->n_heads, L->n_kv_heads);
            else if (L->n_heads)
                CHECK(L->n_heads == 2 * L->n_kv_heads, "query heads stay with their group");
        }
        if (target == AC_EXPORT_LLAMA) CHECK(ac_arch_is_uniform(&r1.arch), "llama export target is uniform");
        if (target == AC_EXPORT_GGUF) {
            /* cheap-to-remove early attention is pruned more than late attention */
            CHECK(r1.arch.layers[0].n_kv_heads <= r1.arch.layers[7].n_kv_heads, "heterogeneous: %d vs %d",
                  r1.arch.layers[0].n_kv_heads, r1.arch.layers[7].n_kv_heads);
        }
        ac_search_result_free(&r1);
        ac_search_result_free(&r2);
    }
    /* infeasible: no architecture reaches it */
    ac_search_problem P = {.table = &k.t, .workload = &k.w, .profile = &k.p, .imp = &k.imp, .base = &k.a};
    P.limits.max_tpot_ms = 1e-6;
    P.opts = (ac_search_opts){.steps = 20,
                              .seed = 1,
                              .lr = 0.03,
                              .ffn_multiple = 64,
                              .hidden_multiple = 64,
                              .prune_hidden = 1,
                              .target = AC_EXPORT_DECI};
    ac_search_result r;
    CHECK(ac_search_autocompress(&P, &r, &e) == 0, "%s", e.msg);
    CHECK(!r.feasible && r.cost.tpot_ms > 0, "infeasible reported");
    ac_search_result_free(&r);
    h100_case_free(&k);
}

/* Every grid width at many hidden sizes: the ffn_mult we write, printed as
 * jansson prints it (%.17g) and read back, gives the width under the
 * loaders' formula (Python's int(2 * m * hidden / 3) in doubles, the same
 * IEEE operations in the same order as ac_deci_loader_ffn). */
static void test_deci_ffn_mult(void) {
    static const int hs[] = {64,   96,   100,  112,  128,  1000,  2048,  3072,
                             4096, 5120, 6144, 7168, 8192, 12288, 16384, 18432};
    long checked = 0;
    for (size_t i = 0; i < sizeof hs / sizeof *hs; i++)
        for (int w = AC_DECI_GRID; w <= 131072; w += AC_DECI_GRID) {
            double m = ac_deci_ffn_mult(w, hs[i]);
            char buf[64];
            snprintf(buf, sizeof buf, "%.17g", m);
            double back = strtod(buf, NULL);
            if (m < 0 || back != m || ac_deci_loader_ffn(back, hs[i]) != w) {
                CHECK(0, "hidden %d width %d: ffn_mult %s gives %d", hs[i], w, buf, ac_deci_loader_ffn(back, hs[i]));
                return;
            }
            checked++;
        }
    CHECK(checked == 16 * 512, "%ld widths", checked);
    CHECK(ac_deci_ffn_mult(384, 128) < 0 && ac_deci_ffn_mult(0, 128) < 0, "off-grid widths have no ffn_mult");
    CHECK(ac_deci_loader_ffn(6.0, 128) == 512 && ac_deci_loader_ffn(4.5, 128) == 512 &&
              ac_deci_loader_ffn(3.0, 128) == 256,
          "the loaders' rounding up");
}

/* deci target, base FFN off the grid (1000): every width is 0 or a grid
 * width up to the padded base (1024), the cost is charged at that width,
 * the first active layer keeps attention, and the result is expressible. */
static void test_search_deci_grid(void) {
    h100_case k;
    h100_case_init(&k, 1000);
    ac_err e;
    for (int lim = 0; lim < 3; lim++) {
        ac_search_problem P = {.table = &k.t, .workload = &k.w, .profile = &k.p, .imp = &k.imp, .base = &k.a};
        P.limits.max_tpot_ms = (0.55 + 0.15 * lim) * k.base.tpot_ms;
        P.opts = (ac_search_opts){.steps = 100,
                                  .seed = 2,
                                  .lr = 0.03,
                                  .ffn_multiple = 32,
                                  .hidden_multiple = 64,
                                  .prune_hidden = 1,
                                  .target = AC_EXPORT_DECI};
        ac_search_result r;
        CHECK(ac_search_autocompress(&P, &r, &e) == 0, "%s", e.msg);
        CHECK(r.feasible, "limit %d feasible", lim);
        int first = -1;
        for (int l = 0; l < 8; l++) {
            const ac_layer_arch *L = &r.arch.layers[l];
            CHECK(L->ffn % AC_DECI_GRID == 0 && L->ffn <= 1024, "layer %d ffn %d on the grid", l, L->ffn);
            if (first < 0 && (L->n_heads || L->ffn)) first = l;
        }
        printf("   tpot limit %.2f x base: ffn", 0.55 + 0.15 * lim);
        for (int l = 0; l < 8; l++) printf(" %d/%dkv", r.arch.layers[l].ffn, r.arch.layers[l].n_kv_heads);
        printf("\n");
        CHECK(first >= 0 && r.arch.layers[first].n_heads > 0, "first active layer %d has attention", first);
        CHECK(ac_arch_is_uniform(&r.arch) || ac_deci_check_arch(&r.arch, &e) == 0, "%s", e.msg);
        ac_cost kc;
        ac_carch c;
        ac_carch_from_arch(&r.arch, &c, &e);
        ac_cost_predict(&k.t, &c, &k.w, &k.p, 0, &kc);
        ac_carch_free(&c);
        CHECK(fabs(kc.tpot_ms - r.cost.tpot_ms) < 1e-9 * kc.tpot_ms, "cost of the padded widths");
        ac_search_result_free(&r);
    }
    h100_case_free(&k);
}

/* vLLM's tensor-parallel rule, written here apart from engines.c: query
 * heads divisible by tp; KV heads divisible by tp, or, fewer than tp, a
 * divisor of it (replicated); FFN widths divisible by tp. */
static int tp_splits(int tp, const ac_layer_arch *y) {
    if (y->n_heads && (y->n_heads % tp || (y->n_kv_heads >= tp ? y->n_kv_heads % tp : tp % y->n_kv_heads)))
        return 0;
    return y->ffn % tp == 0;
}

static int arch_splits(int tp, const ac_arch *a) {
    for (int l = 0; l < a->n_layers; l++)
        if (!tp_splits(tp, &a->layers[l])) return 0;
    return 1;
}

/* Tensor parallelism: the search picks only KV counts (and query heads)
 * the engine splits tp ways, at every target and limit, where the same
 * problem without tp picks some it would not (the rule binds); Minitron's
 * FFN axis keeps tp's multiples; a DNAS architecture handed to repair
 * moves to the nearest count that splits; a base model or FFN grid that
 * does not split is refused. */
static void test_search_tp(void) {
    h100_case k;
    h100_case_init(&k, 4096); /* 16 heads, 8 KV heads a layer */
    ac_err e;
    int unsplit_without_tp = 0, results = 0;
    for (int target = 0; target < 3; target++)
        for (int lim = 0; lim < 3; lim++)
            for (int tp = 1; tp <= 8; tp *= 2) {
                if (tp == 2) continue; /* 1, 4, 8 */
                ac_engine_profile prof = k.p;
                prof.tp = tp;
                ac_search_problem P = {.table = &k.t, .workload = &k.w, .profile = &prof, .imp = &k.imp, .base = &k.a};
                ac_carch bc;
                ac_cost kb;
                ac_carch_from_arch(&k.a, &bc, &e);
                ac_cost_predict(&k.t, &bc, &k.w, &prof, 0, &kb);
                ac_carch_free(&bc);
                P.limits.max_tpot_ms = (0.5 + 0.15 * lim) * kb.tpot_ms;
                P.opts = (ac_search_opts){.steps = 80,
                                          .seed = 5,
                                          .lr = 0.03,
                                          .ffn_multiple = 64,
                                          .hidden_multiple = 64,
                                          .prune_hidden = 0,
                                          .target = (ac_export_target)target};
                ac_search_result r;
                CHECK(ac_search_autocompress(&P, &r, &e) == 0, "target %d tp %d: %s", target, tp, e.msg);
                if (tp == 1) {
                    unsplit_without_tp += !arch_splits(4, &r.arch) || !arch_splits(8, &r.arch);
                } else {
                    results++;
                    CHECK(arch_splits(tp, &r.arch), "target %d limit %d tp %d: a layer the engine cannot split",
                          target, lim, tp);
                    for (int l = 0; l < 8 && !arch_splits(tp, &r.arch); l++)
                        printf("   layer %d: %d heads, %d KV, FFN %d\n", l, r.arch.layers[l].n_heads,
                               r.arch.layers[l].n_kv_heads, r.arch.layers[l].ffn);
                }
                ac_search_result_free(&r);
            }
    printf("   %d searches without tp picked KV counts tp 4 or 8 cannot split; %d with tp checked\n",
           unsplit_without_tp, results);
    CHECK(unsplit_without_tp > 0, "the rule never bound: every search without tp split anyway");

    /* repair snaps a discretisation that knows no tp (DNAS's) to the nearest
     * count that splits; the limit is the snapped architecture's parameters,
     * so that refilling cannot grow it */
    ac_engine_profile prof = k.p;
    prof.tp = 4;
    ac_search_problem P = {.table = &k.t, .workload = &k.w, .profile = &prof, .imp = &k.imp, .base = &k.a};
    P.opts = (ac_search_opts){.steps = 1, .lr = 0.03, .ffn_multiple = 64, .hidden_multiple = 64,
                              .target = AC_EXPORT_GGUF};
    ac_arch a, want;
    ac_arch_copy(&a, &k.a, &e);
    a.layers[1].n_kv_heads = 3, a.layers[1].n_heads = 6;  /* 2 and 4 split: a tie goes up */
    a.layers[2].n_kv_heads = 1, a.layers[2].n_heads = 2;  /* 2 heads on 4 GPUs: up to 2 KV */
    a.layers[3].n_kv_heads = 7, a.layers[3].n_heads = 14; /* 8 */
    a.layers[4].n_kv_heads = 5, a.layers[4].n_heads = 10; /* 4 */
    ac_arch_copy(&want, &a, &e);
    int wk[5] = {8, 4, 2, 8, 4};
    for (int l = 1; l < 5; l++) want.layers[l].n_kv_heads = wk[l], want.layers[l].n_heads = 2 * wk[l];
    ac_carch wc;
    ac_cost c;
    ac_carch_from_arch(&want, &wc, &e);
    ac_cost_predict(&k.t, &wc, &k.w, &prof, 0, &c);
    ac_carch_free(&wc);
    P.limits.max_params = c.params;
    CHECK(ac_search_repair(&P, &a, &c) == 1, "the snapped architecture meets its own parameter count");
    for (int l = 1; l < 5; l++)
        CHECK(a.layers[l].n_kv_heads == wk[l] && a.layers[l].n_heads == 2 * wk[l], "layer %d: %d/%d, want %d KV", l,
              a.layers[l].n_kv_heads, a.layers[l].n_heads, wk[l]);
    CHECK(arch_splits(4, &a), "repaired architecture splits");
    ac_arch_free(&a);
    ac_arch_free(&want);

    /* Minitron: FFN choices on tp's multiples (base FFN 1000: Model-Optimizer's divisor 63) */
    h100_case m;
    h100_case_init(&m, 1000);
    ac_engine_profile p2 = m.p;
    p2.tp = 2;
    ac_search_problem M = {.table = &m.t, .workload = &m.w, .profile = &p2, .imp = &m.imp, .base = &m.a};
    M.limits.max_tpot_ms = 0.6 * m.base.tpot_ms;
    M.opts = (ac_search_opts){.steps = 1, .ffn_multiple = 64, .hidden_multiple = 64};
    ac_search_result r;
    CHECK(ac_search_minitron(&M, &r, &e) == 0, "%s", e.msg);
    CHECK(arch_splits(2, &r.arch) && r.arch.layers[0].ffn < 1000, "minitron FFN %d", r.arch.layers[0].ffn);
    json_t *ch = json_object_get(json_object_get(json_object_get(r.detail, "axes"), "ffn_hidden_size"), "choices");
    size_t i;
    json_t *v;
    int odd = 0;
    json_array_foreach(ch, i, v) odd += json_integer_value(v) % 2;
    CHECK(json_array_size(ch) > 4 && !odd, "%zu FFN choices, %d odd", json_array_size(ch), odd);
    ac_search_result_free(&r);
    h100_case_free(&m);

    /* refusals: KV heads 6 over 4 GPUs (neither divides the other), an FFN grid of 33 on 2 GPUs */
    ac_arch b6 = mk_arch(2, 1024, 64, 12, 6, 4096, 32000);
    ac_importance i6;
    fake_importance(&i6, &b6);
    P.base = &b6, P.imp = &i6;
    P.opts.steps = 5;
    CHECK(ac_search_autocompress(&P, &r, &e) != 0 && strstr(e.msg, "layer 0") && strstr(e.msg, "6 KV heads"),
          "kv 6 on tp 4: %s", e.msg);
    P.base = &k.a, P.imp = &k.imp;
    prof.tp = 2, P.opts.ffn_multiple = 33;
    CHECK(ac_search_autocompress(&P, &r, &e) != 0 && strstr(e.msg, "ffn_multiple 33"), "grid 33 on tp 2: %s", e.msg);
    M.base = &b6, M.imp = &i6, p2.tp = 4;
    CHECK(ac_search_minitron(&M, &r, &e) != 0 && strstr(e.msg, "KV heads"), "minitron kv 6 on tp 4: %s", e.msg);
    ac_importance_free(&i6);
    ac_arch_free(&b6);
    h100_case_free(&k);
}

static char fx[1100];
static int have_fixture(void) {
    ck_build_path(fx, sizeof fx, "fixtures/models/llama_gqa_bf16");
    char p[1200];
    snprintf(p, sizeof p, "%s/config.json", fx);
    return ck_exists(p);
}

static void test_prune_equals_masking(void) {
    if (!have_fixture()) SKIP("no fixtures (make fixtures)");
    ac_model m, pm;
    ac_err e;
    CHECK(ac_model_load(fx, &m, &e) == 0, "%s", e.msg);
    ac_importance imp;
    fake_importance(&imp, &m.a);
    /* drop KV group 0 of layer 1 (heads 0,1) and FFN channels 0..59 of layer 0 */
    imp.kv_order[1][0] = 1;
    imp.kv_order[1][1] = 0;
    for (int i = 0; i < 160; i++) imp.ffn_order[0][i] = (i + 60) % 160;
    ac_arch t;
    ac_arch_copy(&t, &m.a, &e);
    t.layers[1].n_kv_heads = 1;
    t.layers[1].n_heads = 2;
    t.layers[0].ffn = 100;
    CHECK(ac_prune(&m, &t, &imp, &pm, &e) == 0, "%s", e.msg);
    int toks[10] = {1, 5, 9, 100, 200, 7, 3, 250, 11, 42};
    ac_engine e1, e2;
    ac_engine_init(&e2, &pm, 1, 10, &e);
    ac_engine_forward(&e2, toks, 1, 10, 0, 0, &e);
    /* masking in the original: zero o_proj columns of heads 0,1 in layer 1, down_proj columns 0..59 in layer 0 */
    int H = m.a.hidden, hd = m.a.head_dim, Q = 4 * hd;
    for (int r = 0; r < H; r++) {
        memset(m.L[1].wo + (size_t)r * Q, 0, 2 * hd * 4);
        memset(m.L[0].wd + (size_t)r * 160, 0, 60 * 4);
    }
    ac_engine_init(&e1, &m, 1, 10, &e);
    ac_engine_forward(&e1, toks, 1, 10, 0, 0, &e);
    double d = 0, mx = 0;
    for (int i = 0; i < 10 * m.a.vocab; i++) {
        d = fmax(d, fabs(e1.logits[i] - e2.logits[i]));
        mx = fmax(mx, fabs(e1.logits[i]));
    }
    CHECK(d <= 1e-5 * mx, "pruned vs masked logits differ by %g (max %g)", d, mx);
    ac_engine_free(&e1);
    ac_engine_free(&e2);
    ac_model_free(&pm);
    /* a target that does not fit is refused */
    t.layers[1].n_heads = 3;
    CHECK(ac_prune(&m, &t, &imp, &pm, &e) != 0 && strstr(e.msg, "query heads"), "%s", e.msg);
    ac_arch_free(&t);
    ac_importance_free(&imp);
    ac_model_free(&m);
}

static void test_kv_merge_of_duplicate_heads_is_exact(void) {
    if (!have_fixture()) SKIP("no fixtures (make fixtures)");
    ac_model m, pm;
    ac_err e;
    CHECK(ac_model_load(fx, &m, &e) == 0, "%s", e.msg);
    /* make KV head 1 of layer 0 a copy of head 0: merging them is exact */
    int H = m.a.hidden, hd = m.a.head_dim;
    memcpy(m.L[0].wk + (size_t)hd * H, m.L[0].wk, sizeof(float) * hd * H);
    memcpy(m.L[0].wv + (size_t)hd * H, m.L[0].wv, sizeof(float) * hd * H);
    ac_importance imp;
    fake_importance(&imp, &m.a);
    ac_arch t;
    ac_arch_copy(&t, &m.a, &e);
    t.layers[0].n_kv_heads = 1; /* 4 query heads kept, 2 KV heads -> 1 */
    CHECK(ac_prune(&m, &t, &imp, &pm, &e) == 0, "%s", e.msg);
    int toks[10] = {4, 8, 15, 16, 23, 42, 99, 100, 7, 1};
    ac_engine e1, e2;
    ac_engine_init(&e1, &m, 1, 10, &e);
    ac_engine_init(&e2, &pm, 1, 10, &e);
    ac_engine_forward(&e1, toks, 1, 10, 0, 0, &e);
    ac_engine_forward(&e2, toks, 1, 10, 0, 0, &e);
    double d = 0, mx = 0;
    for (int i = 0; i < 10 * m.a.vocab; i++) {
        d = fmax(d, fabs(e1.logits[i] - e2.logits[i]));
        mx = fmax(mx, fabs(e1.logits[i]));
    }
    CHECK(d <= 1e-5 * mx, "merged logits differ by %g (max %g)", d, mx);
    CHECK(pm.a.layers[0].n_heads == 4 && pm.a.layers[0].n_kv_heads == 1, "arch");
    /* DeciLM config: n_heads_in_group 4 for the merged layer */
    json_t *c = ac_arch_to_config(&pm.a);
    json_t *bc = json_object_get(c, "block_configs");
    CHECK(bc && json_integer_value(
                    json_object_get(json_object_get(json_array_get(bc, 0), "attention"), "n_heads_in_group")) == 4,
          "block config");
    json_decref(c);
    ac_engine_free(&e1);
    ac_engine_free(&e2);
    ac_model_free(&pm);
    ac_arch_free(&t);
    ac_importance_free(&imp);
    ac_model_free(&m);
}

static int cmp_int_asc(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* The tiny model and at most cap tokens of its calibration text; -1 (the
 * caller skips) without the model. */
static int tiny_with_calib(ac_model *m, int **ids, size_t *n, size_t cap) {
    char tiny[1100], text[1200];
    ac_err e;
    ck_build_path(tiny, sizeof tiny, "models/tiny");
    ck_build_path(text, sizeof text, "data/calib.txt");
    if (ac_model_load(tiny, m, &e)) return -1;
    *ids = NULL;
    *n = 0;
    CHECK(ac_load_text_ids(tiny, text, ids, n, m->a.vocab, &e) == 0, "%s", e.msg);
    if (*n > cap) *n = cap;
    return 0;
}

static void test_repair_reduces_loss(void) {
    ac_model m;
    ac_err e;
    int *ids;
    size_t n;
    if (tiny_with_calib(&m, &ids, &n, 8192)) SKIP("no tiny model (make tiny-model)");
    ac_importance imp;
    CHECK(ac_importance_compute(&m, ids, n, 64, 32, 0, NULL, NULL, &imp, &e) == 0, "%s", e.msg);
    for (int l = 0; l < m.a.n_layers; l++)
        for (int p = 1; p < AC_SENS_POINTS; p++) CHECK(imp.ffn_sens[l][p] >= imp.ffn_sens[l][p - 1], "monotone curve");
    ac_arch t;
    ac_arch_copy(&t, &m.a, &e);
    for (int l = 0; l < t.n_layers; l++) t.layers[l].ffn = 192;
    ac_model p1, p2;
    CHECK(ac_prune(&m, &t, &imp, &p1, &e) == 0 && ac_prune(&m, &t, &imp, &p2, &e) == 0, "%s", e.msg);
    int rep = ac_repair_ffn(&m, &p2, &imp, ids, n, 64, 32, &e);
    CHECK(rep == m.a.n_layers, "repaired %d layers: %s", rep, e.msg);
    ac_ppl_opts o = {.ctx = 64, .stride = 0, .max_windows = 64, .batch = 4};
    ac_ppl_result r1, r2;
    ac_perplexity(&p1, ids, n, &o, NULL, NULL, NULL, &r1, &e);
    ac_perplexity(&p2, ids, n, &o, NULL, NULL, NULL, &r2, &e);
    printf("   FFN halved: calibration loss %.4f without repair, %.4f with (base %.4f)\n", r1.nll, r2.nll,
           imp.base_loss);
    CHECK(r2.nll < r1.nll, "repair did not help: %g vs %g", r2.nll, r1.nll);
    /* The refit solves the ridge normal equations: check every layer's
     * residual (G_kk + lambda I) X - G_k: Wd[hk]^T in double, from the Gram
     * of a separate stats pass (LAPACK's solve against plain loops). */
    ac_stats st;
    CHECK(ac_repair_stats(&m, ids, n, 64, 32, &st, &e) == 0 && st.ffn_gram, "%s", e.msg);
    int H = m.a.hidden, Fk = 192;
    double worst = 0;
    for (int l = 0; st.ffn_gram && l < m.a.n_layers; l++) {
        int F = m.a.layers[l].ffn, fk[192];
        for (int i = 0; i < Fk; i++) fk[i] = imp.ffn_order[l][i];
        qsort(fk, Fk, sizeof(int), cmp_int_asc);
        const float *G = st.ffn_gram[l], *X = p2.L[l].wd, *W = m.L[l].wd;
        double tr = 0;
        for (int i = 0; i < Fk; i++) tr += G[(size_t)fk[i] * F + fk[i]];
        double lambda = 1e-2 * tr / Fk + 1e-8;
        for (int r = 0; r < H; r += 7)
            for (int i = 0; i < Fk; i++) {
                double lhs = lambda * X[(size_t)r * Fk + i], rhs = 0, scale = fabs(lhs);
                for (int j = 0; j < Fk; j++) {
                    double t = (double)G[(size_t)fk[i] * F + fk[j]] * X[(size_t)r * Fk + j];
                    lhs += t;
                    scale += fabs(t);
                }
                for (int c = 0; c < F; c++) {
                    double t = (double)G[(size_t)fk[i] * F + c] * W[(size_t)r * F + c];
                    rhs += t;
                    scale += fabs(t);
                }
                double d = fabs(lhs - rhs) / (scale + 1e-30);
                if (d > worst) worst = d;
            }
    }
    printf("   repair normal equations: worst relative residual %.2e\n", worst);
    CHECK(worst < 1e-5, "repair does not solve its normal equations: %g", worst);
    ac_stats_free(&st);
    ac_model_free(&p1);
    ac_model_free(&p2);
    ac_arch_free(&t);
    ac_importance_free(&imp);
    free(ids);
    ac_model_free(&m);
}

/* Two arms repaired in one layer-streamed pass (ac_repair_ffn_many) equal
 * each repaired alone, bit for bit: one arm with its hidden width pruned
 * too, the other leaving layer 0's FFN whole (not repaired, left as
 * ac_prune sliced it) and ending its repairs before the last layer; the
 * same arms as BF16 students (ac_prune_bf16) get those weights rounded. */
static void test_repair_many(void) {
    ac_model m;
    ac_err e;
    int *ids;
    size_t n;
    if (tiny_with_calib(&m, &ids, &n, 4096)) SKIP("no tiny model (make tiny-model)");
    ac_importance imp;
    CHECK(ac_importance_compute(&m, ids, n, 64, 16, 0, NULL, NULL, &imp, &e) == 0, "%s", e.msg);
    int L = m.a.n_layers;
    ac_arch t1, t2;
    ac_arch_copy(&t1, &m.a, &e);
    ac_arch_copy(&t2, &m.a, &e);
    t1.hidden = m.a.hidden * 3 / 4;
    for (int l = 0; l < L; l++) {
        t1.layers[l].ffn = 160;
        t2.layers[l].ffn = l == 0 || l == L - 1 ? m.a.layers[l].ffn : 96 + 32 * (l % 3);
    }
    ac_importance mimp; /* arm 2 keeps channels by Minitron's orders, as in a job */
    ac_minitron_importance_view(&imp, &mimp);
    ac_model a1, a2, b1, b2;
    CHECK(ac_prune(&m, &t1, &imp, &a1, &e) == 0 && ac_prune(&m, &t2, &mimp, &a2, &e) == 0 &&
              ac_prune(&m, &t1, &imp, &b1, &e) == 0 && ac_prune(&m, &t2, &mimp, &b2, &e) == 0,
          "%s", e.msg);
    ac_model *d[2] = {&a1, &a2};
    const ac_importance *im[2] = {&imp, &mimp};
    int rep[2] = {-1, -1};
    CHECK(ac_repair_ffn_many(&m, d, im, 2, ids, n, 64, 16, rep, &e) == 0, "%s", e.msg);
    int r1 = ac_repair_ffn(&m, &b1, &imp, ids, n, 64, 16, &e), r2 = ac_repair_ffn(&m, &b2, &mimp, ids, n, 64, 16, &e);
    CHECK(rep[0] == L && rep[1] == L - 2 && r1 == L && r2 == L - 2, "repaired %d %d together, %d %d alone", rep[0],
          rep[1], r1, r2);
    for (int l = 0; l < L; l++) {
        size_t n1 = (size_t)t1.hidden * t1.layers[l].ffn, n2 = (size_t)t2.hidden * t2.layers[l].ffn;
        CHECK(!memcmp(a1.L[l].wd, b1.L[l].wd, n1 * 4) && !memcmp(a2.L[l].wd, b2.L[l].wd, n2 * 4),
              "layer %d: together differs from alone", l);
    }
    /* BF16 students (a job's, ac_prune_bf16) repaired together: the fp32
     * arms' repair rounded to BF16 */
    ac_model h1 = {0}, h2 = {0};
    int ok16 = ac_prune_bf16(&m, &t1, &imp, &h1, &e) == 0 && ac_prune_bf16(&m, &t2, &mimp, &h2, &e) == 0;
    CHECK(ok16, "%s", e.msg);
    ac_model *dh[2] = {&h1, &h2};
    int reph[2] = {-1, -1};
    CHECK(ok16 && ac_repair_ffn_many(&m, dh, im, 2, ids, n, 64, 16, reph, &e) == 0, "%s", e.msg);
    CHECK(reph[0] == L && reph[1] == L - 2 && bf16_matches(&h1, &a1) && bf16_matches(&h2, &a2),
          "BF16 arms' repair is the fp32 one's rounded (repaired %d %d)", reph[0], reph[1]);
    ac_model_free(&h1);
    ac_model_free(&h2);
    /* layer 0 of arm 2 is ac_prune's slice, untouched; layer 1 was refit */
    ac_model c2;
    CHECK(ac_prune(&m, &t2, &mimp, &c2, &e) == 0, "%s", e.msg);
    CHECK(!memcmp(a2.L[0].wd, c2.L[0].wd, (size_t)t2.hidden * t2.layers[0].ffn * 4), "unpruned layer touched");
    CHECK(memcmp(a2.L[1].wd, c2.L[1].wd, (size_t)t2.hidden * t2.layers[1].ffn * 4), "pruned layer not refit");
    /* nothing pruned: nothing to do, no pass */
    ac_model u;
    CHECK(ac_prune(&m, &m.a, &imp, &u, &e) == 0, "%s", e.msg);
    CHECK(ac_repair_ffn(&m, &u, &imp, ids, 10, 64, 16, &e) == 0, "unpruned model: no repair, even on too few tokens");
    ac_model *dp = &a1;
    CHECK(ac_repair_ffn_many(&m, &dp, im, 1, ids, 10, 64, 16, rep, &e) != 0 && strstr(e.msg, "fewer than one window"),
          "too few tokens: %s", e.msg);
    ac_model_free(&u);
    ac_model_free(&c2);
    ac_model_free(&a1);
    ac_model_free(&a2);
    ac_model_free(&b1);
    ac_model_free(&b2);
    ac_arch_free(&t1);
    ac_arch_free(&t2);
    ac_importance_free(&imp);
    free(ids);
    ac_model_free(&m);
}

/* Batch-4 bands are read at the working set of a 4-layer model with this
 * model's bytes per layer: a 2-layer model at ws reads them at 2 ws (here
 * past the last band: its rate, not the first band's). */
static void test_b4_band_per_layer(void) {
    ac_cost_table t;
    synth_table(&t);
    ac_arch a = mk_arch(2, 64, 16, 4, 2, 128, 256);
    ac_carch c;
    ac_err e;
    CHECK(ac_carch_from_arch(&a, &c, &e) == 0, "carch");
    ac_engine_profile p;
    ac_engine_profile_default(&p, 1);
    ac_workload w4 = {.batch = 4, .prompt_len = 16, .gen_len = 2};
    ac_cost warm4, b4;
    t.cache_bytes = 1e30;
    ac_cost_predict(&t, &c, &w4, &p, 0, &warm4);
    t.cache_bytes = 0;
    t.ndec = 2;
    t.dec_b4 = 1;
    /* every step's own ws (contexts 17..18) at or below band 0; twice it beyond band 1 */
    t.dec_ws[0] = ac_cost_decode_bytes(&c, &p, 4, 18) * 1.0001;
    t.dec_ws[1] = 2 * ac_cost_decode_bytes(&c, &p, 4, 17) * 0.9999;
    t.dec_us_mib[0] = t.dec_us_mib[1] = 20;
    t.dec_us_mib4[0] = 100;
    t.dec_us_mib4[1] = 10;
    ac_cost_predict(&t, &c, &w4, &p, 0, &b4);
    double x4 = ac_cost_decode_bytes(&c, &p, 4, 17.5) / 1048576.0 * 10 / 1e3;
    CHECK(t.dec_ws[0] < t.dec_ws[1], "bands ordered");
    CHECK(fabs(b4.tpot_ms - warm4.tpot_ms - x4) < 1e-9, "per-layer lookup: %g vs %g + %g", b4.tpot_ms, warm4.tpot_ms,
          x4);
    ac_carch_free(&c);
    ac_arch_free(&a);
    ac_cost_table_free(&t);
}

/* Band pooling: plain rates pooled where they fall; with a scale (MiB),
 * the products: a high rate on a small probe (a per-step cost) survives. */
static void test_band_monotone(void) {
    double r[4] = {40, 20, 30, 10}, mib[4] = {4, 8, 10, 20}, q[4] = {40, 20, 30, 10};
    ac_cost_bands_monotone(r, NULL, 4, 0);
    /* 40,20 -> 30,30; 30 ok; 30,30,30,10 -> 25 x 4 (by hand) */
    for (int i = 0; i < 4; i++) CHECK(fabs(r[i] - 25) < 1e-12, "rate %d: %g vs 25", i, r[i]);
    ac_cost_bands_monotone(q, mib, 4, 0);
    /* totals 160,160,300,200 -> 160,160,250,250: rates 40, 20, 25, 12.5 */
    double want[4] = {40, 20, 25, 12.5};
    for (int i = 0; i < 4; i++) CHECK(fabs(q[i] - want[i]) < 1e-12, "scaled %d: %g vs %g", i, q[i], want[i]);
    double neg[2] = {-5, 3};
    ac_cost_bands_monotone(neg, mib, 2, 0);
    CHECK(neg[0] == 0 && neg[1] == 3, "negative clipped: %g %g", neg[0], neg[1]);
    /* signed (the weights' rates): kept below 0, still pooled: -5, -9 -> -7, -7 */
    double sg[3] = {-5, -9, 3};
    ac_cost_bands_monotone(sg, NULL, 3, 1);
    CHECK(sg[0] == -7 && sg[1] == -7 && sg[2] == 3, "signed: %g %g %g", sg[0], sg[1], sg[2]);
    /* with a scale, the totals pooled: -20, -36 (x 4, 4) -> -28 each */
    double sq[2] = {-5, -9}, m4[2] = {4, 4};
    ac_cost_bands_monotone(sq, m4, 2, 1);
    CHECK(sq[0] == -7 && sq[1] == -7, "signed scaled: %g %g", sq[0], sq[1]);
}

int main(void) {
    ac_set_threads(ck_threads());
    RUN(test_cuda_pin);
    RUN(test_interpolation_hits_grid_points);
    RUN(test_gradients_match_finite_differences);
    RUN(test_decode_bands);
    RUN(test_band_monotone);
    RUN(test_b4_band_per_layer);
    RUN(test_memory_accounting);
    RUN(test_search_feasible_deterministic_heterogeneous);
    RUN(test_deci_ffn_mult);
    RUN(test_search_deci_grid);
    RUN(test_search_tp);
    RUN(test_prune_equals_masking);
    RUN(test_kv_merge_of_duplicate_heads_is_exact);
    RUN(test_repair_reduces_loss);
    RUN(test_repair_many);
    return DONE();
}
