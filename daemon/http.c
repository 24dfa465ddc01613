/*
 * http.c - the REST API, SSE streams, metrics and the dashboard's static
 * files, on libmicrohttpd (internal polling thread, epoll where available,
 * suspend/resume for SSE).
 *
 * Every error is JSON: {"error":{"code","message","field"}} with the right
 * status. Bodies are capped (413), JSON is parsed strictly (duplicate keys
 * rejected) and job specs validated field by field (400 naming the field).
 * With tokens configured, every /v1 route needs "Authorization: Bearer T"
 * (or ?access_token=T, for EventSource which cannot set headers).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api.h"
#include "costcache.h"
#include "costmodel.h"
#include "daemon.h"
#include "deci.h"
#include "gguf.h"
#include "job.h"

typedef struct {
    char *body;
    size_t len, cap;
    int too_big;
} req_ctx;

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(j);
    if (!s) return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_error(ac_daemon *d, struct MHD_Connection *c, unsigned status, const char *code, const char *msg,
                                  const char *field) {
    atomic_fetch_add(&d->http_errors, 1);
    json_t *err = json_pack("{s:s,s:s}", "code", code, "message", msg);
    json_object_set_new(err, "field", field && *field ? json_string(field) : json_null());
    return send_json(c, status, json_pack("{s:o}", "error", err));
}

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *type, char *text, size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static int authorized(ac_daemon *d, struct MHD_Connection *c) {
    if (d->cfg.ntokens == 0) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *tok = NULL;
    if (h && !strncmp(h, "Bearer ", 7)) tok = h + 7;
    if (!tok) tok = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "access_token");
    if (!tok) return 0;
    size_t tl = strlen(tok);
    int ok = 0;
    for (int i = 0; i < d->cfg.ntokens; i++) {
        const char *t = d->cfg.tokens[i];
        size_t n = strlen(t);
        unsigned char diff = (unsigned char)(n != tl);
        for (size_t k = 0; k < n; k++) diff |= (unsigned char)(t[k] ^ (k < tl ? tok[k] : 0)); /* constant time in token length */
        ok |= diff == 0;
    }
    return ok;
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
    long x = strtol(v, &end, 10);
    if (*end || x < lo || x > hi) { *bad = 1; return def; }
    return x;
}

/* Paths a job names must be absolute, free of "..", exist (model, texts),
 * and lie under one of model_roots when those are configured. */
static int check_path(ac_daemon *d, const char *p, int must_exist_dir, int must_exist_file, char *why, size_t whyn) {
    if (p[0] != '/') { snprintf(why, whyn, "must be an absolute path"); return -1; }
    for (const char *s = p; (s = strstr(s, "..")); s += 2)
        if ((s == p || s[-1] == '/') && (s[2] == 0 || s[2] == '/')) { snprintf(why, whyn, "must not contain '..'"); return -1; }
    char real[PATH_MAX];
    if (must_exist_dir || must_exist_file) {
        struct stat sb;
        if (!realpath(p, real) || stat(real, &sb) != 0) { snprintf(why, whyn, "%.200s does not exist", p); return -1; }
        if (must_exist_dir && !S_ISDIR(sb.st_mode)) { snprintf(why, whyn, "%.200s is not a directory", p); return -1; }
        if (must_exist_file && !S_ISREG(sb.st_mode)) { snprintf(why, whyn, "%.200s is not a regular file", p); return -1; }
    } else {
        snprintf(real, sizeof real, "%s", p);
    }
    if (d->cfg.nroots == 0) return 0;
    for (int i = 0; i < d->cfg.nroots; i++) {
        char root[PATH_MAX];
        if (!realpath(d->cfg.model_roots[i], root)) continue;
        size_t rl = strlen(root);
        if (!strncmp(real, root, rl) && (real[rl] == '/' || real[rl] == 0 || (rl == 1 && root[0] == '/'))) return 0;
    }
    snprintf(why, whyn, "%.200s is outside the allowed model_roots", p);
    return -1;
}

