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
 * stderr in data_dir/jobs/ID/worker.log. Cancel: SIGTERM, SIGKILL after
 * cfg.cancel_grace_s. A worker that crashes fails only its job.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon.h"
#include "target.h"

typedef struct slot {
    char id[32];       /* "cpu" or "cuda:N" */
    int gpu;           /* CUDA ordinal or -1 */
    int capacity, running;
} slot;

typedef struct worker {
    struct worker *next;
    ac_daemon *d;
    long job;
    slot *slot;
    uv_process_t proc;
    uv_pipe_t out;
    uv_timer_t kill_timer;
    char *line;
    size_t len, cap;
    char *result;      /* JSON text of the result event */
    char error[512];   /* last error event message */
    int cancelling, closing_handles, exited;
    int64_t exit_status;
    int term_signal;
} worker;

struct scheduler {
    ac_daemon *d;
    slot slots[AC_MAX_DEVICES];
    int nslots;
    worker *workers;
    uv_async_t wake;
    uv_timer_t tick, keepalive;
    pthread_mutex_t mu;     /* guards cancels[] and the running snapshot */
    long cancels[256];
    int ncancels;
    int stopping;
};

long daemon_event(ac_daemon *d, long job, const char *kind, json_t *data) {
    char *s = json_dumps(data, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(data);
    if (!s) return -1;
    ac_err e;
    long id = db_event_insert(d->db, job, kind, s, &e);
    if (id > 0) {
        atomic_fetch_add(&d->events_stored, 1);
        sse_publish(d->hub, job, id, kind, s);
    } else fprintf(stderr, "autocompressd: job %ld: cannot store event: %s\n", job, e.msg);
    free(s);
    return id;
}

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
    if (--w->closing_handles > 0) return;
    free(w->line);
    free(w->result);
    free(w);
}

static void finish_worker(worker *w) {
    scheduler *s = w->d->sched;
    ac_daemon *d = w->d;
    ac_err e = {{0}};
    const char *to;
    char reason[700];
    if (s->stopping) {
        to = "queued";
        snprintf(reason, sizeof reason, "the daemon shut down while the job ran; re-queued");
    } else if (w->cancelling) {
        to = "cancelled";
        snprintf(reason, sizeof reason, "cancelled by user");
    } else if (w->exit_status == 0 && w->result) {
        to = "succeeded";
        snprintf(reason, sizeof reason, "completed");
    } else {
        to = "failed";
        if (w->error[0]) snprintf(reason, sizeof reason, "%s", w->error);
        else if (w->term_signal) snprintf(reason, sizeof reason, "worker killed by signal %d (%s)", w->term_signal, strsignal(w->term_signal));
        else snprintf(reason, sizeof reason, "worker exited with status %lld and no result", (long long)w->exit_status);
    }
    if (db_job_transition(d->db, w->job, "running", to, reason, NULL, !strcmp(to, "succeeded") ? w->result : NULL, &e) < 0)
        log_line("job %ld: cannot record end: %s", w->job, e.msg);
    log_line("job %ld %s: %s", w->job, to, reason);
    if (!s->stopping) {
        daemon_event(d, w->job, "state", json_pack("{s:s,s:s}", "state", to, "reason", reason));
        sse_finish(d->hub, w->job);
    }
    w->slot->running--;
    for (worker **p = &s->workers; *p; p = &(*p)->next)
        if (*p == w) { *p = w->next; break; }
    w->closing_handles = 3;
    uv_close((uv_handle_t *)&w->proc, on_handle_closed);
    uv_close((uv_handle_t *)&w->out, on_handle_closed);
    uv_close((uv_handle_t *)&w->kill_timer, on_handle_closed);
    if (!s->stopping) uv_async_send(&s->wake);
}

