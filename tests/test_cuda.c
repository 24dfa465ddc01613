/* test_cuda.c - the CUDA backend against the CPU engine (BF16 tolerance),
 * KV-cache decode on the GPU, GEMM timings against the device's roofline.
 * Skips with the reason when the plugin or a device is missing. */
#include <jansson.h>
#include <math.h>

#include "check.h"
#include "costcache.h"
#include "cost/costtimings_int.h"
#include "runtime/cuda_plugin.h"
#include "cost/device.h"
#include "runtime/engine.h"
#include "runtime/eval.h"
#include "imp_compare.h"
#include "search/importance.h"
#include "pipeline/job.h"
#include "runtime/kernels_cpu.h"
#include "runtime/rope.h"
#include "format/safetensors.h"
#include "search/stats.h"
#include "core/tensor.h"

static const ac_cuda_api *cu;
static const char *why;

/* Loads fixture model `name` (build/fixtures/models); 0 on success. */
static int load_fixture(const char *name, ac_model *m) {
    char dir[1024], rel[256];
    ac_err e;
    snprintf(rel, sizeof rel, "fixtures/models/%s", name);
    ck_build_path(dir, sizeof dir, rel);
    return ac_model_load(dir, m, &e);
}

/* max(a, b), NaN when either is (fmax would drop a NaN difference). */
static double max_nan(double a, double b) { return a != a || b != b ? NAN : a > b ? a : b; }

static void compare(const char *name) {
    if (!cu) SKIP("%s", why);
    ac_model m;
    ac_err e;
    if (load_fixture(name, &m)) SKIP("no fixture %s (make fixtures)", name);
    int B = 2, T = 12, toks[24];
    for (int i = 0; i < B * T; i++) toks[i] = (i * 37 + 5) % m.a.vocab;
    ac_engine en;
    CHECK(ac_engine_init(&en, &m, B, T, &e) == 0, "%s", e.msg);
    ac_engine_forward(&en, toks, B, T, 0, 0, &e);
    acc_engine *g = NULL;
    char err[512] = "";
    CHECK(cu->engine_create(0, &m, B, T, en.cos_t, en.sin_t, &g, err, sizeof err) == 0, "%s",
          err); /* the host's RoPE tables */
    size_t V = m.a.vocab;
    float *lg = malloc(sizeof(float) * B * T * V);
    CHECK(g && cu->engine_forward(g, toks, B, T, 0, 0, lg, err, sizeof err) == 0, "%s", err);
    double mx = 0, d = 0;
    for (size_t i = 0; i < B * T * V; i++) {
        mx = fmax(mx, fabs(en.logits[i]));
        d = max_nan(d, fabs(en.logits[i] - lg[i]));
    }
    printf("   %s: GPU vs CPU max |diff| / max |logit| = %.2e\n", name, d / mx);
    CHECK(d <= 3e-2 * mx, "%s: GPU logits differ by %g (max %g)", name, d, mx);
    /* decode: prefill T-1, then one token; last row must match */
    int pre[22], last[2] = {toks[T - 1], toks[2 * T - 1]};
    for (int bb = 0; bb < B; bb++) memcpy(pre + bb * (T - 1), toks + bb * T, sizeof(int) * (T - 1));
    float *l2 = malloc(sizeof(float) * B * V);
    CHECK(cu->engine_forward(g, pre, B, T - 1, 0, 1, l2, err, sizeof err) == 0 &&
              cu->engine_forward(g, last, B, 1, T - 1, 1, l2, err, sizeof err) == 0,
          "%s", err);
    double dd = 0;
    for (int bb = 0; bb < B; bb++)
        for (size_t v = 0; v < V; v++) dd = max_nan(dd, fabs(l2[bb * V + v] - lg[((size_t)bb * T + T - 1) * V + v]));
    CHECK(dd <= 1e-2 * mx, "%s: decode differs by %g", name, dd);
    free(l2);
    /* cross-entropy on the device vs the CPU engine's, same windows */
    int tg[24];
    float nl[24];
    for (int bb = 0; bb < B; bb++)
        for (int t = 0; t < T; t++) tg[bb * T + t] = t + 1 < T ? toks[bb * T + t + 1] : -1;
    long cnt;
    double cpu_nll = ac_engine_nll(&en, toks, B, T, 0, &cnt), gpu_nll = 0;
    CHECK(cu->engine_nll(g, toks, tg, B, T, 0, nl, err, sizeof err) == 0, "%s", err);
    double worst = 0;
    for (int i = 0; i < B * T; i++) {
        gpu_nll += nl[i];
        if (tg[i] < 0) {
            CHECK(nl[i] == 0, "%s: row %d has no target but NLL %g", name, i, nl[i]);
            continue;
        }
        const float *row = en.logits + (size_t)i * V; /* per-row reference from the CPU logits */
        double mxr = row[0], se = 0;
        for (size_t v = 1; v < V; v++) mxr = fmax(mxr, row[v]);
        for (size_t v = 0; v < V; v++) se += exp(row[v] - mxr);
        worst = fmax(worst, fabs(nl[i] - (mxr + log(se) - row[tg[i]])));
    }
    gpu_nll /= cnt;
    printf("   %s: mean NLL GPU %.5f vs CPU %.5f, worst row %.2e\n", name, gpu_nll, cpu_nll, worst);
    CHECK(fabs(gpu_nll - cpu_nll) <= 3e-3 * cpu_nll, "%s: mean NLL %g vs %g", name, gpu_nll, cpu_nll);
    CHECK(worst <= 2 * d + 1e-3, "%s: a row's NLL differs by %g (logits by %g)", name, worst, d);
    /* out of range: a clear error, nothing run */
    err[0] = 0;
    CHECK(cu->engine_forward(g, toks, B, T, 1, 1, lg, err, sizeof err) != 0 && strstr(err, "exceeds"),
          "%s: beyond max_ctx: '%s'", name, err);
    free(lg);
    if (g) cu->engine_free(g);
    ac_engine_free(&en);
    ac_model_free(&m);
}

static void test_gpu_llama_gqa(void) { compare("llama_gqa_bf16"); }
static void test_gpu_qwen2_bias(void) { compare("qwen2_tied_f16"); }
static void test_gpu_qwen3_qk_norm(void) { compare("qwen3_hd_bf16"); }
static void test_gpu_moe(void) {
    compare("qwen3moe_mixed_bf16");
    compare("mixtral_f32");
}
/* The fixture's tokens (B x T, tokens.json) and float64-reference logits
 * (logits.bin, B*T x V) of model `name`; 0 on success (the caller frees). */
