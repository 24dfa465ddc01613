/*
 * scheduler.c - the device pool and the worker processes, on the libuv loop
 * of the main thread.
 *
 * Slots: `cpu` (cfg.cpu_slots concurrent jobs) and one entry per CUDA GPU
 * (cfg.jobs_per_gpu each). A job whose target.device names a local CUDA
 * device ("cuda", "cuda:N") needs a GPU slot; every other job runs on a CPU
 * slot. Queue order: priority, then age; a job that cannot be placed keeps a
 * `reason` saying what it waits for.
 *
 * Each job runs as `autocompressd run-job ID` (same binary) with its stdout
 * on a pipe (one JSON event per line, stored and fanned out to SSE) and its
 * stderr in data_dir/jobs/ID/worker.log, and its stage checkpoints in
 * data_dir/jobs/ID/checkpoint (a job re-queued after the daemon's restart
 * or crash resumes from them). Cancel: SIGTERM, SIGKILL after
 * cfg.cancel_grace_s. A worker that crashes fails only its job. A job
 * running longer than cfg.max_job_seconds is stopped the same way and fails
 * with that reason.
 *
 * Cost-table measurements (POST /v1/cost-tables {"measure":..}) are units
 * of the same queue: `autocompressd measure-table` in its own process on a
 * CPU slot (ahead of queued jobs), cancellable, at most cfg.max_measurements
 * queued or running, one per table key; the table it prints is stored as
 * "measured".
 *
 * Workers are watched: each sends a heartbeat line every worker_silence_s/4
 * (at most every 5 s; not stored as an event); a worker not heard from for
 * cfg.worker_silence_s (stopped by SIGSTOP or a debugger, or hung so that
 * its heartbeat thread cannot run or write) is killed and its job failed
 * with that reason, not left "running" until max_job_seconds. Each tick
 * every worker's /proc/PID/status gives its peak resident memory (VmHWM)
 * and whether it is stopped, for the reason. Each worker runs under a
 * memory limit, cfg.worker_memory_mib (wlimit.h: its own cgroup, or a
 * watch of its resident memory); a worker the limit ended is reported as
 * "out of memory at N MiB in stage S" (S: its last "stage" event), as is a
 * worker killed by a
 * SIGKILL the daemon did not send while the kernel's OOM-kill count
 * (/proc/vmstat oom_kill, which counts cgroup OOM kills too) rose.
 *
 * A job's end that cannot be written (full disk, I/O error) is kept and
 * retried every tick; meanwhile /healthz reports degraded. If the daemon
 * dies first, the job is still "running" in the database and recovery at
 * the next start re-queues or fails it (db_recover).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "autocompress.h"
#include "costcache.h"
#include "daemon.h"
#include "executor.h"
#include "wevent.h"
#include "wlimit.h"

typedef struct slot {
    char id[32]; /* "cpu" or "cuda:N" */
    int gpu;     /* CUDA ordinal or -1 */
    int capacity, running;
} slot;

typedef struct worker {
    struct worker *next;
    ac_daemon *d;
    long job;
    slot *slot;
    uv_process_t proc;
    uv_pipe_t in, out; /* the worker's stdin (its spec) and stdout (its events) */
    uv_timer_t kill_timer;
    uv_write_t wr;
    char *input; /* what is written to stdin, until written */
    ac_buf line;     /* the stdout line being read */
    char *result;    /* JSON text of the result event */
    char error[512]; /* last error event message */
    int cancelling, open_handles, exited, timed_out, skipping;
    int64_t exit_status;
    int term_signal;
    double started;
    char stage[32];            /* the last stage it announced */
    long peak_kb;              /* its peak resident memory, sampled each tick (VmHWM) */
    double heard;              /* when its last line (event or heartbeat) came */
    int stopped;               /* it was seen stopped (T state) at the last tick */
    int silent;                /* killed for staying silent past worker_silence_s */
    double silent_for;         /* how long it had been silent then */
    wlimit lim;                /* its memory limit's cgroup (wlimit.h) */
    long over_mib;             /* resident MiB past its limit (its "oom" event, or seen here); 0: not */
    unsigned long long oom0;   /* the OOM-kill count when it started */
} worker;

/* A job end the database refused, retried every tick. */
typedef struct pending_end {
    struct pending_end *next;
    long job;
    job_state to;
    char *reason, *result;
} pending_end;

/* A cost-table measurement (the HTTP routes list and cancel them, on the loop too). */
typedef struct measure {
    struct measure *next;
    struct scheduler *s;
    long id;
    char key[512];
    int threads;
    char dtype[8]; /* the weights' dtype: "fp32" or "bf16" (validated by the API) */
    job_state state;
    char error[300];
    int cancel, exited, pipe_done, closing_handles;
    slot *slot;
    uv_process_t proc;
    uv_pipe_t out;
    uv_timer_t kill_timer;
    ac_buf buf; /* its stdout: the table */
    int64_t exit_status;
    double queued_at, started_at, finished_at;
} measure;

struct scheduler {
    ac_daemon *d;
    slot slots[AC_MAX_DEVICES];
    int nslots;
    worker *workers;
    uv_async_t wake;
    uv_timer_t tick, keepalive;
    long cancels[256];
    int ncancels;
    int stopping;
    pending_end *pending;
    int npending;
    char pending_why[256];
    measure *measures; /* newest first */
    char jobs_dir[1100];
    long next_measure;
    const ac_executor *exec; /* what runs jobs: local_exec or executor_slurm */
    wlimit_base lim;         /* the workers' memory limit (wlimit.h) */
    double last_watch;       /* the last watch_workers pass */
};

static void log_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void log_line(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "autocompressd: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void on_handle_closed(uv_handle_t *h) {
    worker *w = h->data;
    if (--w->open_handles > 0) return;
    free(w->input);
    ac_buf_free(&w->line);
    free(w->result);
    free(w);
}

