/* test_costmoe.c - the cost model of mixture-of-experts layers: the
 * expected number of experts a step reaches against a simulation of the
 * routing, every expert held in memory while a decode step reads only the
 * reached ones (memory-bound at small batch, compute-bound at large), the
 * parameter count against the model's own, tensor parallelism, and the
 * architecture JSON's MoE fields. */
#include <math.h>

#include "check.h"
#include "cost/costmodel.h"
#include "cost/device.h"
#include "synth.h"

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

int main(void) {
    RUN(test_active_experts_match_simulated_routing);
    RUN(test_params_hold_every_expert);
    RUN(test_decode_memory_bound_small_batch_compute_bound_large);
    RUN(test_arch_json_moe_fields);
    return DONE();
}
