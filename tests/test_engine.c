/* test_engine.c - the CPU engine against PyTorch reference logits
 * (tests/gen_fixtures.py), KV-cache decode against full forward, perplexity
 * against the reference protocol, config parsing errors. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <unistd.h>

#include "runtime/block_cpu.h"
#include "check.h"
#include "runtime/engine.h"
#include "runtime/eval.h"
#include "runtime/kernels_amx_int.h"
#include "runtime/kernels_avx512bf16.h"
#include "runtime/kernels_cpu.h"
#include "runtime/kthreads_int.h"
#include "format/model.h"
#include "search/moe_importance_int.h"
#include "runtime/rope.h"
#include "format/safetensors.h"
#include "search/slice.h"
#include "core/tensor.h"

static char fx[1024];

static int fixtures_present(void) {
    ck_build_path(fx, sizeof fx, "fixtures");
    char p[1200];
    snprintf(p, sizeof p, "%s/models/llama_gqa_bf16/config.json", fx);
    return ck_exists(p);
}

/* Compare engine logits with the reference of one fixture model, loaded as
 * fp32 (resident == 0) or with its matrices resident in the file dtype.
 * Tolerance: max |diff| <= tol * max |ref| (relative to the logit scale). */
static void check_model_ex(const char *name, int resident, double tol) {
    char dir[1200], p[1300];
    snprintf(dir, sizeof dir, "%s/models/%s", fx, name);
    ac_model m;
    ac_err e = {{0}};
    if ((resident ? ac_model_load_resident : ac_model_load)(dir, &m, &e)) {
        CHECK(0, "%s: %s", name, e.msg);
        return;
    }
    CHECK(!resident || ac_model_wdt(&m) == ST_BF16 || ac_model_wdt(&m) == ST_F16, "%s: not resident", name);
    snprintf(p, sizeof p, "%s/tokens.json", dir);
    json_t *tj = json_load_file(p, 0, NULL);
    CHECK(tj != NULL, "tokens.json");
    if (!tj) {
        ac_model_free(&m);
        return;
    }
    int B = (int)json_integer_value(json_object_get(tj, "B")), T = (int)json_integer_value(json_object_get(tj, "T"));
    int *tok = malloc(sizeof(int) * B * T);
    for (int i = 0; i < B * T; i++) tok[i] = (int)json_integer_value(json_array_get(json_object_get(tj, "ids"), i));
    json_decref(tj);
    size_t V = m.a.vocab, nlog = (size_t)B * T * V;
    float *ref = malloc(nlog * 4);
    snprintf(p, sizeof p, "%s/logits.bin", dir);
    FILE *f = fopen(p, "rb");
    CHECK(f && fread(ref, 4, nlog, f) == nlog, "logits.bin");
    if (f) fclose(f);
    ac_engine en;
    CHECK(ac_engine_init(&en, &m, B, T, &e) == 0, "%s", e.msg);
    CHECK(ac_engine_forward(&en, tok, B, T, 0, 0, &e) == 0, "%s", e.msg);
    double maxref = 0, maxdiff = 0;
    for (size_t i = 0; i < nlog; i++) {
        if (fabs(ref[i]) > maxref) maxref = fabs(ref[i]);
        if (fabs(ref[i] - en.logits[i]) > maxdiff) maxdiff = fabs(ref[i] - en.logits[i]);
    }
    CHECK(maxdiff <= tol * maxref, "%s: max diff %.3g vs max |logit| %.3g", name, maxdiff, maxref);
    printf("   %s%s: max |diff| / max |logit| = %.2e\n", name, resident ? " (resident)" : "", maxdiff / maxref);
    /* KV cache: prefill T-1 tokens, decode the last one; logits of the last
     * position must equal the full forward's. */
    int *last = malloc(sizeof(int) * B), *pre = malloc(sizeof(int) * B * (T - 1));
    for (int b = 0; b < B; b++) {
        memcpy(pre + b * (T - 1), tok + b * T, sizeof(int) * (T - 1));
        last[b] = tok[b * T + T - 1];
    }
    CHECK(ac_engine_forward(&en, pre, B, T - 1, 0, 1, &e) == 0, "%s", e.msg);
    CHECK(ac_engine_forward(&en, last, B, 1, T - 1, 1, &e) == 0, "%s", e.msg);
    double dd = 0;
    for (int b = 0; b < B; b++)
        for (size_t v = 0; v < V; v++) {
            double d = fabs(en.logits[b * V + v] - ref[((size_t)b * T + T - 1) * V + v]);
            if (d > dd) dd = d;
        }
    CHECK(dd <= tol * maxref, "%s: decode step differs by %.3g", name, dd);
    free(last);
    free(pre);
    ac_engine_free(&en);
    free(ref);
    free(tok);
    ac_model_free(&m);
}

static void check_model(const char *name) { check_model_ex(name, 0, 1e-4); }

/* Resident 16-bit matrices converted per tile (AMX off): the same fp32
 * arithmetic on the same values, so the fp32 path's tolerance holds. */
static void test_resident_exact(void) {
    if (!fixtures_present()) SKIP("no fixtures");
    ac_set_bf16_gemm_rows(0);
    check_model_ex("llama_gqa_bf16", 1, 1e-4);
    check_model_ex("qwen2_tied_f16", 1, 1e-4);
    check_model_ex("mistral_sharded", 1, 1e-4);
    ac_set_bf16_gemm_rows(32);
    /* a resident model saves as the same checkpoint: BF16 bytes copied, the
     * F32 form converted (both equal to the fp32 load's values) */
    char src[1200];
    snprintf(src, sizeof src, "%s/models/llama_gqa_bf16", fx);
    ac_model r, f, back;
    ac_err e0 = {{0}};
    if (ac_model_load_resident(src, &r, &e0) == 0 && ac_model_load(src, &f, &e0) == 0) {
        for (int dt = 0; dt < 2; dt++) {
            CHECK(ac_model_save(&r, "/tmp/ac_test_resident_save", dt ? ST_F32 : ST_BF16, &e0) == 0, "%s", e0.msg);
            CHECK(ac_model_load("/tmp/ac_test_resident_save", &back, &e0) == 0, "%s", e0.msg);
            size_t nq = (size_t)f.a.layers[1].n_heads * f.a.head_dim * f.a.hidden;
            CHECK(back.L && memcmp(back.L[1].wq, f.L[1].wq, nq * 4) == 0 &&
                      memcmp(back.embed, f.embed, (size_t)f.a.vocab * f.a.hidden * 4) == 0 &&
                      memcmp(back.L[0].in_norm, f.L[0].in_norm, (size_t)f.a.hidden * 4) == 0,
                  "resident save (%s) differs", dt ? "F32" : "BF16");
            ac_model_free(&back);
        }
        ac_model_free(&r);
        ac_model_free(&f);
        CHECK(system("rm -rf /tmp/ac_test_resident_save") == 0, "cleanup");
    } else
        CHECK(0, "%s", e0.msg);
    /* an fp32 checkpoint stays fp32 */
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/models/llama3_rope_f32", fx);
    ac_model m;
    ac_err e;
    CHECK(ac_model_load_resident(dir, &m, &e) == 0 && ac_model_wdt(&m) == ST_F32, "f32 resident");
    ac_model_free(&m);
}

/* BF16 GEMM kernels (AMX, AVX512-BF16: each this CPU has) for every row
 * count: activations are rounded to BF16 (relative error <= 2^-9 each)
 * before exact products and fp32 sums, which is what PyTorch's own BF16
 * matmul does; through the fixtures' layers this gives 4-5e-3 of the logit
 * scale, so the bound is 1e-2 (100x the fp32 one). */
