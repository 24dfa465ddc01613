/*
 * job.c - the compression pipeline (see job.h): load, calibrate, profile,
 * search, prune, evaluate, export. Each stage announces itself with a
 * "stage" event and reports progress; a failure names its stage.
 */
#include "job.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "costmodel.h"
#include "cuda_plugin.h"
#include "device.h"
#include "engine.h"
#include "eval.h"
#include "gguf.h"
#include "importance.h"
#include "kernels_cpu.h"
#include "prune.h"
#include "safetensors.h"
#include "search.h"
#include "tokenizer.h"

static const char *STAGES[] = {"load", "calibrate", "profile", "search", "prune", "evaluate", "export"};

typedef struct {
    ac_job_ctx *ctx;
    const char *stage;
    double last;
} run_t;

static void emit(run_t *r, const char *kind, json_t *data) {
    if (r->ctx->emit) r->ctx->emit(r->ctx->ud, kind, data);
    json_decref(data);
}

static int stage(run_t *r, int i, ac_err *e) {
    if (r->ctx->cancelled && *r->ctx->cancelled) return ac_errf(e, "cancelled");
    r->stage = STAGES[i];
    emit(r, "stage", json_pack("{s:s,s:i,s:i}", "stage", STAGES[i], "index", i + 1, "of", 7));
    return 0;
}

static void progress_cb(void *ud, const char *what, double frac) {
    run_t *r = ud;
    double now = ac_now();
    if (frac < 1 && now - r->last < 0.5) return;
    r->last = now;
    emit(r, "progress", json_pack("{s:s,s:s,s:f}", "stage", r->stage, "what", what, "fraction", frac));
}

static void progress_plain(void *ud, double frac) { progress_cb(ud, "measuring cost table", frac); }

static void search_emit(void *ud, json_t *ev) {
    run_t *r = ud;
    json_incref(ev);
    emit(r, "search", ev);
}

static double num(const json_t *o, const char *k, double def) {
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : def;
}

/* Best-of-3 TTFT / TPOT of a model for a workload, on the CPU engine or,
 * with cuda, the CUDA one (device 0 of the plugin). The minimum, like the
 * cost table's micro-benchmarks: neighbours on a shared machine only add time. */
static int measure_latency(int cuda, const ac_model *m, const int *ids, size_t n, int B, int P, int G, double *ttft, double *tpot,
                           ac_err *e) {
    ac_scorer *sc;
    if (ac_scorer_open(m, B, P + G, cuda, NULL, &sc, e)) return -1;
    int *tok = malloc(sizeof(int) * B * P), *nxt = malloc(sizeof(int) * B);
    for (int i = 0; i < B * P; i++) tok[i] = ids[i % n];
    double tt[3], tp[3];
    int rc = 0;
    for (int rep = 0; rep < 3 && !rc; rep++) {
        double t0 = ac_now();
        rc = ac_scorer_step(sc, tok, B, P, 0, e);
        tt[rep] = (ac_now() - t0) * 1e3;
        t0 = ac_now();
        for (int g = 1; g < G && !rc; g++) {
            for (int b = 0; b < B; b++) nxt[b] = ids[(b + g) % n];
            rc = ac_scorer_step(sc, nxt, B, 1, P + g - 1, e);
        }
        tp[rep] = G > 1 ? (ac_now() - t0) * 1e3 / (G - 1) : 0;
    }
    for (int i = 0; i < 3; i++) for (int j = i + 1; j < 3; j++) {
        if (tt[j] < tt[i]) { double t = tt[i]; tt[i] = tt[j]; tt[j] = t; }
        if (tp[j] < tp[i]) { double t = tp[i]; tp[i] = tp[j]; tp[j] = t; }
    }
    *ttft = tt[0];
    *tpot = tp[0];
    free(tok);
    free(nxt);
    ac_scorer_close(sc);
    return rc;
}

static int copy_file(const char *from, const char *to, ac_err *e) {
    size_t len;
    char *d = ac_read_file(from, 1u << 30, &len, e);
    if (!d) return -1;
    FILE *f = fopen(to, "wb");
    int ok = f && fwrite(d, 1, len, f) == len;
    if (f) ok = (fclose(f) == 0) && ok;
    free(d);
    return ok ? 0 : ac_errf(e, "cannot write %s: %s", to, strerror(errno));
}

