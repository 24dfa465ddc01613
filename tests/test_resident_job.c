/*
 * test_resident_job.c - the job pipeline on resident (BF16-mapped) weights
 * against the same weights loaded as fp32 (issue 16): per-layer fp32
 * copies, the fp32 copy for trainers, the frozen-weight (gate) trainer on
 * the mapping, ac_prune from the mapping, streamed
 * calibration, the GGUF export, and a whole
 * compression job whose export must be byte-identical.
 *
 * Reference: the tiny model (BF16 safetensors) saved once as an F32
 * checkpoint. BF16 -> fp32 widening is exact, so the F32 checkpoint holds
 * the very values the resident model maps; every GEMM is asked to be fp32
 * (ac_set_bf16_gemm_rows(0): no AMX rounding of activations), so a pipeline
 * that reads the mapping through conversions per row, tile, layer or tensor
 * must produce the same bytes as the fp32 pipeline.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "eval.h"
#include "fsafe.h"
#include "gguf.h"
#include "importance.h"
#include "job.h"
#include "jobspec.h"
#include "kernels_cpu.h"
#include "model.h"
#include "prune.h"
#include "safetensors.h"
#include "synth.h"
#include "train.h"

static char tiny[1100], f32dir[256] = "/tmp/ac_test_resident_job";

static int have_tiny(void) {
    char p[1200];
    snprintf(p, sizeof p, "%s/model.safetensors", tiny);
    return ck_exists(p);
}

static int copy_file(const char *from, const char *to) {
    ac_err e;
    size_t len;
    char *d = ac_read_file(from, 1 << 26, &len, &e);
    FILE *f = d ? fopen(to, "wb") : NULL;
    int ok = f && fwrite(d, 1, len, f) == len;
    if (f) ok = fclose(f) == 0 && ok;
    free(d);
    return ok ? 0 : -1;
}

/* 1 when the two files hold the same bytes. */
static int same_bytes(const char *a, const char *b, size_t *len) {
    ac_err e;
    size_t la = 0, lb = 0;
    char *x = ac_read_file(a, 1 << 28, &la, &e), *y = ac_read_file(b, 1 << 28, &lb, &e);
    int same = x && y && la == lb && memcmp(x, y, la) == 0;
    *len = la;
    free(x);
    free(y);
    return same;
}

/* The tiny model as an F32 checkpoint (with its tokenizer) in f32dir. */
static int make_f32_copy(void) {
    ac_model m;
    ac_err e;
    char a[1300], b[400];
    if (ac_model_load(tiny, &m, &e)) return -1;
    int rc = ac_model_save(&m, f32dir, ST_F32, &e);
    ac_model_free(&m);
    snprintf(a, sizeof a, "%s/tokenizer.json", tiny);
    snprintf(b, sizeof b, "%s/tokenizer.json", f32dir);
    return rc || copy_file(a, b);
}

/* ac_model_to_f32 of the resident model equals ac_model_load. */
static void test_to_f32(void) {
    if (!have_tiny()) SKIP("no tiny model (make tiny-model)");
    ac_model r, f, c;
    ac_err e;
    if (ac_model_load_resident(tiny, &r, &e) || ac_model_load(tiny, &f, &e)) {
        CHECK(0, "%s", e.msg);
        return;
    }
    CHECK(ac_model_wdt(&r) == ST_BF16, "tiny model resident in BF16");
    CHECK(ac_model_to_f32(&r, &c, &e) == 0, "%s", e.msg);
    size_t V = (size_t)r.a.vocab * r.a.hidden;
    int same = memcmp(c.embed, f.embed, V * 4) == 0;
    for (int l = 0; l < r.a.n_layers; l++)
        for (int w = AC_W_Q; w <= AC_W_D; w++) {
            size_t k, k2;
            const float *p = ac_layer_matrix(&c, l, (ac_wmat)w, &k), *q = ac_layer_matrix(&f, l, (ac_wmat)w, &k2);
            same = same && k == k2 && (!k || memcmp(p, q, k * 4) == 0);
        }
    CHECK(same && ac_model_wdt(&c) == ST_F32, "ac_model_to_f32 equals ac_model_load");
    ac_model_free(&c);
    ac_model_free(&r);
    ac_model_free(&f);
}

