/*
 * test_gguf.c - GGUF export (src/format/gguf.c) and import (src/format/gguf_read.c):
 * round trips through our own loader (identical logits: BF16-exact weights
 * and F32 fixtures with llama3 RoPE scaling, Q/K/V biases, tied embeddings;
 * the hybrid nemotron_h / nemotron_h_moe exports read back tensor by tensor;
 * identical tokenization for byte-level and SentencePiece-style
 * tokenizers, the latter against the sentencepiece library's ids), the
 * rules of what llama.cpp runs, the search keeping to them, malformed files,
 * and the exports of the tiny model run in real llama.cpp (node-llama-cpp's
 * prebuilt binaries, tests/llama): same perplexity as our engine within
 * 0.5 %, same tokenization, generated text.
 */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "cost/costmodel.h"
#include "runtime/engine.h"
#include "runtime/eval.h"
#include "format/gguf.h"
#include "search/importance.h"
#include "pipeline/job.h"
#include "pipeline/jobcheck.h"
#include "format/model.h"
#include "compress/prune.h"
#include "format/safetensors.h"
#include "search/search.h"
#include "format/tokenizer.h"

static char tmpdir[64];
static char tiny[1100], tiny_tok[1200], heldout[1100], calib[1100];

static int have_tiny(void) {
    ck_build_path(tiny, sizeof tiny, "models/tiny");
    ck_build_path(heldout, sizeof heldout, "data/heldout.txt");
    ck_build_path(calib, sizeof calib, "data/calib.txt");
    snprintf(tiny_tok, sizeof tiny_tok, "%s/tokenizer.json", tiny);
    return ck_exists(tiny_tok) && ck_exists(heldout);
}

/* Largest |difference| of the two models' logits on toks (and the largest |logit|). */
static double logits_diff(const ac_model *a, const ac_model *b, const int *toks, int n, double *mx) {
    ac_engine e1, e2;
    ac_err e;
    *mx = 0;
    if (ac_engine_init(&e1, a, 1, n, &e) || ac_engine_init(&e2, b, 1, n, &e)) return 1e30;
    double d = 1e30;
    if (!ac_engine_forward(&e1, toks, 1, n, 0, 0, &e) && !ac_engine_forward(&e2, toks, 1, n, 0, 0, &e)) {
        d = 0;
        for (size_t i = 0; i < (size_t)n * a->a.vocab; i++) {
            d = fmax(d, fabs((double)e1.logits[i] - e2.logits[i]));
            *mx = fmax(*mx, fabs(e1.logits[i]));
        }
    }
    ac_engine_free(&e1);
    ac_engine_free(&e2);
    return d;
}

static int arch_same(const ac_arch *x, const ac_arch *y) {
    int ok = x->vocab == y->vocab && x->hidden == y->hidden && x->head_dim == y->head_dim &&
             x->n_layers == y->n_layers && x->max_pos == y->max_pos && x->eps == y->eps &&
             x->rope_theta == y->rope_theta && x->rope_llama3 == y->rope_llama3 &&
             x->tie_embeddings == y->tie_embeddings && x->qkv_bias == y->qkv_bias && x->bos_id == y->bos_id &&
             x->eos_id == y->eos_id && x->qk_norm == y->qk_norm && x->top_k == y->top_k && x->norm_topk == y->norm_topk;
    if (x->rope_llama3)
        ok &= x->rs_factor == y->rs_factor && x->rs_low == y->rs_low && x->rs_high == y->rs_high &&
              x->rs_orig == y->rs_orig;
    for (int l = 0; ok && l < x->n_layers; l++) ok = !memcmp(&x->layers[l], &y->layers[l], sizeof x->layers[l]);
    return ok;
}

/* Export m (and tok), load it back, and compare architecture and logits. */
static void roundtrip(const ac_model *m, const char *tok, int dtype, const char *name) {
    char path[200];
    ac_err e;
    ac_model r;
    snprintf(path, sizeof path, "%s/%s.gguf", tmpdir, name);
    CHECK(ac_gguf_write(m, tok, path, dtype, &e) == 0, "%s: %s", name, e.msg);
    if (ac_model_load(path, &r, &e)) {
        CHECK(0, "%s: load: %s", name, e.msg);
        return;
    }
    CHECK(arch_same(&m->a, &r.a), "%s: architecture differs after the round trip", name);
    int toks[24];
    for (int i = 0; i < 24; i++) toks[i] = (i * 37 + 11) % m->a.vocab;
    double mx = 0, d = arch_same(&m->a, &r.a) ? logits_diff(m, &r, toks, 24, &mx) : 1e30;
    CHECK(d == 0, "%s: logits differ by %g (max |logit| %g)", name, d, mx);
    ac_model_free(&r);
}

static void test_uniform_roundtrip_bf16(void) {
    if (!have_tiny()) SKIP("no tiny model (make tiny-model)");
    ac_model m;
    ac_err e;
    CHECK(ac_model_load(tiny, &m, &e) == 0, "%s", e.msg);
    roundtrip(&m, tiny_tok, ST_BF16, "tiny");
    ac_arch a;
    char path[200];
    snprintf(path, sizeof path, "%s/tiny.gguf", tmpdir);
    CHECK(ac_arch_load(path, &a, &e) == 0 && arch_same(&a, &m.a), "arch of the GGUF file: %s", e.msg);
    ac_arch_free(&a);
    /* tokenization from the metadata equals tokenizer.json's */
    ac_tokenizer *t1, *t2;
    size_t len, n1, n2;
    int *i1, *i2;
    char *text = ac_read_file(heldout, 1 << 20, &len, &e);
    CHECK(text && ac_tok_load(tiny_tok, &t1, &e) == 0 && ac_gguf_tokenizer(path, &t2, &e) == 0, "%s", e.msg);
    CHECK(ac_tok_encode(t1, text, len, &i1, &n1, &e) == 0 && ac_tok_encode(t2, text, len, &i2, &n2, &e) == 0, "%s",
          e.msg);
    CHECK(n1 == n2 && n1 > 1000 && !memcmp(i1, i2, n1 * sizeof *i1),
          "held-out tokenization differs (%zu vs %zu tokens)", n1, n2);
    char *d1, *d2;
    CHECK(ac_tok_decode(t2, i2, n2, &d2, NULL, &e) == 0 && ac_tok_decode(t1, i1, n1, &d1, NULL, &e) == 0 &&
              !strcmp(d1, d2),
          "decode");
    free(d1);
    free(d2);
    free(i1);
    free(i2);
    free(text);
    ac_tok_free(t1);
    ac_tok_free(t2);
    ac_model_free(&m);
}

static void test_fixture_roundtrips_f32(void) {
    const char *names[] = {"llama3_rope_f32", "qwen2_tied_f16", "llama_gqa_bf16", "qwen3_hd_bf16"};
    for (int i = 0; i < 4; i++) {
        char d[1200], c[1300];
        ck_build_path(d, sizeof d, "fixtures/models/");
        strcat(d, names[i]);
        snprintf(c, sizeof c, "%s/config.json", d);
        if (!ck_exists(c)) SKIP("no fixtures (make fixtures)");
        ac_model m;
        ac_err e;
        if (ac_model_load(d, &m, &e)) {
            CHECK(0, "%s", e.msg);
            continue;
        }
        roundtrip(&m, NULL, ST_F32, names[i]); /* F32: exact whatever the source dtype */
        ac_model_free(&m);
    }
}

/* The tiny model pruned to a heterogeneous architecture: KV groups pruned
 * per layer, FFN widths varied, layer 2's attention and all of layer 4
 * removed, with importance measured on calibration text. */
static int tiny_hetero(const ac_model *m, ac_model *pm, ac_err *e) {
    int *ids = NULL, rc;
    size_t n;
    ac_importance imp;
    if (ac_load_text_ids(tiny, calib, &ids, &n, m->a.vocab, e)) return -1;
    rc = ac_importance_compute((ac_model *)m, ids, n < 4 * 64 ? n : 4 * 64, 64, 4, 0, NULL, NULL, &imp, e);
    free(ids);
    if (rc) return -1;
    ac_arch t;
    if (ac_arch_copy(&t, &m->a, e)) {
        ac_importance_free(&imp);
        return -1;
    }
    const int kv[6] = {4, 2, 0, 1, 0, 3}, ffn[6] = {384, 256, 320, 160, 0, 224};
    for (int l = 0; l < 6; l++) t.layers[l] = (ac_layer_arch){2 * kv[l], kv[l], ffn[l], 0, 0, 0};
    rc = ac_prune(m, &t, &imp, pm, e);
    ac_arch_free(&t);
    ac_importance_free(&imp);
    return rc;
}

static void test_heterogeneous_roundtrip(void) {
    if (!have_tiny()) SKIP("no tiny model (make tiny-model)");
    ac_model m, pm;
    ac_err e;
    CHECK(ac_model_load(tiny, &m, &e) == 0, "%s", e.msg);
    if (tiny_hetero(&m, &pm, &e)) {
        CHECK(0, "%s", e.msg);
        ac_model_free(&m);
        return;
    }
    CHECK(!ac_arch_is_uniform(&pm.a), "heterogeneous");
    roundtrip(&pm, tiny_tok, ST_BF16, "hetero");
    ac_model_free(&pm);
    ac_model_free(&m);
}

static void test_llama_cpp_rules(void) {
    ac_arch a = {.vocab = 16,
                 .hidden = 8,
                 .head_dim = 4,
                 .n_layers = 3,
                 .max_pos = 64,
                 .eps = 1e-5f,
                 .rope_theta = 1e4f,
                 .bos_id = -1,
                 .eos_id = -1};
    ac_layer_arch L[3] = {{2, 1, 8, 0, 0, 0}, {0, 0, 8, 0, 0, 0}, {2, 2, 8, 0, 0, 0}};
    a.layers = L;
    ac_err e;
    CHECK(ac_gguf_check_arch(&a, &e) == 0, "valid: %s", e.msg);
    L[1] = (ac_layer_arch){0, 0, 0, 0, 0, 0};
    CHECK(ac_gguf_check_arch(&a, &e) == 0, "a whole layer removed in the middle is fine: %s", e.msg);
    L[1] = (ac_layer_arch){2, 1, 0, 0, 0, 0};
    CHECK(ac_gguf_check_arch(&a, &e) != 0 && strstr(e.msg, "layer 1 keeps attention"), "attention without FFN: %s",
          e.msg);
    L[1] = (ac_layer_arch){2, 1, 8, 0, 0, 0};
    L[0] = (ac_layer_arch){0, 0, 8, 0, 0, 0};
    CHECK(ac_gguf_check_arch(&a, &e) != 0 && strstr(e.msg, "layer 0"), "layer 0 without attention: %s", e.msg);
    L[0] = (ac_layer_arch){2, 1, 8, 0, 0, 0};
    L[2] = (ac_layer_arch){0, 0, 0, 0, 0, 0};
    CHECK(ac_gguf_check_arch(&a, &e) != 0 && strstr(e.msg, "last layer"), "last layer without FFN: %s", e.msg);
    L[2] = (ac_layer_arch){2, 2, 8, 0, 0, 0};
    a.sliding_window = 32;
    CHECK(ac_gguf_check_arch(&a, &e) != 0 && strstr(e.msg, "sliding"), "sliding window: %s", e.msg);
    a.sliding_window = 0;
    /* the writer refuses what llama.cpp would mis-run */
    ac_model m;
    L[1] = (ac_layer_arch){2, 1, 0, 0, 0, 0};
    CHECK(ac_model_alloc(&m, &a, &e) == 0, "%s", e.msg);
    char path[200];
    snprintf(path, sizeof path, "%s/bad.gguf", tmpdir);
    CHECK(ac_gguf_write(&m, NULL, path, ST_F32, &e) != 0 && !ck_exists(path), "attention-only layer written");
    ac_model_free(&m);
}

