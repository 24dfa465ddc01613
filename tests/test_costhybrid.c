/* test_costhybrid.c - the cost model of hybrid Mamba-2 / attention models
 * (nemotron_h): the parameter count against the tensors a checkpoint holds
 * (read from its safetensors header here, not through the library); the
 * Mamba state counted per sequence and not growing with the context while
 * the KV cache of the attention layers does, both against sums written out
 * here; a decode step of Mamba layers that does not grow with the context;
 * a prefill linear in the tokens; fewer Mamba heads costing less; tensor
 * parallelism splitting the mixers; the figure in the cost JSON. */
#include <math.h>
#include <stdint.h>

#include "check.h"
#include "cost/costmodel.h"
#include "cost/device.h"

/* A nemotron_h config: L layers of `pattern` (M Mamba-2, * attention, -
 * squared-ReLU MLP), Nemotron-H-8B-like widths, nh Mamba heads. */
static int hybrid_arch(const char *pattern, int nh, ac_arch *a, ac_err *e) {
    json_t *c = json_pack("{s:[s],s:s,s:i,s:i,s:i,s:s,s:i,s:i,s:i,s:i,s:s,s:i,s:i,s:i,s:i,s:i,s:b,s:f,s:i,s:b}",
                          "architectures", "NemotronHForCausalLM", "model_type", "nemotron_h", "vocab_size", 131072,
                          "hidden_size", 4096, "num_hidden_layers", (int)strlen(pattern), "hybrid_override_pattern",
                          pattern, "num_attention_heads", 32, "num_key_value_heads", 8, "head_dim", 128,
                          "intermediate_size", 21504, "mlp_hidden_act", "relu2", "mamba_num_heads", nh,
                          "mamba_head_dim", 64, "ssm_state_size", 128, "n_groups", 8, "conv_kernel", 4,
                          "use_conv_bias", 1, "layer_norm_epsilon", 1e-5, "max_position_embeddings", 131072,
                          "tie_word_embeddings", 0);
    int rc = ac_arch_from_config(c, a, e);
    json_decref(c);
    return rc;
}

/* Elements of every tensor in a safetensors file: its 8-byte header length,
 * then the JSON header's shapes. -1 when unreadable. */
static double file_elements(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    unsigned char lb[8];
    uint64_t n = 0;
    double total = -1;
    if (fread(lb, 1, 8, f) == 8) {
        for (int i = 7; i >= 0; i--) n = n << 8 | lb[i];
        char *h = n < (1u << 26) ? malloc(n + 1) : NULL;
        if (h && fread(h, 1, n, f) == n) {
            h[n] = 0;
            json_t *j = json_loads(h, 0, NULL);
            const char *k;
            json_t *v;
            total = j ? 0 : -1;
            json_object_foreach(j, k, v) {
                if (!strcmp(k, "__metadata__")) continue;
                double el = 1;
                size_t i;
                json_t *d;
                json_array_foreach(json_object_get(v, "shape"), i, d) el *= (double)json_integer_value(d);
                total += el;
            }
            json_decref(j);
        }
        free(h);
    }
    fclose(f);
    return total;
}

static void test_params_are_the_checkpoints(void) {
    /* the dense hybrid, one with MoE layers (shared expert, correction bias) and a LatentMoE one */
    static const char *const fx_names[] = {"nemotronh_bf16", "nemotronh_moe_bf16", "nemotronh_latent_bf16"};
    const char *fx = getenv("AC_BUILD");
    char missing[200] = "";
    for (size_t i = 0; i < sizeof fx_names / sizeof *fx_names; i++) {
        char dir[1024], p[1100];
        snprintf(dir, sizeof dir, "%s/fixtures/models/%s", fx ? fx : "build", fx_names[i]);
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        if (!ck_exists(p)) {
            snprintf(missing + strlen(missing), sizeof missing - strlen(missing), " %s", fx_names[i]);
            continue;
        }
        ac_err e;
        ac_arch a;
        CHECK(ac_arch_load(dir, &a, &e) == 0, "%s", e.msg);
        ac_carch c;
        CHECK(ac_carch_from_arch(&a, &c, &e) == 0, "%s", e.msg);
        double want = file_elements(p);
        CHECK(want > 0, "read %s", p);
        CHECK(ac_arch_params(&a) == want, "%s: model.c counts %.0f parameters, the file holds %.0f", fx_names[i],
              ac_arch_params(&a), want);
        CHECK(ac_carch_params(&c) == want, "%s: the cost model counts %.0f parameters, the file holds %.0f",
              fx_names[i], ac_carch_params(&c), want);
        CHECK(c.ssm && c.ssm[0] == 6 && c.ffn_mats == 2, "%s: Mamba heads and the 2-matrix MLP read", fx_names[i]);
        ac_carch_free(&c);
        ac_arch_free(&a);
    }
    if (missing[0]) SKIP("no fixture%s (make fixtures)", missing); /* the others were checked */
}