/* Gate values in (0,1] that are not all 1 (every gate kind), from a counter. */
static void odd_gates(ac_gates *g, const ac_arch *a) {
    unsigned k = 7;
    for (int l = 0; l < a->n_layers; l++) {
        for (int h = 0; h < a->layers[l].n_heads; h++)
            g->head[l][h] = 0.25f + (float)((k = k * 1103515245u + 12345u) >> 24) / 341;
        for (int c = 0; c < a->layers[l].ffn; c++)
            g->ffn[l][c] = 0.25f + (float)((k = k * 1103515245u + 12345u) >> 24) / 341;
        g->attn[l] = 0.9f - 0.05f * l;
        g->mlp[l] = 0.6f + 0.05f * l;
    }
    for (int c = 0; c < a->hidden; c++) g->hidden[c] = c % 5 ? 1.0f : 0.5f;
}

/* Every gate gradient of t in one vector (n floats); returns the count. */
static size_t gate_grads(const ac_trainer *t, float *out) {
    const ac_arch *a = &t->m->a;
    size_t n = 0;
    for (int l = 0; l < a->n_layers; l++) {
        for (int h = 0; h < a->layers[l].n_heads; h++) out[n++] = t->dgate.head[l][h];
        for (int c = 0; c < a->layers[l].ffn; c++) out[n++] = t->dgate.ffn[l][c];
        out[n++] = t->dgate.attn[l];
        out[n++] = t->dgate.mlp[l];
    }
    for (int c = 0; c < a->hidden; c++) out[n++] = t->dgate.hidden[c];
    return n;
}

typedef struct {
    float *logits, *dg;
    size_t ng;
    double loss;
    int no_wgrad; /* the frozen trainer holds no weight gradient */
} tr_out;

/* One forward, KD+CE loss against fixed teacher logits, backward on m
 * (frozen or full trainer; lm_rows > 0 overrides the LM-head tile). */
static int tr_run(ac_model *m, int frozen, int lm_rows, tr_out *o, ac_err *e) {
    enum { B = 2, T = 24 };
    const ac_arch *a = &m->a;
    int tok[B * T], tgt[B * T], V = a->vocab;
    for (int i = 0; i < B * T; i++) tok[i] = (i * 37 + 11) % V;
    ac_next_token_targets(tgt, tok, B, T);
    float *teach = malloc(sizeof(float) * B * T * V);
    ac_trainer t;
    if (!teach || (frozen ? ac_trainer_init_frozen(&t, m, B, T, e) : ac_trainer_init(&t, m, B, T, e))) {
        free(teach);
        return -1;
    }
    for (int i = 0; i < B * T * V; i++) teach[i] = (float)((i * 7919) % 401) / 100.0f - 2.0f;
    if (lm_rows > 0) t.lm_rows = lm_rows;
    odd_gates(&t.gate, a);
    int rc = ac_train_forward(&t, tok, B, T, e);
    if (!rc) {
        o->loss = ac_train_loss(&t, tgt, teach, 2.0f, 0.5f, 1.0f, NULL, NULL);
        ac_train_backward(&t);
        o->logits = malloc(sizeof(float) * B * T * V);
        o->dg =
            malloc(sizeof(float) * (a->hidden + (size_t)a->n_layers * (2 + a->layers[0].n_heads + a->layers[0].ffn)));
        if (o->logits && o->dg) {
            memcpy(o->logits, t.logits, sizeof(float) * B * T * V);
            o->ng = gate_grads(&t, o->dg);
        } else
            rc = ac_errf(e, "out of memory");
        o->no_wgrad =
            !t.g.embed && !t.g.lm_head && !t.g.final_norm && !t.g.L[0].wq && !t.g.L[0].wd && !t.g.L[0].in_norm;
    }
    ac_trainer_free(&t);
    free(teach);
    return rc;
}

static double max_rel(const float *x, const float *y, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)x[i] - y[i])), s = fmax(s, fabs((double)y[i]));
    return s > 0 ? d / s : d;
}

