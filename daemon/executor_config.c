/* executor_config.c - see executor_config.h. */
#include "executor_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void exec_config_defaults(ac_exec_config *c) {
    memset(c, 0, sizeof *c);
    c->kind = AC_EXEC_LOCAL;
    c->poll_s = 5;
    c->post_flush_s = 30;
    c->requeue = 1;
}

const char *exec_kind_name(ac_exec_kind k) { return k == AC_EXEC_SLURM ? "slurm" : "local"; }

/* A value sbatch gets as one argument: printable, no spaces or quotes. */
static int plain(const char *s) {
    for (; *s; s++)
        if (*s <= ' ' || *s == 0x7f || *s == '"' || *s == '\'' || *s == '\\') return 0;
    return 1;
}

static int str_key(json_t *o, const char *k, char *dst, size_t n, ac_err *e) {
    json_t *v = json_object_get(o, k);
    if (!v) return 0;
    if (!json_is_string(v) || json_string_length(v) >= n || !plain(json_string_value(v)))
        return ac_errf(e, "config: slurm.%s must be a string without spaces or quotes, shorter than %zu", k, n);
    snprintf(dst, n, "%s", json_string_value(v));
    return 0;
}

static int num_key(json_t *o, const char *k, double lo, double hi, double *dst, ac_err *e) {
    json_t *v = json_object_get(o, k);
    if (!v) return 0;
    if (!json_is_number(v) || json_number_value(v) < lo || json_number_value(v) > hi)
        return ac_errf(e, "config: slurm.%s must be a number in [%g, %g]", k, lo, hi);
    *dst = json_number_value(v);
    return 0;
}

/* Options that would take the job's files, name or output away from the daemon. */
static int reserved_option(const char *o) {
    static const char *bad[] = {"--output",     "--error",  "--job-name", "--chdir", "--parsable", "--wrap",
                                "--open-mode",  "--export", "--input",    "--array", "--wait",     "--requeue",
                                "--no-requeue", "-o",       "-e",         "-J",      "-D",         "-i",
                                "-a",           "-W",       NULL};
    for (int i = 0; bad[i]; i++) {
        size_t n = strlen(bad[i]);
        if (!strncmp(o, bad[i], n) && (o[n] == 0 || o[n] == '=')) return 1;
    }
    return 0;
}

static int slurm_parse(ac_exec_config *c, json_t *s, ac_err *e) {
    static const char *known[] = {
        "partition",      "account",    "qos",    "time_limit",   "gres",    "mem", "cpus_per_task",
        "sbatch_options", "daemon_url", "poll_s", "post_flush_s", "requeue", NULL};
    const char *k;
    json_t *v;
    if (!json_is_object(s)) return ac_errf(e, "config: slurm must be an object");
    json_object_foreach(s, k, v) {
        int ok = 0;
        for (int i = 0; known[i]; i++) ok |= !strcmp(known[i], k);
        if (!ok) return ac_errf(e, "config: unknown key slurm.%s", k);
    }
    double cpt = c->cpus_per_task;
    if (str_key(s, "partition", c->partition, sizeof c->partition, e) ||
        str_key(s, "account", c->account, sizeof c->account, e) || str_key(s, "qos", c->qos, sizeof c->qos, e) ||
        str_key(s, "time_limit", c->time_limit, sizeof c->time_limit, e) ||
        str_key(s, "gres", c->gres, sizeof c->gres, e) || str_key(s, "mem", c->mem, sizeof c->mem, e) ||
        str_key(s, "daemon_url", c->daemon_url, sizeof c->daemon_url, e) ||
        num_key(s, "cpus_per_task", 0, 4096, &cpt, e) || num_key(s, "poll_s", 0.2, 3600, &c->poll_s, e) ||
        num_key(s, "post_flush_s", 0, 3600, &c->post_flush_s, e))
        return -1;
    c->cpus_per_task = (int)cpt;
    json_t *rq = json_object_get(s, "requeue");
    if (rq && !json_is_boolean(rq)) return ac_errf(e, "config: slurm.requeue must be true or false");
    if (rq) c->requeue = json_is_true(rq);
    if (c->daemon_url[0] && strncmp(c->daemon_url, "http://", 7) && strncmp(c->daemon_url, "https://", 8))
        return ac_errf(e, "config: slurm.daemon_url must start with http:// or https://");
    json_t *opts = json_object_get(s, "sbatch_options");
    if (opts) {
        size_t i;
        if (!json_is_array(opts) || json_array_size(opts) > AC_SLURM_MAX_OPTS)
            return ac_errf(e, "config: slurm.sbatch_options must be an array of at most %d strings", AC_SLURM_MAX_OPTS);
        json_array_foreach(opts, i, v) {
            const char *o = json_string_value(v);
            if (!o || o[0] != '-' || strlen(o) > 256 || !plain(o))
                return ac_errf(e, "config: slurm.sbatch_options[%zu] must be one option (\"--name=value\", no spaces)",
                               i);
            if (reserved_option(o))
                return ac_errf(e, "config: slurm.sbatch_options[%zu] (%s) is set by the daemon itself%s", i, o,
                               strstr(o, "requeue") ? " (use slurm.requeue)" : "");
            if (!(c->sbatch_options[c->nsbatch_options++] = strdup(o))) return ac_errf(e, "out of memory");
        }
    }
    return 0;
}

int exec_config_parse(ac_exec_config *c, json_t *j, ac_err *e) {
    json_t *x = json_object_get(j, "executor"), *s = json_object_get(j, "slurm");
    if (x) {
        const char *n = json_string_value(x);
        if (n && !strcmp(n, "local"))
            c->kind = AC_EXEC_LOCAL;
        else if (n && !strcmp(n, "slurm"))
            c->kind = AC_EXEC_SLURM;
        else
            return ac_errf(e, "config: executor must be \"local\" or \"slurm\"");
    }
    return s ? slurm_parse(c, s, e) : 0;
}

void exec_config_free(ac_exec_config *c) {
    for (int i = 0; i < c->nsbatch_options; i++) free(c->sbatch_options[i]);
    c->nsbatch_options = 0;
}

json_t *exec_config_json(const ac_exec_config *c) {
    json_t *o = json_pack("{s:s}", "executor", exec_kind_name(c->kind));
    if (!o || c->kind != AC_EXEC_SLURM) return o;
    json_t *opts = json_array();
    for (int i = 0; opts && i < c->nsbatch_options; i++) json_array_append_new(opts, json_string(c->sbatch_options[i]));
    json_t *s = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:i,s:o,s:s,s:f,s:f,s:b}", "partition", c->partition, "account",
                          c->account, "qos", c->qos, "time_limit", c->time_limit, "gres", c->gres, "mem", c->mem,
                          "cpus_per_task", c->cpus_per_task, "sbatch_options", opts ? opts : json_array(), "daemon_url",
                          c->daemon_url, "poll_s", c->poll_s, "post_flush_s", c->post_flush_s, "requeue", c->requeue);
    if (!s || json_object_set_new(o, "slurm", s)) {
        json_decref(o);
        return NULL;
    }
    return o;
}
