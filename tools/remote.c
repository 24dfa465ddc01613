/*
 * remote.c - the CLI's daemon commands (see remote.h): each parses its
 * options with getopt_long, makes its requests through http_client.c and
 * prints either for a person (tables, a progress bar on a terminal, plain
 * lines otherwise) or, with --json, the API's JSON (one document, or one
 * JSON line per event when following).
 */
#include "remote.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "http_client.h"

#define DEFAULT_SERVER "http://127.0.0.1:8321"

typedef struct {
    hc_conn conn;
    char base[1024];
    int json;
} ctx;

const char remote_usage[] = "  autocompress submit SPEC.json [--follow] [--idempotency-key K]\n"
                            "  autocompress status ID\n"
                            "  autocompress list [--state S] [--limit N]\n"
                            "  autocompress logs ID [--follow] [--worker]\n"
                            "  autocompress cancel ID\n"
                            "  autocompress wait ID [--timeout S]\n"
                            "  autocompress report ID [--open]\n"
                            "  autocompress download ID DIR\n"
                            "      (each takes --server URL, default $AUTOCOMPRESS_SERVER else " DEFAULT_SERVER
                            ";\n       --token T, default $AUTOCOMPRESS_TOKEN; --json; --help)\n";

static const struct {
    const char *name, *args, *help;
} CMDS[] = {
    {"submit", "SPEC.json [--follow] [--idempotency-key K]",
     "Submit a job spec (POST /v1/jobs) and print its id. --follow: then follow it as `wait` does and exit\n"
     "with the job's outcome. --idempotency-key K: a retry with the same key and spec returns the first job."},
    {"status", "ID", "The job's state, reason, times and transitions (GET /v1/jobs/ID)."},
    {"list", "[--state S] [--limit N]",
     "Jobs, oldest first, every page (GET /v1/jobs); --state queued|running|succeeded|failed|cancelled;\n"
     "--limit N: at most N jobs."},
    {"logs", "ID [--follow] [--worker]",
     "The job's events (GET /v1/jobs/ID/events). --follow: stream them (server-sent events) until the job\n"
     "ends, resuming with Last-Event-ID after a dropped connection, and exit with its outcome as `wait` does.\n"
     "--worker: the worker's text log instead."},
    {"cancel", "ID", "Cancel a queued or running job (DELETE /v1/jobs/ID)."},
    {"wait", "ID [--timeout S]",
     "Wait for the job to end: a progress bar (stage, percent, ETA) on a terminal, plain lines otherwise\n"
     "(--json: only the final job). Exit 0 when it succeeded, 1 failed, 3 cancelled, 5 when --timeout S seconds ran "
     "out."},
    {"report", "ID [--open]",
     "The report of a succeeded job (GET /v1/jobs/ID/result): the arms side by side; --json: report.json.\n"
     "--open: its HTML page (GET /v1/jobs/ID/report.html) saved to a new file in $TMPDIR (else /tmp) and\n"
     "opened with xdg-open when there is one; the file's path is printed either way."},
    {"download", "ID DIR",
     "Copy a succeeded job's exported files (GET /v1/jobs/ID/files) into DIR (created if missing)."},
};

static int cmd_help(const char *name, FILE *f) {
    for (size_t i = 0; i < sizeof CMDS / sizeof *CMDS; i++)
        if (!strcmp(CMDS[i].name, name)) {
            fprintf(f,
                    "usage: autocompress %s %s\n\n%s\n\n"
                    "Options of every daemon command:\n"
                    "  --server URL   the daemon (default $AUTOCOMPRESS_SERVER, else " DEFAULT_SERVER ")\n"
                    "  --token T      bearer token (default $AUTOCOMPRESS_TOKEN)\n"
                    "  --json         the API's JSON on stdout, for scripts\n"
                    "  --help         this text\n"
                    "Exit status: 0 ok, 1 job failed, 2 usage, 3 job cancelled, 4 API error or server unreachable,\n"
                    "5 timeout.\n",
                    CMDS[i].name, CMDS[i].args, CMDS[i].help);
            return f == stdout ? RC_OK : RC_USAGE;
        }
    return RC_USAGE;
}

int remote_is_command(const char *cmd) {
    for (size_t i = 0; i < sizeof CMDS / sizeof *CMDS; i++)
        if (!strcmp(CMDS[i].name, cmd)) return 1;
    return 0;
}

/* ---- printing ---- */