static enum MHD_Result post_job(ac_daemon *d, struct MHD_Connection *c, json_t *spec) {
    ac_err e = {{0}};
    const char *field = NULL, *path;
    static _Thread_local ac_job_spec js; /* 33 KB: off the connection thread's stack */
    if (ac_job_spec_parse(spec, &js, &field, &e)) return send_error(d, c, 400, "invalid_spec", e.msg, field);
    int pflags;
    for (int i = 0; ac_job_spec_path(&js, i, &field, &path, &pflags); i++) {
        char why[300];
        if (*path && check_path(d, path, !!(pflags & AC_F_PATH_DIR), !!(pflags & AC_F_PATH_FILE), why, sizeof why)) {
            char msg[400];
            snprintf(msg, sizeof msg, "%s: %s", field, why);
            return send_error(d, c, 400, "invalid_path", msg, field);
        }
    }
    char cfgp[PATH_MAX + 16];
    snprintf(cfgp, sizeof cfgp, "%.*s/config.json", PATH_MAX, js.model);
    if (access(cfgp, R_OK) != 0) return send_error(d, c, 400, "invalid_path", "model: directory has no readable config.json", "model");
    if (ac_deci_validate_model(js.search.target == AC_EXPORT_DECI, js.method == AC_METHOD_MINITRON, js.model, &field,
                               &e))
        return send_error(d, c, 400, "invalid_spec", e.msg, field);
    if (ac_gguf_check_spec(&js.search, js.model, &field, &e))
        return send_error(d, c, 400, "invalid_spec", e.msg, field);
    if (js.target.dev.kind == AC_TARGET_CUDA) {
        int gpus = 0;
        for (int i = 0; i < d->ndevices; i++) gpus += d->devices[i].index >= 0;
        if (!gpus || !d->cfg.use_gpus) return send_error(d, c, 400, "no_device", "target.device asks for a local CUDA GPU but this server has none; name a spec profile (e.g. H100) to target a GPU that is not here", "target.device");
        if (js.target.dev.ordinal >= gpus)
            return send_error(d, c, 400, "no_device",
                              "target.device names a CUDA device this server does not have (see GET /v1/devices)",
                              "target.device");
    }
    char *s = json_dumps(spec, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_t *pr = json_object_get(spec, "priority");
    long id = db_job_insert(d->db, s, json_string_value(json_object_get(spec, "name")), pr ? (int)json_integer_value(pr) : 0, &e);
    free(s);
    if (id < 0) return send_error(d, c, 500, "internal", e.msg, NULL);
    atomic_fetch_add(&d->jobs_submitted, 1);
    daemon_event(d, id, "state", json_pack("{s:s}", "state", "queued"));
    sched_notify(d);
    json_t *job;
    if (db_job_get(d->db, id, &job, &e) || !job) return send_error(d, c, 500, "internal", e.msg, NULL);
    return send_json(c, 201, job);
}

static enum MHD_Result job_route(ac_daemon *d, struct MHD_Connection *c, const char *method, long id, const char *rest) {
    ac_err e = {{0}};
    json_t *job;
    if (db_job_get(d->db, id, &job, &e)) return send_error(d, c, 500, "internal", e.msg, NULL);
    if (!job) return send_error(d, c, 404, "not_found", "no such job", NULL);
    const char *state = json_string_value(json_object_get(job, "state"));
    int terminal = !strcmp(state, "succeeded") || !strcmp(state, "failed") || !strcmp(state, "cancelled");
    if (!*rest) {
        if (!strcmp(method, "GET")) return send_json(c, 200, job);
        if (!strcmp(method, "DELETE")) {
            json_decref(job);
            if (terminal) return send_error(d, c, 409, "conflict", "job already ended", NULL);
            db_job_set(d->db, id, "cancel_requested", NULL, 1, &e);
            if (db_job_transition(d->db, id, "queued", "cancelled", "cancelled by user before it started", NULL, NULL, &e) == 0) {
                daemon_event(d, id, "state", json_pack("{s:s,s:s}", "state", "cancelled", "reason", "cancelled by user"));
                sse_finish(d->hub, id);
            } else {
                sched_cancel(d, id);
            }
            db_job_get(d->db, id, &job, &e);
            return send_json(c, 202, job);
        }
        json_decref(job);
        return send_error(d, c, 405, "method_not_allowed", "use GET or DELETE", NULL);
    }
    if (strcmp(method, "GET")) {
        json_decref(job);
        return send_error(d, c, 405, "method_not_allowed", "use GET", NULL);
    }
    if (!strcmp(rest, "/events")) {
        json_decref(job);
        int bad = 0;
        const char *lei = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Last-Event-ID");
        long after = query_long(c, "after", 0, 0, LONG_MAX, &bad);
        if (lei) {
            char *end;
            after = strtol(lei, &end, 10);
            if (*end || after < 0) bad = 1;
        }
        if (bad) return send_error(d, c, 400, "bad_request", "after / Last-Event-ID must be a non-negative event id", "after");
        const char *fmt = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "format");
        if (fmt && !strcmp(fmt, "json")) {
            long limit = query_long(c, "limit", 1000, 1, 10000, &bad);
            if (bad) return send_error(d, c, 400, "bad_request", "limit must be in [1, 10000]", "limit");
            json_t *evs;
            if (db_events(d->db, id, after, (int)limit, &evs, &e)) return send_error(d, c, 500, "internal", e.msg, NULL);
            return send_json(c, 200, json_pack("{s:o}", "events", evs));
        }
        struct MHD_Response *r = sse_open(d->hub, d->db, c, id, after, terminal);
        if (!r) return send_error(d, c, 500, "internal", "cannot open stream", NULL);
        enum MHD_Result ret = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return ret;
    }
    if (!strcmp(rest, "/result")) {
        json_decref(job);
        if (!terminal) return send_error(d, c, 409, "not_finished", "job has not finished", NULL);
        char *res = NULL;
        if (db_job_result(d->db, id, &res, &e)) return send_error(d, c, 500, "internal", e.msg, NULL);
        if (!res) return send_error(d, c, 409, "no_result", "job did not succeed; see its reason and events", NULL);
        return send_text(c, 200, "application/json", res, strlen(res));
    }
    if (!strcmp(rest, "/log")) {
        json_decref(job);
        char p[2048];
        snprintf(p, sizeof p, "%s/jobs/%ld/worker.log", d->cfg.data_dir, id);
        size_t len = 0;
        char *txt = ac_read_file(p, 16u << 20, &len, &e);
        if (!txt) { txt = strdup(""); len = 0; }
        return send_text(c, 200, "text/plain; charset=utf-8", txt, len);
    }
    json_decref(job);
    return send_error(d, c, 404, "not_found", "no such route", NULL);
}

