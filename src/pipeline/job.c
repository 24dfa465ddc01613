/*
 * job.c - the compression pipeline (see job.h): a table of stage functions
 * run in order over one job_state (job_state_int.h). Each stage announces
 * itself with a "stage" event, reports progress, and on failure its error
 * is prefixed with "stage NAME". The report is built by report.c, latency
 * measured by measure.c.
 */
#include "pipeline/job.h"
#include "core/fsafe.h"
#include "core/fsafe_write.h"

#include <assert.h>
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "candidates_int.h"
#include "checkpoint_int.h"
#include "runtime/cuda_plugin.h"
#include "format/deci.h"
#include "cost/device.h"
#include "compress/distill.h"
#include "search/dnas.h"
#include "core/dtype.h"
#include "format/gguf.h"
#include "job_state_int.h"
#include "pipeline/jobcheck.h"
#include "runtime/kernels_cpu.h"
#include "jobpuzzle_int.h"
#include "measure_int.h"
#include "search/minitron.h"
#include "pipeline/modelcard.h"
#include "pipeline/reporthtml.h"
#include "compress/prune.h"
#include "students_int.h"

/* Every event of the job passes here (data borrowed): its loss points are
 * kept for report.html (ac_report_curves_add), then it goes to ctx->emit. */
static void job_emit(void *ud, const char *kind, json_t *data) {
    job_state *s = ud;
    if (!data) return;
    ac_report_curves_add(s->curves, kind, data);
    if (s->ctx->emit) s->ctx->emit(s->ctx->ud, kind, data);
}

static void emit(job_state *s, const char *kind, json_t *data) {
    job_emit(s, kind, data);
    json_decref(data);
}

static void progress_cb(void *ud, const char *what, double frac) {
    job_state *s = ud;
    double now = ac_now();
    if (frac < 1 && now - s->last_progress < 0.5) return;
    s->last_progress = now;
    emit(s, "progress", json_pack("{s:s,s:s,s:f}", "stage", s->stage, "what", what, "fraction", frac));
}

static void progress_plain(void *ud, double frac) { progress_cb(ud, "measuring cost table", frac); }

static void search_emit(void *ud, json_t *ev) {
    json_incref(ev);
    emit(ud, "search", ev);
}

/* ---------------------------------------------------------------- 1 load */

/* Pre-flight: the CPU engine holds the weights resident in their file dtype
 * (ac_model_load_resident, 2 bytes per parameter when 16-bit) plus one
 * pruned student at a time (BF16, at most the base's size; with two arms
 * the other is parked in a file, students_int.h) and at most one fp32 copy
 * (in evaluate a resident base's fp32 timing copy, or the result's; the
 * other arm is freed first): about 8 bytes per parameter.
 * Distillation (one student's fp32 weights, gradients and AdamW moments)
 * checks its own memory (distill.c). The CPU DNAS gate search holds no
 * weights of its own (its trainer reads the
 * resident weights one layer at a time; activations are checked by dnas.c),
 * nor does the CUDA one (the plugin converts each tensor on the device);
 * calibration's engine method and the Minitron search on a GPU hold one
 * pruned fp32 model at a time (masks are on a copy of one matrix, and the
 * CPU search scores masked views). Fail with a clear reason instead of
 * being killed by the kernel's OOM killer. */
static int check_host_memory(const char *model_dir, ac_err *e) {
    ac_arch a0;
    if (ac_arch_load(model_dir, &a0, e)) return -1;
    double need = ac_arch_params(&a0) * (2 + 2 + 4) / 1073741824.0;
    ac_arch_free(&a0);
    ac_local_device host[1];
    ac_devices_local(host, 1);
    if (host[0].mem_gib > 0 && need > 0.9 * host[0].mem_gib)
        return ac_errf(e,
                       "the model needs about %.1f GiB of host memory (8 bytes per parameter: its weights, one pruned "
                       "student and an fp32 timing copy) but this host has %.1f GiB",
                       need, host[0].mem_gib);
    return 0;
}