/* ---- real llama.cpp (node-llama-cpp) ---- */

static char llama_dir[1100];

/* Why llama.cpp cannot run here, or NULL. */
static const char *llama_missing(void) {
    const char *root = getenv("AC_TEST_ROOT");
    snprintf(llama_dir, sizeof llama_dir, "%s/tests/llama", root ? root : ".");
    char p[1200];
    snprintf(p, sizeof p, "%s/node_modules/@node-llama-cpp/linux-x64/package.json", llama_dir);
    if (!ck_exists(p))
        return "tests/llama/node_modules lacks node-llama-cpp's linux-x64 binaries ('make llama-test-deps')";
    FILE *f = popen("node -e 'process.stdout.write(process.versions.node.split(\".\")[0])' 2>/dev/null", "r");
    int major = 0;
    if (f) {
        if (fscanf(f, "%d", &major) != 1) major = 0;
        pclose(f);
    }
    if (major < 20) return "node >= 20 not found (node-llama-cpp 3 needs it)";
    return NULL;
}

/* Run llama_check.mjs on gguf with job; the parsed output or NULL. */
static json_t *run_llama(const char *gguf, json_t *job) {
    char jp[200], op[200], cmd[3000];
    snprintf(jp, sizeof jp, "%s/job.json", tmpdir);
    snprintf(op, sizeof op, "%s/llama_out.json", tmpdir);
    if (json_dump_file(job, jp, JSON_COMPACT)) return NULL;
    snprintf(cmd, sizeof cmd, "cd '%s' && timeout 120 node llama_check.mjs '%s' '%s' > '%s' 2> '%s.err'", llama_dir,
             gguf, jp, op, op);
    int rc = system(cmd);
    json_error_t je;
    json_t *out = rc == 0 ? json_load_file(op, JSON_ALLOW_NUL, &je) : NULL;
    if (!out) {
        char ep[220];
        snprintf(ep, sizeof ep, "%s.err", op);
        size_t n;
        char *err = ac_read_file(ep, 1 << 16, &n, NULL);
        fprintf(stderr, "  llama_check.mjs failed (exit %d): %.2000s\n", rc, err ? err : "");
        free(err);
    }
    return out;
}

/* Greedy continuation of prompt by our engine (full forward per token). */
static void our_greedy(const ac_model *m, const int *prompt, int np, int ngen, int *out) {
    ac_engine en;
    ac_err e;
    int toks[128];
    if (np + ngen > 128) return;
    memcpy(toks, prompt, sizeof(int) * np);
    if (ac_engine_init(&en, m, 1, np + ngen, &e)) return;
    for (int g = 0; g < ngen; g++) {
        int n = np + g, best = 0;
        if (ac_engine_forward(&en, toks, 1, n, 0, 1, &e)) break;
        for (int v = 1; v < m->a.vocab; v++)
            if (en.logits[v] > en.logits[best]) best = v;
        out[g] = toks[n] = best;
    }
    ac_engine_free(&en);
}

/* The held-out text (malloc'd) and *tl, the length of its first whole lines
 * up to 3000 bytes (no UTF-8 character cut): what llama_compare tokenizes. */
static char *heldout_lines(size_t *tl) {
    size_t len = 0;
    ac_err e;
    char *text = ac_read_file(heldout, 1 << 24, &len, &e);
    *tl = text ? (len < 3000 ? len : 3000) : 0;
    while (*tl > 0 && text[*tl - 1] != '\n') --*tl;
    return text;
}

/* Export m (in dtype wdt), run it in llama.cpp over held-out windows,
 * compare; ng greedy tokens after an 8-token prompt, of which the first
 * half must be ours; with all, every one, and generation goes on through
 * end-of-generation tokens (as our_greedy does), so all ng are compared. */
/* given: a GGUF file of m already written (a job's export), else m is exported here. */
static void llama_compare_as(const ac_model *m, const char *given, const char *name, const int *ids, size_t nids,
                             const char *text, size_t tlen, int wdt, int ng_want, int all) {
    enum { W = 128, NW = 6, NP = 8, NGMAX = 64 };
    int NG = ng_want < NGMAX ? ng_want : NGMAX;
    char path[1200];
    ac_err e;
    snprintf(path, sizeof path, "%s/%s.gguf", tmpdir, name);
    if (given)
        snprintf(path, sizeof path, "%s", given);
    else if (ac_gguf_write(m, tiny_tok, path, wdt, &e)) {
        CHECK(0, "%s: %s", name, e.msg);
        return;
    }
    if (nids < (size_t)W * NW) {
        CHECK(0, "held-out text too short");
        return;
    }
    json_t *wins = json_array(), *prompt = json_array();
    for (int w = 0; w < NW; w++) {
        json_t *a = json_array();
        for (int i = 0; i < W; i++) json_array_append_new(a, json_integer(ids[w * W + i]));
        json_array_append_new(wins, a);
    }
    for (int i = 0; i < NP; i++) json_array_append_new(prompt, json_integer(ids[i]));
    json_t *job = json_pack("{s:o,s:s%,s:o,s:i,s:b}", "windows", wins, "text", text, tlen, "prompt", prompt, "gen", NG,
                            "through_eog", all);
    json_t *out = run_llama(path, job);
    json_decref(job);
    if (!out) {
        CHECK(0, "%s: llama.cpp did not run the export", name);
        return;
    }
    /* perplexity: ours on the same windows (every target in a window scored) */
    ac_ppl_opts o = {.ctx = W, .stride = 0, .max_windows = NW, .batch = 2};
    ac_ppl_result r;
    CHECK(ac_perplexity(m, ids, (size_t)W * NW, &o, NULL, NULL, NULL, &r, &e) == 0, "%s", e.msg);
    double nll = 0;
    long cnt = 0;
    for (size_t i = 0; i < json_array_size(json_object_get(out, "nll")); i++) {
        nll += json_number_value(json_array_get(json_object_get(out, "nll"), i));
        cnt += (long)json_integer_value(json_array_get(json_object_get(out, "count"), i));
    }
    double ppl = cnt ? exp(nll / cnt) : 0;
    printf("  %s: llama.cpp perplexity %.4f, ours %.4f (%ld and %ld tokens scored, %d windows of %d)\n", name, ppl,
           r.ppl, cnt, r.scored, NW, W);
    CHECK(cnt == r.scored && fabs(ppl / r.ppl - 1) < 0.005, "%s: llama.cpp ppl %g vs ours %g", name, ppl, r.ppl);
    /* tokenization of the text by llama.cpp = ours */
    json_t *lt = json_object_get(out, "tokens");
    ac_tokenizer *t;
    int *mine = NULL;
    size_t nm = 0;
    CHECK(ac_tok_load(tiny_tok, &t, &e) == 0 && ac_tok_encode(t, text, tlen, &mine, &nm, &e) == 0, "%s", e.msg);
    int same = json_array_size(lt) == nm;
    for (size_t i = 0; same && i < nm; i++) same = json_integer_value(json_array_get(lt, i)) == mine[i];
    CHECK(same, "%s: llama.cpp tokenized %zu bytes into %zu tokens, we into %zu (or different ids)", name, tlen,
          json_array_size(lt), nm);
    /* generation: greedy tokens as our engine picks them, and text */
    int g[NGMAX + 1] = {0};
    our_greedy(m, ids, NP, NG + 1 <= NGMAX ? NG + 1 : NG, g);
    json_t *gt = json_object_get(out, "gen_tokens");
    int agree = 0;
    while (agree < NG && agree < (int)json_array_size(gt) && json_integer_value(json_array_get(gt, agree)) == g[agree])
        agree++;
    const char *gen = json_string_value(json_object_get(out, "generated"));
    printf("  %s: llama.cpp generated %zu tokens \"%s\"; first %d equal to our greedy tokens\n", name,
           json_array_size(gt), gen ? gen : "", agree);
    int ng = (int)json_array_size(gt);
    CHECK(ng > 0 && gen && strlen(gen) > 0, "%s: no text generated", name);
    int need = all ? ng : ng < NG / 2 ? ng : NG / 2;
    CHECK(agree >= need, "%s: only the first %d of %d greedy tokens agree with our engine", name, agree, ng);
    CHECK(!all || ng == NG || (ng > 0 && agree == ng), "%s: llama.cpp generated %d of %d tokens", name, ng, NG);
    /* llama.cpp stops at the end-of-generation token: ours must pick it there too */
    if (ng < NG && agree == ng)
        CHECK(g[ng] == m->a.eos_id, "%s: llama.cpp stopped after %d tokens but we continue with %d", name, ng, g[ng]);
    free(mine);
    ac_tok_free(t);
    json_decref(out);
}

static void llama_compare(const ac_model *m, const char *given, const char *name, const int *ids, size_t nids,
                          const char *text, size_t tlen) {
    llama_compare_as(m, given, name, ids, nids, text, tlen, ST_BF16, 16, 0);
}

static void test_llama_cpp_runs_exports(void) {
    if (!have_tiny()) SKIP("no tiny model (make tiny-model)");
    const char *why = llama_missing();
    if (why) SKIP("%s", why);
    ac_model m, pm;
    ac_err e;
    int *ids = NULL;
    size_t n = 0;
    CHECK(ac_model_load(tiny, &m, &e) == 0 && ac_load_text_ids(tiny, heldout, &ids, &n, m.a.vocab, &e) == 0, "%s",
          e.msg);
    size_t tl;
    char *text = heldout_lines(&tl);
    /* the uniform case is test_jobs_write_gguf's llama + search.gguf job */
    if (tiny_hetero(&m, &pm, &e) == 0) {
        llama_compare(&pm, NULL, "llama_deci", ids, n, text, tl);
        ac_model_free(&pm);
    } else
        CHECK(0, "%s", e.msg);
    free(text);
    free(ids);
    ac_model_free(&m);
}