static void test_resident_bf16_kernels(void) {
    if (!fixtures_present()) SKIP("no fixtures");
    int ks[2] = {AC_BF16_AMX, AC_BF16_AVX512}, ran = 0;
    char p[1200], tiny[1100], text[1200];
    snprintf(p, sizeof p, "%s/ppl.json", fx);
    json_t *ref = json_load_file(p, 0, NULL), *v = json_object_get(ref, "ctx64_stride0_win6");
    ck_build_path(tiny, sizeof tiny, "models/tiny");
    snprintf(text, sizeof text, "%s/heldout_small.txt", fx);
    snprintf(p, sizeof p, "%s/config.json", tiny);
    if (!v || !ck_exists(p)) {
        json_decref(ref);
        SKIP("no tiny model or ppl.json: the resident prefill perplexity cannot be checked (make tiny-model fixtures)");
    }
    for (int i = 0; i < 2; i++) {
        if (ac_set_bf16_kernel(ks[i])) continue;
        ran++;
        ac_set_bf16_gemm_rows(1);
        check_model_ex("llama_gqa_bf16", 1, 1e-2);
        check_model_ex("mistral_sharded", 1, 1e-2);
        ac_set_bf16_gemm_rows(32);
        /* the tiny model's perplexity with its prefill on the kernel: within
         * 0.1 % of PyTorch's fp32 reference (seen: 0.011 % on AMX) */
        ac_model m;
        ac_err e = {{0}};
        int *ids = NULL;
        size_t n = 0;
        if (ac_model_load_resident(tiny, &m, &e)) {
            CHECK(0, "tiny model: %s", e.msg);
            continue;
        }
        CHECK(ac_model_wdt(&m) == ST_BF16, "tiny model resident in BF16");
        CHECK(ac_load_text_ids(tiny, text, &ids, &n, m.a.vocab, &e) == 0, "%s", e.msg);
        ac_ppl_opts o = {.ctx = 64, .stride = 0, .max_windows = 6, .batch = 3};
        ac_ppl_result r;
        CHECK(ac_perplexity(&m, ids, n, &o, NULL, NULL, NULL, &r, &e) == 0, "%s", e.msg);
        double want = json_real_value(json_object_get(v, "ppl"));
        CHECK(fabs(r.ppl - want) / want < 1e-3, "%s prefill: ppl %.6f vs reference %.6f", ac_bf16_kernel_name(ks[i]),
              r.ppl, want);
        printf("   tiny resident, %s prefill: ppl %.4f (reference %.4f)\n", ac_bf16_kernel_name(ks[i]), r.ppl, want);
        free(ids);
        ac_model_free(&m);
    }
    ac_set_bf16_kernel(AC_BF16_AUTO);
    json_decref(ref);
    if (!ran) SKIP("no BF16 GEMM kernel on this CPU (neither AMX-BF16 nor AVX512-BF16)");
}

/* A GEMM case from seed st: activations X[N,in] in [-0.5, 0.5), BF16
 * weights Wb[out,in] and W, the same values widened (malloc'd, the
 * caller's). */
static void bf16_case(int N, int in, int out, uint32_t st, float **X, float **W, uint16_t **Wb) {
    *X = malloc(sizeof(float) * N * in);
    *W = malloc(sizeof(float) * out * in);
    *Wb = malloc(2 * (size_t)out * in);
    for (int i = 0; i < N * in; i++) (*X)[i] = ((st = st * 1664525 + 1013904223) >> 8) / 16777216.0f - 0.5f;
    for (int i = 0; i < out * in; i++) {
        (*Wb)[i] = ac_f32_to_bf16(((st = st * 1664525 + 1013904223) >> 8) / 16777216.0f - 0.5f);
        (*W)[i] = ac_bf16_to_f32((*Wb)[i]);
    }
}

/* ac_linear_w on BF16 weights against the fp32 GEMM of the same values,
 * with each kernel this CPU has (none: per-tile conversion; AMX; AVX512-
 * BF16): shapes AMX takes (in % 32, out % 16) and ones it leaves, k tails
 * (in % 32 != 0), row and column remainders of the AVX512 tiles, acc and
 * bias; and the AVX512-BF16 kernel directly against a double-precision sum
 * of the BF16-rounded activations (order only: 1e-5 relative), with the
 * same bits whether wide inputs go in k chunks (2500 in chunks of 1024,
 * every shape in chunks of 64) or in whole rows. */
static void test_linear_bf16(void) {
    int shapes[][3] = {{37, 96, 48},  {64, 64, 80},  {5, 40, 24},   {33, 64, 17},
                       {41, 200, 29}, {7, 1000, 13}, {41, 2500, 29}};
    int ks[3] = {AC_BF16_NONE, AC_BF16_AMX, AC_BF16_AVX512};
    ac_wscratch ws;
    CHECK(ac_wscratch_alloc(&ws, 64, 2500) == 0, "scratch");
    for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++) {
        int N = shapes[c][0], in = shapes[c][1], out = shapes[c][2];
        float *X, *W, *b = malloc(sizeof(float) * out);
        float *Y = malloc(sizeof(float) * N * out), *R = malloc(sizeof(float) * N * out);
        uint16_t *Wb;
        bf16_case(N, in, out, 12345 + (uint32_t)c, &X, &W, &Wb);
        for (int i = 0; i < out; i++) b[i] = (float)i / out;
        for (int ki = 0; ki < 3; ki++) {
            if (ac_set_bf16_kernel(ks[ki])) continue;
            for (int rows = 0; rows <= 2; rows++) {
                ac_set_bf16_gemm_rows(rows > 0);
                ac_kthreads_set_gemm_min_macs(rows == 2 ? 1 : 0); /* rows 2: the BF16 kernel on 2 threads */
                for (int i = 0; i < N * out; i++) Y[i] = R[i] = 1.0f;
                ac_linear_w(Y, X, Wb, ST_BF16, b, N, in, out, 1, &ws);
                ac_linear_w(R, X, W, ST_F32, b, N, in, out, 1, &ws);
                double md = 0;
                for (int i = 0; i < N * out; i++) md = fmax(md, fabs(Y[i] - R[i]));
                /* per-tile path: exact up to summation order; BF16 kernels: X in BF16, |x w| <= 0.25, in terms */
                double tol = rows && ks[ki] != AC_BF16_NONE ? in * 0.25 * 0x1p-8 : 1e-5 * fmax(1.0, in / 64.0);
                CHECK(md <= tol, "%s N=%d in=%d out=%d rows=%d: max diff %.3g > %.3g", ac_bf16_kernel_name(ks[ki]), N,
                      in, out, rows, md, tol);
            }
        }
        if (ac_avx512bf16_available()) {
            uint16_t *xp = malloc(2 * ac_avx512bf16_pack_size(N, in));
            for (int i = 0; i < N * out; i++) Y[i] = 0.5f;
            CHECK(ac_avx512bf16_linear(Y, X, Wb, b, N, in, out, 1, xp, 2) == 0, "avx512bf16 kernel refused");
            double md = 0;
            for (int r = 0; r < N; r++)
                for (int j = 0; j < out; j++) {
                    double s = 0.5 + b[j];
                    for (int k = 0; k < in; k++)
                        s += (double)ac_bf16_to_f32(ac_f32_to_bf16(X[(size_t)r * in + k])) * W[(size_t)j * in + k];
                    md = fmax(md, fabs(Y[(size_t)r * out + j] - s) / (1 + fabs(s)));
                }
            CHECK(md < 1e-5, "avx512bf16 N=%d in=%d out=%d: %.3g from the double sum of BF16 activations", N, in, out,
                  md);
            /* the same bits in k chunks of 1024 (above: one thread, these
             * shapes being below ac_kthreads_gemm's threshold), whole rows,
             * chunks of 64, and with the output columns split over 2 threads */
            float *Y2 = malloc(sizeof(float) * N * out);
            int chunks[3] = {0, 64, 1024}, same = 1;
            for (int k = 0; k < 3; k++) {
                ac_avx512bf16_set_kchunk(chunks[k]);
                ac_kthreads_set_gemm_min_macs(k == 2 ? 1 : 0);
                for (int i = 0; i < N * out; i++) Y2[i] = 0.5f;
                ac_avx512bf16_linear(Y2, X, Wb, b, N, in, out, 1, xp, 2);
                same &= !memcmp(Y, Y2, sizeof(float) * N * out);
            }
            ac_avx512bf16_set_kchunk(1024);
            ac_kthreads_set_gemm_min_macs(0);
            CHECK(same, "avx512bf16 N=%d in=%d out=%d: k chunks of 1024, whole rows, chunks of 64 and 2 threads differ",
                  N, in, out);
            free(Y2);
            free(xp);
        }
        free(X), free(W), free(b), free(Y), free(R), free(Wb);
    }
    ac_set_bf16_kernel(AC_BF16_AUTO);
    ac_set_bf16_gemm_rows(32);
    ac_kthreads_set_gemm_min_macs(0);
    ac_wscratch_free(&ws);
}