typedef struct { ac_daemon *d; json_t *req; } measure_arg;

static void *measure_thread(void *p) {
    measure_arg *a = p;
    ac_err e = {{0}};
    json_t *table = NULL;
    if (ac_cost_measure_json(a->req, &table, &e) == 0) {
        char *s = json_dumps(table, JSON_COMPACT);
        db_cost_put(a->d->db, json_string_value(json_object_get(table, "key")), json_string_value(json_object_get(table, "device")),
                    json_string_value(json_object_get(table, "dtype")), json_string_value(json_object_get(table, "engine")),
                    (int)json_integer_value(json_object_get(table, "version")), "measured", s, &e);
        free(s);
        json_decref(table);
    } else {
        fprintf(stderr, "autocompressd: cost-table measurement failed: %s\n", e.msg);
    }
    json_decref(a->req);
    free(a);
    return NULL;
}

static enum MHD_Result cost_route(ac_daemon *d, struct MHD_Connection *c, const char *method, const char *rest, json_t *body) {
    ac_err e = {{0}};
    if (!*rest && !strcmp(method, "GET")) {
        json_t *l;
        if (db_cost_list(d->db, &l, &e)) return send_error(d, c, 500, "internal", e.msg, NULL);
        return send_json(c, 200, json_pack("{s:o}", "tables", l));
    }
    if (!*rest && !strcmp(method, "POST")) {
        if (!body) return send_error(d, c, 400, "bad_request", "body must be a JSON object", NULL);
        json_t *m = json_object_get(body, "measure");
        if (m) {
            const char *field = NULL;
            if (ac_cost_measure_validate(m, &field, &e)) return send_error(d, c, 400, "invalid_request", e.msg, field);
            char key[512];
            ac_cost_measure_key(m, key, sizeof key);
            measure_arg *a = malloc(sizeof *a);
            a->d = d;
            a->req = json_deep_copy(m);
            pthread_t th;
            if (pthread_create(&th, NULL, measure_thread, a)) { json_decref(a->req); free(a); return send_error(d, c, 500, "internal", "cannot start measurement", NULL); }
            pthread_detach(th);
            return send_json(c, 202, json_pack("{s:s,s:s}", "key", key, "status", "measuring"));
        }
        json_t *t = json_object_get(body, "table");
        const char *field = NULL;
        if (!t) return send_error(d, c, 400, "invalid_request", "body needs \"table\" (import) or \"measure\"", NULL);
        if (ac_cost_table_validate(t, &field, &e)) return send_error(d, c, 400, "invalid_table", e.msg, field);
        char *s = json_dumps(t, JSON_COMPACT);
        int rc = db_cost_put(d->db, json_string_value(json_object_get(t, "key")), json_string_value(json_object_get(t, "device")),
                             json_string_value(json_object_get(t, "dtype")), json_string_value(json_object_get(t, "engine")),
                             (int)json_integer_value(json_object_get(t, "version")), "imported", s, &e);
        free(s);
        if (rc) return send_error(d, c, 500, "internal", e.msg, NULL);
        return send_json(c, 201, json_pack("{s:O,s:s}", "key", json_object_get(t, "key"), "status", "imported"));
    }
    if (*rest == '/' && !strcmp(method, "GET")) {
        char key[512];
        snprintf(key, sizeof key, "%s", rest + 1);
        MHD_http_unescape(key); /* a no-op when MHD already decoded the path */
        char *data;
        if (db_cost_get(d->db, key, &data, &e)) return send_error(d, c, 500, "internal", e.msg, NULL);
        if (!data) return send_error(d, c, 404, "not_found", "no cost table with that key", NULL);
        return send_text(c, 200, "application/json", data, strlen(data));
    }
    return send_error(d, c, 405, "method_not_allowed", "GET or POST /v1/cost-tables, GET /v1/cost-tables/{key}", NULL);
}