static int fixture_ref(const char *name, int V, int *B, int *T, int **tok, float **ref) {
    char p[1024], rel[300];
    snprintf(rel, sizeof rel, "fixtures/models/%s/tokens.json", name);
    ck_build_path(p, sizeof p, rel);
    json_t *tj = json_load_file(p, 0, NULL);
    if (!tj) return -1;
    *B = (int)json_integer_value(json_object_get(tj, "B"));
    *T = (int)json_integer_value(json_object_get(tj, "T"));
    size_t n = (size_t)*B * *T;
    *tok = malloc(sizeof(int) * n);
    *ref = malloc(sizeof(float) * n * V);
    for (size_t i = 0; *tok && i < n; i++) (*tok)[i] = (int)json_integer_value(json_array_get(json_object_get(tj, "ids"), i));
    json_decref(tj);
    snprintf(rel, sizeof rel, "fixtures/models/%s/logits.bin", name);
    ck_build_path(p, sizeof p, rel);
    FILE *f = fopen(p, "rb");
    int ok = f && *tok && *ref && fread(*ref, sizeof(float), n * V, f) == n * V;
    if (f) fclose(f);
    return ok ? 0 : -1;
}

/* Hybrid fixture `name` (nemotron_h) on the CUDA engine: against the CPU
 * engine as every dense model (compare: logits, a prefill then a decode
 * step, cross-entropy), against the float64 reference of tests/ref_mamba.py
 * (the sequential recurrence) at the same BF16 tolerance, and decoding
 * token by token (each Mamba layer's conv and SSM state carried on the
 * device, as the attention layers' KV cache) equal to the prefill. Without
 * vs_ref, against the CPU engine on a BF16 copy of the model instead of the
 * reference: an F32 checkpoint's weights are rounded to BF16 on the device,
 * which moves router scores by more than the fixture's 1e-4 margin between
 * a row's k-th and (k+1)-th expert, so the rounded model routes some rows
 * otherwise than the float64 one (the CPU engine on the rounded weights
 * differs from the reference as much). */
static void hybrid_vs_reference(const char *name, int vs_ref) {
    ac_model m;
    ac_err e;
    if (load_fixture(name, &m)) SKIP("no fixture %s (make fixtures)", name);
    compare(name);
    int B = 0, T = 0, *tok = NULL, V = m.a.vocab;
    float *ref = NULL;
    if (fixture_ref(name, V, &B, &T, &tok, &ref)) {
        CHECK(0, "%s: tokens.json / logits.bin", name);
        free(tok), free(ref);
        ac_model_free(&m);
        return;
    }
    size_t nr = (size_t)T * (m.a.head_dim / 2);
    float *cs = malloc(nr * 4), *sn = malloc(nr * 4), *lg = malloc(sizeof(float) * B * T * V),
          *l1 = malloc(sizeof(float) * B * V);
    CHECK(ac_rope_tables(&m.a, T, cs, sn, &e) == 0, "%s", e.msg);
    acc_engine *g = NULL;
    char err[512] = "";
    CHECK(cu->engine_create(0, &m, B, T, cs, sn, &g, err, sizeof err) == 0, "%s", err);
    CHECK(g && cu->engine_forward(g, tok, B, T, 0, 0, lg, err, sizeof err) == 0, "%s", err);
    double mx = 0, d = 0, dd = 0;
    for (size_t i = 0; i < (size_t)B * T * V; i++) {
        mx = fmax(mx, fabs(ref[i]));
        d = max_nan(d, fabs(ref[i] - lg[i]));
    }
    if (!vs_ref) { /* the reference: the CPU engine on the weights the device holds */
        ac_model mb;
        ac_engine ce;
        CHECK(ac_model_to_bf16(&m, &mb, &e) == 0 && ac_engine_init(&ce, &mb, B, T, &e) == 0 &&
                  ac_engine_forward(&ce, tok, B, T, 0, 0, &e) == 0,
              "%s", e.msg);
        d = 0;
        for (size_t i = 0; i < (size_t)B * T * V; i++) d = max_nan(d, fabs(ce.logits[i] - lg[i]));
        ac_engine_free(&ce);
        ac_model_free(&mb);
    }
    CHECK(d <= 3e-2 * mx, "%s: GPU logits differ from the %s by %g (max %g)", name,
          vs_ref ? "float64 reference" : "CPU engine on BF16 weights", d, mx);
    for (int t = 0; g && t < T; t++) { /* token by token: every step continues the device's state */
        int step[8];
        for (int b = 0; b < B && b < 8; b++) step[b] = tok[b * T + t];
        CHECK(cu->engine_forward(g, step, B, 1, t, 1, l1, err, sizeof err) == 0, "%s", err);
        for (int b = 0; b < B; b++)
            for (int v = 0; v < V; v++)
                dd = max_nan(dd, fabs(l1[(size_t)b * V + v] - lg[((size_t)b * T + t) * V + v]));
    }
    CHECK(dd <= 1e-2 * mx, "%s: token-by-token decode differs from the prefill by %g", name, dd);
    printf("   %s: GPU vs %s max |diff| / max |logit| = %.2e; decode token by token vs prefill %.2e\n", name,
           vs_ref ? "float64 reference" : "CPU engine on its BF16 copy", d / mx, dd / mx);
    if (g) cu->engine_free(g);
    free(cs), free(sn), free(lg), free(l1), free(tok), free(ref);
    ac_model_free(&m);
}

/* nemotron_h on the CUDA engine: the dense hybrid nemotronh_bf16 (M-M*-:
 * Mamba-2, squared-ReLU MLP, attention without RoPE), the MoE ones
 * nemotronh_moe_bf16 (MEM*E: the sigmoid router with its correction bias,
 * top-2 renormalised, scale 2.5, squared-ReLU experts, a shared expert),
 * nemotronh_moe_nonorm_f32 (E*E: top-3, not renormalised) and LatentMoE
 * nemotronh_latent_bf16 (ME*E: the experts in a latent width of 24). */
static void test_gpu_hybrid(void) {
    if (!cu) SKIP("%s", why);
    hybrid_vs_reference("nemotronh_bf16", 1);
    hybrid_vs_reference("nemotronh_moe_bf16", 1);
    hybrid_vs_reference("nemotronh_moe_nonorm_f32", 0);
    hybrid_vs_reference("nemotronh_latent_bf16", 1);
}

/* Whole-model perplexity of hybrid fixture `name` on the CUDA engine:
 * ac_perplexity with the forward and the cross-entropy on the device over
 * the windows of the fixture's ppl.json (3 of 32 tokens, each from position
 * 0, 2 per forward then 1: every forward starts each sequence's conv and
 * SSM state from zero) within 0.1 % of tests/ref_mamba.py's float64
 * perplexity stored there, and the device's logits of those windows (one
 * forward of all three) against the CPU engine's within 3e-2 of the largest
 * logit, the dense models' BF16 tolerance (compare). Without vs_ref (an F32
 * checkpoint, rounded to BF16 on the device, which routes some rows
 * otherwise: hybrid_vs_reference) the logits against the CPU engine on the
 * model's BF16 copy, and the perplexity within 0.1 % of that engine's too. */
