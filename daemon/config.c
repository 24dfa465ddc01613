/* config.c - see config.h. */
#include "config.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void config_defaults(ac_config *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->listen_host, sizeof c->listen_host, "127.0.0.1");
    c->listen_port = 8321;
    snprintf(c->db_path, sizeof c->db_path, "autocompress.db");
    snprintf(c->data_dir, sizeof c->data_dir, "autocompress-data");
    c->cpu_slots = 1;
    c->jobs_per_gpu = 1;
    c->use_gpus = 1;
    c->max_body_bytes = 1 << 20;
    c->max_connections = 256;
    c->sse_keepalive_s = 15;
    c->sse_buffer_bytes = 1 << 20;
    snprintf(c->interrupted_policy, sizeof c->interrupted_policy, "requeue");
    c->max_attempts = 3;
    c->cancel_grace_s = 1.0;
    c->worker_threads = 2;
    c->quiet_budget_s = -1;
    c->max_connections_per_client = 64;
    c->max_sse_streams = 1024;
    c->header_timeout_s = 10;
    c->body_timeout_s = 30;
    c->idle_timeout_s = 60;
    c->http_threads = 2;
    c->max_job_seconds = 86400;
    c->worker_silence_s = 60;
    c->worker_memory_mib = -1;
    c->max_calibration_tokens = 1L << 24;
    c->max_search_steps = 100000;
    c->max_eval_windows = 1L << 20;
    c->max_distill_tokens = 10000000;
    c->max_measurements = 4;
    exec_config_defaults(&c->exec);
}

int config_is_loopback(const char *h) {
    return !strcmp(h, "localhost") || !strncmp(h, "127.", 4) || !strcmp(h, "::1") || !strcmp(h, "[::1]");
}

int config_listen(ac_config *c, const char *hp, ac_err *e) {
    const char *colon = strrchr(hp, ':');
    if (!colon || colon == hp) return ac_errf(e, "listen address %s must be HOST:PORT", hp);
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 0 || port > 65535) return ac_errf(e, "bad port in %s", hp);
    size_t hl = (size_t)(colon - hp);
    if (hl >= sizeof c->listen_host) return ac_errf(e, "host too long in %s", hp);
    memcpy(c->listen_host, hp, hl);
    c->listen_host[hl] = 0;
    c->listen_port = (int)port;
    return 0;
}

static int str_field(json_t *j, const char *k, char *dst, size_t n, ac_err *e) {
    json_t *v = json_object_get(j, k);
    if (!v) return 0;
    if (!json_is_string(v) || json_string_length(v) >= n)
        return ac_errf(e, "config: %s must be a string shorter than %zu", k, n);
    snprintf(dst, n, "%s", json_string_value(v));
    return 0;
}

static int int_field(json_t *j, const char *k, long lo, long hi, long *dst, ac_err *e) {
    json_t *v = json_object_get(j, k);
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return ac_errf(e, "config: %s must be an integer in [%ld, %ld]", k, lo, hi);
    *dst = (long)json_integer_value(v);
    return 0;
}

int config_load(ac_config *c, const char *path, ac_err *e) {
    json_error_t je;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!j) return ac_errf(e, "config %s: %s (line %d)", path, je.text, je.line);
    int rc = config_parse(c, j, e);
    json_decref(j);
    if (rc) ac_errctx(e, "config %s", path);
    return rc;
}

