/*
 * conn.h - the HTTP front's own ledger of its connections, for deadlines
 * libmicrohttpd does not have: it only times out *inactivity*, which a client
 * trickling a byte every few seconds never reaches. Each connection is in a
 * phase with a start time: HEAD (waiting for a complete request head; also
 * an idle keep-alive connection), BODY (receiving the body), BUSY (being
 * answered) or SSE (an event stream, never cut). A timer on the daemon's
 * loop (every 250 ms) shuts down the socket of a connection past
 * header_timeout_s in HEAD or body_timeout_s in BODY; libmicrohttpd then
 * sees the closed socket and frees the slot. Everything here runs on the
 * loop's thread (libmicrohttpd is run from it), so there is no lock.
 *
 * The guard also keeps the API's connection cap: past max_api connections
 * that are not event streams, a new one makes it cut the connection that has
 * waited longest for its request head, so slow-header sockets cannot fill
 * the API and lock out /healthz or GET /v1/jobs (streams have their own cap
 * in sse.c).
 *
 * And the per-client cap (max_connections_per_client per client address,
 * all phases counted): a newcomer past it is cut at once. The watchdog's own
 * probe (watchdog.c) is outside all of this: it announces the address and
 * port it will connect from (guard_expect), and the one connection from
 * there is neither counted nor cut, so no client, however many sockets or
 * streams it holds, can starve the daemon's liveness check.
 */
#ifndef AC_CONN_H
#define AC_CONN_H

#include <microhttpd.h>
#include <netinet/in.h>
#include <uv.h>

enum { CONN_HEAD, CONN_BODY, CONN_BUSY, CONN_SSE };

typedef struct conn_guard conn_guard;

conn_guard *guard_new(uv_loop_t *loop, int header_timeout_s, int body_timeout_s, int max_api, int max_per_client);
/* The next connection from sa (the watchdog's probe; its bound local
 * address) is exempt from the caps and deadlines. */
void guard_expect(conn_guard *g, const struct sockaddr_in *sa);
/* Probe connections accepted so far: the watchdog's proof that the server
 * takes connections (with TLS its plain-HTTP probe gets no request through). */
long guard_probes(conn_guard *g);
/* Stops the timer; the guard is freed when its handle has closed. */
void guard_free(conn_guard *g);
/* MHD_OPTION_NOTIFY_CONNECTION callback (cls = the guard). */
void guard_notify(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code);
/* Move a connection to a phase (restarts its clock). */
void guard_phase(conn_guard *g, struct MHD_Connection *c, int phase);
/* Connections cut so far (a missed deadline, or evicted over max_api). */
long guard_cut(conn_guard *g);

#endif