static void hybrid_ppl_gpu(const char *name, int vs_ref) {
    ac_model m, mb;
    ac_err e = {{0}};
    char p[1024], rel[300];
    if (load_fixture(name, &m)) SKIP("no fixture %s (make fixtures)", name);
    snprintf(rel, sizeof rel, "fixtures/models/%s/ppl.json", name);
    ck_build_path(p, sizeof p, rel);
    json_t *pj = json_load_file(p, 0, NULL), *ja = json_object_get(pj, "ids");
    size_t n = json_array_size(ja);
    int ctx = (int)json_integer_value(json_object_get(pj, "ctx")),
        nw = (int)json_integer_value(json_object_get(pj, "windows")), *ids = malloc(sizeof(int) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) ids[i] = (int)json_integer_value(json_array_get(ja, i));
    double want = json_real_value(json_object_get(pj, "ppl"));
    long scored = (long)json_integer_value(json_object_get(pj, "scored"));
    json_decref(pj);
    if (!n || ctx < 2 || nw < 1 || (size_t)ctx * nw > n) {
        CHECK(0, "%s: ppl.json", name);
        free(ids), ac_model_free(&m);
        return;
    }
    const ac_model *cm = &m; /* the CPU engine's model: the device's weights where they differ */
    if (!vs_ref) {
        CHECK(ac_model_to_bf16(&m, &mb, &e) == 0, "%s: %s", name, e.msg);
        cm = &mb;
    }
    ac_ppl_opts oc = {.ctx = ctx, .max_windows = nw, .batch = 2}, og = oc;
    og.cuda = 1;
    ac_ppl_result rc, rg;
    CHECK(ac_perplexity(cm, ids, n, &oc, NULL, NULL, NULL, &rc, &e) == 0, "%s: %s", name, e.msg);
    CHECK(ac_perplexity(&m, ids, n, &og, NULL, NULL, NULL, &rg, &e) == 0, "%s: %s", name, e.msg);
    double rd = fabs(rg.ppl - want) / want, rdc = fabs(rg.ppl - rc.ppl) / rc.ppl;
    CHECK(!strcmp(rg.engine, "cuda") && rg.scored == scored && rc.scored == scored, "%s: engine %s, scored %ld / %ld of %ld",
          name, rg.engine, rg.scored, rc.scored, scored);
    CHECK(rd <= 1e-3, "%s: ppl on the device %.6f vs the float64 reference's %.6f (%.2e relative)", name, rg.ppl, want, rd);
    CHECK(vs_ref || rdc <= 1e-3, "%s: ppl on the device %.6f vs the CPU engine's on BF16 weights %.6f (%.2e relative)",
          name, rg.ppl, rc.ppl, rdc);
    /* the logits of the same windows, one forward of all of them */
    ac_engine en;
    acc_engine *g = NULL;
    char err[512] = "";
    size_t V = m.a.vocab, nl = (size_t)nw * ctx * V;
    float *lg = malloc(sizeof(float) * nl);
    CHECK(lg && ac_engine_init(&en, cm, nw, ctx, &e) == 0 && ac_engine_forward(&en, ids, nw, ctx, 0, 0, &e) == 0, "%s: %s",
          name, e.msg);
    CHECK(cu->engine_create(0, &m, nw, ctx, en.cos_t, en.sin_t, &g, err, sizeof err) == 0 && g &&
              cu->engine_forward(g, ids, nw, ctx, 0, 0, lg, err, sizeof err) == 0,
          "%s: %s", name, err);
    double mx = 0, d = 0;
    for (size_t i = 0; i < nl; i++) {
        mx = fmax(mx, fabs(en.logits[i]));
        d = max_nan(d, fabs(en.logits[i] - lg[i]));
    }
    CHECK(d <= 3e-2 * mx, "%s: GPU logits of the ppl windows differ from the CPU engine's by %g (max %g)", name, d, mx);
    printf("   %s: ppl GPU %.5f, CPU %.5f%s, reference %.5f: GPU %.2e from the reference, %.2e from the CPU; "
           "logits vs CPU %.2e\n",
           name, rg.ppl, rc.ppl, vs_ref ? "" : " (BF16 copy)", want, rd, rdc, d / mx);
    if (g) cu->engine_free(g);
    ac_engine_free(&en);
    free(lg), free(ids);
    if (!vs_ref) ac_model_free(&mb);
    ac_model_free(&m);
}

/* Whole-model perplexity of the four hybrid fixtures on the CUDA engine
 * (hybrid_ppl_gpu): M-M*-, MEM*E, E*E (F32, against the CPU engine on its
 * BF16 copy) and ME*E LatentMoE. */
static void test_gpu_hybrid_perplexity(void) {
    if (!cu) SKIP("%s", why);
    hybrid_ppl_gpu("nemotronh_bf16", 1);
    hybrid_ppl_gpu("nemotronh_moe_bf16", 1);
    hybrid_ppl_gpu("nemotronh_moe_nonorm_f32", 0);
    hybrid_ppl_gpu("nemotronh_latent_bf16", 1);
}
static void test_gpu_llama3_rope(void) { compare("llama3_rope_f32"); }
static void test_gpu_heterogeneous(void) { compare("deci_hetero"); }
static void test_gpu_mistral_sliding_window(void) { compare("mistral_sharded"); }

/* ac_perplexity with the forward and the cross-entropy on the device equals
 * the CPU engine's, in both protocols (non-overlapping batches, sliding stride). */
static void test_gpu_perplexity(void) {
    if (!cu) SKIP("%s", why);
    ac_model m;
    ac_err e;
    if (load_fixture("llama_gqa_bf16", &m)) SKIP("no fixture llama_gqa_bf16 (make fixtures)");
    int ids[60];
    for (int i = 0; i < 60; i++) ids[i] = (i * 29 + 3) % m.a.vocab;
    ac_ppl_opts modes[2] = {{.ctx = 12, .batch = 2}, {.ctx = 16, .stride = 6}};
    for (int k = 0; k < 2; k++) {
        ac_ppl_opts oc = modes[k], og = modes[k];
        og.cuda = 1;
        ac_ppl_result rc, rg;
        CHECK(ac_perplexity(&m, ids, 60, &oc, NULL, NULL, NULL, &rc, &e) == 0, "%s", e.msg);
        CHECK(ac_perplexity(&m, ids, 60, &og, NULL, NULL, NULL, &rg, &e) == 0, "%s", e.msg);
        printf("   %s: ppl GPU %.4f vs CPU %.4f (%ld and %ld targets, engine %s)\n", k ? "sliding" : "windows", rg.ppl,
               rc.ppl, rg.scored, rc.scored, rg.engine);
        CHECK(rg.scored == rc.scored && rg.windows == rc.windows && rc.scored > 0, "scored %ld vs %ld", rg.scored,
              rc.scored);
        CHECK(fabs(rg.nll - rc.nll) <= 3e-3 * rc.nll && !strcmp(rg.engine, "cuda"), "nll %g vs %g", rg.nll, rc.nll);
    }
    ac_stats st;
    memset(&st, 0, sizeof st);
    ac_ppl_opts og = modes[0];
    og.cuda = 1;
    ac_ppl_result r;
    ac_engine_hooks hk;
    ac_stats_hooks(&st, &hk);
    CHECK(ac_perplexity(&m, ids, 60, &og, &hk, NULL, NULL, &r, &e) != 0 && strstr(e.msg, "CPU engine"),
          "stats on CUDA: %s", e.msg);
    ac_model_free(&m);
}