/* ac_kthreads_gemm: a thread per 2^24 multiply-adds, within the threads and
 * the shares; at least one. */
static void test_kthreads_gemm(void) {
    double m = AC_KTHREADS_GEMM_MIN_MACS;
    CHECK(ac_kthreads_gemm(2, 100, 2 * m - 1) == 1 && ac_kthreads_gemm(2, 100, 2 * m) == 2 &&
              ac_kthreads_gemm(2, 100, 0) == 1 && ac_kthreads_gemm(2, 1, 8 * m) == 1 &&
              ac_kthreads_gemm(16, 100, 5.5 * m) == 5 && ac_kthreads_gemm(64, 100, 1e12) == AC_KTHREADS_MAX &&
              ac_kthreads_gemm(0, 100, 1e12) == 1,
          "thread counts: %d %d %d %d %d %d %d", ac_kthreads_gemm(2, 100, 2 * m - 1), ac_kthreads_gemm(2, 100, 2 * m),
          ac_kthreads_gemm(2, 100, 0), ac_kthreads_gemm(2, 1, 8 * m), ac_kthreads_gemm(16, 100, 5.5 * m),
          ac_kthreads_gemm(64, 100, 1e12), ac_kthreads_gemm(0, 100, 1e12));
    ac_kthreads_set_gemm_min_macs(1);
    CHECK(ac_kthreads_gemm(2, 100, 2) == 2, "test override");
    ac_kthreads_set_gemm_min_macs(0);
    CHECK(ac_kthreads_gemm(2, 100, 2) == 1, "override reset");
}

/* The BF16 decode GEMV (ac_linear_w with N <= 8 rows below the BF16
 * kernel's rows): against a double-precision sum of the exact (widened)
 * weights times the fp32 activations, 1e-5 relative (fp32 sums in another
 * order), for 1-8 rows, inputs with 8-lane tails, bias and acc, and outputs
 * enough to split over threads (in x out >= 2^19); with BF16 GEMMs off
 * (rows 0) decode goes per tile, bit for bit sgemm's on the widened weights. */
static void test_bf16_gemv(void) {
    int shapes[][3] = {{1, 8, 3}, {2, 13, 33}, {4, 576, 190}, {8, 1000, 700}, {1, 1000, 700}, {3, 2048, 17}};
    ac_set_threads(2);
    ac_wscratch ws;
    CHECK(ac_wscratch_alloc(&ws, 8, 2048) == 0, "scratch");
    CHECK(ac_bf16_gemv_rows(1) && ac_bf16_gemv_rows(8) && !ac_bf16_gemv_rows(9), "GEMV rows at the default 32");
    for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++) {
        int N = shapes[c][0], in = shapes[c][1], out = shapes[c][2];
        float *X, *W, *b = malloc(sizeof(float) * out);
        float *Y = malloc(sizeof(float) * N * out), *R = malloc(sizeof(float) * N * out);
        uint16_t *Wb;
        bf16_case(N, in, out, 777 + (uint32_t)c, &X, &W, &Wb);
        for (int i = 0; i < out; i++) b[i] = (float)i / out - 0.25f;
        for (int mode = 0; mode < 4; mode++) { /* bit 0: acc, bit 1: bias */
            int acc = mode & 1;
            const float *bb = mode & 2 ? b : NULL;
            for (int i = 0; i < N * out; i++) Y[i] = 0.75f;
            ac_linear_w(Y, X, Wb, ST_BF16, bb, N, in, out, acc, &ws);
            double md = 0;
            for (int r = 0; r < N; r++)
                for (int j = 0; j < out; j++) {
                    double sum = (acc ? 0.75 : 0) + (bb ? bb[j] : 0);
                    for (int k = 0; k < in; k++) sum += (double)X[(size_t)r * in + k] * W[(size_t)j * in + k];
                    md = fmax(md, fabs(Y[(size_t)r * out + j] - sum) / (1 + fabs(sum)));
                }
            CHECK(md < 1e-5, "GEMV N=%d in=%d out=%d acc=%d bias=%d: %.3g from the double sum", N, in, out, acc,
                  bb != NULL, md);
        }
        /* rows 0: the per-tile path, sgemm on the widened weights bit for bit */
        ac_set_bf16_gemm_rows(0);
        CHECK(!ac_bf16_gemv_rows(1), "no GEMV with BF16 GEMMs off");
        ac_linear_w(Y, X, Wb, ST_BF16, NULL, N, in, out, 0, &ws);
        ac_linear(R, X, W, NULL, N, in, out);
        int T = (int)(ws.wtile_n / (size_t)in);
        if (T >= out)
            CHECK(!memcmp(Y, R, sizeof(float) * N * out), "per-tile N=%d in=%d out=%d differs from sgemm", N, in, out);
        ac_set_bf16_gemm_rows(32);
        free(X), free(W), free(b), free(Y), free(R), free(Wb);
    }
    ac_wscratch_free(&ws);
}

static void test_llama_gqa_bf16(void) {
    if (!fixtures_present()) SKIP("no fixtures (make fixtures)");
    check_model("llama_gqa_bf16");
}
static void test_qwen2_tied_f16(void) {
    if (!fixtures_present()) SKIP("no fixtures");
    check_model("qwen2_tied_f16");
}
/* Qwen3: q_norm / k_norm per head before RoPE, head_dim 24 with hidden 64
 * and 4 heads (q is 96 wide); fp32 and resident BF16. */
static void test_qwen3_hd_bf16(void) {
    if (!fixtures_present()) SKIP("no fixtures");
    check_model("qwen3_hd_bf16");
    check_model_ex("qwen3_hd_bf16", 1, 1e-2);
}
/* Mixture of experts against the Hugging Face semantics: Qwen3-MoE with 5
 * experts, top-2 without renormalisation and a dense layer between MoE
 * layers (mlp_only_layers), BF16 (fp32 and resident); Mixtral with 3
 * experts, top-2 renormalised, fp32. */
