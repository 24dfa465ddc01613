/*
 * sse.h - server-sent event streams of job progress.
 *
 * Each subscriber (one HTTP connection) owns a bounded buffer of serialized
 * events. The MHD content reader drains it, or suspends the connection when
 * it is empty; the publisher (scheduler thread) appends and resumes under
 * the hub lock. A subscriber whose buffer overflows is dropped (the client
 * reconnects with Last-Event-ID and replays from SQLite). A keep-alive tick
 * resumes every subscriber with a comment line so dead clients are noticed.
 */
#ifndef AC_SSE_H
#define AC_SSE_H

#include <microhttpd.h>

#include "db.h"

typedef struct sse_hub sse_hub;

sse_hub *sse_hub_new(size_t max_buffer_bytes);
void sse_hub_free(sse_hub *h);

/* A streaming response for job `job`, replaying events with id > last_id
 * from the database first. `terminal`: the job has already ended (the
 * stream closes after the replay). NULL on allocation failure. */
struct MHD_Response *sse_open(sse_hub *h, db *d, struct MHD_Connection *c, long job, long last_id, int terminal);

/* Publish a stored event to the job's subscribers. */
void sse_publish(sse_hub *h, long job, long event_id, const char *kind, const char *data_json);
/* The job ended: subscribers close after draining. */
void sse_finish(sse_hub *h, long job);
/* Send ": keep-alive" to every subscriber. */
void sse_keepalive(sse_hub *h);
/* Close every stream (before MHD_stop_daemon). */
void sse_shutdown(sse_hub *h);
int sse_count(sse_hub *h);

#endif