/* The calibration stage with its loss passes on the device (one engine for
 * the source model with the masked matrix re-uploaded per point, one per
 * pruned model) gives the CPU's unit orders and loss curves within BF16
 * noise, and leaves the model's weights as they were. */
static void test_gpu_calibration(void) {
    if (!cu) SKIP("%s", why);
    ac_model m;
    ac_err e;
    if (load_fixture("deci_hetero", &m)) SKIP("no fixture deci_hetero (make fixtures)");
    int ids[128];
    for (int i = 0; i < 128; i++) ids[i] = (i * 31 + 7 + i / 5) % m.a.vocab;
    size_t nwo = (size_t)m.a.hidden * m.a.layers[0].n_heads * m.a.head_dim;
    float *wo = malloc(nwo * sizeof(float));
    memcpy(wo, m.L[0].wo, nwo * sizeof(float));
    ac_importance ic, ig;
    CHECK(ac_importance_compute(&m, ids, 128, 8, 16, 0, NULL, NULL, &ic, &e) == 0, "%s", e.msg);
    CHECK(ac_importance_compute(&m, ids, 128, 8, 16, 1, NULL, NULL, &ig, &e) == 0, "%s", e.msg);
    CHECK(memcmp(wo, m.L[0].wo, nwo * sizeof(float)) == 0, "layer 0 o_proj not restored");
    double worst = 0, largest = 0;
    for (int l = 0; l < m.a.n_layers; l++) {
        const ac_layer_arch *la = &m.a.layers[l];
        CHECK(!la->n_heads || !memcmp(ic.kv_order[l], ig.kv_order[l], sizeof(int) * la->n_kv_heads),
              "layer %d KV order", l);
        CHECK(!la->ffn || !memcmp(ic.ffn_order[l], ig.ffn_order[l], sizeof(int) * la->ffn), "layer %d FFN order", l);
        for (int p = 0; p < AC_SENS_POINTS; p++) {
            worst = fmax(worst, fabs(ic.attn_sens[l][p] - ig.attn_sens[l][p]) - 0.1 * fabs(ic.attn_sens[l][p]));
            worst = fmax(worst, fabs(ic.ffn_sens[l][p] - ig.ffn_sens[l][p]) - 0.1 * fabs(ic.ffn_sens[l][p]));
            largest = fmax(largest, fmax(ic.attn_sens[l][p], ic.ffn_sens[l][p]));
        }
        CHECK(ic.merge_n[l] == ig.merge_n[l], "layer %d merge points", l);
        for (int k = 0; k < ic.merge_n[l]; k++)
            worst = fmax(worst, fabs(ic.merge_sens[l][k] - ig.merge_sens[l][k]) - 0.1 * fabs(ic.merge_sens[l][k]));
    }
    for (int i = 0; i < 4; i++) {
        worst = fmax(worst, fabs(ic.hid_sens[i] - ig.hid_sens[i]) - 0.1 * fabs(ic.hid_sens[i]));
        largest = fmax(largest, ic.hid_sens[i]);
    }
    printf("   loss curves GPU vs CPU: worst excess over 10%% %.4f nats (largest increase %.3f)\n", worst, largest);
    CHECK(largest > 0.05, "curves too flat to compare (%g)", largest);
    CHECK(worst <= 0.01, "curves differ by %g nats beyond 10%%", worst);
    ac_importance_free(&ic);
    ac_importance_free(&ig);
    free(wo);
    ac_model_free(&m);
}

/* Calibration of the MoE fixtures with a CUDA target: the engine method
 * (the attention masks and each MoE layer's expert curve from pruned copies
 * scored on the device) against the CPU's exact one: the same KV, FFN and
 * expert orders, every curve within 10 % + 0.01 nats (test_gpu_calibration's
 * rule), the expert curves (a few thousandths of a nat on these models)
 * within 10 % + 0.001 and not flat on the device, and the method is the
 * engine's (no CPU fallback). */
static void test_gpu_calibration_moe(void) {
    if (!cu) SKIP("%s", why);
    const char *names[] = {"mixtral_f32", "qwen3moe_mixed_bf16"};
    for (int f = 0; f < 2; f++) {
        ac_model m;
        ac_err e = {{0}};
        if (load_fixture(names[f], &m)) SKIP("no fixture %s (make fixtures)", names[f]);
        int ids[128];
        for (int i = 0; i < 128; i++) ids[i] = (i * 31 + 7 + i / 5) % m.a.vocab;
        ac_importance ic, ig;
        int ok = ac_importance_compute(&m, ids, 128, 8, 16, 0, NULL, NULL, &ic, &e) == 0 &&
                 ac_importance_compute(&m, ids, 128, 8, 16, 1, NULL, NULL, &ig, &e) == 0;
        CHECK(ok, "%s: %s", names[f], e.msg);
        if (!ok) {
            ac_model_free(&m);
            continue;
        }
        double worst = 0, largest = 0, worst_x = 0, largest_g = 0;
        int orders = 0;
        for (int l = 0; l < m.a.n_layers; l++) {
            const ac_layer_arch *la = &m.a.layers[l];
            orders += la->n_heads && memcmp(ic.kv_order[l], ig.kv_order[l], sizeof(int) * la->n_kv_heads);
            orders += la->ffn && memcmp(ic.ffn_order[l], ig.ffn_order[l], sizeof(int) * la->ffn);
            orders += la->n_experts && memcmp(ic.expert_order[l], ig.expert_order[l], sizeof(int) * la->n_experts);
            for (int p = 0; p < AC_SENS_POINTS; p++) {
                worst = fmax(worst, fabs(ic.attn_sens[l][p] - ig.attn_sens[l][p]) - 0.1 * fabs(ic.attn_sens[l][p]));
                worst = fmax(worst, fabs(ic.ffn_sens[l][p] - ig.ffn_sens[l][p]) - 0.1 * fabs(ic.ffn_sens[l][p]));
                if (!la->n_experts) continue;
                largest = fmax(largest, ic.ffn_sens[l][p]), largest_g = fmax(largest_g, ig.ffn_sens[l][p]);
                worst_x = fmax(worst_x, fabs(ic.ffn_sens[l][p] - ig.ffn_sens[l][p]) - 0.1 * fabs(ic.ffn_sens[l][p]));
            }
        }
        printf("   %s: GPU method %d (CPU %d), orders differing %d, curves' worst excess over 10%% %.4f nats, "
               "expert curves' %.5f (largest point %.4f CPU, %.4f GPU)\n",
               names[f], ig.method, ic.method, orders, worst, worst_x, largest, largest_g);
        CHECK(ig.method == AC_CALIB_ENGINE, "%s: the CUDA target's method is %d", names[f], ig.method);
        CHECK(orders == 0, "%s: %d orders differ", names[f], orders);
        CHECK(largest > 0 && largest_g > 0, "%s: expert curves are flat", names[f]);
        CHECK(worst <= 0.01, "%s: curves differ by %g nats beyond 10%%", names[f], worst);
        CHECK(worst_x <= 0.001, "%s: expert curves differ by %g nats beyond 10%%", names[f], worst_x);
        ac_importance_free(&ic);
        ac_importance_free(&ig);
        ac_model_free(&m);
    }
}

