/*
 * routes_jobs.c - the job routes: submit and validate (the spec checked by
 * ac_job_spec_check on the thread pool: fields, caps, devices, paths, the
 * model's files), list, get, cancel, events (JSON
 * or an SSE stream, sse.c), result and log. See http.h.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autocompress.h"
#include "conn.h"
#include "executor.h"
#include "http.h"
#include "views.h"

/* The server's job caps: 0 or -1 with a 400 naming the cap. */
static int check_limits(ac_daemon *d, const ac_job_spec *js, reply *r) {
    struct {
        const char *field, *cap;
        double v;
        long max;
    } c[] = {
        {"calibration_tokens", "max_calibration_tokens", js->calibration_tokens, d->cfg.max_calibration_tokens},
        {"search.steps", "max_search_steps", js->search.steps, d->cfg.max_search_steps},
        {"search.dnas_steps", "max_search_steps", js->search.dnas_steps, d->cfg.max_search_steps}, /* gate steps */
        {"eval.windows", "max_eval_windows", js->eval.windows, d->cfg.max_eval_windows},
        {"distill.tokens", "max_distill_tokens", (double)js->distill.tokens, d->cfg.max_distill_tokens},
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++)
        if (c[i].v > (double)c[i].max) {
            char m[300];
            snprintf(m, sizeof m, "%s=%.0f exceeds this server's cap %s=%ld", c[i].field, c[i].v, c[i].cap, c[i].max);
            rep_error(d, r, 400, "limit_exceeded", m, c[i].field);
            return -1;
        }
    return 0;
}

/* A device a spec names must be one this server has. */
static int check_device(ac_daemon *d, const ac_job_spec *js, reply *r) {
    if (js->target.dev.kind != AC_TARGET_CUDA || d->cfg.exec.kind == AC_EXEC_SLURM) return 0; /* nodes' GPUs */
    int gpus = 0;
    for (int i = 0; i < d->ndevices; i++) gpus += d->devices[i].index >= 0;
    if (!gpus || !d->cfg.use_gpus) {
        rep_error(d, r, 400, "no_device",
                  "target.device asks for a local CUDA GPU but this server has none; name a spec profile "
                  "(e.g. H100) to target a GPU that is not here",
                  "target.device");
        return -1;
    }
    if (js->target.dev.ordinal >= gpus) {
        rep_error(d, r, 400, "no_device",
                  "target.device names a CUDA device this server does not have (see GET /v1/devices)", "target.device");
        return -1;
    }
    return 0;
}

/* The job named by the path's {id} into *j: 0, or -1 with a 404 / 503 reply. */
static int load_job(req_ctx *rc, db_job *j) {
    ac_err e = {{0}};
    int found;
    if (db_job_get(rc->d->db, rc->id, j, &found, &e)) {
        rep_store(rc->d, &rc->rep, e.msg);
        return -1;
    }
    if (!found) {
        rep_error(rc->d, &rc->rep, 404, "not_found", "no such job", NULL);
        return -1;
    }
    return 0;
}

/* Whether the path's job has ended: 1 yes, 0 no, -1 with a 404 / 503 reply. */
static int job_ended(req_ctx *rc) {
    db_job j;
    if (load_job(rc, &j)) return -1;
    int ended = job_state_terminal(j.state);
    db_job_clear(&j);
    return ended;
}

static void rep_job(req_ctx *rc, unsigned status);

/* POST /v1/jobs, a new job stored: its first event, and the scheduler told. Loop thread. */
static void post_job_queued(req_ctx *rc) {
    atomic_fetch_add(&rc->d->jobs_submitted, 1);
    daemon_event(rc->d, rc->id, "state", json_pack("{s:s}", "state", "queued"));
    sched_notify(rc->d);
}

/* The daemon's rules in ac_job_spec_check (after the fields, before the
 * files): its caps, its devices and, on submit, the Idempotency-Key. They
 * read only what is fixed at start (configuration, devices): thread pool. */