static int stage_load(job_state *s, ac_err *e) {
    const ac_job_spec *sp = s->spec;
    int ctxlen = sp->eval.ctx;
    const char *field;
    if (check_host_memory(sp->model, e) || ac_model_load_resident(sp->model, &s->m, e) ||
        ac_deci_validate_base(sp->search.target == AC_EXPORT_DECI, sp->method == AC_METHOD_MINITRON, &s->m.a, &field,
                              e))
        return -1;
    if (ac_load_text_ids(sp->model, sp->calibration, &s->cids, &s->nc, s->m.a.vocab, e) ||
        ac_load_text_ids(sp->model, sp->heldout, &s->hids, &s->nh, s->m.a.vocab, e))
        return -1;
    if ((size_t)sp->calibration_tokens < s->nc) s->nc = (size_t)sp->calibration_tokens;
    if (ac_job_tasks_load(&sp->eval, sp->model, &s->m.a, &s->tasks, e)) return -1;
    /* The engine profile the job predicts with: the spec's; on a CPU target
     * whose spec names no weights dtype, the checkpoint's: a BF16 one runs
     * on the CPU engine's BF16 kernels, as the BF16 export will, so its
     * tables are the BF16 ones (an F16 or fp32 checkpoint keeps fp32). */
    ac_target_engine_for(&sp->target, ac_model_wdt(&s->m), &s->engine);
    s->wdtype = ac_target_weights_dtype(&sp->target, ac_model_wdt(&s->m));
    s->table_dtype = ac_target_table_dtype(&sp->target, ac_model_wdt(&s->m));
    if (s->nc < (size_t)ctxlen * 2)
        return ac_errf(e, "calibration text has %zu tokens; need at least %d (2 windows of eval.ctx)", s->nc,
                       2 * ctxlen);
    if (s->nh < (size_t)ctxlen)
        return ac_errf(e, "held-out text has %zu tokens; need at least eval.ctx=%d", s->nh, ctxlen);
    emit(s, "log",
         json_pack("{s:s,s:o,s:I,s:I}", "message", "model loaded", "architecture", ac_arch_to_json(&s->m.a),
                   "calibration_tokens", (json_int_t)s->nc, "heldout_tokens", (json_int_t)s->nh));
    return 0;
}

/* ---------------------------------------------------------------- 2 calibrate */

/* What calibrate decides besides the importance (also for a restored one). */
static void calibrate_setup(job_state *s) {
    s->cwin = (int)(s->nc / s->spec->eval.ctx);
    /* On a local CUDA target the loss passes (calibration sensitivity and
     * held-out perplexity) run on the GPU; activation statistics on the CPU. */
    s->on_gpu = s->spec->target.dev.kind == AC_TARGET_CUDA && ac_cuda(NULL);
}

static int stage_calibrate(job_state *s, ac_err *e) {
    int ctxlen = s->spec->eval.ctx;
    calibrate_setup(s);
    return ac_importance_compute_mode(&s->m, s->cids, s->nc, ctxlen, s->cwin, s->on_gpu, s->spec->calibration_method,
                                      progress_cb, s, &s->imp, e);
}

/* ---------------------------------------------------------------- 3 profile */

/* How this CPU runs now against when table t was measured (quiet.h): 1
 * when the table's reference probe ran slower than the tolerance allows of
 * the quickest of three probes now (a neighbour slowed it; its figures are
 * then high), -1 when the probe now runs that much slower than the table's
 * (its figures are then low for now), else 0. *then, *now: the two probes.
 * Tables without a reference, or measured elsewhere, are taken as they are. */
static int has_quiet_ref(const ac_cost_table *t) {
    return !t->roofline && t->ref_us > 0 && !strcmp(t->source, "measured");
}
static int table_state(const ac_cost_table *t, double *then, double *now) {
    if (!has_quiet_ref(t)) return 0;
    double p = ac_cost_ref_probe_us();
    for (int i = 0; i < 2; i++) p = fmin(p, ac_cost_ref_probe_us());
    *then = t->ref_us;
    *now = p;
    return t->ref_us > AC_QUIET_TOL * p ? 1 : p > AC_QUIET_TOL * t->ref_us ? -1 : 0;
}

static int stage_profile(job_state *s, ac_err *e) {
    const ac_target_spec *t = &s->spec->target;
    const ac_cost_cache *cache = s->ctx->cache;
    ac_cost_table *tb = &s->table;
    if (ac_cost_table_for(&t->dev, s->table_dtype, cache, s->threads, 1, progress_plain, s, tb, &s->cache_hit, e))
        return -1;
    double then = 0, now = 0;
    /* a cached table measured slower than now: measure it again, quiet (one
     * measured quicker stays: the search plans for the CPU's quick state) */
    int replaced = s->cache_hit && t->dev.kind == AC_TARGET_CPU && table_state(tb, &then, &now) == 1;
    if (replaced) {
        emit(s, "log",
             json_pack("{s:s,s:f,s:f}", "message",
                       "the cached cost table was measured while this CPU ran slower than now: measuring it again",
                       "table_reference_probe_us", then, "reference_probe_us", now));
        ac_cost_table_free(tb);
        if (ac_cost_measure_cpu(s->threads, s->table_dtype, progress_plain, s, tb, e)) return -1;
        s->cache_hit = 0;
    }
    int measured = !s->cache_hit && !tb->roofline;
    json_t *ev = json_pack("{s:s,s:s,s:s,s:b,s:f}", "key", tb->key, "device", tb->device, "source", tb->source,
                           "cache_hit", s->cache_hit, "measure_seconds", tb->measure_s);
    if (replaced)
        json_object_set_new(ev, "replaced_slow_table",
                            json_pack("{s:f,s:f}", "table_reference_probe_us", then, "reference_probe_us", now));
    if (measured) json_object_set_new(ev, "table", ac_cost_table_to_json(tb));
    if (measured && cache && cache->put && cache->put(cache->ud, tb, e)) {
        json_decref(ev);
        return -1;
    }
    emit(s, "cost_table", ev);
    return 0;
}

