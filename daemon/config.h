/*
 * config.h - the daemon's configuration: a JSON file (see
 * systemd/autocompressd.json for every key) overridden by command-line flags.
 */
#ifndef AC_CONFIG_H
#define AC_CONFIG_H

#include <jansson.h>

#include "autocompress.h"
#include "executor_config.h"

#define AC_MAX_TOKENS 32
#define AC_MAX_ROOTS 16

typedef struct {
    char listen_host[128];
    int listen_port;
    char db_path[1024];
    char data_dir[1024];
    char web_dir[1024];
    char tls_cert[1024], tls_key[1024]; /* PEM files: HTTPS when both are set */
    char *tokens[AC_MAX_TOKENS];
    int ntokens;
    char *model_roots[AC_MAX_ROOTS]; /* paths a job may read from / write to */
    int nroots;
    int cpu_slots; /* concurrent CPU jobs */
    int jobs_per_gpu;
    int use_gpus; /* 0 = ignore CUDA devices */
    long max_body_bytes;
    int max_connections;
    int sse_keepalive_s;
    size_t sse_buffer_bytes;
    char interrupted_policy[16]; /* requeue | fail */
    int max_attempts;
    double cancel_grace_s;
    int worker_threads;
    double quiet_budget_s; /* cap on quiet re-measurement (quiet.h) in workers; < 0: the library's own */
    /* Connections (see http.c, conn.c). */
    int max_connections_per_client;    /* per client IP, API and SSE together */
    int max_sse_streams;               /* counted apart from max_connections */
    int header_timeout_s;              /* whole request head within this */
    int body_timeout_s;                /* whole body within this */
    int idle_timeout_s;                /* keep-alive idle connections */
    int http_threads;                  /* libuv's thread pool, for file-touching routes */
    char *allowed_hosts[AC_MAX_ROOTS]; /* Host names accepted besides loopback ones */
    int nallowed_hosts;
    /* Job limits (400 naming the cap at submit; wall clock in the scheduler). */
    int max_job_seconds;
    int worker_silence_s;   /* a worker not heard from (no heartbeat) this long is failed */
    long worker_memory_mib; /* each worker's memory limit (wlimit.h); 0: none; < 0: 90% of the host's */
    long max_calibration_tokens;
    long max_search_steps;
    long max_eval_windows;
    long max_distill_tokens; /* distill.tokens per pruned model */
    int max_measurements;    /* queued + running cost-table measurements */
    ac_exec_config exec;     /* "executor" and "slurm" (executor_config.h) */
} ac_config;

void config_defaults(ac_config *c);
int config_load(ac_config *c, const char *path, ac_err *e);
/* The same from parsed JSON (the fuzz entry); j is not consumed. */
int config_parse(ac_config *c, json_t *j, ac_err *e);
/* 1 when host (an address or name) is a loopback one. */
int config_is_loopback(const char *host);
/* Parse "host:port" into c. */
int config_listen(ac_config *c, const char *hostport, ac_err *e);
void config_free(ac_config *c);

#endif
