/*
 * autocompressd - the AutoCompress daemon.
 *   autocompressd [--config FILE] [--listen HOST:PORT] [--db PATH] [--data-dir DIR] [--web-dir DIR]
 *   autocompressd run-job ID ...                (the worker, its spec on stdin; see worker.c)
 *   autocompressd token add USER --role ROLE | list | revoke ID   (users' API tokens; see auth.h)
 *   autocompressd --openapi                   (the OpenAPI document it serves; openapi.h)
 * Runs in the foreground, logs to stderr; SIGTERM/SIGINT stop it: running
 * jobs are stopped and re-queued, so a restart picks them up again.
 *
 * Under systemd (Type=notify) it sends READY=1 once it listens, WATCHDOG=1
 * from a timer on the loop at half of WatchdogSec while the HTTP server
 * answers too (so a frozen loop or a wedged HTTP side is restarted;
 * watchdog.c), STOPPING=1 on SIGTERM.
 *
 * It refuses to listen on a non-loopback address without tokens (in the
 * config or the store): an unauthenticated API is only ever reachable from
 * this host, and off loopback every request needs a token even when all of
 * the store's are revoked.
 * AUTOCOMPRESS_TOKEN (environment) adds a token, for containers.
 */
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "auth.h"
#include "daemon.h"
#include "autocompress.h"
#include "openapi.h"

void sched_stop(ac_daemon *d);
int sched_busy(ac_daemon *d);
void sched_close(ac_daemon *d);
void sched_free(ac_daemon *d);

static ac_daemon D;
static uv_signal_t sig_term, sig_int;
static uv_signal_t sig_usr2;
static uv_timer_t drain_timer;

/* Test hook (AUTOCOMPRESSD_TEST_HOOKS=1): SIGUSR2 freezes / thaws the HTTP side. */
static int http_frozen;
static void on_test_freeze(uv_signal_t *s, int signum) {
    (void)s;
    (void)signum;
    http_frozen = !http_frozen;
    http_freeze(&D, http_frozen);
    fprintf(stderr, "autocompressd: test hook: HTTP side %s\n", http_frozen ? "frozen" : "thawed");
}

static void on_drain(uv_timer_t *t) {
    if (sched_busy(&D)) return;
    uv_timer_stop(t);
    uv_close((uv_handle_t *)t, NULL);
    uv_close((uv_handle_t *)&sig_term, NULL);
    uv_close((uv_handle_t *)&sig_int, NULL);
    sched_close(&D);
}

static void on_signal(uv_signal_t *s, int signum) {
    (void)s;
    static int once;
    if (once++) return;
    fprintf(stderr, "autocompressd: signal %d: stopping (running jobs are re-queued)\n", signum);
    wd_notify("STOPPING=1");
    http_freeze(&D, 0);
    wd_stop();
    if (sig_usr2.loop) uv_close((uv_handle_t *)&sig_usr2, NULL);
    http_stop(&D);
    sched_stop(&D);
    uv_timer_init(D.loop, &drain_timer);
    uv_timer_start(&drain_timer, on_drain, 0, 50);
}

/* --openapi: the document, as served, on stdout (proto/openapi.json is this output). */
static int print_openapi(ac_err *e) {
    json_t *doc = openapi_doc(e);
    char *s = doc ? json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(doc);
    if (!s) {
        fprintf(stderr, "autocompressd: %s\n", doc ? "out of memory" : e->msg);
        return 1;
    }
    printf("%s\n", s);
    free(s);
    return 0;
}

static int usage(void) {
    fprintf(stderr,
            "usage: autocompressd [--config FILE] [--listen HOST:PORT] [--db PATH] [--data-dir DIR] [--web-dir DIR]\n"
            "       autocompressd run-job ID [--device D] [--threads N] [--output DIR] < input.json\n"
            "       autocompressd token add USER --role read|submit|admin | list | revoke ID [--config FILE] [--db PATH]\n"
            "       autocompressd --openapi   (the OpenAPI document GET /openapi.json serves, on stdout)\n");
    return 2;
}

