/* test_costattn.c - the CPU decode model's context-dependent terms (issue
 * #16): a decode step reads the KV cache at the table's own measured rate
 * (dec_kv_us_mib) on top of the warm attention table, the weights at the
 * band rate; the rates survive JSON; older tables (no KV rate) keep charging
 * the KV cache like the weights. And the softmax the attention is made of
 * writes no subnormal weights (which made the engine's P.V GEMM 10-20x
 * slower on peaked rows, a cost no table could predict). */
#include <float.h>
#include <math.h>

#include "check.h"
#include "cost/costmodel.h"
#include "runtime/kernels_cpu.h"
#include "synth.h"
#include "synth_cost.h"

/* Weight and KV bytes counted independently of the model: 3 layers (the
 * middle one without attention), hidden 64, head_dim 16, heads 4/kv 2 and
 * 8/kv 8 heads, FFN 128, vocab 256, fp32. */
#define WB ((256.0 * 64 + 2 * 64 * (4 + 2) * 16 + 2 * 64 * (8 + 8) * 16 + 3 * 3 * 64 * 128) * 4)
#define KVB(B, S) ((B) * (S)*2.0 * (2 + 8) * 16 * 4)

static ac_arch test_arch(void) {
    ac_arch a = mk_arch(3, 64, 16, 4, 2, 128, 256);
    a.layers[1].n_heads = a.layers[1].n_kv_heads = 0;
    a.layers[2].n_heads = a.layers[2].n_kv_heads = 8;
    return a;
}

/* The decode step: warm tables + weights x band rate + KV x KV rate, with
 * both rates read at the step's working set (weights + KV). */
static void test_decode_step_terms(void) {
    ac_cost_table t;
    synth_table(&t);
    ac_arch a = test_arch();
    ac_carch c;
    ac_err e;
    CHECK(ac_carch_from_arch(&a, &c, &e) == 0, "carch");
    ac_engine_profile p;
    ac_engine_profile_default(&p, 1);
    CHECK(fabs(ac_cost_decode_bytes(&c, &p, 1, 0) - WB) < 1e-6, "weights %g vs %g", ac_cost_decode_bytes(&c, &p, 1, 0),
          WB);
    CHECK(fabs(ac_cost_decode_bytes(&c, &p, 3, 100) - WB - KVB(3, 100)) < 1e-6, "KV bytes");
    /* warm: no bands, all weights in cache */
    t.cache_bytes = 1e30;
    double S[] = {20, 300, 3000}, B[] = {1, 3}, warm[2][3];
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 3; i++) warm[b][i] = ac_cost_decode_step_us(&t, &c, &p, B[b], S[i]);
    CHECK(warm[0][2] > warm[0][0], "the warm attention grows with the context: %g vs %g", warm[0][2], warm[0][0]);
    /* bands: constant rates (one working set beyond both points) */
    t.ndec = 2;
    t.dec_ws[0] = 1e3;
    t.dec_ws[1] = 2e3;
    t.dec_us_mib[0] = t.dec_us_mib[1] = 20;
    t.dec_kv = 1;
    t.dec_kv_us_mib[0] = t.dec_kv_us_mib[1] = 90;
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 3; i++) {
            double want = warm[b][i] + WB / 1048576.0 * 20 + KVB(B[b], S[i]) / 1048576.0 * 90,
                   got = ac_cost_decode_step_us(&t, &c, &p, B[b], S[i]);
            CHECK(fabs(got - want) < 1e-9 * want, "B %g S %g: %g vs %g", B[b], S[i], got, want);
        }
    /* older tables: the KV cache at the weights' rate */
    t.dec_kv = 0;
    double old = ac_cost_decode_step_us(&t, &c, &p, 1, 300), want = warm[0][1] + (WB + KVB(1, 300)) / 1048576.0 * 20;
    CHECK(fabs(old - want) < 1e-9 * want, "no KV rate: %g vs %g", old, want);
    /* rates between bands: log-linear in the working set, both of them */
    t.dec_kv = 1;
    double ws = WB + KVB(1, 300);
    t.dec_ws[0] = ws / 2;
    t.dec_ws[1] = ws * 2;
    t.dec_us_mib[1] = 40;
    t.dec_kv_us_mib[0] = 60;
    t.dec_kv_us_mib[1] = 120;
    want = warm[0][1] + WB / 1048576.0 * 30 + KVB(1, 300) / 1048576.0 * 90;
    double mid = ac_cost_decode_step_us(&t, &c, &p, 1, 300);
    CHECK(fabs(mid - want) < 1e-6 * want, "between the bands: %g vs %g", mid, want);
    ac_carch_free(&c);
    ac_arch_free(&a);
    ac_cost_table_free(&t);
}

/* TPOT over a generation: the mean step over its contexts, so the KV term
 * adds (mean context) x KV bytes per position x rate; prefill unchanged. */