static enum MHD_Result metrics(ac_daemon *d, struct MHD_Connection *c) {
    json_t *counts;
    ac_err e;
    if (db_job_counts(d->db, &counts, &e)) return send_error(d, c, 500, "internal", e.msg, NULL);
    size_t cap = 4096, n = 0;
    char *s = malloc(cap);
    n += snprintf(s + n, cap - n, "# HELP autocompress_jobs Jobs by state.\n# TYPE autocompress_jobs gauge\n");
    const char *k;
    json_t *v;
    json_object_foreach(counts, k, v) n += snprintf(s + n, cap - n, "autocompress_jobs{state=\"%s\"} %lld\n", k, (long long)json_integer_value(v));
    json_decref(counts);
    n += snprintf(s + n, cap - n,
                  "# HELP autocompress_http_requests_total HTTP requests served.\n# TYPE autocompress_http_requests_total counter\n"
                  "autocompress_http_requests_total %ld\n"
                  "# HELP autocompress_http_errors_total HTTP error responses.\n# TYPE autocompress_http_errors_total counter\n"
                  "autocompress_http_errors_total %ld\n"
                  "# HELP autocompress_jobs_submitted_total Jobs accepted.\n# TYPE autocompress_jobs_submitted_total counter\n"
                  "autocompress_jobs_submitted_total %ld\n"
                  "# HELP autocompress_events_total Progress events stored.\n# TYPE autocompress_events_total counter\n"
                  "autocompress_events_total %ld\n"
                  "# HELP autocompress_sse_clients Open event streams.\n# TYPE autocompress_sse_clients gauge\n"
                  "autocompress_sse_clients %d\n"
                  "# HELP autocompress_uptime_seconds Seconds since start.\n# TYPE autocompress_uptime_seconds gauge\n"
                  "autocompress_uptime_seconds %.0f\n",
                  atomic_load(&d->http_requests), atomic_load(&d->http_errors), atomic_load(&d->jobs_submitted),
                  atomic_load(&d->events_stored), sse_count(d->hub), ac_now() - d->started_at);
    return send_text(c, 200, "text/plain; version=0.0.4", s, n);
}

