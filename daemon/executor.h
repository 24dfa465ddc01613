/*
 * executor.h - what runs a queued job: the scheduler (scheduler.c) keeps
 * the queue, its order and the job states; an executor places a job and
 * runs it. Two implementations, chosen by the config's "executor" key
 * (executor_config.h):
 *
 *   local  worker processes on this host, in its CPU / GPU slots
 *          (scheduler.c; the default);
 *   slurm  a batch job per queued job, submitted with sbatch, that runs
 *          the same worker binary on a node (executor_slurm.c).
 *
 * Every call is made on the daemon's loop. The event ingestion of a job
 * that runs elsewhere (exec_worker_event) is shared: a worker's events are
 * applied the same way whether they came on a local pipe or over HTTP.
 */
#ifndef AC_EXECUTOR_H
#define AC_EXECUTOR_H

#include <jansson.h>

#include "daemon.h"
#include "wevent.h"

typedef struct ac_executor {
    const char *name;
    /* At start, after the store is open: re-attach what runs already. */
    int (*start)(ac_daemon *d, ac_err *e);
    /* Place the queued job: 0 it runs (or was handed on), 1 not now (why
     * says what it waits for), -1 it could not start (the job was failed
     * or left queued, said in its reason). */
    int (*place)(ac_daemon *d, long job, const char *device, char *why, size_t n);
    /* The job (running on this executor) is asked to cancel. */
    void (*cancel)(ac_daemon *d, long job);
    /* Once a second from the scheduler's tick. */
    void (*tick)(ac_daemon *d);
    /* GET /v1/devices' "scheduler" view of this executor's capacity (NULL: none to add). */
    json_t *(*status)(ac_daemon *d);
    /* The daemon stops (SIGTERM): 1 while it still needs the loop. */
    void (*stop)(ac_daemon *d);
    int (*busy)(ac_daemon *d);
} ac_executor;

extern const ac_executor executor_slurm;

/* What a worker event does besides being stored: keeps a "result" (into
 * *result, owned) or an "error" message (into error), stores a cost
 * table a job measured, counts a cache hit, and strips the table off the
 * stored event. Shared by the local scheduler and the Slurm executor
 * (scheduler.c). */
void exec_worker_event(ac_daemon *d, long job, wevent *ev, char **result, char *error, size_t n);

/* The worker's input, {"spec": ..., "cost_tables": {...}} as JSON text
 * (caller frees), NULL with e set (scheduler.c). */
char *exec_worker_input(ac_daemon *d, long job, ac_err *e);

/* The Slurm executor's view of one job for GET /v1/jobs/{id}: adds
 * "executor" and, for a Slurm job, "slurm": {job_id, name, state} to o. */
void exec_job_view(ac_daemon *d, long job, json_t *o);

/* POST /v1/jobs/{id}/worker-events (routes_exec.c): a remote worker's
 * events {"events": [{seq, kind, data}, ...]} with its job's secret. Returns
 * the HTTP status: 200 (stored, or seen before), 400 (msg, *field), 401
 * (not this job's secret), 409 (the job takes no more events), 503; and
 * *last_seq, the last seq the daemon has. */
int exec_worker_post(ac_daemon *d, long job, const char *secret, json_t *body, char *msg, size_t n, const char **field,
                     long *last_seq);

#endif
