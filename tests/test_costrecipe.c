/* test_costrecipe.c - the cost model walks each layer's block recipe
 * (runtime/block.h) rather than a list of its own: a Qwen3 layer is
 * Llama's recipe plus two per-head norms, and the model charges a Qwen3
 * prefill exactly those two elementwise passes more than a Llama one of
 * the same widths (same GEMMs, same launches); a layer whose FFN width is
 * 0 loses exactly its FFN sub-block (its three GEMMs, its passes, two
 * launches). Sums written out here from the cost tables' own lookups. */
#include <math.h>

#include "check.h"
#include "cost/cost_int.h"
#include "cost/costmodel.h"
#include "cost/device.h"
#include "cost/engines.h"
#include "synth.h"

static double ttft(const ac_cost_table *t, const ac_arch *a, const ac_engine_profile *p, int prompt) {
    ac_err e;
    ac_carch c;
    if (ac_carch_from_arch(a, &c, &e)) return NAN;
    ac_workload w = {.batch = 1, .prompt_len = prompt, .gen_len = 1};
    ac_cost k;
    ac_cost_predict(t, &c, &w, p, 1, &k);
    ac_carch_free(&c);
    return k.ttft_ms * 1e3;
}

static void test_qwen3_pays_its_head_norms(void) {
    ac_err e;
    ac_cost_table t;
    CHECK(ac_cost_roofline(ac_device_spec_find("H100"), "bf16", &t, &e) == 0, "%s", e.msg);
    ac_engine_profile p;
    ac_engine_profile_default(&p, 0);
    p.graph_max = -1; /* eager: every kernel launched */
    const int L = 6, H = 1024, hd = 64, nh = 16, kv = 4, F = 2816, P = 512;
    ac_arch llama = mk_arch(L, H, hd, nh, kv, F, 32000), qwen3 = mk_arch(L, H, hd, nh, kv, F, 32000);
    qwen3.qk_norm = 1;
    snprintf(qwen3.model_type, sizeof qwen3.model_type, "qwen3");
    double dl = ttft(&t, &llama, &p, P), dq = ttft(&t, &qwen3, &p, P);
    double want = L * ac_cost_elem_us(&t, (double)P * (nh + kv) * hd, p.act_bytes);
    fprintf(stderr, "  TTFT llama %.3f us, qwen3 %.3f us: +%.4f, two head norms per layer %.4f\n", dl, dq, dq - dl, want);
    CHECK(want > 0 && fabs((dq - dl) - want) < 1e-9 * dl, "qwen3 - llama %.6f us, the head norms' passes %.6f", dq - dl,
          want);
    /* a layer without its FFN: its gate, up and down GEMMs, the norm and
     * SwiGLU passes (H + 2F values a token) and two launches fewer */
    ac_arch nof = mk_arch(L, H, hd, nh, kv, F, 32000);
    nof.layers[2].ffn = 0;
    double dn = ttft(&t, &nof, &p, P);
    /* the smooth prediction (ttft above) prices GEMMs without wave
     * quantisation: the table without its SM count (costroofline.c) */
    ac_cost_table tu = t;
    tu.sms = 0;
    CHECK(t.sms == 132, "the H100 profile's SMs: %d", t.sms);
    double ffn = 2 * ac_cost_gemm_lookup(&tu, P, F, H, 1) + ac_cost_gemm_lookup(&tu, P, H, F, 1) +
                 ac_cost_elem_us(&t, (double)P * (H + 2 * F), p.act_bytes) + 2 * t.launch_us;
    CHECK(t.launch_us > 0, "the H100 roofline has a launch cost");
    CHECK(fabs((dl - dn) - ffn) < 1e-9 * dl, "one FFN sub-block removed saves %.6f us, its GEMMs and passes %.6f",
          dl - dn, ffn);
    ac_arch_free(&llama), ac_arch_free(&qwen3), ac_arch_free(&nof);
    ac_cost_table_free(&t);
}

/* ac_cost_overhead_share: on a table without launch costs, the fixed part
 * is the engine's per-call overhead once per forward call (the prefill and
 * G - 1 decode steps), written out here; with a GPU's launches it is
 * larger, and it falls as the batch grows (more work per launch). */
/* ac_cost_overhead_share of the prediction it takes, made here as callers make it. */
static double share_of(const ac_cost_table *t, const ac_carch *c, const ac_workload *w, const ac_engine_profile *p) {
    ac_cost a;
    ac_cost_predict(t, c, w, p, 0, &a);
    return ac_cost_overhead_share(t, c, w, p, &a);
}

static void test_overhead_share(void) {
    ac_err e;
    ac_cost_table t;
    CHECK(ac_cost_roofline(ac_device_spec_find("H100"), "bf16", &t, &e) == 0, "%s", e.msg);
    double launch = t.launch_us;
    ac_arch a = mk_arch(8, 2048, 128, 16, 4, 5632, 32000);
    ac_carch c;
    CHECK(ac_carch_from_arch(&a, &c, &e) == 0, "%s", e.msg);
    ac_engine_profile p;
    ac_engine_profile_named(ac_engine_find("vllm"), 0, &p);
    p.overhead_ms = 0.5;
    ac_workload w = {.batch = 4, .prompt_len = 512, .gen_len = 64};
    ac_cost k;
    t.launch_us = 0;
    ac_cost_predict(&t, &c, &w, &p, 0, &k);
    double s0 = ac_cost_overhead_share(&t, &c, &w, &p, &k), want = 64 * 0.5 / k.e2e_ms;
    CHECK(fabs(s0 - want) < 1e-9, "no launches: share %.6f, 64 calls x 0.5 ms / %.3f ms = %.6f", s0, k.e2e_ms, want);
    t.launch_us = launch;
    double s4 = share_of(&t, &c, &w, &p);
    w.batch = 64;
    double s64 = share_of(&t, &c, &w, &p);
    ac_workload wo = {.batch = 4, .prompt_len = 512, .gen_len = 64, .offline = 1, .requests = 16};
    double so = share_of(&t, &c, &wo, &p);
    fprintf(stderr, "  overhead share: no launches %.4f; with H100 launches batch 4 %.4f, batch 64 %.4f; served %.4f\n",
            s0, s4, s64, so);
    CHECK(s4 > s0 && s64 < s4, "launches add to the share, a larger batch lowers it");
    /* 16 equal offline requests run as one batch of 16: a share between the static batches of 4 and 64
     * (the share is clamped to [0, 1], so a bound of 0 < share < 1 would say nothing) */
    CHECK(so < s4 && so > s64, "served share %.4f not between batch 4's %.4f and batch 64's %.4f", so, s4, s64);
    ac_carch_free(&c);
    ac_arch_free(&a);
    ac_cost_table_free(&t);
}

int main(void) {
    RUN(test_qwen3_pays_its_head_norms);
    RUN(test_overhead_share);
    return DONE();
}