static void close_worker_handles(worker *w) {
    uv_handle_t *hs[] = {(uv_handle_t *)&w->proc, (uv_handle_t *)&w->in, (uv_handle_t *)&w->out,
                         (uv_handle_t *)&w->kill_timer};
    for (size_t i = 0; i < sizeof hs / sizeof *hs; i++)
        if (!uv_is_closing(hs[i])) uv_close(hs[i], on_handle_closed);
}

/* A job end the database refused: kept and retried every tick. */
static void keep_pending(scheduler *s, long job, job_state to, const char *reason, const char *result,
                         const char *why) {
    pending_end *p = calloc(1, sizeof *p);
    if (!p) return;
    p->job = job;
    p->to = to;
    p->reason = strdup(reason);
    p->result = result ? strdup(result) : NULL;
    if (!p->reason || (result && !p->result)) {
        free(p->reason);
        free(p->result);
        free(p);
        return;
    }
    p->next = s->pending;
    s->pending = p;
    s->npending++;
    snprintf(s->pending_why, sizeof s->pending_why, "job %ld's end could not be recorded: %.200s", job, why);
}

/* How a worker's job ended, and why. */
/* The kernel's OOM-kill count (/proc/vmstat oom_kill; with the test hooks
 * on, AC_TEST_OOM_COUNTER names a file of the same form instead). */
static unsigned long long oom_kills(void) {
    const char *hooks = getenv("AUTOCOMPRESSD_TEST_HOOKS"), *alt = getenv("AC_TEST_OOM_COUNTER");
    FILE *f = fopen(hooks && !strcmp(hooks, "1") && alt ? alt : "/proc/vmstat", "r");
    if (!f) return 0;
    char line[128];
    unsigned long long n = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "oom_kill %llu", &n) == 1) break;
    fclose(f);
    return n;
}

static long s_mib(const ac_daemon *d) { return d->sched->lim.mib; }

static job_state worker_outcome(const worker *w, char *reason, size_t n) {
    const ac_daemon *d = w->d;
    if (d->sched->stopping) {
        snprintf(reason, n, "the daemon shut down while the job ran; re-queued");
        return JOB_QUEUED;
    }
    if (w->timed_out) {
        snprintf(reason, n, "stopped: the job ran longer than this server's cap max_job_seconds=%d (wall clock)",
                 d->cfg.max_job_seconds);
        return JOB_FAILED;
    }
    if (w->cancelling) {
        snprintf(reason, n, "cancelled by user");
        return JOB_CANCELLED;
    }
    if (w->exit_status == 0 && w->result) {
        snprintf(reason, n, "completed");
        return JOB_SUCCEEDED;
    }
    const char *stage = w->stage[0] ? w->stage : "(none)";
    if (w->silent) {
        snprintf(reason, n,
                 "the worker sent no heartbeat for %.0f s (worker_silence_s=%d) in stage %s: %s; killed", w->silent_for,
                 d->cfg.worker_silence_s, stage,
                 w->stopped ? "it was stopped (SIGSTOP or a debugger)" : "it was hung (not running its heartbeat)");
        return JOB_FAILED;
    }
    long peak = (w->peak_kb + 512) / 1024;
    if (wlimit_oom_killed(&w->lim, &peak)) {
        snprintf(reason, n,
                 "out of memory at %ld MiB in stage %s: the worker reached its cgroup's limit worker_memory_mib=%ld "
                 "and the kernel's OOM killer ended it",
                 peak, stage, s_mib(d));
        return JOB_FAILED;
    }
    if (w->over_mib) {
        snprintf(reason, n,
                 "out of memory at %ld MiB in stage %s: the worker passed its memory limit worker_memory_mib=%ld "
                 "(resident memory) and was stopped",
                 w->over_mib, stage, s_mib(d));
        return JOB_FAILED;
    }
    if (w->term_signal == SIGKILL && oom_kills() > w->oom0) {
        snprintf(reason, n, "out of memory at %ld MiB in stage %s: the kernel's OOM killer ended the worker", peak,
                 stage);
        return JOB_FAILED;
    }
    if (w->error[0])
        snprintf(reason, n, "%s", w->error);
    else if (w->term_signal)
        snprintf(reason, n, "worker killed by signal %d (%s)", w->term_signal, strsignal(w->term_signal));
    else
        snprintf(reason, n, "worker exited with status %lld and no result", (long long)w->exit_status);
    return JOB_FAILED;
}

static void finish_worker(worker *w) {
    scheduler *s = w->d->sched;
    ac_daemon *d = w->d;
    ac_err e = {{0}};
    char reason[700];
    job_state to = worker_outcome(w, reason, sizeof reason);
    wlimit_release(&w->lim);
    const char *result = to == JOB_SUCCEEDED ? w->result : NULL, *name = job_state_name(to);
    if (db_job_transition(d->db, w->job, JOB_RUNNING, to, reason, NULL, result, &e) < 0) {
        log_line("job %ld: cannot record end (%s): %s; retrying", w->job, name, e.msg);
        keep_pending(s, w->job, to, reason, result, e.msg);
    }
    log_line("job %ld %s: %s", w->job, name, reason);
    if (to == JOB_FAILED || to == JOB_CANCELLED) sched_release_checkpoints(d, w->job); /* succeeded: the worker did */
    if (!s->stopping) {
        daemon_event(d, w->job, "state", json_pack("{s:s,s:s}", "state", name, "reason", reason));
        events_finish(d, w->job);
    }
    w->slot->running--;
    for (worker **p = &s->workers; *p; p = &(*p)->next)
        if (*p == w) {
            *p = w->next;
            break;
        }
    close_worker_handles(w);
    if (!s->stopping) uv_async_send(&s->wake);
}

/* Store a measured cost table (a job's cost_table event, a scheduled
 * measurement's output) through the daemon's cost cache (costcache.c). */
