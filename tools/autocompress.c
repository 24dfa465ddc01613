/*
 * autocompress - the command-line front: the daemon's client (remote.c:
 * submit, status, list, logs, cancel, wait, report, download; see remote.h)
 * and the library without a daemon:
 *   autocompress eval MODEL_DIR TEXT_FILE [--ctx N] [--windows N] [--stride N]
 *                     [--batch N] [--threads N] [--device cpu|cuda] [--gemm bf16|exact] [--json]
 *   autocompress tasks MODEL_DIR TASK.jsonl... [--batch N] [--max-len N] [--threads N] [--gemm bf16|exact] [--lls]
 *                                       (multiple-choice accuracy, as a job's eval.tasks; docs/tasks.md)
 *   autocompress compress SPEC.json     (same code path as the daemon's worker)
 *   autocompress estimate REQUEST.json  (as POST /v1/estimate)
 *   autocompress tokenize TOKENIZER_JSON TEXT_FILE   (ids, one line)
 *   autocompress export-gguf MODEL_DIR OUT.gguf [--f32]  (llama.cpp's format)
 *   autocompress prune MODEL_DIR ARCH.json OUT_DIR [--deci]
 *   autocompress validate SPEC.json     (what compress checks before it starts: {"ok":true} or the error
 *                                        and its field)
 *   autocompress schema                 (proto/job.schema.json, from the spec's field table)
 *   autocompress constraints            (web/constraints.js, from the constraint table)
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autocompress.h"
#include "costcache.h"
#include "daemon.h"
#include "remote.h"

#ifndef AC_VERSION
#define AC_VERSION "0.1.0"
#endif

/* The commands that run the library here (each answers --help with its line below). */
static const struct {
    const char *name, *line;
} LOCAL_CMDS[] = {
    {"eval", "eval MODEL_DIR TEXT_FILE [--ctx N] [--windows N] [--stride N] [--batch N] [--threads N] "
             "[--device cpu|cuda] [--gemm bf16|exact] [--json]\n      (held-out perplexity and tokens/s on this host)"},
    {"tasks", "tasks MODEL_DIR TASK.jsonl... [--batch N] [--max-len N] [--threads N] [--gemm bf16|exact] [--lls]\n      "
              "(multiple-choice accuracy as lm-evaluation-harness scores it, JSON by file name; --lls: each "
              "choice's log-likelihood)"},
    {"compress", "compress SPEC.json\n      (the job here, without a daemon; AC_COST_DB=FILE caches measured cost "
                 "tables; AC_QUIET_BUDGET_S=S caps their quiet re-measurement, as the daemon's quiet_budget_s; AC_THREADS=N: its "
                 "CPU threads, as the daemon's worker_threads, default 2, as eval's and tasks')"},
    {"estimate", "estimate REQUEST.json\n      ({\"model\"|\"architecture\", \"target\"}, as POST /v1/estimate; with "
                 "\"constraints\" on a\n       nemotron_h model: the structures that fit, config only)"},
    {"tokenize", "tokenize TOKENIZER_JSON TEXT_FILE\n      (token ids, one line)"},
    {"validate", "validate SPEC.json\n      (what compress checks before it starts: {\"ok\":true} or the error and "
                 "its field)"},
    {"schema", "schema\n      (the job spec's JSON schema, proto/job.schema.json)"},
    {"constraints", "constraints\n      (web/constraints.js, from the constraint table)"},
    {"model-card", "model-card REPORT.json\n      (the export's README.md from a job's report.json, as the job writes it)"},
    {"report-html", "report-html REPORT.json\n      (report.html from a job's report.json: the job's own page without its loss curves, which report.json does not keep)"},
    {"export-gguf", "export-gguf MODEL_DIR OUT.gguf [--f32]\n      (llama.cpp's format)"},
    {"prune", "prune MODEL_DIR ARCH.json OUT_DIR [--deci]\n      (slice to ARCH keeping the first channels; --deci: "
              "pad FFN widths to the deci grid,\n       fail when the deci target cannot express ARCH)"},
};