/* 26 layers: 22 Mamba, 4 attention (no MLP among them for the sums below
 * to stay short: the MLP layers are priced as before). */
#define PATTERN "MMMMM*MMMMM*MMMMM*MMMMM*MM"

static void test_state_per_sequence_kv_per_token(void) {
    ac_err e;
    ac_arch a;
    CHECK(hybrid_arch(PATTERN, 128, &a, &e) == 0, "%s", e.msg);
    ac_carch c;
    CHECK(ac_carch_from_arch(&a, &c, &e) == 0, "%s", e.msg);
    ac_cost_table t;
    CHECK(ac_cost_roofline(ac_device_spec_find("B200"), "bf16", &t, &e) == 0, "%s", e.msg);
    ac_engine_profile p;
    ac_engine_profile_default(&p, 0);
    /* written out: 22 Mamba layers of 128 heads x 64, conv channels
     * 8192 + 2 x 8 x 128 with 3 rows of window, state 8192 x 128, fp32;
     * 4 attention layers of 8 KV heads x 128, K and V */
    double gib = 1073741824.0, state = 22.0 * ((8192 + 2 * 8 * 128) * 3 + 8192.0 * 128) * 4,
           kv_tok = 4.0 * 2 * 8 * 128 * p.kv_bytes;
    CHECK(fabs(ac_carch_state_bytes(&c) / state - 1) < 1e-12, "state %.0f bytes, written out %.0f",
          ac_carch_state_bytes(&c), state);
    ac_cost k1, k2;
    ac_workload w1 = {.batch = 4, .prompt_len = 1024, .gen_len = 1}, w2 = {.batch = 4, .prompt_len = 131071, .gen_len = 1};
    ac_cost_predict(&t, &c, &w1, &p, 1, &k1);
    ac_cost_predict(&t, &c, &w2, &p, 1, &k2);
    CHECK(fabs(k1.state_gib - 4 * state / gib) < 1e-9 && k1.state_gib == k2.state_gib,
          "state %.4f GiB at 1K, %.4f at 128K; written out %.4f", k1.state_gib, k2.state_gib, 4 * state / gib);
    CHECK(fabs(k2.kv_gib - 4 * 131072.0 * kv_tok / gib) < 1e-9, "KV %.3f GiB at 128K, written out %.3f", k2.kv_gib,
          4 * 131072.0 * kv_tok / gib);
    CHECK(k2.mem_gib - k1.mem_gib > k2.kv_gib - k1.kv_gib - 1e-9, "memory grows by the KV (and activations) only");
    json_t *j = ac_cost_to_json(&k1);
    CHECK(fabs(json_real_value(json_object_get(j, "ssm_state_gib")) - k1.state_gib) < 1e-12, "ssm_state_gib in JSON");
    json_decref(j);
    /* the largest batch that fits counts each sequence's state */
    CHECK(k1.max_batch > 0, "max batch %d", k1.max_batch);
    double per_seq_no_state = (1025 * kv_tok) / gib;
    CHECK(k1.max_batch < (t.mem_gib * p.mem_util - k1.weights_gib - p.overhead_gib) / per_seq_no_state,
          "max batch %d ignores the state", k1.max_batch);
    ac_carch_free(&c);
    ac_arch_free(&a);
    ac_cost_table_free(&t);
}