/* A Qwen3 model made from the trained tiny model (its weights, plus per-head
 * q_norm / k_norm weights near 1: the function changes, its predictions stay
 * peaked): llama.cpp's qwen3 architecture runs our GGUF export with our
 * perplexity and greedy tokens, and a safetensors save loads back as Qwen3
 * with the same weights. */
static void test_llama_cpp_runs_qwen3(void) {
    if (!have_tiny()) SKIP("no tiny model (make tiny-model)");
    ac_model m, back;
    ac_err e;
    int *ids = NULL;
    size_t n = 0;
    CHECK(ac_model_load(tiny, &m, &e) == 0 && ac_load_text_ids(tiny, heldout, &ids, &n, m.a.vocab, &e) == 0, "%s",
          e.msg);
    int hd = m.a.head_dim;
    m.a.qk_norm = 1;
    snprintf(m.a.model_type, sizeof m.a.model_type, "qwen3");
    for (int l = 0; l < m.a.n_layers; l++) {
        m.L[l].q_norm = malloc(sizeof(float) * hd);
        m.L[l].k_norm = malloc(sizeof(float) * hd);
        for (int i = 0; i < hd; i++) {
            m.L[l].q_norm[i] = 1.0f + 0.2f * sinf(0.7f * i + l);
            m.L[l].k_norm[i] = 0.9f + 0.2f * cosf(1.3f * i - l);
        }
    }
    char dir[300], cfg[400];
    snprintf(dir, sizeof dir, "%s/qwen3_st", tmpdir);
    CHECK(ac_model_save(&m, dir, ST_F32, &e) == 0, "%s", e.msg);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    json_t *c = json_load_file(cfg, 0, NULL);
    CHECK(c && !strcmp(json_string_value(json_object_get(c, "model_type")), "qwen3") &&
              !strcmp(json_string_value(json_array_get(json_object_get(c, "architectures"), 0)), "Qwen3ForCausalLM") &&
              json_integer_value(json_object_get(c, "head_dim")) == hd,
          "qwen3 config.json");
    json_decref(c);
    if (ac_model_load(dir, &back, &e) == 0) {
        CHECK(back.a.qk_norm && !memcmp(back.L[3].q_norm, m.L[3].q_norm, sizeof(float) * hd) &&
                  !memcmp(back.L[5].k_norm, m.L[5].k_norm, sizeof(float) * hd),
              "qwen3 safetensors round trip");
        ac_model_free(&back);
    } else
        CHECK(0, "%s", e.msg);
    /* llama.cpp's qwen3 is uniform: a pruned Qwen3 is refused with the reason */
    ac_arch het;
    CHECK(ac_arch_copy(&het, &m.a, &e) == 0, "%s", e.msg);
    het.layers[2].ffn = 128;
    CHECK(ac_gguf_check_arch(&het, &e) != 0 && strstr(e.msg, "qwen3"), "heterogeneous qwen3 gguf: %s", e.msg);
    ac_arch_free(&het);
    const char *why = llama_missing();
    if (!why) {
        size_t tl;
        char *text = heldout_lines(&tl);
        llama_compare(&m, NULL, "qwen3", ids, n, text, tl);
        free(text);
    }
    free(ids);
    ac_model_free(&m);
    if (why) SKIP("the qwen3 export was checked here but not in llama.cpp: %s", why);
}

/* A mixture-of-experts model made from the trained tiny model: each layer's
 * FFN cut into E experts of F/E channels (down scaled by E/k), a random
 * router, top-k renormalised; with QK-norm (Qwen3-MoE) or without
 * (Mixtral). */
static int tiny_moe(const ac_model *t, int qk, int E, int k, ac_model *o, ac_err *e) {
    ac_arch a;
    if (ac_arch_copy(&a, &t->a, e)) return -1;
    int H = a.hidden, F = t->a.layers[0].ffn, Fe = F / E, hd = a.head_dim;
    a.qk_norm = qk;
    a.top_k = k;
    a.norm_topk = 1;
    snprintf(a.model_type, sizeof a.model_type, "%s", qk ? "qwen3_moe" : "mixtral");
    for (int l = 0; l < a.n_layers; l++) a.layers[l].ffn = 0, a.layers[l].n_experts = E, a.layers[l].expert_ffn = Fe;
    int rc = ac_model_alloc(o, &a, e);
    ac_arch_free(&a);
    if (rc) return -1;
    size_t VH = (size_t)t->a.vocab * H;
    memcpy(o->embed, t->embed, VH * 4);
    if (!t->a.tie_embeddings) memcpy(o->lm_head, t->lm_head, VH * 4);
    memcpy(o->final_norm, t->final_norm, (size_t)H * 4);
    unsigned rng = 99;
    for (int l = 0; l < o->a.n_layers; l++) {
        const ac_layer_w *s = &t->L[l];
        ac_layer_w *d = &o->L[l];
        size_t Q = (size_t)t->a.layers[l].n_heads * hd, KV = (size_t)t->a.layers[l].n_kv_heads * hd;
        memcpy(d->in_norm, s->in_norm, (size_t)H * 4), memcpy(d->post_norm, s->post_norm, (size_t)H * 4);
        memcpy(d->wq, s->wq, Q * H * 4), memcpy(d->wk, s->wk, KV * H * 4), memcpy(d->wv, s->wv, KV * H * 4);
        memcpy(d->wo, s->wo, Q * H * 4);
        for (int i = 0; qk && i < hd; i++) d->q_norm[i] = 1.0f + 0.1f * sinf((float)i), d->k_norm[i] = 1.0f;
        for (size_t i = 0; i < (size_t)E * H; i++) {
            rng = rng * 1664525u + 1013904223u;
            d->router[i] = ((float)(rng >> 8) / 16777216.0f - 0.5f) * 0.6f;
        }
        for (int x = 0; x < E; x++) {
            memcpy(d->eg[x], s->wg + (size_t)x * Fe * H, (size_t)Fe * H * 4);
            memcpy(d->eu[x], s->wu + (size_t)x * Fe * H, (size_t)Fe * H * 4);
            for (int r = 0; r < H; r++)
                for (int c = 0; c < Fe; c++) d->ed[x][(size_t)r * Fe + c] = s->wd[(size_t)r * F + x * Fe + c] * E / k;
        }
    }
    return 0;
}

/* Mixtral (llama.cpp's llama with experts) and Qwen3-MoE (qwen3moe) GGUF
 * exports: our reader gets the same model back, llama.cpp scores and
 * continues them as our engine does; what llama.cpp cannot hold (a dense
 * layer among MoE ones, top-k without renormalisation) is refused. */
static void test_moe_gguf(void) {
    if (!have_tiny()) SKIP("no tiny model (make tiny-model)");
    ac_model t, mo;
    ac_err e;
    int *ids = NULL;
    size_t n = 0;
    CHECK(ac_model_load(tiny, &t, &e) == 0 && ac_load_text_ids(tiny, heldout, &ids, &n, t.a.vocab, &e) == 0, "%s",
          e.msg);
    const char *why = llama_missing();
    size_t tl;
    char *text = heldout_lines(&tl);
    for (int qk = 0; qk < 2; qk++) {
        const char *name = qk ? "qwen3moe" : "mixtral";
        if (tiny_moe(&t, qk, 4, 2, &mo, &e)) {
            CHECK(0, "%s", e.msg);
            continue;
        }
        CHECK(!strcmp(ac_gguf_arch_name(&mo.a), qk ? "qwen3moe" : "llama"), "%s arch", name);
        roundtrip(&mo, tiny_tok, ST_F32, name);
        if (!why) llama_compare(&mo, NULL, name, ids, n, text, tl);
        if (!why) { /* the whole 64-token greedy continuation, on an F32 export (in BF16 near-ties flip an expert) */
            char nm[64];
            snprintf(nm, sizeof nm, "%s_f32", name);
            llama_compare_as(&mo, NULL, nm, ids, n, text, tl, ST_F32, 64, 1);
        }
        mo.a.norm_topk = 0;
        CHECK(ac_gguf_check_arch(&mo.a, &e) != 0 && strstr(e.msg, "renormalises"), "%s: no renormalisation: %s", name,
              e.msg);
        mo.a.norm_topk = 1;
        ac_model_free(&mo);
    }
    free(text);
    free(ids);
    ac_model_free(&t);
    if (why) SKIP("the MoE exports were checked here but not in llama.cpp: %s", why);
}

/* A Nemotron-H hybrid made from the tiny model, one layer a pattern
 * character (pat: e.g. M*-M*-): the attention layers the tiny model's (no
 * RoPE now), the MLP layers its up/down under relu^2, the Mamba-2 layers
 * deterministic random (8 heads of 16 in 2 groups, state 16, kernel 4;
 * out_proj small, so the trained layers dominate the output); MoE (E)
 * layers 4 random experts of 32, top-2 renormalised, scaled by 2.5, a
 * random score-correction bias, the shared expert the tiny model's up/down
 * (as the MLP layers), the experts on a latent width when latent > 0
 * (LatentMoE, random projections). */
