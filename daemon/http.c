/*
 * http.c - the REST API, SSE streams, metrics and the dashboard's static
 * files, on libmicrohttpd (epoll, suspend/resume) run from the daemon's
 * libuv loop: no thread of its own (see "the loop" below).
 *
 * Handlers run on the loop and never touch the file system outside SQLite:
 * routes that do (POST /v1/jobs checks the paths a spec names, /v1/estimate
 * reads config.json, job logs, static files) suspend their connection and
 * run on libuv's thread pool (uv_queue_work, http_threads threads); the
 * loop resumes the connection with the reply ready. Every path a request names goes through src/core/fsafe.c (confined
 * under model_roots, regular files, size caps), the same rules the worker
 * applies again.
 *
 * Routes are one table (`routes`): method, path pattern ({id}, {rest}),
 * handler and the rules checked before it (cross-site check, token, token in
 * the query, JSON content type and body). The JSON of jobs, events and cost
 * tables comes from views.c, built from the store's typed rows.
 *
 * Every handler fills a `reply`; errors are JSON {"error":{"code","message",
 * "field"}} with the right status: 400 naming the field (or the cap a job
 * exceeds), 401/403 (token, cross-site), 409, 413 (max_body_bytes), 415
 * (POST/DELETE without a JSON content type), 503 (the job store cannot write, or
 * too many streams/pending requests).
 *
 * Browsers: a request whose Origin is not this server's own, or whose Host
 * is not a loopback name (or one of allowed_hosts) while the server listens
 * on loopback (DNS rebinding), is refused with 403; POST and DELETE need
 * Content-Type: application/json, which a cross-site form cannot send
 * without a CORS preflight this server never grants. With tokens
 * configured, /v1 routes need "Authorization: Bearer T"; ?access_token=T is
 * accepted on the SSE route only (EventSource cannot set headers).
 *
 * Connections: max_connections API connections plus max_sse_streams event
 * streams (counted apart, so streams never lock out /healthz), at most
 * max_connections_per_client per client address, request heads and bodies
 * within header_timeout_s / body_timeout_s (conn.c).
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "api.h"
#include "conn.h"
#include "costcache.h"
#include "costmodel.h"
#include "daemon.h"
#include "deci.h"
#include "fsafe.h"
#include "gguf.h"
#include "job.h"
#include "views.h"

typedef struct {
    unsigned status;
    json_t *json; /* JSON body (owned), or */
    char *text;   /* text body (owned) */
    size_t len;
    const char *ctype;
    struct MHD_Response *resp; /* a prepared response (SSE) */
    const char *hdr_name, *hdr_value;
} reply;

typedef struct req_ctx {
    ac_daemon *d;
    struct MHD_Connection *c;
    char *body;
    size_t len, cap;
    int too_big;
    int state; /* 0 new, 1 offloaded, 2 reply ready */
    uv_work_t work;                    /* offloaded: fn on libuv's thread pool, */
    void (*fn)(struct req_ctx *rc);
    void (*after)(struct req_ctx *rc); /* then after on the loop */
    reply rep;
    /* inputs of offloaded work, copied off the connection */
    json_t *in;
    ac_job_spec *js; /* POST /v1/jobs: the parsed spec (33 KB, heap) */
    char *idem_key;
    char url[512];
    const char *path; /* the request's path (valid during the MHD callback) */
    const char *rest; /* a route's {rest} */
    long id;          /* a route's {id} */
} req_ctx;

/* ------------------------------------------------------------- replies */

static void rep_json(reply *r, unsigned status, json_t *j) {
    r->status = status;
    json_decref(r->json);
    r->json = j;
}

static void rep_error(ac_daemon *d, reply *r, unsigned status, const char *code, const char *msg, const char *field) {
    atomic_fetch_add(&d->http_errors, 1);
    json_t *err = json_pack("{s:s,s:s}", "code", code, "message", msg && *msg ? msg : code);
    if (err) json_object_set_new(err, "field", field && *field ? json_string(field) : json_null());
    rep_json(r, status, err ? json_pack("{s:o}", "error", err) : NULL);
}

static void rep_text(reply *r, unsigned status, const char *type, char *text, size_t len) {
    r->status = status;
    free(r->text);
    r->text = text;
    r->len = len;
    r->ctype = type;
}

/* A failed read or write of the job store: 503 with the reason. */
static void rep_store(ac_daemon *d, reply *r, const char *msg) {
    char m[600];
    snprintf(m, sizeof m, "the job store is unavailable: %s", msg);
    rep_error(d, r, 503, "storage_unavailable", m, NULL);
}