/* One line of worker output: {"kind": K, "data": D}. */
static void handle_line(worker *w, const char *line) {
    json_error_t je;
    json_t *ev = json_loads(line, 0, &je);
    const char *kind = json_string_value(json_object_get(ev, "kind"));
    json_t *data = json_object_get(ev, "data");
    if (!ev || !kind || !data) {
        daemon_event(w->d, w->job, "log", json_pack("{s:s}", "line", line));
        json_decref(ev);
        return;
    }
    ac_err e;
    if (!strcmp(kind, "result")) {
        free(w->result);
        w->result = json_dumps(data, JSON_COMPACT);
    } else if (!strcmp(kind, "error")) {
        snprintf(w->error, sizeof w->error, "%s", json_string_value(json_object_get(data, "message")) ? json_string_value(json_object_get(data, "message")) : "error");
    } else if (!strcmp(kind, "cost_table")) {
        json_t *t = json_object_get(data, "table");
        if (t) {
            char *ts = json_dumps(t, JSON_COMPACT);
            if (db_cost_put(w->d->db, json_string_value(json_object_get(t, "key")), json_string_value(json_object_get(t, "device")),
                            json_string_value(json_object_get(t, "dtype")), json_string_value(json_object_get(t, "engine")),
                            (int)json_integer_value(json_object_get(t, "version")), json_string_value(json_object_get(t, "source")) ? json_string_value(json_object_get(t, "source")) : "measured", ts, &e))
                log_line("job %ld: cannot store cost table: %s", w->job, e.msg);
            free(ts);
            json_object_del(data, "table"); /* the event keeps the summary */
        } else if (json_is_true(json_object_get(data, "cache_hit"))) {
            db_cost_hit(w->d->db, json_string_value(json_object_get(data, "key")), &e);
        }
    }
    json_incref(data);
    daemon_event(w->d, w->job, kind, data);
    json_decref(ev);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    (void)h;
    buf->base = malloc(suggested);
    buf->len = buf->base ? suggested : 0;
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
    worker *w = st->data;
    if (n > 0) {
        for (ssize_t i = 0; i < n; i++) {
            char ch = buf->base[i];
            if (ch == '\n') {
                if (w->len) {
                    w->line[w->len] = 0;
                    handle_line(w, w->line);
                }
                w->len = 0;
                continue;
            }
            if (w->len + 2 > w->cap) {
                size_t nc = w->cap ? w->cap * 2 : 4096;
                char *nl = realloc(w->line, nc);
                if (!nl) continue;
                w->line = nl;
                w->cap = nc;
            }
            w->line[w->len++] = ch;
        }
    } else if (n < 0) {
        uv_read_stop(st);
        if (w->exited) finish_worker(w);
        else w->exited = -1; /* pipe closed first; exit callback finishes */
    }
    free(buf->base);
}

static void on_exit_cb(uv_process_t *p, int64_t status, int sig) {
    worker *w = p->data;
    w->exit_status = status;
    w->term_signal = sig;
    uv_timer_stop(&w->kill_timer);
    if (w->exited == -1) finish_worker(w);
    else w->exited = 1;
}

static void on_kill_timer(uv_timer_t *t) {
    worker *w = t->data;
    log_line("job %ld: worker did not stop after SIGTERM; SIGKILL", w->job);
    uv_process_kill(&w->proc, SIGKILL);
}

static int start_worker(scheduler *s, slot *sl, long job) {
    ac_daemon *d = s->d;
    ac_err e = {{0}};
    char dir[2048], logp[2100], jobarg[32], thr[16], outp[2100];
    snprintf(dir, sizeof dir, "%s/jobs/%ld", d->cfg.data_dir, job);
    char jobs_dir[2048];
    snprintf(jobs_dir, sizeof jobs_dir, "%s/jobs", d->cfg.data_dir);
    mkdir(d->cfg.data_dir, 0755);
    mkdir(jobs_dir, 0755);
    mkdir(dir, 0755);
    snprintf(logp, sizeof logp, "%s/worker.log", dir);
    snprintf(outp, sizeof outp, "%s/output", dir);
    int logfd = open(logp, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (logfd < 0) {
        db_job_transition(d->db, job, "queued", "failed", "cannot create the job's log file", NULL, NULL, &e);
        return -1;
    }
    if (db_job_transition(d->db, job, "queued", "running", "running", sl->id, NULL, &e) != 0) { close(logfd); return -1; }
    worker *w = calloc(1, sizeof *w);
    w->d = d;
    w->job = job;
    w->slot = sl;
    snprintf(jobarg, sizeof jobarg, "%ld", job);
    snprintf(thr, sizeof thr, "%d", d->cfg.worker_threads);
    char *args[] = {d->exe, "run-job", jobarg, "--db", d->cfg.db_path, "--device", sl->id, "--threads", thr, "--output", outp, NULL};
    uv_pipe_init(d->loop, &w->out, 0);
    uv_timer_init(d->loop, &w->kill_timer);
    w->out.data = w->proc.data = w->kill_timer.data = w;
    uv_stdio_container_t stdio[3];
    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[1].data.stream = (uv_stream_t *)&w->out;
    stdio[2].flags = UV_INHERIT_FD;
    stdio[2].data.fd = logfd;
    uv_process_options_t opt;
    memset(&opt, 0, sizeof opt);
    opt.file = d->exe;
    opt.args = args;
    opt.exit_cb = on_exit_cb;
    opt.stdio = stdio;
    opt.stdio_count = 3;
    int r = uv_spawn(d->loop, &w->proc, &opt);
    close(logfd);
    if (r) {
        char why[256];
        snprintf(why, sizeof why, "cannot start worker: %s", uv_strerror(r));
        db_job_transition(d->db, job, "running", "failed", why, NULL, NULL, &e);
        daemon_event(d, job, "state", json_pack("{s:s,s:s}", "state", "failed", "reason", why));
        sse_finish(d->hub, job);
        w->closing_handles = 3; /* a failed uv_spawn still initialised the process handle */
        uv_close((uv_handle_t *)&w->proc, on_handle_closed);
        uv_close((uv_handle_t *)&w->out, on_handle_closed);
        uv_close((uv_handle_t *)&w->kill_timer, on_handle_closed);
        return -1;
    }
    sl->running++;
    w->next = s->workers;
    s->workers = w;
    db_job_set(d->db, job, "worker_pid", NULL, w->proc.pid, &e);
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
    if (!exists) snprintf(why, whyn, "waiting: no %s slot on this server", want_gpu ? dev : "cpu");
    else snprintf(why, whyn, "waiting for a free %s slot (all busy)", want_gpu ? (want_idx >= 0 ? dev : "GPU") : "cpu");
    return NULL;
}

static void schedule(scheduler *s) {
    if (s->stopping) return;
    ac_daemon *d = s->d;
    ac_err e;
    json_t *queue;
    if (db_queue(d->db, &queue, &e)) { log_line("scheduler: %s", e.msg); return; }
    size_t i;
    json_t *j;
    json_array_foreach(queue, i, j) {
        long id = (long)json_integer_value(json_object_get(j, "id"));
        const char *dev = json_string_value(json_object_get(j, "device"));
        char why[256];
        slot *sl = find_slot(s, dev ? dev : "cpu", why, sizeof why);
        if (sl) start_worker(s, sl, id);
        else {
            const char *cur = json_string_value(json_object_get(j, "reason"));
            if (!cur || strcmp(cur, why)) db_job_set(d->db, id, "reason", why, 0, &e);
        }
    }
    json_decref(queue);
}

static void process_cancels(scheduler *s) {
    long ids[256];
    int n;
    pthread_mutex_lock(&s->mu);
    n = s->ncancels;
    memcpy(ids, s->cancels, sizeof(long) * n);
    s->ncancels = 0;
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n; i++)
        for (worker *w = s->workers; w; w = w->next)
            if (w->job == ids[i] && !w->cancelling) {
                w->cancelling = 1;
                uv_process_kill(&w->proc, SIGTERM);
                uv_timer_start(&w->kill_timer, on_kill_timer, (uint64_t)(s->d->cfg.cancel_grace_s * 1000), 0);
                log_line("job %ld: cancelling (SIGTERM to pid %d)", w->job, w->proc.pid);
            }
}

