/*
 * worker_post.h - the events of a worker that runs away from the daemon's
 * host (a Slurm node): each event is appended, with a sequence number, to
 * the job's events file on the shared file system (the durable record),
 * and a thread posts the new lines to the daemon over HTTP
 * (POST DAEMON/v1/jobs/ID/worker-events, "Authorization: Bearer" the
 * job's secret), retrying with back-off while the daemon is unreachable.
 * Sequence numbers continue those already in the file (a requeued job).
 * The daemon stores each seq once, so a line posted twice or also read
 * from the file is stored once. Lines too large for the daemon's
 * max_body_bytes (413) are not posted: the daemon reads them from the file
 * when the next posted seq shows the gap, or when the batch job ends.
 *
 * Line format: {"seq": N, "kind": K, "data": D}.
 */
#ifndef AC_WORKER_POST_H
#define AC_WORKER_POST_H

#include <jansson.h>

#include "autocompress.h"

typedef struct wpost wpost;

/* url: the daemon's base URL, or NULL to only write the file. NULL with e set. */
wpost *wpost_open(const char *events_path, const char *url, long job, const char *secret, double flush_s, ac_err *e);
/* Append one event (data borrowed) and wake the poster. */
void wpost_emit(wpost *p, const char *kind, json_t *data);
/* Deliver what is left for up to flush_s seconds, then stop; frees p. */
void wpost_close(wpost *p);

#endif