/* The same calibration on the GPU from a resident model (deci_hetero saved
 * as BF16, its matrices left in the read-only mapping): each masked matrix
 * is a private BF16 copy uploaded in its dtype, each pruned model gathered
 * from the mapping, so the curves equal those from the fp32 load of the
 * same values (statistics with fp32 GEMMs on both), and every layer
 * pointer of the resident model is back where it was. */
static void test_gpu_calibration_resident(void) {
    if (!cu) SKIP("%s", why);
    ac_model m, r, f;
    ac_err e;
    if (load_fixture("deci_hetero", &m)) SKIP("no fixture deci_hetero (make fixtures)");
    char dir[] = "/tmp/ac_test_cuda_res_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    CHECK(ac_model_save(&m, dir, ST_BF16, &e) == 0, "%s", e.msg);
    CHECK(ac_model_load_resident(dir, &r, &e) == 0 && ac_model_load(dir, &f, &e) == 0, "%s", e.msg);
    CHECK(ac_model_wdt(&r) == ST_BF16, "resident dtype %d", ac_model_wdt(&r));
    int ids[128], L = r.a.n_layers;
    for (int i = 0; i < 128; i++) ids[i] = (i * 31 + 7 + i / 5) % r.a.vocab;
    float *wo[64], *wd[64];
    for (int l = 0; l < L && l < 64; l++) wo[l] = r.L[l].wo, wd[l] = r.L[l].wd;
    int rows = ac_bf16_gemm_rows();
    ac_set_bf16_gemm_rows(0);
    ac_importance ir, i_f;
    CHECK(ac_importance_compute(&r, ids, 128, 8, 16, 1, NULL, NULL, &ir, &e) == 0, "resident: %s", e.msg);
    CHECK(ac_importance_compute(&f, ids, 128, 8, 16, 1, NULL, NULL, &i_f, &e) == 0, "fp32: %s", e.msg);
    ac_set_bf16_gemm_rows(rows);
    int moved = 0, n = 0;
    for (int l = 0; l < L && l < 64; l++) moved += r.L[l].wo != wo[l] || r.L[l].wd != wd[l];
    CHECK(moved == 0, "%d layers' pointers not restored", moved);
    CHECK(ir.method == AC_CALIB_ENGINE && i_f.method == AC_CALIB_ENGINE, "methods %d %d", ir.method, i_f.method);
    int bad = imp_differences(&ir, &i_f, &r.a, 1e-6, 1e-4, &n);
    printf("   resident vs fp32 load on the device: base loss %.9f / %.9f, %d of %d values differ\n", ir.base_loss,
           i_f.base_loss, bad, n);
    CHECK(bad == 0, "%d of %d curve values or orders differ", bad, n);
    CHECK(fabs(ir.base_loss - i_f.base_loss) <= 1e-6 * i_f.base_loss, "base loss %.9f vs %.9f", ir.base_loss,
          i_f.base_loss);
    ac_importance_free(&ir);
    ac_importance_free(&i_f);
    ac_model_free(&r);
    ac_model_free(&f);
    ac_model_free(&m);
    CHECK(ck_rmtree(dir) == 0, "cleanup %s", dir);
}

/* The upload's device conversion (ac_cuda_conv_int.h) against the host's
 * (tensor.c), bit for bit: every BF16 and every F16 pattern (zeros,
 * subnormals, infinities, NaN payloads included) to fp32 (the trainer's
 * weights) and to BF16 (the engine's: F16 rounded to nearest even, BF16
 * copied); fp32 specials, rounding ties and random patterns to BF16 through
 * the staging buffer in several chunks. A few values are checked against
 * their definitions too, so a host converter bug cannot hide. */
static void test_gpu_convert(void) {
    if (!cu) SKIP("%s", why);
    size_t n = 65536, nf = 10000;
    uint16_t *h = malloc(n * 2), *b = malloc(n * 2);
    float *f = malloc(n * sizeof(float)), *src = malloc(nf * sizeof(float));
    uint32_t *fb = malloc(nf * 4);
    char err[512] = "";
    CHECK(h && b && f && src && fb, "out of memory");
    for (size_t i = 0; i < n; i++) h[i] = (uint16_t)i;
    long bad[4] = {0}, subn = 0, infs = 0, nans = 0;
    for (int k = 0; k < 2; k++) {
        int dt = k ? ST_F16 : ST_BF16;
        CHECK(cu->convert(0, f, ST_F32, h, dt, n, err, sizeof err) == 0, "%s", err);
        for (size_t i = 0; i < n; i++) {
            float want = k ? ac_f16_to_f32(h[i]) : ac_bf16_to_f32(h[i]);
            bad[k] += memcmp(&want, &f[i], 4) != 0;
            subn += fpclassify(f[i]) == FP_SUBNORMAL, infs += isinf(f[i]) != 0, nans += isnan(f[i]) != 0;
        }
        CHECK(cu->convert(0, b, ST_BF16, h, dt, n, err, sizeof err) == 0, "%s", err);
        for (size_t i = 0; i < n; i++) bad[2 + k] += b[i] != (k ? ac_f32_to_bf16(ac_f16_to_f32(h[i])) : h[i]);
    }
    printf("   device conversion of all 2 x 65,536 patterns: %ld %ld (to fp32), %ld %ld (to BF16) differ from the "
           "host's; %ld subnormal, %ld infinite, %ld NaN results\n",
           bad[0], bad[1], bad[2], bad[3], subn, infs, nans);
    CHECK(!bad[0] && !bad[1] && !bad[2] && !bad[3], "device and host conversions differ");
    /* BF16: 254 subnormals stay subnormal in fp32; NaNs 2 x 127 (BF16) + 2 x 1023 (F16); 4 infinities */
    CHECK(subn == 254 && infs == 4 && nans == 2300, "the pattern classes were not all covered");
    uint16_t def[5] = {0x0001, 0x8001, 0x7c00, 0x3c00, 0x7e01};
    float dv[5];
    CHECK(cu->convert(0, dv, ST_F32, def, ST_F16, 5, err, sizeof err) == 0, "%s", err);
    CHECK(dv[0] == ldexpf(1, -24) && dv[1] == -ldexpf(1, -24) && isinf(dv[2]) && dv[3] == 1 && isnan(dv[4]),
          "F16 definitions: %g %g %g %g %g", dv[0], dv[1], dv[2], dv[3], dv[4]);
    /* fp32 -> BF16: specials, ties, subnormals, then random patterns */
    uint32_t sp[] = {0,          0x80000000, 0x7f800000, 0xff800000, 0x7f800001, 0xffc12345, 0x00000001,
                     0x007fffff, 0x3f808000, 0x3f818000, 0x3f808001, 0x7f7fffff, 0x3f7fffff, 0x807f8000};
    unsigned seed = 12345;
    for (size_t i = 0; i < nf; i++) {
        seed = seed * 1664525u + 1013904223u;
        fb[i] = i < sizeof sp / 4 ? sp[i] : seed;
    }
    memcpy(src, fb, nf * 4);
    CHECK(cu->convert(0, b, ST_BF16, src, ST_F32, nf, err, sizeof err) == 0, "%s", err);
    long bf = 0;
    for (size_t i = 0; i < nf; i++) bf += b[i] != ac_f32_to_bf16(src[i]);
    CHECK(bf == 0, "%ld of %zu fp32 -> BF16 conversions differ from the host's", bf, nf);
    CHECK(b[8] == 0x3f80 && b[9] == 0x3f82 && b[10] == 0x3f81 && b[12] == 0x3f80, "ties: %04x %04x %04x %04x", b[8],
          b[9], b[10], b[12]);
    CHECK(cu->convert(0, f, ST_F32, src, ST_F32, nf, err, sizeof err) == 0 && !memcmp(f, src, nf * 4),
          "fp32 to fp32: %s", err);
    err[0] = 0;
    CHECK(cu->convert(0, f, ST_F32, src, ST_I32, 4, err, sizeof err) != 0 && strstr(err, "dtype"),
          "an I32 tensor accepted: '%s'", err);
    free(h);
    free(b);
    free(f);
    free(src);
    free(fb);
}