static int mkdirs(const char *path) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') { *p = 0; mkdir(tmp, 0755); *p = '/'; }
    return mkdir(tmp, 0755) == 0 || errno == EEXIST ? 0 : -1;
}

int ac_job_run(const json_t *spec, ac_job_ctx *ctx, json_t **result, ac_err *e) {
    *result = NULL;
    if (ac_job_validate(spec, e) || ac_gguf_check_spec(spec, NULL, e)) return -1;
    run_t R = {.ctx = ctx};
    int threads = ctx->threads > 0 ? ctx->threads : 2;
    ac_set_threads(threads);
    double t_job = ac_now();
    json_t *timings = json_object();
    const char *model_dir = ac_job_path(spec, "model"), *calib = ac_job_path(spec, "calibration");
    const char *held = ac_job_path(spec, "heldout") ? ac_job_path(spec, "heldout") : calib;
    const char *out_dir = ac_job_path(spec, "output");
    const char *method = json_string_value(json_object_get(spec, "method")) ? json_string_value(json_object_get(spec, "method")) : "autocompress";
    json_t *target = json_object_get(spec, "target"), *cons = json_object_get(spec, "constraints"), *sj = json_object_get(spec, "search"),
           *ej = json_object_get(spec, "eval");
    if (!out_dir) return ac_errf(e, "output: no output directory given");
    int ctxlen = (int)num(ej, "ctx", 128), windows = (int)num(ej, "windows", 32);
    int calib_tokens = (int)num(spec, "calibration_tokens", 16384);
    ac_model m = {0};
    int *cids = NULL, *hids = NULL;
    size_t nc = 0, nh = 0;
    ac_importance imp = {0};
    ac_cost_table table = {0};
    ac_search_result ra = {0}, rm = {0};
    ac_model pa = {0}, pm = {0};
    json_t *report = NULL, *on_target = NULL;
    int rc = -1;
    double t0;

    /* 1 load */
    t0 = ac_now();
    if (stage(&R, 0, e)) goto out;
    {
        /* Pre-flight: the CPU engine holds the model in fp32 plus the pruned
         * copies (Minitron and AutoCompress results); fail with a clear
         * reason instead of being killed by the kernel's OOM killer. */
        ac_arch a0;
        if (ac_arch_load(model_dir, &a0, e)) { ac_errctx(e, "stage load"); goto out; }
        double need = ac_arch_params(&a0) * 4 * 3 / 1073741824.0;
        ac_arch_free(&a0);
        ac_local_device host[1];
        ac_devices_local(host, 1);
        if (host[0].mem_gib > 0 && need > 0.9 * host[0].mem_gib) {
            ac_errf(e, "stage load: the model needs about %.1f GiB of host memory (fp32 weights and two pruned copies) but this host has %.1f GiB",
                    need, host[0].mem_gib);
            goto out;
        }
    }
    if (ac_model_load(model_dir, &m, e)) { ac_errctx(e, "stage load"); goto out; }
    if (ac_load_text_ids(model_dir, calib, &cids, &nc, m.a.vocab, e) || ac_load_text_ids(model_dir, held, &hids, &nh, m.a.vocab, e)) {
        ac_errctx(e, "stage load");
        goto out;
    }
    if ((size_t)calib_tokens < nc) nc = (size_t)calib_tokens;
    if (nc < (size_t)ctxlen * 2) { ac_errf(e, "stage load: calibration text has %zu tokens; need at least %d (2 windows of eval.ctx)", nc, 2 * ctxlen); goto out; }
    if (nh < (size_t)ctxlen) { ac_errf(e, "stage load: held-out text has %zu tokens; need at least eval.ctx=%d", nh, ctxlen); goto out; }
    emit(&R, "log", json_pack("{s:s,s:o,s:I,s:I}", "message", "model loaded", "architecture", ac_arch_to_json(&m.a),
                              "calibration_tokens", (json_int_t)nc, "heldout_tokens", (json_int_t)nh));
    json_object_set_new(timings, "load", json_real(ac_now() - t0));

    /* 2 calibrate */
    t0 = ac_now();
    if (stage(&R, 1, e)) goto out;
    int cwin = (int)(nc / ctxlen);
    /* On a local CUDA target the loss passes (calibration sensitivity and
     * held-out perplexity) run on the GPU; activation statistics on the CPU. */
    const char *tdev = json_string_value(json_object_get(target, "device"));
    int on_gpu = tdev && !strncmp(tdev, "cuda", 4) && ac_cuda(NULL);
    if (ac_importance_compute(&m, cids, nc, ctxlen, cwin, on_gpu, progress_cb, &R, &imp, e)) { ac_errctx(e, "stage calibrate"); goto out; }
    json_object_set_new(timings, "calibrate", json_real(ac_now() - t0));

    /* 3 profile */
    t0 = ac_now();
    if (stage(&R, 2, e)) goto out;
    const char *device = json_string_value(json_object_get(target, "device"));
    int is_cpu = !strcmp(device, "cpu");
    ac_engine_profile prof;
    ac_workload wl;
    ac_engine_profile_default(&prof, is_cpu);
    if (ac_engine_profile_from_json(json_object_get(target, "engine"), &prof, e) || ac_workload_from_json(json_object_get(target, "workload"), &wl, e)) {
        ac_errctx(e, "stage profile");
        goto out;
    }
    const char *dtype = prof.w_bytes == 4 ? "fp32" : prof.w_bytes == 1 ? "fp8" : "bf16";
    int hit = 0;
    if (ac_cost_table_for(device, dtype, ctx->cost_db, threads, 1, progress_plain, &R, &table, &hit, e)) { ac_errctx(e, "stage profile"); goto out; }
    {
        json_t *ev = json_pack("{s:s,s:s,s:s,s:b,s:f}", "key", table.key, "device", table.device, "source", table.source, "cache_hit", hit,
                               "measure_seconds", table.measure_s);
        if (!hit && !table.roofline) json_object_set_new(ev, "table", ac_cost_table_to_json(&table));
        if (!hit && !table.roofline && ctx->cost_db && ctx->store_cost_tables && ac_cost_cache_put(ctx->cost_db, &table, e)) {
            json_decref(ev);
            ac_errctx(e, "stage profile");
            goto out;
        }
        emit(&R, "cost_table", ev);
    }
    json_object_set_new(timings, "profile", json_real(ac_now() - t0));

    /* 4 search */
    t0 = ac_now();
    if (stage(&R, 3, e)) goto out;
    ac_search_problem P = {.table = &table, .workload = &wl, .profile = &prof, .imp = &imp, .base = &m.a, .emit = search_emit, .ud = &R};
    P.limits = (ac_constraints){num(cons, "max_ttft_ms", 0), num(cons, "max_tpot_ms", 0), num(cons, "min_tokens_per_s", 0),
                                num(cons, "max_memory_gib", 0), num(cons, "max_params", 0)};
    const char *xt = json_string_value(json_object_get(sj, "export_target"));
    P.opts = (ac_search_opts){.steps = (int)num(sj, "steps", 300), .seed = (unsigned)num(sj, "seed", 0), .lr = num(sj, "lr", 0.03),
                              .ffn_multiple = (int)num(sj, "ffn_multiple", 32), .hidden_multiple = (int)num(sj, "hidden_multiple", 16),
                              .prune_hidden = json_object_get(sj, "prune_hidden") ? json_is_true(json_object_get(sj, "prune_hidden")) : 1,
                              .target = !xt || !strcmp(xt, "deci") ? AC_EXPORT_DECI : !strcmp(xt, "llama") ? AC_EXPORT_LLAMA : AC_EXPORT_GGUF};
    ac_carch base_c;
    ac_cost base_cost;
    if (ac_carch_from_arch(&m.a, &base_c, e)) goto out;
    ac_cost_predict(&table, &base_c, &wl, &prof, 0, &base_cost);
    ac_carch_free(&base_c);
    emit(&R, "log", json_pack("{s:s,s:o,s:o}", "message", "baseline prediction", "predicted", ac_cost_to_json(&base_cost), "constraints",
                              ac_constraints_report(&P.limits, &base_cost)));
    if (ac_search_minitron(&P, &rm, e)) { ac_errctx(e, "stage search"); goto out; }
    if (!strcmp(method, "autocompress") && ac_search_autocompress(&P, &ra, e)) { ac_errctx(e, "stage search"); goto out; }
    ac_search_result *chosen = !strcmp(method, "autocompress") ? &ra : &rm;
    json_object_set_new(timings, "search", json_real(ac_now() - t0));
    if (!chosen->feasible) {
        json_t *closest = ac_constraints_report(&P.limits, &chosen->cost);
        char *cs = json_dumps(closest, JSON_COMPACT);
        emit(&R, "infeasible", json_pack("{s:o,s:o,s:o}", "closest", closest, "predicted", ac_cost_to_json(&chosen->cost), "architecture",
                                         ac_arch_to_json(&chosen->arch)));
        ac_errf(e, "stage search: infeasible: the constraints cannot be met on %s for this workload even at the smallest architecture the export target allows; closest reachable: %s",
                table.device, cs ? cs : "?");
        free(cs);
        goto out;
    }

    /* 5 prune */
    t0 = ac_now();
    if (stage(&R, 4, e)) goto out;
    int repair = json_object_get(spec, "repair") ? json_is_true(json_object_get(spec, "repair")) : 1;
    int rep_a = 0, rep_m = 0;
    if (ac_prune(&m, &rm.arch, &imp, &pm, e)) { ac_errctx(e, "stage prune"); goto out; }
    if (repair && (rep_m = ac_repair_ffn(&m, &pm, &imp, cids, nc, ctxlen, cwin < 16 ? cwin : 16, e)) < 0) { ac_errctx(e, "stage prune"); goto out; }
    progress_cb(&R, "minitron pruned", 0.5);
    if (chosen == &ra) {
        if (ac_prune(&m, &ra.arch, &imp, &pa, e)) { ac_errctx(e, "stage prune"); goto out; }
        if (repair && (rep_a = ac_repair_ffn(&m, &pa, &imp, cids, nc, ctxlen, cwin < 16 ? cwin : 16, e)) < 0) { ac_errctx(e, "stage prune"); goto out; }
    }
    progress_cb(&R, "pruned", 1.0);
    json_object_set_new(timings, "prune", json_real(ac_now() - t0));

    /* 6 evaluate */
    t0 = ac_now();
    if (stage(&R, 5, e)) goto out;
    ac_ppl_opts po = {.ctx = ctxlen, .stride = 0, .max_windows = windows, .batch = 4, .cuda = on_gpu};
    ac_ppl_result pb, pmr, par = {0};
    if (ac_perplexity(&m, hids, nh, &po, NULL, NULL, NULL, &pb, e) || ac_perplexity(&pm, hids, nh, &po, NULL, NULL, NULL, &pmr, e) ||
        (chosen == &ra && ac_perplexity(&pa, hids, nh, &po, NULL, NULL, NULL, &par, e))) {
        ac_errctx(e, "stage evaluate");
        goto out;
    }
    progress_cb(&R, "perplexity", 0.5);
    /* Measured cost on the local CPU (small workload), against the CPU
     * table's prediction when one is at hand. */
    ac_workload lw = {wl.batch < 4 ? wl.batch : 4, wl.prompt_len < 128 ? wl.prompt_len : 128, wl.gen_len < 32 ? wl.gen_len : 32};
    const ac_model *res_model = chosen == &ra ? &pa : &pm;
    double bt, bp, rt, rp;
    if (measure_latency(0, &m, hids, nh, lw.batch, lw.prompt_len, lw.gen_len, &bt, &bp, e) ||
        measure_latency(0, res_model, hids, nh, lw.batch, lw.prompt_len, lw.gen_len, &rt, &rp, e)) {
        ac_errctx(e, "stage evaluate");
        goto out;
    }
    json_t *local = json_pack("{s:s,s:{s:i,s:i,s:i},s:{s:f,s:f},s:{s:f,s:f}}", "device", "cpu", "workload", "batch", lw.batch, "prompt_len",
                              lw.prompt_len, "gen_len", lw.gen_len, "base", "ttft_ms", bt, "tpot_ms", bp, "result", "ttft_ms", rt, "tpot_ms", rp);
    {
        ac_cost_table ct;
        int found = 0;
        ac_err e2;
        if (is_cpu) { ct = table; found = 1; }
        else {
            char key[384];
            ac_cost_cpu_key(threads, key, sizeof key, NULL, 0);
            ac_cost_cache_get(ctx->cost_db, key, &ct, &found, &e2);
        }
        if (found) {
            ac_engine_profile cp;
            ac_engine_profile_default(&cp, 1);
            ac_carch c1;
            ac_cost k1, k0;
            if (ac_carch_from_arch(&res_model->a, &c1, &e2) == 0) {
                ac_cost_predict(&ct, &c1, &lw, &cp, 0, &k1);
                ac_carch_free(&c1);
            }
            if (ac_carch_from_arch(&m.a, &c1, &e2) == 0) {
                ac_cost_predict(&ct, &c1, &lw, &cp, 0, &k0);
                ac_carch_free(&c1);
            }
            json_object_set_new(local, "predicted", json_pack("{s:{s:f,s:f},s:{s:f,s:f}}", "base", "ttft_ms", k0.ttft_ms, "tpot_ms", k0.tpot_ms,
                                                              "result", "ttft_ms", k1.ttft_ms, "tpot_ms", k1.tpot_ms));
            json_object_set_new(local, "prediction_error", json_pack("{s:f,s:f}", "ttft", k1.ttft_ms / rt - 1, "tpot", rp > 0 ? k1.tpot_ms / rp - 1 : 0));
            if (!is_cpu) ac_cost_table_free(&ct);
        }
    }
    /* On a local CUDA target: measured on that GPU against the GPU table's
     * prediction (the workload capped to keep the measurement short). */
    if (!strncmp(device, "cuda", 4)) {
        const ac_cuda_api *cu = ac_cuda(NULL);
        ac_workload gw = {wl.batch < 32 ? wl.batch : 32, wl.prompt_len < 2048 ? wl.prompt_len : 2048, wl.gen_len < 64 ? wl.gen_len : 64};
        double gbt, gbp, grt, grp;
        if (cu && measure_latency(1, &m, hids, nh, gw.batch, gw.prompt_len, gw.gen_len, &gbt, &gbp, e) == 0 &&
            measure_latency(1, res_model, hids, nh, gw.batch, gw.prompt_len, gw.gen_len, &grt, &grp, e) == 0) {
            ac_engine_profile gp = prof;
            gp.overhead_ms = 0; /* our engine, not a serving framework */
            ac_carch c1;
            ac_cost k1;
            if (ac_carch_from_arch(&res_model->a, &c1, e) == 0) {
                ac_cost_predict(&table, &c1, &gw, &gp, 0, &k1);
                ac_carch_free(&c1);
                on_target = json_pack("{s:s,s:{s:i,s:i,s:i},s:{s:f,s:f},s:{s:f,s:f},s:{s:f,s:f},s:{s:f,s:f}}", "device", table.device, "workload",
                                      "batch", gw.batch, "prompt_len", gw.prompt_len, "gen_len", gw.gen_len, "base", "ttft_ms", gbt, "tpot_ms", gbp,
                                      "result", "ttft_ms", grt, "tpot_ms", grp, "predicted_result", "ttft_ms", k1.ttft_ms, "tpot_ms", k1.tpot_ms,
                                      "prediction_error", "ttft", k1.ttft_ms / grt - 1, "tpot", grp > 0 ? k1.tpot_ms / grp - 1 : 0);
            }
        } else if (cu) {
            emit(&R, "log", json_pack("{s:s,s:s}", "message", "measuring on the target GPU failed", "error", e->msg));
        }
    }
    json_object_set_new(timings, "evaluate", json_real(ac_now() - t0));

    /* 7 export */
    t0 = ac_now();
    if (stage(&R, 6, e)) goto out;
    if (mkdirs(out_dir)) { ac_errf(e, "stage export: cannot create %s: %s", out_dir, strerror(errno)); goto out; }
    if (ac_model_save(res_model, out_dir, ST_BF16, e) || ac_gguf_export_job(spec, res_model, model_dir, out_dir, e)) {
        ac_errctx(e, "stage export");
        goto out;
    }
    char src[4200], dst[4200];
    snprintf(src, sizeof src, "%s/tokenizer.json", model_dir);
    snprintf(dst, sizeof dst, "%s/tokenizer.json", out_dir);
    if (copy_file(src, dst, e)) { ac_errctx(e, "stage export"); goto out; }
    json_object_set_new(timings, "export", json_real(ac_now() - t0));
    json_object_set_new(timings, "total", json_real(ac_now() - t_job));

#define RES(r, pp, rep) json_pack("{s:o,s:o,s:o,s:b,s:f,s:f,s:f,s:i,s:b}", "architecture", ac_arch_to_json(&(r)->arch), "predicted", \
                                  ac_cost_to_json(&(r)->cost), "constraints", ac_constraints_report(&P.limits, &(r)->cost), "feasible", \
                                  (r)->feasible, "predicted_loss_increase", (r)->pred_loss, "perplexity", (pp).ppl, "nll", (pp).nll, \
                                  "repaired_layers", rep, "uniform", ac_arch_is_uniform(&(r)->arch))
    report = json_pack("{s:s,s:s,s:{s:s,s:o},s:{s:s,s:s,s:s,s:s,s:b,s:{s:s,s:i,s:i,s:i,s:f,s:f,s:f},s:{s:i,s:i,s:i}},s:O,s:{s:o,s:f,s:f}}",
                       "version", "autocompress-report/1", "method", method,
                       "model", "path", model_dir, "architecture", ac_arch_to_json(&m.a),
                       "target", "device", device, "device_name", table.device, "cost_table", table.key, "cost_source", table.source,
                       "cache_hit", hit, "engine", "name", prof.name, "weight_bytes", prof.w_bytes, "kv_bytes", prof.kv_bytes,
                       "block_size", prof.block_size, "memory_utilization", prof.mem_util, "overhead_ms", prof.overhead_ms, "overhead_gib",
                       prof.overhead_gib, "workload", "batch", wl.batch, "prompt_len", wl.prompt_len, "gen_len", wl.gen_len,
                       "constraints", cons,
                       "baseline", "predicted", ac_cost_to_json(&base_cost), "perplexity", pb.ppl, "nll", pb.nll);
    json_object_set_new(report, "minitron", RES(&rm, pmr, rep_m));
    if (chosen == &ra) {
        json_object_set_new(report, "autocompress", RES(&ra, par, rep_a));
        json_object_set_new(report, "search", json_pack("{s:i,s:i,s:f}", "steps", ra.steps_run, "seed", (int)P.opts.seed, "lr", P.opts.lr));
    }
    json_object_set_new(report, "chosen", json_string(chosen == &ra ? "autocompress" : "minitron"));
    json_object_set_new(report, "measured_local", local);
    if (on_target) json_object_set_new(report, "measured_on_target", on_target);
    on_target = NULL;
    json_object_set_new(report, "eval_protocol", json_pack("{s:s,s:i,s:i,s:I,s:s,s:s}", "text", held, "ctx", ctxlen, "windows", pb.windows, "scored_tokens",
                                                           (json_int_t)pb.scored, "mode", "non-overlapping windows, every target in a window scored",
                                                           "engine", pb.engine));
    json_object_set_new(report, "importance", ac_importance_to_json(&imp));
    json_object_set_new(report, "export", json_pack("{s:s,s:s,s:s}", "dir", out_dir, "format",
                                                    ac_arch_is_uniform(&res_model->a) ? "LlamaForCausalLM" : "DeciLMForCausalLM (nemotron-nas block_configs)",
                                                    "dtype", "bf16"));
    ac_gguf_report(spec, &res_model->a, out_dir, json_object_get(report, "export"));
    json_object_set_new(report, "timings_s", timings);
    timings = NULL;
    snprintf(dst, sizeof dst, "%s/report.json", out_dir);
    if (json_dump_file(report, dst, JSON_INDENT(2))) { ac_errf(e, "stage export: cannot write %s", dst); goto out; }
    *result = report;
    report = NULL;
    rc = 0;
out:
    json_decref(on_target);
    json_decref(report);
    json_decref(timings);
    ac_model_free(&pa);
    ac_model_free(&pm);
    ac_search_result_free(&ra);
    ac_search_result_free(&rm);
    ac_cost_table_free(&table);
    ac_importance_free(&imp);
    free(cids);
    free(hids);
    ac_model_free(&m);
    return rc;
}
