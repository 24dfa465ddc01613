/*
 * routes.c - the route table (method, path pattern with {id} / a last {NAME},
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

/* The routes, and what GET /openapi.json says of each (http.h; openapi.c
 * builds the document from this table, its parameter table and the
 * schemas' field tables in openapi_schemas.c). */
const route http_routes[] = {
    {"*", "/healthz", r_healthz, 0, "Liveness and schema version (no auth)", "200=Health 503=Health", NULL, NULL, NULL},
    {"*", "/metrics", r_metrics, R_BROWSER,
     "Prometheus text metrics: autocompress_jobs{state}, http requests/errors, events, SSE clients, uptime",
     "200=text/plain", NULL, NULL, NULL},
    {"GET", "/openapi.json", r_openapi, R_BROWSER, /* openapi.c */
     "This document (OpenAPI 3.1), generated from the daemon's route table and field tables", "200=object", NULL,
     NULL, NULL},
    {"GET", "/v1/jobs", r_jobs_list, R_API, "List jobs (paginated by id)", "200=JobPage 400", "limit after state", NULL,
     NULL},
    {"POST", "/v1/jobs", r_jobs_post, R_API | R_JSON | R_SUBMIT, "Submit a job",
     "201=Job+Location 200=Job+Idempotent-Replayed 409", "Idempotency-Key", "JobSpec",
     "Validated field by field; paths must be absolute, without '..', exist, and lie under model_roots when "
     "configured. 201 with the job's URL in Location; a retry with the same Idempotency-Key and spec answers 200 "
     "with the first job."},
    {"POST", "/v1/validate", r_validate, R_API | R_JSON | R_SUBMIT,
     "Check a job spec as POST /v1/jobs does, without queuing a job", "200=Valid", NULL, "JobSpec",
     "The one validation every front runs (ac_job_spec_check): the fields, this server's caps and devices, the "
     "paths (absolute, without '..', existing, under model_roots when configured), and the base model against the "
     "export target. `autocompress validate` runs the same checks, except that the CLI needs an output directory."},
    {"GET", "/v1/jobs/{id}", r_job_get, R_API | R_OWNED, "A job with its spec and state transitions", "200=Job", NULL,
     NULL, NULL},
    {"DELETE", "/v1/jobs/{id}", r_job_cancel, R_API | R_SUBMIT | R_OWNED,
     "Cancel a queued or running job (worker: SIGTERM, SIGKILL after cancel_grace_s)", "202=Job 409", NULL, NULL,
     "No request body and no Content-Type. 202 with the job (cancelled when it was queued, cancel_requested while "
     "its worker stops); 409 when it already ended."},
    {"GET", "/v1/jobs/{id}/events", r_job_events, R_API | R_QUERY_TOKEN | R_OWNED,
     "Progress events: SSE stream, or JSON with ?format=json (see proto/events.md)",
     "200=text/event-stream|EventList 400", "Last-Event-ID events-after format events-limit", NULL,
     "An SSE stream resumes after Last-Event-ID (or ?after=); it ends after the job's final event."},
    {"GET", "/v1/jobs/{id}/result", r_job_result, R_API | R_OWNED, "The report of a succeeded job (proto/events.md)",
     "200=Report 409", NULL, NULL, NULL},
    {"GET", "/v1/jobs/{id}/log", r_job_log, R_API | R_OWNED, "The worker's log (text)", "200=text/plain", NULL, NULL,
     NULL},
    {"GET", "/v1/jobs/{id}/report.html", r_job_report_html, R_API | R_OWNED,
     "The report of a succeeded job as one self-contained HTML page (no script, nothing fetched)", "200=text/html 409",
     NULL, NULL,
     "The choice and why, every limit met or missed per arm, quality before and after, predicted and measured "
     "cost, the structure per layer, the search and distillation loss curves from the job's events."},
    {"GET", "/v1/jobs/{id}/files", r_job_files, R_API | R_OWNED,
     "The regular files directly in a finished job's export directory (report export.dir), for download",
     "200=Files 409", NULL, NULL, NULL},
    {"GET", "/v1/jobs/{id}/files/{name}", r_job_file, R_API | R_OWNED,
     "One file of GET /v1/jobs/{id}/files (not a symbolic link, not a dot file)", "200=application/octet-stream 409",
     NULL, NULL, NULL},
    {"POST", "/v1/estimate", r_estimate, R_API | R_JSON | R_SUBMIT,
     "Predict TTFT, TPOT, throughput, memory and max batch of an architecture on a target", "200=EstimateAnswer",
     NULL, "Estimate", NULL},
    {"GET", "/v1/devices", r_devices, R_API,
     "Local devices (CPU, CUDA GPUs with memory), named spec profiles, scheduler slots", "200=Devices", NULL, NULL,
     NULL},
    {"GET", "/v1/cost-tables", r_cost_list, R_API,
     "Cached cost tables (key, device, dtype, engine, version, source, created_at, hits)", "200=CostTables", NULL,
     NULL, NULL},
    {"POST", "/v1/cost-tables", r_cost_post, R_API | R_JSON | R_ADMIN,
     "Import a table ({\"table\": TABLE}) or schedule a measurement ({\"measure\": {\"device\":\"cpu\"}}) on a CPU slot",
     "201=object 202=object 409", NULL, "CostTableRequest",
     "409 when a table with that key is already cached. A measurement answers 202 with {key, status, measurement}."},
    {"GET", "/v1/cost-tables/measurements", r_measurements, R_API,
     "Cost-table measurements (newest first): id, key, state, threads, dtype, cancel_requested, error", "200=object",
     NULL, NULL, NULL},
    {"DELETE", "/v1/cost-tables/measurements/{id}", r_measure_cancel, R_API | R_ADMIN,
     "Cancel a queued or running measurement", "202=object 409", NULL, NULL, NULL},
    {"GET", "/v1/cost-tables/{key}", r_cost_get, R_API, "Export one table as JSON (URL-encode the key)", "200=object 404",
     NULL, NULL, NULL},
    {"GET", "/v1/config", r_config, R_API,
     "The configuration the daemon runs with, without tokens: slots, limits, the executor and its Slurm settings",
     "200=object", NULL, NULL, NULL},
    {"GET", "/v1/audit", r_audit, R_API | R_ADMIN,
     "The audit log, admins only: who did what, oldest first, paginated by id", "200=AuditPage 400", "limit after user",
     NULL,
     "Requests that change something, refusals for a role, and the token commands; 403 for roles other than admin."},
    {"POST", "/v1/jobs/{id}/worker-events", r_worker_events, R_JSON, /* the job's own secret */
     "A Slurm worker's events for its job, authorised by that job's secret (Authorization: Bearer), not an API token",
     "200=LastSeq 401 403 409", NULL, "WorkerEvents", NULL},
};

const size_t http_nroutes = sizeof http_routes / sizeof *http_routes;

const route http_static_route = {"GET", "/", r_static, R_BROWSER, "the dashboard's files (web/)", "200", NULL, NULL, NULL};