static void test_moe_models(void) {
    if (!fixtures_present()) SKIP("no fixtures");
    check_model("qwen3moe_mixed_bf16");
    check_model_ex("qwen3moe_mixed_bf16", 1, 1e-2);
    check_model("mixtral_f32");
    /* saved and loaded back: the family's config and tensor names, the same logits */
    const char *names[] = {"mixtral_f32", "qwen3moe_mixed_bf16"}, *types[] = {"mixtral", "qwen3_moe"};
    for (int i = 0; i < 2; i++) {
        char src[1200], dst[300], cfg[400];
        snprintf(src, sizeof src, "%s/models/%s", fx, names[i]);
        snprintf(dst, sizeof dst, "/tmp/ac_moe_rt_%d_%d", (int)getpid(), i);
        ac_model m, b;
        ac_err e = {{0}};
        CHECK(ac_model_load(src, &m, &e) == 0 && ac_model_save(&m, dst, ST_F32, &e) == 0 &&
                  ac_model_load(dst, &b, &e) == 0,
              "%s: %s", names[i], e.msg);
        snprintf(cfg, sizeof cfg, "%s/config.json", dst);
        json_t *c = json_load_file(cfg, 0, NULL);
        CHECK(c && !strcmp(json_string_value(json_object_get(c, "model_type")), types[i]), "%s config", names[i]);
        CHECK(b.a.top_k == m.a.top_k && b.a.norm_topk == m.a.norm_topk && b.a.qk_norm == m.a.qk_norm &&
                  b.a.layers[1].n_experts == m.a.layers[1].n_experts &&
                  b.a.layers[0].expert_ffn == m.a.layers[0].expert_ffn,
              "%s: arch after the round trip", names[i]);
        int toks[6] = {1, 5, 9, 33, 2, 7};
        ac_engine e1, e2;
        CHECK(ac_engine_init(&e1, &m, 1, 6, &e) == 0 && ac_engine_init(&e2, &b, 1, 6, &e) == 0, "%s", e.msg);
        CHECK(ac_engine_forward(&e1, toks, 1, 6, 0, 0, &e) == 0 && ac_engine_forward(&e2, toks, 1, 6, 0, 0, &e) == 0,
              "%s", e.msg);
        CHECK(!memcmp(e1.logits, e2.logits, sizeof(float) * 6 * m.a.vocab), "%s: logits after the round trip",
              names[i]);
        ac_engine_free(&e1), ac_engine_free(&e2);
        json_decref(c);
        ac_model_free(&m), ac_model_free(&b);
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dst);
        CHECK(system(cmd) == 0, "rm");
    }
}
/* A hybrid model saved (F32) and loaded back: the config it wrote
 * (*cfg, the caller's) and bit-identical logits on 7 tokens; then decoding
 * them one at a time from the Mamba layers' states equals the prefill.
 * Returns the prefill logits (7 x vocab, the caller's) and *mx their
 * largest magnitude. */
static float *hybrid_roundtrip_decode(const ac_model *m, const char *tag, json_t **cfg, double *mx) {
    char dst[300], p[400];
    ac_model b;
    ac_err e = {{0}};
    size_t V = (size_t)m->a.vocab;
    snprintf(dst, sizeof dst, "/tmp/ac_%s_rt_%d", tag, (int)getpid());
    CHECK(ac_model_save(m, dst, ST_F32, &e) == 0 && ac_model_load(dst, &b, &e) == 0, "%s", e.msg);
    snprintf(p, sizeof p, "%s/config.json", dst);
    *cfg = json_load_file(p, 0, NULL);
    int toks[7] = {1, 5, 9, 33, 2, 7, 250};
    ac_engine e1, e2;
    CHECK(ac_engine_init(&e1, m, 1, 7, &e) == 0 && ac_engine_init(&e2, &b, 1, 7, &e) == 0, "%s", e.msg);
    CHECK(ac_engine_forward(&e1, toks, 1, 7, 0, 0, &e) == 0 && ac_engine_forward(&e2, toks, 1, 7, 0, 0, &e) == 0,
          "%s", e.msg);
    CHECK(!memcmp(e1.logits, e2.logits, sizeof(float) * 7 * V), "%s: logits after the round trip", tag);
    float *full = malloc(sizeof(float) * 7 * V);
    memcpy(full, e1.logits, sizeof(float) * 7 * V);
    double dd = 0;
    *mx = 0;
    for (int t = 0; t < 7; t++) {
        CHECK(ac_engine_forward(&e1, toks + t, 1, 1, t, 0, &e) == 0, "%s", e.msg);
        for (size_t v = 0; v < V; v++) {
            dd = fmax(dd, fabs(e1.logits[v] - full[(size_t)t * V + v]));
            *mx = fmax(*mx, fabs(full[(size_t)t * V + v]));
        }
    }
    CHECK(dd <= 1e-5 * *mx, "%s: token-by-token decode differs by %.3g (max %.3g)", tag, dd, *mx);
    ac_engine_free(&e1), ac_engine_free(&e2);
    ac_model_free(&b);
    snprintf(p, sizeof p, "rm -rf %s", dst);
    CHECK(system(p) == 0, "rm");
    return full;
}

/* Perplexity of hybrid m through eval (windows of ppl.json's ids from
 * position 0, beside the fixture in dir) within 0.1% of tests/ref_mamba.py's. */
static void hybrid_ppl(const ac_model *m, const char *dir, const char *tag) {
    char p[1300];
    ac_err e = {{0}};
    snprintf(p, sizeof p, "%s/ppl.json", dir);
    json_t *pj = json_load_file(p, 0, NULL), *ids = json_object_get(pj, "ids");
    size_t n = json_array_size(ids);
    int *tk = malloc(sizeof(int) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) tk[i] = (int)json_integer_value(json_array_get(ids, i));
    ac_ppl_opts o = {.ctx = (int)json_integer_value(json_object_get(pj, "ctx")),
                     .max_windows = (int)json_integer_value(json_object_get(pj, "windows")),
                     .batch = 2};
    ac_ppl_result r;
    CHECK(pj && ac_perplexity(m, tk, n, &o, NULL, NULL, NULL, &r, &e) == 0, "%s: %s", tag, e.msg);
    double want = json_real_value(json_object_get(pj, "ppl"));
    CHECK(r.scored == json_integer_value(json_object_get(pj, "scored")), "%s: scored %ld", tag, r.scored);
    CHECK(fabs(r.ppl - want) / want < 1e-3, "%s: ppl %.6f vs reference %.6f", tag, r.ppl, want);
    printf("   %s: ppl %.5f (reference %.5f, %.2e relative)\n", tag, r.ppl, want, fabs(r.ppl - want) / want);
    free(tk);
    json_decref(pj);
}

/* Nemotron-H (hybrid Mamba-2 / attention without RoPE / squared-ReLU MLP,
 * pattern M-M*-, odd widths, 2 groups) against tests/ref_mamba.py's float64
 * sequential recurrence: logits fp32 and resident BF16, a decode step
 * continuing the Mamba layers' conv and SSM states, the checkpoint saved and
 * loaded back, perplexity within 0.1% of the reference; configs refused
 * with their reason. */
