/*
 * http_client.h - the CLI's HTTP client for the daemon's API, over libcurl:
 * one request with a JSON or text answer, a download to a file, and one
 * server-sent-event stream read event by event. It owns nothing but what a
 * call returns (an hc_resp the caller frees with hc_resp_free). Resuming an
 * event stream after a dropped connection (Last-Event-ID) is the caller's
 * loop (remote.c): hc_sse makes one connection and reports the last id seen.
 */
#ifndef AC_HTTP_CLIENT_H
#define AC_HTTP_CLIENT_H

#include <stddef.h>

#include "autocompress.h"

typedef struct {
    const char *base;  /* "http://127.0.0.1:8321" (no trailing slash) */
    const char *token; /* bearer token, or NULL */
    long timeout_s;    /* whole-request limit of hc_request (0: none) */
} hc_conn;

typedef struct {
    long status;
    char *body; /* NUL-terminated (owned) */
    size_t len;
    char ctype[128];
    char location[512];
} hc_resp;

/* Process-wide libcurl set-up (once, before threads) and tear-down. */
int hc_global_init(ac_err *e);
void hc_global_cleanup(void);

/* method path [body JSON] [Idempotency-Key]: 0 with *r filled (any HTTP
 * status), or -1 when the server could not be reached or answered no HTTP. */
int hc_request(const hc_conn *c, const char *method, const char *path, const char *json_body, const char *idem_key,
               hc_resp *r, ac_err *e);
void hc_resp_free(hc_resp *r);

/* GET path into the file out_path (written as out_path.part, renamed when
 * complete): 0 with *status set (the file is kept only on 200), -1 when
 * unreachable or the file cannot be written. */
int hc_download(const hc_conn *c, const char *path, const char *out_path, long *status, ac_err *e);

/* One event: its id (0 when the event had none), kind and data (a JSON text).
 * Return nonzero to stop reading. */
typedef int (*hc_event_fn)(void *ud, long id, const char *kind, const char *data);

/* Read the SSE stream at path from after *last_id (sent as Last-Event-ID when
 * > 0), for at most max_ms milliseconds (0: no limit), calling fn per event
 * and updating *last_id; *retry_ms gets the
 * server's retry field when it sends one. Returns 0 when the stream ended
 * (server closed it, or fn stopped it) with *status the HTTP status (the
 * body of a non-200 answer in *err_body, owned, may be NULL), -1 when the
 * connection failed or dropped (e says why; *last_id is where to resume). */
int hc_sse(const hc_conn *c, const char *path, long *last_id, long max_ms, long *retry_ms, hc_event_fn fn, void *ud,
           long *status, char **err_body, ac_err *e);

#endif