static void on_wake(uv_async_t *a) {
    scheduler *s = a->data;
    process_cancels(s);
    schedule(s);
}

static void on_tick(uv_timer_t *t) { on_wake(&((scheduler *)t->data)->wake); }
static void on_keepalive(uv_timer_t *t) { sse_keepalive(((scheduler *)t->data)->d->hub); }

int sched_start(ac_daemon *d, ac_err *e) {
    scheduler *s = calloc(1, sizeof *s);
    if (!s) return ac_errf(e, "out of memory");
    s->d = d;
    d->sched = s;
    pthread_mutex_init(&s->mu, NULL);
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
    uv_timer_start(&s->keepalive, on_keepalive, (uint64_t)d->cfg.sse_keepalive_s * 1000, (uint64_t)d->cfg.sse_keepalive_s * 1000);
    return 0;
}

void sched_notify(ac_daemon *d) { uv_async_send(&d->sched->wake); }

void sched_cancel(ac_daemon *d, long job) {
    scheduler *s = d->sched;
    pthread_mutex_lock(&s->mu);
    if (s->ncancels < 256) s->cancels[s->ncancels++] = job;
    pthread_mutex_unlock(&s->mu);
    uv_async_send(&s->wake);
}

json_t *sched_status(ac_daemon *d) {
    scheduler *s = d->sched;
    json_t *o = json_object();
    /* slot counters are only written on the loop thread; a racy read is fine for a status view */
    for (int i = 0; i < s->nslots; i++)
        json_object_set_new(o, s->slots[i].id, json_pack("{s:i,s:i}", "slots", s->slots[i].capacity, "running", s->slots[i].running));
    return o;
}

/* SIGTERM/SIGINT: stop scheduling, stop workers, re-queue their jobs. */
void sched_stop(ac_daemon *d) {
    scheduler *s = d->sched;
    s->stopping = 1;
    for (worker *w = s->workers; w; w = w->next) uv_process_kill(&w->proc, SIGKILL);
    uv_timer_stop(&s->tick);
    uv_timer_stop(&s->keepalive);
}

int sched_busy(ac_daemon *d) { return d->sched->workers != NULL; }

void sched_close(ac_daemon *d) {
    scheduler *s = d->sched;
    uv_close((uv_handle_t *)&s->wake, NULL);
    uv_close((uv_handle_t *)&s->tick, NULL);
    uv_close((uv_handle_t *)&s->keepalive, NULL);
}

void sched_free(ac_daemon *d) {
    if (!d->sched) return;
    pthread_mutex_destroy(&d->sched->mu);
    free(d->sched);
    d->sched = NULL;
}