static void test_nemotron_h(void) {
    if (!fixtures_present()) SKIP("no fixtures");
    char dir[1200], p[1300];
    snprintf(dir, sizeof dir, "%s/models/nemotronh_bf16", fx);
    snprintf(p, sizeof p, "%s/ppl.json", dir);
    if (!ck_exists(p)) SKIP("no nemotron_h fixture (make fixtures)");
    check_model("nemotronh_bf16");
    check_model_ex("nemotronh_bf16", 1, 1e-2);
    ac_model m;
    ac_err e = {{0}};
    CHECK(ac_model_load(dir, &m, &e) == 0, "%s", e.msg);
    CHECK(m.a.hybrid && m.a.layers[0].ssm_heads == 6 && m.a.layers[1].ffn == 70 && m.a.layers[3].n_heads == 4 &&
              !m.a.layers[3].ffn && m.a.ssm_groups == 2 && m.a.ssm_state == 7 && m.a.ssm_head_dim == 5,
          "nemotron_h arch");
    /* round trip: nemotron_h's config and backbone.* names, bit-identical logits; decode */
    json_t *c;
    double mx;
    free(hybrid_roundtrip_decode(&m, "nemoh", &c, &mx));
    CHECK(c && !strcmp(json_string_value(json_object_get(c, "model_type")), "nemotron_h") &&
              !strcmp(json_string_value(json_object_get(c, "hybrid_override_pattern")), "M-M*-"),
          "nemotron_h config after the round trip");
    json_decref(c);
    hybrid_ppl(&m, dir, "nemotronh_bf16");
    ac_model_free(&m);
    /* refused with the reason */
    const char *bad[][2] = {
        {"{\"model_type\":\"nemotron_h\",\"vocab_size\":10,\"hidden_size\":8,\"num_attention_heads\":2,"
         "\"hybrid_override_pattern\":\"M*E\",\"mamba_num_heads\":2,\"mamba_head_dim\":4,\"ssm_state_size\":4,"
         "\"intermediate_size\":8}",
         "n_routed_experts"},
        {"{\"model_type\":\"nemotron_h\",\"vocab_size\":10,\"hidden_size\":8,\"num_attention_heads\":2,"
         "\"hybrid_override_pattern\":\"M-\",\"mamba_num_heads\":3,\"n_groups\":2,\"mamba_head_dim\":4,"
         "\"ssm_state_size\":4,\"intermediate_size\":8}",
         "divisible by n_groups"},
        {"{\"model_type\":\"nemotron_h\",\"vocab_size\":10,\"hidden_size\":8,\"num_attention_heads\":2,"
         "\"hybrid_override_pattern\":\"M-\",\"mamba_num_heads\":2,\"mamba_head_dim\":4,\"ssm_state_size\":4,"
         "\"intermediate_size\":8,\"num_hidden_layers\":3}",
         "num_hidden_layers says 3"},
        {"{\"model_type\":\"nemotron_h\",\"vocab_size\":10,\"hidden_size\":8,\"num_attention_heads\":2,"
         "\"hybrid_override_pattern\":\"M-\",\"mamba_num_heads\":2,\"mamba_head_dim\":4,\"ssm_state_size\":4,"
         "\"intermediate_size\":8,\"mlp_hidden_act\":\"silu\"}",
         "relu2"},
        /* MoE (E) layers */
        {"{\"model_type\":\"nemotron_h\",\"vocab_size\":10,\"hidden_size\":8,\"num_attention_heads\":2,"
         "\"hybrid_override_pattern\":\"E*\",\"n_routed_experts\":4,\"num_experts_per_tok\":2,"
         "\"moe_intermediate_size\":8,\"moe_shared_expert_intermediate_size\":8,\"moe_latent_size\":16}",
         "moe_latent_size 16 must be 1..hidden_size (8)"},
        {"{\"model_type\":\"nemotron_h\",\"vocab_size\":10,\"hidden_size\":8,\"num_attention_heads\":2,"
         "\"hybrid_override_pattern\":\"E*\",\"n_routed_experts\":4,\"num_experts_per_tok\":2,"
         "\"moe_intermediate_size\":8,\"moe_shared_expert_intermediate_size\":8,\"n_group\":2,\"topk_group\":1}",
         "group-limited"},
        {"{\"model_type\":\"nemotron_h\",\"vocab_size\":10,\"hidden_size\":8,\"num_attention_heads\":2,"
         "\"hybrid_override_pattern\":\"E*\",\"n_routed_experts\":4,\"num_experts_per_tok\":5,"
         "\"moe_intermediate_size\":8,\"moe_shared_expert_intermediate_size\":8}",
         "num_experts_per_tok 5"},
        {"{\"model_type\":\"nemotron_h\",\"vocab_size\":10,\"hidden_size\":8,\"num_attention_heads\":2,"
         "\"hybrid_override_pattern\":\"E*\",\"n_routed_experts\":4,\"num_experts_per_tok\":2,"
         "\"moe_intermediate_size\":8,\"moe_shared_expert_intermediate_size\":8,\"n_shared_experts\":2}",
         "n_shared_experts 2"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        json_t *cj = json_loads(bad[i][0], 0, NULL);
        ac_arch a;
        ac_err e2 = {{0}};
        CHECK(cj && ac_arch_from_config(cj, &a, &e2) != 0 && strstr(e2.msg, bad[i][1]), "config %zu: %s", i,
              e2.msg);
        json_decref(cj);
    }
}
/* The parameters a checkpoint's safetensors hold (every tensor's elements). */
static double checkpoint_params(const char *dir) {
    st_set ss;
    ac_err e = {{0}};
    double n = 0;
    if (st_set_open(dir, &ss, &e)) return -1;
    for (int f = 0; f < ss.n; f++)
        for (int t = 0; t < ss.files[f].n; t++) {
            double c = 1;
            for (int d = 0; d < ss.files[f].t[t].ndim; d++) c *= (double)ss.files[f].t[t].shape[d];
            n += c;
        }
    st_set_close(&ss);
    return n;
}

/* Nemotron-H MoE (E layers: the sigmoid router with its score-correction
 * bias, squared-ReLU experts, a shared expert, routed scaling) against
 * tests/ref_mamba.py in float64: nemotronh_moe_bf16 (MEM*E, top-2
 * renormalised, scale 2.5) fp32 and resident, nemotronh_moe_nonorm_f32
 * (E*E, top-3 not renormalised, the config's defaults); token-by-token
 * decode equal to the prefill; the save round trip (config keys, the bias
 * kept fp32, logits bit-identical); and the checks that make the fixture
 * fail when the bias or the scale were ignored; LatentMoE
 * (nemotronh_latent_bf16: ME*E, latent 24 beside hidden 40) likewise (the
 * refused configs are test_nemotron_h's; gradients are test_train's). */
static void test_nemotron_h_moe(void) {
    if (!fixtures_present()) SKIP("no fixtures");
    char dir[1200], p[1300], dst[300];
    snprintf(dir, sizeof dir, "%s/models/nemotronh_moe_bf16", fx);
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (!ck_exists(p)) SKIP("no nemotron_h MoE fixture (make fixtures)");
    check_model("nemotronh_moe_bf16");
    check_model_ex("nemotronh_moe_bf16", 1, 1e-2);
    check_model("nemotronh_moe_nonorm_f32");
    ac_model m;
    ac_err e = {{0}};
    CHECK(ac_model_load(dir, &m, &e) == 0, "%s", e.msg);
    CHECK(m.a.hybrid && m.a.router_sigmoid && m.a.layers[1].n_experts == 6 && m.a.layers[1].expert_ffn == 24 &&
              m.a.shared_ffn == 36 && m.a.top_k == 2 && m.a.norm_topk && fabsf(m.a.routed_scale - 2.5f) < 1e-6 &&
              m.a.layers[0].ssm_heads && m.a.layers[3].n_heads && !m.a.layers[3].n_experts && m.L[1].router_bias &&
              !m.L[1].eg[0],
          "nemotron_h MoE arch");
    CHECK(ac_arch_params(&m.a) == checkpoint_params(dir), "nemotron_h MoE params %.0f, the checkpoint holds %.0f",
          ac_arch_params(&m.a), checkpoint_params(dir));
    hybrid_ppl(&m, dir, "nemotronh_moe_bf16");
    /* round trip: E in the pattern, the MoE keys; bit-identical logits; decode */
    json_t *c;
    double mx;
    float *full = hybrid_roundtrip_decode(&m, "nemoh_moe", &c, &mx);
    CHECK(c && !strcmp(json_string_value(json_object_get(c, "hybrid_override_pattern")), "MEM*E") &&
              json_integer_value(json_object_get(c, "n_routed_experts")) == 6 &&
              json_integer_value(json_object_get(c, "moe_shared_expert_intermediate_size")) == 36 &&
              json_real_value(json_object_get(c, "routed_scaling_factor")) == 2.5 &&
              json_is_true(json_object_get(c, "norm_topk_prob")),
          "nemotron_h MoE config after the round trip");
    json_decref(c);
    int toks[7] = {1, 5, 9, 33, 2, 7, 250};
    ac_engine e1;
    CHECK(ac_engine_init(&e1, &m, 1, 7, &e) == 0, "%s", e.msg);
    /* the reference would catch an engine that ignored the bias or the scale: each changes the logits */
    for (int k = 0; k < 2; k++) {
        float *bias0 = m.L[1].router_bias, scale0 = m.a.routed_scale;
        if (k == 0) m.L[1].router_bias = NULL;
        if (k == 1) m.a.routed_scale = 1;
        CHECK(ac_engine_forward(&e1, toks, 1, 7, 0, 0, &e) == 0, "%s", e.msg);
        double d = 0;
        for (size_t i = 0; i < (size_t)7 * m.a.vocab; i++) d = fmax(d, fabs(e1.logits[i] - full[i]));
        CHECK(d > 1e-3 * mx, "nemotron_h MoE: without the %s the logits move only %.3g", k ? "scale" : "bias", d);
        m.L[1].router_bias = bias0, m.a.routed_scale = scale0;
    }
    ac_engine_free(&e1);
    free(full);
    /* a BF16 save keeps the correction bias F32, as Hugging Face does */
    snprintf(dst, sizeof dst, "/tmp/ac_nemoh_moe_bf16_%d", (int)getpid());
    CHECK(ac_model_save(&m, dst, ST_BF16, &e) == 0, "%s", e.msg);
    {
        st_set ss;
        CHECK(st_set_open(dst, &ss, &e) == 0, "%s", e.msg);
        const st_tensor *bt = st_set_find(&ss, "backbone.layers.1.mixer.gate.e_score_correction_bias"),
                        *ut = st_set_find(&ss, "backbone.layers.1.mixer.experts.5.up_proj.weight");
        CHECK(bt && bt->dtype == ST_F32 && ut && ut->dtype == ST_BF16 && !memcmp(bt->data, m.L[1].router_bias, 6 * 4),
              "nemotron_h MoE BF16 save: bias F32 and exact, experts BF16");
        st_set_close(&ss);
    }
    snprintf(p, sizeof p, "rm -rf %s", dst);
    CHECK(system(p) == 0, "rm");
    ac_model_free(&m);
    /* LatentMoE (Nemotron 3 Super): nemotronh_latent_bf16 (ME*E, latent 24 beside hidden 40) */
    snprintf(dir, sizeof dir, "%s/models/nemotronh_latent_bf16", fx);
    check_model("nemotronh_latent_bf16");
    check_model_ex("nemotronh_latent_bf16", 1, 1e-2);
    CHECK(ac_model_load(dir, &m, &e) == 0, "%s", e.msg);
    CHECK(m.a.moe_latent == 24 && m.L[1].lat_down && m.L[3].lat_up && ac_block_dim(&m.a, 1, AC_DIM_LT) == 24 &&
              ac_block_dim(&m.a, 0, AC_DIM_LT) == 0,
          "LatentMoE arch");
    CHECK(ac_arch_params(&m.a) == checkpoint_params(dir), "LatentMoE params %.0f, the checkpoint holds %.0f",
          ac_arch_params(&m.a), checkpoint_params(dir));
    hybrid_ppl(&m, dir, "nemotronh_latent_bf16");
    free(hybrid_roundtrip_decode(&m, "nemoh_latent", &c, &mx));
    CHECK(c && json_integer_value(json_object_get(c, "moe_latent_size")) == 24, "LatentMoE config after the round trip");
    json_decref(c);
    /* ac_model_make_bf16 on the fp32 load (its values BF16-exact) runs as the resident load does, bit for bit */
    {
        ac_model r;
        ac_engine e1, e2;
        int toks[7] = {1, 5, 9, 33, 2, 7, 250};
        CHECK(ac_model_load_resident(dir, &r, &e) == 0 && ac_model_make_bf16(&m, &e) == 0 && m.wown &&
                  ac_model_wdt(&m) == ST_BF16,
              "%s", e.msg);
        CHECK(ac_engine_init(&e1, &m, 1, 7, &e) == 0 && ac_engine_init(&e2, &r, 1, 7, &e) == 0, "%s", e.msg);
        CHECK(ac_engine_forward(&e1, toks, 1, 7, 0, 0, &e) == 0 && ac_engine_forward(&e2, toks, 1, 7, 0, 0, &e) == 0,
              "%s", e.msg);
        CHECK(!memcmp(e1.logits, e2.logits, sizeof(float) * 7 * m.a.vocab), "LatentMoE: make_bf16 vs resident logits");
        ac_engine_free(&e1), ac_engine_free(&e2);
        ac_model_free(&r);
    }
    ac_model_free(&m);
}
/* Logits of m over B sequences of n tokens with experts removed from the
 * routing by masks (emask[l][E], NULL: none), through the block executor
 * (what calibration simulates), final norm and head in fp32. */
static void masked_logits(const ac_model *m, float *const *emask, const int *tok, int B, int n, float *logits) {
    const ac_arch *a = &m->a;
    int N = B * n, H = a->hidden, E = ac_block_dim_max(a, AC_DIM_E), pos[64], rows[64];
    float *slot[AC_T_COUNT], *cs = malloc(sizeof(float) * n * a->head_dim),
                             *sn = malloc(sizeof(float) * n * a->head_dim), *sc = malloc(sizeof(float) * n * n),
                             *xn = malloc(sizeof(float) * N * H);
    for (int t = 0; t < AC_T_COUNT; t++)
        slot[t] = calloc((size_t)N * ac_block_dim_max(a, (ac_dim)ac_block_slot_dim(t)) + 1, sizeof(float));
    ac_err e;
    ac_rope_tables(a, n, cs, sn, &e);
    for (int r = 0; r < N; r++) {
        pos[r] = r % n;
        memcpy(slot[AC_T_X] + (size_t)r * H, m->embed + (size_t)tok[r] * H, sizeof(float) * H);
    }
    (void)E;
    for (int l = 0; l < a->n_layers; l++) {
        ac_block_mod mod = {.expert_mask = emask[l]};
        ac_block_cpu c = {.m = m, .pos = pos, .cos_t = cs, .sin_t = sn, .scores = sc, .rows = rows, .mod = &mod};
        memcpy(c.slot, slot, sizeof slot);
        ac_block_cpu_forward(&c, l, B, n, 0);
    }
    ac_rmsnorm(xn, slot[AC_T_X], m->final_norm, N, H, a->eps);
    ac_linear(logits, xn, m->lm_head, NULL, N, H, a->vocab);
    for (int t = 0; t < AC_T_COUNT; t++) free(slot[t]);
    free(cs), free(sn), free(sc), free(xn);
}

/* Experts ranked by their router-weighted output on calibration tokens, the
 * least important removed by ac_prune: the pruned model (router rows of the
 * kept experts, so softmax, top-k and renormalisation run over them alone)
 * equals the full model with the removed experts masked out of the routing. */
static void test_moe_prune_experts(void) {
    if (!fixtures_present()) SKIP("no fixtures");
    const char *names[] = {"mixtral_f32", "qwen3moe_mixed_bf16"};
    for (int f = 0; f < 2; f++) {
        char dir[1200];
        snprintf(dir, sizeof dir, "%s/models/%s", fx, names[f]);
        ac_model m, pm;
        ac_err e = {{0}};
        if (ac_model_load(dir, &m, &e)) {
            CHECK(0, "%s: %s", names[f], e.msg);
            continue;
        }
        const ac_arch *a = &m.a;
        int L = a->n_layers, B = 2, n = 9, ids[64], calib[4 * 11];
        unsigned rng = 5;
        for (int i = 0; i < 4 * 11; i++) calib[i] = (int)((rng = rng * 1664525u + 1013904223u) >> 8) % a->vocab;
        for (int i = 0; i < B * n; i++) ids[i] = (int)((rng = rng * 1664525u + 1013904223u) >> 8) % a->vocab;
        ac_importance imp = {0}; /* identity orders but for the experts */
        imp.n_layers = L;
        imp.hid_order = malloc(sizeof(int) * a->hidden);
        imp.kv_order = calloc(L, sizeof(int *)), imp.ffn_order = calloc(L, sizeof(int *));
        imp.kv_score = calloc(L, sizeof(double *)), imp.ffn_score = calloc(L, sizeof(double *));
        for (int c = 0; c < a->hidden; c++) imp.hid_order[c] = c;
        for (int l = 0; l < L; l++) {
            imp.kv_order[l] = malloc(sizeof(int) * (a->layers[l].n_kv_heads + 1));
            imp.ffn_order[l] = malloc(sizeof(int) * (a->layers[l].ffn + 1));
            for (int k = 0; k < a->layers[l].n_kv_heads; k++) imp.kv_order[l][k] = k;
            for (int k = 0; k < a->layers[l].ffn; k++) imp.ffn_order[l][k] = k;
        }
        CHECK(ac_expert_importance(&m, calib, 4 * 11, 11, 4, &imp, &e) == 0, "%s", e.msg);
        ac_arch t;
        CHECK(ac_arch_copy(&t, a, &e) == 0, "%s", e.msg);
        float *mask[8] = {0};
        for (int l = 0; l < L; l++) {
            int E = a->layers[l].n_experts;
            if (!E) continue;
            int seen[8] = {0}, ok = 1;
            for (int j = 0; j < E; j++) ok &= !seen[imp.expert_order[l][j]]++;
            for (int j = 0; j + 1 < E; j++)
                ok &= imp.expert_score[l][imp.expert_order[l][j]] >= imp.expert_score[l][imp.expert_order[l][j + 1]];
            CHECK(ok && imp.expert_score[l][imp.expert_order[l][0]] > 0, "%s layer %d: expert order", names[f], l);
            t.layers[l].n_experts = E - 1;
            mask[l] = calloc(E, sizeof(float));
            for (int j = 0; j < E - 1; j++) mask[l][imp.expert_order[l][j]] = 1;
        }
        CHECK(ac_prune(&m, &t, &imp, &pm, &e) == 0, "%s: %s", names[f], e.msg);
        float *want = malloc(sizeof(float) * B * n * a->vocab);
        masked_logits(&m, mask, ids, B, n, want);
        ac_engine en;
        CHECK(ac_engine_init(&en, &pm, B, n, &e) == 0 && ac_engine_forward(&en, ids, B, n, 0, 0, &e) == 0, "%s", e.msg);
        double md = 0, mr = 0;
        for (size_t i = 0; i < (size_t)B * n * a->vocab; i++)
            md = fmax(md, fabs(want[i] - en.logits[i])), mr = fmax(mr, fabs(want[i]));
        printf("   %s: one expert of each MoE layer removed: pruned vs masked logits %.2e (relative)\n", names[f],
               md / mr);
        CHECK(md <= 1e-5 * mr, "%s: pruned model differs from the masked one by %g of %g", names[f], md, mr);
        /* the masks change the model: removing an expert is not a no-op */
        float *full = malloc(sizeof(float) * B * n * a->vocab), *none[8] = {0};
        masked_logits(&m, none, ids, B, n, full);
        double dd = 0;
        for (size_t i = 0; i < (size_t)B * n * a->vocab; i++) dd = fmax(dd, fabs(full[i] - want[i]));
        CHECK(dd > 1e-4 * mr, "%s: removing experts changed nothing", names[f]);
        ac_engine_free(&en);
        free(want), free(full);
        for (int l = 0; l < L; l++) free(mask[l]);
        ac_arch_free(&t);
        ac_model_free(&pm);
        ac_importance_free(&imp);
        ac_model_free(&m);
    }
}

static void test_llama3_rope_f32(void) {
    if (!fixtures_present()) SKIP("no fixtures");
    check_model("llama3_rope_f32");
}
static void test_mistral_sharded(void) {
    if (!fixtures_present()) SKIP("no fixtures");
    check_model("mistral_sharded");
}
static void test_deci_heterogeneous(void) {
    if (!fixtures_present()) SKIP("no fixtures");
    check_model("deci_hetero");
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/models/deci_hetero", fx);
    ac_arch a;
    ac_err e;
    CHECK(ac_arch_load(dir, &a, &e) == 0, "%s", e.msg);
    if (a.layers) {
        CHECK(a.layers[1].n_heads == 0 && a.layers[2].n_heads == 2 && a.layers[2].n_kv_heads == 2 &&
                  a.layers[3].ffn == 0 && a.layers[0].n_kv_heads == 2 && a.layers[1].ffn == 96,
              "per-layer shapes");
        CHECK(!ac_arch_is_uniform(&a), "uniform?");
        ac_arch_free(&a);
    }
}

static void test_save_reload_roundtrip(void) {
    if (!fixtures_present()) SKIP("no fixtures");
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/models/deci_hetero", fx);
    ac_model m, m2;
    ac_err e;
    CHECK(ac_model_load(dir, &m, &e) == 0, "%s", e.msg);
    CHECK(ac_model_save(&m, "/tmp/ac_test_roundtrip", 11 /* ST_F32 */, &e) == 0, "%s", e.msg);
    CHECK(ac_model_load("/tmp/ac_test_roundtrip", &m2, &e) == 0, "%s", e.msg);
    if (m2.L) {
        CHECK(m2.a.n_layers == 4 && m2.a.layers[1].n_heads == 0 && m2.a.layers[3].ffn == 0, "arch");
        CHECK(memcmp(m.L[2].wq, m2.L[2].wq, sizeof(float) * 2 * 16 * 64) == 0, "weights");
        ac_model_free(&m2);
    }
    ac_model_free(&m);
    CHECK(system("rm -rf /tmp/ac_test_roundtrip") == 0, "cleanup");
}

/* v[0..n) scaled by 1 + 2^-11 (so that no element is a BF16 value, unless 0). */
static void nudge(float *v, size_t n) {
    for (size_t i = 0; v && i < n; i++) v[i] *= 1.0f + 1.0f / 2048;
}

/* Every fp32 vector of m nudged off the BF16 grid (the router correction bias too). */
static void nudge_vectors(ac_model *m) {
    const ac_arch *a = &m->a;
    size_t H = a->hidden, hd = a->head_dim;
    nudge(m->final_norm, H);
    for (int l = 0; l < a->n_layers; l++) {
        const ac_layer_arch *L = &a->layers[l];
        ac_layer_w *w = &m->L[l];
        nudge(w->in_norm, H), nudge(w->post_norm, H), nudge(w->q_norm, hd), nudge(w->k_norm, hd);
        nudge(w->bq, (size_t)L->n_heads * hd), nudge(w->bk, (size_t)L->n_kv_heads * hd);
        nudge(w->bv, (size_t)L->n_kv_heads * hd), nudge(w->router_bias, L->n_experts);
        if (L->ssm_heads) {
            size_t C = ac_ssm_conv_dim(a, l), nh = L->ssm_heads;
            nudge(w->conv_w, C * a->ssm_conv), nudge(w->conv_b, C), nudge(w->dt_bias, nh), nudge(w->a_log, nh);
            nudge(w->ssm_d, nh), nudge(w->ssm_norm, ac_ssm_inner(a, l));
        }
    }
}

/* Logits of m and of its BF16 export (ac_model_save, loaded back resident: the same BF16 kernels) on 7 tokens:
 * 1 when bit-identical. */
static int same_as_export(const ac_model *m, const char *tag) {
    char dst[300];
    ac_model b;
    ac_err e = {{0}};
    snprintf(dst, sizeof dst, "/tmp/ac_%s_rv_%d", tag, (int)getpid());
    int toks[7] = {1, 5, 9, 33, 2, 7, 250}, same = 0;
    if (ac_model_save(m, dst, ST_BF16, &e) || ac_model_load_resident(dst, &b, &e)) {
        CHECK(0, "%s: %s", tag, e.msg);
        return 0;
    }
    ac_engine e1, e2;
    CHECK(ac_engine_init(&e1, m, 1, 7, &e) == 0 && ac_engine_init(&e2, &b, 1, 7, &e) == 0, "%s", e.msg);
    CHECK(ac_engine_forward(&e1, toks, 1, 7, 0, 0, &e) == 0 && ac_engine_forward(&e2, toks, 1, 7, 0, 0, &e) == 0,
          "%s", e.msg);
    same = !memcmp(e1.logits, e2.logits, sizeof(float) * 7 * m->a.vocab);
    ac_engine_free(&e1), ac_engine_free(&e2);
    ac_model_free(&b);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dst);
    CHECK(system(cmd) == 0, "rm");
    return same;
}