static int daemon_rules(void *ud, const ac_job_spec *js) {
    req_ctx *rc = ud;
    if (check_limits(rc->d, js, &rc->rep) || check_device(rc->d, js, &rc->rep)) return -1;
    const char *key = rc->idem_key;
    if (!key) return 0;
    size_t kl = strlen(key);
    int ok = kl >= 1 && kl <= 200;
    for (size_t i = 0; i < kl && ok; i++) ok = key[i] > 32 && key[i] < 127;
    if (ok) return 0;
    rep_error(rc->d, &rc->rep, 400, "bad_request", "Idempotency-Key must be 1 to 200 printable ASCII characters",
              "Idempotency-Key");
    return -1;
}

/* The job spec in rc->in through ac_job_spec_check into rc->js, as submit
 * and POST /v1/validate both see it: 0, or -1 with the 400 reply. Thread pool. */
static int check_spec(req_ctx *rc) {
    ac_daemon *d = rc->d;
    ac_err e = {{0}};
    const char *field = NULL;
    char jobs_dir[1100];
    snprintf(jobs_dir, sizeof jobs_dir, "%s/jobs", d->data_dir_abs);
    ac_limit_bound b = {0};
    ac_job_check_opts o = {.jobs_dir = jobs_dir, .rules = daemon_rules, .ud = rc, .bound = &b};
    switch (ac_job_spec_check(rc->in, rc->js, &o, &field, &e)) {
    case AC_SPEC_OK: return 0;
    case AC_SPEC_INVALID:
        rep_error(d, &rc->rep, 400, "invalid_spec", e.msg, field);
        if (b.constraint) /* a limit no structure reaches: the limit and the best any structure reaches */
            json_object_set_new(json_object_get(rc->rep.json, "error"), "bound",
                                json_pack("{s:s,s:s,s:s,s:s,s:f,s:f}", "constraint", b.constraint, "metric", b.metric,
                                          "unit", b.unit, "kind", b.ge ? "min" : "max", "limit", b.limit,
                                          "reachable", b.reachable));
        break;
    case AC_SPEC_BAD_PATH: {
        char msg[600];
        snprintf(msg, sizeof msg, "%s: %s", field, e.msg);
        rep_error(d, &rc->rep, 400, "invalid_path", msg, field);
        break;
    }
    case AC_SPEC_REFUSED: break; /* daemon_rules replied */
    }
    return -1;
}

/* POST /v1/jobs: the spec checked, then inserted. Thread pool. */
static void task_post_job(req_ctx *rc) {
    ac_daemon *d = rc->d;
    reply *r = &rc->rep;
    json_t *spec = rc->in;
    ac_err e = {{0}};
    const ac_job_spec *js = rc->js;
    if (check_spec(rc)) return;
    char *s = json_dumps(spec, JSON_COMPACT | JSON_PRESERVE_ORDER), *existing = NULL, key[300];
    const char *owner = rc->who.user[0] ? rc->who.user : NULL;
    if (rc->idem_key && owner) /* one user's Idempotency-Key never finds another's job */
        snprintf(key, sizeof key, "%s\x1f%s", owner, rc->idem_key);
    const char *k = rc->idem_key && owner ? key : rc->idem_key;
    long id = s ? db_job_insert(d->db, s, js->name[0] ? js->name : NULL, js->priority, owner, k, &existing, &e)
                : ac_errf(&e, "out of memory");
    free(s);
    if (id < 0) {
        rep_store(d, r, e.msg);
        return;
    }
    unsigned status = 201;
    if (existing) { /* a retry with the same Idempotency-Key */
        json_t *old = json_loads(existing, 0, NULL);
        int same = old && json_equal(old, spec);
        json_decref(old);
        free(existing);
        if (!same) {
            rep_error(d, r, 409, "idempotency_conflict", "this Idempotency-Key was used for a different job spec",
                      NULL);
            return;
        }
        status = 200;
        r->hdr_name = "Idempotent-Replayed";
        r->hdr_value = "true";
    } else { /* 201 Created with the job's Location */
        rc->after = post_job_queued;
        snprintf(rc->url, sizeof rc->url, "/v1/jobs/%ld", id);
        r->hdr_name = "Location";
        r->hdr_value = rc->url;
    }
    rc->id = id;
    rep_job(rc, status);
}

