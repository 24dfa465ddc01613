/*
 * worker.c - `autocompressd run-job ID --db PATH [--device D] [--threads N]
 * [--output DIR]`: runs one job in its own process. Reads the spec from the
 * database (read-only), writes one JSON event per line on stdout for the
 * daemon to store, logs on stderr. Dies with its parent (PR_SET_PDEATHSIG),
 * so a killed daemon leaves no orphan worker behind.
 *
 * The worker applies the daemon's path rules again (src/core/fsafe.c, with the
 * roots it is given by --root): the spec's paths are checked before the job
 * starts, and every file the library opens is confined the same way.
 *
 * `autocompressd measure-table --threads N` measures the CPU cost table
 * and prints it as one JSON line (a scheduled measurement's process).
 */
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "api.h"
#include "costcache.h"
#include "daemon.h"
#include "device.h"
#include "fsafe.h"
#include "job.h"

static void emit_line(void *ud, const char *kind, json_t *data) {
    (void)ud;
    json_t *ev = json_pack("{s:s,s:O}", "kind", kind, "data", data);
    char *s = json_dumps(ev, JSON_COMPACT);
    json_decref(ev);
    if (s) {
        fputs(s, stdout);
        fputc('\n', stdout);
        fflush(stdout);
        free(s);
    }
    if (!strcmp(kind, "stage") || !strcmp(kind, "log"))
        fprintf(stderr, "[%s] %s\n", kind, json_string_value(json_object_get(data, "stage")) ? json_string_value(json_object_get(data, "stage")) : json_string_value(json_object_get(data, "message")) ? json_string_value(json_object_get(data, "message")) : "");
}

static void fail(const char *msg) {
    json_t *d = json_pack("{s:s}", "message", msg);
    emit_line(NULL, "error", d);
    json_decref(d);
    fprintf(stderr, "job failed: %s\n", msg);
}

int worker_main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: autocompressd run-job ID --db PATH [--device D] [--threads N] [--output DIR]\n"); return 2; }
    long id = atol(argv[2]);
    const char *dbp = NULL, *device = "cpu", *output = NULL, *jobs_dir = NULL;
    const char *roots[AC_FSAFE_MAX_ROOTS];
    int nroots = 0, threads = 2;
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--db")) dbp = argv[i + 1];
        else if (!strcmp(argv[i], "--root") && nroots < AC_FSAFE_MAX_ROOTS) roots[nroots++] = argv[i + 1];
        else if (!strcmp(argv[i], "--jobs-dir")) jobs_dir = argv[i + 1];
        else if (!strcmp(argv[i], "--device")) device = argv[i + 1];
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--output")) output = argv[i + 1];
    }
    if (!dbp || id <= 0) { fprintf(stderr, "run-job: need a job id and --db\n"); return 2; }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1) return 3; /* parent already gone */
    sqlite3 *c;
    if (sqlite3_open_v2(dbp, &c, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) { fail("cannot open the job database"); return 1; }
    sqlite3_busy_timeout(c, 5000);
    sqlite3_stmt *st;
    json_t *spec = NULL;
    if (sqlite3_prepare_v2(c, "SELECT spec FROM jobs WHERE id = ?", -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_int64(st, 1, id);
        if (sqlite3_step(st) == SQLITE_ROW) spec = json_loads((const char *)sqlite3_column_text(st, 0), 0, NULL);
        sqlite3_finalize(st);
    }
    sqlite3_close(c);
    if (!spec) { fail("job not found in the database"); return 1; }
    static ac_job_spec js; /* 33 KB: off the stack */
    ac_err pe = {{0}};
    const char *field = NULL;
    int prc = ac_job_spec_parse(spec, &js, &field, &pe);
    json_decref(spec);
    if (prc || ac_fsafe_set_roots(roots, nroots, &pe) || ac_fsafe_check_job(&js, jobs_dir, &field, &pe)) {
        char msg[700];
        snprintf(msg, sizeof msg, "%s: %s", field ? field : "paths", pe.msg);
        fail(msg);
        return 1;
    }
    /* The default output (data_dir/jobs/ID/output) is given after the check,
     * which refuses outputs a spec points into the job directories. */
    if (!js.output[0] && output && (size_t)snprintf(js.output, sizeof js.output, "%s", output) >= sizeof js.output) {
        fail("--output: path too long");
        return 1;
    }
    fprintf(stderr, "worker for job %ld on %s (pid %d)\n", id, device, (int)getpid());
    if (!strncmp(device, "cuda:", 5)) {
        /* The slot's GPU becomes this process's CUDA device 0, which is the
         * one the engine, the table measurement and the evaluation use. */
        char vis[256];
        if (ac_cuda_pin(getenv("CUDA_VISIBLE_DEVICES"), atoi(device + 5), vis, sizeof vis)) {
            fail("cannot pin the job to its GPU slot (CUDA_VISIBLE_DEVICES)");
            return 1;
        }
        setenv("CUDA_VISIBLE_DEVICES", vis, 1);
        fprintf(stderr, "worker: CUDA_VISIBLE_DEVICES=%s\n", vis);
    }
    ac_cost_cache cache;
    costcache_file(&cache, dbp, 0); /* read-only: the daemon stores tables from the cost_table event */
    ac_job_ctx ctx = {.emit = emit_line, .ud = NULL, .cancelled = NULL, .cache = &cache, .threads = threads};
    json_t *result = NULL;
    ac_err e = {{0}};
    int rc = ac_job_run(&js, &ctx, &result, &e);
    if (rc) { fail(e.msg); return 1; }
    emit_line(NULL, "result", result);
    json_decref(result);
    return 0;
}

int measure_main(int argc, char **argv) {
    int threads = 2;
    for (int i = 2; i + 1 < argc; i += 2)
        if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
    if (threads < 1 || threads > 256) { fprintf(stderr, "measure-table: --threads must be in [1, 256]\n"); return 2; }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1) return 3;
    json_t *req = json_pack("{s:s,s:i}", "device", "cpu", "threads", threads), *table = NULL;
    ac_err e = {{0}};
    int rc = req ? ac_cost_measure_json(req, &table, &e) : ac_errf(&e, "out of memory");
    json_decref(req);
    if (rc) { fprintf(stderr, "measure-table: %s\n", e.msg); return 1; }
    char *s = json_dumps(table, JSON_COMPACT);
    json_decref(table);
    if (!s) return 1;
    puts(s);
    free(s);
    return fflush(stdout) == 0 ? 0 : 1;
}