static void test_tpot_context_slope(void) {
    ac_cost_table t;
    synth_table(&t);
    ac_arch a = test_arch();
    ac_carch c;
    ac_err e;
    CHECK(ac_carch_from_arch(&a, &c, &e) == 0, "carch");
    ac_engine_profile p;
    ac_engine_profile_default(&p, 1);
    t.ndec = 2;
    t.dec_ws[0] = 1e3;
    t.dec_ws[1] = 2e3;
    t.dec_us_mib[0] = t.dec_us_mib[1] = 20;
    ac_cost k0[2], k1[2];
    int P[] = {64, 512};
    for (int i = 0; i < 2; i++) {
        ac_workload w = {.batch = 1, .prompt_len = P[i], .gen_len = 9};
        t.dec_kv = 1;
        t.dec_kv_us_mib[0] = t.dec_kv_us_mib[1] = 0;
        ac_cost_predict(&t, &c, &w, &p, 0, &k0[i]);
        t.dec_kv_us_mib[0] = t.dec_kv_us_mib[1] = 100;
        ac_cost_predict(&t, &c, &w, &p, 0, &k1[i]);
        /* ac_cost_predict integrates the steps over contexts P+1 .. P+G: mean P + 5 */
        double extra = KVB(1, P[i] + 5.0) / 1048576.0 * 100 / 1e3;
        CHECK(fabs(k1[i].tpot_ms - k0[i].tpot_ms - extra) < 1e-9, "P %d: KV term %g vs %g", P[i],
              k1[i].tpot_ms - k0[i].tpot_ms, extra);
        CHECK(k1[i].ttft_ms == k0[i].ttft_ms, "prefill changed by the KV rate");
    }
    CHECK(k1[1].tpot_ms - k1[0].tpot_ms > k0[1].tpot_ms - k0[0].tpot_ms, "the KV rate steepens TPOT in the context");
    ac_carch_free(&c);
    ac_arch_free(&a);
    ac_cost_table_free(&t);
}

/* kv_us_per_mib survives JSON; a wrong length or a non-number is refused
 * and named. */
static void test_kv_rate_json(void) {
    ac_cost_table t, u;
    ac_err e;
    synth_table(&t);
    t.ndec = 2;
    t.dec_ws[0] = 1e6;
    t.dec_ws[1] = 5e7;
    t.dec_us_mib[0] = 20;
    t.dec_us_mib[1] = 35;
    t.dec_kv = 1;
    t.dec_kv_us_mib[0] = 70;
    t.dec_kv_us_mib[1] = 110;
    json_t *j = ac_cost_table_to_json(&t);
    CHECK(ac_cost_table_from_json(j, &u, &e) == 0, "round trip: %s", e.msg);
    CHECK(u.dec_kv == 1 && u.dec_kv_us_mib[0] == 70 && u.dec_kv_us_mib[1] == 110, "KV rates %d %g %g", u.dec_kv,
          u.dec_kv_us_mib[0], u.dec_kv_us_mib[1]);
    ac_cost_table_free(&u);
    const char *field = NULL;
    json_t *d = json_object_get(j, "decode_bands");
    json_object_set_new(d, "kv_us_per_mib", json_pack("[f]", 1.0));
    CHECK(ac_cost_table_validate(j, &field, &e) != 0 && field && !strcmp(field, "decode_bands.kv_us_per_mib"),
          "wrong length accepted (field %s)", field ? field : "-");
    json_object_set_new(d, "kv_us_per_mib", json_pack("[f,s]", 1.0, "x"));
    CHECK(ac_cost_table_validate(j, &field, &e) != 0, "a string accepted");
    json_object_del(d, "kv_us_per_mib");
    CHECK(ac_cost_table_from_json(j, &u, &e) == 0 && u.dec_kv == 0, "without the KV rates: an older table");
    ac_cost_table_free(&u);
    json_decref(j);
    ac_cost_table_free(&t);
}

/* A peaked row: weights that would be subnormal are 0, those from 4 FLT_MIN
 * up match the double-precision softmax; attention over it returns the
 * peak's value row. */
static void test_softmax_no_subnormals(void) {
    enum { N = 200 };
    float x[N];
    double ref[N], s = 0;
    for (int i = 0; i < N; i++) x[i] = i == 7 ? 0.0f : i < 20 ? -80.0f - i : -95.0f - i;
    for (int i = 0; i < N; i++) s += exp((double)x[i]);
    for (int i = 0; i < N; i++) ref[i] = exp((double)x[i]) / s;
    ac_softmax(x, N);
    int sub = 0, bad = 0;
    double sum = 0;
    for (int i = 0; i < N; i++) {
        sum += x[i];
        if (x[i] != 0 && fabsf(x[i]) < FLT_MIN) sub++;
        if (ref[i] >= FLT_MIN * 4 && fabs(x[i] - ref[i]) > 1e-5 * ref[i]) bad++;
        if (ref[i] < FLT_MIN / 2 && x[i] != 0) bad++;
    }
    CHECK(sub == 0, "%d subnormal weights", sub);
    CHECK(bad == 0, "%d weights off the reference", bad);
    CHECK(fabs(sum - 1) < 1e-6, "sum %g", sum);
    /* one head, 64 keys, the query aligned with key 5 only */
    enum { S = 64, HD = 16 };
    float q[HD], k[S * HD], v[S * HD], out[HD], sc[S];
    for (int d = 0; d < HD; d++) q[d] = d == 0 ? 100.0f : 0.0f;
    for (int j = 0; j < S; j++)
        for (int d = 0; d < HD; d++) {
            k[j * HD + d] = d == 0 ? (j == 5 ? 4.0f : -4.0f) : 0.0f;
            v[j * HD + d] = (float)(j * 100 + d);
        }
    ac_attention_head(out, q, k, v, 1, S - 1, HD, HD, HD, 0, sc);
    int sub2 = 0;
    for (int j = 0; j < S; j++) sub2 += sc[j] != 0 && fabsf(sc[j]) < FLT_MIN;
    CHECK(sub2 == 0, "%d subnormal attention weights", sub2);
    for (int d = 0; d < HD; d++) CHECK(fabsf(out[d] - (500 + d)) < 1e-3f, "out[%d] = %g", d, out[d]);
}

int main(void) {
    ac_set_threads(1);
    RUN(test_decode_step_terms);
    RUN(test_tpot_context_slope);
    RUN(test_kv_rate_json);
    RUN(test_softmax_no_subnormals);
    return DONE();
}