static void task_log(req_ctx *rc) {
    char p[2200];
    snprintf(p, sizeof p, "%s/jobs/%ld/worker.log", rc->d->cfg.data_dir, rc->id);
    size_t len = 0;
    ac_err e;
    char *txt = ac_read_file(p, 16u << 20, &len, &e);
    if (!txt) { /* no log yet */
        txt = strdup("");
        len = 0;
    }
    if (txt)
        rep_text(&rc->rep, 200, "text/plain; charset=utf-8", txt, len);
    else
        rep_error(rc->d, &rc->rep, 503, "busy", "out of memory", NULL);
}

/* Reply with the job as it is now (status 200, 201, 202). */
static void rep_job(req_ctx *rc, unsigned status) {
    db_job j;
    if (load_job(rc, &j)) return;
    json_t *o = view_job(&j);
    db_job_clear(&j);
    if (o) exec_job_view(rc->d, rc->id, o); /* executor, Slurm job id */
    rep_view(rc, status, o);
}

enum MHD_Result r_jobs_post(req_ctx *rc, json_t *spec) {
    ac_daemon *d = rc->d;
    reply *r = &rc->rep;
    ac_job_spec *js = rc->js = malloc(sizeof *rc->js);
    if (!js) {
        rep_error(d, r, 503, "busy", "out of memory", NULL);
        return http_reply(rc);
    }
    const char *key = MHD_lookup_connection_value(rc->c, MHD_HEADER_KIND, "Idempotency-Key");
    if (key && !(rc->idem_key = strdup(key))) { /* checked by daemon_rules, in ac_job_spec_check's order */
        rep_error(d, r, 503, "busy", "out of memory", NULL);
        return http_reply(rc);
    }
    rc->in = json_incref(spec);
    return http_offload(rc, task_post_job);
}

/* POST /v1/validate: what POST /v1/jobs answers a spec, without the job. Thread pool. */
static void task_validate(req_ctx *rc) {
    if (!check_spec(rc)) rep_view(rc, 200, json_pack("{s:b}", "ok", 1));
}

enum MHD_Result r_validate(req_ctx *rc, json_t *spec) {
    if (!(rc->js = malloc(sizeof *rc->js))) {
        rep_error(rc->d, &rc->rep, 503, "busy", "out of memory", NULL);
        return http_reply(rc);
    }
    rc->in = json_incref(spec);
    return http_offload(rc, task_validate);
}

enum MHD_Result r_jobs_list(req_ctx *rc, json_t *body) {
    (void)body;
    ac_daemon *d = rc->d;
    reply *r = &rc->rep;
    ac_err e = {{0}};
    int bad = 0;
    long limit = http_query_long(rc->c, "limit", 100, 1, 1000, &bad),
         after = http_query_long(rc->c, "after", 0, 0, LONG_MAX, &bad);
    const char *state = MHD_lookup_connection_value(rc->c, MHD_GET_ARGUMENT_KIND, "state");
    job_state st;
    if (bad) {
        rep_error(d, r, 400, "bad_request", "limit must be in [1,1000] and after a job id", "limit");
        return http_reply(rc);
    }
    if (state && job_state_parse(state, &st)) {
        rep_error(d, r, 400, "bad_request", "state must be queued, running, succeeded, failed or cancelled", "state");
        return http_reply(rc);
    }
    db_job *jobs;
    int n;
    const char *owner = rc->who.role == ROLE_ADMIN ? NULL : rc->who.user; /* admins see every user's jobs */
    if (db_job_list(d->db, state ? &st : NULL, owner, after, (int)limit, &jobs, &n, &e)) {
        rep_store(d, r, e.msg);
        return http_reply(rc);
    }
    json_t *o = view_job_page(jobs, n, (int)limit);
    db_jobs_free(jobs, n);
    rep_view(rc, 200, o);
    return http_reply(rc);
}

enum MHD_Result r_job_get(req_ctx *rc, json_t *body) {
    (void)body;
    rep_job(rc, 200);
    return http_reply(rc);
}