/* ---------------------------------------------------------------- 4 search */

/* DNAS gate steps within a FLOP budget (docs/search.md, "Differentiable
 * search through the network"): a step is a forward and a backward, about
 * 6 FLOPs per parameter per token, over dnas_batch x dnas_seq_len tokens; at
 * most the steps asked, at least 50. The tiny model (300 steps = 0.63 TFLOP)
 * is unaffected. */
#define AC_DNAS_FLOP_BUDGET 2e13
static int dnas_steps_budgeted(const ac_search_opts *so, const ac_arch *a) {
    double cap = AC_DNAS_FLOP_BUDGET / (6.0 * ac_arch_params(a) * so->dnas_batch * so->dnas_seq_len);
    return so->dnas_steps <= cap ? so->dnas_steps : cap < 50 ? 50 : (int)cap;
}

/* The gate trainers read a resident model in its dtype and never write it:
 * the CPU one (train.c, frozen weights) one layer at a time, the CUDA
 * plugin's by converting each tensor on the device. KV-merge mixtures go to
 * a private buffer; cotrain trains an fp32 pruned copy. */
static int dnas_search(job_state *s, const ac_search_opts *so, ac_err *e) {
    return ac_dnas_job_search(&s->P, &s->m, so, s->cids, s->nc, &s->ra, &s->imp_d, e);
}

/* The search problem and the base model's prediction (also for restored results). */
static int search_setup(job_state *s, ac_err *e) {
    const ac_job_spec *sp = s->spec;
    ac_search_problem *P = &s->P;
    *P = (ac_search_problem){.table = &s->table,
                             .workload = &sp->target.workload,
                             .profile = &s->engine,
                             .imp = &s->imp,
                             .base = &s->m.a,
                             .limits = sp->limits,
                             .opts = sp->search,
                             .emit = search_emit,
                             .ud = s,
                             /* Minitron scores its top-k candidates by pruning them */
                             .model = &s->m,
                             .calib_ids = s->cids,
                             .n_calib = s->nc,
                             .ctx = sp->eval.ctx,
                             .cuda = s->on_gpu,
                             .minitron = sp->minitron.opts};
    if (sp->minitron.task_index >= 0) { /* minitron.score task: candidates by that task's accuracy */
        P->score_task = &s->tasks.t[sp->minitron.task_index];
        P->score_name = s->tasks.names[sp->minitron.task_index];
    }
    ac_carch base_c;
    if (ac_carch_from_arch(&s->m.a, &base_c, e)) return -1;
    ac_cost_predict(&s->table, &base_c, P->workload, P->profile, 0, &s->base_cost);
    s->base_overhead_share = ac_cost_overhead_share(&s->table, &base_c, P->workload, P->profile, &s->base_cost);
    ac_carch_free(&base_c);
    emit(s, "log",
         json_pack("{s:s,s:o,s:o}", "message", "baseline prediction", "predicted", ac_cost_to_json(&s->base_cost),
                   "constraints", ac_constraints_report(&P->limits, &s->base_cost)));
    return 0;
}

static int stage_search(job_state *s, ac_err *e) {
    const ac_job_spec *sp = s->spec;
    ac_search_problem *P = &s->P;
    if (search_setup(s, e)) return -1;
    int autoc = sp->method == AC_METHOD_AUTOCOMPRESS;
    if (ac_search_minitron(P, &s->rm, e)) return -1;
    ac_search_opts so = sp->search;
    so.dnas_steps = dnas_steps_budgeted(&so, &s->m.a);
    if (autoc && so.method == AC_SEARCH_DNAS && so.dnas_steps < sp->search.dnas_steps)
        emit(s, "log",
             json_pack("{s:s,s:i,s:i}", "message", "dnas steps scaled to the FLOP budget", "dnas_steps", so.dnas_steps,
                       "asked", sp->search.dnas_steps));
    if (autoc && so.method == AC_SEARCH_DNAS && !ac_dnas_gates_ok(P, &s->m))
        emit(s, "log",
             json_pack("{s:s}", "message",
                       "mixture-of-experts model the gate trainer cannot train here (resident 16-bit weights, a "
                       "dense model's sigmoid router or a GPU target: its expert gates train on fp32 weights on the "
                       "CPU), so the "
                       "autocompress arm runs the surrogate search (relaxed widths and expert counts on the measured "
                       "curves, augmented Lagrangian on the cost model)"));
    if (autoc && dnas_search(s, &so, e)) return -1;
    s->two_arms = autoc;
    s->chosen = autoc ? &s->ra : &s->rm; /* provisional: evaluate picks the best arm that meets every limit */
    if (s->chosen->feasible) return 0;
    if (autoc && s->rm.feasible) { /* Minitron's arm meets every limit: the job goes on and will export it */
        emit(s, "log",
             json_pack("{s:s}", "message",
                       "the autocompress arm misses a limit and the minitron arm meets every limit: minitron's "
                       "will be exported"));
        return 0;
    }
    const ac_cost *k = &s->chosen->cost;
    json_t *closest = ac_constraints_report(&P->limits, k);
    char *cs = json_dumps(closest, JSON_COMPACT);
    emit(s, "infeasible",
         json_pack("{s:o,s:o,s:o}", "closest", closest, "predicted", ac_cost_to_json(k), "architecture",
                   ac_arch_to_json(&s->chosen->arch)));
    ac_errf(e,
            "infeasible: the constraints cannot be met on %s for this workload even at the smallest architecture the "
            "export target allows; closest reachable: %s",
            s->table.device, cs ? cs : "?");
    free(cs);
    return -1;
}