static void usage_to(FILE *f) {
    fprintf(f,
            "usage: autocompress [--server URL] [--token T] [--json] COMMAND [ARGS]   (--help after any command)\n"
            "       autocompress --version\n"
            "The daemon's client:\n%s"
            "Here, without a daemon:\n",
            remote_usage);
    for (size_t i = 0; i < sizeof LOCAL_CMDS / sizeof *LOCAL_CMDS; i++)
        fprintf(f, "  autocompress %s\n", LOCAL_CMDS[i].line);
}

static int usage(void) {
    usage_to(stderr);
    return 2;
}

/* `autocompress CMD --help` for a local command: its line, exit 0. */
static int local_help(const char *cmd) {
    for (size_t i = 0; i < sizeof LOCAL_CMDS / sizeof *LOCAL_CMDS; i++)
        if (!strcmp(LOCAL_CMDS[i].name, cmd)) {
            printf("usage: autocompress %s\n", LOCAL_CMDS[i].line);
            return 0;
        }
    return usage();
}

/* $AC_THREADS: the CPU threads of compress, eval and tasks unless --threads
 * says (as the daemon's worker_threads), and those of the CPU table
 * estimate reads; 2 when unset, -1 (said on stderr) when it is no number in
 * [1, 256]. */
static int env_threads(void) {
    const char *th = getenv("AC_THREADS");
    if (!th || !*th) return 2;
    char *end;
    long n = strtol(th, &end, 10);
    if (*end || n < 1 || n > 256) {
        fprintf(stderr, "autocompress: AC_THREADS must be a number of threads in [1, 256], not '%s'\n", th);
        return -1;
    }
    return (int)n;
}

static int cmd_eval(int argc, char **argv) {
    if (argc < 4) return usage();
    ac_ppl_opts o = {.ctx = 128, .stride = 0, .max_windows = 0, .batch = 4};
    int json = 0, threads = env_threads();
    if (threads < 0) return 1;
    for (int i = 4; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (i + 1 < argc && !strcmp(argv[i], "--ctx"))
            o.ctx = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--windows"))
            o.max_windows = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--stride"))
            o.stride = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--gemm")) { /* BF16 prefill GEMMs on AMX, or fp32 ones */
            const char *g = argv[++i];
            if (strcmp(g, "bf16") && strcmp(g, "exact")) return usage();
            ac_set_bf16_gemm_rows(strcmp(g, "exact") ? 32 : 0);
        } else if (i + 1 < argc && !strcmp(argv[i], "--batch"))
            o.batch = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--threads"))
            threads = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--device")) {
            ac_target tg; /* a local device: cpu, or the CUDA device this process sees first */
            ac_err te;
            if (ac_target_resolve(argv[++i], &tg, &te) || tg.kind == AC_TARGET_PROFILE || tg.ordinal > 0)
                return usage();
            o.cuda = tg.kind == AC_TARGET_CUDA;
        } else
            return usage();
    }
    ac_set_threads(threads);
    ac_err e = {{0}};
    ac_model m;
    int *ids = NULL;
    size_t n = 0;
    /* CPU: weights stay in their file dtype (mapped); the CUDA upload wants fp32 */
    if (ac_model_load_resident(argv[2], &m, &e)) { /* CUDA: uploaded from a transient fp32 copy */
        fprintf(stderr, "autocompress: %s\n", e.msg);
        return 1;
    }
    if (ac_load_text_ids(argv[2], argv[3], &ids, &n, m.a.vocab, &e)) {
        fprintf(stderr, "autocompress: %s\n", e.msg);
        ac_model_free(&m);
        return 1;
    }
    ac_ppl_result r;
    int rc = ac_perplexity(&m, ids, n, &o, NULL, NULL, NULL, &r, &e);
    if (rc)
        fprintf(stderr, "autocompress: %s\n", e.msg);
    else if (json)
        printf("{\"ppl\":%.6f,\"nll\":%.6f,\"tokens\":%ld,\"scored\":%ld,\"windows\":%d,\"ctx\":%d,\"stride\":%d,\"tok_"
               "per_s\":%.1f,\"seconds\":%.3f,\"engine\":\"%s\"}\n",
               r.ppl, r.nll, r.processed, r.scored, r.windows, o.ctx, o.stride, r.tok_per_s, r.seconds, r.engine);
    else
        printf(
            "perplexity %.4f over %ld scored tokens (%d windows of %d, %s); %.0f tokens/s (%ld tokens, %.2f s, %s)\n",
            r.ppl, r.scored, r.windows, o.ctx, o.stride ? "sliding" : "non-overlapping", r.tok_per_s, r.processed,
            r.seconds, r.engine);
    free(ids);
    ac_model_free(&m);
    return rc ? 1 : 0;
}

