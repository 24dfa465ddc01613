/*
 * http.h - the daemon's HTTP framework (http.c) as the route files see it:
 * a request's context, its reply, the helpers that fill and queue a reply,
 * offloading to libuv's thread pool, and the route table (routes.c) the
 * framework dispatches on. Private to daemon/: daemon.h has http_start /
 * http_stop for the rest.
 *
 * Every handler runs on the daemon's loop, fills rc->rep and returns
 * http_reply(rc) (or http_offload(rc, fn) for work that opens files).
 */
#ifndef AC_HTTP_H
#define AC_HTTP_H

#include <jansson.h>
#include <microhttpd.h>
#include <uv.h>

#include "auth.h"
#include "autocompress.h"
#include "daemon.h"

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
    ac_buf body;
    int too_big;
    int state;      /* 0 new, 1 offloaded, 2 reply ready */
    uv_work_t work; /* offloaded: fn on libuv's thread pool, */
    void (*fn)(struct req_ctx *rc);
    int delay_ms; /* the test hook's hold before fn (http.c), 0 normally */
    int owed;     /* offloaded work came back: its reply is owed (a stop waits for it) */
    void (*after)(struct req_ctx *rc); /* then after on the loop */
    reply rep;
    /* inputs of offloaded work, copied off the connection */
    json_t *in;
    ac_job_spec *js; /* POST /v1/jobs: the parsed spec (33 KB, heap) */
    char *idem_key;
    char url[512];
    const char *path; /* the request's path (valid during the MHD callback) */
    const char *rest; /* a route's last {NAME} */
    long id;          /* a route's {id} */
    int head;         /* a HEAD request (served by the GET route) */
    auth_ident who;   /* the caller (R_AUTH routes) */
    int identified;   /* the caller's token (or the lack of one) was accepted */
    int audit;        /* logged when done (if identified): action, the caller, the status */
    char action[300]; /* "METHOD /path" */
} req_ctx;

/* Replies: a JSON body (owned), an error {"error":{"code","message","field"}},
 * a text body (owned), a 503 for a failed read or write of the store, a
 * view built for the reply (NULL: out of memory, a 503). */
void rep_json(reply *r, unsigned status, json_t *j);
void rep_error(ac_daemon *d, reply *r, unsigned status, const char *code, const char *msg, const char *field);
void rep_text(reply *r, unsigned status, const char *type, char *text, size_t len);
void rep_store(ac_daemon *d, reply *r, const char *msg);
void rep_view(req_ctx *rc, unsigned status, json_t *o);
/* Queue rc->rep on the connection. */
enum MHD_Result http_reply(req_ctx *rc);
/* Run fn on libuv's thread pool with the connection suspended (fn touches
 * only rc and the store); rc->after, when set, then runs on the loop and the
 * reply is queued. A full queue is an immediate 503. */
enum MHD_Result http_offload(req_ctx *rc, void (*fn)(req_ctx *rc));
/* A query argument in [lo, hi] (def when absent; *bad set when malformed). */
long http_query_long(struct MHD_Connection *c, const char *k, long def, long lo, long hi, int *bad);

enum {
    R_BROWSER = 1,     /* refuse cross-site requests (Origin / Host / Sec-Fetch-Site) */
    R_AUTH = 2,        /* a bearer token when tokens are configured */
    R_QUERY_TOKEN = 4, /* ... or ?access_token= (EventSource cannot set headers) */
    R_JSON = 8,        /* Content-Type: application/json and a JSON object body (POST / PUT) */
    R_SUBMIT = 16,     /* the caller's role is submit or admin (else read is enough) */
    R_ADMIN = 32,      /* the caller's role is admin */
    R_OWNED = 64,      /* {id} is a job: 404 unless the caller owns it or is an admin */
    R_API = R_BROWSER | R_AUTH,
};

typedef enum MHD_Result (*route_fn)(req_ctx *rc, json_t *body);

/* A route, and what GET /openapi.json says of it: openapi.c builds the
 * document's paths from this table alone, so a route cannot be served
 * undocumented nor documented unserved. */
typedef struct {
    const char *method; /* "*": any (documented as GET) */
    const char *path;   /* segments; {id} a positive integer, a last {NAME} the remainder (rc->rest) */
    route_fn fn;
    int rules;
    const char *summary; /* one line (required: the document refuses a route without one) */
    /* The answers beside those the rules imply (openapi.c: R_AUTH 401,
     * R_BROWSER / R_SUBMIT / R_ADMIN 403, {id} 404, R_JSON 400 413 415,
     * every route 503): space-separated STATUS[=WHAT[|WHAT]][+HEADER], WHAT a
     * component schema (openapi_schemas.c), "object" (any JSON object) or
     * a media type (text/html); a bare STATUS is an Error. */
    const char *answers;
    const char *params;  /* query and header parameters: names of openapi.c's parameter table, space-separated */
    const char *body;    /* the request body's component schema (R_JSON routes), or NULL */
    const char *desc;    /* the longer description, or NULL */
} route;

/* The route table (routes.c), and the static-file route for other GETs. */
extern const route http_routes[];
extern const size_t http_nroutes;
extern const route http_static_route;

/* Handlers: jobs (routes_jobs.c), cost tables and estimates (routes_cost.c),
 * the server's own (routes.c). */
enum MHD_Result r_jobs_post(req_ctx *rc, json_t *body);
enum MHD_Result r_validate(req_ctx *rc, json_t *body);
enum MHD_Result r_jobs_list(req_ctx *rc, json_t *body);
enum MHD_Result r_job_get(req_ctx *rc, json_t *body);
enum MHD_Result r_job_cancel(req_ctx *rc, json_t *body);
enum MHD_Result r_job_events(req_ctx *rc, json_t *body);
enum MHD_Result r_job_result(req_ctx *rc, json_t *body);
enum MHD_Result r_job_log(req_ctx *rc, json_t *body);
enum MHD_Result r_job_files(req_ctx *rc, json_t *body); /* routes_files.c */
enum MHD_Result r_job_file(req_ctx *rc, json_t *body);
enum MHD_Result r_job_report_html(req_ctx *rc, json_t *body);
enum MHD_Result r_estimate(req_ctx *rc, json_t *body);
enum MHD_Result r_measurements(req_ctx *rc, json_t *body);
enum MHD_Result r_measure_cancel(req_ctx *rc, json_t *body);
enum MHD_Result r_cost_list(req_ctx *rc, json_t *body);
enum MHD_Result r_cost_post(req_ctx *rc, json_t *body);
enum MHD_Result r_cost_get(req_ctx *rc, json_t *body);
enum MHD_Result r_devices(req_ctx *rc, json_t *body);
enum MHD_Result r_metrics(req_ctx *rc, json_t *body);
enum MHD_Result r_healthz(req_ctx *rc, json_t *body);
enum MHD_Result r_static(req_ctx *rc, json_t *body);
/* routes_exec.c */
enum MHD_Result r_config(req_ctx *rc, json_t *body);
enum MHD_Result r_audit(req_ctx *rc, json_t *body);
enum MHD_Result r_worker_events(req_ctx *rc, json_t *body);
enum MHD_Result r_openapi(req_ctx *rc, json_t *body); /* openapi.c */

#endif