/* ---------------------------------------------------------------- 5 prune */

/* search.keep_weights: the co-trained weights are freed once the arm is
 * pruned from them (after the KD-aware choice, which prunes the search's
 * candidate from them again). */
static void drop_trained(job_state *s) {
    if (s->ra.trained) ac_model_free(s->ra.trained);
    free(s->ra.trained);
    s->ra.trained = NULL;
}

/* Slice the base model to each arm's architecture (keeping the most
 * important channels by that arm's importance) and, when the spec asks,
 * refit the arm's pruned FFN down projections (ac_repair_ffn: one layer's
 * FFN Gram in memory at a time), one arm after the other: the Minitron
 * student is finished, and parked in a file when there are two arms
 * (students_int.h), before the AutoCompress one is sliced, so the stage
 * holds one student beside the mapped base. Each arm's repair walks the
 * residual stream of the model it is pruned from on its own (a second pass
 * over the calibration windows for the second arm), with the numbers one
 * joint pass gave: an arm's refit reads only that model's activations.
 * The students are BF16 (ac_prune_bf16: half an fp32 student's memory),
 * rounded as the export writes them, so evaluate measures the weights the
 * job exports; the distill stage trains each on an fp32 copy. */
static int stage_prune(job_state *s, ac_err *e) {
    ac_importance mimp; /* Minitron prunes by its own importance */
    ac_minitron_importance_view(&s->imp, &mimp);
    const ac_importance *ia = s->imp_d.n_layers ? &s->imp_d : &s->imp; /* dnas: gate-score orders */
    int arms = s->two_arms ? 2 : 1;
    /* search.keep_weights: the autocompress arm from the weights trained with the gates, refit to their outputs */
    const ac_model *src_a = s->ra.trained ? s->ra.trained : &s->m;
    s->pa_cotrained = arms == 2 && s->ra.trained;
    if (s->spec->repair && ac_arch_is_hybrid(&s->m.a)) /* the repair's layer stream has no Mamba layers yet */
        emit(s, "log", json_pack("{s:s}", "message", "hybrid (nemotron_h) model: the least-squares FFN repair is skipped"));
    if (ac_job_prune_arm(s, &s->m, &s->rm.arch, &mimp, 1, &s->pm, &s->rep_m, e)) return -1;
    if (arms == 2) {
        progress_cb(s, "pruned", 0.5);
        ac_job_park(s, &s->pm, "minitron");
        if (ac_job_prune_arm(s, src_a, &s->ra.arch, ia, 0, &s->pa, &s->rep_a, e)) return -1;
        ac_job_park(s, &s->pa, "autocompress");
    }
    progress_cb(s, "pruned", 1.0);
    s->result = s->chosen == &s->ra ? &s->pa : &s->pm;
    if (!(s->spec->distill.tokens > 0 && s->spec->distill.candidates > 1)) drop_trained(s);
    return 0;
}

/* ---------------------------------------------------------------- 5b distill */

/* eval.tasks on the reported arms (and the base with with_base) into (*out)[arm]. */
static int score_tasks(job_state *s, int with_base, json_t **out, ac_err *e) {
    const struct {
        const char *name;
        const ac_model *m;
        int on;
    } arms[] = {{"baseline", &s->m, with_base}, {"minitron", &s->pm, 1}, {"autocompress", &s->pa, s->two_arms}};
    if (!*out && !(*out = json_object())) return ac_errf(e, "out of memory");
    for (int i = 0; i < 3; i++) {
        if (!arms[i].on) continue;
        json_t *j = ac_job_tasks_score(&s->tasks, arms[i].m, e);
        if (i) ac_job_student_done(arms[i].m);
        if (!j) return ac_errctx(e, "%s", arms[i].name);
        json_object_set_new(*out, arms[i].name, j);
    }
    return 0;
}

/* Every reported arm (the compacted Minitron model and AutoCompress's) is
 * distilled from the base model with the same total budget (distill.c,
 * candidates_int.h); held-out perplexity before it goes into the report as
 * perplexity_pruned. */
