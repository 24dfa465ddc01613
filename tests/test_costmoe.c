/* test_costmoe.c - the cost model of mixture-of-experts layers: the
 * expected number of experts a step reaches against a simulation of the
 * routing, every expert held in memory while a decode step reads only the
 * reached ones (memory-bound at small batch, compute-bound at large), the
 * parameter count against the model's own, tensor parallelism, the
 * architecture JSON's MoE fields, and the measured CPU tables' expert grid:
 * a table that has one prices the experts from it (by exactly what it
 * adds over the GEMM grid), one without (older tables, JSON without it)
 * from the GEMM grid, and the report's provenance says which. */
#include <math.h>

#include "check.h"
#include "cost/costmodel.h"
#include "cost/device.h"
#include "cost/provenance.h"
#include "synth.h"
#include "synth_cost.h"

/* A model of L MoE layers: E experts of Fe channels, top-k routing. */
static ac_arch moe_arch(int L, int H, int hd, int heads, int kv, int E, int Fe, int k, int vocab) {
    ac_arch a = mk_arch(L, H, hd, heads, kv, 0, vocab);
    snprintf(a.model_type, sizeof a.model_type, "mixtral");
    for (int l = 0; a.layers && l < L; l++) a.layers[l] = (ac_layer_arch){heads, kv, 0, E, Fe, 0};
    a.top_k = k;
    a.norm_topk = 1;
    return a;
}

static unsigned rnd(unsigned long long *s) { /* splitmix64 */
    unsigned long long z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (unsigned)((z ^ (z >> 31)) >> 32);
}

/* Distinct experts reached by T tokens, each routed to k distinct experts
 * drawn uniformly (a partial Fisher-Yates shuffle per token), averaged
 * over trials: the quantity ac_moe_active_experts states in closed form. */
static double simulate_reached(int E, int k, int T, int trials, unsigned long long *seed) {
    int perm[256], hit[256];
    double sum = 0;
    for (int r = 0; r < trials; r++) {
        memset(hit, 0, sizeof hit);
        for (int t = 0; t < T; t++) {
            for (int i = 0; i < E; i++) perm[i] = i;
            for (int i = 0; i < k; i++) {
                int j = i + (int)(rnd(seed) % (unsigned)(E - i)), x = perm[i];
                perm[i] = perm[j];
                perm[j] = x;
                hit[perm[i]] = 1;
            }
        }
        for (int i = 0; i < E; i++) sum += hit[i];
    }
    return sum / trials;
}

static void test_active_experts_match_simulated_routing(void) {
    unsigned long long seed = 7;
    const int cases[][3] = {{128, 8, 1}, {128, 8, 4}, {128, 8, 16}, {128, 8, 64}, {5, 2, 3}, {8, 2, 2}, {60, 4, 32}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int E = cases[i][0], k = cases[i][1], T = cases[i][2];
        double want = simulate_reached(E, k, T, 3000, &seed), got = ac_moe_active_experts(E, k, T);
        CHECK(fabs(got / want - 1) < 0.01, "E %d k %d T %d: formula %.3f, simulated %.3f", E, k, T, got, want);
    }
    CHECK(ac_moe_active_experts(3, 3, 1) == 3, "k = E reaches every expert");
    CHECK(fabs(ac_moe_active_experts(128, 8, 1) - 8) < 1e-9, "one token reaches its k experts");
    CHECK(fabs(ac_moe_active_experts(128, 8, 1e6) - 128) < 1e-6, "a long prefill reaches all");
}

/* The cost model's parameter count is the model's own (model.c counts
 * the layers' tensors, the router and every expert). */
static void test_params_hold_every_expert(void) {
    ac_err e;
    ac_arch a = moe_arch(3, 96, 16, 6, 2, 5, 40, 2, 300);
    a.layers[1] = (ac_layer_arch){6, 2, 80, 0, 0, 0}; /* a dense layer among MoE ones */
    ac_carch c;
    CHECK(ac_carch_from_arch(&a, &c, &e) == 0, "%s", e.msg);
    CHECK(c.experts && c.top_k == 2 && c.experts[1] == 0 && c.effn[0] == 40, "experts read");
    CHECK(fabs(ac_carch_params(&c) - ac_arch_params(&a)) < 0.5, "params %.0f vs the model's %.0f",
          ac_carch_params(&c), ac_arch_params(&a));
    ac_carch_free(&c);
    ac_arch_free(&a);
}

