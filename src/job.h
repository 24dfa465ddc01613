/*
 * job.h - the compression job: spec validation and the staged pipeline
 * (load, calibrate, profile, search, prune, evaluate, export). Shared by the
 * daemon's worker (`autocompressd run-job`) and `autocompress compress`.
 *
 * The pipeline reports through ctx->emit(kind, data): one "stage" event per
 * stage start, "progress" events while it works, "cost_table" when it
 * measured a table (the daemon stores it in its cache), "log" lines. It
 * checks *ctx->cancelled between steps. The result JSON (report) is returned
 * in *result (caller owns it).
 */
#ifndef AC_JOB_H
#define AC_JOB_H

#include <jansson.h>

#include "err.h"

typedef struct {
    void (*emit)(void *ud, const char *kind, json_t *data); /* data borrowed */
    void *ud;
    volatile int *cancelled;  /* may be NULL */
    const char *cost_db;      /* SQLite file with cached cost tables (read), or NULL */
    int threads;              /* CPU threads; 0 = 2 */
    int store_cost_tables;    /* write measured tables into cost_db itself (CLI); the
                                 daemon stores them from the cost_table event instead */
} ac_job_ctx;

/* Validate a job spec against proto/job.schema.json's rules (types, ranges,
 * unknown fields). On failure e->msg names the field; *field (if not NULL)
 * gets a pointer to a static string naming it. */
int ac_job_validate_field(const json_t *spec, const char **field, ac_err *e);
int ac_job_validate(const json_t *spec, ac_err *e);

/* The paths a spec names (model, calibration, heldout, output), for the
 * daemon's path policy. Returns borrowed strings or NULL. */
const char *ac_job_path(const json_t *spec, const char *which);

int ac_job_run(const json_t *spec, ac_job_ctx *ctx, json_t **result, ac_err *e);

#endif