static int stage_distill(job_state *s, ac_err *e) {
    const ac_job_spec *sp = s->spec;
    ac_ppl_opts po = {.ctx = sp->eval.ctx, .stride = 0, .max_windows = sp->eval.windows, .batch = 4, .cuda = s->on_gpu};
    ac_distill_opts o;
    ac_job_distill_opts(s, sp->distill.tokens, &o);
    const char *text = ac_job_distill_text(s);
    /* distill.tokens is each arm's total budget; the autocompress arm's
     * structure is chosen by its loss after a short distillation (candidates_int.h) */
    ac_kd_choice kc;
    int rc = ac_kd_choose(s, &o, text, &kc, e);
    drop_trained(s);
    if (!rc && s->tasks.n) rc = score_tasks(s, 0, &s->tasks_pruned, e);
    if (!rc) rc = ac_kd_distill_arms(s, &o, text, &po, &kc, job_emit, e);
    ac_kd_choice_free(&kc);
    return rc;
}

static int want_distill(const job_state *s) { return s->spec->distill.tokens > 0; }

/* ---------------------------------------------------------------- 6 evaluate */

/* The CPU table measured again for measured_local (stage_evaluate), into
 * *out: a log event says why (then, now: the table's reference probe and
 * the CPU's now), a cost_table event ("for": "measured_local") follows, and
 * the table is cached (put, and the event's table for the daemon, whose
 * workers read the cache only) when quicker than the cached one, whose
 * reference is cached_ref. A failed measurement is logged and returns -1
 * (the caller keeps its table). */
static int measure_cpu_again(job_state *s, const char *why, const char *dtype, double then, double now,
                             double cached_ref, ac_cost_table *out) {
    char msg[200];
    snprintf(msg, sizeof msg, "%s: measuring it again for the timings on this CPU", why);
    emit(s, "log",
         json_pack("{s:s,s:f,s:f}", "message", msg, "table_reference_probe_us", then, "reference_probe_us", now));
    ac_err e2;
    if (ac_cost_measure_cpu(s->threads, dtype, progress_plain, s, out, &e2)) {
        emit(s, "log", json_pack("{s:s,s:s}", "message", "measuring the CPU cost table failed", "error", e2.msg));
        return -1;
    }
    int keep = cached_ref > 0 && out->ref_us < cached_ref;
    json_t *ev = json_pack("{s:s,s:s,s:s,s:b,s:f,s:s}", "key", out->key, "device", out->device, "source", out->source,
                           "cache_hit", 0, "measure_seconds", out->measure_s, "for", "measured_local");
    if (ev && keep) json_object_set_new(ev, "table", ac_cost_table_to_json(out));
    if (ev) emit(s, "cost_table", ev);
    const ac_cost_cache *cache = s->ctx->cache;
    if (keep && cache && cache->put && cache->put(cache->ud, out, &e2))
        emit(s, "log", json_pack("{s:s,s:s}", "message", "caching the CPU cost table failed", "error", e2.msg));
    return 0;
}

/* One entry of measured_local.table_measured_again. */
static json_t *again_json(const char *reason, const char *when, double then, double now, double new_ref) {
    return json_pack("{s:s,s:s,s:f,s:f,s:f}", "reason", reason, "when", when, "table_reference_probe_us", then,
                     "reference_probe_us", now, "new_table_reference_probe_us", new_ref);
}

/* The exported arm: of the arms that meet every limit, the one with the
 * lower held-out loss (nll); a tie goes to the method's arm. With one arm,
 * or one feasible arm, that one. Sets chosen, result and chosen_reason. */
static void choose_arm(job_state *s) {
    if (!s->two_arms) {
        snprintf(s->chosen_reason, sizeof s->chosen_reason, "the job's method (%s) has one arm",
                 ac_method_name(s->spec->method));
        return;
    }
    int fa = s->ra.feasible, fm = s->rm.feasible;
    if (fa && fm) {
        int mini = s->pmr.nll < s->par.nll;
        s->chosen = mini ? &s->rm : &s->ra;
        snprintf(s->chosen_reason, sizeof s->chosen_reason,
                 "both arms meet every limit; %s has the lower held-out loss (nll %.6f against %.6f%s)",
                 mini ? "minitron" : "autocompress", mini ? s->pmr.nll : s->par.nll, mini ? s->par.nll : s->pmr.nll,
                 s->pmr.nll == s->par.nll ? ", a tie: the method's arm" : "");
    } else {
        s->chosen = fa ? &s->ra : &s->rm;
        snprintf(s->chosen_reason, sizeof s->chosen_reason, "only the %s arm meets every limit",
                 fa ? "autocompress" : "minitron");
    }
    if (s->tasks.n) { /* the tasks' accuracies are in the report: say they did not decide */
        size_t n = strlen(s->chosen_reason);
        snprintf(s->chosen_reason + n, sizeof s->chosen_reason - n,
                 "; task accuracy is reported, not weighed (held-out loss decides, a tie goes to the method's arm)");
    }
    s->result = s->chosen == &s->ra ? &s->pa : &s->pm;
}

/* Held-out perplexity of base, Minitron and AutoCompress; latency of base
 * and result on this CPU against the CPU table (the target's, or a cached
 * one), and on a local CUDA target's GPU against the target's table. */
