/*
 * sse.h - server-sent event streams of job progress.
 *
 * Each subscriber (one HTTP connection) owns a bounded buffer of serialized
 * events. The MHD content reader drains it, or suspends the connection when
 * it is empty; the publisher (the event bus, events.c) appends and resumes.
 * A subscriber whose buffer overflows is dropped (the client reconnects
 * with Last-Event-ID and replays from SQLite). A keep-alive tick resumes
 * every subscriber with a comment line.
 *
 * A suspended connection is not polled by libmicrohttpd, so a client that
 * goes away would hold its slot until the next write. The hub watches every
 * stream's socket itself (a uv_poll for UV_DISCONNECT on the daemon's loop):
 * a hang-up marks the subscriber gone and resumes it, and the reader ends
 * the response at once. Streams are capped (max_streams) apart from API
 * connections.
 *
 * Everything here runs on the loop's thread (libmicrohttpd is run from it
 * too), so the hub has no lock.
 */
#ifndef AC_SSE_H
#define AC_SSE_H

#include <microhttpd.h>
#include <uv.h>

#include "db.h"

typedef struct sse_hub sse_hub;

/* NULL out of memory. Hang-ups are watched on loop. */
sse_hub *sse_hub_new(uv_loop_t *loop, size_t max_buffer_bytes, int max_streams);
void sse_hub_free(sse_hub *h);
/* fn(arg) after a stream's connection is resumed, so the HTTP server runs it. */
void sse_hub_on_resume(sse_hub *h, void (*fn)(void *), void *arg);

/* A streaming response for job `job`, replaying events with id > last_id
 * from the database first. `terminal`: the job has already ended (the
 * stream closes after the replay). NULL on allocation failure, or with
 * *full set when max_streams are open. */
struct MHD_Response *sse_open(sse_hub *h, db *d, struct MHD_Connection *c, long job, long last_id, int terminal,
                              int *full);

/* Publish a stored event to the job's subscribers. */
void sse_publish(sse_hub *h, long job, long event_id, const char *kind, const char *data_json);
/* The job ended: subscribers close after draining. */
void sse_finish(sse_hub *h, long job);
/* Send ": keep-alive" to every subscriber. */
void sse_keepalive(sse_hub *h);
/* Close every stream (before MHD_stop_daemon). */
void sse_shutdown(sse_hub *h);
int sse_count(sse_hub *h);
/* Streams ended because their client hung up: seen by the hang-up watch, or by
 * libmicrohttpd first (a write failed, the stream neither finished,
 * dropped nor shut down). */
long sse_hangups(sse_hub *h);

#endif