static void print_json(json_t *j, int indent) {
    char *s = json_dumps(j, indent ? JSON_INDENT(2) | JSON_PRESERVE_ORDER : JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (s) printf("%s\n", s);
    free(s);
    fflush(stdout);
}

/* An API error: the body's error object to stdout with --json, and a line
 * "autocompress: STATUS CODE: MESSAGE" on stderr. Returns RC_API. */
static int api_error(const ctx *c, const hc_resp *r) {
    json_t *j = r->body ? json_loads(r->body, 0, NULL) : NULL;
    json_t *err = json_object_get(j, "error");
    const char *code = json_string_value(json_object_get(err, "code"));
    const char *msg = json_string_value(json_object_get(err, "message"));
    const char *field = json_string_value(json_object_get(err, "field"));
    if (c->json && j) print_json(j, 0);
    if (code)
        fprintf(stderr, "autocompress: %ld %s: %s%s%s%s\n", r->status, code, msg ? msg : "", field ? " (field " : "",
                field ? field : "", field ? ")" : "");
    else
        fprintf(stderr, "autocompress: HTTP %ld: %.300s\n", r->status, r->body ? r->body : "");
    json_decref(j);
    return RC_API;
}

/* GET path whose 200 answer is text (a log, a page): 0 with *r filled (hc_resp_free), else RC_API after
 * printing why. */
static int get_text(const ctx *c, const char *path, hc_resp *r) {
    ac_err e = {{0}};
    if (hc_request(&c->conn, "GET", path, NULL, NULL, r, &e)) {
        fprintf(stderr, "autocompress: %s\n", e.msg);
        return RC_API;
    }
    if (r->status == 200) return RC_OK;
    int rc = api_error(c, r);
    hc_resp_free(r);
    return rc;
}

/* A request whose 2xx answer is JSON: 0 with *out (owned), else RC_API after printing why. */
static int call_json(const ctx *c, const char *method, const char *path, const char *body, const char *idem,
                     json_t **out, long *status) {
    hc_resp r;
    ac_err e = {{0}};
    *out = NULL;
    if (hc_request(&c->conn, method, path, body, idem, &r, &e)) {
        fprintf(stderr, "autocompress: %s\n", e.msg);
        return RC_API;
    }
    if (status) *status = r.status;
    if (r.status < 200 || r.status > 299) {
        int rc = api_error(c, &r);
        hc_resp_free(&r);
        return rc;
    }
    json_error_t je;
    *out = json_loads(r.body, 0, &je);
    hc_resp_free(&r);
    if (!*out) {
        fprintf(stderr, "autocompress: the server's answer is not JSON: %s\n", je.text);
        return RC_API;
    }
    return RC_OK;
}

static const char *jstr(json_t *o, const char *k) {
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

static void fmt_time(json_t *t, char *out, size_t n) {
    if (!json_is_number(t)) {
        snprintf(out, n, "-");
        return;
    }
    time_t s = (time_t)json_number_value(t);
    struct tm tm;
    localtime_r(&s, &tm);
    strftime(out, n, "%Y-%m-%d %H:%M:%S", &tm);
}

static void fmt_dur(double s, char *out, size_t n) {
    if (!(s >= 0) || s > 1e7)
        snprintf(out, n, "?");
    else if (s < 60)
        snprintf(out, n, "%.0fs", s);
    else if (s < 3600)
        snprintf(out, n, "%dm%02ds", (int)s / 60, (int)s % 60);
    else
        snprintf(out, n, "%dh%02dm", (int)s / 3600, ((int)s % 3600) / 60);
}

/* ---- following a job's events ---- */

typedef enum { SHOW_BAR, SHOW_LINES, SHOW_JSON, SHOW_QUIET, SHOW_EVENTS } show_mode;

typedef struct {
    show_mode mode;
    long job;
    char stage[32];
    int stage_idx, stage_of;
    double stage_frac;
    double started_wall; /* the job's started_at (server's clock), 0 unknown */
    double t_start;      /* this command's start (monotonic) */
    double last_draw, last_line;
    int bar_shown;
    char state[16];
    char reason[1024];
    json_t *result; /* the result event's report (owned) */
} follow_st;

static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int terminal(const char *s) {
    return !strcmp(s, "succeeded") || !strcmp(s, "failed") || !strcmp(s, "cancelled");
}

/* The job's overall fraction: stages count equally, the current one by its own fraction. */
static double overall(const follow_st *f) {
    if (f->stage_of <= 0) return 0;
    double p = (f->stage_idx - 1 + f->stage_frac) / f->stage_of;
    return p < 0 ? 0 : p > 1 ? 1 : p;
}

static void clear_bar(follow_st *f) {
    if (f->bar_shown) {
        fputs("\r\033[K", stdout);
        f->bar_shown = 0;
    }
}

static void draw_bar(follow_st *f, int force) {
    double now = mono();
    if (!force && now - f->last_draw < 0.2) return;
    f->last_draw = now;
    double p = overall(f), el = f->started_wall > 0 ? wall() - f->started_wall : now - f->t_start;
    char els[16], eta[16];
    fmt_dur(el, els, sizeof els);
    if (p > 0.01 && p < 1)
        fmt_dur(el * (1 - p) / p, eta, sizeof eta);
    else
        snprintf(eta, sizeof eta, "?");
    char bar[31];
    int fill = (int)(p * 30 + 0.5);
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
    bar[30] = 0;
    printf("\r\033[Kjob %ld [%d/%d %-9s] [%s] %3.0f%%  %s elapsed  ETA %s", f->job, f->stage_idx, f->stage_of,
           f->stage[0] ? f->stage : f->state, bar, p * 100, els, eta);
    fflush(stdout);
    f->bar_shown = 1;
}

/* A plain line (lines mode) with the time since this command started. */
static void line(follow_st *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void line(follow_st *f, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    clear_bar(f);
    printf("[%6.1fs] job %ld: ", mono() - f->t_start, f->job);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    f->last_line = mono();
}

static int on_event(void *ud, long id, const char *kind, const char *data) {
    follow_st *f = ud;
    json_t *d = json_loads(data, JSON_DECODE_ANY, NULL);
    int shown = f->mode == SHOW_BAR || f->mode == SHOW_LINES;
    if (f->mode == SHOW_JSON || f->mode == SHOW_EVENTS) {
        json_t *o = json_pack("{s:I,s:s,s:O?}", "id", (json_int_t)id, "kind", kind, "data", d);
        if (f->mode == SHOW_JSON)
            print_json(o, 0);
        else {
            char *s = json_dumps(d, JSON_COMPACT | JSON_PRESERVE_ORDER);
            printf("%ld %s %s\n", id, kind, s ? s : data);
            fflush(stdout);
            free(s);
        }
        json_decref(o);
    }
    double frac = -1;
    if (!strcmp(kind, "state")) {
        snprintf(f->state, sizeof f->state, "%s", jstr(d, "state"));
        snprintf(f->reason, sizeof f->reason, "%s", jstr(d, "reason"));
        if (!strcmp(f->state, "running") && f->started_wall <= 0) f->started_wall = wall();
        if (f->mode == SHOW_LINES || (f->mode == SHOW_BAR && terminal(f->state))) {
            if (f->reason[0])
                line(f, "%s (%s)", f->state, f->reason);
            else
                line(f, "%s", f->state);
        }
    } else if (!strcmp(kind, "stage")) {
        snprintf(f->stage, sizeof f->stage, "%s", jstr(d, "stage"));
        f->stage_idx = (int)json_integer_value(json_object_get(d, "index"));
        f->stage_of = (int)json_integer_value(json_object_get(d, "of"));
        f->stage_frac = 0;
        if (f->mode == SHOW_LINES)
            line(f, "stage %d/%d %s (%.0f%%)", f->stage_idx, f->stage_of, f->stage, overall(f) * 100);
    } else if (!strcmp(kind, "progress")) {
        frac = json_number_value(json_object_get(d, "fraction"));
    } else if (!strcmp(kind, "search") || !strcmp(kind, "distill")) {
        /* sub-phases in their order in the stage: search scores Minitron's
         * candidates (counted as its first fifth), then runs its own search;
         * distill trains the minitron arm, then the autocompress one */
        json_t *step = json_object_get(d, "step"), *steps = json_object_get(d, "steps");
        json_t *cand = json_object_get(d, "candidate"), *of = json_object_get(d, "of");
        int minitron = !strcmp(jstr(d, "phase"), "minitron") || !strcmp(jstr(d, "arm"), "minitron");
        double lo = !strcmp(kind, "search") ? (minitron ? 0 : 0.2) : (minitron ? 0 : 0.5);
        double w = !strcmp(kind, "search") ? (minitron ? 0.2 : 0.8) : 0.5;
        if (json_is_integer(step) && json_integer_value(steps) > 0)
            frac = lo + w * (double)json_integer_value(step) / (double)json_integer_value(steps);
        else if (json_is_integer(cand) && json_integer_value(of) > 0)
            frac = lo + w * (double)json_integer_value(cand) / (double)json_integer_value(of);
    } else if (!strcmp(kind, "error") || !strcmp(kind, "infeasible")) {
        if (shown) {
            char *s = json_dumps(d, JSON_COMPACT);
            line(f, "%s: %s", kind, !strcmp(kind, "error") ? jstr(d, "message") : (s ? s : ""));
            free(s);
        }
    } else if (!strcmp(kind, "result")) {
        json_decref(f->result);
        f->result = json_incref(d);
    }
    if (frac >= 0 && frac <= 1 && frac >= f->stage_frac) { /* never backwards within a stage */
        f->stage_frac = frac;
        /* plain lines: a progress line at most every 10 s */
        if (f->mode == SHOW_LINES && mono() - f->last_line >= 10)
            line(f, "%s %.0f%% of the stage, %.0f%% of the job", f->stage, frac * 100, overall(f) * 100);
    }
    if (f->mode == SHOW_BAR && !terminal(f->state) && f->stage_of > 0) draw_bar(f, !strcmp(kind, "stage"));
    json_decref(d);
    return terminal(f->state); /* the server closes the stream after the final state; stop reading there */
}

/* Read the job's event stream until its final state, reconnecting with
 * Last-Event-ID after a dropped connection (for up to 5 minutes without a
 * successful connection). 0, or an RC_* after printing why. */
static int stream_events(const ctx *c, follow_st *f, double timeout_s) {
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%ld/events", f->job);
    long last = 0, retry_ms = 2000;
    double down_since = 0, t0 = mono();
    for (;;) {
        long status;
        char *body = NULL;
        ac_err e = {{0}};
        long before = last;
        long max_ms = timeout_s > 0 ? (long)((timeout_s - (mono() - t0)) * 1000) : 0;
        status = 0;
        int rc = timeout_s > 0 && max_ms <= 0
                     ? -1
                     : hc_sse(&c->conn, path, &last, max_ms, &retry_ms, on_event, f, &status, &body, &e);
        if (terminal(f->state)) {
            free(body);
            return 0;
        }
        if (!rc && status != 200 && status != 0 && status != 503) { /* the API refused: not a dropped connection */
            hc_resp r = {.status = status, .body = body};
            int x = api_error(c, &r);
            free(body);
            return x;
        }
        free(body);
        if (timeout_s > 0 && mono() - t0 > timeout_s) {
            clear_bar(f);
            fprintf(stderr, "autocompress: job %ld still %s after %.0f s\n", f->job, f->state[0] ? f->state : "?",
                    timeout_s);
            return RC_TIMEOUT;
        }
        if (last > before || !rc) down_since = 0; /* events arrived, or the server closed cleanly */
        if (!down_since) down_since = mono();
        if (mono() - down_since > 300) {
            clear_bar(f);
            fprintf(stderr, "autocompress: %s; gave up after 300 s\n", rc ? e.msg : "the event stream keeps ending");
            return RC_API;
        }
        if (f->mode != SHOW_QUIET && f->mode != SHOW_JSON) {
            clear_bar(f);
            fprintf(stderr, "autocompress: event stream %s; resuming after event %ld in %.1f s\n",
                    rc              ? "dropped"
                    : status == 503 ? "refused (503)"
                                    : "ended early",
                    last, retry_ms / 1000.0);
        }
        usleep((useconds_t)(retry_ms > 30000 ? 30000 : retry_ms) * 1000);
    }
}

/* The report's headline: which arm was chosen, its perplexity and where it went. */
static void print_outcome(const follow_st *f) {
    json_t *r = f->result;
    if (!r) {
        printf("job %ld succeeded\n", f->job);
        return;
    }
    const char *chosen = jstr(r, "chosen");
    json_t *arm = json_object_get(r, chosen), *base = json_object_get(r, "baseline");
    printf("job %ld succeeded: chosen %s", f->job, chosen[0] ? chosen : "?");
    double ppl = json_number_value(json_object_get(arm, "perplexity")),
           bppl = json_number_value(json_object_get(base, "perplexity"));
    if (ppl > 0) printf(", perplexity %.3f (baseline %.3f)", ppl, bppl);
    double params = json_number_value(json_object_get(json_object_get(arm, "predicted"), "params"));
    if (params > 0) printf(", %.3g parameters", params);
    const char *dir = jstr(json_object_get(r, "export"), "dir");
    if (dir[0]) printf(", exported to %s", dir);
    printf("\n");
}

/* A followed job that ended failed or cancelled: its reason on stderr and
 * the exit status (RC_JOB_FAILED, RC_CANCELLED); 0 when it succeeded. */
static int ended_badly(const follow_st *f) {
    if (!strcmp(f->state, "succeeded")) return RC_OK;
    fprintf(stderr, "autocompress: job %ld %s: %s\n", f->job, f->state, f->reason[0] ? f->reason : "(no reason)");
    return !strcmp(f->state, "cancelled") ? RC_CANCELLED : RC_JOB_FAILED;
}

/* Follow job id to its end: the exit status of its outcome. */
static int follow_job(const ctx *c, long id, show_mode mode, double timeout_s) {
    follow_st f = {.mode = mode, .job = id, .t_start = mono(), .last_line = -1e9};
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%ld", id);
    json_t *j;
    int rc = call_json(c, "GET", path, NULL, NULL, &j, NULL);
    if (rc) return rc;
    if (json_is_number(json_object_get(j, "started_at")))
        f.started_wall = json_number_value(json_object_get(j, "started_at"));
    json_decref(j);
    rc = stream_events(c, &f, timeout_s);
    clear_bar(&f);
    if (!rc) {
        if (mode == SHOW_JSON || (mode == SHOW_QUIET && c->json)) { /* the final job as the last line */
            rc = call_json(c, "GET", path, NULL, NULL, &j, NULL);
            if (!rc) print_json(j, 0);
            json_decref(j);
        }
        if (!strcmp(f.state, "succeeded")) {
            if (!c->json) print_outcome(&f);
        } else
            rc = ended_badly(&f);
    }
    json_decref(f.result);
    return rc;
}

/* ---- commands ---- */

static int parse_id(const char *s, long *id) {
    char *end;
    errno = 0;
    *id = strtol(s, &end, 10);
    if (errno || end == s || *end || *id <= 0) {
        fprintf(stderr, "autocompress: %s is not a job id\n", s);
        return -1;
    }
    return 0;
}

static int cmd_submit(const ctx *c, int nargs, char **args, int follow, const char *idem) {
    if (nargs != 1) return cmd_help("submit", stderr);
    json_error_t je;
    json_t *spec = json_load_file(args[0], JSON_REJECT_DUPLICATES, &je);
    if (!spec) {
        fprintf(stderr, "autocompress: %s: %s (line %d)\n", args[0], je.text, je.line);
        return RC_USAGE;
    }
    char *body = json_dumps(spec, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(spec);
    json_t *j;
    long status = 0;
    int rc = body ? call_json(c, "POST", "/v1/jobs", body, idem, &j, &status) : RC_API;
    free(body);
    if (rc) return rc;
    long id = (long)json_integer_value(json_object_get(j, "id"));
    if (c->json && !follow)
        print_json(j, 0);
    else if (!c->json)
        printf("job %ld %s%s\n", id, status == 200 ? "(an earlier submission with this Idempotency-Key) " : "",
               jstr(j, "state"));
    fflush(stdout);
    json_decref(j);
    if (!follow) return RC_OK;
    return follow_job(c, id, c->json ? SHOW_JSON : isatty(STDOUT_FILENO) ? SHOW_BAR : SHOW_LINES, 0);
}

static int cmd_status(const ctx *c, long id) {
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%ld", id);
    json_t *j;
    int rc = call_json(c, "GET", path, NULL, NULL, &j, NULL);
    if (rc) return rc;
    if (c->json) {
        print_json(j, 1);
        json_decref(j);
        return RC_OK;
    }
    char cr[32], st[32], fi[32];
    fmt_time(json_object_get(j, "created_at"), cr, sizeof cr);
    fmt_time(json_object_get(j, "started_at"), st, sizeof st);
    fmt_time(json_object_get(j, "finished_at"), fi, sizeof fi);
    printf("job %ld%s%s%s: %s", id, json_is_string(json_object_get(j, "name")) ? " (" : "", jstr(j, "name"),
           json_is_string(json_object_get(j, "name")) ? ")" : "", jstr(j, "state"));
    if (json_is_string(json_object_get(j, "device"))) printf(" on %s", jstr(j, "device"));
    printf(", priority %d, attempts %d%s\n", (int)json_integer_value(json_object_get(j, "priority")),
           (int)json_integer_value(json_object_get(j, "attempts")),
           json_is_true(json_object_get(j, "cancel_requested")) ? ", cancel requested" : "");
    printf("  created %s  started %s  finished %s\n", cr, st, fi);
    if (json_is_string(json_object_get(j, "reason"))) printf("  reason: %s\n", jstr(j, "reason"));
    size_t i;
    json_t *t;
    printf("  transitions:");
    json_array_foreach(json_object_get(j, "transitions"), i, t) printf("%s%s", i ? " -> " : " ", jstr(t, "to"));
    printf("\n");
    json_decref(j);
    return RC_OK;
}

static int cmd_list(const ctx *c, const char *state, long limit) {
    long after = 0, shown = 0;
    json_t *all = json_array();
    for (;;) {
        char path[256];
        long page = limit > 0 && limit - shown < 1000 ? limit - shown : 1000;
        snprintf(path, sizeof path, "/v1/jobs?limit=%ld&after=%ld%s%s", page, after, state ? "&state=" : "",
                 state ? state : "");
        json_t *j;
        int rc = call_json(c, "GET", path, NULL, NULL, &j, NULL);
        if (rc) {
            json_decref(all);
            return rc;
        }
        size_t i;
        json_t *o;
        if (!c->json && !after)
            printf("%6s  %-9s  %3s  %-19s  %-16s  %s\n", "ID", "STATE", "PRI", "CREATED", "NAME", "REASON");
        json_array_foreach(json_object_get(j, "jobs"), i, o) {
            if (c->json)
                json_array_append(all, o);
            else {
                char cr[32];
                fmt_time(json_object_get(o, "created_at"), cr, sizeof cr);
                printf("%6lld  %-9s  %3d  %-19s  %-16.16s  %.80s\n",
                       (long long)json_integer_value(json_object_get(o, "id")), jstr(o, "state"),
                       (int)json_integer_value(json_object_get(o, "priority")), cr,
                       json_is_string(json_object_get(o, "name")) ? jstr(o, "name") : "-", jstr(o, "reason"));
            }
            shown++;
        }
        json_t *next = json_object_get(j, "next_after");
        after = json_is_integer(next) ? (long)json_integer_value(next) : 0;
        json_decref(j);
        if (!after || (limit > 0 && shown >= limit)) break;
    }
    if (c->json) {
        json_t *o = json_pack("{s:o}", "jobs", all);
        print_json(o, 0);
        json_decref(o);
    } else
        json_decref(all);
    return RC_OK;
}

static int cmd_logs(const ctx *c, long id, int follow, int worker) {
    char path[128];
    if (worker) {
        snprintf(path, sizeof path, "/v1/jobs/%ld/log", id);
        hc_resp r;
        if (get_text(c, path, &r)) return RC_API;
        if (!c->json)
            fwrite(r.body, 1, r.len, stdout);
        else /* one {"job", "line", "text"} a line of the log (the last line's newline optional) */
            for (size_t at = 0, n = 1; at < r.len; n++) {
                const char *nl = memchr(r.body + at, '\n', r.len - at);
                size_t end = nl ? (size_t)(nl - r.body) : r.len;
                json_t *o = json_pack("{s:I,s:I,s:s%}", "job", (json_int_t)id, "line", (json_int_t)n, "text",
                                      r.body + at, end - at);
                if (o) print_json(o, 0);
                else
                    fprintf(stderr, "autocompress: line %zu of the worker's log is not UTF-8\n", n);
                json_decref(o);
                at = end + 1;
            }
        hc_resp_free(&r);
        return RC_OK;
    }
    if (follow) {
        follow_st f = {.mode = c->json ? SHOW_JSON : SHOW_EVENTS, .job = id, .t_start = mono()};
        int rc = stream_events(c, &f, 0);
        if (!rc) rc = ended_badly(&f); /* exit with the job's outcome, as `wait` does */
        json_decref(f.result);
        return rc;
    }
    long after = 0;
    for (;;) { /* every page of ?format=json */
        snprintf(path, sizeof path, "/v1/jobs/%ld/events?format=json&limit=1000&after=%ld", id, after);
        json_t *j;
        int rc = call_json(c, "GET", path, NULL, NULL, &j, NULL);
        if (rc) return rc;
        json_t *evs = json_object_get(j, "events"), *ev;
        size_t i;
        json_array_foreach(evs, i, ev) {
            after = (long)json_integer_value(json_object_get(ev, "id"));
            if (c->json)
                print_json(ev, 0);
            else {
                char *s = json_dumps(json_object_get(ev, "data"), JSON_COMPACT | JSON_PRESERVE_ORDER);
                printf("%ld %s %s\n", after, jstr(ev, "kind"), s ? s : "null");
                free(s);
            }
        }
        size_t n = json_array_size(evs);
        json_decref(j);
        if (n < 1000) return RC_OK;
    }
}

static int cmd_cancel(const ctx *c, long id) {
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%ld", id);
    json_t *j;
    int rc = call_json(c, "DELETE", path, NULL, NULL, &j, NULL);
    if (rc) return rc;
    if (c->json)
        print_json(j, 0);
    else
        printf("job %ld %s\n", id,
               !strcmp(jstr(j, "state"), "cancelled") ? "cancelled" : "cancelling (the worker is being stopped)");
    json_decref(j);
    return RC_OK;
}

static void print_arm_row(const char *name, json_t *arm, int chosen) {
    json_t *p = json_object_get(arm, "predicted");
    json_t *feas = json_object_get(arm, "feasible");
    printf("%-13s %-8s %10.3f %12.4g %9.3f %9.2f %11.4g %8.3f%s\n", name,
           json_is_boolean(feas) ? (json_is_true(feas) ? "yes" : "NO") : "-",
           json_number_value(json_object_get(arm, "perplexity")), json_number_value(json_object_get(p, "params")),
           json_number_value(json_object_get(p, "tpot_ms")), json_number_value(json_object_get(p, "ttft_ms")),
           json_number_value(json_object_get(p, "tokens_per_s")), json_number_value(json_object_get(p, "memory_gib")),
           chosen ? "  <- chosen" : "");
}

/* report --open: the page saved to a new file, then xdg-open FILE (when
 * present); prints the path. */
static int open_report_html(const ctx *c, long id) {
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%ld/report.html", id);
    hc_resp r;
    if (get_text(c, path, &r)) return RC_API;
    const char *tmp = getenv("TMPDIR");
    char file[4096];
    snprintf(file, sizeof file, "%s/autocompress-job-%ld-XXXXXX.html", tmp && *tmp ? tmp : "/tmp", id);
    int fd = mkstemps(file, 5); /* a new file of ours (O_EXCL), never one planted in a shared /tmp */
    int ok = fd >= 0 && write(fd, r.body, r.len) == (ssize_t)r.len;
    if (fd >= 0 && close(fd)) ok = 0;
    hc_resp_free(&r);
    if (!ok) {
        fprintf(stderr, "autocompress: cannot write %s: %s\n", file, strerror(errno));
        if (fd >= 0) unlink(file);
        return RC_USAGE;
    }
    fflush(stdout);
    int opened = 0;
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        if (null >= 0) dup2(null, STDOUT_FILENO), dup2(null, STDERR_FILENO); /* the browser's chatter */
        execlp("xdg-open", "xdg-open", file, (char *)NULL);
        _exit(127);
    }
    int st;
    if (pid > 0 && waitpid(pid, &st, 0) == pid) opened = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (c->json) {
        json_t *o = json_pack("{s:I,s:s,s:b}", "id", (json_int_t)id, "path", file, "opened", opened);
        print_json(o, 0);
        json_decref(o);
    } else
        printf("%s\n%s\n", file, opened ? "opened with xdg-open" : "open it in a browser (no xdg-open here)");
    return RC_OK;
}

static int cmd_report(const ctx *c, long id, int open_html) {
    if (open_html) return open_report_html(c, id);
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%ld/result", id);
    json_t *r;
    int rc = call_json(c, "GET", path, NULL, NULL, &r, NULL);
    if (rc) return rc;
    if (c->json) {
        print_json(r, 1);
        json_decref(r);
        return RC_OK;
    }
    json_t *tg = json_object_get(r, "target");
    char *lim = json_dumps(json_object_get(r, "constraints"), JSON_COMPACT);
    printf("job %ld: %s on %s, limits %s\n", id, jstr(json_object_get(r, "model"), "path"), jstr(tg, "device"),
           lim ? lim : "{}");
    free(lim);
    printf("%-13s %-8s %10s %12s %9s %9s %11s %8s\n", "arm", "feasible", "perplexity", "params", "tpot_ms", "ttft_ms",
           "tokens/s", "mem_gib");
    const char *chosen = jstr(r, "chosen");
    const char *arms[] = {"baseline", "minitron", "autocompress"};
    for (int i = 0; i < 3; i++)
        if (json_is_object(json_object_get(r, arms[i])))
            print_arm_row(arms[i], json_object_get(r, arms[i]), !strcmp(chosen, arms[i]));
    json_t *ex = json_object_get(r, "export");
    if (json_is_object(ex)) printf("export: %s (%s, %s)\n", jstr(ex, "dir"), jstr(ex, "format"), jstr(ex, "dtype"));
    json_decref(r);
    return RC_OK;
}

static int cmd_download(const ctx *c, long id, const char *dir) {
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%ld/files", id);
    json_t *j;
    int rc = call_json(c, "GET", path, NULL, NULL, &j, NULL);
    if (rc) return rc;
    if (mkdir(dir, 0755) && errno != EEXIST) {
        fprintf(stderr, "autocompress: cannot create %s: %s\n", dir, strerror(errno));
        json_decref(j);
        return RC_USAGE;
    }
    json_t *f, *done = json_array();
    size_t i;
    json_array_foreach(json_object_get(j, "files"), i, f) {
        const char *name = jstr(f, "name");
        /* the server lists plain names; refuse anything else rather than write outside DIR */
        if (!name[0] || strchr(name, '/') || name[0] == '.') {
            fprintf(stderr, "autocompress: the server listed an unexpected file name %s\n", name);
            rc = RC_API;
            break;
        }
        char out[4096], fp[512];
        snprintf(out, sizeof out, "%s/%s", dir, name);
        snprintf(fp, sizeof fp, "/v1/jobs/%ld/files/%s", id, name);
        long status;
        ac_err e = {{0}};
        if (hc_download(&c->conn, fp, out, &status, &e)) {
            fprintf(stderr, "autocompress: %s: %s\n", name, e.msg);
            rc = RC_API;
            break;
        }
        if (status != 200) {
            fprintf(stderr, "autocompress: %s: HTTP %ld\n", name, status);
            rc = RC_API;
            break;
        }
        struct stat st;
        json_int_t want = json_integer_value(json_object_get(f, "size"));
        if (stat(out, &st) || (json_int_t)st.st_size != want) {
            fprintf(stderr, "autocompress: %s: got %lld bytes, the server listed %lld\n", name, (long long)st.st_size,
                    (long long)want);
            rc = RC_API;
            break;
        }
        if (!c->json) printf("%s  %lld bytes\n", out, (long long)want);
        json_array_append_new(done, json_pack("{s:s,s:I}", "path", out, "size", want));
    }
    if (!rc && c->json) {
        json_t *o = json_pack("{s:I,s:s,s:O}", "id", (json_int_t)id, "dir", dir, "files", done);
        print_json(o, 0);
        json_decref(o);
    }
    json_decref(done);
    json_decref(j);
    return rc;
}

int remote_main(const remote_globals *g, int argc, char **argv) {
    const char *cmd = argv[0];
    ctx c = {.json = g->json};
    const char *server = g->server, *token = g->token, *state = NULL, *idem = NULL;
    int follow = 0, worker = 0, open_html = 0;
    long limit = 0;
    double timeout_s = 0;
    enum { O_SERVER = 256, O_TOKEN, O_JSON, O_FOLLOW, O_IDEM, O_STATE, O_LIMIT, O_WORKER, O_TIMEOUT, O_OPEN };
    /* the options each command accepts besides the common ones */
    const struct {
        const char *cmd;
        int opt;
    } allowed[] = {{"submit", O_FOLLOW}, {"submit", O_IDEM}, {"list", O_STATE},  {"list", O_LIMIT},
                   {"logs", O_FOLLOW},   {"logs", O_WORKER}, {"wait", O_TIMEOUT}, {"report", O_OPEN}};
    static const struct option lopts[] = {
        {"server", required_argument, 0, O_SERVER},
        {"token", required_argument, 0, O_TOKEN},
        {"json", no_argument, 0, O_JSON},
        {"help", no_argument, 0, 'h'},
        {"follow", no_argument, 0, O_FOLLOW},
        {"idempotency-key", required_argument, 0, O_IDEM},
        {"state", required_argument, 0, O_STATE},
        {"limit", required_argument, 0, O_LIMIT},
        {"worker", no_argument, 0, O_WORKER},
        {"timeout", required_argument, 0, O_TIMEOUT},
        {"open", no_argument, 0, O_OPEN},
        {0, 0, 0, 0},
    };
    optind = 0; /* glibc: a full re-initialisation (main may have parsed global options) */
    opterr = 1;
    int o;
    while ((o = getopt_long(argc, argv, "h", lopts, NULL)) != -1) {
        int ok = o < O_FOLLOW;
        for (size_t i = 0; i < sizeof allowed / sizeof *allowed; i++)
            ok |= allowed[i].opt == o && !strcmp(allowed[i].cmd, cmd);
        if (o == '?' || !ok) {
            if (o != '?') fprintf(stderr, "autocompress %s: unknown option %s\n", cmd, argv[optind - 1]);
            return cmd_help(cmd, stderr);
        }
        char *end;
        switch (o) {
        case 'h': return cmd_help(cmd, stdout);
        case O_SERVER: server = optarg; break;
        case O_TOKEN: token = optarg; break;
        case O_JSON: c.json = 1; break;
        case O_FOLLOW: follow = 1; break;
        case O_IDEM: idem = optarg; break;
        case O_STATE: state = optarg; break;
        case O_WORKER: worker = 1; break;
        case O_OPEN: open_html = 1; break;
        case O_LIMIT:
            limit = strtol(optarg, &end, 10);
            if (*end || limit <= 0) return cmd_help(cmd, stderr);
            break;
        case O_TIMEOUT:
            timeout_s = strtod(optarg, &end);
            if (*end || !(timeout_s > 0)) return cmd_help(cmd, stderr);
            break;
        }
    }
    if (!server || !*server) server = getenv("AUTOCOMPRESS_SERVER");
    if (!server || !*server) server = DEFAULT_SERVER;
    if (!token) token = getenv("AUTOCOMPRESS_TOKEN");
    size_t sl = strlen(server);
    while (sl && server[sl - 1] == '/') sl--;
    if (sl >= sizeof c.base) return cmd_help(cmd, stderr);
    if (!strstr(server, "://"))
        snprintf(c.base, sizeof c.base, "http://%.*s", (int)sl, server);
    else
        snprintf(c.base, sizeof c.base, "%.*s", (int)sl, server);
    c.conn = (hc_conn){.base = c.base, .token = token, .timeout_s = 120};
    char **args = argv + optind;
    int nargs = argc - optind;
    ac_err e = {{0}};
    if (hc_global_init(&e)) {
        fprintf(stderr, "autocompress: %s\n", e.msg);
        return RC_API;
    }
    long id = 0;
    int rc;
    if (!strcmp(cmd, "submit"))
        rc = cmd_submit(&c, nargs, args, follow, idem);
    else if (!strcmp(cmd, "list"))
        rc = nargs ? cmd_help(cmd, stderr) : cmd_list(&c, state, limit);
    else if (!strcmp(cmd, "download"))
        rc = nargs != 2 ? cmd_help(cmd, stderr) : parse_id(args[0], &id) ? RC_USAGE : cmd_download(&c, id, args[1]);
    else if (nargs != 1)
        rc = cmd_help(cmd, stderr);
    else if (parse_id(args[0], &id))
        rc = RC_USAGE;
    else if (!strcmp(cmd, "status"))
        rc = cmd_status(&c, id);
    else if (!strcmp(cmd, "logs"))
        rc = cmd_logs(&c, id, follow, worker);
    else if (!strcmp(cmd, "cancel"))
        rc = cmd_cancel(&c, id);
    else if (!strcmp(cmd, "wait"))
        rc = follow_job(&c, id, c.json ? SHOW_QUIET : isatty(STDOUT_FILENO) ? SHOW_BAR : SHOW_LINES, timeout_s);
    else if (!strcmp(cmd, "report"))
        rc = cmd_report(&c, id, open_html);
    else
        rc = cmd_help(cmd, stderr);
    hc_global_cleanup();
    return rc;
}