/* The keys added for hostile clients and job limits. */
static int limits_parse(ac_config *c, json_t *j, ac_err *e) {
    long v[12] = {c->max_connections_per_client,
                  c->max_sse_streams,
                  c->header_timeout_s,
                  c->body_timeout_s,
                  c->idle_timeout_s,
                  c->http_threads,
                  c->max_job_seconds,
                  c->max_calibration_tokens,
                  c->max_search_steps,
                  c->max_eval_windows,
                  c->max_measurements,
                  c->max_distill_tokens};
    if (int_field(j, "max_connections_per_client", 1, 100000, &v[0], e) ||
        int_field(j, "max_sse_streams", 0, 100000, &v[1], e) || int_field(j, "header_timeout_s", 1, 3600, &v[2], e) ||
        int_field(j, "body_timeout_s", 1, 3600, &v[3], e) || int_field(j, "idle_timeout_s", 1, 86400, &v[4], e) ||
        int_field(j, "http_threads", 1, 64, &v[5], e) || int_field(j, "max_job_seconds", 1, 30L * 86400, &v[6], e) ||
        int_field(j, "max_calibration_tokens", 256, 1L << 24, &v[7], e) ||
        int_field(j, "max_search_steps", 1, 100000, &v[8], e) ||
        int_field(j, "max_eval_windows", 1, 1L << 20, &v[9], e) || int_field(j, "max_measurements", 1, 64, &v[10], e) ||
        int_field(j, "max_distill_tokens", 0, 1000000000L, &v[11], e))
        return -1;
    if (str_field(j, "tls_cert", c->tls_cert, sizeof c->tls_cert, e) ||
        str_field(j, "tls_key", c->tls_key, sizeof c->tls_key, e))
        return -1;
    if (!c->tls_cert[0] != !c->tls_key[0]) return ac_errf(e, "config: tls_cert and tls_key go together");
    long ws = c->worker_silence_s, wm = c->worker_memory_mib;
    if (int_field(j, "worker_silence_s", 1, 86400, &ws, e) || int_field(j, "worker_memory_mib", 0, 1L << 30, &wm, e))
        return -1;
    if (wm > 0 && wm < 16) return ac_errf(e, "config: worker_memory_mib must be 0 (no limit) or at least 16");
    c->worker_silence_s = (int)ws;
    c->worker_memory_mib = wm;
    c->max_distill_tokens = v[11];
    c->max_connections_per_client = (int)v[0];
    c->max_sse_streams = (int)v[1];
    c->header_timeout_s = (int)v[2];
    c->body_timeout_s = (int)v[3];
    c->idle_timeout_s = (int)v[4];
    c->http_threads = (int)v[5];
    c->max_job_seconds = (int)v[6];
    c->max_calibration_tokens = v[7];
    c->max_search_steps = v[8];
    c->max_eval_windows = v[9];
    c->max_measurements = (int)v[10];
    json_t *ah = json_object_get(j, "allowed_hosts"), *x;
    if (ah) {
        size_t i;
        if (!json_is_array(ah) || json_array_size(ah) > AC_MAX_ROOTS)
            return ac_errf(e, "allowed_hosts must be an array of host names");
        json_array_foreach(ah, i, x) {
            if (!json_is_string(x) || json_string_length(x) < 1 || json_string_length(x) > 253)
                return ac_errf(e, "allowed_hosts entries must be host names");
            char *h = strdup(json_string_value(x));
            if (!h) return ac_errf(e, "out of memory");
            c->allowed_hosts[c->nallowed_hosts++] = h;
        }
    }
    return 0;
}

static int known_keys(json_t *j, ac_err *e) {
    // clang-format off
    static const char *known[] = {
        "listen", "db", "data_dir", "web_dir", "tokens", "model_roots", "cpu_slots", "jobs_per_gpu", "use_gpus",
        "max_body_bytes", "max_connections", "sse_keepalive_s", "sse_buffer_bytes", "interrupted_policy",
        "max_attempts", "cancel_grace_s", "worker_threads", "max_connections_per_client", "max_sse_streams",
        "header_timeout_s", "body_timeout_s", "idle_timeout_s", "http_threads", "allowed_hosts", "max_job_seconds",
        "max_calibration_tokens", "max_search_steps", "max_eval_windows", "max_measurements", "max_distill_tokens",
        "quiet_budget_s", "worker_silence_s", "worker_memory_mib", "tls_cert", "tls_key", "executor", "slurm", NULL};
    // clang-format on
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v) {
        int ok = 0;
        for (int i = 0; known[i]; i++) ok |= !strcmp(known[i], k);
        if (!ok) return ac_errf(e, "unknown key %s", k);
    }
    return 0;
}

