/*
 * executor_config.h - the daemon config's executor keys: "executor"
 * ("local", the default: worker processes on this host; or "slurm") and
 * "slurm": {partition, account, qos, time_limit, gres, cpus_per_task, mem,
 * sbatch_options, daemon_url, poll_s, post_flush_s, requeue}. Parsed and checked
 * here (config.c calls in), shown by exec_config_json (GET /v1/config).
 */
#ifndef AC_EXECUTOR_CONFIG_H
#define AC_EXECUTOR_CONFIG_H

#include <jansson.h>

#include "autocompress.h"

#define AC_SLURM_MAX_OPTS 16

typedef enum { AC_EXEC_LOCAL, AC_EXEC_SLURM } ac_exec_kind;

typedef struct {
    ac_exec_kind kind;
    /* slurm */
    char partition[128], account[128], qos[128];
    char time_limit[32];                     /* sbatch --time, e.g. "04:00:00" or "1-00:00:00"; "" = the partition's */
    char gres[128];                          /* per-job --gres, e.g. "gpu:1"; "" = none */
    char mem[32];                            /* --mem, e.g. "64G"; "" = the partition's default */
    int cpus_per_task;                       /* --cpus-per-task; 0 = the worker_threads key */
    char *sbatch_options[AC_SLURM_MAX_OPTS]; /* extra "--opt=value" arguments (owned) */
    int nsbatch_options;
    char daemon_url[512]; /* where a node reaches this daemon; "" = http://listen */
    double poll_s;        /* how often squeue is asked */
    double post_flush_s;  /* how long a worker tries to deliver its last events before it exits */
    int requeue;          /* sbatch --requeue (1, the default: Slurm runs the batch job again after a lost node or a
                           * preemption, and the worker resumes from its stage checkpoints) or --no-requeue (0) */
} ac_exec_config;

void exec_config_defaults(ac_exec_config *c);
/* The "executor" and "slurm" keys of the config object j (either may be absent). */
int exec_config_parse(ac_exec_config *c, json_t *j, ac_err *e);
void exec_config_free(ac_exec_config *c);
const char *exec_kind_name(ac_exec_kind k);
/* {"executor": "...", "slurm": {...}} (slurm only when that executor is chosen). */
json_t *exec_config_json(const ac_exec_config *c);

#endif