enum MHD_Result r_job_cancel(req_ctx *rc, json_t *body) {
    (void)body;
    ac_daemon *d = rc->d;
    reply *r = &rc->rep;
    ac_err e = {{0}};
    int ended = job_ended(rc);
    if (ended) {
        if (ended > 0) rep_error(d, r, 409, "conflict", "job already ended", NULL);
        return http_reply(rc);
    }
    if (db_job_set_cancel(d->db, rc->id, &e)) {
        rep_store(d, r, e.msg);
        return http_reply(rc);
    }
    int t = db_job_transition(d->db, rc->id, JOB_QUEUED, JOB_CANCELLED, "cancelled by user before it started", NULL,
                              NULL, &e);
    if (t < 0) {
        rep_store(d, r, e.msg);
        return http_reply(rc);
    }
    if (t == 0) {
        sched_release_checkpoints(d, rc->id); /* a job re-queued after a restart may have some */
        daemon_event(d, rc->id, "state", json_pack("{s:s,s:s}", "state", "cancelled", "reason", "cancelled by user"));
        events_finish(d, rc->id);
    } else {
        sched_cancel(d, rc->id);
    }
    rep_job(rc, 202);
    return http_reply(rc);
}

/* after / Last-Event-ID: the events already seen. -1 when malformed. */
static long events_after(struct MHD_Connection *c) {
    int bad = 0;
    const char *lei = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Last-Event-ID");
    long after = http_query_long(c, "after", 0, 0, LONG_MAX, &bad);
    if (lei) {
        char *end;
        errno = 0;
        after = strtol(lei, &end, 10);
        if (errno || end == lei || *end || after < 0) bad = 1;
    }
    return bad ? -1 : after;
}

enum MHD_Result r_job_events(req_ctx *rc, json_t *body) {
    (void)body;
    ac_daemon *d = rc->d;
    reply *r = &rc->rep;
    ac_err e = {{0}};
    int terminal = job_ended(rc), bad = 0;
    if (terminal < 0) return http_reply(rc);
    long after = events_after(rc->c);
    if (after < 0) {
        rep_error(d, r, 400, "bad_request", "after / Last-Event-ID must be a non-negative event id", "after");
        return http_reply(rc);
    }
    const char *fmt = MHD_lookup_connection_value(rc->c, MHD_GET_ARGUMENT_KIND, "format");
    if (rc->head && !(fmt && !strcmp(fmt, "json"))) { /* the stream's headers, no stream */
        char *empty = strdup("");
        if (empty)
            rep_text(r, 200, "text/event-stream", empty, 0);
        else
            rep_error(d, r, 503, "busy", "out of memory", NULL);
        return http_reply(rc);
    }
    if (fmt && !strcmp(fmt, "json")) {
        long limit = http_query_long(rc->c, "limit", 1000, 1, 10000, &bad);
        if (bad) {
            rep_error(d, r, 400, "bad_request", "limit must be in [1, 10000]", "limit");
            return http_reply(rc);
        }
        db_event *evs;
        int n;
        if (db_events(d->db, rc->id, after, (int)limit, &evs, &n, &e)) {
            rep_store(d, r, e.msg);
            return http_reply(rc);
        }
        json_t *o = view_events(evs, n);
        db_events_free(evs, n);
        rep_view(rc, 200, o);
        return http_reply(rc);
    }
    int full = 0;
    struct MHD_Response *resp = sse_open(d->hub, d->db, rc->c, rc->id, after, terminal, &full);
    if (!resp) {
        if (full)
            rep_error(d, r, 503, "too_many_streams", "the server has max_sse_streams event streams open; retry later",
                      NULL);
        else
            rep_error(d, r, 503, "busy", "cannot open stream", NULL);
        return http_reply(rc);
    }
    guard_phase(d->guard, rc->c, CONN_SSE);
    r->status = 200;
    r->resp = resp;
    return http_reply(rc);
}

enum MHD_Result r_job_result(req_ctx *rc, json_t *body) {
    (void)body;
    ac_daemon *d = rc->d;
    reply *r = &rc->rep;
    ac_err e = {{0}};
    int ended = job_ended(rc);
    if (ended <= 0) {
        if (ended == 0) rep_error(d, r, 409, "not_finished", "job has not finished", NULL);
        return http_reply(rc);
    }
    char *res = NULL;
    if (db_job_result(d->db, rc->id, &res, &e))
        rep_store(d, r, e.msg);
    else if (!res)
        rep_error(d, r, 409, "no_result", "job did not succeed; see its reason and events", NULL);
    else
        rep_text(r, 200, "application/json", res, strlen(res));
    return http_reply(rc);
}

enum MHD_Result r_job_log(req_ctx *rc, json_t *body) {
    (void)body;
    return job_ended(rc) < 0 ? http_reply(rc) : http_offload(rc, task_log);
}