static int store_measured(ac_daemon *d, const json_t *j, ac_err *e) {
    ac_cost_table t;
    if (ac_cost_table_from_json(j, &t, e)) return -1;
    snprintf(t.source, sizeof t.source, "measured");
    ac_cost_cache c;
    costcache_db(&c, d->db);
    int rc = c.put(c.ud, &t, e);
    ac_cost_table_free(&t);
    return rc;
}

/* A table a job measured again for its timings (a cost_table event "for"
 * measured_local) replaces the cached one only when its reference probe
 * (quiet.h) ran quicker: the worker judged against the table it was given
 * at its start, and a quicker one may have been stored since. */
static int store_if_quicker(ac_daemon *d, const json_t *j, ac_err *e) {
    const char *key = json_string_value(json_object_get(j, "key"));
    double ref = json_number_value(json_object_get(json_object_get(j, "quiet"), "reference_probe_us"));
    ac_cost_cache c;
    costcache_db(&c, d->db);
    ac_cost_table old;
    int found = 0;
    if (key && ref > 0 && ac_cost_cache_lookup(&c, key, &old, &found, e) == 0 && found) {
        int keep_old = old.ref_us > 0 && old.ref_us <= ref;
        ac_cost_table_free(&old);
        if (keep_old) return 0;
    }
    return store_measured(d, j, e);
}

void exec_worker_event(ac_daemon *d, long job, wevent *ev, char **result, char *error, size_t n) {
    ac_err e;
    if (!strcmp(ev->kind, "result")) {
        free(*result);
        if (!(*result = json_dumps(ev->data, JSON_COMPACT)))
            snprintf(error, n, "the daemon ran out of memory keeping the job's result");
    } else if (!strcmp(ev->kind, "error")) {
        snprintf(error, n, "%s", ev->error);
    } else if (!strcmp(ev->kind, "cost_table")) {
        json_t *t = ev->table;
        if (t) {
            const char *why = json_string_value(json_object_get(ev->data, "for"));
            int rc = why && !strcmp(why, "measured_local") ? store_if_quicker(d, t, &e) : store_measured(d, t, &e);
            if (rc) log_line("job %ld: cannot store cost table: %s", job, e.msg);
        } else if (json_is_true(json_object_get(ev->data, "cache_hit")) &&
                   json_is_string(json_object_get(ev->data, "key"))) {
            if (db_cost_hit(d->db, json_string_value(json_object_get(ev->data, "key")), &e))
                log_line("job %ld: %s", job, e.msg);
        }
        json_object_del(ev->data, "table"); /* the event keeps the summary */
    }
}

/* One line of worker output: {"kind": K, "data": D}. */
static void handle_line(worker *w, const char *line, size_t len) {
    wevent ev;
    if (wevent_parse(line, len, &ev)) {
        daemon_event(w->d, w->job, "log", json_pack("{s:s%}", "line", line, len));
        return;
    }
    if (!strcmp(ev.kind, "heartbeat")) { /* heard (on_read); not an event to keep */
        wevent_free(&ev);
        return;
    }
    exec_worker_event(w->d, w->job, &ev, &w->result, w->error, sizeof w->error);
    if (!strcmp(ev.kind, "oom") && json_integer_value(json_object_get(ev.data, "rss_mib")) > 0)
        w->over_mib = (long)json_integer_value(json_object_get(ev.data, "rss_mib"));
    if (!strcmp(ev.kind, "stage") && json_is_string(json_object_get(ev.data, "stage"))) /* named if it dies */
        snprintf(w->stage, sizeof w->stage, "%s", json_string_value(json_object_get(ev.data, "stage")));
    daemon_event(w->d, w->job, ev.kind, json_incref(ev.data));
    wevent_free(&ev);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    (void)h;
    buf->base = malloc(suggested);
    buf->len = buf->base ? suggested : 0;
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
    worker *w = st->data;
    if (n > 0) {
        w->heard = ac_now();
        for (ssize_t i = 0; i < n; i++) {
            char ch = buf->base[i];
            if (ch == '\n') {
                if (w->skipping) {
                    w->skipping = 0;
                    w->line.len = 0;
                    continue;
                }
                if (w->line.len) {
                    w->line.data[w->line.len] = 0;
                    handle_line(w, w->line.data, w->line.len);
                }
                w->line.len = 0;
                continue;
            }
            if (w->skipping) continue;
            if (ac_buf_reserve(&w->line, 2, 64u << 20)) {
                w->line.len = 0;
                w->skipping = 1;
                continue;
            } /* an over-long or unallocatable line is dropped whole */
            w->line.data[w->line.len++] = ch;
        }
    } else if (n < 0) {
        uv_read_stop(st);
        if (w->exited)
            finish_worker(w);
        else
            w->exited = -1; /* pipe closed first; exit callback finishes */
    }
    free(buf->base);
}

static void on_exit_cb(uv_process_t *p, int64_t status, int sig) {
    worker *w = p->data;
    w->exit_status = status;
    w->term_signal = sig;
    uv_timer_stop(&w->kill_timer);
    if (w->exited == -1)
        finish_worker(w);
    else
        w->exited = 1;
}

static void on_kill_timer(uv_timer_t *t) {
    worker *w = t->data;
    log_line("job %ld: worker did not stop after SIGTERM; SIGKILL", w->job);
    uv_process_kill(&w->proc, SIGKILL);
}

/* Start `args` with stdout on `out` (a pipe), stderr on errfd, and stdin
 * on `in` (a pipe) or nothing when in is NULL. The pipes are initialised
 * here; the caller closes them (and proc) whether or not it started. */