static int stage_evaluate(job_state *s, ac_err *e) {
    const ac_job_spec *sp = s->spec;
    ac_ppl_opts po = {.ctx = sp->eval.ctx, .stride = 0, .max_windows = sp->eval.windows, .batch = 4, .cuda = s->on_gpu};
    /* the students one at a time: a parked one's pages go once measured (students_int.h) */
    if (ac_perplexity(&s->m, s->hids, s->nh, &po, NULL, NULL, NULL, &s->pb, e) ||
        ac_perplexity(&s->pm, s->hids, s->nh, &po, NULL, NULL, NULL, &s->pmr, e))
        return -1;
    ac_job_student_done(&s->pm);
    if (s->two_arms && ac_perplexity(&s->pa, s->hids, s->nh, &po, NULL, NULL, NULL, &s->par, e)) return -1;
    ac_job_student_done(&s->pa);
    progress_cb(s, "perplexity", 0.5);
    if (s->tasks.n && score_tasks(s, 1, &s->task_scores, e)) return -1;
    choose_arm(s);
    const ac_target_spec *t = &sp->target;
    int is_cpu = t->dev.kind == AC_TARGET_CPU, found = is_cpu;
    /* The weight dtype of the timings on this CPU, and of the CPU table
     * that predicts them: a CPU target's (its profile's, stage_load); else
     * the checkpoint's, BF16 for a BF16 one (the base timed on its mapping,
     * the students as they are: BF16, as the export writes them), else
     * fp32. */
    const char *ldt = is_cpu ? s->table_dtype : ac_model_wdt(&s->m) == ST_BF16 ? "bf16" : "fp32";
    ac_cost_table cpu = {0};
    if (!is_cpu) {
        char key[384];
        ac_err e2;
        ac_cost_cpu_key(s->threads, ldt, key, sizeof key, NULL, 0);
        ac_cost_cache_lookup(s->ctx->cache, key, &cpu, &found, &e2);
    }
    /* Minitron is timed first when it is not the result (the comparison,
     * same capped workload) and then freed: the result's timing may take an
     * fp32 copy of it or of a resident base (fp32 timings) in the timings'
     * dtype (ac_measure_latency_in), which then sits beside the mapping and
     * the result only, as check_host_memory plans. */
    const ac_cost_table *ct = found ? (is_cpu ? &s->table : &cpu) : NULL; /* the CPU table, if any */
    /* The VM this runs on switches between speeds for tens of seconds at a
     * time (quiet.h). When the CPU runs, by the reference probe, more than
     * the tolerance quicker or slower than when the CPU table was measured,
     * its predictions would carry that drift into measured_local's errors.
     * So the table is measured again before the timings when the probe now
     * says so, or else after them when the runs' own probe level says they
     * ran in another state than the table's (the state changed meanwhile):
     * the report compares timings with a table of the same state. Once per
     * job at most (25-35 s each; the test suite's many small jobs on a busy
     * machine would pay it twice). A new table is cached when quicker than
     * the cached one; a CPU target's search keeps the table it planned with
     * (s->table). */
    ac_cost_table fresh = {0};
    json_t *again = NULL; /* the one entry of table_measured_again */
    double then = 0, now = 0;
    int state = ct ? table_state(ct, &then, &now) : 0;
    if (state && measure_cpu_again(s,
                                   state > 0 ? "this CPU runs quicker than when its cost table was measured"
                                             : "this CPU runs slower than when its cost table was measured",
                                   ldt, then, now, ct->ref_us, &fresh) == 0) {
        again = again_json(state > 0 ? "table_slower" : "table_quicker", "before_timing", then, now, fresh.ref_us);
        ct = &fresh;
    }
    ac_workload lw = ac_measure_local_workload(&t->workload);
    double mtt = 0, mtp = 0, ref = ct ? ct->ref_us : 0;
    int other_timed = 0;
    ac_model *other = s->chosen == &s->ra ? &s->pm : &s->pa; /* the arm not exported, when there are two */
    if (s->two_arms) {
        other_timed = ac_measure_latency_in(other, ldt, s->hids, s->nh, &lw, ref, &mtt, &mtp, NULL, e) == 0;
        ac_model_free(other);
    }
    ac_local_timing lt;
    int rc = ac_measure_local_time(&s->m, s->result, ldt, s->hids, s->nh, &t->workload, ref, &lt, e);
    now = !rc && !again && ct && has_quiet_ref(ct) ? ac_local_timing_off_table(&lt, ct) : 0;
    if (now > 0 && measure_cpu_again(s, "base and result ran in another state of this CPU than its cost table", ldt,
                                     ct->ref_us, now, ct->ref_us, &fresh) == 0) {
        again = again_json(now > ct->ref_us ? "timing_slower" : "timing_quicker", "after_timing", ct->ref_us, now,
                           fresh.ref_us);
        ct = &fresh;
    }
    const char *arm = s->chosen == &s->ra ? "autocompress" : "minitron"; /* the exported arm's name */
    if (!rc && !(s->measured_local = ac_measure_local_report(&lt, &s->m, s->result, arm, ct)))
        rc = ac_errf(e, "out of memory");
    if (!rc && again) json_object_set_new(s->measured_local, "table_measured_again", json_pack("[O]", again));
    json_decref(again);
    if (!is_cpu) ac_cost_table_free(&cpu);
    ac_cost_table_free(&fresh);
    if (rc) return -1;
    if (other_timed)
        json_object_set_new(s->measured_local, s->chosen == &s->ra ? "minitron" : "autocompress",
                            json_pack("{s:f,s:f}", "ttft_ms", mtt, "tpot_ms", mtp));
    if (t->dev.kind == AC_TARGET_CUDA && ac_cuda(NULL) &&
        ac_measure_on_gpu(&s->m, s->result, arm, s->hids, s->nh, &t->workload, &s->table, &s->engine, &s->measured_on_target,
                          e))
        emit(s, "log", json_pack("{s:s,s:s}", "message", "measuring on the target GPU failed", "error", e->msg));
    return 0;
}