/* The gate trainer on frozen weights reads the mapping (a layer's matrices
 * converted into one fp32 scratch at a time, the LM head by tiles, the
 * embedding by rows): logits, loss and every gate gradient equal the frozen
 * trainer's on the fp32 copy (ac_model_to_f32) and the full trainer's
 * (weight gradients too) on the fp32 load, bit for bit; with the LM head
 * in 5 tiles instead of 1 the mapping still equals the copy bit for bit,
 * and the one-tile result to 1e-5 of the largest value (only dxn's
 * summation order over the vocabulary changes). */
static void test_frozen_trainer_on_mapping(void) {
    if (!have_tiny()) SKIP("no tiny model (make tiny-model)");
    ac_model r, f, c;
    ac_err e;
    if (ac_model_load_resident(tiny, &r, &e) || ac_model_load(tiny, &f, &e) || ac_model_to_f32(&r, &c, &e)) {
        CHECK(0, "%s", e.msg);
        return;
    }
    CHECK(ac_model_wdt(&r) == ST_BF16, "resident in BF16");
    ac_trainer t;
    CHECK(ac_trainer_init(&t, &r, 1, 2, &e) != 0 && strstr(e.msg, "fp32"), "a trained resident model is refused");
    tr_out o[5] = {0};
    ac_model *ms[5] = {&r, &c, &f, &r, &c};
    int fr[5] = {1, 1, 0, 1, 1}, rows[5] = {0, 0, 0, 160, 160}, ok = 1;
    for (int i = 0; i < 5 && ok; i++) ok = tr_run(ms[i], fr[i], rows[i], &o[i], &e) == 0;
    CHECK(ok, "%s", e.msg);
    if (ok) {
        size_t nl = (size_t)2 * 24 * f.a.vocab, ng = o[0].ng;
        for (int i = 1; i < 3; i++) {
            int same = o[i].loss == o[0].loss && o[i].ng == ng && !memcmp(o[i].logits, o[0].logits, nl * 4) &&
                       !memcmp(o[i].dg, o[0].dg, ng * 4);
            CHECK(same, "mapping vs %s: loss %.9g vs %.9g, logits %.3g, gate grads %.3g", i == 1 ? "copy" : "fp32 load",
                  o[0].loss, o[i].loss, max_rel(o[0].logits, o[i].logits, nl), max_rel(o[0].dg, o[i].dg, ng));
        }
        CHECK(o[0].no_wgrad && o[1].no_wgrad && !o[2].no_wgrad, "frozen trainers hold no weight gradient");
        int same =
            o[3].loss == o[4].loss && !memcmp(o[3].logits, o[4].logits, nl * 4) && !memcmp(o[3].dg, o[4].dg, ng * 4);
        double dt = max_rel(o[3].dg, o[0].dg, ng);
        printf("  %zu gate gradients, loss %.6f: mapping == copy == fp32 load; LM head in 5 tiles: mapping == copy %s, "
               "vs 1 tile max rel %.2e (logits %s)\n",
               ng, o[0].loss, same ? "yes" : "NO", dt, memcmp(o[3].logits, o[0].logits, nl * 4) ? "differ" : "same");
        CHECK(same, "5 tiles: mapping vs copy differ");
        CHECK(dt < 1e-5 && o[3].loss == o[0].loss, "5 tiles vs 1: gate grads differ by %g", dt);
    }
    for (int i = 0; i < 5; i++) free(o[i].logits), free(o[i].dg);
    ac_model_free(&r);
    ac_model_free(&f);
    ac_model_free(&c);
}

/* ac_prune from the mapping (KV groups, KV merging, Minitron head trimming,
 * FFN and hidden width) equals ac_prune from the fp32 load, value for value. */