static void test_decode_and_prefill(void) {
    ac_err e;
    ac_arch am, ah;
    CHECK(hybrid_arch("MMMMMMMMMMMM", 128, &am, &e) == 0 && hybrid_arch(PATTERN, 128, &ah, &e) == 0, "%s", e.msg);
    ac_carch cm, ch;
    CHECK(ac_carch_from_arch(&am, &cm, &e) == 0 && ac_carch_from_arch(&ah, &ch, &e) == 0, "%s", e.msg);
    ac_cost_table t;
    CHECK(ac_cost_roofline(ac_device_spec_find("B200"), "bf16", &t, &e) == 0, "%s", e.msg);
    ac_engine_profile p;
    ac_engine_profile_default(&p, 0);
    /* decode: Mamba layers read their weights and state, whatever the context */
    double m1k = ac_cost_decode_step_us(&t, &cm, &p, 8, 1024), m128k = ac_cost_decode_step_us(&t, &cm, &p, 8, 131072);
    double h1k = ac_cost_decode_step_us(&t, &ch, &p, 8, 1024), h128k = ac_cost_decode_step_us(&t, &ch, &p, 8, 131072);
    fprintf(stderr, "  B200 decode step, batch 8: Mamba-only %.1f us at 1K, %.1f at 128K; hybrid %.1f, %.1f\n", m1k,
            m128k, h1k, h128k);
    CHECK(fabs(m128k / m1k - 1) < 1e-9, "Mamba-only step grows with the context: %.2f -> %.2f us", m1k, m128k);
    CHECK(h128k > 1.2 * h1k, "the attention layers' step grows with the context: %.2f -> %.2f us", h1k, h128k);
    CHECK(ac_cost_decode_bytes(&cm, &p, 8, 0) - ac_cost_decode_bytes(&cm, &p, 0, 0) ==
              2 * 8 * ac_carch_state_bytes(&cm),
          "each sequence's state read and written once a step");
    /* prefill: linear in the tokens (the GEMMs and the scan alike) */
    ac_workload w4 = {.batch = 1, .prompt_len = 4096, .gen_len = 1}, w8 = {.batch = 1, .prompt_len = 8192, .gen_len = 1};
    ac_cost a4, a8;
    ac_cost_predict(&t, &cm, &w4, &p, 1, &a4);
    ac_cost_predict(&t, &cm, &w8, &p, 1, &a8);
    CHECK(a8.ttft_ms / a4.ttft_ms > 1.85 && a8.ttft_ms / a4.ttft_ms < 2.05, "TTFT 8K / 4K %.3f", a8.ttft_ms / a4.ttft_ms);
    /* half the Mamba heads: fewer parameters, half the state, a faster prefill */
    ac_arch ahalf;
    ac_carch chalf;
    CHECK(hybrid_arch("MMMMMMMMMMMM", 64, &ahalf, &e) == 0 && ac_carch_from_arch(&ahalf, &chalf, &e) == 0, "%s",
          e.msg);
    ac_cost b8;
    ac_cost_predict(&t, &chalf, &w8, &p, 1, &b8);
    CHECK(b8.params < a8.params && b8.ttft_ms < a8.ttft_ms, "64 heads: %.3g params %.2f ms; 128: %.3g, %.2f ms",
          b8.params, b8.ttft_ms, a8.params, a8.ttft_ms);
    CHECK(fabs(b8.state_gib / a8.state_gib - (64.0 * 64 * 3 + 2 * 8 * 128 * 3 + 64.0 * 64 * 128) /
                                                 (128.0 * 64 * 3 + 2 * 8 * 128 * 3 + 128.0 * 64 * 128)) < 1e-9,
          "state at 64 heads / 128 heads %.4f", b8.state_gib / a8.state_gib);
    /* tensor parallelism: each GPU holds half the heads and their state */
    ac_engine_profile p2 = p;
    p2.tp = 2;
    ac_cost t2;
    ac_cost_predict(&t, &cm, &w8, &p2, 1, &t2);
    CHECK(fabs(t2.state_gib / a8.state_gib - 0.5) < 1e-9, "tp 2 state per GPU %.3f of tp 1", t2.state_gib / a8.state_gib);
    CHECK(t2.weights_gib < 0.6 * a8.weights_gib, "tp 2 weights per GPU %.3f of tp 1", t2.weights_gib / a8.weights_gib);
    ac_carch_free(&cm), ac_carch_free(&ch), ac_carch_free(&chalf);
    ac_arch_free(&am), ac_arch_free(&ah), ac_arch_free(&ahalf);
    ac_cost_table_free(&t);
}

int main(void) {
    RUN(test_params_are_the_checkpoints);
    RUN(test_state_per_sequence_kv_per_token);
    RUN(test_decode_and_prefill);
    return DONE();
}