/* ---------------------------------------------------------------- 7 export */

static int copy_file(const char *from, const char *to, ac_err *e) {
    size_t len;
    char *d = ac_fsafe_read(from, AC_FK_TOKENIZER, &len, e); /* the model dir's file, confined */
    if (!d) return -1;
    int rc = ac_fsafe_write(to, d, len, e); /* confined like every export file (fsafe_write.h) */
    free(d);
    return rc;
}

static int stage_export(job_state *s, ac_err *e) {
    const ac_job_spec *sp = s->spec;
    if (ac_fsafe_mkdirs(sp->output, e)) return -1;
    if (ac_model_save(s->result, sp->output, ST_BF16, e) ||
        ac_gguf_export_job(&sp->search, s->result, sp->model, sp->output, e))
        return -1;
    char src[4200], dst[4200];
    snprintf(src, sizeof src, "%s/tokenizer.json", sp->model);
    snprintf(dst, sizeof dst, "%s/tokenizer.json", sp->output);
    return copy_file(src, dst, e);
}

/* ---------------------------------------------------------------- the run */

/* The stages in the order they run and the events report them. wanted
 * (NULL = always) leaves a stage out of a job that does not ask for it,
 * index and of in the "stage" events counting only the stages that run. */
static const struct {
    const char *name;
    int (*run)(job_state *s, ac_err *e);
    int (*wanted)(const job_state *s);
} STAGES[] = {
    {"load", stage_load, NULL},         {"calibrate", stage_calibrate, NULL}, {"profile", stage_profile, NULL},
    {"search", stage_search, NULL},     {"prune", stage_prune, NULL},         {"distill", stage_distill, want_distill},
    {"puzzle", ac_job_stage_puzzle, ac_job_want_puzzle}, /* the opt-in third arm (jobpuzzle.c) */
    {"evaluate", stage_evaluate, NULL}, {"export", stage_export, NULL},
};
enum { N_STAGES = sizeof STAGES / sizeof *STAGES };

/* A stage restored from its checkpoint (checkpoint_int.h): what the stage sets
 * besides the outputs the file held. */
static int stage_restored(job_state *s, const char *stage, ac_err *e) {
    if (!strcmp(stage, "calibrate")) calibrate_setup(s);
    if (!strcmp(stage, "search")) {
        if (search_setup(s, e)) return -1;
        s->chosen = s->two_arms ? &s->ra : &s->rm; /* as stage_search leaves it */
    }
    return 0;
}

/* Run stage i, or restore it from the job's checkpoints while every
 * checkpointed stage before it was restored (*resuming). */
static int run_stage(job_state *s, int i, int index, int of, int *resuming, ac_err *e);

static void state_free(job_state *s) {
    ac_job_puzzle_free(s);
    json_decref(s->curves);
    json_decref(s->resumed);
    json_decref(s->distill);
    json_decref(s->tasks_pruned);
    json_decref(s->task_scores);
    ac_job_tasks_free(&s->tasks);
    json_decref(s->measured_on_target);
    json_decref(s->measured_local);
    json_decref(s->timings);
    ac_model_free(&s->pa);
    ac_model_free(&s->pm);
    ac_search_result_free(&s->ra);
    ac_search_result_free(&s->rm);
    ac_cost_table_free(&s->table);
    ac_importance_free(&s->imp);
    ac_importance_free(&s->imp_d);
    free(s->cids);
    free(s->hids);
    ac_model_free(&s->m);
}