static enum MHD_Result queue_reply(struct MHD_Connection *c, reply *r) {
    struct MHD_Response *resp = r->resp;
    r->resp = NULL;
    if (!resp && r->json) {
        char *s = json_dumps(r->json, JSON_COMPACT | JSON_ENCODE_ANY);
        json_decref(r->json);
        r->json = NULL;
        if (!s) return MHD_NO;
        resp = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
        if (!resp) {
            free(s);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "application/json");
    } else if (!resp) {
        if (!r->text) return MHD_NO; /* out of memory while building the reply */
        resp = MHD_create_response_from_buffer(r->len, r->text, MHD_RESPMEM_MUST_FREE);
        if (!resp) return MHD_NO;
        r->text = NULL;
        MHD_add_response_header(resp, "Content-Type", r->ctype);
    }
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    if (r->hdr_name) MHD_add_response_header(resp, r->hdr_name, r->hdr_value);
    enum MHD_Result ret = MHD_queue_response(c, r->status, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* ------------------------------------------------------------- checks */

static int authorized(ac_daemon *d, struct MHD_Connection *c, int query_token_ok) {
    if (d->cfg.ntokens == 0) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *tok = NULL;
    if (h && !strncmp(h, "Bearer ", 7)) tok = h + 7;
    if (!tok && query_token_ok) tok = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "access_token");
    if (!tok) return 0;
    size_t tl = strlen(tok);
    int ok = 0;
    for (int i = 0; i < d->cfg.ntokens; i++) {
        const char *t = d->cfg.tokens[i];
        size_t n = strlen(t);
        unsigned char diff = (unsigned char)(n != tl);
        for (size_t k = 0; k < n; k++)
            diff |= (unsigned char)(t[k] ^ (k < tl ? tok[k] : 0)); /* constant time in token length */
        ok |= diff == 0;
    }
    return ok;
}

/* The host name of a Host header value, without the port. */
static void host_name(const char *host, char *out, size_t n) {
    if (host[0] == '[') {
        const char *end = strchr(host, ']');
        size_t l = end ? (size_t)(end - host + 1) : strlen(host);
        snprintf(out, n, "%.*s", (int)(l < n ? l : n - 1), host);
        return;
    }
    const char *colon = strrchr(host, ':');
    size_t l = colon ? (size_t)(colon - host) : strlen(host);
    snprintf(out, n, "%.*s", (int)(l < n ? l : n - 1), host);
    for (char *p = out; *p; p++) *p = (char)tolower((unsigned char)*p);
}

/* Cross-site requests from browsers: NULL when fine, else the reason. */
static const char *browser_check(ac_daemon *d, struct MHD_Connection *c) {
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    const char *site = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Sec-Fetch-Site");
    int loop_listen = config_is_loopback(d->cfg.listen_host);
    if (host && (loop_listen || d->cfg.nallowed_hosts)) {
        char hn[300];
        host_name(host, hn, sizeof hn);
        int ok = config_is_loopback(hn);
        for (int i = 0; i < d->cfg.nallowed_hosts && !ok; i++) ok = !strcasecmp(hn, d->cfg.allowed_hosts[i]);
        if (!ok) return "Host is not a name of this server (add it to allowed_hosts)";
    }
    if (site && !strcmp(site, "cross-site")) return "cross-site request";
    if (origin) {
        if (!host) return "Origin without Host";
        const char *rest = !strncmp(origin, "http://", 7)    ? origin + 7
                           : !strncmp(origin, "https://", 8) ? origin + 8
                                                             : NULL;
        if (!rest || strcasecmp(rest, host)) return "cross-origin request (Origin is not this server)";
    }
    return NULL;
}

static int json_content_type(struct MHD_Connection *c) {
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    if (!ct || strncasecmp(ct, "application/json", 16)) return 0;
    return ct[16] == 0 || ct[16] == ';' || ct[16] == ' ';
}

/* Parse a decimal id path segment; -1 when not a positive integer. */
static long parse_id(const char *s, const char **rest) {
    char *end;
    if (*s < '0' || *s > '9') return -1;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || v <= 0 || (*end && *end != '/')) return -1;
    *rest = end;
    return v;
}

static long query_long(struct MHD_Connection *c, const char *k, long def, long lo, long hi, int *bad) {
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, k);
    if (!v) return def;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        *bad = 1;
        return def;
    }
    return x;
}

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

/* ------------------------------------------------------------- offloaded work */

/* Offloaded work: fn runs on libuv's thread pool with the connection
 * suspended, touching only rc and the store (db.c locks); the loop then
 * runs rc->after, resumes the connection and queues the reply. At most
 * MAX_OFFLOADED wait: past that, an immediate 503. */
#define MAX_OFFLOADED 256
static int offloaded, http_stopping;
static void http_kick(ac_daemon *d);
static void http_close(ac_daemon *d);

static void work_run(uv_work_t *w) {
    req_ctx *rc = w->data;
    rc->fn(rc);
}

static void work_done(uv_work_t *w, int status) {
    (void)status;
    req_ctx *rc = w->data;
    ac_daemon *d = rc->d;
    offloaded--;
    if (rc->after) rc->after(rc);
    rc->state = 2;
    MHD_resume_connection(rc->c); /* rc may be freed from here on */
    if (http_stopping && offloaded == 0)
        http_close(d); /* the stop waited for this work (libmicrohttpd refuses to stop with a connection suspended) */
    else
        http_kick(d);
}

static enum MHD_Result offload(req_ctx *rc, void (*fn)(req_ctx *rc)) {
    rc->state = 1;
    rc->fn = fn;
    rc->work.data = rc;
    if (offloaded >= MAX_OFFLOADED || http_stopping || uv_queue_work(rc->d->loop, &rc->work, work_run, work_done)) {
        rc->state = 2;
        rep_error(rc->d, &rc->rep, 503, "busy", "too many requests waiting for file access; retry", NULL);
        return queue_reply(rc->c, &rc->rep);
    }
    offloaded++;
    MHD_suspend_connection(rc->c);
    return MHD_YES;
}

static void rep_job(req_ctx *rc, unsigned status);