static enum MHD_Result static_file(ac_daemon *d, struct MHD_Connection *c, const char *url) {
    if (!strcmp(url, "/")) url = "/index.html";
    for (const char *p = url; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '/' || *p == '.' || *p == '-' || *p == '_'))
            return send_error(d, c, 404, "not_found", "no such file", NULL);
    if (strstr(url, "..")) return send_error(d, c, 404, "not_found", "no such file", NULL);
    char p[2048];
    snprintf(p, sizeof p, "%s%s", d->cfg.web_dir, url);
    size_t len;
    ac_err e;
    char *data = ac_read_file(p, 8u << 20, &len, &e);
    if (!data) return send_error(d, c, 404, "not_found", "no such file", NULL);
    const char *ext = strrchr(url, '.');
    const char *type = !ext ? "application/octet-stream" : !strcmp(ext, ".html") ? "text/html; charset=utf-8"
                       : !strcmp(ext, ".js") ? "text/javascript" : !strcmp(ext, ".css") ? "text/css"
                       : !strcmp(ext, ".svg") ? "image/svg+xml" : "application/octet-stream";
    return send_text(c, 200, type, data, len);
}

static enum MHD_Result handle(ac_daemon *d, struct MHD_Connection *c, const char *url, const char *method, req_ctx *rc) {
    atomic_fetch_add(&d->http_requests, 1);
    if (rc->too_big) return send_error(d, c, 413, "payload_too_large", "request body exceeds max_body_bytes", NULL);
    if (!strcmp(url, "/healthz")) {
        int v = db_schema_version(d->db);
        return send_json(c, v > 0 ? 200 : 503, json_pack("{s:s,s:s,s:i,s:f}", "status", v > 0 ? "ok" : "db_unavailable", "version", AC_VERSION, "schema_version", v, "uptime_s", ac_now() - d->started_at));
    }
    if (!strcmp(url, "/metrics")) return metrics(d, c);
    if (strncmp(url, "/v1/", 4) != 0) {
        if (strcmp(method, "GET") && strcmp(method, "HEAD")) return send_error(d, c, 405, "method_not_allowed", "static files are GET only", NULL);
        return static_file(d, c, url);
    }
    if (!authorized(d, c)) {
        atomic_fetch_add(&d->http_errors, 1);
        json_t *j = json_pack("{s:{s:s,s:s,s:n}}", "error", "code", "unauthorized", "message", "missing or invalid bearer token", "field");
        char *s = json_dumps(j, JSON_COMPACT);
        json_decref(j);
        struct MHD_Response *r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
        MHD_add_response_header(r, "Content-Type", "application/json");
        MHD_add_response_header(r, "WWW-Authenticate", "Bearer realm=\"autocompress\"");
        enum MHD_Result ret = MHD_queue_response(c, 401, r);
        MHD_destroy_response(r);
        return ret;
    }
    json_t *body = NULL;
    if (!strcmp(method, "POST") || !strcmp(method, "PUT")) {
        json_error_t je;
        body = json_loadb(rc->body ? rc->body : "", rc->len, JSON_REJECT_DUPLICATES, &je);
        if (!body) {
            char msg[300];
            snprintf(msg, sizeof msg, "malformed JSON: %s (line %d, column %d)", je.text, je.line, je.column);
            return send_error(d, c, 400, "malformed_json", msg, NULL);
        }
        if (!json_is_object(body)) { json_decref(body); return send_error(d, c, 400, "bad_request", "body must be a JSON object", NULL); }
    }
    enum MHD_Result ret;
    const char *rest;
    ac_err e = {{0}};
    if (!strcmp(url, "/v1/jobs")) {
        if (!strcmp(method, "POST")) ret = post_job(d, c, body);
        else if (!strcmp(method, "GET")) {
            int bad = 0;
            long limit = query_long(c, "limit", 100, 1, 1000, &bad), after = query_long(c, "after", 0, 0, LONG_MAX, &bad);
            const char *state = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "state");
            if (bad) ret = send_error(d, c, 400, "bad_request", "limit must be in [1,1000] and after a job id", "limit");
            else if (state && strcmp(state, "queued") && strcmp(state, "running") && strcmp(state, "succeeded") && strcmp(state, "failed") && strcmp(state, "cancelled"))
                ret = send_error(d, c, 400, "bad_request", "state must be queued, running, succeeded, failed or cancelled", "state");
            else {
                json_t *jobs;
                if (db_job_list(d->db, state, after, (int)limit, &jobs, &e)) ret = send_error(d, c, 500, "internal", e.msg, NULL);
                else {
                    size_t n = json_array_size(jobs);
                    json_t *next = n == (size_t)limit ? json_copy(json_object_get(json_array_get(jobs, n - 1), "id")) : json_null();
                    ret = send_json(c, 200, json_pack("{s:o,s:o}", "jobs", jobs, "next_after", next));
                }
            }
        } else ret = send_error(d, c, 405, "method_not_allowed", "use GET or POST", NULL);
    } else if (!strncmp(url, "/v1/jobs/", 9)) {
        long id = parse_id(url + 9, &rest);
        ret = id < 0 ? send_error(d, c, 404, "not_found", "no such job", NULL) : job_route(d, c, method, id, rest);
    } else if (!strcmp(url, "/v1/devices")) {
        json_t *local = json_array(), *profiles = json_array();
        for (int i = 0; i < d->ndevices; i++) json_array_append_new(local, ac_local_device_json(&d->devices[i]));
        for (const ac_device_spec *s = ac_device_specs; s->name; s++) json_array_append_new(profiles, ac_device_spec_json(s));
        ret = send_json(c, 200, json_pack("{s:o,s:o,s:o}", "local", local, "profiles", profiles, "scheduler", sched_status(d)));
    } else if (!strncmp(url, "/v1/cost-tables", 15) && (url[15] == 0 || url[15] == '/')) {
        ret = cost_route(d, c, method, url + 15, body);
    } else if (!strcmp(url, "/v1/estimate")) {
        if (strcmp(method, "POST")) ret = send_error(d, c, 405, "method_not_allowed", "use POST", NULL);
        else {
            json_t *out = NULL;
            const char *field = NULL;
            ac_cost_cache cache;
            costcache_db(&cache, d->db);
            if (ac_estimate_json(body, &cache, &out, &field, &e))
                ret = send_error(d, c, 400, "invalid_request", e.msg, field);
            else ret = send_json(c, 200, out);
        }
    } else {
        ret = send_error(d, c, 404, "not_found", "no such route", NULL);
    }
    json_decref(body);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method, const char *version,
                                  const char *data, size_t *data_size, void **con_cls) {
    (void)version;
    ac_daemon *d = cls;
    req_ctx *rc = *con_cls;
    if (!rc) {
        rc = calloc(1, sizeof *rc);
        if (!rc) return MHD_NO;
        *con_cls = rc;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoll(cl, NULL, 10) > d->cfg.max_body_bytes) rc->too_big = 1;
        return MHD_YES;
    }
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
        } else rc->too_big = 1;
        *data_size = 0;
        return MHD_YES;
    }
    return handle(d, c, url, method, rc);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls; (void)c; (void)toe;
    req_ctx *rc = *con_cls;
    if (rc) { free(rc->body); free(rc); }
    *con_cls = NULL;
}