static void test_prune_from_mapping(void) {
    if (!have_tiny()) SKIP("no tiny model (make tiny-model)");
    ac_model r, f;
    ac_err e;
    if (ac_model_load_resident(tiny, &r, &e) || ac_model_load(tiny, &f, &e)) {
        CHECK(0, "%s", e.msg);
        return;
    }
    const ac_arch *a = &f.a;
    ac_importance imp;
    memset(&imp, 0, sizeof imp);
    int L = a->n_layers, H = a->hidden;
    imp.kv_order = calloc(L, sizeof *imp.kv_order);
    imp.head_order = calloc(L, sizeof *imp.head_order);
    imp.ffn_order = calloc(L, sizeof *imp.ffn_order);
    imp.hid_order = malloc(sizeof(int) * H);
    for (int c = 0; c < H; c++) imp.hid_order[c] = (c * 7 + 3) % H; /* H is not a multiple of 7 in the tiny model */
    for (int l = 0; l < L; l++) {
        const ac_layer_arch *la = &a->layers[l];
        imp.kv_order[l] = malloc(sizeof(int) * la->n_kv_heads);
        imp.head_order[l] = malloc(sizeof(int) * la->n_heads);
        imp.ffn_order[l] = malloc(sizeof(int) * la->ffn);
        for (int g = 0; g < la->n_kv_heads; g++) imp.kv_order[l][g] = la->n_kv_heads - 1 - g;
        for (int h = 0; h < la->n_heads; h++) imp.head_order[l][h] = la->n_heads - 1 - h;
        for (int c = 0; c < la->ffn; c++) imp.ffn_order[l][c] = (c * 5 + 1) % la->ffn;
    }
    ac_arch t;
    CHECK(ac_arch_copy(&t, a, &e) == 0, "%s", e.msg);
    t.hidden = H - H / 4;
    for (int l = 0; l < L; l++) {
        ac_layer_arch *d = &t.layers[l];
        const ac_layer_arch *s = &a->layers[l];
        int grp = s->n_heads / s->n_kv_heads;
        d->ffn = s->ffn / 2 + l;
        if (l % 3 == 0 && s->n_kv_heads > 1) d->n_kv_heads = s->n_kv_heads / 2; /* merge, all heads kept */
        if (l % 3 == 1 && s->n_kv_heads > 1) {                                  /* KV groups with their heads */
            d->n_kv_heads = s->n_kv_heads / 2;
            d->n_heads = d->n_kv_heads * grp;
        }
        if (l % 3 == 2 && grp > 1) d->n_heads = s->n_kv_heads * (grp / 2); /* Minitron trim */
    }
    ac_model pr, pf;
    int ok = ac_prune(&r, &t, &imp, &pr, &e) == 0 && ac_prune(&f, &t, &imp, &pf, &e) == 0;
    CHECK(ok, "%s", e.msg);
    if (ok) {
        int same = memcmp(pr.embed, pf.embed, sizeof(float) * (size_t)t.vocab * t.hidden) == 0;
        for (int l = 0; l < L; l++)
            for (int w = AC_W_Q; w <= AC_W_D; w++) {
                size_t k, k2;
                const float *p = ac_layer_matrix(&pr, l, (ac_wmat)w, &k), *q = ac_layer_matrix(&pf, l, (ac_wmat)w, &k2);
                int eq = k == k2 && (!k || memcmp(p, q, k * 4) == 0);
                CHECK(eq, "layer %d matrix %d differs", l, w);
                same = same && eq;
            }
        CHECK(same, "pruned from the mapping == pruned from the fp32 load");
        ac_model_free(&pr);
        ac_model_free(&pf);
    }
    ac_arch_free(&t);
    for (int l = 0; l < L; l++) free(imp.kv_order[l]), free(imp.head_order[l]), free(imp.ffn_order[l]);
    free(imp.kv_order), free(imp.head_order), free(imp.ffn_order), free(imp.hid_order);
    ac_model_free(&r);
    ac_model_free(&f);
}

/* export-gguf converts a resident model per tensor: the GGUF file (BF16
 * and F32 tensors) is byte-identical to the one written from the fp32 load. */