/* A resident model (matrices left in the mmap'd file, BF16 or F16) goes to
 * the plugin as it is, each tensor converted on the device; its engine and
 * trainer equal those made from the fp32 copy of the same weights bit for
 * bit (BF16/F16 -> fp32 is exact; fp32 -> BF16 rounds the same value either
 * way): logits, NLL, a layer re-uploaded in its file dtype, the trainer's
 * logits and its downloaded weights. */
static void resident_vs_f32(const char *dir, int want_dt) {
    ac_model r, f;
    ac_err e;
    if (ac_model_load_resident(dir, &r, &e)) SKIP("%s: %s", dir, e.msg);
    CHECK(ac_model_load(dir, &f, &e) == 0, "%s", e.msg);
    CHECK(ac_model_wdt(&r) == want_dt && ac_model_wdt(&f) == ST_F32, "%s: resident dtype %d, fp32 load %d", dir,
          ac_model_wdt(&r), ac_model_wdt(&f));
    int B = 2, T = 10, toks[20], tg[20];
    for (int i = 0; i < B * T; i++) toks[i] = (i * 53 + 11) % r.a.vocab;
    for (int i = 0; i < B * T; i++) tg[i] = i % T + 1 < T ? toks[i + 1] : -1;
    size_t V = r.a.vocab, nl = (size_t)B * T * V;
    float *cs = malloc(sizeof(float) * T * r.a.head_dim / 2), *sn = malloc(sizeof(float) * T * r.a.head_dim / 2);
    float *lr = malloc(sizeof(float) * nl), *lf = malloc(sizeof(float) * nl), nr[20], nf[20];
    CHECK(cs && sn && lr && lf && ac_rope_tables(&r.a, T, cs, sn, &e) == 0, "rope tables");
    acc_engine *gr = NULL, *gf = NULL;
    char err[512] = "";
    CHECK(cu->engine_create(0, &r, B, T, cs, sn, &gr, err, sizeof err) == 0, "resident: %s", err);
    CHECK(cu->engine_create(0, &f, B, T, cs, sn, &gf, err, sizeof err) == 0, "fp32: %s", err);
    int ok = gr && gf && !cu->engine_forward(gr, toks, B, T, 0, 0, lr, err, sizeof err) &&
             !cu->engine_forward(gf, toks, B, T, 0, 0, lf, err, sizeof err);
    CHECK(ok, "%s", err);
    long diff = 0;
    for (size_t i = 0; ok && i < nl; i++) diff += memcmp(&lr[i], &lf[i], 4) != 0;
    CHECK(ok && cu->engine_nll(gr, toks, tg, B, T, 0, nr, err, sizeof err) == 0 &&
              cu->engine_nll(gf, toks, tg, B, T, 0, nf, err, sizeof err) == 0,
          "%s", err);
    printf("   %s: engine logits from the resident model vs its fp32 copy: %ld of %zu differ\n", dir, diff, nl);
    CHECK(diff == 0 && !memcmp(nr, nf, sizeof nr), "resident and fp32 uploads differ");
    /* a layer's matrix re-uploaded in its file dtype (the calibration's restore) */
    size_t n;
    const float *wr = ac_layer_matrix(&r, 1, AC_W_U, &n);
    CHECK(wr && cu->engine_update(gr, 1, AC_W_U, wr, ac_model_wdt(&r), n, err, sizeof err) == 0 &&
              cu->engine_forward(gr, toks, B, T, 0, 0, lr, err, sizeof err) == 0 && !memcmp(lr, lf, nl * 4),
          "update in the file dtype: %s", err);
    cu->engine_free(gr);
    cu->engine_free(gf);
    /* the trainer: fp32 on the device from either */
    acc_trainer *tr = NULL, *tf = NULL;
    CHECK(cu->trainer_create(0, &r, B, T, cs, sn, &tr, err, sizeof err) == 0, "resident trainer: %s", err);
    CHECK(cu->trainer_create(0, &f, B, T, cs, sn, &tf, err, sizeof err) == 0, "fp32 trainer: %s", err);
    ac_model w;
    CHECK(ac_model_alloc(&w, &f.a, &e) == 0, "%s", e.msg);
    ok = tr && tf && !cu->trainer_forward(tr, toks, B, T, lr, err, sizeof err) &&
         !cu->trainer_forward(tf, toks, B, T, lf, err, sizeof err) &&
         !cu->trainer_download(tr, &w, NULL, err, sizeof err);
    CHECK(ok, "%s", err);
    long wd = 0;
    for (int l = 0; ok && l < f.a.n_layers; l++)
        for (int k = AC_W_Q; k <= AC_W_D; k++) {
            size_t a, c;
            const float *x = ac_layer_matrix(&w, l, (ac_wmat)k, &a), *y = ac_layer_matrix(&f, l, (ac_wmat)k, &c);
            wd += a != c || (x && memcmp(x, y, a * 4));
        }
    wd += ok && memcmp(w.embed, f.embed, V * f.a.hidden * 4);
    CHECK(ok && wd == 0 && !memcmp(lr, lf, nl * 4), "resident trainer: %ld tensors differ, logits %s", wd,
          ok && memcmp(lr, lf, nl * 4) ? "differ" : "equal");
    err[0] = 0;
    CHECK(ok && cu->trainer_download(tr, &r, NULL, err, sizeof err) != 0 && strstr(err, "fp32"),
          "download into the mapping: '%s'", err);
    if (tr) cu->trainer_free(tr);
    if (tf) cu->trainer_free(tf);
    ac_model_free(&w);
    free(cs);
    free(sn);
    free(lr);
    free(lf);
    ac_model_free(&r);
    ac_model_free(&f);
}

static void test_gpu_resident_bf16(void) {
    if (!cu) SKIP("%s", why);
    char dir[1024];
    ck_build_path(dir, sizeof dir, "models/tiny");
    if (!ck_exists(dir)) SKIP("no tiny model (make tiny-model)");
    resident_vs_f32(dir, ST_BF16);
}