/* A BF16 student whose vectors were rounded by ac_model_round_vectors (what a job does to its students when they
 * are finished) computes bit for bit what its BF16 export computes, on a dense model with attention biases, one
 * with QK norms, a hybrid (M-M*-), a hybrid MoE (E*E) and a LatentMoE one with Mamba layers (ME*E), every vector first moved off the BF16 grid; the correction bias stays
 * fp32 as the export keeps it. The same student not rounded computes something else (the job's report then
 * described another model than its export). */
static void test_round_vectors_is_export(void) {
    if (!fixtures_present()) SKIP("no fixtures");
    static const char *names[] = {"qwen2_tied_f16", "qwen3_hd_bf16", "nemotronh_bf16", "nemotronh_moe_nonorm_f32",
                                  "nemotronh_latent_bf16"};
    for (int i = 0; i < 5; i++) {
        char dir[1200];
        snprintf(dir, sizeof dir, "%s/models/%s", fx, names[i]);
        ac_model m, raw;
        ac_err e = {{0}};
        if (ac_model_load(dir, &m, &e) || ac_model_load(dir, &raw, &e)) {
            CHECK(0, "%s: %s", names[i], e.msg);
            continue;
        }
        nudge_vectors(&m), nudge_vectors(&raw);
        int moe = 0;
        float rb[64];
        for (int l = 0; l < m.a.n_layers; l++)
            if (m.L[l].router_bias && m.a.layers[l].n_experts <= 64) {
                memcpy(rb, m.L[l].router_bias, sizeof(float) * m.a.layers[l].n_experts);
                moe = l + 1;
            }
        ac_model_round_vectors(&m, ST_BF16);
        CHECK(!moe || !memcmp(rb, m.L[moe - 1].router_bias, sizeof(float) * m.a.layers[moe - 1].n_experts),
              "%s: the correction bias stays fp32", names[i]);
        CHECK(ac_model_make_bf16(&m, &e) == 0 && ac_model_make_bf16(&raw, &e) == 0, "%s", e.msg);
        CHECK(same_as_export(&m, names[i]), "%s: the rounded student computes what its export computes", names[i]);
        CHECK(!same_as_export(&raw, names[i]), "%s: without the rounding the export computes the same (no test)",
              names[i]);
        ac_model_free(&m), ac_model_free(&raw);
    }
}