static void test_gguf_from_mapping(void) {
    if (!have_tiny()) SKIP("no tiny model (make tiny-model)");
    ac_model r, f;
    ac_err e;
    char tok[1200];
    snprintf(tok, sizeof tok, "%s/tokenizer.json", tiny);
    if (ac_model_load_resident(tiny, &r, &e) || ac_model_load(tiny, &f, &e)) {
        CHECK(0, "%s", e.msg);
        return;
    }
    int dts[2] = {ST_BF16, ST_F32};
    for (int i = 0; i < 2; i++) {
        const char *a = "/tmp/ac_test_resident_a.gguf", *b = "/tmp/ac_test_resident_b.gguf";
        size_t len = 0;
        int ok = ac_gguf_write(&r, tok, a, dts[i], &e) == 0 && ac_gguf_write(&f, tok, b, dts[i], &e) == 0;
        CHECK(ok, "%s", e.msg);
        CHECK(ok && same_bytes(a, b, &len) && len > 0, "GGUF (%s) from the mapping differs", i ? "F32" : "BF16");
    }
    ac_model_free(&r);
    ac_model_free(&f);
}

/* Streamed calibration (layer by layer, stream.c) on the resident model
 * equals the one on the fp32 load with fp32 GEMMs: the same unit orders,
 * curves and base loss. */
static void test_streamed_calibration(void) {
    if (!have_tiny()) SKIP("no tiny model (make tiny-model)");
    ac_model r, f;
    ac_importance ir, iff;
    ac_err e;
    int *ids = NULL;
    size_t n = 0;
    char calib[1100];
    ck_build_path(calib, sizeof calib, "data/calib.txt");
    if (ac_model_load_resident(tiny, &r, &e) || ac_model_load(tiny, &f, &e) ||
        ac_load_text_ids(tiny, calib, &ids, &n, f.a.vocab, &e)) {
        CHECK(0, "%s", e.msg);
        return;
    }
    if (n > 2048) n = 2048;
    int rows = ac_bf16_gemm_rows();
    ac_set_bf16_gemm_rows(0);
    int ok = ac_importance_compute_mode(&r, ids, n, 64, 32, 0, AC_CALIB_STREAMED, NULL, NULL, &ir, &e) == 0 &&
             ac_importance_compute_mode(&f, ids, n, 64, 32, 0, AC_CALIB_STREAMED, NULL, NULL, &iff, &e) == 0;
    ac_set_bf16_gemm_rows(rows);
    CHECK(ok, "%s", e.msg);
    if (ok) {
        int same = ir.base_loss == iff.base_loss && memcmp(ir.hid_order, iff.hid_order, sizeof(int) * f.a.hidden) == 0;
        for (int l = 0; l < f.a.n_layers; l++) {
            same = same && memcmp(ir.ffn_order[l], iff.ffn_order[l], sizeof(int) * f.a.layers[l].ffn) == 0 &&
                   memcmp(ir.kv_order[l], iff.kv_order[l], sizeof(int) * f.a.layers[l].n_kv_heads) == 0;
            /* the backward passes of the streamed method multiply per converted tile on resident weights and
             * in one sgemm on fp32 ones: same values, another summation order (test_stream's bound) */
            for (int p = 0; p < AC_SENS_POINTS; p++)
                same = same &&
                       fabs(ir.attn_sens[l][p] - iff.attn_sens[l][p]) <= 1e-5 + 1e-3 * fabs(iff.attn_sens[l][p]) &&
                       fabs(ir.ffn_sens[l][p] - iff.ffn_sens[l][p]) <= 1e-5 + 1e-3 * fabs(iff.ffn_sens[l][p]);
        }
        printf("  streamed base loss: resident %.9f, fp32 %.9f\n", ir.base_loss, iff.base_loss);
        CHECK(same && ir.streamed, "streamed calibration differs between resident and fp32 weights");
        ac_importance_free(&ir);
        ac_importance_free(&iff);
    }
    free(ids);
    ac_model_free(&r);
    ac_model_free(&f);
}

static void quiet(void *ud, const char *kind, json_t *data) { (void)ud, (void)kind, (void)data; }

