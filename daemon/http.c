/*
 * http.c - the HTTP framework of the REST API, on libmicrohttpd (epoll,
 * suspend/resume) run from the daemon's libuv loop: no thread of its own
 * (see "the loop" below). The routes live in routes.c (the table and the
 * server's own routes), routes_jobs.c and routes_cost.c; http.h is what they
 * see of this file.
 *
 * Handlers run on the loop and never touch the file system outside SQLite:
 * routes that do (POST /v1/jobs checks the paths a spec names, /v1/estimate
 * reads config.json, job logs, static files) suspend their connection and
 * run on libuv's thread pool (uv_queue_work, http_threads threads); the
 * loop resumes the connection with the reply ready. Every path a request
 * names goes through src/core/fsafe.c (confined under model_roots, regular
 * files, size caps), the same rules the worker applies again.
 *
 * Routes are one table (`http_routes`, routes.c): method, path pattern
 * ({id}, a last {NAME}), handler and the rules this file checks before it
 * (cross-site check, token, token in the query, JSON content type and
 * body). The JSON of jobs, events and cost tables comes from views.c, built
 * from the store's typed rows.
 *
 * Every handler fills a `reply`; errors are JSON {"error":{"code","message",
 * "field"}} with the right status: 400 naming the field (or the cap a job
 * exceeds), 401/403 (token, cross-site), 409, 413 (max_body_bytes), 415
 * (POST without a JSON content type), 503 (the job store cannot write, or
 * too many streams/pending requests). HEAD is answered wherever GET is (the
 * GET route runs; libmicrohttpd sends its headers without the body; the
 * event stream answers its headers without opening a stream). DELETE takes
 * no body and needs no content type.
 *
 * Browsers: a request whose Origin is not this server's own, or whose Host
 * is not a loopback name (or one of allowed_hosts) while the server listens
 * on loopback (DNS rebinding), is refused with 403; POST needs
 * Content-Type: application/json, which a cross-site form cannot send
 * without a CORS preflight this server never grants (DELETE needs none: no
 * form can send it, and a cross-site script's DELETE needs that preflight
 * too). When tokens are needed (auth.h), /v1 routes need "Authorization:
 * Bearer T" (401 without a known, live one); ?access_token=T is accepted on
 * the SSE route only (EventSource cannot set headers). A route's rules name
 * the role it needs (403 for less) and whether its {id} is a job only its
 * owner and admins see (404 for others). Requests that change something,
 * and refusals for a role, go to the audit log with the caller and status.
 *
 * Connections: max_connections API connections plus max_sse_streams event
 * streams (counted apart, so streams never lock out /healthz), at most
 * max_connections_per_client per client address, request heads and bodies
 * within header_timeout_s / body_timeout_s, and the watchdog's probe outside
 * all of these (conn.c).
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "auth.h"
#include "conn.h"
#include "http.h"

/* ------------------------------------------------------------- replies */

void rep_json(reply *r, unsigned status, json_t *j) {
    r->status = status;
    json_decref(r->json);
    r->json = j;
}

void rep_error(ac_daemon *d, reply *r, unsigned status, const char *code, const char *msg, const char *field) {
    atomic_fetch_add(&d->http_errors, 1);
    json_t *err = json_pack("{s:s,s:s}", "code", code, "message", msg && *msg ? msg : code);
    if (err) json_object_set_new(err, "field", field && *field ? json_string(field) : json_null());
    rep_json(r, status, err ? json_pack("{s:o}", "error", err) : NULL);
}

void rep_text(reply *r, unsigned status, const char *type, char *text, size_t len) {
    r->status = status;
    free(r->text);
    r->text = text;
    r->len = len;
    r->ctype = type;
}

/* A failed read or write of the job store: 503 with the reason. */
void rep_store(ac_daemon *d, reply *r, const char *msg) {
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

enum MHD_Result http_reply(req_ctx *rc) { return queue_reply(rc->c, &rc->rep); }

/* A view built for the reply (NULL: out of memory). */
void rep_view(req_ctx *rc, unsigned status, json_t *o) {
    if (o)
        rep_json(&rc->rep, status, o);
    else
        rep_error(rc->d, &rc->rep, 503, "busy", "out of memory", NULL);
}

/* ------------------------------------------------------------- checks */

/* The request's bearer token (or ?access_token= where allowed), NULL when none. */
static const char *bearer(struct MHD_Connection *c, int query_token_ok) {
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (h && !strncmp(h, "Bearer ", 7)) return h + 7;
    return query_token_ok ? MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "access_token") : NULL;
}

/* Who the caller is and whether its role and the job's owner let it through:
 * 0, or -1 with the 401 / 403 / 404 / 503 reply made. */