static void test_config_errors(void) {
    const char *bad[] = {
        "{\"model_type\":\"gpt2\",\"vocab_size\":10}",
        "{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":"
        "3,\"num_key_value_heads\":2,\"intermediate_size\":4}",
        "{\"model_type\":\"llama\",\"vocab_size\":\"x\"}",
        "{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":"
        "2,\"intermediate_size\":4,\"rope_scaling\":{\"type\":\"yarn\"}}",
        "{\"model_type\":\"nemotron-nas\",\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":2,\"num_attention_"
        "heads\":2,\"intermediate_size\":4}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        json_t *j = json_loads(bad[i], 0, NULL);
        ac_arch a;
        ac_err e = {{0}};
        CHECK(j && ac_arch_from_config(j, &a, &e) != 0 && e.msg[0], "config %zu accepted", i);
        json_decref(j);
    }
    /* defaults: kv heads = heads, head_dim = hidden/heads, rope_parameters form */
    json_t *j =
        json_loads("{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":1,\"num_"
                   "attention_heads\":2,"
                   "\"intermediate_size\":4,\"rope_parameters\":{\"rope_theta\":500000.0,\"rope_type\":\"default\"}}",
                   0, NULL);
    ac_arch a;
    ac_err e;
    CHECK(ac_arch_from_config(j, &a, &e) == 0, "%s", e.msg);
    CHECK(a.layers[0].n_kv_heads == 2 && a.head_dim == 4 && a.rope_theta == 500000.0f && fabsf(a.eps - 1e-6f) < 1e-12f,
          "defaults");
    ac_arch_free(&a);
    json_decref(j);
}