/* Paths, slots and sizes. */
static int basics_parse(ac_config *c, json_t *j, ac_err *e) {
    char listen[200] = "";
    long cpu = c->cpu_slots, gpu = c->jobs_per_gpu, body = c->max_body_bytes, conns = c->max_connections,
         ka = c->sse_keepalive_s, sb = (long)c->sse_buffer_bytes, att = c->max_attempts, wt = c->worker_threads;
    if (str_field(j, "listen", listen, sizeof listen, e) || (listen[0] && config_listen(c, listen, e)) ||
        str_field(j, "db", c->db_path, sizeof c->db_path, e) ||
        str_field(j, "data_dir", c->data_dir, sizeof c->data_dir, e) ||
        str_field(j, "web_dir", c->web_dir, sizeof c->web_dir, e) ||
        str_field(j, "interrupted_policy", c->interrupted_policy, sizeof c->interrupted_policy, e) ||
        int_field(j, "cpu_slots", 0, 256, &cpu, e) || int_field(j, "jobs_per_gpu", 1, 64, &gpu, e) ||
        int_field(j, "max_body_bytes", 1024, 1L << 30, &body, e) ||
        int_field(j, "max_connections", 1, 100000, &conns, e) || int_field(j, "sse_keepalive_s", 1, 3600, &ka, e) ||
        int_field(j, "sse_buffer_bytes", 4096, 1L << 30, &sb, e) || int_field(j, "max_attempts", 1, 100, &att, e) ||
        int_field(j, "worker_threads", 1, 256, &wt, e))
        return -1;
    c->cpu_slots = (int)cpu;
    c->jobs_per_gpu = (int)gpu;
    c->max_body_bytes = body;
    c->max_connections = (int)conns;
    c->sse_keepalive_s = (int)ka;
    c->sse_buffer_bytes = (size_t)sb;
    c->max_attempts = (int)att;
    c->worker_threads = (int)wt;
    if (strcmp(c->interrupted_policy, "requeue") && strcmp(c->interrupted_policy, "fail"))
        return ac_errf(e, "config: interrupted_policy must be requeue or fail");
    json_t *g = json_object_get(j, "use_gpus"), *cg = json_object_get(j, "cancel_grace_s"),
           *qb = json_object_get(j, "quiet_budget_s");
    if (g && !json_is_boolean(g)) return ac_errf(e, "config: use_gpus must be a boolean");
    if (g) c->use_gpus = json_is_true(g);
    if (cg && (!json_is_number(cg) || json_number_value(cg) < 0))
        return ac_errf(e, "config: cancel_grace_s must be a number >= 0");
    if (cg) c->cancel_grace_s = json_number_value(cg);
    if (qb && (!json_is_number(qb) || json_number_value(qb) < 0 || json_number_value(qb) > 3600))
        return ac_errf(e, "config: quiet_budget_s must be a number in [0, 3600]");
    if (qb) c->quiet_budget_s = json_number_value(qb);
    return 0;
}

/* tokens and model_roots. */
static int lists_parse(ac_config *c, json_t *j, ac_err *e) {
    json_t *arrs[2] = {json_object_get(j, "tokens"), json_object_get(j, "model_roots")}, *v;
    for (int a = 0; a < 2; a++) {
        if (!arrs[a]) continue;
        if (!json_is_array(arrs[a]) || json_array_size(arrs[a]) > (a ? AC_MAX_ROOTS : AC_MAX_TOKENS))
            return ac_errf(e, "config: %s must be an array of strings", a ? "model_roots" : "tokens");
        size_t i;
        json_array_foreach(arrs[a], i, v) {
            if (!json_is_string(v) || json_string_length(v) < (a ? 1 : 16))
                return ac_errf(e, a ? "config: model_roots entries must be paths"
                                    : "config: tokens must be strings of at least 16 characters");
            char *dup = strdup(json_string_value(v));
            if (!dup) return ac_errf(e, "out of memory");
            if (a)
                c->model_roots[c->nroots++] = dup;
            else
                c->tokens[c->ntokens++] = dup;
        }
    }
    return 0;
}

int config_parse(ac_config *c, json_t *j, ac_err *e) {
    if (!json_is_object(j)) return ac_errf(e, "must be a JSON object");
    if (known_keys(j, e) || basics_parse(c, j, e) || limits_parse(c, j, e) || lists_parse(c, j, e) ||
        exec_config_parse(&c->exec, j, e))
        return -1;
    return 0;
}

void config_free(ac_config *c) {
    for (int i = 0; i < c->ntokens; i++) free(c->tokens[i]);
    for (int i = 0; i < c->nroots; i++) free(c->model_roots[i]);
    for (int i = 0; i < c->nallowed_hosts; i++) free(c->allowed_hosts[i]);
    c->ntokens = c->nroots = c->nallowed_hosts = 0;
    exec_config_free(&c->exec);
}