/* Qwen3-30B-A3B's shapes (48 layers, hidden 2048, 32 heads / 4 KV groups,
 * head_dim 128, 128 experts of 768, top-8) on the B200 roofline in BF16,
 * beside a dense model of the same shape whose FFN is one token's active
 * experts (8 x 768): equal weights read at batch 1. */
static void test_decode_memory_bound_small_batch_compute_bound_large(void) {
    ac_err e;
    ac_cost_table t;
    CHECK(ac_cost_roofline(ac_device_spec_find("B200"), "bf16", &t, &e) == 0, "%s", e.msg);
    ac_arch am = moe_arch(48, 2048, 128, 32, 4, 128, 768, 8, 151936), ad = mk_arch(48, 2048, 128, 32, 4, 8 * 768, 151936);
    ac_carch cm, cd;
    CHECK(ac_carch_from_arch(&am, &cm, &e) == 0 && ac_carch_from_arch(&ad, &cd, &e) == 0, "%s", e.msg);
    ac_engine_profile p;
    ac_engine_profile_default(&p, 0);
    /* memory: every expert held, 30.5B parameters (the published total) */
    ac_workload w = {.batch = 1, .prompt_len = 128, .gen_len = 32};
    ac_cost km, kd;
    ac_cost_predict(&t, &cm, &w, &p, 0, &km);
    ac_cost_predict(&t, &cd, &w, &p, 0, &kd);
    CHECK(fabs(km.params / 30.5e9 - 1) < 0.02, "params %.3g (published 30.5B)", km.params);
    CHECK(km.weights_gib > 8 * kd.weights_gib, "weights %.1f GiB vs the active-width dense %.1f", km.weights_gib,
          kd.weights_gib);
    /* batch 1: the same bytes read, so about the same step */
    double m1 = ac_cost_decode_step_us(&t, &cm, &p, 1, 129), d1 = ac_cost_decode_step_us(&t, &cd, &p, 1, 129);
    CHECK(m1 > d1 && m1 < 1.25 * d1, "batch 1: MoE %.1f us vs active-width dense %.1f us", m1, d1);
    /* batch 32: the step reaches ~112 experts; the dense step hardly grows */
    double m32 = ac_cost_decode_step_us(&t, &cm, &p, 32, 129), d32 = ac_cost_decode_step_us(&t, &cd, &p, 32, 129);
    double bytes_ratio = ac_cost_decode_bytes(&cm, &p, 32, 0) / ac_cost_decode_bytes(&cm, &p, 1, 0);
    CHECK(bytes_ratio > 5, "weights read at batch 32 / batch 1: %.2f", bytes_ratio);
    CHECK(m32 / m1 > 3 && d32 / d1 < 1.5, "batch 32 / batch 1: MoE %.2f, dense %.2f", m32 / m1, d32 / d1);
    /* thousands of tokens: every expert reached, each with enough rows to
     * be compute-bound: the step doubles with the tokens */
    double m8k = ac_cost_decode_step_us(&t, &cm, &p, 8192, 129), m16k = ac_cost_decode_step_us(&t, &cm, &p, 16384, 129);
    fprintf(stderr, "  B200: step us b1 %.1f (dense %.1f) b32 %.1f (dense %.1f) b8k %.1f b16k %.1f\n", m1, d1, m32, d32, m8k, m16k);
    CHECK(m16k / m8k > 1.7 && m16k / m8k < 2.05, "16384 / 8192 tokens: %.3f", m16k / m8k);
    /* tensor parallelism splits every expert's width: half the weights per GPU */
    ac_engine_profile p2 = p;
    p2.tp = 2;
    ac_cost k2;
    ac_cost_predict(&t, &cm, &w, &p2, 0, &k2);
    CHECK(fabs(k2.weights_gib / km.weights_gib - 0.5) < 0.01, "tp 2 weights per GPU %.2f of tp 1",
          k2.weights_gib / km.weights_gib);
    ac_carch_free(&cm);
    ac_carch_free(&cd);
    ac_arch_free(&am);
    ac_arch_free(&ad);
    ac_cost_table_free(&t);
}