static int tiny_hybrid_as(const ac_model *t, const char *pat, int latent, ac_model *o, ac_err *e) {
    ac_arch a;
    if (ac_arch_copy(&a, &t->a, e)) return -1;
    int H = a.hidden, hd = a.head_dim;
    snprintf(a.model_type, sizeof a.model_type, "nemotron_h");
    a.hybrid = 1, a.ssm_head_dim = 16, a.ssm_state = 16, a.ssm_groups = 2, a.ssm_conv = 4, a.ssm_conv_bias = 1;
    for (int l = 0; l < a.n_layers; l++) {
        ac_layer_arch *L = &a.layers[l], T = t->a.layers[l];
        *L = (ac_layer_arch){pat[l] == '*' ? T.n_heads : 0, pat[l] == '*' ? T.n_kv_heads : 0, pat[l] == '-' ? T.ffn : 0,
                             pat[l] == 'E' ? 4 : 0, pat[l] == 'E' ? 32 : 0, pat[l] == 'M' ? 8 : 0};
        if (pat[l] == 'E') a.shared_ffn = T.ffn;
    }
    a.top_k = 2, a.norm_topk = 1, a.router_sigmoid = 1, a.routed_scale = 2.5f, a.moe_latent = latent;
    int rc = ac_model_alloc(o, &a, e);
    ac_arch_free(&a);
    if (rc) return -1;
    size_t VH = (size_t)t->a.vocab * H;
    memcpy(o->embed, t->embed, VH * 4);
    memcpy(o->lm_head, t->lm_head, VH * 4);
    memcpy(o->final_norm, t->final_norm, (size_t)H * 4);
    unsigned rng = 11;
#define RND(scale) ((rng = rng * 1664525u + 1013904223u), ((float)(rng >> 8) / 16777216.0f - 0.5f) * 2 * (scale))
    for (int l = 0; l < o->a.n_layers; l++) {
        const ac_layer_w *s = &t->L[l];
        ac_layer_w *d = &o->L[l];
        const ac_layer_arch *L = &o->a.layers[l];
        size_t Q = (size_t)L->n_heads * hd, KV = (size_t)L->n_kv_heads * hd, F = L->ffn;
        if (L->n_heads) {
            memcpy(d->in_norm, s->in_norm, (size_t)H * 4);
            memcpy(d->wq, s->wq, Q * H * 4), memcpy(d->wk, s->wk, KV * H * 4), memcpy(d->wv, s->wv, KV * H * 4);
            memcpy(d->wo, s->wo, Q * H * 4);
        } else if (L->n_experts) {
            size_t Fs = o->a.shared_ffn, Fe = L->expert_ffn, Hin = latent ? (size_t)latent : (size_t)H;
            memcpy(d->post_norm, s->post_norm, (size_t)H * 4);
            memcpy(d->sh_u, s->wu, Fs * H * 4);
            for (size_t i = 0; i < Fs * H; i++) d->sh_d[i] = 0.05f * s->wd[i];
            for (size_t i = 0; i < (size_t)L->n_experts * H; i++) d->router[i] = RND(0.5f);
            for (int x = 0; x < L->n_experts; x++) {
                d->router_bias[x] = RND(0.1f);
                for (size_t i = 0; i < Fe * Hin; i++) d->eu[x][i] = RND(0.3f), d->ed[x][i] = RND(0.05f);
            }
            for (size_t i = 0; latent && i < Hin * H; i++) d->lat_down[i] = RND(0.3f), d->lat_up[i] = RND(0.3f);
        } else if (F) {
            memcpy(d->post_norm, s->post_norm, (size_t)H * 4);
            memcpy(d->wu, s->wu, F * H * 4);
            for (size_t i = 0; i < F * H; i++) d->wd[i] = 0.05f * s->wd[i];
        } else {
            int nh = L->ssm_heads, di = nh * 16, C = di + 2 * 2 * 16, SI = di + C + nh;
            for (int c = 0; c < H; c++) d->in_norm[c] = s->in_norm[c];
            for (size_t i = 0; i < (size_t)SI * H; i++) d->ssm_in[i] = RND(0.2f);
            for (size_t i = 0; i < (size_t)C * 4; i++) d->conv_w[i] = RND(0.5f);
            for (int c = 0; c < C; c++) d->conv_b[c] = RND(0.1f);
            for (int h = 0; h < nh; h++)
                d->dt_bias[h] = logf(expm1f(0.1f + 0.05f * h)), d->a_log[h] = logf(0.2f + 0.2f * h), d->ssm_d[h] = 0.1f;
            for (int c = 0; c < di; c++) d->ssm_norm[c] = 1.0f + RND(0.1f);
            for (size_t i = 0; i < (size_t)H * di; i++) d->ssm_out[i] = RND(0.5f);
        }
    }
#undef RND
    return 0;
}

/* A hybrid of pattern pat made from the tiny model (tiny_hybrid_as),
 * exported as llama.cpp's architecture arch with dtype's tensors and run
 * there as our engine runs it (llama_compare: perplexity, tokenization,
 * greedy tokens; without node-llama-cpp the caller skips). Returns 0 with *hy the
 * caller's. */
static int tiny_hybrid_in_llama(const char *pat, int latent, const char *arch, int dtype, ac_model *hy) {
    ac_model t;
    ac_err e;
    int *ids = NULL;
    size_t n = 0;
    if (ac_model_load(tiny, &t, &e) || ac_load_text_ids(tiny, heldout, &ids, &n, t.a.vocab, &e) ||
        tiny_hybrid_as(&t, pat, latent, hy, &e)) {
        CHECK(0, "%s: %s", arch, e.msg);
        return -1;
    }
    CHECK(!strcmp(ac_gguf_arch_name(&hy->a), arch) && ac_gguf_check_arch(&hy->a, &e) == 0, "%s arch: %s", arch,
          e.msg);
    const char *why = llama_missing();
    size_t tl;
    char *text = heldout_lines(&tl);
    char path[1200];
    snprintf(path, sizeof path, "%s/%s_%d.gguf", tmpdir, arch, latent);
    CHECK(ac_gguf_write(hy, tiny_tok, path, dtype, &e) == 0, "%s", e.msg);
    if (!why) llama_compare(hy, path, arch, ids, n, text, tl); /* else the caller skips, saying why */
    free(text);
    free(ids);
    ac_model_free(&t);
    return 0;
}

/* llama.cpp's nemotron_h (Mamba-2, attention without RoPE, relu^2 MLP)
 * runs our GGUF export as our engine does (perplexity, tokenization,
 * greedy tokens); what it cannot hold is refused. */
static void test_nemotron_h_gguf(void) {
    if (!have_tiny()) SKIP("no tiny model (make tiny-model)");
    ac_model hy;
    ac_err e;
    if (tiny_hybrid_in_llama("M*-M*-", 0, "nemotron_h", ST_BF16, &hy)) return;
    hy.a.layers[0].ssm_heads = 4; /* one Mamba-head count in llama.cpp's nemotron_h */
    CHECK(ac_gguf_check_arch(&hy.a, &e) != 0 && strstr(e.msg, "Mamba-head count"), "mixed Mamba heads: %s", e.msg);
    hy.a.layers[0].ssm_heads = 8;
    ac_model_free(&hy);
    const char *why = llama_missing();
    if (why) SKIP("the nemotron_h export was checked here but not in llama.cpp: %s", why);
}

/* A GGUF file's scalar keys and tensor infos, read with nothing of ours
 * (the format as ggml documents it): a key's number (bools and integers
 * as is, floats widened), a tensor's dims and ggml type. */