/* Each TASK.jsonl scored on the CPU engine, as a job's eval.tasks are:
 * {"NAME": {acc, acc_norm, n, stderr, ...}} with NAME the file's base name. */
static int cmd_tasks(int argc, char **argv) {
    if (argc < 4) return usage();
    int threads = env_threads(), batch = 8, lls = 0, max_len = 0;
    if (threads < 0) return 1;
    const char *files[64];
    int nf = 0;
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--lls"))
            lls = 1;
        else if (i + 1 < argc && !strcmp(argv[i], "--batch"))
            batch = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--max-len"))
            max_len = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--threads"))
            threads = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--gemm")) {
            const char *g = argv[++i];
            if (strcmp(g, "bf16") && strcmp(g, "exact")) return usage();
            ac_set_bf16_gemm_rows(strcmp(g, "exact") ? 32 : 0);
        } else if (argv[i][0] != '-' && nf < 64)
            files[nf++] = argv[i];
        else
            return usage();
    }
    if (!nf || batch < 1 || max_len < 0) return usage();
    ac_set_threads(threads);
    ac_err e = {{0}};
    ac_model m;
    if (ac_model_load_resident(argv[2], &m, &e)) {
        fprintf(stderr, "autocompress: %s\n", e.msg);
        return 1;
    }
    json_t *out = json_object();
    int rc = 0;
    for (int f = 0; f < nf && !rc; f++) {
        ac_mc_task t;
        ac_mc_result r;
        if (ac_mc_load_for(argv[2], &m.a, files[f], &t, &e)) {
            rc = 1;
            break;
        }
        double *ll = malloc(sizeof(double) * (t.nreq ? t.nreq : 1));
        rc = !ll || ac_mc_score(&m, &t, batch, max_len, ll, &r, &e);
        if (!rc) {
            json_t *j = ac_mc_result_json(&r);
            if (lls && j) {
                json_t *a = json_array();
                for (int d = 0; d < t.ndocs; d++) {
                    json_t *row = json_array();
                    for (int q = t.first[d]; q < t.first[d + 1]; q++) json_array_append_new(row, json_real(ll[q]));
                    json_array_append_new(a, row);
                }
                json_object_set_new(j, "lls", a);
            }
            const char *base = strrchr(files[f], '/') ? strrchr(files[f], '/') + 1 : files[f];
            char name[256];
            snprintf(name, sizeof name, "%s", base);
            char *dot = strstr(name, ".jsonl");
            if (dot && !dot[6]) *dot = 0;
            json_object_set_new(out, name, j);
        }
        free(ll);
        ac_mc_free(&t);
    }
    if (rc)
        fprintf(stderr, "autocompress: %s\n", e.msg[0] ? e.msg : "out of memory");
    else {
        char *s = json_dumps(out, JSON_COMPACT | JSON_REAL_PRECISION(17));
        if (s) puts(s);
        free(s);
    }
    json_decref(out);
    ac_model_free(&m);
    return rc;
}