/* POST /v1/jobs, a new job stored: its first event, and the scheduler told. Loop thread. */
static void post_job_queued(req_ctx *rc) {
    atomic_fetch_add(&rc->d->jobs_submitted, 1);
    daemon_event(rc->d, rc->id, "state", json_pack("{s:s}", "state", "queued"));
    sched_notify(rc->d);
}

/* POST /v1/jobs, after validation: paths, device, insert. Thread pool. */
static void task_post_job(req_ctx *rc) {
    ac_daemon *d = rc->d;
    reply *r = &rc->rep;
    json_t *spec = rc->in;
    ac_err e = {{0}};
    const char *field = NULL;
    char jobs_dir[1100];
    snprintf(jobs_dir, sizeof jobs_dir, "%s/jobs", d->data_dir_abs);
    const ac_job_spec *js = rc->js;
    if (ac_fsafe_check_job(js, jobs_dir, &field, &e)) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s: %s", field, e.msg);
        rep_error(d, r, 400, "invalid_path", msg, field);
        return;
    }
    /* Deci exports need a base model the 256-grid can represent (reads config.json, so here, off the poll thread). */
    if (ac_deci_validate_model(js->search.target == AC_EXPORT_DECI, js->method == AC_METHOD_MINITRON, js->model, &field,
                               &e)) {
        rep_error(d, r, 400, "invalid_spec", e.msg, field);
        return;
    }
    /* GGUF exports: an architecture and tokenizer llama.cpp can run (reads the model's files too). */
    if (ac_gguf_check_spec(&js->search, js->model, &field, &e)) {
        rep_error(d, r, 400, "invalid_spec", e.msg, field);
        return;
    }
    char *s = json_dumps(spec, JSON_COMPACT | JSON_PRESERVE_ORDER), *existing = NULL;
    long id = s ? db_job_insert(d->db, s, js->name[0] ? js->name : NULL, js->priority, rc->idem_key, &existing, &e)
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
    } else {
        rc->after = post_job_queued;
    }
    rc->id = id;
    rep_job(rc, status);
}

