/*
 * routes.c - the route table (method, path pattern with {id} / {rest},
 * handler, the rules http.c checks first), and the server's own routes:
 * /healthz, /metrics (Prometheus text), /v1/devices and the dashboard's
 * static files (read on the thread pool). See http.h.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn.h"
#include "autocompress.h"
#include "http.h"

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

enum MHD_Result r_devices(req_ctx *rc, json_t *body) {
    (void)body;
    ac_daemon *d = rc->d;
    json_t *local = json_array(), *profiles = json_array();
    for (int i = 0; i < d->ndevices; i++) json_array_append_new(local, ac_local_device_json(&d->devices[i]));
    for (const ac_device_spec *s = ac_device_specs; s->name; s++)
        json_array_append_new(profiles, ac_device_spec_json(s));
    rep_view(rc, 200, json_pack("{s:o,s:o,s:o}", "local", local, "profiles", profiles, "scheduler", sched_status(d)));
    return http_reply(rc);
}

/* Prometheus text: one gauge or counter a row. */
enum MHD_Result r_metrics(req_ctx *rc, json_t *body) {
    (void)body;
    ac_daemon *d = rc->d;
    ac_err e = {{0}};
    long counts[JOB_NSTATES], wf = 0;
    if (db_job_counts(d->db, counts, &e)) {
        rep_store(d, &rc->rep, e.msg);
        return http_reply(rc);
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
        return http_reply(rc);
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
    return http_reply(rc);
}

enum MHD_Result r_healthz(req_ctx *rc, json_t *body) {
    (void)body;
    ac_daemon *d = rc->d;
    char msg[300];
    int deg = db_health(d->db, msg, sizeof msg, NULL) || sched_degraded(d, msg, sizeof msg);
    json_t *j =
        json_pack("{s:s,s:s,s:i,s:f,s:i}", "status", deg ? "degraded" : "ok", "version", AC_VERSION, "schema_version",
                  d->schema_version, "uptime_s", ac_now() - d->started_at, "sse_streams", sse_count(d->hub));
    if (j && deg) json_object_set_new(j, "reason", json_string(msg));
    rep_json(&rc->rep, deg ? 503 : 200, j);
    return http_reply(rc);
}

enum MHD_Result r_static(req_ctx *rc, json_t *body) {
    (void)body;
    const char *url = rc->path;
    if (!strcmp(url, "/")) url = "/index.html";
    int ok = strlen(url) < sizeof rc->url && !strstr(url, "..");
    for (const char *p = url; *p && ok; p++)
        ok = isalnum((unsigned char)*p) || *p == '/' || *p == '.' || *p == '-' || *p == '_';
    if (!ok) {
        rep_error(rc->d, &rc->rep, 404, "not_found", "no such file", NULL);
        return http_reply(rc);
    }
    snprintf(rc->url, sizeof rc->url, "%s", url);
    return http_offload(rc, task_static);
}

const route http_routes[] = {
    {"*", "/healthz", r_healthz, 0},
    {"*", "/metrics", r_metrics, R_BROWSER},
    {"GET", "/openapi.json", r_openapi, R_BROWSER}, /* openapi.c */
    {"GET", "/v1/jobs", r_jobs_list, R_API},
    {"POST", "/v1/jobs", r_jobs_post, R_API | R_JSON | R_SUBMIT},
    {"POST", "/v1/validate", r_validate, R_API | R_JSON | R_SUBMIT},
    {"GET", "/v1/jobs/{id}", r_job_get, R_API | R_OWNED},
    {"DELETE", "/v1/jobs/{id}", r_job_cancel, R_API | R_SUBMIT | R_OWNED},
    {"GET", "/v1/jobs/{id}/events", r_job_events, R_API | R_QUERY_TOKEN | R_OWNED},
    {"GET", "/v1/jobs/{id}/result", r_job_result, R_API | R_OWNED},
    {"GET", "/v1/jobs/{id}/log", r_job_log, R_API | R_OWNED},
    {"GET", "/v1/jobs/{id}/report.html", r_job_report_html, R_API | R_OWNED},
    {"GET", "/v1/jobs/{id}/files", r_job_files, R_API | R_OWNED},
    {"GET", "/v1/jobs/{id}/files/{rest}", r_job_file, R_API | R_OWNED},
    {"POST", "/v1/estimate", r_estimate, R_API | R_JSON | R_SUBMIT},
    {"GET", "/v1/devices", r_devices, R_API},
    {"GET", "/v1/cost-tables", r_cost_list, R_API},
    {"POST", "/v1/cost-tables", r_cost_post, R_API | R_JSON | R_ADMIN},
    {"GET", "/v1/cost-tables/measurements", r_measurements, R_API},
    {"DELETE", "/v1/cost-tables/measurements/{id}", r_measure_cancel, R_API | R_ADMIN},
    {"GET", "/v1/cost-tables/{rest}", r_cost_get, R_API},
    {"GET", "/v1/config", r_config, R_API},
    {"GET", "/v1/audit", r_audit, R_API | R_ADMIN},
    {"POST", "/v1/jobs/{id}/worker-events", r_worker_events, R_JSON}, /* the job's own secret */
};

const size_t http_nroutes = sizeof http_routes / sizeof *http_routes;

const route http_static_route = {"GET", "/", r_static, R_BROWSER};
