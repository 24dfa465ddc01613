/*
 * routes_exec.c - GET /v1/config (the daemon's configuration as it runs,
 * secrets left out, with the executor), GET /v1/audit (the audit log,
 * admins only) and POST /v1/jobs/{id}/worker-events
 * (a worker on a Slurm node posts its events; authenticated by the job's
 * own secret, not by the API tokens). See http.h, executor.h.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "executor.h"
#include "http.h"
#include "views.h"

enum MHD_Result r_config(req_ctx *rc, json_t *body) {
    (void)body;
    const ac_config *c = &rc->d->cfg;
    json_t *roots = json_array();
    for (int i = 0; roots && i < c->nroots; i++) json_array_append_new(roots, json_string(c->model_roots[i]));
    char listen[200];
    snprintf(listen, sizeof listen, "%s:%d", c->listen_host, c->listen_port);
    json_t *o = json_pack("{s:s,s:s,s:o,s:i,s:i,s:b,s:i,s:s,s:i,s:f,s:i,s:i,s:b}", "listen", listen, "data_dir",
                          rc->d->data_dir_abs, "model_roots", roots ? roots : json_array(), "cpu_slots", c->cpu_slots,
                          "jobs_per_gpu", c->jobs_per_gpu, "use_gpus", c->use_gpus, "worker_threads", c->worker_threads,
                          "interrupted_policy", c->interrupted_policy, "max_attempts", c->max_attempts,
                          "cancel_grace_s", c->cancel_grace_s, "max_job_seconds", c->max_job_seconds,
                          "max_measurements", c->max_measurements, "auth", c->ntokens > 0);
    long mib = 0;
    const char *how = sched_worker_memory(rc->d, &mib);
    if (o) {
        json_object_set_new(o, "worker_silence_s", json_integer(c->worker_silence_s));
        json_object_set_new(o, "worker_memory_mib", json_integer(mib));
        json_object_set_new(o, "worker_memory_limit", json_string(how));
    }
    json_t *x = exec_config_json(&c->exec);
    if (o && x && c->exec.kind == AC_EXEC_SLURM) { /* the URL workers use, as resolved */
        json_t *st = sched_status(rc->d);
        json_t *url = json_object_get(json_object_get(st, "slurm"), "daemon_url");
        if (url) json_object_set(json_object_get(x, "slurm"), "daemon_url", url);
        json_decref(st);
    }
    if (o && x) json_object_update(o, x);
    json_decref(x);
    rep_view(rc, 200, o);
    return http_reply(rc);
}

enum MHD_Result r_audit(req_ctx *rc, json_t *body) {
    (void)body;
    ac_daemon *d = rc->d;
    int bad = 0;
    long limit = http_query_long(rc->c, "limit", 100, 1, 1000, &bad),
         after = http_query_long(rc->c, "after", 0, 0, LONG_MAX, &bad);
    const char *user = MHD_lookup_connection_value(rc->c, MHD_GET_ARGUMENT_KIND, "user");
    if (bad) {
        rep_error(d, &rc->rep, 400, "bad_request", "limit must be in [1,1000] and after an audit entry's id", "limit");
        return http_reply(rc);
    }
    db_audit_row *rows;
    int n;
    ac_err e = {{0}};
    if (db_audit_list(d->db, user, after, (int)limit, &rows, &n, &e)) {
        rep_store(d, &rc->rep, e.msg);
        return http_reply(rc);
    }
    json_t *o = view_audit_page(rows, n, (int)limit);
    free(rows);
    rep_view(rc, 200, o);
    return http_reply(rc);
}

enum MHD_Result r_worker_events(req_ctx *rc, json_t *body) {
    ac_daemon *d = rc->d;
    const char *auth = MHD_lookup_connection_value(rc->c, MHD_HEADER_KIND, "Authorization");
    const char *secret = auth && !strncmp(auth, "Bearer ", 7) ? auth + 7 : NULL;
    char msg[300] = "";
    const char *field = NULL;
    long last = 0;
    int st = exec_worker_post(d, rc->id, secret, body, msg, sizeof msg, &field, &last);
    if (st == 200)
        rep_json(&rc->rep, 200, json_pack("{s:I}", "last_seq", (json_int_t)last));
    else
        rep_error(d, &rc->rep, (unsigned)st,
                  st == 400   ? "bad_request"
                  : st == 401 ? "unauthorized"
                  : st == 409 ? "conflict"
                              : "unavailable",
                  msg, field);
    return http_reply(rc);
}