static void task_estimate(req_ctx *rc) {
    ac_err e = {{0}};
    json_t *out = NULL;
    const char *field = NULL;
    ac_cost_cache cache;
    costcache_db(&cache, rc->d->db); /* cached tables only: an estimate measures nothing */
    if (ac_estimate_json(rc->in, &cache, &out, &field, &e))
        rep_error(rc->d, &rc->rep, 400, "invalid_request", e.msg, field);
    else
        rep_json(&rc->rep, 200, out);
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

static void task_static(req_ctx *rc) {
    const char *url = rc->url;
    char p[2048];
    snprintf(p, sizeof p, "%s%s", rc->d->cfg.web_dir, url);
    size_t len;
    ac_err e;
    char *data = ac_read_file(p, 8u << 20, &len, &e);
    if (!data)
        rep_error(rc->d, &rc->rep, 404, "not_found", "no such file", NULL);
    else {
        const char *ext = strrchr(url, '.');
        const char *type = !ext                    ? "application/octet-stream"
                           : !strcmp(ext, ".html") ? "text/html; charset=utf-8"
                           : !strcmp(ext, ".js")   ? "text/javascript"
                           : !strcmp(ext, ".css")  ? "text/css"
                           : !strcmp(ext, ".svg")  ? "image/svg+xml"
                                                   : "application/octet-stream";
        rep_text(&rc->rep, 200, type, data, len);
    }
}

/* ------------------------------------------------------------- routes */

static enum MHD_Result done(req_ctx *rc) { return queue_reply(rc->c, &rc->rep); }

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

/* A view built for the reply (NULL: out of memory). */
static void rep_view(req_ctx *rc, unsigned status, json_t *o) {
    if (o)
        rep_json(&rc->rep, status, o);
    else
        rep_error(rc->d, &rc->rep, 503, "busy", "out of memory", NULL);
}

/* Reply with the job as it is now (status 200, 201, 202). */
static void rep_job(req_ctx *rc, unsigned status) {
    db_job j;
    if (load_job(rc, &j)) return;
    json_t *o = view_job(&j);
    db_job_clear(&j);
    rep_view(rc, status, o);
}

/* A device a spec names must be one this server has. */
static int check_device(ac_daemon *d, const ac_job_spec *js, reply *r) {
    if (js->target.dev.kind != AC_TARGET_CUDA) return 0;
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

static enum MHD_Result r_jobs_post(req_ctx *rc, json_t *spec) {
    ac_daemon *d = rc->d;
    reply *r = &rc->rep;
    ac_err e = {{0}};
    const char *field = NULL;
    ac_job_spec *js = rc->js = malloc(sizeof *rc->js);
    if (!js) {
        rep_error(d, r, 503, "busy", "out of memory", NULL);
        return done(rc);
    }
    if (ac_job_spec_parse(spec, js, &field, &e)) {
        rep_error(d, r, 400, "invalid_spec", e.msg, field);
        return done(rc);
    }
    if (check_limits(d, js, r) || check_device(d, js, r)) return done(rc);
    const char *key = MHD_lookup_connection_value(rc->c, MHD_HEADER_KIND, "Idempotency-Key");
    if (key) {
        size_t kl = strlen(key);
        int ok = kl >= 1 && kl <= 200;
        for (size_t i = 0; i < kl && ok; i++) ok = key[i] > 32 && key[i] < 127;
        if (!ok) {
            rep_error(d, r, 400, "bad_request", "Idempotency-Key must be 1 to 200 printable ASCII characters",
                      "Idempotency-Key");
            return done(rc);
        }
        if (!(rc->idem_key = strdup(key))) {
            rep_error(d, r, 503, "busy", "out of memory", NULL);
            return done(rc);
        }
    }
    rc->in = json_incref(spec);
    return offload(rc, task_post_job);
}

static enum MHD_Result r_jobs_list(req_ctx *rc, json_t *body) {
    (void)body;
    ac_daemon *d = rc->d;
    reply *r = &rc->rep;
    ac_err e = {{0}};
    int bad = 0;
    long limit = query_long(rc->c, "limit", 100, 1, 1000, &bad),
         after = query_long(rc->c, "after", 0, 0, LONG_MAX, &bad);
    const char *state = MHD_lookup_connection_value(rc->c, MHD_GET_ARGUMENT_KIND, "state");
    job_state st;
    if (bad) {
        rep_error(d, r, 400, "bad_request", "limit must be in [1,1000] and after a job id", "limit");
        return done(rc);
    }
    if (state && job_state_parse(state, &st)) {
        rep_error(d, r, 400, "bad_request", "state must be queued, running, succeeded, failed or cancelled", "state");
        return done(rc);
    }
    db_job *jobs;
    int n;
    if (db_job_list(d->db, state ? &st : NULL, after, (int)limit, &jobs, &n, &e)) {
        rep_store(d, r, e.msg);
        return done(rc);
    }
    json_t *o = view_job_page(jobs, n, (int)limit);
    db_jobs_free(jobs, n);
    rep_view(rc, 200, o);
    return done(rc);
}

static enum MHD_Result r_job_get(req_ctx *rc, json_t *body) {
    (void)body;
    rep_job(rc, 200);
    return done(rc);
}

static enum MHD_Result r_job_cancel(req_ctx *rc, json_t *body) {
    (void)body;
    ac_daemon *d = rc->d;
    reply *r = &rc->rep;
    ac_err e = {{0}};
    int ended = job_ended(rc);
    if (ended) {
        if (ended > 0) rep_error(d, r, 409, "conflict", "job already ended", NULL);
        return done(rc);
    }
    if (db_job_set_cancel(d->db, rc->id, &e)) {
        rep_store(d, r, e.msg);
        return done(rc);
    }
    int t = db_job_transition(d->db, rc->id, JOB_QUEUED, JOB_CANCELLED, "cancelled by user before it started", NULL,
                              NULL, &e);
    if (t < 0) {
        rep_store(d, r, e.msg);
        return done(rc);
    }
    if (t == 0) {
        daemon_event(d, rc->id, "state", json_pack("{s:s,s:s}", "state", "cancelled", "reason", "cancelled by user"));
        events_finish(d, rc->id);
    } else {
        sched_cancel(d, rc->id);
    }
    rep_job(rc, 202);
    return done(rc);
}

/* after / Last-Event-ID: the events already seen. -1 when malformed. */
static long events_after(struct MHD_Connection *c) {
    int bad = 0;
    const char *lei = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Last-Event-ID");
    long after = query_long(c, "after", 0, 0, LONG_MAX, &bad);
    if (lei) {
        char *end;
        errno = 0;
        after = strtol(lei, &end, 10);
        if (errno || end == lei || *end || after < 0) bad = 1;
    }
    return bad ? -1 : after;
}

static enum MHD_Result r_job_events(req_ctx *rc, json_t *body) {
    (void)body;
    ac_daemon *d = rc->d;
    reply *r = &rc->rep;
    ac_err e = {{0}};
    int terminal = job_ended(rc), bad = 0;
    if (terminal < 0) return done(rc);
    long after = events_after(rc->c);
    if (after < 0) {
        rep_error(d, r, 400, "bad_request", "after / Last-Event-ID must be a non-negative event id", "after");
        return done(rc);
    }
    const char *fmt = MHD_lookup_connection_value(rc->c, MHD_GET_ARGUMENT_KIND, "format");
    if (fmt && !strcmp(fmt, "json")) {
        long limit = query_long(rc->c, "limit", 1000, 1, 10000, &bad);
        if (bad) {
            rep_error(d, r, 400, "bad_request", "limit must be in [1, 10000]", "limit");
            return done(rc);
        }
        db_event *evs;
        int n;
        if (db_events(d->db, rc->id, after, (int)limit, &evs, &n, &e)) {
            rep_store(d, r, e.msg);
            return done(rc);
        }
        json_t *o = view_events(evs, n);
        db_events_free(evs, n);
        rep_view(rc, 200, o);
        return done(rc);
    }
    int full = 0;
    struct MHD_Response *resp = sse_open(d->hub, d->db, rc->c, rc->id, after, terminal, &full);
    if (!resp) {
        if (full)
            rep_error(d, r, 503, "too_many_streams", "the server has max_sse_streams event streams open; retry later",
                      NULL);
        else
            rep_error(d, r, 503, "busy", "cannot open stream", NULL);
        return done(rc);
    }
    guard_phase(d->guard, rc->c, CONN_SSE);
    r->status = 200;
    r->resp = resp;
    return done(rc);
}

static enum MHD_Result r_job_result(req_ctx *rc, json_t *body) {
    (void)body;
    ac_daemon *d = rc->d;
    reply *r = &rc->rep;
    ac_err e = {{0}};
    int ended = job_ended(rc);
    if (ended <= 0) {
        if (ended == 0) rep_error(d, r, 409, "not_finished", "job has not finished", NULL);
        return done(rc);
    }
    char *res = NULL;
    if (db_job_result(d->db, rc->id, &res, &e))
        rep_store(d, r, e.msg);
    else if (!res)
        rep_error(d, r, 409, "no_result", "job did not succeed; see its reason and events", NULL);
    else
        rep_text(r, 200, "application/json", res, strlen(res));
    return done(rc);
}

static enum MHD_Result r_job_log(req_ctx *rc, json_t *body) {
    (void)body;
    return job_ended(rc) < 0 ? done(rc) : offload(rc, task_log);
}

static enum MHD_Result r_estimate(req_ctx *rc, json_t *body) {
    rc->in = json_incref(body);
    return offload(rc, task_estimate);
}

static enum MHD_Result r_devices(req_ctx *rc, json_t *body) {
    (void)body;
    ac_daemon *d = rc->d;
    json_t *local = json_array(), *profiles = json_array();
    for (int i = 0; i < d->ndevices; i++) json_array_append_new(local, ac_local_device_json(&d->devices[i]));
    for (const ac_device_spec *s = ac_device_specs; s->name; s++)
        json_array_append_new(profiles, ac_device_spec_json(s));
    rep_view(rc, 200, json_pack("{s:o,s:o,s:o}", "local", local, "profiles", profiles, "scheduler", sched_status(d)));
    return done(rc);
}

static enum MHD_Result r_measurements(req_ctx *rc, json_t *body) {
    (void)body;
    rep_json(&rc->rep, 200, json_pack("{s:o}", "measurements", sched_measurements(rc->d)));
    return done(rc);
}

static enum MHD_Result r_measure_cancel(req_ctx *rc, json_t *body) {
    (void)body;
    ac_daemon *d = rc->d;
    int rcx = sched_measure_cancel(d, rc->id);
    if (rcx < 0)
        rep_error(d, &rc->rep, 404, "not_found", "no such measurement", NULL);
    else if (rcx > 0)
        rep_error(d, &rc->rep, 409, "conflict", "measurement already ended", NULL);
    else
        rep_json(&rc->rep, 202, json_pack("{s:I,s:s}", "id", (json_int_t)rc->id, "status", "cancelling"));
    return done(rc);
}

static enum MHD_Result r_cost_list(req_ctx *rc, json_t *body) {
    (void)body;
    ac_err e = {{0}};
    db_cost_row *rows;
    int n;
    if (db_cost_list(rc->d->db, &rows, &n, &e)) {
        rep_store(rc->d, &rc->rep, e.msg);
        return done(rc);
    }
    json_t *o = view_cost_tables(rows, n);
    free(rows);
    rep_view(rc, 200, o);
    return done(rc);
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

static enum MHD_Result r_cost_post(req_ctx *rc, json_t *body) {
    json_t *m = json_object_get(body, "measure"), *t = json_object_get(body, "table");
    if (m)
        cost_measure(rc, m);
    else if (t)
        cost_import(rc, t);
    else
        rep_error(rc->d, &rc->rep, 400, "invalid_request", "body needs \"table\" (import) or \"measure\"", NULL);
    return done(rc);
}

static enum MHD_Result r_cost_get(req_ctx *rc, json_t *body) {
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
    return done(rc);
}

/* Prometheus text: one gauge or counter a row. */
static enum MHD_Result r_metrics(req_ctx *rc, json_t *body) {
    (void)body;
    ac_daemon *d = rc->d;
    ac_err e = {{0}};
    long counts[JOB_NSTATES], wf = 0;
    if (db_job_counts(d->db, counts, &e)) {
        rep_store(d, &rc->rep, e.msg);
        return done(rc);
    }
    int deg = db_health(d->db, NULL, 0, &wf);
    const struct {
        const char *name, *type, *help;
        double v;
    } m[] = {
        {"http_requests_total", "counter", "HTTP requests served.", (double)atomic_load(&d->http_requests)},
        {"http_errors_total", "counter", "HTTP error responses.", (double)atomic_load(&d->http_errors)},
        {"jobs_submitted_total", "counter", "Jobs accepted.", (double)atomic_load(&d->jobs_submitted)},
        {"events_total", "counter", "Progress events stored.", (double)atomic_load(&d->events_stored)},
        {"sse_clients", "gauge", "Open event streams.", sse_count(d->hub)},
        {"sse_hangups_total", "counter", "Streams closed by their client.", (double)sse_hangups(d->hub)},
        {"http_cut_total", "counter", "Connections cut at the header or body deadline, or over max_connections.",
         (double)guard_cut(d->guard)},
        {"db_write_failures_total", "counter", "Failed writes of the job store.", (double)wf},
        {"db_degraded", "gauge", "1 while the last write of the job store failed.", deg},
        {"uptime_seconds", "gauge", "Seconds since start.", floor(ac_now() - d->started_at)},
    };
    size_t cap = 8192, n = 0;
    char *s = malloc(cap);
    if (!s) {
        rep_error(d, &rc->rep, 503, "busy", "out of memory", NULL);
        return done(rc);
    }
    n += (size_t)snprintf(s + n, cap - n, "# HELP autocompress_jobs Jobs by state.\n# TYPE autocompress_jobs gauge\n");
    for (int i = 0; i < JOB_NSTATES && n < cap; i++)
        n += (size_t)snprintf(s + n, cap - n, "autocompress_jobs{state=\"%s\"} %ld\n", job_state_name((job_state)i),
                              counts[i]);
    for (size_t i = 0; i < sizeof m / sizeof *m && n < cap; i++)
        n += (size_t)snprintf(s + n, cap - n,
                              "# HELP autocompress_%s %s\n# TYPE autocompress_%s %s\nautocompress_%s %.0f\n", m[i].name,
                              m[i].help, m[i].name, m[i].type, m[i].name, m[i].v);
    rep_text(&rc->rep, 200, "text/plain; version=0.0.4", s, n < cap ? n : cap - 1);
    return done(rc);
}

static enum MHD_Result r_healthz(req_ctx *rc, json_t *body) {
    (void)body;
    ac_daemon *d = rc->d;
    char msg[300];
    int deg = db_health(d->db, msg, sizeof msg, NULL) || sched_degraded(d, msg, sizeof msg);
    json_t *j =
        json_pack("{s:s,s:s,s:i,s:f,s:i}", "status", deg ? "degraded" : "ok", "version", AC_VERSION, "schema_version",
                  d->schema_version, "uptime_s", ac_now() - d->started_at, "sse_streams", sse_count(d->hub));
    if (j && deg) json_object_set_new(j, "reason", json_string(msg));
    rep_json(&rc->rep, deg ? 503 : 200, j);
    return done(rc);
}

static enum MHD_Result r_static(req_ctx *rc, json_t *body) {
    (void)body;
    const char *url = rc->path;
    if (!strcmp(url, "/")) url = "/index.html";
    int ok = strlen(url) < sizeof rc->url && !strstr(url, "..");
    for (const char *p = url; *p && ok; p++)
        ok = isalnum((unsigned char)*p) || *p == '/' || *p == '.' || *p == '-' || *p == '_';
    if (!ok) {
        rep_error(rc->d, &rc->rep, 404, "not_found", "no such file", NULL);
        return done(rc);
    }
    snprintf(rc->url, sizeof rc->url, "%s", url);
    return offload(rc, task_static);
}

/* ------------------------------------------------------------- route table */

enum {
    R_BROWSER = 1,     /* refuse cross-site requests (Origin / Host / Sec-Fetch-Site) */
    R_AUTH = 2,        /* a bearer token when tokens are configured */
    R_QUERY_TOKEN = 4, /* ... or ?access_token= (EventSource cannot set headers) */
    R_JSON = 8,        /* Content-Type: application/json (POST / PUT / DELETE) */
    R_API = R_BROWSER | R_AUTH,
};

typedef enum MHD_Result (*route_fn)(req_ctx *rc, json_t *body);

typedef struct {
    const char *method; /* "*": any */
    const char *path;   /* segments; {id} a positive integer, {rest} the remainder */
    route_fn fn;
    int rules;
} route;

static const route routes[] = {
    {"*", "/healthz", r_healthz, 0},
    {"*", "/metrics", r_metrics, R_BROWSER},
    {"GET", "/v1/jobs", r_jobs_list, R_API},
    {"POST", "/v1/jobs", r_jobs_post, R_API | R_JSON},
    {"GET", "/v1/jobs/{id}", r_job_get, R_API},
    {"DELETE", "/v1/jobs/{id}", r_job_cancel, R_API | R_JSON},
    {"GET", "/v1/jobs/{id}/events", r_job_events, R_API | R_QUERY_TOKEN},
    {"GET", "/v1/jobs/{id}/result", r_job_result, R_API},
    {"GET", "/v1/jobs/{id}/log", r_job_log, R_API},
    {"POST", "/v1/estimate", r_estimate, R_API | R_JSON},
    {"GET", "/v1/devices", r_devices, R_API},
    {"GET", "/v1/cost-tables", r_cost_list, R_API},
    {"POST", "/v1/cost-tables", r_cost_post, R_API | R_JSON},
    {"GET", "/v1/cost-tables/measurements", r_measurements, R_API},
    {"DELETE", "/v1/cost-tables/measurements/{id}", r_measure_cancel, R_API | R_JSON},
    {"GET", "/v1/cost-tables/{rest}", r_cost_get, R_API},
};

/* 1 when url matches pattern; fills rc->id / rc->rest. */
static int path_match(const char *pat, const char *url, req_ctx *rc) {
    while (*pat) {
        if (!strncmp(pat, "{id}", 4)) {
            long id = parse_id(url, &url);
            if (id < 0) return 0;
            rc->id = id;
            pat += 4;
        } else if (!strcmp(pat, "{rest}")) {
            if (!*url) return 0;
            rc->rest = url;
            return 1;
        } else if (*pat++ != *url++) {
            return 0;
        }
    }
    return *url == 0;
}

/* The route for (method, url); *path_known when some route has that path. */
static const route *find_route(req_ctx *rc, const char *url, const char *method, int *path_known) {
    *path_known = 0;
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++) {
        if (!path_match(routes[i].path, url, rc)) continue;
        *path_known = 1;
        if (!strcmp(routes[i].method, "*") || !strcmp(routes[i].method, method)) return &routes[i];
    }
    return NULL;
}

static const route static_get = {"GET", "/", r_static, R_BROWSER};

/* The rules before any handler: 0, or -1 with the error reply made. */
static int check_rules(req_ctx *rc, int rules, const char *method, json_t **body) {
    ac_daemon *d = rc->d;
    reply *r = &rc->rep;
    const char *why = rules & R_BROWSER ? browser_check(d, rc->c) : NULL;
    if (why) {
        rep_error(d, r, 403, "forbidden", why, NULL);
        return -1;
    }
    if ((rules & R_AUTH) && !authorized(d, rc->c, rules & R_QUERY_TOKEN)) {
        rep_error(d, r, 401, "unauthorized", "missing or invalid bearer token", NULL);
        r->hdr_name = "WWW-Authenticate";
        r->hdr_value = "Bearer realm=\"autocompress\"";
        return -1;
    }
    if (!(rules & R_JSON)) return 0;
    if (!json_content_type(rc->c)) {
        rep_error(d, r, 415, "unsupported_media_type", "POST, PUT and DELETE need Content-Type: application/json",
                  NULL);
        return -1;
    }
    if (strcmp(method, "POST") && strcmp(method, "PUT")) return 0; /* DELETE: no body */
    json_error_t je;
    *body = json_loadb(rc->body ? rc->body : "", rc->len, JSON_REJECT_DUPLICATES, &je);
    if (!*body) {
        char msg[300];
        snprintf(msg, sizeof msg, "malformed JSON: %s (line %d, column %d)", je.text, je.line, je.column);
        rep_error(d, r, 400, "malformed_json", msg, NULL);
        return -1;
    }
    if (!json_is_object(*body)) {
        rep_error(d, r, 400, "bad_request", "body must be a JSON object", NULL);
        return -1;
    }
    return 0;
}

static enum MHD_Result handle(req_ctx *rc, const char *url, const char *method) {
    ac_daemon *d = rc->d;
    atomic_fetch_add(&d->http_requests, 1);
    if (rc->too_big) {
        rep_error(d, &rc->rep, 413, "payload_too_large", "request body exceeds max_body_bytes", NULL);
        return done(rc);
    }
    int known, api = !strncmp(url, "/v1/", 4),
               writes = !strcmp(method, "POST") || !strcmp(method, "PUT") || !strcmp(method, "DELETE");
    const route *rt = find_route(rc, url, method, &known);
    if (!rt && !api && !known && (!strcmp(method, "GET") || !strcmp(method, "HEAD"))) rt = &static_get;
    /* An unknown route or method is answered after the same checks an API route gets. */
    int rules = rt ? rt->rules : api ? R_API | (writes ? R_JSON : 0) : R_BROWSER;
    json_t *body = NULL;
    enum MHD_Result ret;
    rc->path = url;
    if (check_rules(rc, rules, method, &body))
        ret = done(rc);
    else if (rt)
        ret = rt->fn(rc, body);
    else {
        if (known)
            rep_error(d, &rc->rep, 405, "method_not_allowed", "method not allowed on this path", NULL);
        else if (api)
            rep_error(d, &rc->rep, 404, "not_found", "no such route", NULL);
        else
            rep_error(d, &rc->rep, 405, "method_not_allowed", "static files are GET only", NULL);
        ret = done(rc);
    }
    json_decref(body);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *data, size_t *data_size, void **con_cls) {
    (void)version;
    ac_daemon *d = cls;
    req_ctx *rc = *con_cls;
    if (!rc) {
        atomic_store(&d->http_beat_ms, wd_now_ms()); /* the watchdog's proof that the HTTP side runs */
        rc = calloc(1, sizeof *rc);
        if (!rc) return MHD_NO;
        rc->d = d;
        rc->c = c;
        *con_cls = rc;
        guard_phase(d->guard, c, CONN_BODY);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            char *end;
            errno = 0;
            long long v = strtoll(cl, &end, 10);
            if (errno || *end || v < 0 || v > d->cfg.max_body_bytes) rc->too_big = 1;
        }
        return MHD_YES;
    }
    if (rc->state == 1) return MHD_YES; /* resumed spuriously; the reply is not ready */
    if (rc->state == 2) return queue_reply(c, &rc->rep);
    if (*data_size) {
        if (!rc->too_big && rc->len + *data_size <= (size_t)d->cfg.max_body_bytes) {
            if (rc->len + *data_size > rc->cap) {
                size_t nc = (rc->len + *data_size) * 2;
                char *nb = realloc(rc->body, nc);
                if (!nb) return MHD_NO;
                rc->body = nb;
                rc->cap = nc;
            }
            memcpy(rc->body + rc->len, data, *data_size);
            rc->len += *data_size;
        } else
            rc->too_big = 1;
        *data_size = 0;
        return MHD_YES;
    }
    guard_phase(d->guard, c, CONN_BUSY);
    return handle(rc, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)toe;
    ac_daemon *d = cls;
    req_ctx *rc = *con_cls;
    if (rc) {
        free(rc->body);
        json_decref(rc->in);
        json_decref(rc->rep.json);
        free(rc->rep.text);
        if (rc->rep.resp) MHD_destroy_response(rc->rep.resp);
        free(rc->idem_key);
        free(rc->js);
        free(rc);
    }
    *con_cls = NULL;
    guard_phase(d->guard, c, CONN_HEAD); /* keep-alive: the next request head has its own deadline */
}

/* ------------------------------------------------------------- the loop
 *
 * libmicrohttpd runs without a thread of its own: its epoll descriptor is a
 * uv_poll on the daemon's loop, and its timeout (idle connections) a
 * uv_timer re-armed from MHD_get_timeout after every MHD_run. A resumed
 * connection (SSE publish, offloaded work) wakes the epoll descriptor through
 * libmicrohttpd's inter-thread channel, so it is run on the next turn. */

static uv_poll_t mhd_poll;
static uv_timer_t mhd_timer;
static int mhd_frozen, mhd_kicked;

static void on_mhd_timer(uv_timer_t *t);

static void mhd_arm(ac_daemon *d) {
    MHD_UNSIGNED_LONG_LONG to;
    if (MHD_get_timeout(d->mhd, &to) == MHD_YES)
        uv_timer_start(&mhd_timer, on_mhd_timer, (uint64_t)to, 0);
    else
        uv_timer_stop(&mhd_timer);
}

static void mhd_turn(ac_daemon *d) {
    if (!d->mhd || mhd_frozen) return;
    mhd_kicked = 0;
    MHD_run(d->mhd);
    if (!d->mhd) return;
    if (mhd_kicked) /* a connection was resumed during the run */
        uv_timer_start(&mhd_timer, on_mhd_timer, 0, 0);
    else
        mhd_arm(d);
}

/* A connection was resumed (from the loop): run libmicrohttpd on the next turn. */
static void http_kick(ac_daemon *d) {
    if (!d->mhd || mhd_frozen) return;
    mhd_kicked = 1;
    uv_timer_start(&mhd_timer, on_mhd_timer, 0, 0);
}

static void on_sse_resume(void *arg) { http_kick(arg); }

static void set_threadpool_size(int n) {
    char v[16];
    snprintf(v, sizeof v, "%d", n);
    setenv("UV_THREADPOOL_SIZE", v, 0); /* read when the pool first starts; the environment wins */
}

static void on_mhd_poll(uv_poll_t *p, int status, int events) {
    (void)status;
    (void)events;
    mhd_turn(p->data);
}

static void on_mhd_timer(uv_timer_t *t) { mhd_turn(t->data); }

void http_freeze(ac_daemon *d, int frozen) {
    if (!d->mhd || frozen == mhd_frozen) return;
    mhd_frozen = frozen;
    if (frozen) {
        uv_poll_stop(&mhd_poll);
        uv_timer_stop(&mhd_timer);
    } else {
        uv_poll_start(&mhd_poll, UV_READABLE, on_mhd_poll);
        uv_timer_start(&mhd_timer, on_mhd_timer, 0, 0);
    }
}

int http_start(ac_daemon *d, ac_err *e) {
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)d->cfg.listen_port);
    if (inet_pton(AF_INET, !strcmp(d->cfg.listen_host, "localhost") ? "127.0.0.1" : d->cfg.listen_host, &sa.sin_addr) !=
        1)
        return ac_errf(e, "listen host %s is not an IPv4 address", d->cfg.listen_host);
    set_threadpool_size(d->cfg.http_threads);
    d->guard = guard_new(d->loop, d->cfg.header_timeout_s, d->cfg.body_timeout_s, d->cfg.max_connections);
    if (!d->guard) return ac_errf(e, "cannot start the connection guard");
    /* The guard keeps max_connections (evicting slow heads) and the hub
     * max_sse_streams; the slack lets a newcomer in so the guard can evict. */
    unsigned limit = (unsigned)d->cfg.max_connections + (unsigned)d->cfg.max_sse_streams + 64;
    d->mhd = MHD_start_daemon(
        MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG, (uint16_t)d->cfg.listen_port, NULL, NULL,
        on_request, d, MHD_OPTION_SOCK_ADDR, &sa, MHD_OPTION_NOTIFY_COMPLETED, on_completed, d,
        MHD_OPTION_NOTIFY_CONNECTION, guard_notify, d->guard, MHD_OPTION_CONNECTION_LIMIT, limit,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)d->cfg.max_connections_per_client, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)d->cfg.idle_timeout_s, MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1, MHD_OPTION_END);
    if (!d->mhd)
        return ac_errf(e, "cannot listen on %s:%d (%s)", d->cfg.listen_host, d->cfg.listen_port, strerror(errno));
    if (d->cfg.listen_port == 0) {
        const union MHD_DaemonInfo *info = MHD_get_daemon_info(d->mhd, MHD_DAEMON_INFO_BIND_PORT);
        if (info) d->cfg.listen_port = info->port;
    }
    const union MHD_DaemonInfo *ep = MHD_get_daemon_info(d->mhd, MHD_DAEMON_INFO_EPOLL_FD);
    if (!ep || uv_poll_init(d->loop, &mhd_poll, ep->epoll_fd) || uv_timer_init(d->loop, &mhd_timer))
        return ac_errf(e, "cannot watch the HTTP server from the event loop");
    mhd_poll.data = mhd_timer.data = d;
    sse_hub_on_resume(d->hub, on_sse_resume, d);
    uv_poll_start(&mhd_poll, UV_READABLE, on_mhd_poll);
    uv_timer_start(&mhd_timer, on_mhd_timer, 0, 0);
    return 0;
}

/* libmicrohttpd off the loop and stopped. */
static void http_close(ac_daemon *d) {
    if (!d->mhd) return;
    /* off the loop before libmicrohttpd closes its epoll descriptor */
    uv_close((uv_handle_t *)&mhd_poll, NULL);
    uv_close((uv_handle_t *)&mhd_timer, NULL);
    MHD_stop_daemon(d->mhd);
    d->mhd = NULL;
    guard_free(d->guard);
    d->guard = NULL;
}

void http_stop(ac_daemon *d) {
    if (!d->mhd || http_stopping) return;
    http_stopping = 1; /* no new offloaded work */
    sse_shutdown(d->hub);
    if (offloaded == 0) http_close(d); /* else the last work_done closes */
}