/* The configuration: the file (--config), then the flags. 0, 1 (an error, said), 2 (usage). */
static int configure(int argc, char **argv, ac_err *e) {
    config_defaults(&D.cfg);
    const char *cfgfile = NULL;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--config") && i + 1 < argc) cfgfile = argv[++i];
    if (cfgfile && config_load(&D.cfg, cfgfile, e)) return 1;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--config") && v)
            i++;
        else if (!strcmp(argv[i], "--listen") && v) {
            if (config_listen(&D.cfg, argv[++i], e)) return 1;
        } else if (!strcmp(argv[i], "--db") && v)
            snprintf(D.cfg.db_path, sizeof D.cfg.db_path, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--data-dir") && v)
            snprintf(D.cfg.data_dir, sizeof D.cfg.data_dir, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--web-dir") && v)
            snprintf(D.cfg.web_dir, sizeof D.cfg.web_dir, "%s", argv[++i]);
        else
            return 2;
    }
    ssize_t n = readlink("/proc/self/exe", D.exe, sizeof D.exe - 1);
    if (n <= 0) return ac_errf(e, "cannot find own executable"), 1;
    D.exe[n] = 0;
    if (!D.cfg.web_dir[0]) {
        char dir[900];
        snprintf(dir, sizeof dir, "%.899s", D.exe);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        snprintf(D.cfg.web_dir, sizeof D.cfg.web_dir, "%s/../web", dir);
        if (access(D.cfg.web_dir, R_OK) != 0)
            snprintf(D.cfg.web_dir, sizeof D.cfg.web_dir, "/usr/share/autocompress/web");
    }
    const char *envtok = getenv("AUTOCOMPRESS_TOKEN");
    if (envtok && *envtok) {
        if (strlen(envtok) < 16 || D.cfg.ntokens >= AC_MAX_TOKENS)
            return ac_errf(e, "AUTOCOMPRESS_TOKEN must have at least 16 characters"), 1;
        if (!(D.cfg.tokens[D.cfg.ntokens++] = strdup(envtok))) return ac_errf(e, "out of memory"), 1;
    }
    return ac_fsafe_set_roots((const char *const *)D.cfg.model_roots, D.cfg.nroots, e) ? 1 : 0;
}

/* A job interrupted by the daemon's stop that will not run again (its
 * attempts used up, policy fail, or cancelled): the distilled students its
 * checkpoints kept go, as a failed or cancelled job's do. */
static void recovered_ended(void *ud, long job) { sched_release_checkpoints(ud, job); }

/* Open the store (recovering interrupted jobs), the hub, the scheduler and the HTTP front. */
static int start(ac_err *e) {
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN); /* a file-size limit is a failed write (EFBIG), not death */
    struct rlimit nofile;     /* event streams need descriptors: raise the soft limit to the hard one */
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
        nofile.rlim_cur = nofile.rlim_max;
        setrlimit(RLIMIT_NOFILE, &nofile);
    }
    mkdir(D.cfg.data_dir, 0755);
    char *abs = realpath(D.cfg.data_dir, NULL);
    snprintf(D.data_dir_abs, sizeof D.data_dir_abs, "%s", abs ? abs : D.cfg.data_dir);
    free(abs);
    D.started_at = ac_now();
    if (db_open(D.cfg.db_path, &D.db, e)) return -1;
    int live = db_tokens_live(D.db, e);
    if (live < 0) return -1;
    if (!config_is_loopback(D.cfg.listen_host) && D.cfg.ntokens == 0 && !live)
        return ac_errf(e,
                       "refusing to serve an unauthenticated API on %s: set \"tokens\" in the config (or "
                       "AUTOCOMPRESS_TOKEN), add one with `autocompressd token add`, or listen on 127.0.0.1",
                       D.cfg.listen_host);
    int rec = db_recover(D.db, D.cfg.interrupted_policy, D.cfg.max_attempts, recovered_ended, &D, e);
    if (rec < 0) return -1;
    if (rec > 0)
        fprintf(stderr, "autocompressd: recovered %d interrupted job(s) (policy %s)\n", rec, D.cfg.interrupted_policy);
    D.schema_version = db_schema_version(D.db);
    D.ndevices = ac_devices_local(D.devices, AC_MAX_DEVICES);
    D.loop = uv_default_loop();
    D.hub = sse_hub_new(D.loop, D.cfg.sse_buffer_bytes, D.cfg.max_sse_streams);
    if (!D.hub) return ac_errf(e, "cannot start the event-stream hub");
    if (sched_start(&D, e) || http_start(&D, e)) return -1;
    for (int i = 0; i < D.ndevices; i++) fprintf(stderr, "autocompressd: device %s\n", D.devices[i].name);
    fprintf(stderr, "autocompressd %s listening on %s://%s:%d (db %s, schema v%d, data %s)\n", AC_VERSION,
            D.cfg.tls_cert[0] ? "https" : "http", D.cfg.listen_host, D.cfg.listen_port, D.cfg.db_path, db_schema_version(D.db), D.cfg.data_dir);
    uv_signal_init(D.loop, &sig_term);
    uv_signal_start(&sig_term, on_signal, SIGTERM);
    uv_signal_init(D.loop, &sig_int);
    uv_signal_start(&sig_int, on_signal, SIGINT);
    const char *wd = getenv("WATCHDOG_USEC"), *wpid = getenv("WATCHDOG_PID");
    long long wd_us = wd ? atoll(wd) : 0;
    if (wpid && atol(wpid) != (long)getpid()) wd_us = 0;
    if (wd_us > 0 && wd_start(&D, wd_us)) return ac_errf(e, "cannot start the watchdog timer");
    const char *hooks = getenv("AUTOCOMPRESSD_TEST_HOOKS");
    if (hooks && !strcmp(hooks, "1")) {
        uv_signal_init(D.loop, &sig_usr2);
        uv_signal_start(&sig_usr2, on_test_freeze, SIGUSR2);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "run-job")) return worker_main(argc, argv);
    if (argc > 1 && !strcmp(argv[1], "measure-table")) return measure_main(argc, argv);
    if (argc > 1 && !strcmp(argv[1], "token")) return token_main(argc, argv);
    ac_err e = {{0}};
    if (argc == 2 && !strcmp(argv[1], "--openapi")) return print_openapi(&e);
    int rc = configure(argc, argv, &e);
    if (rc == 2) return usage();
    if (rc || start(&e)) {
        fprintf(stderr, "autocompressd: %s\n", e.msg);
        return 1;
    }
    wd_notify("READY=1");
    uv_run(D.loop, UV_RUN_DEFAULT);
    http_stop(&D);
    sched_free(&D);
    uv_loop_close(D.loop);
    db_close(D.db);
    sse_hub_free(D.hub);
    config_free(&D.cfg);
    ac_fsafe_set_roots(NULL, 0, &e);
    fprintf(stderr, "autocompressd: stopped\n");
    return 0;
}