static int cmd_export_gguf(int argc, char **argv) {
    if (argc < 4 || argc > 5 || (argc == 5 && strcmp(argv[4], "--f32"))) return usage();
    ac_err e = {{0}};
    ac_model m;
    char tok[4200];
    snprintf(tok, sizeof tok, "%s/tokenizer.json", argv[2]);
    if (ac_model_load_resident(argv[2], &m, &e)) { /* converted per tensor as it is written */
        fprintf(stderr, "autocompress: %s\n", e.msg);
        return 1;
    }
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
    if (ac_tok_load(argv[2], &t, &e)) {
        fprintf(stderr, "autocompress: %s\n", e.msg);
        return 1;
    }
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

/* Importance that keeps the first channels of every kind (no calibration). */
static int first_channels(const ac_arch *a, ac_importance *imp) {
    memset(imp, 0, sizeof *imp);
    imp->n_layers = a->n_layers;
    imp->hidden = a->hidden;
    imp->kv_order = calloc(a->n_layers, sizeof *imp->kv_order);
    imp->ffn_order = calloc(a->n_layers, sizeof *imp->ffn_order);
    imp->hid_order = malloc(sizeof(int) * (a->hidden + 1));
    if (!imp->kv_order || !imp->ffn_order || !imp->hid_order) return -1;
    for (int i = 0; i < a->hidden; i++) imp->hid_order[i] = i;
    for (int l = 0; l < a->n_layers; l++) {
        int kv = a->layers[l].n_kv_heads, f = a->layers[l].ffn;
        imp->kv_order[l] = malloc(sizeof(int) * (kv + 1));
        imp->ffn_order[l] = malloc(sizeof(int) * (f + 1));
        if (!imp->kv_order[l] || !imp->ffn_order[l]) return -1;
        for (int i = 0; i < kv; i++) imp->kv_order[l][i] = i;
        for (int i = 0; i < f; i++) imp->ffn_order[l][i] = i;
    }
    return 0;
}

static void first_channels_free(ac_importance *imp) {
    for (int l = 0; l < imp->n_layers; l++) {
        if (imp->kv_order) free(imp->kv_order[l]);
        if (imp->ffn_order) free(imp->ffn_order[l]);
    }
    free(imp->kv_order);
    free(imp->ffn_order);
    free(imp->hid_order);
}

static int cmd_prune(int argc, char **argv) {
    if (argc < 5 || argc > 6 || (argc == 6 && strcmp(argv[5], "--deci"))) return usage();
    ac_err e = {{0}};
    ac_model m = {0}, pm = {0};
    ac_arch req = {0}, t = {0};
    ac_importance imp = {0};
    json_error_t je;
    int rc = 1;
    json_t *aj = json_load_file(argv[3], JSON_REJECT_DUPLICATES, &je);
    if (!aj) {
        fprintf(stderr, "autocompress: %s: %s\n", argv[3], je.text);
        return 1;
    }
    if (ac_model_load_resident(argv[2], &m, &e) || ac_arch_from_json(aj, &m.a, &req, &e)) goto out;
    if (argc == 6 && (ac_deci_pad_arch(&req, &t, &e) || ac_deci_check_arch(&t, &e))) goto out;
    if (first_channels(&m.a, &imp)) {
        ac_errf(&e, "out of memory");
        goto out;
    }
    if (ac_prune(&m, &req, &imp, &pm, &e) || (argc == 6 && ac_deci_pad_model(&pm, &e))) goto out;
    if (ac_arch_is_hybrid(&pm.a)) ac_minitron_compact(&pm); /* removed layers out of hybrid_override_pattern */
    if (ac_model_save(&pm, argv[4], ST_BF16, &e)) goto out;
    char src[4200], dst[4200];
    snprintf(src, sizeof src, "%s/tokenizer.json", argv[2]);
    snprintf(dst, sizeof dst, "%s/tokenizer.json", argv[4]);
    FILE *in = fopen(src, "rb"), *o = in ? fopen(dst, "wb") : NULL;
    char buf[65536];
    size_t k;
    while (o && (k = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, k, o);
    if (in) fclose(in);
    if (o && fclose(o)) {
        ac_errf(&e, "cannot write %s", dst);
        goto out;
    }
    rc = 0;
out:
    if (rc) fprintf(stderr, "autocompress: %s\n", e.msg);
    first_channels_free(&imp);
    ac_model_free(&pm);
    ac_model_free(&m);
    ac_arch_free(&req);
    ac_arch_free(&t);
    json_decref(aj);
    return rc;
}

static void print_json_line(json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    if (s) printf("%s\n", s);
    fflush(stdout);
    free(s);
}

static void print_event(void *ud, const char *kind, json_t *data) {
    (void)ud;
    json_t *ev = json_pack("{s:s,s:O}", "kind", kind, "data", data);
    print_json_line(ev);
    json_decref(ev);
}

/* What compress and validate check before a job starts (the same function as the daemon's submit). */
static const ac_job_check_opts CLI_CHECK = {.need_output = 1};

static int cmd_compress(int argc, char **argv) {
    if (argc != 3) return usage();
    ac_err e = {{0}};
    json_error_t je;
    json_t *spec = json_load_file(argv[2], JSON_REJECT_DUPLICATES, &je);
    if (!spec) {
        fprintf(stderr, "autocompress: %s: %s (line %d)\n", argv[2], je.text, je.line);
        return 1;
    }
    const char *qb = getenv("AC_QUIET_BUDGET_S");
    if (qb && *qb) {
        char *end;
        double b = strtod(qb, &end);
        if (*end || !(b >= 0 && b <= 3600)) {
            fprintf(stderr, "autocompress: AC_QUIET_BUDGET_S must be a number of seconds in [0, 3600], not '%s'\n", qb);
            json_decref(spec);
            return 1;
        }
        ac_quiet_set_budget_cap(b);
    }
    int threads = env_threads();
    if (threads < 0) {
        json_decref(spec);
        return 1;
    }
    ac_cost_cache cache;
    costcache_file(&cache, getenv("AC_COST_DB"), 1);
    ac_job_ctx ctx = {.emit = print_event, .ud = NULL, .cancelled = NULL, .cache = &cache, .threads = threads};
    json_t *result = NULL;
    static ac_job_spec js;
    const char *field = NULL;
    ac_spec_verdict v = ac_job_spec_check(spec, &js, &CLI_CHECK, &field, &e);
    int rc = v != AC_SPEC_OK || ac_job_run(&js, &ctx, &result, &e);
    if (rc) /* a path's error names the field in front, as the daemon's invalid_path does */
        fprintf(stderr, "autocompress: %s%s%s\n", v == AC_SPEC_BAD_PATH && field ? field : "",
                v == AC_SPEC_BAD_PATH && field ? ": " : "", e.msg);
    else
        print_event(NULL, "result", result);
    json_decref(result);
    json_decref(spec);
    return rc ? 1 : 0;
}

static int cmd_estimate(int argc, char **argv) {
    if (argc != 3) return usage();
    json_error_t je;
    json_t *req = json_load_file(argv[2], JSON_REJECT_DUPLICATES, &je);
    if (!req) {
        fprintf(stderr, "autocompress: %s: %s\n", argv[2], je.text);
        return 1;
    }
    ac_err e = {{0}};
    json_t *out = NULL;
    const char *field = NULL;
    int threads = env_threads();
    if (threads < 0) {
        json_decref(req);
        return 1;
    }
    ac_cost_cache cache;
    costcache_file(&cache, getenv("AC_COST_DB"), 0);
    int rc = ac_estimate_json(req, &cache, threads, &out, &field, &e);
    if (rc)
        fprintf(stderr, "autocompress: %s%s%s\n", field ? field : "", field ? ": " : "", e.msg);
    else {
        char *s = json_dumps(out, JSON_INDENT(2));
        printf("%s\n", s);
        free(s);
    }
    json_decref(out);
    json_decref(req);
    return rc ? 1 : 0;
}

static int cmd_validate(int argc, char **argv) {
    if (argc != 3) return usage();
    json_error_t je;
    json_t *spec = json_load_file(argv[2], JSON_REJECT_DUPLICATES, &je);
    if (!spec) {
        fprintf(stderr, "autocompress: %s: %s (line %d)\n", argv[2], je.text, je.line);
        return 1;
    }
    static ac_job_spec js;
    ac_err e = {{0}};
    const char *field = NULL;
    int rc = ac_job_spec_check(spec, &js, &CLI_CHECK, &field, &e) != AC_SPEC_OK;
    json_t *out = rc ? json_pack("{s:b,s:s,s:s}", "ok", 0, "error", e.msg, "field", field ? field : "")
                     : json_pack("{s:b}", "ok", 1);
    print_json_line(out);
    json_decref(out);
    json_decref(spec);
    return rc ? 1 : 0;
}

static int cmd_schema(void) {
    json_t *s = ac_job_spec_schema();
    char *txt = json_dumps(s, JSON_INDENT(2));
    json_decref(s);
    if (!txt) return 1;
    printf("%s\n", txt);
    free(txt);
    return 0;
}

static char *report_html(const json_t *r) { return ac_report_html(r, NULL); }

/* model-card and report-html: a page made from a report.json, on stdout. */
static int cmd_render(int argc, char **argv, char *(*render)(const json_t *r)) {
    if (argc != 3) return usage();
    json_error_t je;
    json_t *r = json_load_file(argv[2], 0, &je);
    if (!r) {
        fprintf(stderr, "autocompress: %s: %s (line %d)\n", argv[2], je.text, je.line);
        return 1;
    }
    char *page = render(r);
    json_decref(r);
    if (!page) return 1;
    fputs(page, stdout);
    free(page);
    return 0;
}

static int cmd_constraints(void) {
    char *js = ac_constraint_table_js();
    if (!js) return 1;
    fputs(js, stdout);
    free(js);
    return 0;
}

int main(int argc, char **argv) {
    /* options before the command: the daemon client's, --version and --help */
    remote_globals g = {0};
    static const struct option gopts[] = {
        {"server", required_argument, 0, 's'}, {"token", required_argument, 0, 't'}, {"json", no_argument, 0, 'j'},
        {"version", no_argument, 0, 'V'},      {"help", no_argument, 0, 'h'},        {0, 0, 0, 0},
    };
    int o;
    while ((o = getopt_long(argc, argv, "+h", gopts, NULL)) != -1) switch (o) {
        case 's': g.server = optarg; break;
        case 't': g.token = optarg; break;
        case 'j': g.json = 1; break;
        case 'V': printf("autocompress %s\n", AC_VERSION); return 0;
        case 'h': usage_to(stdout); return 0;
        default: return usage();
        }
    if (optind >= argc) return usage();
    /* the local commands below read argv[1] as the command */
    argv += optind - 1;
    argc -= optind - 1;
    if (remote_is_command(argv[1])) return remote_main(&g, argc - 1, argv + 1);
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return local_help(argv[1]);
    if (!strcmp(argv[1], "eval")) return cmd_eval(argc, argv);
    if (!strcmp(argv[1], "tasks")) return cmd_tasks(argc, argv);
    if (!strcmp(argv[1], "tokenize")) return cmd_tokenize(argc, argv);
    if (!strcmp(argv[1], "compress")) return cmd_compress(argc, argv);
    if (!strcmp(argv[1], "estimate")) return cmd_estimate(argc, argv);
    if (!strcmp(argv[1], "export-gguf")) return cmd_export_gguf(argc, argv);
    if (!strcmp(argv[1], "prune")) return cmd_prune(argc, argv);
    if (!strcmp(argv[1], "validate")) return cmd_validate(argc, argv);
    if (!strcmp(argv[1], "model-card")) return cmd_render(argc, argv, ac_model_card);
    if (!strcmp(argv[1], "report-html")) return cmd_render(argc, argv, report_html);
    if (argc == 2 && !strcmp(argv[1], "schema")) return cmd_schema();
    if (argc == 2 && !strcmp(argv[1], "constraints")) return cmd_constraints();
    return usage();
}
