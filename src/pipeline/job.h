/*
 * job.h - the compression job: a typed spec (jobspec.h) run as a sequence
 * of stages (load, calibrate, profile, search, prune, distill when the
 * spec asks for it, evaluate, export)
 * over one job state. Shared by the daemon's worker (`autocompressd
 * run-job`) and `autocompress compress`.
 *
 * The pipeline reports through ctx->emit(kind, data): one "stage" event per
 * stage start, "progress" events while it works, "cost_table" when it
 * found or measured a table (the daemon stores a measured one in its
 * cache), "log" lines, "infeasible" before failing on an impossible limit.
 * It checks *ctx->cancelled between stages. The report is returned in
 * *result (caller owns it) and written to OUTPUT/report.json.
 */
#ifndef AC_JOB_H
#define AC_JOB_H

#include <jansson.h>

#include "cost/costmodel.h"
#include "core/err.h"
#include "pipeline/jobspec.h"

typedef struct {
    void (*emit)(void *ud, const char *kind, json_t *data); /* data borrowed */
    void *ud;
    volatile int *cancelled;    /* may be NULL */
    const ac_cost_cache *cache; /* cached cost tables (may be NULL); a measured table is put
                                    there when the cache has put (the CLI); the daemon's worker
                                    gets a read-only one and the daemon stores from the event */
    int threads;                /* CPU threads; 0 = 2 */
    /* Stage checkpoints (checkpoint_int.h): a directory the job's finished
     * calibrate, profile and search stages and distilled arms are kept in,
     * and restored from when the job runs again (a requeued batch job, a
     * local job re-queued after the daemon's restart);
     * NULL: none. key: the
     * caller's fingerprint of the job (its spec), which a checkpoint must
     * carry to be used. */
    const char *checkpoint_dir, *checkpoint_key;
} ac_job_ctx;

/* JSON-level helpers for callers that hold the JSON: the fields only
 * (ac_job_spec_parse underneath; a job's whole validation, paths and model
 * included, is ac_job_spec_check). *field (if not NULL) names the offending
 * field (a thread-local string). */
int ac_job_validate_field(const json_t *spec, const char **field, ac_err *e);
int ac_job_validate(const json_t *spec, ac_err *e);
/* A top-level string member of the JSON spec (borrowed), or NULL. */
const char *ac_job_path(const json_t *spec, const char *which);

/* Run the job. spec->output must be set (the daemon sets a default). */
int ac_job_run(const ac_job_spec *spec, ac_job_ctx *ctx, json_t **result, ac_err *e);
/* Remove the distilled students kept in a checkpoint directory (the
 * largest checkpoint files: a whole fp32 model per arm) once the job that
 * wrote them has its result; the small stage files stay. */
void ac_job_release_checkpoints(const char *checkpoint_dir);
/* Remove every checkpoint in the directory, stages and distilled arms: a
 * job's first run, where whatever is there was left by another job (a data
 * directory reused with a new database, whose job ids start again). */
void ac_job_clear_checkpoints(const char *checkpoint_dir);

#endif