static int spawn_child(ac_daemon *d, uv_process_t *proc, uv_pipe_t *in, uv_pipe_t *out, int errfd, char **args,
                       uv_exit_cb on_exit) {
    uv_pipe_init(d->loop, out, 0);
    if (in) uv_pipe_init(d->loop, in, 0);
    uv_stdio_container_t stdio[3];
    stdio[0].flags = in ? UV_CREATE_PIPE | UV_READABLE_PIPE : UV_IGNORE;
    stdio[0].data.stream = (uv_stream_t *)in;
    stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[1].data.stream = (uv_stream_t *)out;
    stdio[2].flags = UV_INHERIT_FD;
    stdio[2].data.fd = errfd;
    uv_process_options_t opt;
    memset(&opt, 0, sizeof opt);
    opt.file = d->exe;
    opt.args = args;
    opt.exit_cb = on_exit;
    opt.stdio = stdio;
    opt.stdio_count = 3;
    return uv_spawn(d->loop, proc, &opt);
}

/* What a worker reads on stdin: {"spec": the job's spec, "cost_tables":
 * {key: table} (every cached table, so the worker needs no database)}.
 * NULL with e set. */
char *exec_worker_input(ac_daemon *d, long job, ac_err *e) {
    char *spec_text;
    if (db_job_spec(d->db, job, &spec_text, e)) return NULL;
    if (!spec_text) {
        ac_errf(e, "job %ld has no spec", job);
        return NULL;
    }
    json_t *spec = json_loads(spec_text, 0, NULL), *tables = json_object(), *in = NULL;
    free(spec_text);
    db_cost_row *rows = NULL;
    int n = 0;
    if (spec && tables && db_cost_list(d->db, &rows, &n, e) == 0) {
        for (int i = 0; i < n; i++) {
            char *data = NULL;
            if (db_cost_get(d->db, rows[i].key, &data, e) || !data) continue;
            json_t *t = json_loads(data, 0, NULL);
            free(data);
            if (t) json_object_set_new(tables, rows[i].key, t);
        }
        in = json_pack("{s:O,s:O}", "spec", spec, "cost_tables", tables);
    }
    free(rows);
    json_decref(spec);
    json_decref(tables);
    char *s = in ? json_dumps(in, JSON_COMPACT) : NULL;
    json_decref(in);
    if (!s && !e->msg[0]) ac_errf(e, "out of memory");
    return s;
}

static void on_input_written(uv_write_t *req, int status) {
    (void)status; /* a worker that died first fails on its own */
    worker *w = req->data;
    free(w->input);
    w->input = NULL;
    if (!uv_is_closing((uv_handle_t *)&w->in)) uv_close((uv_handle_t *)&w->in, on_handle_closed);
}

