/*
 * worker.c - `autocompressd run-job ID [--device D] [--threads N]
 * [--output DIR] [--jobs-dir DIR] [--root DIR]... [--quiet-budget S]
 * [--checkpoint DIR] [--heartbeat-ms N] [--memory-mib N]`:
 * runs one job in its own process. The daemon writes {"spec": ..., "cost_tables": {key: table}} on
 * its stdin (the worker never opens the daemon's database), it writes one
 * JSON event per line on stdout for the daemon to store, logs on stderr. Dies with its parent (PR_SET_PDEATHSIG),
 * so a killed daemon leaves no orphan worker behind.
 *
 * With --heartbeat-ms, a thread of its own writes {"kind": "heartbeat"} every
 * N ms, so the daemon can tell a worker that does not run (stopped, hung)
 * from one busy in a long stage (scheduler.c, worker_silence_s). With
 * --memory-mib (the daemon's worker_memory_mib where it has no cgroup to
 * enforce it, wlimit.h) the same thread reads the worker's resident memory
 * every 0.1 s and, past the limit, writes {"kind": "oom", "data":
 * {"rss_mib": N, "limit_mib": L}} and kills the worker.
 *
 * The worker applies the daemon's path rules again (src/core/fsafe.c, with the
 * roots it is given by --root): the spec's paths are checked before the job
 * starts, and every file the library opens is confined the same way.
 *
 * `autocompressd measure-table --threads N [--quiet-budget S] [--dtype
 * fp32|bf16]` measures the CPU cost table (for the engine on weights of
 * that dtype) and prints it as one JSON line (a scheduled
 * measurement's process). --quiet-budget: the config's quiet_budget_s, a
 * cap on quiet re-measurement (quiet.h; absent or < 0: none).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "autocompress.h"
#include "costcache.h"
#include "daemon.h"
#include "digest.h"
#include "worker_post.h"

/* Where events go when the worker runs on another host (--events, --post):
 * the job's events file and the daemon over HTTP (worker_post.h). */
static wpost *remote;

static void emit_line(void *ud, const char *kind, json_t *data) {
    (void)ud;
    json_t *ev = remote ? NULL : json_pack("{s:s,s:O}", "kind", kind, "data", data);
    char *s = ev ? json_dumps(ev, JSON_COMPACT) : NULL;
    json_decref(ev);
    if (remote) wpost_emit(remote, kind, data);
    if (s) {
        flockfile(stdout); /* one whole line at a time: the heartbeat thread writes too */
        fputs(s, stdout);
        fputc('\n', stdout);
        fflush(stdout);
        funlockfile(stdout);
        free(s);
    }
    if (!strcmp(kind, "stage") || !strcmp(kind, "log"))
        fprintf(stderr, "[%s] %s\n", kind,
                json_string_value(json_object_get(data, "stage")) ? json_string_value(json_object_get(data, "stage"))
                : json_string_value(json_object_get(data, "message"))
                    ? json_string_value(json_object_get(data, "message"))
                    : "");
}

/* The worker's resident memory in MiB (/proc/self/statm), or -1. */
static long resident_mib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size, res = -1;
    if (f && fscanf(f, "%ld %ld", &size, &res) != 2) res = -1;
    if (f) fclose(f);
    return res < 0 ? -1 : (long)((double)res * (double)sysconf(_SC_PAGESIZE) / 1048576.0);
}

static struct {
    int period_ms; /* heartbeat */
    long mib;      /* resident limit; 0: none */
} watch;

