/*
 * events.c - the daemon's event bus: a job's progress events (from its
 * worker, the scheduler or the API) are stored in SQLite first, for replay
 * with Last-Event-ID, then fanned out to the job's live SSE subscribers
 * (sse.c). One entry point for every producer, all on the daemon's loop
 * (the scheduler, the HTTP handlers, offloaded work's last step).
 */
#include <stdio.h>
#include <stdlib.h>

#include "daemon.h"

long daemon_event(ac_daemon *d, long job, const char *kind, json_t *data) {
    char *s = json_dumps(data, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(data);
    if (!s) return -1;
    ac_err e = {{0}};
    long id = db_event_insert(d->db, job, kind, s, &e);
    if (id > 0) {
        atomic_fetch_add(&d->events_stored, 1);
        sse_publish(d->hub, job, id, kind, s);
    } else {
        fprintf(stderr, "autocompressd: job %ld: cannot store event: %s\n", job, e.msg);
    }
    free(s);
    return id;
}

void events_finish(ac_daemon *d, long job) { sse_finish(d->hub, job); }