/* The architecture JSON of an estimate: experts and top_k are read; a
 * dense model's architecture may not name experts. */
static void test_arch_json_moe_fields(void) {
    ac_err e;
    ac_arch none, out, dense = mk_arch(2, 64, 16, 4, 2, 128, 100), moe = moe_arch(2, 64, 16, 4, 2, 6, 32, 2, 100);
    memset(&none, 0, sizeof none);
    none.vocab = 100, none.hidden = 64, none.head_dim = 16;
    json_t *j = json_loads("{\"top_k\":2,\"layers\":[{\"heads\":4,\"kv_heads\":2,\"ffn\":0,\"experts\":4,"
                           "\"expert_ffn\":32},{\"heads\":4,\"kv_heads\":2,\"ffn\":96}]}",
                           0, NULL);
    CHECK(ac_arch_from_json(j, &none, &out, &e) == 0, "%s", e.msg);
    CHECK(out.top_k == 2 && out.layers[0].n_experts == 4 && out.layers[1].ffn == 96, "fields read");
    ac_arch_free(&out);
    CHECK(ac_arch_from_json(j, &dense, &out, &e) == -1 && strstr(e.msg, "dense model"), "dense base: %s", e.msg);
    CHECK(ac_arch_from_json(j, &moe, &out, &e) == 0, "moe base: %s", e.msg);
    ac_arch_free(&out);
    json_decref(j);
    j = json_loads("{\"top_k\":5,\"layers\":[{\"heads\":4,\"kv_heads\":2,\"ffn\":0,\"experts\":4,\"expert_ffn\":32}]}",
                   0, NULL);
    CHECK(ac_arch_from_json(j, &moe, &out, &e) == -1, "top_k above the experts accepted");
    json_decref(j);
    ac_arch_free(&dense);
    ac_arch_free(&moe);
}

/* synth_cost.h's table with GEMMs of exactly 1e-5 m n k us (a power law:
 * log-log interpolation and the linear extrapolation beyond the grid
 * reproduce it exactly, so the test can state every lookup in closed
 * form): a CPU table (no launch cost), no decode bands (decode steps are
 * the operator tables'), cache 0 (every weight cold). xr > 0: also an
 * expert grid of xr x 3e-5 m fe h us, which is xr times the three GEMMs
 * (gate, up, down) of the GEMM grid. */
static void power_table(ac_cost_table *t, double xr) {
    synth_table(t);
    int nnk = t->nn * t->nk;
    for (int i = 0; i < t->nm * nnk; i++) /* point i: m = gm[i / nnk], n = gn[i / nk % nn], k = gk[i % nk] */
        t->gemm_us[i] = 1e-5 * t->gm[i / nnk] * t->gn[i / t->nk % t->nn] * t->gk[i % t->nk];
    if (xr <= 0) return;
    double r[] = {1, 4, 16}, f[] = {32, 256}, h[] = {64, 512};
    t->nre = 3;
    t->nfe = t->nhe = 2;
    memcpy(t->erows, r, sizeof r);
    memcpy(t->effn, f, sizeof f);
    memcpy(t->ehid, h, sizeof h);
    t->expert_us = malloc(sizeof(double) * 12);
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 2; b++)
            for (int c = 0; c < 2; c++) t->expert_us[(a * 2 + b) * 2 + c] = xr * 3e-5 * r[a] * f[b] * h[c];
}