static void *heartbeat(void *arg) {
    (void)arg;
    const int step = 100; /* ms between memory checks */
    struct timespec ts = {.tv_sec = 0, .tv_nsec = step * 1000000L};
    for (int since = watch.period_ms;; since += step) {
        long rss = watch.mib > 0 ? resident_mib() : -1;
        if (rss > watch.mib) {
            flockfile(stdout);
            printf("{\"kind\":\"oom\",\"data\":{\"rss_mib\":%ld,\"limit_mib\":%ld}}\n", rss, watch.mib);
            fflush(stdout);
            fprintf(stderr, "worker: %ld MiB resident, over its limit of %ld MiB; stopping\n", rss, watch.mib);
            raise(SIGKILL); /* stdout stays locked: nothing else is written after it */
        }
        if (since >= watch.period_ms) {
            since = 0;
            flockfile(stdout);
            fputs("{\"kind\":\"heartbeat\",\"data\":{}}\n", stdout);
            fflush(stdout);
            funlockfile(stdout);
        }
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* The heartbeat thread (local workers only: their stdout is the daemon's pipe). */
static void start_heartbeat(int ms, long mib) {
    pthread_t t;
    if ((ms <= 0 && mib <= 0) || remote) return;
    watch.period_ms = ms > 0 ? ms : 1 << 30;
    watch.mib = mib;
    if (pthread_create(&t, NULL, heartbeat, NULL) == 0) pthread_detach(t);
}

static void fail(const char *msg) {
    json_t *d = json_pack("{s:s}", "message", msg);
    emit_line(NULL, "error", d);
    json_decref(d);
    fprintf(stderr, "job failed: %s\n", msg);
}

/* All of stdin (at most max bytes), NUL-terminated; NULL when too long or out of memory. */
static char *read_stdin(size_t max, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            char *nb = cap < max ? realloc(buf, cap * 2) : NULL;
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, stdin);
        n += r;
        if (r == 0) break;
    }
    if (buf) buf[n] = 0;
    *len = n;
    return buf;
}

typedef struct {
    long id;
    const char *device, *output, *jobs_dir;
    const char *roots[AC_FSAFE_MAX_ROOTS];
    int nroots, threads;
    double quiet_budget; /* < 0: none given */
    /* a worker away from the daemon (executor_slurm.c): its input in a file,
     * its events to the events file and the daemon (worker_post.h) */
    const char *input, *events, *post, *secret_file;
    double flush_s;
    const char *checkpoint; /* stage checkpoints' directory (checkpoint_int.h), NULL: none */
    int heartbeat_ms;       /* 0: no heartbeat */
    long memory_mib;        /* resident limit it watches itself; 0: none */
} worker_args;

static int parse_args(int argc, char **argv, worker_args *a) {
    memset(a, 0, sizeof *a);
    a->device = "cpu";
    a->threads = 2;
    a->quiet_budget = -1;
    a->id = argc >= 3 ? atol(argv[2]) : 0;
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--root") && a->nroots < AC_FSAFE_MAX_ROOTS)
            a->roots[a->nroots++] = argv[i + 1];
        else if (!strcmp(argv[i], "--jobs-dir"))
            a->jobs_dir = argv[i + 1];
        else if (!strcmp(argv[i], "--device"))
            a->device = argv[i + 1];
        else if (!strcmp(argv[i], "--threads"))
            a->threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--output"))
            a->output = argv[i + 1];
        else if (!strcmp(argv[i], "--quiet-budget"))
            ac_quiet_set_budget_cap(a->quiet_budget = atof(argv[i + 1]));
        else if (!strcmp(argv[i], "--input"))
            a->input = argv[i + 1];
        else if (!strcmp(argv[i], "--events"))
            a->events = argv[i + 1];
        else if (!strcmp(argv[i], "--post"))
            a->post = argv[i + 1];
        else if (!strcmp(argv[i], "--secret-file"))
            a->secret_file = argv[i + 1];
        else if (!strcmp(argv[i], "--flush"))
            a->flush_s = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--checkpoint"))
            a->checkpoint = argv[i + 1];
        else if (!strcmp(argv[i], "--heartbeat-ms"))
            a->heartbeat_ms = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--memory-mib"))
            a->memory_mib = atol(argv[i + 1]);
    }
    return a->id > 0 ? 0 : -1;
}

/* The slot's GPU becomes this process's CUDA device 0, which is the one the
 * engine, the table measurement and the evaluation use. */
static int pin_gpu(const char *device) {
    if (strncmp(device, "cuda:", 5)) return 0;
    char vis[256];
    if (ac_cuda_pin(getenv("CUDA_VISIBLE_DEVICES"), atoi(device + 5), vis, sizeof vis)) return -1;
    setenv("CUDA_VISIBLE_DEVICES", vis, 1);
    fprintf(stderr, "worker: CUDA_VISIBLE_DEVICES=%s\n", vis);
    return 0;
}

/* A file's text (at most max bytes), NUL-terminated; NULL when unreadable or too long. */
static char *read_file(const char *path, size_t max, size_t *len) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    char *buf = NULL;
    size_t cap = 0;
    *len = 0;
    for (;;) {
        if (*len + 1 >= cap) {
            char *nb = cap <= max ? realloc(buf, cap ? cap * 2 : 1 << 16) : NULL;
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
            cap = cap ? cap * 2 : 1 << 16;
        }
        size_t r = fread(buf + *len, 1, cap - *len - 1, f);
        *len += r;
        if (r == 0) break;
    }
    fclose(f);
    buf[*len] = 0;
    return buf;
}

