/*
 * daemon.h - the state of one autocompressd process: its libuv loop (main
 * thread) runs the scheduler and the HTTP server (libmicrohttpd).
 */
#ifndef AC_DAEMON_H
#define AC_DAEMON_H

#include <stdatomic.h>
#include <uv.h>

#include "config.h"
#include "db.h"
#include "autocompress.h"
#include "sse.h"

#define AC_VERSION "0.1.0"
#define AC_MAX_DEVICES 17

typedef struct scheduler scheduler;
typedef struct conn_guard conn_guard;

typedef struct ac_daemon {
    ac_config cfg;
    db *db;
    sse_hub *hub;
    struct MHD_Daemon *mhd;
    conn_guard *guard;  /* header / body deadlines */
    int schema_version; /* read once at start: /healthz takes no lock */
    char data_dir_abs[1024];
    uv_loop_t *loop;
    scheduler *sched;
    char exe[1024];
    ac_local_device devices[AC_MAX_DEVICES];
    int ndevices;
    double started_at;
    atomic_long http_requests, http_errors, jobs_submitted, events_stored;
    atomic_llong http_beat_ms; /* the HTTP server's last request (watchdog.c) */
} ac_daemon;

/* HTTP front (http.c). */
int http_start(ac_daemon *d, ac_err *e);
/* Stop serving: streams end; libmicrohttpd stops at once, or (offloaded
 * work still on the thread pool) when the last of it has come back. */
void http_stop(ac_daemon *d);
/* Test hook (SIGUSR2 with AUTOCOMPRESSD_TEST_HOOKS=1): stop / restart
 * running libmicrohttpd from the loop, so the HTTP side stops answering
 * while the loop runs on. */
void http_freeze(ac_daemon *d, int frozen);

/* Scheduler (scheduler.c). Runs on d->loop; every call below is made from the loop. */
int sched_start(ac_daemon *d, ac_err *e);
/* A job was queued / asked to cancel. */
void sched_notify(ac_daemon *d);
void sched_cancel(ac_daemon *d, long job);
/* DATA_DIR/jobs/ID/checkpoint: the job's stage checkpoints, written by its
 * worker (local or on a Slurm node) and read again when the job runs again. */
void sched_checkpoint_dir(const ac_daemon *d, long job, char *out, size_t n);
/* The job ended without its result (failed, cancelled): it never runs
 * again, so its distilled students (a whole fp32 model per arm) go. */
void sched_release_checkpoints(const ac_daemon *d, long job);
/* Snapshot: {"device": {"slots":n,"running":[ids]}} */
json_t *sched_status(ac_daemon *d);
/* How workers' memory is limited ("cgroup", "rlimit", "none"), *mib each (wlimit.h). */
const char *sched_worker_memory(ac_daemon *d, long *mib);
/* 1 when the scheduler could not record a job's state (the
 * write is retried each tick), with the reason in msg. */
int sched_degraded(ac_daemon *d, char *msg, size_t n);
/* Cost-table measurements, scheduled like jobs on a CPU slot.
 * sched_measure: 0 queued (*id), 1 one for that key is already queued or
 * running, 2 too many (why says which). */
int sched_measure(ac_daemon *d, const json_t *req, const char *key, long *id, char *why, size_t n);
/* 0 cancelling, 1 already ended, -1 unknown id. */
int sched_measure_cancel(ac_daemon *d, long id);
json_t *sched_measurements(ac_daemon *d);
/* The worker side of a measurement: `autocompressd measure-table --threads N`. */
int measure_main(int argc, char **argv);
/* The event bus (events.c). On the loop's thread: store a job's progress event
 * (data is consumed) and fan it out to the job's SSE subscribers; returns
 * its id, or -1 when it could not be stored. */
long daemon_event(ac_daemon *d, long job, const char *kind, json_t *data);
/* The job ended: its subscribers close after draining. */
void events_finish(ac_daemon *d, long job);

/* systemd (watchdog.c): sd_notify, and WATCHDOG=1 every usec/2 from the
 * loop while the HTTP side answers too. */
void wd_notify(const char *msg);
int wd_start(ac_daemon *d, long long usec);
void wd_stop(void);
long long wd_now_ms(void);

/* The worker (worker.c): `autocompressd run-job ID --db PATH ...`. */
int worker_main(int argc, char **argv);

#endif