/* An expert grid 3x the GEMM grid moves each MoE layer's price by exactly
 * what it adds: d experts of m = M k / d rows each, 3 x 3e-5 m Fe H us
 * instead of 3e-5 m Fe H from the GEMM grid (d m = M k, whatever d), less
 * the elementwise passes the measured path holds (each routed row's
 * activation, 2 Fe, and scatter-add, H, at elem_ns). Prefill and decode
 * alike, on decode bands too (the experts' bytes then leave the bands);
 * a dense model is not moved. */
static void test_expert_grid_prices_experts(void) {
    ac_err e;
    const int L = 3, H = 96, Fe = 48, E = 8, k = 2, B = 4, P = 64;
    ac_arch a = moe_arch(L, H, 16, 6, 2, E, Fe, k, 300);
    a.layers[1] = (ac_layer_arch){6, 2, 80, 0, 0, 0}; /* a dense layer among MoE ones */
    ac_carch c;
    CHECK(ac_carch_from_arch(&a, &c, &e) == 0, "%s", e.msg);
    ac_cost_table tg, tx;
    power_table(&tg, 0);
    power_table(&tx, 3);
    ac_engine_profile p;
    ac_engine_profile_cpu(&p, "fp32");
    ac_workload w = {.batch = B, .prompt_len = P, .gen_len = 16};
    ac_cost kg, kx;
    ac_cost_predict(&tg, &c, &w, &p, 0, &kg);
    ac_cost_predict(&tx, &c, &w, &p, 0, &kx);
    const char *sg = ac_cost_expert_source(&tg, &c), *sx = ac_cost_expert_source(&tx, &c);
    CHECK(sg && !strcmp(sg, "gemm_grid") && sx && !strcmp(sx, "expert_grid"), "sources %s, %s", sg ? sg : "-",
          sx ? sx : "-");
    /* 2 MoE layers of the 3; microseconds per layer over M tokens */
    double moe_layers = 2, el = tg.elem_ns * 1e-3;
    double d_ttft = moe_layers * (B * P) * k * (2 * 3e-5 * Fe * H - (2 * Fe + H) * el) / 1e3,
           d_tpot = moe_layers * B * k * (2 * 3e-5 * Fe * H - (2 * Fe + H) * el) / 1e3;
    fprintf(stderr, "  TTFT %.4f -> %.4f ms (expected +%.4f), TPOT %.5f -> %.5f ms (expected +%.5f)\n", kg.ttft_ms,
            kx.ttft_ms, d_ttft, kg.tpot_ms, kx.tpot_ms, d_tpot);
    CHECK(d_ttft > 0 && fabs((kx.ttft_ms - kg.ttft_ms) / d_ttft - 1) < 1e-6, "TTFT moved %.6f ms, expected %.6f",
          kx.ttft_ms - kg.ttft_ms, d_ttft);
    CHECK(d_tpot > 0 && fabs((kx.tpot_ms - kg.tpot_ms) / d_tpot - 1) < 1e-6, "TPOT moved %.6f ms, expected %.6f",
          kx.tpot_ms - kg.tpot_ms, d_tpot);
    /* the lookup itself: a point between the grid's and one beyond it */
    CHECK(fabs(ac_cost_expert_us(&tx, 2.5, 100, 200, 0) / (9e-5 * 2.5 * 100 * 200) - 1) < 1e-9 &&
              fabs(ac_cost_expert_us(&tx, 40, 1000, 96, 1) / (9e-5 * 40 * 1000 * 96) - 1) < 1e-9,
          "expert lookups");
    CHECK(ac_cost_expert_us(&tg, 2, 48, 96, 0) == 0, "a table without the grid answers 0");
    /* Decode on a table with bands (a constant 20 us per MiB streamed, every
     * weight outside the cache): the reached experts cost their warm points
     * (here 1x the three GEMMs) plus the cold points' excess (3x - 1x), and
     * their bytes leave the bands: per MoE layer and step, with d experts
     * reached by B tokens, B k (3 - 1) 3e-5 Fe H us more, d 3 H Fe 4 bytes
     * at 20 us/MiB less, less the elementwise passes. */
    double ws[] = {1e6, 1e9};
    ac_cost_table *bt[] = {&tg, &tx};
    for (int i = 0; i < 2; i++) {
        bt[i]->ndec = 2;
        memcpy(bt[i]->dec_ws, ws, sizeof ws);
        bt[i]->dec_us_mib[0] = bt[i]->dec_us_mib[1] = 20;
    }
    tx.expert_warm_us = malloc(sizeof(double) * 12);
    for (int i = 0; i < 12; i++) tx.expert_warm_us[i] = tx.expert_us[i] / 3;
    ac_cost_predict(&tg, &c, &w, &p, 0, &kg);
    ac_cost_predict(&tx, &c, &w, &p, 0, &kx);
    double dB = E * (1 - pow(1 - (double)k / E, B)),
           d_dec = moe_layers *
                   (B * k * (2 * 3e-5 * Fe * H - (2 * Fe + H) * el) - dB * 3.0 * H * Fe * 4 / 1048576.0 * 20) / 1e3;
    fprintf(stderr, "  with bands: TPOT %.5f -> %.5f ms (expected %+.5f)\n", kg.tpot_ms, kx.tpot_ms, d_dec);
    CHECK(fabs((kx.tpot_ms - kg.tpot_ms) / d_dec - 1) < 1e-6, "banded TPOT moved %.6f ms, expected %.6f",
          kx.tpot_ms - kg.tpot_ms, d_dec);
    CHECK(fabs((kx.ttft_ms - kg.ttft_ms) / d_ttft - 1) < 1e-6, "prefill (no bands) still cold: %.6f vs %.6f",
          kx.ttft_ms - kg.ttft_ms, d_ttft);
    /* a dense model is priced alike on both */
    ac_arch ad = mk_arch(L, H, 16, 6, 2, 80, 300);
    ac_carch cd;
    CHECK(ac_carch_from_arch(&ad, &cd, &e) == 0, "%s", e.msg);
    ac_cost_predict(&tg, &cd, &w, &p, 0, &kg);
    ac_cost_predict(&tx, &cd, &w, &p, 0, &kx);
    CHECK(kg.ttft_ms == kx.ttft_ms && kg.tpot_ms == kx.tpot_ms && !ac_cost_expert_source(&tx, &cd), "dense model");
    /* squared-ReLU experts (nemotron_h, two matrices) are not the grid's kernel: the GEMM grid prices them */
    c.ffn_mats = 2;
    const char *s2 = ac_cost_expert_source(&tx, &c);
    CHECK(s2 && !strcmp(s2, "gemm_grid"), "squared-ReLU experts: %s", s2 ? s2 : "-");
    c.ffn_mats = 3;
    /* a table with a launch cost (a GPU's) runs the grouped GEMM */
    ac_cost_table tl = tx; /* shares the arrays */
    tl.launch_us = 5;
    const char *s3 = ac_cost_expert_source(&tl, &c);
    CHECK(s3 && !strcmp(s3, "grouped_gemm"), "a GPU table: %s", s3 ? s3 : "-");
    ac_carch_free(&cd);
    ac_arch_free(&ad);
    ac_carch_free(&c);
    ac_arch_free(&a);
    ac_cost_table_free(&tg);
    ac_cost_table_free(&tx);
}