static void test_gpu_resident_f16(void) {
    if (!cu) SKIP("%s", why);
    char dir[1024];
    ck_build_path(dir, sizeof dir, "fixtures/models/qwen2_tied_f16");
    if (!ck_exists(dir)) SKIP("no fixture qwen2_tied_f16 (make fixtures)");
    resident_vs_f32(dir, ST_F16);
}

static void no_emit(void *ud, const char *kind, json_t *data) { (void)ud, (void)kind, (void)data; }

static void fill(float *p, size_t n, unsigned *s, float scale) {
    for (size_t i = 0; i < n; i++) {
        *s = *s * 1664525u + 1013904223u;
        p[i] = ((*s >> 9) / 8388608.0f - 1.0f) * scale;
    }
}

/* A whole compression job on a local "cuda" target: calibration loss passes,
 * held-out evaluation and the on-target latency run through the CUDA
 * engine. A small random model with the tiny model's tokenizer keeps it
 * short under the emulator, which also gets a datasheet table under its
 * cache key (measuring the GPU grid there would take hours); on a real GPU
 * the job measures its table. The baseline perplexity must equal the CPU
 * engine's on the same windows. */
static void test_gpu_job(void) {
    if (!cu) SKIP("%s", why);
    char tiny[1024], tok[1100], calib[1024], held[1024], dir[] = "/tmp/ac_gpu_job_XXXXXX", path[1200];
    ck_build_path(tiny, sizeof tiny, "models/tiny");
    ck_build_path(calib, sizeof calib, "data/calib.txt");
    ck_build_path(held, sizeof held, "data/heldout.txt");
    snprintf(tok, sizeof tok, "%s/tokenizer.json", tiny);
    if (!ck_exists(tok) || !ck_exists(held)) SKIP("no tiny model (make tiny-model)");
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    ac_err e = {{0}};
    ac_arch a = {0};
    snprintf(a.model_type, sizeof a.model_type, "llama");
    a.vocab = 768;
    a.hidden = 64;
    a.head_dim = 16;
    a.n_layers = 2;
    a.max_pos = 256;
    a.eps = 1e-5f;
    a.rope_theta = 10000;
    a.bos_id = a.eos_id = -1;
    ac_layer_arch la[2] = {{4, 2, 128, 0, 0, 0}, {4, 2, 128, 0, 0, 0}};
    a.layers = la;
    ac_model m;
    CHECK(ac_model_alloc(&m, &a, &e) == 0, "%s", e.msg);
    unsigned sd = 5;
    fill(m.embed, 768 * 64, &sd, 1.0f);
    fill(m.lm_head, 768 * 64, &sd, 0.2f);
    for (int i = 0; i < 64; i++) m.final_norm[i] = 1;
    for (int l = 0; l < 2; l++) {
        ac_layer_w *w = &m.L[l];
        for (int i = 0; i < 64; i++) w->in_norm[i] = w->post_norm[i] = 1;
        fill(w->wq, 64 * 64, &sd, 0.2f);
        fill(w->wk, 32 * 64, &sd, 0.2f);
        fill(w->wv, 32 * 64, &sd, 0.2f);
        fill(w->wo, 64 * 64, &sd, 0.2f);
        fill(w->wg, 128 * 64, &sd, 0.2f);
        fill(w->wu, 128 * 64, &sd, 0.2f);
        fill(w->wd, 128 * 64, &sd, 0.2f);
    }
    snprintf(path, sizeof path, "%s/model", dir);
    CHECK(ac_model_save(&m, path, ST_BF16, &e) == 0, "%s", e.msg);
    ac_model_free(&m);
    size_t tl;
    char *tj = ac_read_file(tok, 1u << 26, &tl, &e), tokdst[1300];
    snprintf(tokdst, sizeof tokdst, "%s/tokenizer.json", path);
    FILE *f = fopen(tokdst, "wb");
    CHECK(tj && f && fwrite(tj, 1, tl, f) == tl, "copy tokenizer");
    if (f) fclose(f);
    free(tj);

    char db[1300], name[128];
    snprintf(db, sizeof db, "%s/cost.db", dir);
    double mem;
    int sms, cc;
    cu->device_info(0, name, sizeof name, &mem, &sms, &cc);
    if (!strcmp(name, "CUDA emulator (CPU)")) {
        ac_cost_table t;
        CHECK(ac_cost_roofline(ac_device_spec_find("L4"), "bf16", &t, &e) == 0, "%s", e.msg);
        ac_cost_cuda_key(name, cc, t.key, sizeof t.key);
        snprintf(t.device, sizeof t.device, "%s (L4 datasheet table)", name);
        ac_cost_cache wc;
        costcache_file(&wc, db, 1);
        CHECK(wc.put(wc.ud, &t, &e) == 0, "%s", e.msg);
        ac_cost_table_free(&t);
    }
    json_t *spec =
        json_pack("{s:s,s:s,s:s,s:s+,s:{s:s,s:{s:i,s:i,s:i}},s:{s:f},s:{s:i,s:i,s:i},s:i,s:{s:i,s:i}}", "model", path,
                  "calibration", calib, "heldout", held, "output", dir, "/out", "target", "device", "cuda", "workload",
                  "batch", 1, "prompt_len", 16, "gen_len", 4, "constraints", "max_params", 90000.0, "search", "steps",
                  30, "dnas_steps", 20, "seed", 1, "calibration_tokens", 256, "eval", "ctx", 16, "windows", 2);
    ac_cost_cache cache;
    costcache_file(&cache, db, 0);
    ac_job_ctx ctx = {.emit = no_emit, .cache = &cache, .threads = ck_threads()};
    json_t *rep = NULL;
    static ac_job_spec js;
    int rc = ac_job_spec_parse(spec, &js, NULL, &e) || ac_job_run(&js, &ctx, &rep, &e);
    CHECK(rc == 0, "job: %s", e.msg);
    if (rc == 0) {
        const char *engine = json_string_value(json_object_get(json_object_get(rep, "eval_protocol"), "engine"));
        json_t *ot = json_object_get(rep, "measured_on_target");
        double gpu_ppl = json_number_value(json_object_get(json_object_get(rep, "baseline"), "perplexity"));
        double ttft = json_number_value(json_object_get(json_object_get(ot, json_string_value(json_object_get(rep, "chosen"))), "ttft_ms"));
        CHECK(engine && !strcmp(engine, "cuda"), "evaluated on %s", engine ? engine : "?");
        CHECK(ot && ttft > 0, "no measured_on_target latency");
        /* the CPU engine on the same held-out windows */
        ac_model mb;
        int *ids = NULL;
        size_t n = 0;
        ac_ppl_result r;
        ac_ppl_opts o = {.ctx = 16, .max_windows = 2, .batch = 4};
        CHECK(ac_model_load(path, &mb, &e) == 0 && ac_load_text_ids(path, held, &ids, &n, mb.a.vocab, &e) == 0 &&
                  ac_perplexity(&mb, ids, n, &o, NULL, NULL, NULL, &r, &e) == 0,
              "%s", e.msg);
        printf("   job on cuda: baseline ppl %.3f (GPU) vs %.3f (CPU), result ttft %.3f ms on %s\n", gpu_ppl, r.ppl,
               ttft, json_string_value(json_object_get(ot, "device")));
        CHECK(fabs(gpu_ppl - r.ppl) <= 0.01 * r.ppl, "baseline ppl %g on the GPU vs %g on the CPU", gpu_ppl, r.ppl);
        free(ids);
        ac_model_free(&mb);
    }
    json_decref(rep);
    json_decref(spec);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "cleanup");
}