/* The job's directory and log file; the log's fd, or -1. */
static int job_log(scheduler *s, long job, char *outp, size_t n) {
    ac_daemon *d = s->d;
    char jobs_dir[1040], dir[1070], logp[1100];
    snprintf(jobs_dir, sizeof jobs_dir, "%s/jobs", d->cfg.data_dir);
    snprintf(dir, sizeof dir, "%s/%ld", jobs_dir, job);
    snprintf(s->jobs_dir, sizeof s->jobs_dir, "%s/jobs", d->data_dir_abs);
    mkdir(d->cfg.data_dir, 0755);
    mkdir(jobs_dir, 0755);
    mkdir(dir, 0755);
    snprintf(logp, sizeof logp, "%s/worker.log", dir);
    snprintf(outp, n, "%s/output", dir);
    return open(logp, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

void sched_checkpoint_dir(const ac_daemon *d, long job, char *out, size_t n) {
    snprintf(out, n, "%s/jobs/%ld/checkpoint", d->data_dir_abs, job);
}

void sched_release_checkpoints(const ac_daemon *d, long job) {
    char dir[1100];
    sched_checkpoint_dir(d, job, dir, sizeof dir);
    ac_job_release_checkpoints(dir);
}

/* The job could not start: fail it and tell its subscribers. */
static void fail_start(ac_daemon *d, long job, job_state from, const char *why) {
    ac_err e = {{0}};
    if (db_job_transition(d->db, job, from, JOB_FAILED, why, NULL, NULL, &e) == 0)
        sched_release_checkpoints(d, job); /* a job re-queued after a restart may have some */
    daemon_event(d, job, "state", json_pack("{s:s,s:s}", "state", "failed", "reason", why));
    events_finish(d, job);
}

static int start_worker(scheduler *s, slot *sl, long job) {
    ac_daemon *d = s->d;
    ac_err e = {{0}};
    char jobarg[32], thr[16], outp[2100];
    int logfd = job_log(s, job, outp, sizeof outp);
    if (logfd < 0) {
        fail_start(d, job, JOB_QUEUED, "cannot create the job's log file");
        return -1;
    }
    worker *w = calloc(1, sizeof *w);
    char *input = w ? exec_worker_input(d, job, &e) : NULL;
    if (!input) {
        close(logfd);
        free(w);
        log_line("job %ld: cannot prepare its worker: %s", job, w ? e.msg : "out of memory");
        return -1;
    }
    if (db_job_transition(d->db, job, JOB_QUEUED, JOB_RUNNING, "running", sl->id, NULL, &e) != 0) {
        close(logfd);
        free(input);
        free(w);
        return -1;
    }
    /* a job's first run: checkpoints already in its directory were left by
     * another job (a data directory reused with a new database) */
    char ckpt[1100];
    sched_checkpoint_dir(d, job, ckpt, sizeof ckpt);
    db_job row = {0};
    int found = 0;
    if (db_job_get(d->db, job, &row, &found, &e) == 0 && found && row.attempts == 1) ac_job_clear_checkpoints(ckpt);
    db_job_clear(&row);
    char why[300];
    if (wlimit_prepare(&s->lim, job, &w->lim, why, sizeof why)) {
        close(logfd);
        free(input);
        free(w);
        fail_start(d, job, JOB_RUNNING, why);
        return -1;
    }
    w->started = w->heard = ac_now();
    w->oom0 = oom_kills();
    w->d = d;
    w->job = job;
    w->slot = sl;
    w->input = input;
    snprintf(jobarg, sizeof jobarg, "%ld", job);
    snprintf(thr, sizeof thr, "%d", d->cfg.worker_threads);
    /* the worker applies the path rules again: same roots, same job dir */
    char qb[32]; /* quiet_budget_s; < 0 (unset): the worker's own allowance, as in measure_start */
    snprintf(qb, sizeof qb, "%g", d->cfg.quiet_budget_s);
    char hb[32]; /* heartbeat: four within worker_silence_s, at most 5 s apart */
    double beat = d->cfg.worker_silence_s * 1000.0 / 4;
    snprintf(hb, sizeof hb, "%d", beat > 5000 ? 5000 : (int)beat);
    /* a job run again (re-queued after a daemon restart or crash) resumes
     * after its last checkpointed stage, as a requeued Slurm job does */
    char *args[20 + 2 * AC_MAX_ROOTS] = {d->exe,           "run-job", jobarg, "--device",       sl->id, "--threads",
                                         thr,              "--output", outp,  "--jobs-dir",     s->jobs_dir,
                                         "--quiet-budget", qb,        "--heartbeat-ms", hb, "--checkpoint", ckpt};
    int na = 17;
    char mem[32]; /* the resident limit it watches itself (wlimit.h) */
    snprintf(mem, sizeof mem, "%ld", wlimit_self_mib(&s->lim));
    if (wlimit_self_mib(&s->lim) > 0) {
        args[na++] = "--memory-mib";
        args[na++] = mem;
    }
    for (int i = 0; i < d->cfg.nroots; i++) {
        args[na++] = "--root";
        args[na++] = d->cfg.model_roots[i];
    }
    args[na] = NULL;
    uv_timer_init(d->loop, &w->kill_timer);
    int r = spawn_child(d, &w->proc, &w->in, &w->out, logfd, args, on_exit_cb);
    w->in.data = w->out.data = w->proc.data = w->kill_timer.data = w->wr.data = w;
    w->open_handles = 4;
    close(logfd);
    if (r) {
        snprintf(why, sizeof why, "cannot start worker: %s", uv_strerror(r));
        fail_start(d, job, JOB_RUNNING, why);
        wlimit_release(&w->lim);
        close_worker_handles(w); /* a failed uv_spawn still initialised the process handle */
        return -1;
    }
    sl->running++;
    w->next = s->workers;
    s->workers = w;
    uv_buf_t buf = uv_buf_init(w->input, (unsigned)strlen(w->input));
    if (wlimit_apply(&w->lim, w->proc.pid, why, sizeof why)) { /* before it has its job */
        snprintf(w->error, sizeof w->error, "%s", why);
        uv_process_kill(&w->proc, SIGKILL);
    } else if (uv_write(&w->wr, (uv_stream_t *)&w->in, &buf, 1, on_input_written)) {
        snprintf(w->error, sizeof w->error, "cannot send the job's spec to its worker");
        uv_process_kill(&w->proc, SIGKILL);
    }
    db_job_set_pid(d->db, job, w->proc.pid, &e);
    daemon_event(d, job, "state", json_pack("{s:s,s:s,s:i}", "state", "running", "device", sl->id, "pid", w->proc.pid));
    uv_read_start((uv_stream_t *)&w->out, on_alloc, on_read);
    log_line("job %ld started on %s (pid %d)", job, sl->id, w->proc.pid);
    return 0;
}

static slot *find_slot(scheduler *s, const char *dev, char *why, size_t whyn) {
    ac_target tg;
    ac_err e;
    int want_gpu = ac_target_resolve(dev, &tg, &e) == 0 && tg.kind == AC_TARGET_CUDA;
    int want_idx = want_gpu ? tg.ordinal : -1;
    int exists = 0;
    for (int i = 0; i < s->nslots; i++) {
        slot *sl = &s->slots[i];
        if (want_gpu != (sl->gpu >= 0)) continue;
        if (want_idx >= 0 && sl->gpu != want_idx) continue;
        exists = 1;
        if (sl->running < sl->capacity) return sl;
    }
    if (!exists)
        snprintf(why, whyn, "waiting: no %s slot on this server", want_gpu ? dev : "cpu");
    else
        snprintf(why, whyn, "waiting for a free %s slot (all busy)", want_gpu ? (want_idx >= 0 ? dev : "GPU") : "cpu");
    return NULL;
}

/* ------------------------------------------------------- measurements */

static void measure_closed(uv_handle_t *h) {
    measure *m = h->data;
    if (--m->closing_handles > 0) return;
    ac_buf_free(&m->buf);
}

/* Both the exit and the end of its output seen: store and release. */
static void measure_finish(measure *m) {
    scheduler *s = m->s;
    ac_daemon *d = s->d;
    ac_err e = {{0}};
    job_state state;
    char err[300] = "";
    if (m->cancel)
        state = JOB_CANCELLED;
    else if (m->exit_status != 0 || !m->buf.data) {
        state = JOB_FAILED;
        snprintf(err, sizeof err, "the measurement process exited with status %lld", (long long)m->exit_status);
    } else {
        m->buf.data[m->buf.len] = 0;
        json_t *t = json_loads(m->buf.data, 0, NULL);
        const char *field;
        const char *key = t ? json_string_value(json_object_get(t, "key")) : NULL;
        if (!t || ac_cost_table_validate(t, &field, &e)) {
            state = JOB_FAILED;
            snprintf(err, sizeof err, "the measurement printed no valid table");
        } else if (!key || strcmp(key, m->key)) {
            state = JOB_FAILED;
            snprintf(err, sizeof err, "the measurement printed a table for another key (%.200s)", key ? key : "none");
        } else if (store_measured(d, t, &e)) {
            state = JOB_FAILED;
            snprintf(err, sizeof err, "cannot store the table: %.250s", e.msg);
        } else
            state = JOB_SUCCEEDED;
        json_decref(t);
    }
    m->state = state;
    snprintf(m->error, sizeof m->error, "%s", err);
    m->finished_at = ac_now();
    log_line("cost-table measurement %ld (%s) %s%s%s", m->id, m->key, job_state_name(state), err[0] ? ": " : "", err);
    m->slot->running--;
    m->closing_handles = 3;
    uv_close((uv_handle_t *)&m->proc, measure_closed);
    uv_close((uv_handle_t *)&m->out, measure_closed);
    uv_close((uv_handle_t *)&m->kill_timer, measure_closed);
    if (!s->stopping) uv_async_send(&s->wake);
}

static void measure_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
    measure *m = st->data;
    if (n > 0) {
        if (ac_buf_reserve(&m->buf, (size_t)n + 1, 32u << 20) == 0) { /* + 1: the NUL measure_finish puts */
            memcpy(m->buf.data + m->buf.len, buf->base, (size_t)n);
            m->buf.len += (size_t)n;
        } else
            m->exit_status = m->exit_status ? m->exit_status : 99; /* output lost: fail it */
    } else if (n < 0) {
        uv_read_stop(st);
        m->pipe_done = 1;
        if (m->exited) measure_finish(m);
    }
    free(buf->base);
}

static void measure_exit(uv_process_t *p, int64_t status, int sig) {
    measure *m = p->data;
    if (m->exit_status == 0) m->exit_status = status ? status : sig ? 128 + sig : 0;
    uv_timer_stop(&m->kill_timer);
    m->exited = 1;
    if (m->pipe_done) measure_finish(m);
}

static void measure_kill(uv_timer_t *t) {
    measure *m = t->data;
    uv_process_kill(&m->proc, SIGKILL);
}

static void measure_start(scheduler *s, measure *m, slot *sl) {
    ac_daemon *d = s->d;
    char thr[16];
    snprintf(thr, sizeof thr, "%d", m->threads);
    char qb[32];
    snprintf(qb, sizeof qb, "%g", d->cfg.quiet_budget_s);
    char *args[] = {d->exe, "measure-table", "--threads", thr, "--quiet-budget", qb, "--dtype", m->dtype, NULL};
    uv_timer_init(d->loop, &m->kill_timer);
    m->slot = sl;
    sl->running++;
    m->state = JOB_RUNNING;
    m->started_at = ac_now();
    int r = spawn_child(d, &m->proc, NULL, &m->out, 2, args, measure_exit);
    m->out.data = m->proc.data = m->kill_timer.data = m;
    if (r) {
        m->exit_status = 127;
        m->exited = m->pipe_done = 1;
        measure_finish(m);
        return;
    }
    uv_read_start((uv_stream_t *)&m->out, on_alloc, measure_read);
    log_line("cost-table measurement %ld (%s) started on %s (pid %d)", m->id, m->key, sl->id, m->proc.pid);
}

/* Start queued measurements (oldest first) on free CPU slots; stop the
 * ones asked to cancel. */
static void run_measurements(scheduler *s) {
    /* Keep the 32 newest entries; older finished ones whose handles are
     * closed are dropped (loop thread: handle fields are only touched here). */
    int kept = 0;
    for (measure **pp = &s->measures; *pp;) {
        measure *m = *pp;
        int ended = m->state != JOB_QUEUED && m->state != JOB_RUNNING;
        if (++kept > 32 && ended && m->closing_handles == 0) {
            *pp = m->next;
            ac_buf_free(&m->buf);
            free(m);
            continue;
        }
        pp = &m->next;
    }
    for (;;) {
        measure *next = NULL;
        for (measure *m = s->measures; m; m = m->next) {
            if (m->state == JOB_RUNNING && m->cancel && !m->exited && !uv_is_active((uv_handle_t *)&m->kill_timer)) {
                uv_process_kill(&m->proc, SIGTERM);
                uv_timer_start(&m->kill_timer, measure_kill, (uint64_t)(s->d->cfg.cancel_grace_s * 1000), 0);
            }
            if (m->state == JOB_QUEUED) next = m;
        }
        if (!next || s->stopping) return;
        char why[128];
        slot *sl = find_slot(s, "cpu", why, sizeof why);
        if (!sl) return;
        measure_start(s, next, sl);
    }
}

int sched_measure(ac_daemon *d, const json_t *req, const char *key, long *id, char *why, size_t n) {
    scheduler *s = d->sched;
    int active = 0, rc = 0;
    for (measure *m = s->measures; m; m = m->next) {
        int live = m->state == JOB_QUEUED || m->state == JOB_RUNNING;
        active += live;
        if (live && !strcmp(m->key, key)) {
            snprintf(why, n, "measurement %ld of this table is already %s", m->id, job_state_name(m->state));
            rc = 1;
        }
    }
    if (!rc && active >= d->cfg.max_measurements) {
        snprintf(why, n, "%d measurements are queued or running (max_measurements); retry later", active);
        rc = 2;
    }
    measure *m = rc ? NULL : calloc(1, sizeof *m);
    if (!rc && !m) {
        snprintf(why, n, "out of memory");
        rc = 2;
    }
    if (m) {
        m->s = s;
        m->id = ++s->next_measure;
        snprintf(m->key, sizeof m->key, "%s", key);
        m->threads = ac_cost_measure_threads(req);
        snprintf(m->dtype, sizeof m->dtype, "%s", ac_cost_measure_dtype(req));
        m->state = JOB_QUEUED;
        m->queued_at = ac_now();
        m->next = s->measures;
        s->measures = m;
        *id = m->id;
    }
    if (m) uv_async_send(&s->wake);
    return rc;
}

int sched_measure_cancel(ac_daemon *d, long id) {
    scheduler *s = d->sched;
    int rc = -1;
    for (measure *m = s->measures; m; m = m->next) {
        if (m->id != id) continue;
        if (m->state == JOB_QUEUED) {
            m->state = JOB_CANCELLED;
            m->finished_at = ac_now();
            rc = 0;
        } else if (m->state == JOB_RUNNING) {
            m->cancel = 1;
            rc = 0;
        } else
            rc = 1;
    }
    if (rc == 0) uv_async_send(&s->wake);
    return rc;
}

json_t *sched_measurements(ac_daemon *d) {
    scheduler *s = d->sched;
    json_t *a = json_array();
    for (measure *m = s->measures; m && a; m = m->next) {
        json_t *o = json_pack("{s:I,s:s,s:s,s:i,s:s,s:b}", "id", (json_int_t)m->id, "key", m->key, "state",
                              job_state_name(m->state), "threads", m->threads, "dtype", m->dtype, "cancel_requested",
                              m->cancel);
        if (o && m->error[0]) json_object_set_new(o, "error", json_string(m->error));
        json_array_append_new(a, o);
    }
    return a;
}

/* ------------------------------------------------------- recovery, limits */

/* Retry job ends the database refused. */
static void retry_pending(scheduler *s) {
    ac_err e = {{0}};
    for (pending_end **pp = &s->pending; *pp;) {
        pending_end *p = *pp;
        int r = db_job_transition(s->d->db, p->job, JOB_RUNNING, p->to, p->reason, NULL, p->result, &e);
        if (r < 0) return; /* still failing: keep the rest too */
        log_line("job %ld: end recorded on retry (%s)", p->job, job_state_name(p->to));
        if (r == 0) {
            daemon_event(s->d, p->job, "state",
                         json_pack("{s:s,s:s}", "state", job_state_name(p->to), "reason", p->reason));
            events_finish(s->d, p->job);
        }
        *pp = p->next;
        free(p->reason);
        free(p->result);
        free(p);
        s->npending--;
    }
}

int sched_degraded(ac_daemon *d, char *msg, size_t n) {
    scheduler *s = d->sched;
    if (!s) return 0;
    int deg = s->npending > 0;
    if (deg) snprintf(msg, n, "%s", s->pending_why);
    return deg;
}

/* Stop jobs past max_job_seconds. */
static void enforce_wall_clock(scheduler *s) {
    double now = ac_now();
    for (worker *w = s->workers; w; w = w->next)
        if (!w->cancelling && !w->timed_out && now - w->started > s->d->cfg.max_job_seconds) {
            w->timed_out = 1;
            uv_process_kill(&w->proc, SIGTERM);
            uv_timer_start(&w->kill_timer, on_kill_timer, (uint64_t)(s->d->cfg.cancel_grace_s * 1000), 0);
            log_line("job %ld: over max_job_seconds=%d; stopping it", w->job, s->d->cfg.max_job_seconds);
        }
}

/* Each tick: every worker's peak memory and stopped state, and whether it
 * has been silent past worker_silence_s (see the top). A tick that comes
 * late (the loop itself was held up, reading no pipe meanwhile) moves the
 * workers' last-heard times on by the delay: their silence was the
 * daemon's. */
static void watch_workers(scheduler *s) {
    double now = ac_now(), late = s->last_watch > 0 ? now - s->last_watch - 1.0 : 0;
    s->last_watch = now;
    for (worker *w = s->workers; w; w = w->next) {
        if (w->exited > 0 || w->silent || w->proc.pid <= 0) continue;
        if (late > 0.5) w->heard += late;
        char path[64], line[256];
        snprintf(path, sizeof path, "/proc/%d/status", w->proc.pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        long kb, rss_kb = 0, self = wlimit_self_mib(&s->lim);
        while (fgets(line, sizeof line, f)) {
            if (!strncmp(line, "State:", 6)) w->stopped = strchr(line, 'T') || strstr(line, "t (tracing stop)");
            if (sscanf(line, "VmHWM: %ld kB", &kb) == 1 && kb > w->peak_kb) w->peak_kb = kb;
            if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) rss_kb = kb;
        }
        fclose(f);
        if (self > 0 && rss_kb > self * 1024 && !w->over_mib && !w->cancelling) { /* the worker did not stop itself */
            w->over_mib = (rss_kb + 1023) / 1024;
            uv_process_kill(&w->proc, SIGKILL);
            log_line("job %ld: worker at %ld MiB resident, over worker_memory_mib=%ld; killed", w->job, w->over_mib, self);
            continue;
        }
        if (now - w->heard > s->d->cfg.worker_silence_s && !w->cancelling && !w->timed_out) {
            w->silent = 1;
            w->silent_for = now - w->heard;
            uv_process_kill(&w->proc, SIGKILL); /* a stopped process takes no SIGTERM */
            log_line("job %ld: no heartbeat from its worker for %.0f s (%s); killed", w->job, w->silent_for,
                     w->stopped ? "stopped" : "hung");
        }
    }
}

/* ------------------------------------------------------- the local executor */

static int local_place(ac_daemon *d, long job, const char *device, char *why, size_t n) {
    slot *sl = find_slot(d->sched, device, why, n);
    if (!sl) return 1;
    return start_worker(d->sched, sl, job) ? -1 : 0;
}

static void local_cancel(ac_daemon *d, long job) {
    scheduler *s = d->sched;
    for (worker *w = s->workers; w; w = w->next)
        if (w->job == job && !w->cancelling) {
            w->cancelling = 1;
            uv_process_kill(&w->proc, SIGTERM);
            uv_timer_start(&w->kill_timer, on_kill_timer, (uint64_t)(s->d->cfg.cancel_grace_s * 1000), 0);
            log_line("job %ld: cancelling (SIGTERM to pid %d)", w->job, w->proc.pid);
        }
}

static void local_tick(ac_daemon *d) { enforce_wall_clock(d->sched); }

static void local_stop(ac_daemon *d) {
    for (worker *w = d->sched->workers; w; w = w->next) uv_process_kill(&w->proc, SIGKILL);
}

static int local_busy(ac_daemon *d) { return d->sched->workers != NULL; }

static const ac_executor local_exec = {
    .name = "local", .place = local_place, .cancel = local_cancel, .tick = local_tick, .stop = local_stop,
    .busy = local_busy};

static void schedule(scheduler *s) {
    if (s->stopping) return;
    ac_daemon *d = s->d;
    ac_err e;
    db_queued *queue;
    int n;
    run_measurements(s);
    if (db_queue(d->db, &queue, &n, &e)) {
        log_line("scheduler: %s", e.msg);
        return;
    }
    for (int i = 0; i < n; i++) {
        char why[256];
        if (s->exec->place(d, queue[i].id, queue[i].device, why, sizeof why) == 1 && strcmp(queue[i].reason, why))
            db_job_set_reason(d->db, queue[i].id, why, &e);
    }
    free(queue);
}

static void process_cancels(scheduler *s) {
    long ids[256];
    int n;
    n = s->ncancels;
    memcpy(ids, s->cancels, sizeof(long) * n);
    s->ncancels = 0;
    for (int i = 0; i < n; i++) s->exec->cancel(s->d, ids[i]);
}

static void on_wake(uv_async_t *a) {
    scheduler *s = a->data;
    process_cancels(s);
    schedule(s);
}

static void on_tick(uv_timer_t *t) {
    scheduler *s = t->data;
    if (s->pending) retry_pending(s);
    s->exec->tick(s->d); /* the local executor's: wall-clock limits */
    watch_workers(s);
    on_wake(&s->wake);
}
static void on_keepalive(uv_timer_t *t) { sse_keepalive(((scheduler *)t->data)->d->hub); }

int sched_start(ac_daemon *d, ac_err *e) {
    scheduler *s = calloc(1, sizeof *s);
    if (!s) return ac_errf(e, "out of memory");
    s->d = d;
    d->sched = s;
    s->exec = d->cfg.exec.kind == AC_EXEC_SLURM ? &executor_slurm : &local_exec;
    if (s->exec == &local_exec) {
        char note[1400];
        wlimit_init(&s->lim, d->cfg.worker_memory_mib, note, sizeof note);
        log_line("%s", note);
    }
    if (s->exec->start && s->exec->start(d, e)) {
        d->sched = NULL;
        free(s);
        return -1;
    }
    for (int i = 0; i < d->ndevices && s->nslots < AC_MAX_DEVICES; i++) {
        slot *sl = &s->slots[s->nslots];
        if (d->devices[i].index < 0) {
            if (d->cfg.cpu_slots == 0) continue;
            snprintf(sl->id, sizeof sl->id, "cpu");
            sl->gpu = -1;
            sl->capacity = d->cfg.cpu_slots;
        } else {
            if (!d->cfg.use_gpus) continue;
            snprintf(sl->id, sizeof sl->id, "cuda:%d", d->devices[i].index);
            sl->gpu = d->devices[i].index;
            sl->capacity = d->cfg.jobs_per_gpu;
        }
        s->nslots++;
    }
    uv_async_init(d->loop, &s->wake, on_wake);
    s->wake.data = s;
    uv_timer_init(d->loop, &s->tick);
    s->tick.data = s;
    uv_timer_start(&s->tick, on_tick, 0, 1000);
    uv_timer_init(d->loop, &s->keepalive);
    s->keepalive.data = s;
    uv_timer_start(&s->keepalive, on_keepalive, (uint64_t)d->cfg.sse_keepalive_s * 1000,
                   (uint64_t)d->cfg.sse_keepalive_s * 1000);
    return 0;
}

const char *sched_worker_memory(ac_daemon *d, long *mib) {
    *mib = d->sched ? d->sched->lim.mib : 0;
    return wlimit_mode_name(d->sched ? d->sched->lim.mode : WLIMIT_NONE);
}

void sched_notify(ac_daemon *d) { uv_async_send(&d->sched->wake); }

void sched_cancel(ac_daemon *d, long job) {
    scheduler *s = d->sched;
    if (s->ncancels < 256) s->cancels[s->ncancels++] = job;
    uv_async_send(&s->wake);
}

json_t *sched_status(ac_daemon *d) {
    scheduler *s = d->sched;
    json_t *o = json_object();
    /* slot counters are only written on the loop thread; a racy read is fine for a status view */
    for (int i = 0; i < s->nslots; i++)
        json_object_set_new(o, s->slots[i].id,
                            json_pack("{s:i,s:i}", "slots", s->slots[i].capacity, "running", s->slots[i].running));
    json_t *x = s->exec->status ? s->exec->status(d) : NULL;
    if (x) json_object_set_new(o, s->exec->name, x);
    return o;
}

/* SIGTERM/SIGINT: stop scheduling, stop workers, re-queue their jobs. */
void sched_stop(ac_daemon *d) {
    scheduler *s = d->sched;
    s->stopping = 1;
    s->exec->stop(d);
    for (measure *m = s->measures; m; m = m->next)
        if (m->state == JOB_RUNNING && !m->exited) {
            m->cancel = 1;
            uv_process_kill(&m->proc, SIGKILL);
        }
    uv_timer_stop(&s->tick);
    uv_timer_stop(&s->keepalive);
}

int sched_busy(ac_daemon *d) {
    scheduler *s = d->sched;
    int busy = s->exec->busy(d);
    for (measure *m = s->measures; m; m = m->next) busy |= m->state == JOB_RUNNING || m->closing_handles > 0;
    return busy;
}

void sched_close(ac_daemon *d) {
    scheduler *s = d->sched;
    uv_close((uv_handle_t *)&s->wake, NULL);
    uv_close((uv_handle_t *)&s->tick, NULL);
    uv_close((uv_handle_t *)&s->keepalive, NULL);
}

void sched_free(ac_daemon *d) {
    if (!d->sched) return;
    for (measure *m = d->sched->measures, *n; m; m = n) {
        n = m->next;
        ac_buf_free(&m->buf);
        free(m);
    }
    for (pending_end *p = d->sched->pending, *n; p; p = n) {
        n = p->next;
        free(p->reason);
        free(p->result);
        free(p);
    }
    free(d->sched);
    d->sched = NULL;
}