/* The expert grid goes through JSON (the cache's rows, export, import)
 * unchanged; a table whose JSON has none (measured before it) parses and
 * falls back to the GEMM grid, predicting what a table without it does;
 * a malformed grid is refused naming the field. The report's provenance
 * names the source and, with the grid, compares its figures with the GEMM
 * grid's. */
static void test_expert_grid_json_and_provenance(void) {
    ac_err e;
    ac_arch a = moe_arch(2, 96, 16, 6, 2, 8, 48, 2, 300);
    ac_carch c;
    CHECK(ac_carch_from_arch(&a, &c, &e) == 0, "%s", e.msg);
    ac_cost_table tg, tx, back, old;
    power_table(&tg, 0);
    power_table(&tx, 3);
    tx.expert_warm_us = malloc(sizeof(double) * 12);
    for (int i = 0; i < 12; i++) tx.expert_warm_us[i] = 0.5 * tx.expert_us[i];
    ac_engine_profile p;
    ac_engine_profile_cpu(&p, "fp32");
    ac_workload w = {.batch = 2, .prompt_len = 32, .gen_len = 8};
    json_t *j = ac_cost_table_to_json(&tx);
    CHECK(j && json_object_get(j, "experts") && json_array_size(json_object_get(json_object_get(j, "experts"), "us")) == 12,
          "experts in the JSON");
    CHECK(ac_cost_table_from_json(j, &back, &e) == 0, "%s", e.msg);
    json_t *j2 = ac_cost_table_to_json(&back);
    CHECK(json_equal(j, j2), "round trip");
    json_decref(j2);
    ac_cost k0, k1;
    ac_cost_predict(&tx, &c, &w, &p, 0, &k0);
    ac_cost_predict(&back, &c, &w, &p, 0, &k1);
    CHECK(k0.ttft_ms == k1.ttft_ms && k0.tpot_ms == k1.tpot_ms, "the read-back table predicts alike");
    /* an older table: the same JSON without "experts" */
    json_object_del(j, "experts");
    CHECK(ac_cost_table_from_json(j, &old, &e) == 0 && old.nre == 0 && !old.expert_us, "old table: %s", e.msg);
    const char *so = ac_cost_expert_source(&old, &c);
    ac_cost_predict(&old, &c, &w, &p, 0, &k1);
    ac_cost_predict(&tg, &c, &w, &p, 0, &k0);
    CHECK(so && !strcmp(so, "gemm_grid") && k0.ttft_ms == k1.ttft_ms && k0.tpot_ms == k1.tpot_ms,
          "old table on the GEMM grid (%s): TTFT %.5f vs %.5f", so ? so : "-", k1.ttft_ms, k0.ttft_ms);
    /* a malformed grid: refused, naming it */
    json_t *bad = ac_cost_table_to_json(&tx);
    json_array_set_new(json_object_get(json_object_get(bad, "experts"), "us"), 3, json_real(-1));
    const char *field = NULL;
    CHECK(ac_cost_table_validate(bad, &field, &e) == -1 && field && !strcmp(field, "experts.us"), "bad grid: %s",
          field ? field : "-");
    json_decref(bad);
    /* provenance: the source, and the expert grid's figures against the GEMM grid's */
    json_t *pv = ac_cost_provenance(&tx, &c, &w, &p), *ex = json_object_get(json_object_get(pv, "inputs"), "experts");
    ac_cost_predict(&tx, &c, &w, &p, 0, &k0);
    ac_cost_predict(&tg, &c, &w, &p, 0, &k1);
    json_t *tt = json_object_get(json_object_get(ex, "figures"), "ttft_ms");
    CHECK(ex && !strcmp(json_string_value(json_object_get(ex, "source")), "expert_grid") &&
              fabs(json_number_value(json_object_get(tt, "ratio")) - k0.ttft_ms / k1.ttft_ms) < 1e-9,
          "provenance of the expert grid");
    json_decref(pv);
    pv = ac_cost_provenance(&old, &c, &w, &p), ex = json_object_get(json_object_get(pv, "inputs"), "experts");
    CHECK(ex && !strcmp(json_string_value(json_object_get(ex, "source")), "gemm_grid") &&
              !json_object_get(ex, "figures"),
          "provenance of the GEMM grid");
    json_decref(pv);
    json_decref(j);
    ac_cost_table_free(&old);
    ac_cost_table_free(&back);
    ac_cost_table_free(&tx);
    ac_cost_table_free(&tg);
    ac_carch_free(&c);
    ac_arch_free(&a);
}

int main(void) {
    RUN(test_active_experts_match_simulated_routing);
    RUN(test_params_hold_every_expert);
    RUN(test_decode_memory_bound_small_batch_compute_bound_large);
    RUN(test_arch_json_moe_fields);
    RUN(test_expert_grid_prices_experts);
    RUN(test_expert_grid_json_and_provenance);
    return DONE();
}