typedef struct {
    char name[96];
    int tensor, ndim, type;
    long long ne[4];
    double v;
} gguf_item;
typedef struct {
    int n;
    gguf_item *items;
} gguf_head;
static int gg_rd(FILE *f, void *p, size_t n) { return fread(p, 1, n, f) == n ? 0 : -1; }
static int gg_rdstr(FILE *f, char *out, size_t cap) {
    uint64_t n;
    if (gg_rd(f, &n, 8) || n > 1u << 20) return -1;
    for (uint64_t i = 0; i < n; i++) {
        int c = fgetc(f);
        if (c == EOF) return -1;
        if (i + 1 < cap) out[i] = (char)c, out[i + 1] = 0;
    }
    if (!n && cap) out[0] = 0;
    return 0;
}
/* one value of type ty into *v (strings skipped) */
static int gg_rdval(FILE *f, uint32_t ty, double *v) {
    static const int sz[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    unsigned char b[8] = {0};
    char skip[8];
    if (ty == 8) return gg_rdstr(f, skip, sizeof skip);
    if (ty == 9) {
        uint32_t et;
        uint64_t n;
        if (gg_rd(f, &et, 4) || gg_rd(f, &n, 8) || et == 9) return -1;
        for (uint64_t i = 0; i < n; i++)
            if (gg_rdval(f, et, v)) return -1;
        return 0;
    }
    if (ty > 12 || gg_rd(f, b, (size_t)sz[ty])) return -1;
    float fl;
    double db;
    memcpy(&fl, b, 4), memcpy(&db, b, 8);
    *v = ty == 6 ? fl : ty == 12 ? db : ty == 5 ? *(int32_t *)(void *)b : (double)*(uint64_t *)(void *)b;
    return 0;
}
static int gguf_head_read(const char *path, gguf_head *g) {
    FILE *f = fopen(path, "rb");
    uint32_t magic, ver;
    uint64_t nt, nkv;
    int rc = -1;
    g->n = 0, g->items = NULL;
    if (!f || gg_rd(f, &magic, 4) || gg_rd(f, &ver, 4) || gg_rd(f, &nt, 8) || gg_rd(f, &nkv, 8) || nt + nkv > 100000)
        goto out;
    if (!(g->items = calloc(nt + nkv + 1, sizeof *g->items))) goto out;
    for (uint64_t i = 0; i < nkv; i++) {
        gguf_item *it = &g->items[g->n++];
        uint32_t ty;
        if (gg_rdstr(f, it->name, sizeof it->name) || gg_rd(f, &ty, 4) || gg_rdval(f, ty, &it->v)) goto out;
    }
    for (uint64_t i = 0; i < nt; i++) {
        gguf_item *it = &g->items[g->n++];
        uint32_t nd, ty;
        uint64_t off;
        it->tensor = 1;
        if (gg_rdstr(f, it->name, sizeof it->name) || gg_rd(f, &nd, 4) || nd > 4) goto out;
        it->ndim = (int)nd;
        for (uint32_t d = 0; d < nd; d++)
            if (gg_rd(f, &it->ne[d], 8)) goto out;
        if (gg_rd(f, &ty, 4) || gg_rd(f, &off, 8)) goto out;
        it->type = (int)ty;
    }
    rc = magic == 0x46554747u ? 0 : -1; /* "GGUF" */
out:
    if (f) fclose(f);
    if (rc) free(g->items), g->items = NULL;
    return rc;
}
static const gguf_item *gguf_item_find(const gguf_head *g, const char *name) {
    for (int i = 0; i < g->n; i++)
        if (!strcmp(g->items[i].name, name)) return &g->items[i];
    return NULL;
}

/* The nemotron_h_moe export of the MoE fixture (MEM*E, 6 experts of 24,
 * top-2, scale 2.5, shared 36), read back with gguf_head_read: the keys
 * llama.cpp's loader reads, the stacked experts without a gate, the
 * correction bias F32 and equal to the model's; a dense MLP layer beside
 * MoE ones refused. */
static void test_nemotron_h_moe_gguf_keys(void) {
    char dir[1100], path[1200];
    ck_build_path(dir, sizeof dir, "fixtures/models/nemotronh_moe_bf16");
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!ck_exists(path)) SKIP("no nemotron_h MoE fixture (make fixtures)");
    ac_model m;
    ac_err e;
    CHECK(ac_model_load(dir, &m, &e) == 0, "%s", e.msg);
    CHECK(!strcmp(ac_gguf_arch_name(&m.a), "nemotron_h_moe") && ac_gguf_check_arch(&m.a, &e) == 0,
          "nemotron_h_moe arch: %s", e.msg);
    snprintf(path, sizeof path, "%s/nemotron_h_moe_keys.gguf", tmpdir);
    CHECK(ac_gguf_write(&m, NULL, path, ST_BF16, &e) == 0, "%s", e.msg);
    gguf_head g;
    if (gguf_head_read(path, &g) == 0) {
        const gguf_item *kc = gguf_item_find(&g, "nemotron_h_moe.expert_count"),
                        *ku = gguf_item_find(&g, "nemotron_h_moe.expert_used_count"),
                        *kfe = gguf_item_find(&g, "nemotron_h_moe.expert_feed_forward_length"),
                        *ks = gguf_item_find(&g, "nemotron_h_moe.expert_weights_scale"),
                        *kn = gguf_item_find(&g, "nemotron_h_moe.expert_weights_norm"),
                        *kf = gguf_item_find(&g, "nemotron_h_moe.expert_shared_feed_forward_length"),
                        *up = gguf_item_find(&g, "blk.1.ffn_up_exps.weight"),
                        *dn = gguf_item_find(&g, "blk.4.ffn_down_exps.weight"),
                        *gi = gguf_item_find(&g, "blk.1.ffn_gate_inp.weight"),
                        *pb = gguf_item_find(&g, "blk.1.exp_probs_b.bias");
        CHECK(kc && kc->v == 6 && ku && ku->v == 2 && kfe && kfe->v == 24 && ks && ks->v == 2.5 && kn && kn->v == 1 &&
                  kf && kf->v == 36,
              "nemotron_h_moe keys");
        CHECK(up && up->ndim == 3 && up->ne[0] == 40 && up->ne[1] == 24 && up->ne[2] == 6 && up->type == 30 && dn &&
                  dn->ne[0] == 24 && dn->ne[1] == 40 && dn->ne[2] == 6 && gi && gi->ne[0] == 40 && gi->ne[1] == 6 &&
                  pb && pb->ndim == 1 && pb->ne[0] == 6 && pb->type == 0 &&
                  !gguf_item_find(&g, "blk.1.ffn_gate_exps.weight") &&
                  gguf_item_find(&g, "blk.1.ffn_up_shexp.weight") && gguf_item_find(&g, "blk.4.ffn_down_shexp.weight"),
              "nemotron_h_moe tensors");
        free(g.items);
    } else
        CHECK(0, "cannot read back %s", path);
    m.a.layers[3] = (ac_layer_arch){0, 0, 8, 0, 0, 0}; /* a dense MLP beside MoE layers */
    CHECK(ac_gguf_check_arch(&m.a, &e) != 0 && strstr(e.msg, "dense MLP"), "dense MLP in nemotron_h_moe: %s", e.msg);
    m.a.layers[3] = (ac_layer_arch){4, 2, 0, 0, 0, 0};
    ac_model_free(&m);
    /* LatentMoE (ME*E, latent 24): moe_latent_size, ffn_latent_down/up, the experts on the latent width */
    ck_build_path(dir, sizeof dir, "fixtures/models/nemotronh_latent_bf16");
    CHECK(ac_model_load(dir, &m, &e) == 0 && ac_gguf_write(&m, NULL, path, ST_BF16, &e) == 0, "%s", e.msg);
    if (gguf_head_read(path, &g) == 0) {
        const gguf_item *kl = gguf_item_find(&g, "nemotron_h_moe.moe_latent_size"),
                        *ld = gguf_item_find(&g, "blk.1.ffn_latent_down.weight"),
                        *lu = gguf_item_find(&g, "blk.3.ffn_latent_up.weight"),
                        *up = gguf_item_find(&g, "blk.1.ffn_up_exps.weight"),
                        *dn = gguf_item_find(&g, "blk.3.ffn_down_exps.weight");
        CHECK(kl && kl->v == 24 && ld && ld->ne[0] == 40 && ld->ne[1] == 24 && lu && lu->ne[0] == 24 &&
                  lu->ne[1] == 40 && up && up->ne[0] == 24 && up->ne[1] == 20 && up->ne[2] == 6 && dn &&
                  dn->ne[0] == 20 && dn->ne[1] == 24,
              "LatentMoE keys and tensors");
        free(g.items);
    } else
        CHECK(0, "cannot read back %s", path);
    ac_model_free(&m);
}

/* llama.cpp's nemotron_h_moe (the same with MoE layers: sigmoid router
 * with the correction bias, relu^2 experts and shared expert, scale,
 * renormalisation; and with LatentMoE's projections) runs our GGUF export
 * of a hybrid made from the tiny model as our engine does; mixed expert
 * widths are refused. The export is F32: on this near-random model (its
 * Mamba and MoE layers random, perplexity about 1300) BF16 rounding flips
 * the expert choice of rows near a tie, which moves the flat logits enough
 * to change greedy tokens; in F32 llama.cpp agrees to 2e-7 in perplexity,
 * where dropping the scale, the renormalisation or the correction bias
 * moves ours by 5.8%, 4.3% and 0.3%. A first layer that is MoE (E*EM*E)
 * runs too (its MoE keys written once). */
static void test_nemotron_h_moe_gguf(void) {
    if (!have_tiny()) SKIP("no tiny model (make tiny-model)");
    ac_model hy;
    ac_err e;
    if (tiny_hybrid_in_llama("M*EM*E", 0, "nemotron_h_moe", ST_F32, &hy)) return;
    hy.a.layers[2].expert_ffn = 16; /* one expert width in llama.cpp */
    CHECK(ac_gguf_check_arch(&hy.a, &e) != 0 && strstr(e.msg, "one expert count"), "mixed expert widths: %s", e.msg);
    hy.a.layers[2].expert_ffn = 32;
    ac_model_free(&hy);
    /* LatentMoE: the experts on half the hidden width */
    ac_model t;
    CHECK(ac_model_load(tiny, &t, &e) == 0, "%s", e.msg);
    int lt = t.a.hidden / 2;
    ac_model_free(&t);
    if (tiny_hybrid_in_llama("M*EM*E", lt, "nemotron_h_moe", ST_F32, &hy)) return;
    ac_model_free(&hy);
    /* layer 0 MoE: the MoE keys once (they were written twice, a file llama.cpp refuses) */
    if (tiny_hybrid_in_llama("E*EM*E", 0, "nemotron_h_moe", ST_F32, &hy)) return;
    ac_model_free(&hy);
    const char *why = llama_missing();
    if (why) SKIP("the nemotron_h_moe exports were checked here but not in llama.cpp: %s", why);
}

/* ---- nemotron_h / nemotron_h_moe read back ---- */

/* The Mamba heads of every layer together. */
static int hybrid_mamba_heads(const ac_arch *a) {
    int n = 0;
    for (int l = 0; l < a->n_layers; l++) n += a->layers[l].ssm_heads;
    return n;
}
/* The architecture fields of a hybrid the GGUF file carries (arch_same and
 * the Mamba, MoE-router and LatentMoE ones; the Mamba head width and conv
 * bias only when some layer is Mamba, as the file says them then only). */
static int hybrid_arch_same(const ac_arch *x, const ac_arch *y) {
    int mamba = hybrid_mamba_heads(x) > 0;
    return arch_same(x, y) && !strcmp(x->model_type, y->model_type) && x->hybrid == y->hybrid &&
           (!mamba || (x->ssm_head_dim == y->ssm_head_dim && x->ssm_conv_bias == y->ssm_conv_bias)) &&
           x->ssm_state == y->ssm_state && x->ssm_groups == y->ssm_groups && x->ssm_conv == y->ssm_conv &&
           x->router_sigmoid == y->router_sigmoid && x->routed_scale == y->routed_scale &&
           x->shared_ffn == y->shared_ffn && x->moe_latent == y->moe_latent && x->mtp_layers == y->mtp_layers;
}

/* One tensor of a hybrid layer: its values, count, whether a matrix (BF16 in
 * a BF16 export; the conv, norms, biases and per-head vectors stay F32). */
typedef struct {
    const float *p;
    size_t n;
    int mat;
    const char *what;
} hy_tensor;

/* Every tensor of layer l of m, listed from model.h's layout (not the writer's list). */
static int hybrid_tensors(const ac_model *m, int l, hy_tensor *t, int cap) {
    const ac_arch *a = &m->a;
    const ac_layer_arch *L = &a->layers[l];
    const ac_layer_w *w = &m->L[l];
    size_t H = a->hidden, hd = a->head_dim, n = 0;
#define HY(ptr, cnt, mt)                                                                                               \
    if ((int)n < cap) t[n++] = (hy_tensor) {                                                                           \
            ptr, cnt, mt, #ptr                                                                                         \
        }
    if (L->ssm_heads) {
        size_t nh = L->ssm_heads, di = nh * a->ssm_head_dim, C = di + 2 * (size_t)a->ssm_groups * a->ssm_state;
        HY(w->in_norm, H, 0);
        HY(w->ssm_in, (di + C + nh) * H, 1);
        HY(w->ssm_out, H * di, 1);
        HY(w->conv_w, C * a->ssm_conv, 0);
        if (a->ssm_conv_bias) HY(w->conv_b, C, 0);
        HY(w->dt_bias, nh, 0);
        HY(w->ssm_d, nh, 0);
        HY(w->ssm_norm, di, 0); /* A_log: compared on its own (hybrid_a_log) */
    }
    if (L->n_heads) {
        size_t q = L->n_heads * hd, kv = L->n_kv_heads * hd;
        HY(w->in_norm, H, 0);
        HY(w->wq, q * H, 1);
        HY(w->wk, kv * H, 1);
        HY(w->wv, kv * H, 1);
        HY(w->wo, H * q, 1);
    }
    if (L->ffn) {
        HY(w->post_norm, H, 0);
        HY(w->wu, L->ffn * H, 1);
        HY(w->wd, H * L->ffn, 1);
    }
    if (L->n_experts) {
        size_t E = L->n_experts, Fe = L->expert_ffn, Fs = a->shared_ffn, Hin = a->moe_latent ? (size_t)a->moe_latent : H;
        HY(w->post_norm, H, 0);
        HY(w->router, E * H, 1);
        HY(w->router_bias, E, 0);
        HY(w->sh_u, Fs * H, 1);
        HY(w->sh_d, H * Fs, 1);
        if (a->moe_latent) {
            HY(w->lat_down, Hin * H, 1);
            HY(w->lat_up, H * Hin, 1);
        }
        for (size_t x = 0; x < E; x++) {
            HY(w->eu[x], Fe * Hin, 1);
            HY(w->ed[x], Hin * Fe, 1);
        }
    }
#undef HY
    return (int)n;
}

