/*
 * autocompress - the command-line front of the library (no daemon):
 *   autocompress eval MODEL_DIR TEXT_FILE [--ctx N] [--windows N] [--stride N]
 *                     [--batch N] [--threads N] [--device cpu|cuda] [--json]
 *   autocompress compress SPEC.json     (same code path as the daemon's worker)
 *   autocompress estimate REQUEST.json  (as POST /v1/estimate)
 *   autocompress tokenize TOKENIZER_JSON TEXT_FILE   (ids, one line)
 *   autocompress export-gguf MODEL_DIR OUT.gguf [--f32]  (llama.cpp's format)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "costmodel.h"
#include "eval.h"
#include "gguf.h"
#include "job.h"
#include "kernels_cpu.h"
#include "model.h"
#include "safetensors.h"
#include "tokenizer.h"

static int usage(void) {
    fprintf(stderr,
            "usage:\n"
            "  autocompress eval MODEL_DIR TEXT_FILE [--ctx N] [--windows N] [--stride N] [--batch N] [--threads N] [--device cpu|cuda] [--json]\n"
            "  autocompress compress SPEC.json        (AC_COST_DB=FILE caches measured cost tables)\n"
            "  autocompress estimate REQUEST.json     ({\"model\"|\"architecture\", \"target\"}, as POST /v1/estimate)\n"
            "  autocompress tokenize TOKENIZER_JSON TEXT_FILE\n"
            "  autocompress export-gguf MODEL_DIR OUT.gguf [--f32]   (BF16 weights unless --f32)\n");
    return 2;
}

static int cmd_eval(int argc, char **argv) {
    if (argc < 4) return usage();
    ac_ppl_opts o = {.ctx = 128, .stride = 0, .max_windows = 0, .batch = 4};
    int json = 0, threads = 2;
    for (int i = 4; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (i + 1 < argc && !strcmp(argv[i], "--ctx")) o.ctx = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--windows")) o.max_windows = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--stride")) o.stride = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--batch")) o.batch = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--threads")) threads = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--device") && (!strcmp(argv[i + 1], "cpu") || !strcmp(argv[i + 1], "cuda")))
            o.cuda = !strcmp(argv[++i], "cuda");
        else return usage();
    }
    ac_set_threads(threads);
    ac_err e = {{0}};
    ac_model m;
    int *ids = NULL;
    size_t n = 0;
    if (ac_model_load(argv[2], &m, &e)) { fprintf(stderr, "autocompress: %s\n", e.msg); return 1; }
    if (ac_load_text_ids(argv[2], argv[3], &ids, &n, m.a.vocab, &e)) { fprintf(stderr, "autocompress: %s\n", e.msg); ac_model_free(&m); return 1; }
    ac_ppl_result r;
    int rc = ac_perplexity(&m, ids, n, &o, NULL, NULL, NULL, &r, &e);
    if (rc) fprintf(stderr, "autocompress: %s\n", e.msg);
    else if (json)
        printf("{\"ppl\":%.6f,\"nll\":%.6f,\"tokens\":%ld,\"scored\":%ld,\"windows\":%d,\"ctx\":%d,\"stride\":%d,\"tok_per_s\":%.1f,\"seconds\":%.3f,\"engine\":\"%s\"}\n",
               r.ppl, r.nll, r.processed, r.scored, r.windows, o.ctx, o.stride, r.tok_per_s, r.seconds, r.engine);
    else
        printf("perplexity %.4f over %ld scored tokens (%d windows of %d, %s); %.0f tokens/s (%ld tokens, %.2f s, %s)\n", r.ppl, r.scored,
               r.windows, o.ctx, o.stride ? "sliding" : "non-overlapping", r.tok_per_s, r.processed, r.seconds, r.engine);
    free(ids);
    ac_model_free(&m);
    return rc ? 1 : 0;
}

static int cmd_export_gguf(int argc, char **argv) {
    if (argc < 4 || argc > 5 || (argc == 5 && strcmp(argv[4], "--f32"))) return usage();
    ac_err e = {{0}};
    ac_model m;
    char tok[4200];
    snprintf(tok, sizeof tok, "%s/tokenizer.json", argv[2]);
    if (ac_model_load(argv[2], &m, &e)) { fprintf(stderr, "autocompress: %s\n", e.msg); return 1; }
    int rc = ac_gguf_write(&m, tok, argv[3], argc == 5 ? ST_F32 : ST_BF16, &e);
    if (rc) fprintf(stderr, "autocompress: %s\n", e.msg);
    ac_model_free(&m);
    return rc ? 1 : 0;
}

static int cmd_tokenize(int argc, char **argv) {
    if (argc != 4) return usage();
    ac_err e = {{0}};
    ac_tokenizer *t;
    size_t len, n;
    int *ids;
    if (ac_tok_load(argv[2], &t, &e)) { fprintf(stderr, "autocompress: %s\n", e.msg); return 1; }
    char *text = ac_read_file(argv[3], 1u << 30, &len, &e);
    if (!text || ac_tok_encode(t, text, len, &ids, &n, &e)) {
        fprintf(stderr, "autocompress: %s\n", e.msg);
        free(text);
        ac_tok_free(t);
        return 1;
    }
    for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    free(ids);
    free(text);
    ac_tok_free(t);
    return 0;
}

static void print_event(void *ud, const char *kind, json_t *data) {
    (void)ud;
    json_t *ev = json_pack("{s:s,s:O}", "kind", kind, "data", data);
    char *s = json_dumps(ev, JSON_COMPACT);
    printf("%s\n", s);
    fflush(stdout);
    free(s);
    json_decref(ev);
}

static int cmd_compress(int argc, char **argv) {
    if (argc != 3) return usage();
    ac_err e = {{0}};
    json_error_t je;
    json_t *spec = json_load_file(argv[2], JSON_REJECT_DUPLICATES, &je);
    if (!spec) { fprintf(stderr, "autocompress: %s: %s (line %d)\n", argv[2], je.text, je.line); return 1; }
    ac_job_ctx ctx = {.emit = print_event, .ud = NULL, .cancelled = NULL, .cost_db = getenv("AC_COST_DB"), .store_cost_tables = 1};
    json_t *result = NULL;
    int rc = ac_job_validate(spec, &e) || ac_job_run(spec, &ctx, &result, &e);
    if (rc) fprintf(stderr, "autocompress: %s\n", e.msg);
    else print_event(NULL, "result", result);
    json_decref(result);
    json_decref(spec);
    return rc ? 1 : 0;
}

static int cmd_estimate(int argc, char **argv) {
    if (argc != 3) return usage();
    json_error_t je;
    json_t *req = json_load_file(argv[2], JSON_REJECT_DUPLICATES, &je);
    if (!req) { fprintf(stderr, "autocompress: %s: %s\n", argv[2], je.text); return 1; }
    ac_err e = {{0}};
    json_t *out = NULL;
    const char *field = NULL;
    int rc = ac_estimate_json(req, getenv("AC_COST_DB"), &out, &field, &e);
    if (rc) fprintf(stderr, "autocompress: %s%s%s\n", field ? field : "", field ? ": " : "", e.msg);
    else {
        char *s = json_dumps(out, JSON_INDENT(2));
        printf("%s\n", s);
        free(s);
    }
    json_decref(out);
    json_decref(req);
    return rc ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage();
    if (!strcmp(argv[1], "eval")) return cmd_eval(argc, argv);
    if (!strcmp(argv[1], "tokenize")) return cmd_tokenize(argc, argv);
    if (!strcmp(argv[1], "compress")) return cmd_compress(argc, argv);
    if (!strcmp(argv[1], "estimate")) return cmd_estimate(argc, argv);
    if (!strcmp(argv[1], "export-gguf")) return cmd_export_gguf(argc, argv);
    return usage();
}
