/*
 * jobpuzzle.c - the job's puzzle stage (see jobpuzzle_int.h): the third
 * arm, Puzzle's heterogeneous search (search/puzzle.h), from the library
 * to the distilled student; report.c reports it beside the other arms.
 *
 * Budget: the block-local distillation is counted in the arm's training
 * tokens as Puzzle runs it, every block of a step fed by one parent
 * forward: steps x batch x ctx tokens. The arm's final distillation gets
 * distill.tokens less that (never below 0), so its total is the others'.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "candidates_int.h"
#include "compress/distill.h"
#include "core/dtype.h"
#include "jobpuzzle_int.h"
#include "jobtasks_int.h"
#include "runtime/eval.h"
#include "search/minitron.h"
#include "search/puzzle.h"
#include "search/slice.h"
#include "cost/device.h"
#include "pipeline/reporthtml.h"

/* An event of the stage: kept for report.html's curves, then to the caller. */
static void pz_emit(void *ud, const char *kind, json_t *data) {
    job_state *s = ud;
    if (!data) return;
    ac_report_curves_add(s->curves, kind, data);
    if (s->ctx->emit) s->ctx->emit(s->ctx->ud, kind, data);
}

static void pz_progress(void *ud, double frac) {
    job_state *s = ud;
    double now = ac_now();
    if (frac < 1 && now - s->last_progress < 0.5) return;
    s->last_progress = now;
    json_t *ev = json_pack("{s:s,s:s,s:f}", "stage", s->stage, "what", "block-local distillation", "fraction", frac);
    pz_emit(s, "progress", ev);
    json_decref(ev);
}

int ac_job_want_puzzle(const job_state *s) { return s->spec->puzzle.enabled; }

void ac_job_puzzle_free(job_state *s) {
    ac_search_result_free(&s->rz);
    ac_model_free(&s->pz);
    json_decref(s->puzzle_extra);
    s->puzzle_extra = NULL;
}

/* eval.tasks of the arm into (*into)["puzzle"]. */
static int score_tasks(job_state *s, json_t **into, ac_err *e) {
    if (!s->tasks.n) return 0;
    if (!*into && !(*into = json_object())) return ac_errf(e, "out of memory");
    json_t *j = ac_job_tasks_score(&s->tasks, &s->pz, e);
    if (!j) return ac_errctx(e, "puzzle");
    json_object_set_new(*into, "puzzle", j);
    return 0;
}

/* The library (kept weights only while they fit a quarter of this host's memory). */
static int build_library(job_state *s, ac_puzzle_library *lib, long *bld_tokens, ac_err *e) {
    const ac_job_spec *sp = s->spec;
    ac_puzzle_opts o;
    ac_puzzle_opts_default(&o);
    o.steps = sp->puzzle.steps, o.windows = sp->puzzle.windows, o.batch = sp->puzzle.batch, o.lr = sp->puzzle.lr;
    if (sp->search.ffn_multiple > 0) o.ffn_multiple = sp->search.ffn_multiple;
    double host = ac_host_mem_available();
    o.keep_weights = host <= 0 || ac_arch_params(&s->m.a) * 4 * 2.5 < 0.25 * host;
    int W = (int)(s->nc / (size_t)sp->eval.ctx);
    if (W > o.windows) W = o.windows;
    int Wt = W - (W / 4 > 0 ? W / 4 : 1), bt = o.batch < Wt ? o.batch : Wt;
    *bld_tokens = (long)o.steps * (bt > 0 ? bt : 0) * sp->eval.ctx;
    return ac_puzzle_library_build(&s->m, &s->imp, s->cids, s->nc, sp->eval.ctx, &o, pz_progress, s, lib, e);
}

int ac_job_stage_puzzle(job_state *s, ac_err *e) {
    const ac_job_spec *sp = s->spec;
    ac_puzzle_library lib;
    long bld = 0;
    if (build_library(s, &lib, &bld, e)) return -1;
    int *choice = calloc(lib.n_layers, sizeof(int));
    int rc = choice ? ac_search_puzzle(&s->P, &lib, &s->rz, choice, e) : ac_errf(e, "out of memory");
    if (!rc) {
        json_t *ev = json_pack("{s:s,s:b,s:f,s:o,s:o}", "phase", "puzzle", "feasible", s->rz.feasible,
                               "bld_score", s->rz.pred_loss, "architecture", ac_arch_to_json(&s->rz.arch), "predicted",
                               ac_cost_to_json(&s->rz.cost));
        pz_emit(s, "search", ev);
        json_decref(ev);
        rc = ac_prune_bf16(&s->m, &s->rz.arch, &s->imp, &s->pz, e); /* then the trained blocks put in */
    }
    int realized = !rc && lib.attn_w && s->rz.feasible;
    if (realized) rc = ac_puzzle_realize(&lib, choice, &s->pz, e);
    ac_puzzle_library_free(&lib);
    free(choice);
    if (rc) return -1;
    if (sp->search.target == AC_EXPORT_LLAMA) ac_minitron_compact(&s->pz);
    ac_model_round_vectors(&s->pz, ST_BF16); /* the trained blocks' vectors too, as the BF16 export writes them */
    long total = sp->distill.tokens, left = total > bld ? total - bld : 0;
    s->puzzle_extra = json_pack("{s:b,s:{s:I,s:I,s:I}}", "bld_weights_used", realized, "budget", "total_tokens",
                                (json_int_t)total, "bld_tokens", (json_int_t)bld, "distill_tokens", (json_int_t)left);
    ac_ppl_opts po = {.ctx = sp->eval.ctx, .stride = 0, .max_windows = sp->eval.windows, .batch = 4, .cuda = s->on_gpu};
    if (total > 0 && score_tasks(s, &s->tasks_pruned, e)) return -1;
    if (left > 0) {
        ac_distill_opts o;
        ac_job_distill_opts(s, left, &o);
        const char *text = ac_job_distill_text(s);
        ac_model *arms[1] = {&s->pz};
        const char *names[1] = {"puzzle"};
        json_t *out = NULL;
        if (ac_distill_job(&o, sp->model, text, &s->m, s->cids, s->nc, arms, names, 1, s->hids, s->nh, &po, pz_emit,
                           s, s->ctx->cancelled, &out, e))
            return -1;
        if (!s->distill) s->distill = json_object();
        json_object_update(s->distill, out);
        json_decref(out);
    }
    if (ac_perplexity(&s->pz, s->hids, s->nh, &po, NULL, NULL, NULL, &s->pzr, e) ||
        score_tasks(s, &s->task_scores, e))
        return -1;
    s->puzzle_ran = 1;
    return 0;
}
