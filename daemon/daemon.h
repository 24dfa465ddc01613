/*
 * daemon.h - the state one autocompressd process shares between its HTTP
 * thread (libmicrohttpd) and its scheduler loop (libuv, main thread).
 */
#ifndef AC_DAEMON_H
#define AC_DAEMON_H

#include <stdatomic.h>
#include <uv.h>

#include "config.h"
#include "db.h"
#include "device.h"
#include "sse.h"

#define AC_VERSION "0.1.0"
#define AC_MAX_DEVICES 17

typedef struct scheduler scheduler;

typedef struct ac_daemon {
    ac_config cfg;
    db *db;
    sse_hub *hub;
    struct MHD_Daemon *mhd;
    uv_loop_t *loop;
    scheduler *sched;
    char exe[1024];
    ac_local_device devices[AC_MAX_DEVICES];
    int ndevices;
    double started_at;
    atomic_long http_requests, http_errors, jobs_submitted, events_stored;
} ac_daemon;

/* HTTP front (http.c). */
int http_start(ac_daemon *d, ac_err *e);
void http_stop(ac_daemon *d);

/* Scheduler (scheduler.c). Runs on d->loop. */
int sched_start(ac_daemon *d, ac_err *e);
/* Thread-safe: a job was queued / asked to cancel. */
void sched_notify(ac_daemon *d);
void sched_cancel(ac_daemon *d, long job);
/* Thread-safe snapshot: {"device": {"slots":n,"running":[ids]}} */
json_t *sched_status(ac_daemon *d);
/* Thread-safe: store an event, fan it out to SSE, return its id. */
long daemon_event(ac_daemon *d, long job, const char *kind, json_t *data);

/* The worker (worker.c): `autocompressd run-job ID --db PATH ...`. */
int worker_main(int argc, char **argv);

#endif