static int run_job(const char *model, const char *out, json_t **res, ac_err *e) {
    char calib[1100], held[1100];
    ck_build_path(calib, sizeof calib, "data/calib.txt");
    ck_build_path(held, sizeof held, "data/heldout.txt");
    json_t *spec = json_pack("{s:s,s:s,s:s,s:s,s:{s:s,s:{s:i,s:i,s:i}},s:{s:i},s:{s:i,s:i},s:i,s:{s:i,s:i},s:{s:i}}",
                             "model", model, "calibration", calib, "heldout", held, "output", out, "target", "device",
                             "H100", "workload", "batch", 8, "prompt_len", 256, "gen_len", 64, "constraints",
                             "max_params", 900000, "search", "steps", 60, "dnas_steps", 30, "calibration_tokens", 2048,
                             "eval", "ctx", 128, "windows", 4, "distill", "tokens", 2048);
    static ac_job_spec sp;
    ac_job_ctx ctx = {.emit = quiet, .threads = 2};
    int rc = ac_job_spec_parse(spec, &sp, NULL, e) || ac_job_run(&sp, &ctx, res, e);
    json_decref(spec);
    return rc ? -1 : 0;
}

/* A whole job (calibration, Minitron and DNAS search, prune with repair,
 * distillation of both arms, evaluation, export) on the resident BF16 tiny
 * model and on its F32 checkpoint: the exported safetensors and config are
 * byte-identical and the reported perplexities equal. */
static void test_job_resident_equals_fp32(void) {
    if (!have_tiny()) SKIP("no tiny model (make tiny-model)");
    if (make_f32_copy()) {
        CHECK(0, "cannot write the F32 copy in %s", f32dir);
        return;
    }
    ac_model chk;
    ac_err e;
    CHECK(ac_model_load_resident(f32dir, &chk, &e) == 0 && ac_model_wdt(&chk) == ST_F32, "F32 checkpoint not fp32");
    ac_model_free(&chk);
    int rows = ac_bf16_gemm_rows();
    ac_set_bf16_gemm_rows(0); /* fp32 GEMMs: no AMX rounding of activations on either side */
    json_t *ra = NULL, *rb = NULL;
    int ok = run_job(tiny, "/tmp/ac_test_resident_job_a", &ra, &e) == 0;
    CHECK(ok, "resident job: %s", e.msg);
    ok = ok && run_job(f32dir, "/tmp/ac_test_resident_job_b", &rb, &e) == 0;
    CHECK(ok || !ra, "fp32 job: %s", e.msg);
    ac_set_bf16_gemm_rows(rows);
    if (ok) {
        const char *files[] = {"model.safetensors", "config.json"};
        for (int i = 0; i < 2; i++) {
            char a[300], b[300];
            size_t len;
            snprintf(a, sizeof a, "/tmp/ac_test_resident_job_a/%s", files[i]);
            snprintf(b, sizeof b, "/tmp/ac_test_resident_job_b/%s", files[i]);
            int same = same_bytes(a, b, &len);
            printf("  %s: %zu bytes, %s\n", files[i], len, same ? "identical" : "DIFFERENT");
            CHECK(same && len > 0, "%s differs between the resident and the fp32 job", files[i]);
        }
        const char *arms[] = {"autocompress", "minitron"};
        for (int i = 0; i < 2; i++) {
            double pa = json_number_value(json_object_get(json_object_get(ra, arms[i]), "perplexity")),
                   pb = json_number_value(json_object_get(json_object_get(rb, arms[i]), "perplexity"));
            printf("  %s perplexity: resident %.6f, fp32 %.6f\n", arms[i], pa, pb);
            CHECK(pa > 1 && pa == pb, "%s perplexity %g vs %g", arms[i], pa, pb);
        }
        double ba = json_number_value(json_object_get(json_object_get(ra, "baseline"), "perplexity")),
               bb = json_number_value(json_object_get(json_object_get(rb, "baseline"), "perplexity"));
        CHECK(ba > 1 && ba == bb, "base perplexity %g vs %g", ba, bb);
    }
    json_decref(ra);
    json_decref(rb);
}

int main(void) {
    ck_build_path(tiny, sizeof tiny, "models/tiny");
    mkdir(f32dir, 0755);
    RUN(test_to_f32);
    RUN(test_frozen_trainer_on_mapping);
    RUN(test_prune_from_mapping);
    RUN(test_gguf_from_mapping);
    RUN(test_streamed_calibration);
    RUN(test_job_resident_equals_fp32);
    return DONE();
}
