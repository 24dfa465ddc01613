/*
 * config.h - the daemon's configuration: a JSON file (see
 * systemd/autocompressd.json for every key) overridden by command-line flags.
 */
#ifndef AC_CONFIG_H
#define AC_CONFIG_H

#include "err.h"

#define AC_MAX_TOKENS 32
#define AC_MAX_ROOTS 16

typedef struct {
    char listen_host[128];
    int listen_port;
    char db_path[1024];
    char data_dir[1024];
    char web_dir[1024];
    char *tokens[AC_MAX_TOKENS];
    int ntokens;
    char *model_roots[AC_MAX_ROOTS]; /* paths a job may read from / write to */
    int nroots;
    int cpu_slots;          /* concurrent CPU jobs */
    int jobs_per_gpu;
    int use_gpus;           /* 0 = ignore CUDA devices */
    long max_body_bytes;
    int max_connections;
    int sse_keepalive_s;
    size_t sse_buffer_bytes;
    char interrupted_policy[16]; /* requeue | fail */
    int max_attempts;
    double cancel_grace_s;
    int worker_threads;
} ac_config;

void config_defaults(ac_config *c);
int config_load(ac_config *c, const char *path, ac_err *e);
/* Parse "host:port" into c. */
int config_listen(ac_config *c, const char *hostport, ac_err *e);
void config_free(ac_config *c);

#endif