static int check_caller(req_ctx *rc, int rules) {
    ac_daemon *d = rc->d;
    reply *r = &rc->rep;
    ac_err e = {{0}};
    int who = auth_identify(d, bearer(rc->c, rules & R_QUERY_TOKEN), &rc->who, &e);
    if (who < 0) {
        rep_store(d, r, e.msg);
        return -1;
    }
    if (who > 0) {
        rep_error(d, r, 401, "unauthorized", "missing, unknown or revoked bearer token", NULL);
        r->hdr_name = "WWW-Authenticate";
        r->hdr_value = "Bearer realm=\"autocompress\"";
        return -1;
    }
    rc->identified = 1; /* what it does is logged from here on (an unidentified flood fills no log) */
    auth_role need = rules & R_ADMIN ? ROLE_ADMIN : rules & R_SUBMIT ? ROLE_SUBMIT : ROLE_READ;
    if (rc->who.role < need) {
        char msg[200];
        snprintf(msg, sizeof msg, "user %s has role %s; this needs role %s", rc->who.user,
                 auth_role_name(rc->who.role), auth_role_name(need));
        rep_error(d, r, 403, "forbidden", msg, NULL);
        rc->audit = 1;
        return -1;
    }
    if (!(rules & R_OWNED) || rc->who.role == ROLE_ADMIN) return 0;
    char owner[64];
    int found;
    if (db_job_owner(d->db, rc->id, owner, sizeof owner, &found, &e)) {
        rep_store(d, r, e.msg);
        return -1;
    }
    if (!found || strcmp(owner, rc->who.user)) { /* another user's job is not there for this caller */
        rep_error(d, r, 404, "not_found", "no such job", NULL);
        return -1;
    }
    return 0;
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

long http_query_long(struct MHD_Connection *c, const char *k, long def, long lo, long hi, int *bad) {
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

/* ------------------------------------------------------------- offloaded work */

/* Offloaded work: fn runs on libuv's thread pool with the connection
 * suspended, touching only rc and the store (db.c locks); the loop then
 * runs rc->after, resumes the connection and queues the reply. At most
 * MAX_OFFLOADED wait: past that, an immediate 503. */
#define MAX_OFFLOADED 256

static int offloaded, http_stopping;

static void http_kick(ac_daemon *d);

static void http_close(ac_daemon *d);

/* Test hook (AUTOCOMPRESSD_TEST_HOOKS=1): AC_TEST_OFFLOAD_DELAY_MS holds
 * each offloaded task that long first, so a test can stop the daemon while
 * work is on the pool. Read once, at the first offload. */
static int offload_delay_ms(void) {
    static int ms = -1;
    if (ms < 0) {
        const char *hooks = getenv("AUTOCOMPRESSD_TEST_HOOKS"), *v = getenv("AC_TEST_OFFLOAD_DELAY_MS");
        ms = hooks && !strcmp(hooks, "1") && v ? atoi(v) : 0;
        if (ms < 0) ms = 0;
    }
    return ms;
}

static void work_run(uv_work_t *w) {
    req_ctx *rc = w->data;
    if (rc->delay_ms > 0) usleep((useconds_t)rc->delay_ms * 1000);
    rc->fn(rc);
}

/* Replies of offloaded work resumed but not yet sent (on_completed has not
 * run for them); the stop waits for them, then closes from mhd_turn. */
static int owed, close_due;

static void work_done(uv_work_t *w, int status) {
    (void)status;
    req_ctx *rc = w->data;
    ac_daemon *d = rc->d;
    offloaded--;
    if (rc->after) rc->after(rc);
    rc->state = 2;
    rc->owed = 1;
    owed++;
    MHD_resume_connection(rc->c); /* rc may be freed from here on */
    http_kick(d); /* a stop closes once this reply has gone (on_completed, mhd_turn) */
}

enum MHD_Result http_offload(req_ctx *rc, void (*fn)(req_ctx *rc)) {
    rc->state = 1;
    rc->fn = fn;
    rc->work.data = rc;
    rc->delay_ms = offload_delay_ms(); /* read on the loop: the pool's threads only see the copy */
    if (offloaded >= MAX_OFFLOADED || http_stopping || uv_queue_work(rc->d->loop, &rc->work, work_run, work_done)) {
        rc->state = 2;
        rep_error(rc->d, &rc->rep, 503, "busy", "too many requests waiting for file access; retry", NULL);
        return queue_reply(rc->c, &rc->rep);
    }
    offloaded++;
    MHD_suspend_connection(rc->c);
    return MHD_YES;
}

/* ------------------------------------------------------------- dispatch */

/* 1 when url matches pattern; fills rc->id / rc->rest. */
static int path_match(const char *pat, const char *url, req_ctx *rc) {
    while (*pat) {
        if (!strncmp(pat, "{id}", 4)) {
            long id = parse_id(url, &url);
            if (id < 0) return 0;
            rc->id = id;
            pat += 4;
        } else if (*pat == '{' && !strchr(pat, '/')) { /* a last {NAME}: the remainder */
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
    for (size_t i = 0; i < http_nroutes; i++) {
        if (!path_match(http_routes[i].path, url, rc)) continue;
        *path_known = 1;
        if (!strcmp(http_routes[i].method, "*") || !strcmp(http_routes[i].method, method)) return &http_routes[i];
    }
    return NULL;
}

/* The rules before any handler: 0, or -1 with the error reply made. */
static int check_rules(req_ctx *rc, int rules, json_t **body) {
    ac_daemon *d = rc->d;
    reply *r = &rc->rep;
    /* HTTP/1.1 requires Host (RFC 9112 3.2); an HTTP/1.0 request without
     * one is refused too, so the DNS-rebinding check always has a name */
    const char *host = MHD_lookup_connection_value(rc->c, MHD_HEADER_KIND, "Host");
    if (!host || !*host) {
        rep_error(d, r, 400, "bad_request", "the request has no Host header", "Host");
        return -1;
    }
    const char *why = rules & R_BROWSER ? browser_check(d, rc->c) : NULL;
    if (why) {
        rep_error(d, r, 403, "forbidden", why, NULL);
        return -1;
    }
    if ((rules & R_AUTH) && check_caller(rc, rules)) return -1;
    if (!(rules & R_JSON)) return 0;
    if (!json_content_type(rc->c)) {
        rep_error(d, r, 415, "unsupported_media_type", "POST and PUT need Content-Type: application/json", NULL);
        return -1;
    }
    json_error_t je;
    *body = json_loadb(rc->body.data ? rc->body.data : "", rc->body.len, JSON_REJECT_DUPLICATES, &je);
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
        return http_reply(rc);
    }
    int known, api = !strncmp(url, "/v1/", 4), writes = !strcmp(method, "POST") || !strcmp(method, "PUT");
    rc->head = !strcmp(method, "HEAD");
    const route *rt = find_route(rc, url, rc->head ? "GET" : method, &known); /* HEAD: the GET route */
    if (!rt && !api && !known && (!strcmp(method, "GET") || !strcmp(method, "HEAD"))) rt = &http_static_route;
    /* An unknown route or method is answered after the same checks an API route gets. */
    int rules = rt ? rt->rules : api ? R_API | (writes ? R_JSON : 0) : R_BROWSER;
    json_t *body = NULL;
    enum MHD_Result ret;
    rc->path = url;
    rc->audit = (rules & R_AUTH) && strcmp(method, "GET") && !rc->head; /* what changes something is logged */
    snprintf(rc->action, sizeof rc->action, "%s %.250s", method, url);
    if (check_rules(rc, rules, &body))
        ret = http_reply(rc);
    else if (rt)
        ret = rt->fn(rc, body);
    else {
        if (known)
            rep_error(d, &rc->rep, 405, "method_not_allowed", "method not allowed on this path", NULL);
        else if (api)
            rep_error(d, &rc->rep, 404, "not_found", "no such route", NULL);
        else
            rep_error(d, &rc->rep, 405, "method_not_allowed", "static files are GET only", NULL);
        ret = http_reply(rc);
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
        if (!rc->too_big && rc->body.len + *data_size <= (size_t)d->cfg.max_body_bytes) {
            if (ac_buf_append(&rc->body, data, *data_size, 0)) return MHD_NO;
        } else
            rc->too_big = 1;
        *data_size = 0;
        return MHD_YES;
    }
    guard_phase(d->guard, c, CONN_BUSY);
    if (http_stopping) { /* the stop only finishes what it took in before */
        rc->state = 2;
        rep_error(d, &rc->rep, 503, "shutting_down", "the server is shutting down; retry when it is back", NULL);
        return queue_reply(c, &rc->rep);
    }
    return handle(rc, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)toe;
    ac_daemon *d = cls;
    req_ctx *rc = *con_cls;
    if (rc && rc->audit && rc->identified) {
        char target[32]; /* the path's {id}, or the job a submission created */
        ac_err e = {{0}};
        snprintf(target, sizeof target, "%ld", rc->id);
        int anon = rc->who.anonymous || !rc->who.user[0];
        db_audit(d->db, anon ? NULL : rc->who.user, anon ? NULL : auth_role_name(rc->who.role), rc->action,
                 rc->id > 0 ? target : NULL, (int)rc->rep.status, &e);
    }
    if (rc && rc->owed && --owed == 0 && http_stopping && offloaded == 0)
        close_due = 1; /* the last reply the stop waited for is out (or its client gone) */
    if (rc) {
        ac_buf_free(&rc->body);
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

/* The stop's deadline: replies still owed to clients that do not read them
 * after STOP_GRACE_MS are dropped (work still on the pool is waited for:
 * libmicrohttpd refuses to stop with a connection suspended). */
#define STOP_GRACE_MS 10000
static uv_timer_t stop_timer;

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
    if (close_due) { /* a stop's last owed reply went out in this run */
        http_close(d);
        return;
    }
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
    d->guard = guard_new(d->loop, d->cfg.header_timeout_s, d->cfg.body_timeout_s, d->cfg.max_connections,
                         d->cfg.max_connections_per_client);
    if (!d->guard) return ac_errf(e, "cannot start the connection guard");
    /* The guard keeps max_connections (evicting slow heads) and the hub
     * max_sse_streams; the slack lets a newcomer in so the guard can evict. */
    unsigned limit = (unsigned)d->cfg.max_connections + (unsigned)d->cfg.max_sse_streams + 64;
    /* Optional TLS (libmicrohttpd's GnuTLS): the PEM texts stay in memory
     * for the server's life, as MHD_OPTION_HTTPS_MEM_* want. */
    static char *tls_cert_pem, *tls_key_pem;
    unsigned tls = 0;
    if (d->cfg.tls_cert[0]) {
        if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES)
            return ac_errf(e, "tls_cert is set but this libmicrohttpd has no TLS support");
        size_t n;
        free(tls_cert_pem);
        free(tls_key_pem);
        tls_key_pem = NULL;
        if (!(tls_cert_pem = ac_read_file(d->cfg.tls_cert, 1u << 20, &n, e))) return ac_errctx(e, "tls_cert");
        if (!(tls_key_pem = ac_read_file(d->cfg.tls_key, 1u << 20, &n, e))) return ac_errctx(e, "tls_key");
        tls = MHD_USE_TLS;
    }
    d->mhd = MHD_start_daemon(
        MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG | tls, (uint16_t)d->cfg.listen_port, NULL, NULL,
        on_request, d, MHD_OPTION_SOCK_ADDR, &sa, MHD_OPTION_NOTIFY_COMPLETED, on_completed, d,
        MHD_OPTION_NOTIFY_CONNECTION, guard_notify, d->guard, MHD_OPTION_CONNECTION_LIMIT, limit,
        MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)d->cfg.idle_timeout_s, MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1,
        tls ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, tls_cert_pem, MHD_OPTION_HTTPS_MEM_KEY, tls_key_pem,
        MHD_OPTION_END);
    if (!d->mhd)
        return ac_errf(e, "cannot listen on %s:%d (%s%s)", d->cfg.listen_host, d->cfg.listen_port, strerror(errno),
                       tls ? "; or tls_cert / tls_key are not a PEM certificate and its key" : "");
    if (d->cfg.listen_port == 0) {
        const union MHD_DaemonInfo *info = MHD_get_daemon_info(d->mhd, MHD_DAEMON_INFO_BIND_PORT);
        if (info) d->cfg.listen_port = info->port;
    }
    const union MHD_DaemonInfo *ep = MHD_get_daemon_info(d->mhd, MHD_DAEMON_INFO_EPOLL_FD);
    if (!ep || uv_poll_init(d->loop, &mhd_poll, ep->epoll_fd) || uv_timer_init(d->loop, &mhd_timer))
        return ac_errf(e, "cannot watch the HTTP server from the event loop");
    if (uv_timer_init(d->loop, &stop_timer)) return ac_errf(e, "cannot watch the HTTP server from the event loop");
    mhd_poll.data = mhd_timer.data = stop_timer.data = d;
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
    uv_close((uv_handle_t *)&stop_timer, NULL);
    MHD_stop_daemon(d->mhd);
    d->mhd = NULL;
    guard_free(d->guard);
    d->guard = NULL;
}

static void on_stop_deadline(uv_timer_t *t) {
    ac_daemon *d = t->data;
    if (offloaded == 0)
        http_close(d); /* replies nobody read */
    else
        uv_timer_start(&stop_timer, on_stop_deadline, 500, 0);
}

/* The stop: no new request is taken in (503 shutting_down); work on the
 * pool is waited for and its replies sent, then libmicrohttpd stops. */
void http_stop(ac_daemon *d) {
    if (!d->mhd || http_stopping) return;
    http_stopping = 1; /* no new offloaded work */
    sse_shutdown(d->hub);
    if (offloaded == 0 && owed == 0) {
        http_close(d);
        return;
    }
    uv_timer_start(&stop_timer, on_stop_deadline, STOP_GRACE_MS, 0);
    http_kick(d);
}
