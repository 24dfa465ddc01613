/*
 * routes_cost.c - estimates (on the thread pool: they read config.json) and
 * the cost-table cache: list, get, import, measure (scheduled like a job,
 * scheduler.c) and measurements. See http.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autocompress.h"
#include "costcache.h"
#include "http.h"
#include "views.h"

static void task_estimate(req_ctx *rc) {
    ac_err e = {{0}};
    json_t *out = NULL;
    const char *field = NULL;
    ac_cost_cache cache;
    costcache_db(&cache, rc->d->db); /* cached tables only: an estimate measures nothing */
    if (ac_estimate_json(rc->in, &cache, rc->d->cfg.worker_threads, &out, &field, &e))
        rep_error(rc->d, &rc->rep, 400, "invalid_request", e.msg, field);
    else
        rep_json(&rc->rep, 200, out);
}

enum MHD_Result r_estimate(req_ctx *rc, json_t *body) {
    rc->in = json_incref(body);
    return http_offload(rc, task_estimate);
}

enum MHD_Result r_measurements(req_ctx *rc, json_t *body) {
    (void)body;
    rep_json(&rc->rep, 200, json_pack("{s:o}", "measurements", sched_measurements(rc->d)));
    return http_reply(rc);
}

enum MHD_Result r_measure_cancel(req_ctx *rc, json_t *body) {
    (void)body;
    ac_daemon *d = rc->d;
    int rcx = sched_measure_cancel(d, rc->id);
    if (rcx < 0)
        rep_error(d, &rc->rep, 404, "not_found", "no such measurement", NULL);
    else if (rcx > 0)
        rep_error(d, &rc->rep, 409, "conflict", "measurement already ended", NULL);
    else
        rep_json(&rc->rep, 202, json_pack("{s:I,s:s}", "id", (json_int_t)rc->id, "status", "cancelling"));
    return http_reply(rc);
}

enum MHD_Result r_cost_list(req_ctx *rc, json_t *body) {
    (void)body;
    ac_err e = {{0}};
    db_cost_row *rows;
    int n;
    if (db_cost_list(rc->d->db, &rows, &n, &e)) {
        rep_store(rc->d, &rc->rep, e.msg);
        return http_reply(rc);
    }
    json_t *o = view_cost_tables(rows, n);
    free(rows);
    rep_view(rc, 200, o);
    return http_reply(rc);
}

static void cost_measure(req_ctx *rc, json_t *m) {
    ac_daemon *d = rc->d;
    reply *r = &rc->rep;
    ac_err e = {{0}};
    const char *field = NULL;
    if (ac_cost_measure_validate(m, &field, &e)) {
        rep_error(d, r, 400, "invalid_request", e.msg, field);
        return;
    }
    /* no threads named: the daemon's worker_threads, the key its jobs plan with */
    if (!json_object_get(m, "threads")) json_object_set_new(m, "threads", json_integer(d->cfg.worker_threads));
    char key[512], why[300];
    ac_cost_measure_key(m, key, sizeof key);
    long id;
    int q = sched_measure(d, m, key, &id, why, sizeof why);
    if (q == 1)
        rep_error(d, r, 409, "conflict", why, "measure");
    else if (q)
        rep_error(d, r, 503, "busy", why, NULL);
    else
        rep_json(r, 202, json_pack("{s:s,s:s,s:I}", "key", key, "status", "measuring", "measurement", (json_int_t)id));
}

static void cost_import(req_ctx *rc, json_t *t) {
    ac_daemon *d = rc->d;
    reply *r = &rc->rep;
    ac_err e = {{0}};
    const char *field = NULL;
    if (ac_cost_table_validate(t, &field, &e)) {
        rep_error(d, r, 400, "invalid_table", e.msg, field);
        return;
    }
    const char *key = json_string_value(json_object_get(t, "key"));
    char src[32];
    if (db_cost_source(d->db, key, src, sizeof src, &e)) {
        rep_store(d, r, e.msg);
        return;
    }
    if (src[0]) { /* never replace a cached table silently */
        char m[700];
        snprintf(m, sizeof m, "a cost table with key %.400s is already cached (source %s); import it under another key",
                 key, src);
        rep_error(d, r, 409, "conflict", m, "table.key");
        return;
    }
    char *s = json_dumps(t, JSON_COMPACT);
#define TXT(k) json_string_value(json_object_get(t, k))
    int rcx = s ? db_cost_put(d->db, key, TXT("device"), TXT("dtype"), TXT("engine"),
                              (int)json_integer_value(json_object_get(t, "version")), "imported", s, &e)
                : ac_errf(&e, "out of memory");
#undef TXT
    free(s);
    if (rcx)
        rep_store(d, r, e.msg);
    else
        rep_json(r, 201, json_pack("{s:O,s:s}", "key", json_object_get(t, "key"), "status", "imported"));
}

enum MHD_Result r_cost_post(req_ctx *rc, json_t *body) {
    json_t *m = json_object_get(body, "measure"), *t = json_object_get(body, "table");
    if (m)
        cost_measure(rc, m);
    else if (t)
        cost_import(rc, t);
    else
        rep_error(rc->d, &rc->rep, 400, "invalid_request", "body needs \"table\" (import) or \"measure\"", NULL);
    return http_reply(rc);
}

enum MHD_Result r_cost_get(req_ctx *rc, json_t *body) {
    (void)body;
    ac_err e = {{0}};
    char key[512], *data;
    snprintf(key, sizeof key, "%s", rc->rest);
    MHD_http_unescape(key); /* a no-op when MHD already decoded the path */
    if (db_cost_get(rc->d->db, key, &data, &e))
        rep_store(rc->d, &rc->rep, e.msg);
    else if (!data)
        rep_error(rc->d, &rc->rep, 404, "not_found", "no cost table with that key", NULL);
    else
        rep_text(&rc->rep, 200, "application/json", data, strlen(data));
    return http_reply(rc);
}