static void test_perplexity_matches_reference(void) {
    if (!fixtures_present()) SKIP("no fixtures");
    char p[1200];
    snprintf(p, sizeof p, "%s/ppl.json", fx);
    json_t *ref = json_load_file(p, 0, NULL);
    if (!ref) SKIP("no ppl.json (tiny model not built)");
    char tiny[1100], text[1200];
    ck_build_path(tiny, sizeof tiny, "models/tiny");
    snprintf(text, sizeof text, "%s/heldout_small.txt", fx);
    ac_model m;
    ac_err e = {{0}};
    int *ids = NULL;
    size_t n;
    CHECK(ac_model_load(tiny, &m, &e) == 0, "%s", e.msg);
    CHECK(ac_load_text_ids(tiny, text, &ids, &n, m.a.vocab, &e) == 0, "%s", e.msg);
    const char *k;
    json_t *v;
    json_object_foreach(ref, k, v) {
        ac_ppl_opts o = {.ctx = (int)json_integer_value(json_object_get(v, "ctx")),
                         .stride = (int)json_integer_value(json_object_get(v, "stride")),
                         .max_windows = (int)json_integer_value(json_object_get(v, "windows")),
                         .batch = 3};
        ac_ppl_result r;
        CHECK(ac_perplexity(&m, ids, n, &o, NULL, NULL, NULL, &r, &e) == 0, "%s", e.msg);
        double want = json_real_value(json_object_get(v, "ppl"));
        CHECK(r.scored == json_integer_value(json_object_get(v, "scored")), "%s: scored %ld", k, r.scored);
        CHECK(fabs(r.ppl - want) / want < 1e-4, "%s: ppl %.6f vs reference %.6f", k, r.ppl, want);
        printf("   %s: ppl %.4f (reference %.4f)\n", k, r.ppl, want);
    }
    free(ids);
    ac_model_free(&m);
    json_decref(ref);
}

int main(void) {
    ac_set_threads(ck_threads());
    RUN(test_llama_gqa_bf16);
    RUN(test_qwen2_tied_f16);
    RUN(test_qwen3_hd_bf16);
    RUN(test_moe_models);
    RUN(test_moe_prune_experts);
    RUN(test_llama3_rope_f32);
    RUN(test_mistral_sharded);
    RUN(test_deci_heterogeneous);
    RUN(test_resident_exact);
    RUN(test_resident_bf16_kernels);
    RUN(test_linear_bf16);
    RUN(test_kthreads_gemm);
    RUN(test_bf16_gemv);
    RUN(test_save_reload_roundtrip);
    RUN(test_round_vectors_is_export);
    RUN(test_config_errors);
    RUN(test_perplexity_matches_reference);
    RUN(test_nemotron_h);
    RUN(test_nemotron_h_moe);
    return DONE();
}