static void test_gemm_timings_within_roofline(void) {
    if (!cu) SKIP("%s", why);
    char name[128], err[512];
    double mem;
    int sms, cc;
    cu->device_info(0, name, sizeof name, &mem, &sms, &cc);
    const ac_device_spec *s = ac_device_spec_for_gpu(name);
    if (!s) SKIP("no datasheet profile matches %s", name);
    double us;
    CHECK(cu->time_gemm(0, 8192, 8192, 8192, &us, err, sizeof err) == 0, "%s", err);
    double tflops = 2.0 * 8192 * 8192 * 8192 / (us * 1e-6) / 1e12;
    CHECK(cu->time_gemm(0, 1, 8192, 8192, &us, err, sizeof err) == 0, "%s", err);
    double gbs = 2.0 * 8192 * 8192 / (us * 1e-6) / 1e9;
    printf("   %s: prefill-shape GEMM %.0f TFLOP/s (peak %.0f), decode-shape GEMM %.0f GB/s (peak %.0f)\n", name,
           tflops, s->bf16_tflops, gbs, s->bw_gbs);
    CHECK(tflops < 1.1 * s->bf16_tflops && tflops > 0.2 * s->bf16_tflops, "GEMM %.0f TFLOP/s vs peak %.0f", tflops,
          s->bf16_tflops);
    CHECK(gbs < 1.1 * s->bw_gbs && gbs > 0.2 * s->bw_gbs, "decode GEMM %.0f GB/s vs peak %.0f", gbs, s->bw_gbs);
}

/* #10: the plugin returns raw timings; src/cost builds the table from
 * them. Synthetic timings (a known function of the grid point) round-trip:
 * the table interpolates back the measured points, validates as JSON, and
 * a non-positive point is refused. On a real device, also the plugin's own. */
static void test_table_from_timings(void) {
    acc_timings *tm = calloc(1, sizeof *tm);
    snprintf(tm->name, sizeof tm->name, "Test GPU");
    tm->sms = 132, tm->cc = 90, tm->mem_gib = 80;
    tm->nm = 5, tm->nn = tm->nk = 4, tm->nhd = 2, tm->naq = tm->nas = 3;
    for (int i = 0; i < 5; i++) tm->gm[i] = 1 << (2 * i);
    for (int i = 0; i < 4; i++) tm->gn[i] = tm->gk[i] = 256 << i;
    for (int i = 0; i < 3; i++) tm->aq[i] = tm->as[i] = 1 << (4 * i);
    tm->ahd[0] = 64, tm->ahd[1] = 128;
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 4; b++)
            for (int c = 0; c < 4; c++) tm->gemm_us[(a * 4 + b) * 4 + c] = 3 + 1e-6 * tm->gm[a] * tm->gn[b] * tm->gk[c];
    for (int i = 0; i < 18; i++) tm->attn_us[i] = 1 + i;
    tm->launch_us = 2.5, tm->elem_ns = 0.01;
    ac_cost_table t;
    ac_err e = {{0}};
    CHECK(ac_cost_table_from_timings(tm, &t, &e) == 0, "%s", e.msg);
    double worst = 0;
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 4; b++)
            for (int c = 0; c < 4; c++) {
                double want = tm->gemm_us[(a * 4 + b) * 4 + c];
                worst = fmax(worst, fabs(ac_cost_gemm_us(&t, tm->gm[a], tm->gn[b], tm->gk[c]) - want) / want);
            }
    printf("   table from timings: key %s, grid points back within %.2e\n", t.key, worst);
    CHECK(worst < 1e-9, "grid points differ by %g", worst);
    char want[160]; /* keyed by node kind: the GPU, its compute capability, the driver (costmodel.h) */
    snprintf(want, sizeof want, "cuda:Test GPU [sm_90, driver %d]|bf16|cublas", ac_cuda_driver_version());
    CHECK(strstr(t.key, want) == t.key && t.launch_us == 2.5 && !strcmp(t.source, "measured"),
          "identity %s / launch %g / source %s", t.key, t.launch_us, t.source);
    json_t *j = ac_cost_table_to_json(&t);
    const char *field = NULL;
    CHECK(j && ac_cost_table_validate(j, &field, &e) == 0, "table JSON invalid at %s: %s", field, e.msg);
    json_decref(j);
    ac_cost_table_free(&t);
    tm->attn_us[7] = 0;
    CHECK(ac_cost_table_from_timings(tm, &t, &e) == -1 && strstr(e.msg, "point"), "a zero timing accepted");
    free(tm);
}

/* The loader refuses a library of another plugin ABI by its version: one
 * without acc_abi_version (as every plugin before version 2) says so. */
static void test_plugin_abi_check(void) {
    char w[512] = "";
    char want[64];
    snprintf(want, sizeof want, "ABI version 1, this build needs %d", ACC_ABI_VERSION);
    CHECK(ac_cuda_plugin_check("libjansson.so.4", w, sizeof w) == -1 && strstr(w, want),
          "a library without acc_abi_version: '%s'", w);
    const char *p = getenv("AC_CUDA_PLUGIN");
    if (!p || !*p) SKIP("AC_CUDA_PLUGIN not set (the emulator plugin's path)");
    CHECK(ac_cuda_plugin_check(p, w, sizeof w) == 0, "%s: %s", p, w);
}

int main(void) {
    ac_set_threads(ck_threads());
    cu = ac_cuda(&why);
    if (!cu) printf("   CUDA tests skip: %s\n", why);
    RUN(test_gpu_llama_gqa);
    RUN(test_gpu_qwen2_bias);
    RUN(test_gpu_qwen3_qk_norm);
    RUN(test_gpu_moe);
    RUN(test_gpu_hybrid);
    RUN(test_gpu_hybrid_perplexity);
    RUN(test_gpu_llama3_rope);
    RUN(test_gpu_heterogeneous);
    RUN(test_gpu_mistral_sliding_window);
    RUN(test_gpu_perplexity);
    RUN(test_gpu_convert);
    RUN(test_gpu_resident_bf16);
    RUN(test_gpu_resident_f16);
    RUN(test_gpu_calibration);
    RUN(test_gpu_calibration_resident);
    RUN(test_gpu_calibration_moe);
    RUN(test_gpu_job);
    RUN(test_gemm_timings_within_roofline);
    RUN(test_table_from_timings);
    RUN(test_plugin_abi_check);
    return DONE();
}