/* x rounded to BF16 (nearest, ties to even) and back: what a BF16 export holds. */
static float bf16_of(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* Values of r (read back) that are not bit for bit m's, or with bf16 m's
 * matrices rounded to BF16; A_log apart. */
static size_t hybrid_mismatches(const ac_model *m, const ac_model *r, int bf16, const char **first) {
    size_t bad = 0, V = (size_t)m->a.vocab * m->a.hidden;
    *first = NULL;
    hy_tensor tm[64], tr[64];
    const float *gm[3] = {m->embed, m->lm_head, m->final_norm}, *gr[3] = {r->embed, r->lm_head, r->final_norm};
    size_t gn[3] = {V, V, (size_t)m->a.hidden};
    for (int i = 0; i < 3; i++)
        for (size_t j = 0; j < gn[i]; j++) {
            float want = bf16 && i < 2 ? bf16_of(gm[i][j]) : gm[i][j];
            if (memcmp(&want, &gr[i][j], 4)) bad++, *first = *first ? *first : "embed/lm_head/final_norm";
        }
    for (int l = 0; l < m->a.n_layers; l++) {
        int n = hybrid_tensors(m, l, tm, 64);
        if (hybrid_tensors(r, l, tr, 64) != n) return (size_t)-1;
        for (int i = 0; i < n; i++)
            for (size_t j = 0; j < tm[i].n; j++) {
                float want = bf16 && tm[i].mat ? bf16_of(tm[i].p[j]) : tm[i].p[j];
                if (memcmp(&want, &tr[i].p[j], 4)) bad++, *first = *first ? *first : tm[i].what;
            }
    }
    return bad;
}

/* Largest |A_log difference| of r against m; *same: how many heads' A =
 * -exp(A_log) (in float, as the writer and llama.cpp hold it) agree bit for bit. */
static double hybrid_a_log(const ac_model *m, const ac_model *r, int *heads, int *same) {
    double worst = 0;
    *heads = *same = 0;
    for (int l = 0; l < m->a.n_layers; l++)
        for (int h = 0; h < m->a.layers[l].ssm_heads; h++) {
            float x = m->L[l].a_log[h], y = r->L[l].a_log[h];
            worst = fmax(worst, fabs((double)x - y));
            if (isnan(y)) worst = INFINITY;
            (*heads)++;
            *same += -expf(x) == -expf(y);
        }
    return worst;
}

/* Export hybrid m as GGUF (dtype), read it back with our reader: the same
 * architecture; every tensor bit-identical (F32) or the BF16 values the
 * writer wrote (matrices; the rest F32, exact); A_log exact (from the
 * autocompress.ssm_a_log key); in F32 identical logits. Then the same file
 * with that key renamed (as llama.cpp's converter would write it): A_log
 * from log(-ssm_a), each head's A the file's, A_log within 2 ulp of 1
 * (3e-7 * max(1, |A_log|)), the rest as before. */
static void hybrid_roundtrip(const ac_model *m, const char *tok, int dtype, const char *name) {
    char path[200];
    ac_err e;
    ac_model r;
    int bf16 = dtype == ST_BF16, heads, same;
    const char *first;
    snprintf(path, sizeof path, "%s/%s_%s.gguf", tmpdir, name, bf16 ? "bf16" : "f32");
    CHECK(ac_gguf_write(m, tok, path, dtype, &e) == 0, "%s: %s", name, e.msg);
    if (ac_model_load(path, &r, &e)) {
        CHECK(0, "%s: load: %s", name, e.msg);
        return;
    }
    int as = hybrid_arch_same(&m->a, &r.a);
    CHECK(as, "%s: architecture differs after the round trip", name);
    if (!as) {
        ac_model_free(&r);
        return;
    }
    size_t bad = hybrid_mismatches(m, &r, bf16, &first);
    double wa = hybrid_a_log(m, &r, &heads, &same);
    CHECK(bad == 0, "%s: %zu values differ from what was written (first in %s)", name, bad, first ? first : "?");
    CHECK(wa == 0 && same == heads, "%s: A_log differs by %g (%d of %d heads' A alike)", name, wa, same, heads);
    int toks[24];
    for (int i = 0; i < 24; i++) toks[i] = (i * 37 + 11) % m->a.vocab;
    double mx = 0, d = bf16 ? 0 : logits_diff(m, &r, toks, 24, &mx);
    CHECK(d == 0, "%s: logits differ by %g (max |logit| %g)", name, d, mx);
    ac_model_free(&r);
    if (!hybrid_mamba_heads(&m->a)) return; /* no A_log, no key */
    /* the key renamed in place: the reader falls back to log(-A) */
    size_t len;
    char *buf = ac_read_file(path, 1u << 30, &len, &e), *k = NULL;
    for (size_t i = 0; buf && !k && i + 22 <= len; i++)
        if (!memcmp(buf + i, "autocompress.ssm_a_log", 22)) k = buf + i;
    CHECK(k != NULL, "%s: no autocompress.ssm_a_log key in the file", name);
    if (k) k[21] = 'X';
    if (k && ac_gguf_load_buf(buf, len, &r, NULL, &e) == 0) {
        bad = hybrid_mismatches(m, &r, bf16, &first);
        double worst_rel = 0;
        for (int l = 0; l < m->a.n_layers; l++)
            for (int h = 0; h < m->a.layers[l].ssm_heads; h++) {
                double x = m->L[l].a_log[h], y = r.L[l].a_log[h];
                worst_rel = fmax(worst_rel, isnan(y) ? INFINITY : fabs(x - y) / fmax(1, fabs(x)));
            }
        wa = hybrid_a_log(m, &r, &heads, &same);
        d = bf16 ? 0 : logits_diff(m, &r, toks, 24, &mx);
        printf("   %s (%s): every tensor as written; without the A_log key A_log within %.3g (%d of %d heads' A "
               "alike)",
               name, bf16 ? "BF16" : "F32", wa, same, heads);
        if (!bf16) printf(", logits within %.3g of max |logit| %.3g", d, mx);
        printf("\n");
        CHECK(bad == 0 && worst_rel <= 3e-7 && same == heads,
              "%s: without the key: %zu other values differ, A_log by %g (%d of %d heads' A alike)", name, bad, wa,
              same, heads);
        CHECK(d <= 1e-4 * fmax(1, mx), "%s: without the key the logits differ by %g", name, d);
        ac_model_free(&r);
    } else if (k)
        CHECK(0, "%s: without the key: %s", name, e.msg);
    free(buf);
}

/* A hybrid export (hybrid_roundtrip's F32 file of m) cut short at every
 * 97th byte never loads; an A_log of -200 (ssm_a = -exp(-200) = -0 in
 * float) is refused, naming ssm_a. */
static void hybrid_bad_files(ac_model *m, const char *name) {
    char path[200];
    ac_err e;
    size_t len;
    snprintf(path, sizeof path, "%s/%s_f32.gguf", tmpdir, name);
    char *buf = ac_read_file(path, 1u << 30, &len, &e);
    if (!buf) {
        CHECK(0, "%s: %s", name, e.msg);
        return;
    }
    int loaded = 0, tried = 0;
    ac_model r;
    for (size_t cut = 0; cut < len; cut += 97, tried++)
        if (ac_gguf_load_buf(buf, cut, &r, NULL, &e) == 0) loaded++, ac_model_free(&r);
    CHECK(loaded == 0, "%s: %d of %d truncated copies loaded", name, loaded, tried);
    printf("   %s: %d truncated copies refused\n", name, tried - loaded);
    free(buf);
    int l = 0;
    while (l < m->a.n_layers && !m->a.layers[l].ssm_heads) l++;
    if (l == m->a.n_layers) return;
    float keep = m->L[l].a_log[1];
    m->L[l].a_log[1] = -200;
    snprintf(path, sizeof path, "%s/%s_a0.gguf", tmpdir, name);
    CHECK(ac_gguf_write(m, NULL, path, ST_F32, &e) == 0, "%s", e.msg);
    CHECK(ac_model_load(path, &r, &e) != 0 && strstr(e.msg, "ssm_a[1]") && strstr(e.msg, "not negative"),
          "%s: an ssm_a of -0: %s", name, e.msg);
    printf("   %s: an ssm_a of -0 refused: %s\n", name, e.msg);
    m->L[l].a_log[1] = keep;
}

/* Our reader gets back what we export as nemotron_h and nemotron_h_moe:
 * the dense, MoE and LatentMoE hybrids made from the tiny model (trained
 * attention and MLP weights, random Mamba and MoE ones; F32 and BF16) and
 * the hybrid fixtures (config.json models: dense, MoE, MoE without
 * renormalisation, LatentMoE; F32); truncated and -0 ssm_a files refused. */
static void test_nemotron_h_gguf_read(void) {
    ac_err e;
    int ran = 0;
    if (have_tiny()) {
        ac_model t, hy;
        CHECK(ac_model_load(tiny, &t, &e) == 0, "%s", e.msg);
        const char *pats[3] = {"M*-M*-", "M*EM*E", "M*EM*E"}, *names[3] = {"nemotron_h", "nemotron_h_moe", "latent"};
        for (int i = 0; i < 3; i++) {
            if (tiny_hybrid_as(&t, pats[i], i == 2 ? t.a.hidden / 2 : 0, &hy, &e)) {
                CHECK(0, "%s: %s", names[i], e.msg);
                continue;
            }
            if (i == 0) /* what a config.json without MoE layers holds */
                hy.a.top_k = 0, hy.a.norm_topk = 0, hy.a.router_sigmoid = 0, hy.a.routed_scale = 0;
            for (int bf = 0; bf < 2; bf++) hybrid_roundtrip(&hy, tiny_tok, bf ? ST_BF16 : ST_F32, names[i]);
            ac_model_free(&hy);
            ran++;
        }
        ac_model_free(&t);
    }
    const char *fx[4] = {"nemotronh_bf16", "nemotronh_moe_bf16", "nemotronh_moe_nonorm_f32", "nemotronh_latent_bf16"};
    for (int i = 0; i < 4; i++) {
        char d[1100], c[1200];
        ck_build_path(d, sizeof d, "fixtures/models/");
        strcat(d, fx[i]);
        snprintf(c, sizeof c, "%s/config.json", d);
        if (!ck_exists(c)) continue;
        ac_model m;
        if (ac_model_load(d, &m, &e)) {
            CHECK(0, "%s: %s", fx[i], e.msg);
            continue;
        }
        hybrid_roundtrip(&m, NULL, ST_F32, fx[i]);
        if (i == 3) hybrid_bad_files(&m, fx[i]);
        ac_model_free(&m);
        ran++;
    }
    if (!ran) SKIP("no tiny model nor hybrid fixtures (make tiny-model fixtures)");
}

/* ---- SentencePiece-style and GPT-2 tokenizers through GGUF metadata ---- */

/* Encode every case of fixtures/tok/NAME through a GGUF written with its
 * tokenizer.json; ids must equal the expected (sentencepiece library /
 * Python reference) ones. Returns the number of cases checked. */
static int tok_cases(const char *name, int vocab) {
    char d[1100], tj[1200], cj[1200], path[200];
    ck_build_path(d, sizeof d, "fixtures/tok/");
    strcat(d, name);
    snprintf(tj, sizeof tj, "%s/tokenizer.json", d);
    snprintf(cj, sizeof cj, "%s/cases.json", d);
    if (!ck_exists(tj) || !ck_exists(cj)) return 0;
    ac_arch a = {.vocab = vocab,
                 .hidden = 8,
                 .head_dim = 4,
                 .n_layers = 1,
                 .max_pos = 64,
                 .eps = 1e-5f,
                 .rope_theta = 1e4f,
                 .bos_id = 1,
                 .eos_id = 2};
    ac_layer_arch L = {2, 1, 8, 0, 0, 0};
    a.layers = &L;
    ac_model m;
    ac_err e;
    ac_tokenizer *t = NULL;
    if (ac_model_alloc(&m, &a, &e)) return 0;
    snprintf(path, sizeof path, "%s/tok_%s.gguf", tmpdir, name);
    CHECK(ac_gguf_write(&m, tj, path, ST_F32, &e) == 0 && ac_gguf_tokenizer(path, &t, &e) == 0, "%s: %s", name, e.msg);
    ac_model_free(&m);
    json_error_t je;
    json_t *cases = json_load_file(cj, 0, &je);
    int n = 0;
    for (size_t i = 0; t && i < json_array_size(cases); i++, n++) {
        json_t *c = json_array_get(cases, i), *want = json_object_get(c, "ids");
        const char *text = json_string_value(json_object_get(c, "text"));
        /* GGUF has llama.cpp's (and SentencePiece's) rule: the space prefix
         * always goes in; Metaspace "first" skips it before a leading space */
        if (!strcmp(name, "sp_metaspace") && text[0] == ' ') {
            n--;
            continue;
        }
        int *ids;
        size_t k;
        if (ac_tok_encode(t, text, strlen(text), &ids, &k, &e)) {
            CHECK(0, "%s: %s", name, e.msg);
            continue;
        }
        int same = k == json_array_size(want);
        for (size_t j = 0; same && j < k; j++) same = ids[j] == json_integer_value(json_array_get(want, j));
        CHECK(same, "%s case %zu: %zu ids, %zu expected (or different ids) for \"%.40s\"", name, i, k,
              json_array_size(want), text);
        free(ids);
    }
    /* llama.cpp's tokenizer on the same file: the expected ids too */
    if (t && !llama_missing() && strcmp(name, "tiny")) { /* tiny's: by llama_compare on held-out text */
        json_t *texts = json_array();
        for (size_t i = 0; i < json_array_size(cases); i++) {
            const char *text = json_string_value(json_object_get(json_array_get(cases, i), "text"));
            if (!strstr(text, "<|endoftext|>") && !(text[0] == ' ' && !strcmp(name, "sp_metaspace")) &&
                strlen(text) < 200)
                json_array_append_new(texts, json_string(text));
        }
        json_t *job = json_pack("{s:[[i,i,i]],s:s,s:[i],s:i,s:o}", "windows", 3, 4, 5, "text", "a", "prompt", 3, "gen",
                                1, "texts", texts);
        json_t *out = run_llama(path, job);
        CHECK(out != NULL, "%s: llama.cpp did not load the tokenizer", name);
        size_t k = 0, agree = 0;
        for (size_t i = 0; out && i < json_array_size(cases); i++) {
            const char *text = json_string_value(json_object_get(json_array_get(cases, i), "text"));
            if (strstr(text, "<|endoftext|>") || (text[0] == ' ' && !strcmp(name, "sp_metaspace")) ||
                strlen(text) >= 200)
                continue;
            json_t *got = json_array_get(json_object_get(out, "texts_tokens"), k++),
                   *want = json_object_get(json_array_get(cases, i), "ids");
            agree += json_equal(got, want);
            CHECK(json_equal(got, want), "%s: llama.cpp tokenizes case %zu (\"%.30s\") differently", name, i, text);
        }
        if (out) printf("  %s: llama.cpp's tokenizer agrees on %zu of %zu cases\n", name, agree, k);
        json_decref(out);
        json_decref(job);
    }
    json_decref(cases);
    ac_tok_free(t);
    return n;
}

static void test_tokenizers_from_metadata(void) {
    static const char *const names[] = {"sp_legacy", "sp_metaspace", "gpt2style", "tiny"};
    static const int vocab[] = {1000, 1000, 512, 768};
    char missing[200] = "";
    int n = 0;
    for (int i = 0; i < 4; i++) {
        int k = tok_cases(names[i], vocab[i]);
        if (!k) snprintf(missing + strlen(missing), sizeof missing - strlen(missing), " %s", names[i]);
        n += k;
    }
    printf("  %d tokenizer cases through GGUF metadata\n", n);
    /* every fixture's cases, and llama.cpp's tokenizer on them, or a skip saying which did not run */
    if (missing[0]) SKIP("no tokenizer fixture%s (make fixtures; sp_* need python3-sentencepiece)", missing);
    const char *why = llama_missing();
    if (why) SKIP("the cases were checked here but not in llama.cpp's tokenizer: %s", why);
}

/* ---- malformed files ---- */

static void test_truncated_and_corrupt_files(void) {
    char path[200], bad[200];
    snprintf(path, sizeof path, "%s/tiny.gguf", tmpdir);
    snprintf(bad, sizeof bad, "%s/cut.gguf", tmpdir);
    size_t len;
    ac_err e;
    char *buf = ac_read_file(path, 1 << 26, &len, &e);
    if (!buf) SKIP("no tiny.gguf (the round-trip test writes it)");
    int crashes = 0, loaded = 0;
    for (size_t cut = 0; cut < len; cut += cut < 200000 ? 1499 : 99991) {
        FILE *f = fopen(bad, "wb");
        fwrite(buf, 1, cut, f);
        fclose(f);
        ac_model m;
        ac_tokenizer *t;
        if (ac_model_load(bad, &m, &e) == 0) {
            loaded++;
            ac_model_free(&m);
        }
        if (ac_gguf_tokenizer(bad, &t, &e) == 0) ac_tok_free(t);
    }
    CHECK(loaded == 0, "%d truncated files loaded", loaded);
    /* a huge metadata count and a bad magic are refused */
    FILE *f = fopen(bad, "wb");
    uint64_t big = 1ULL << 40;
    fwrite(buf, 1, 16, f);
    fwrite(&big, 8, 1, f);
    fwrite(buf + 24, 1, len - 24, f);
    fclose(f);
    ac_model m;
    CHECK(ac_model_load(bad, &m, &e) != 0 && strstr(e.msg, "metadata entries") && strstr(e.msg, "more than its"), "%s",
          e.msg);
    buf[0] = 'X';
    f = fopen(bad, "wb");
    fwrite(buf, 1, len, f);
    fclose(f);
    CHECK(ac_model_load(bad, &m, &e) != 0 && strstr(e.msg, "not a GGUF"), "%s", e.msg);
    (void)crashes;
    free(buf);
}

/* ---- the search keeps to what llama.cpp runs ---- */

/* Importance where early attention and late FFNs are the cheapest to
 * remove: an unconstrained search would drop layer 0's attention and keep
 * attention-only layers. */
static void skewed_importance(ac_importance *imp, const ac_arch *a) {
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
    imp->merge_n = calloc(L, sizeof(int));
    imp->merge_r = calloc(L, sizeof *imp->merge_r);
    imp->merge_sens = calloc(L, sizeof *imp->merge_sens);
    for (int l = 0; l < L; l++) {
        imp->kv_order[l] = calloc(a->layers[l].n_kv_heads + 1, sizeof(int));
        imp->kv_score[l] = calloc(a->layers[l].n_kv_heads + 1, sizeof(double));
        imp->ffn_order[l] = calloc(a->layers[l].ffn + 1, sizeof(int));
        imp->ffn_score[l] = calloc(a->layers[l].ffn + 1, sizeof(double));
        for (int i = 0; i < a->layers[l].n_kv_heads; i++) imp->kv_order[l][i] = i;
        for (int i = 0; i < a->layers[l].ffn; i++) imp->ffn_order[l][i] = i;
        for (int p = 0; p < AC_SENS_POINTS; p++) {
            double r = p / 4.0;
            imp->attn_sens[l][p] = 0.01 * (l + 1) * r;
            imp->ffn_sens[l][p] = 0.02 * (L - l) * r;
        }
        imp->layer_bi[l] = 1.0 / (l + 1);
    }
    imp->hid_order = calloc(a->hidden, sizeof(int));
    imp->hid_score = calloc(a->hidden, sizeof(double));
    for (int i = 0; i < a->hidden; i++) imp->hid_order[i] = i;
    double hf[4] = {0.125, 0.25, 0.5, 0.75};
    for (int i = 0; i < 4; i++) {
        imp->hid_frac[i] = hf[i];
        imp->hid_sens[i] = 50 * hf[i];
    }
}

static void test_search_keeps_to_llama_cpp(void) {
    ac_cost_table t;
    ac_err e;
    CHECK(ac_cost_roofline(ac_device_spec_find("H100"), "bf16", &t, &e) == 0, "%s", e.msg);
    ac_arch a = {.vocab = 32000,
                 .hidden = 1024,
                 .head_dim = 64,
                 .n_layers = 8,
                 .max_pos = 4096,
                 .eps = 1e-5f,
                 .rope_theta = 1e4f,
                 .bos_id = -1,
                 .eos_id = -1};
    a.layers = calloc(8, sizeof *a.layers);
    for (int l = 0; l < 8; l++) a.layers[l] = (ac_layer_arch){16, 8, 4096, 0, 0, 0};
    ac_importance imp;
    skewed_importance(&imp, &a);
    ac_engine_profile p;
    ac_engine_profile_default(&p, 0);
    ac_workload w = {.batch = 64, .prompt_len = 1024, .gen_len = 128};
    int bad = 0, runs = 0, removed = 0;
    for (int tgt = 0; tgt < 2; tgt++)
        for (int k = 0; k < 3; k++) {
            ac_search_problem P = {.table = &t, .workload = &w, .profile = &p, .imp = &imp, .base = &a};
            P.limits.max_params = (0.4 + 0.15 * k) * ac_arch_params(&a);
            P.opts = (ac_search_opts){.steps = 100,
                                      .seed = (unsigned)k,
                                      .lr = 0.03,
                                      .ffn_multiple = 256,
                                      .hidden_multiple = 64,
                                      .prune_hidden = 0,
                                      .target = tgt ? AC_EXPORT_GGUF : AC_EXPORT_DECI};
            ac_search_result r;
            if (ac_search_autocompress(&P, &r, &e)) {
                CHECK(0, "%s", e.msg);
                continue;
            }
            int ok = ac_gguf_check_arch(&r.arch, &e) == 0;
            if (tgt) {
                runs++;
                CHECK(r.feasible, "gguf search at %.2f of the parameters infeasible", 0.35 + 0.15 * k);
                CHECK(ok, "gguf search result: %s", e.msg);
                for (int l = 0; l < 8; l++) removed += r.arch.layers[l].n_heads == 0 || r.arch.layers[l].ffn == 0;
            } else
                bad += !ok;
            ac_search_result_free(&r);
        }
    printf("  gguf: %d searches keep to llama.cpp's rules (%d sub-blocks removed); the deci target breaks them in %d "
           "of 3\n",
           runs, removed, bad);
    CHECK(removed > 0, "the gguf searches removed no sub-block: the rules were not exercised");
    CHECK(bad > 0, "the skewed importance does not tempt the unconstrained search: the test proves nothing");
    ac_importance_free(&imp);
    ac_arch_free(&a);
    ac_cost_table_free(&t);
}

/* ---- job specs and jobs ---- */

static ac_job_spec spec_buf; /* 33 KB: off the stack */

/* The typed spec of s and the submission check on it (as daemon/http.c). */
static int check_json_spec(const json_t *s, const char **field, ac_err *e) {
    return ac_job_spec_parse(s, &spec_buf, field, e) || ac_gguf_check_spec(&spec_buf.search, spec_buf.model, field, e);
}

/* A 40-step gate search (the service default is 300): these jobs check exports, not the search. */
static json_t *tiny_spec(const char *target, int gguf_flag, const char *out) {
    char d[1100];
    ck_build_path(d, sizeof d, "data");
    json_t *s = json_pack("{s:s,s:s,s:s,s:s,s:{s:s,s:{s:i,s:i,s:i}},s:{s:i},s:{s:i,s:i},s:i,s:{s:i,s:i}}", "model", tiny,
                          "calibration", calib, "heldout", heldout, "output", out, "target", "device", "H100",
                          "workload", "batch", 8, "prompt_len", 256, "gen_len", 64, "constraints", "max_params", 900000,
                          "search", "steps", 60, "dnas_steps", 40, "calibration_tokens", 2048, "eval", "ctx", 128, "windows", 8);
    if (target) json_object_set_new(json_object_get(s, "search"), "export_target", json_string(target));
    if (gguf_flag) json_object_set_new(json_object_get(s, "search"), "gguf", json_true());
    return s;
}

static void test_spec_checks(void) {
    if (!have_tiny()) SKIP("no tiny model (make tiny-model)");
    ac_err e;
    const char *field = NULL;
    struct {
        const char *target;
        int flag;
        const char *want;
    } cases[] = {{"gguf", 0, NULL}, {"gguf-deci", 0, NULL},     {"llama", 1, NULL},
                 {"deci", 0, NULL}, {"deci", 1, "search.gguf"}, {NULL, 1, "search.gguf"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        json_t *s = tiny_spec(cases[i].target, cases[i].flag, "/tmp/x");
        int rc = check_json_spec(s, &field, &e);
        CHECK(cases[i].want ? rc != 0 && !strcmp(field, cases[i].want) : rc == 0, "case %zu (%s, gguf %d): %s", i,
              cases[i].target ? cases[i].target : "default", cases[i].flag, rc ? e.msg : "accepted");
        if (!rc && cases[i].target && !strncmp(cases[i].target, "gguf", 4)) /* gguf-deci: the old name of gguf */
            CHECK(spec_buf.search.target == AC_EXPORT_GGUF, "%s parses as export target %d", cases[i].target,
                  (int)spec_buf.search.target);
        json_decref(s);
    }
    /* a model llama.cpp's architectures cannot express: a sliding window */
    char mis[1100];
    ck_build_path(mis, sizeof mis, "fixtures/models/mistral_sharded");
    json_t *s = tiny_spec("gguf", 0, "/tmp/x");
    json_object_set_new(s, "model", json_string(mis));
    CHECK(check_json_spec(s, &field, &e) != 0 && strstr(e.msg, "sliding") && !strcmp(field, "model"),
          "sliding window: %s", e.msg);
    /* a tokenizer whose split regex llama.cpp has no pre type for */
    char dir[200], p[1300];
    snprintf(dir, sizeof dir, "%s/oddtok", tmpdir);
    mkdir(dir, 0755);
    json_error_t je;
    json_t *tj = json_load_file(tiny_tok, 0, &je), *cfg = NULL;
    snprintf(p, sizeof p, "%s/config.json", tiny);
    cfg = json_load_file(p, 0, &je);
    json_t *split = json_array_get(json_object_get(json_object_get(tj, "pre_tokenizer"), "pretokenizers"), 0);
    json_object_set_new(json_object_get(split, "pattern"), "Regex", json_string("\\p{L}+|\\s+|."));
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    json_dump_file(tj, p, 0);
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_dump_file(cfg, p, 0);
    json_object_set_new(s, "model", json_string(dir));
    CHECK(check_json_spec(s, &field, &e) != 0 && strstr(e.msg, "pre-tokenizer"), "odd regex: %s", e.msg);
    json_decref(tj);
    json_decref(cfg);
    json_decref(s);
}

static void quiet(void *ud, const char *kind, json_t *data) {
    (void)ud;
    (void)kind;
    (void)data;
}

/* A compression job with export target gguf (heterogeneous) and one with
 * llama + search.gguf (uniform): model.gguf is written, loads, keeps to
 * llama.cpp's rules, scores the report's perplexity, and runs in llama.cpp. */
static void test_jobs_write_gguf(void) {
    if (!have_tiny()) SKIP("no tiny model (make tiny-model)");
    const char *why = llama_missing();
    for (int k = 0; k < 2; k++) {
        char out[200], g[300];
        snprintf(out, sizeof out, "%s/job%d", tmpdir, k);
        snprintf(g, sizeof g, "%s/model.gguf", out);
        json_t *spec = tiny_spec(k ? "llama" : "gguf", k, out), *res = NULL;
        ac_job_ctx ctx = {.emit = quiet, .threads = ck_threads()};
        ac_err e;
        ac_model m;
        if (ac_job_spec_parse(spec, &spec_buf, NULL, &e) || ac_job_run(&spec_buf, &ctx, &res, &e)) {
            CHECK(0, "job %d: %s", k, e.msg);
            json_decref(spec);
            continue;
        }
        json_t *ac = json_object_get(res, "autocompress"),
               *xg = json_object_get(json_object_get(res, "export"), "gguf");
        if (ac_model_load(g, &m, &e)) {
            CHECK(0, "job %d: %s", k, e.msg);
            json_decref(res);
            json_decref(spec);
            continue;
        }
        CHECK(ac_gguf_check_arch(&m.a, &e) == 0, "job %d: %s", k, e.msg);
        CHECK(k ? ac_arch_is_uniform(&m.a) : !ac_arch_is_uniform(&m.a), "job %d: uniform %d", k,
              ac_arch_is_uniform(&m.a));
        CHECK(xg && !strcmp(json_string_value(json_object_get(xg, "architecture")), k ? "llama" : "deci"),
              "job %d: report export.gguf", k);
        int *ids;
        size_t n;
        ac_ppl_opts o = {.ctx = 128, .max_windows = 8, .batch = 4};
        ac_ppl_result r;
        CHECK(ac_load_text_ids(g, heldout, &ids, &n, m.a.vocab, &e) == 0 &&
                  ac_perplexity(&m, ids, n, &o, NULL, NULL, NULL, &r, &e) == 0,
              "%s", e.msg);
        /* the report scores the fp32 result; the exports hold it in BF16, the same in both files */
        double want = json_number_value(json_object_get(ac, "perplexity"));
        ac_model st;
        ac_ppl_result rs = {0};
        CHECK(ac_model_load(out, &st, &e) == 0 && ac_perplexity(&st, ids, n, &o, NULL, NULL, NULL, &rs, &e) == 0, "%s",
              e.msg);
        printf("  job %d (%s): model.gguf perplexity %.4f, the safetensors export %.4f, report (fp32) %.4f\n", k,
               k ? "llama + gguf" : "gguf", r.ppl, rs.ppl, want);
        CHECK(r.ppl == rs.ppl && fabs(r.ppl / want - 1) < 1e-3,
              "job %d: model.gguf perplexity %g, safetensors %g, report %g", k, r.ppl, rs.ppl, want);
        ac_model_free(&st);
        if (!why) {
            size_t tl;
            char *text = heldout_lines(&tl);
            llama_compare(&m, g, k ? "job_llama" : "job_gguf", ids, n, text, tl);
            free(text);
        }
        free(ids);
        ac_model_free(&m);
        json_decref(res);
        json_decref(spec);
    }
    if (why) SKIP("the jobs' GGUF files were checked here but not in llama.cpp: %s", why);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ac_gguf_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_llama_cpp_rules);
    RUN(test_uniform_roundtrip_bf16);
    RUN(test_fixture_roundtrips_f32);
    RUN(test_heterogeneous_roundtrip);
    RUN(test_tokenizers_from_metadata);
    RUN(test_truncated_and_corrupt_files);
    RUN(test_search_keeps_to_llama_cpp);
    RUN(test_llama_cpp_runs_exports);
    RUN(test_llama_cpp_runs_qwen3);
    RUN(test_moe_gguf);
    RUN(test_nemotron_h_gguf);
    RUN(test_nemotron_h_moe_gguf_keys);
    RUN(test_nemotron_h_moe_gguf);
    RUN(test_nemotron_h_gguf_read);
    RUN(test_spec_checks);
    RUN(test_jobs_write_gguf);
    char cmd[128];
    if (getenv("AC_KEEP_TMP")) return DONE();
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd)) fprintf(stderr, "cannot remove %s\n", tmpdir);
    return DONE();
}
