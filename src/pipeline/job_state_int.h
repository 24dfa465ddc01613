/*
 * job_state_int.h - what the stages of one job (job.c) hand each other, and
 * what the report (report.c) is built from. Private to those two files and
 * checkpoint.c (which keeps stage outputs on disk).
 * Filled in stage order: each group below is written by the stage named.
 */
#ifndef AC_JOB_STATE_H
#define AC_JOB_STATE_H

#include <jansson.h>

#include "cost/costmodel.h"
#include "runtime/eval.h"
#include "search/importance.h"
#include "pipeline/job.h"
#include "jobtasks_int.h"
#include "search/search.h"

typedef struct job_state {
    const ac_job_spec *spec;
    ac_job_ctx *ctx;
    const char *stage;    /* the running stage, for progress events */
    double last_progress; /* ac_now() of the last progress event */
    int threads;
    json_t *timings; /* stage -> seconds */
    json_t *curves;  /* the loss per step from the job's events, for report.html (reporthtml.h; owned) */
    json_t *resumed; /* names of the stages restored from checkpoints (owned; NULL: none) */
    /* load */
    ac_model m;       /* the base model */
    int *cids, *hids; /* calibration and held-out token ids */
    size_t nc, nh;
    ac_job_tasks tasks; /* eval.tasks, tokenised (n = 0: none) */
    ac_engine_profile engine; /* the target's profile, its CPU weight dtype resolved (stage_load) */
    const char *wdtype;       /* the weights' dtype it is for (ac_target_weights_dtype; static) */
    const char *table_dtype;  /* its cost table's (ac_target_table_dtype; static) */
    /* calibrate */
    int on_gpu; /* loss passes on the local GPU */
    int cwin;   /* calibration windows of eval.ctx */
    ac_importance imp;
    ac_importance imp_d; /* search: unit orders by DNAS gate score (n_layers 0: none) */
    /* profile */
    ac_cost_table table;
    int cache_hit;
    /* search */
    ac_search_problem P;
    ac_cost base_cost;
    double base_overhead_share; /* of base_cost's latency: fixed launches and engine overhead (costmodel.h) */
    ac_search_result ra, rm; /* AutoCompress (method autocompress), Minitron (always) */
    int two_arms;            /* method autocompress: both arms are pruned, evaluated and reported */
    /* the exported arm: the method's until evaluate picks the best feasible one (choose_arm) */
    ac_search_result *chosen;
    char chosen_reason[256];
    /* prune */
    ac_model pa, pm;
    const ac_model *result; /* &pa or &pm: the chosen arm's (set again by evaluate's choice) */
    int rep_a, rep_m;       /* layers refit by the least-squares repair */
    int pa_cotrained;       /* pa pruned from the gate search's co-trained weights (search.keep_weights) */
    /* distill (only with spec distill): {arm: {perplexity_pruned, distill}} (owned) */
    json_t *distill;
    json_t *tasks_pruned; /* eval.tasks before distillation: {arm: {NAME: {...}}} (owned; NULL: none) */
    /* evaluate */
    ac_ppl_result pb, pmr, par;                  /* base, Minitron, AutoCompress */
    json_t *measured_local, *measured_on_target; /* owned; on_target may be NULL */
    json_t *task_scores; /* eval.tasks: {"baseline"|"minitron"|"autocompress": {NAME: {...}}} (owned; NULL: none) */
    /* puzzle (spec puzzle.enabled; jobpuzzle.c, after distill): the third
     * arm's search result, its student (distilled), held-out perplexity,
     * and its report fields besides arm()'s (budget split; owned) */
    int puzzle_ran;
    ac_search_result rz;
    ac_model pz;
    ac_ppl_result pzr;
    json_t *puzzle_extra;
} job_state;

/* The report (proto/events.md): built from a finished state (report.c). */
json_t *ac_report_build(const job_state *s);

#endif