static int run_job(worker_args *ap) {
    worker_args a = *ap;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1) return 3; /* parent already gone */
    start_heartbeat(a.heartbeat_ms, a.memory_mib);
    size_t len;
    char *text = a.input ? read_file(a.input, 1u << 30, &len) : read_stdin(1u << 30, &len);
    json_t *in = text ? json_loadb(text, len, 0, NULL) : NULL;
    free(text);
    json_t *spec = json_object_get(in, "spec"), *tables = json_object_get(in, "cost_tables");
    if (!json_is_object(spec)) {
        fail(a.input ? "no job spec in --input" : "no job spec on stdin");
        json_decref(in);
        return 1;
    }
    static ac_job_spec js; /* 33 KB: off the stack */
    ac_err pe = {{0}};
    const char *field = NULL;
    ac_job_check_opts chk = {.jobs_dir = a.jobs_dir}; /* what the daemon checked at submit, again here */
    if (ac_fsafe_set_roots(a.roots, a.nroots, &pe) || ac_job_spec_check(spec, &js, &chk, &field, &pe) != AC_SPEC_OK) {
        char msg[700];
        snprintf(msg, sizeof msg, "%s: %s", field ? field : "paths", pe.msg);
        fail(msg);
        json_decref(in);
        return 1;
    }
    /* The default output (data_dir/jobs/ID/output) is given after the check,
     * which refuses outputs a spec points into the job directories. */
    if (!js.output[0] && a.output &&
        (size_t)snprintf(js.output, sizeof js.output, "%s", a.output) >= sizeof js.output) {
        fail("--output: path too long");
        json_decref(in);
        return 1;
    }
    fprintf(stderr, "worker for job %ld on %s (pid %d)\n", a.id, a.device, (int)getpid());
    if (a.quiet_budget >= 0)
        fprintf(stderr, "worker: quiet re-measurement capped at %g s (quiet_budget_s)\n", a.quiet_budget);
    if (pin_gpu(a.device)) {
        fail("cannot pin the job to its GPU slot (CUDA_VISIBLE_DEVICES)");
        json_decref(in);
        return 1;
    }
    ac_cost_cache cache;
    costcache_json(&cache, tables); /* read-only: the daemon stores tables from the cost_table event */
    ac_job_ctx ctx = {.emit = emit_line, .ud = NULL, .cancelled = NULL, .cache = &cache, .threads = a.threads};
    /* A job run again (a requeued batch job, a local job re-queued after the
     * daemon's restart or crash) resumes after its checkpointed stages; the
     * key ties them to this spec (its SHA-256). */
    char key[DIGEST_HEX_LEN + 1] = "";
    char *spec_text = a.checkpoint ? json_dumps(spec, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    ac_err ke = {{0}};
    if (spec_text && (mkdir(a.checkpoint, 0700) == 0 || errno == EEXIST) && digest_sha256_hex(spec_text, strlen(spec_text), key, &ke) == 0) {
        ctx.checkpoint_dir = a.checkpoint;
        ctx.checkpoint_key = key;
        fprintf(stderr, "worker: stage checkpoints in %s\n", a.checkpoint);
    } else if (a.checkpoint)
        fprintf(stderr, "worker: no stage checkpoints (%s: %s)\n", a.checkpoint, ke.msg[0] ? ke.msg : strerror(errno));
    free(spec_text);
    json_t *result = NULL;
    ac_err e = {{0}};
    int rc = ac_job_run(&js, &ctx, &result, &e);
    json_decref(in);
    if (rc) {
        fail(e.msg);
        return 1;
    }
    emit_line(NULL, "result", result);
    json_decref(result);
    /* the job has its report: the distilled students kept for a rerun go (a whole fp32 model each) */
    ac_job_release_checkpoints(ctx.checkpoint_dir);
    return 0;
}

int worker_main(int argc, char **argv) {
    worker_args a;
    if (parse_args(argc, argv, &a)) {
        fprintf(stderr, "usage: autocompressd run-job ID [--device D] [--threads N] [--output DIR] (the spec on stdin)\n"
                        "       autocompressd run-job ID --input FILE --events FILE [--post URL --secret-file FILE]\n");
        return 2;
    }
    if (a.events) {
        char secret[128] = "";
        size_t n = 0;
        char *sec = a.secret_file ? read_file(a.secret_file, 4096, &n) : NULL;
        if (sec) snprintf(secret, sizeof secret, "%.*s", (int)strcspn(sec, "\r\n"), sec);
        free(sec);
        if (a.post && !secret[0]) {
            fprintf(stderr, "worker: --post needs the job's secret in --secret-file\n");
            return 2;
        }
        ac_err e = {{0}};
        if (!(remote = wpost_open(a.events, a.post, a.id, secret, a.flush_s > 0 ? a.flush_s : 30, &e))) {
            fprintf(stderr, "worker: %s\n", e.msg);
            return 1;
        }
    }
    int rc = run_job(&a);
    wpost_close(remote);
    remote = NULL;
    return rc;
}

int measure_main(int argc, char **argv) {
    int threads = 2;
    const char *dtype = "fp32";
    for (int i = 2; i + 1 < argc; i += 2)
        if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dtype"))
            dtype = argv[i + 1];
        else if (!strcmp(argv[i], "--quiet-budget"))
            ac_quiet_set_budget_cap(atof(argv[i + 1]));
    if (threads < 1 || threads > 256) {
        fprintf(stderr, "measure-table: --threads must be in [1, 256]\n");
        return 2;
    }
    if (!ac_cost_cpu_dtype_ok(dtype)) {
        fprintf(stderr, "measure-table: --dtype must be fp32 or bf16\n");
        return 2;
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1) return 3;
    json_t *req = json_pack("{s:s,s:i,s:s}", "device", "cpu", "threads", threads, "dtype", dtype), *table = NULL;
    ac_err e = {{0}};
    int rc = req ? ac_cost_measure_json(req, &table, &e) : ac_errf(&e, "out of memory");
    json_decref(req);
    if (rc) {
        fprintf(stderr, "measure-table: %s\n", e.msg);
        return 1;
    }
    char *s = json_dumps(table, JSON_COMPACT);
    json_decref(table);
    if (!s) return 1;
    puts(s);
    free(s);
    return fflush(stdout) == 0 ? 0 : 1;
}