int http_start(ac_daemon *d, ac_err *e) {
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)d->cfg.listen_port);
    if (inet_pton(AF_INET, !strcmp(d->cfg.listen_host, "localhost") ? "127.0.0.1" : d->cfg.listen_host, &sa.sin_addr) != 1)
        return ac_errf(e, "listen host %s is not an IPv4 address", d->cfg.listen_host);
    d->mhd = MHD_start_daemon(MHD_USE_AUTO_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG, (uint16_t)d->cfg.listen_port,
                              NULL, NULL, on_request, d, MHD_OPTION_SOCK_ADDR, &sa, MHD_OPTION_NOTIFY_COMPLETED, on_completed, d,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)d->cfg.max_connections, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120,
                              MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1, MHD_OPTION_END);
    if (!d->mhd) return ac_errf(e, "cannot listen on %s:%d (%s)", d->cfg.listen_host, d->cfg.listen_port, strerror(errno));
    if (d->cfg.listen_port == 0) {
        const union MHD_DaemonInfo *info = MHD_get_daemon_info(d->mhd, MHD_DAEMON_INFO_BIND_PORT);
        if (info) d->cfg.listen_port = info->port;
    }
    return 0;
}

void http_stop(ac_daemon *d) {
    if (!d->mhd) return;
    sse_shutdown(d->hub);
    MHD_stop_daemon(d->mhd);
    d->mhd = NULL;
}