static int write_report(job_state *s, json_t **result, ac_err *e) {
    json_t *report = ac_report_build(s);
    if (!report) return ac_errf(e, "stage export: out of memory");
    char dst[4200];
    snprintf(dst, sizeof dst, "%s/report.json", s->spec->output);
    if (ac_fsafe_write_json(dst, report, JSON_INDENT(2), e)) {
        json_decref(report);
        return ac_errctx(e, "stage export");
    }
    if (ac_model_card_write(report, s->spec->output, e) || /* README.md, the export's model card */
        ac_report_html_write(report, s->curves, s->spec->output, e)) { /* report.html, the page a person opens */
        json_decref(report);
        return ac_errctx(e, "stage export");
    }
    *result = report;
    return 0;
}

int ac_job_run(const ac_job_spec *spec, ac_job_ctx *ctx, json_t **result, ac_err *e) {
    *result = NULL;
    if (!spec->output[0]) return ac_errf(e, "output: no output directory given");
    if (ac_gguf_check_spec(&spec->search, spec->model, NULL, e)) return -1;
    job_state *s = calloc(1, sizeof *s);
    if (!s) return ac_errf(e, "out of memory");
    *s =
        (job_state){.spec = spec, .ctx = ctx, .threads = ctx->threads > 0 ? ctx->threads : 2, .timings = json_object(),
                    .curves = ac_report_curves_new()};
    ac_set_threads(s->threads);
    double t_job = ac_now();
    int rc = 0, of = 0, index = 0, resuming = ctx->checkpoint_dir && ctx->checkpoint_dir[0];
    for (int i = 0; i < N_STAGES; i++) of += !STAGES[i].wanted || STAGES[i].wanted(s);
    for (int i = 0; i < N_STAGES && !rc; i++) {
        if (STAGES[i].wanted && !STAGES[i].wanted(s)) continue;
        if (ctx->cancelled && *ctx->cancelled) {
            rc = ac_errf(e, "cancelled");
            break;
        }
        if ((rc = run_stage(s, i, ++index, of, &resuming, e))) ac_errctx(e, "stage %s", s->stage);
        /* give the stage's freed working sets back to the system: glibc keeps
         * freed heap pages (per-tensor buffers below its raised mmap threshold
         * after a stage freed whole fp32 models: pruned students, `cotrain`'s
         * copy), which the next stage's peak would count */
        malloc_trim(0);
    }
    if (!rc) {
        assert(s->result && s->measured_local);
        json_object_set_new(s->timings, "total", json_real(ac_now() - t_job));
        rc = write_report(s, result, e);
    }
    state_free(s);
    free(s);
    return rc;
}

void ac_job_release_checkpoints(const char *checkpoint_dir) {
    if (checkpoint_dir && checkpoint_dir[0]) ac_ckpt_release_arms(checkpoint_dir);
}

void ac_job_clear_checkpoints(const char *checkpoint_dir) {
    if (checkpoint_dir && checkpoint_dir[0]) ac_ckpt_clear(checkpoint_dir);
}

static int run_stage(job_state *s, int i, int index, int of, int *resuming, ac_err *e) {
    const ac_job_ctx *ctx = s->ctx;
    const char *dir = ctx->checkpoint_dir, *key = ctx->checkpoint_key ? ctx->checkpoint_key : "";
    s->stage = STAGES[i].name;
    int ck = dir && dir[0] && ac_ckpt_stage(s->stage);
    if (ck && !strcmp(s->stage, "search") && s->spec->search.keep_weights) { /* its result holds a whole model */
        emit(s, "log", json_pack("{s:s}", "message",
                                 "the search stage is not checkpointed: search.keep_weights keeps the co-trained "
                                 "weights, a whole model"));
        ck = 0;
    }
    if (ck && *resuming) {
        double secs = 0;
        char why[600];
        int r = ac_ckpt_load(s, dir, key, s->stage, &secs, why, sizeof why);
        if (r == 1) {
            emit(s, "stage", json_pack("{s:s,s:i,s:i,s:b}", "stage", s->stage, "index", index, "of", of, "resumed", 1));
            emit(s, "log", json_pack("{s:s,s:s,s:f}", "message", "stage restored from its checkpoint", "stage",
                                     s->stage, "first_run_seconds", secs));
            if (!s->resumed) s->resumed = json_array();
            json_array_append_new(s->resumed, json_string(s->stage));
            json_object_set_new(s->timings, s->stage, json_real(secs));
            return stage_restored(s, s->stage, e);
        }
        if (why[0]) emit(s, "log", json_pack("{s:s,s:s}", "message", "checkpoint not used", "why", why));
        *resuming = 0;
    } else if (ck)
        *resuming = 0;
    emit(s, "stage", json_pack("{s:s,s:i,s:i}", "stage", s->stage, "index", index, "of", of));
    double t0 = ac_now();
    if (STAGES[i].run(s, e)) return -1;
    double secs = ac_now() - t0;
    json_object_set_new(s->timings, s->stage, json_real(secs));
    ac_err e2 = {{0}};
    if (ck && ac_ckpt_save(s, dir, key, s->stage, secs, &e2)) /* the job goes on; a rerun computes the stage */
        emit(s, "log", json_pack("{s:s,s:s}", "message", "cannot write the stage checkpoint", "error", e2.msg));
    return 0;
}
