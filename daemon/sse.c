/* sse.c - see sse.h. */
#include "sse.h"

#include "autocompress.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct sub {
    struct sub *next;
    sse_hub *hub;
    struct MHD_Connection *conn;
    long job, queued_id; /* last event id put into buf */
    ac_buf buf; /* bytes queued; buf.data[off .. buf.len) not yet read by MHD */
    size_t off;
    int suspended, done, dropped, gone;
    uv_poll_t *watch; /* the connection's socket, watched for hang-up (NULL: not watched) */
} sub;

struct sse_hub {
    uv_loop_t *loop;
    sub *subs;
    size_t max_buf;
    int count, closing, max_streams;
    long hangups;
    void (*on_resume)(void *);
    void *on_resume_arg;
};

static void wake(sub *s);

static void watch_closed(uv_handle_t *h) { free(h); }

static void unwatch(sub *s) {
    if (!s->watch) return;
    uv_close((uv_handle_t *)s->watch, watch_closed);
    s->watch = NULL;
}

/* The hang-up watch (a uv_poll on the stream's socket): a closed client
 * resumes its stream at once. */
static void on_hangup(uv_poll_t *p, int status, int events) {
    (void)status;
    (void)events;
    sub *s = p->data;
    if (s->gone) return;
    s->gone = 1;
    s->hub->hangups++;
    unwatch(s);
    wake(s);
}

sse_hub *sse_hub_new(uv_loop_t *loop, size_t max_buffer_bytes, int max_streams) {
    sse_hub *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    h->loop = loop;
    h->max_buf = max_buffer_bytes;
    h->max_streams = max_streams;
    return h;
}

void sse_hub_free(sse_hub *h) { free(h); }

/* Append bytes to a subscriber's buffer; mark it dropped on overflow. */
static void append(sub *s, const char *p, size_t n) {
    if (s->dropped || s->done) return;
    if (s->off > 0 && s->off == s->buf.len) s->off = s->buf.len = 0;
    if (s->buf.len - s->off + n > s->hub->max_buf) {
        s->dropped = 1;
        return;
    }
    if (s->buf.len + n > s->buf.cap && s->off) { /* compact first */
        ac_buf_consume(&s->buf, s->off);
        s->off = 0;
    }
    if (ac_buf_append(&s->buf, p, n, 0)) s->dropped = 1;
}

static void append_event(sub *s, long id, const char *kind, const char *data) {
    size_t need = strlen(kind) + strlen(data) + 64;
    char *tmp = malloc(need);
    if (!tmp) {
        s->dropped = 1;
        return;
    }
    int n = snprintf(tmp, need, "id: %ld\nevent: %s\ndata: %s\n\n", id, kind, data);
    append(s, tmp, (size_t)n);
    free(tmp);
    if (id > s->queued_id) s->queued_id = id;
}

static void wake(sub *s) {
    if (s->suspended) {
        s->suspended = 0;
        MHD_resume_connection(s->conn);
        if (s->hub->on_resume) s->hub->on_resume(s->hub->on_resume_arg);
    }
}

void sse_hub_on_resume(sse_hub *h, void (*fn)(void *), void *arg) {
    h->on_resume = fn;
    h->on_resume_arg = arg;
}

static ssize_t reader(void *cls, uint64_t pos, char *out, size_t max) {
    (void)pos;
    sub *s = cls;
    sse_hub *h = s->hub;
    ssize_t r;
    if (s->buf.len > s->off) {
        size_t n = s->buf.len - s->off < max ? s->buf.len - s->off : max;
        memcpy(out, s->buf.data + s->off, n);
        s->off += n;
        r = (ssize_t)n;
    } else if (s->gone) {
        r = MHD_CONTENT_READER_END_WITH_ERROR; /* the client hung up: close now */
    } else if (s->done || s->dropped || h->closing) {
        r = MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        s->suspended = 1;
        MHD_suspend_connection(s->conn);
        r = 0;
    }
    return r;
}

static void free_sub(void *cls) {
    sub *s = cls;
    sse_hub *h = s->hub;
    for (sub **p = &h->subs; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            break;
        }
    h->count--;
    unwatch(s);
    /* the connection ended before its stream did (not finished, dropped or
     * shut down): its client went away, and MHD noticed first (a write
     * failed) rather than the watcher */
    if (!s->gone && !s->done && !s->dropped && !h->closing) h->hangups++;
    ac_buf_free(&s->buf);
    free(s);
}

struct MHD_Response *sse_open(sse_hub *h, db *d, struct MHD_Connection *c, long job, long last_id, int terminal,
                              int *full) {
    *full = 0;
    sub *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->hub = h;
    s->conn = c;
    s->job = job;
    s->queued_id = last_id;
    if (h->count >= h->max_streams) {
        free(s);
        *full = 1;
        return NULL;
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci && (s->watch = malloc(sizeof *s->watch))) {
        if (uv_poll_init_socket(h->loop, s->watch, ci->connect_fd)) {
            free(s->watch); /* unwatched: libmicrohttpd sees the hang-up at the next write */
            s->watch = NULL;
        } else {
            s->watch->data = s;
            uv_poll_start(s->watch, UV_DISCONNECT, on_hangup);
        }
    }
    s->next = h->subs;
    h->subs = s;
    h->count++;
    /* Registered before the replay: a publish cannot slip between the query
     * and the registration (ids make the merge exact). */
    append(s, "retry: 2000\n\n", 13);
    long after = last_id;
    for (;;) {
        db_event *evs = NULL;
        int n = 0;
        ac_err e;
        if (db_events(d, job, after, 500, &evs, &n, &e)) break;
        for (int i = 0; i < n; i++) {
            append_event(s, evs[i].id, evs[i].kind, evs[i].data);
            after = evs[i].id;
        }
        db_events_free(evs, n);
        if (n < 500 || s->dropped) break;
    }
    if (terminal) s->done = 1;
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, reader, s, free_sub);
    if (!r) {
        s->done = 1; /* not a hang-up */
        free_sub(s);
        return NULL;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    return r;
}

void sse_publish(sse_hub *h, long job, long id, const char *kind, const char *data) {
    for (sub *s = h->subs; s; s = s->next)
        if (s->job == job && id > s->queued_id) {
            append_event(s, id, kind, data);
            wake(s);
        }
}

void sse_finish(sse_hub *h, long job) {
    for (sub *s = h->subs; s; s = s->next)
        if (s->job == job) {
            s->done = 1;
            wake(s);
        }
}

void sse_keepalive(sse_hub *h) {
    for (sub *s = h->subs; s; s = s->next) {
        append(s, ": keep-alive\n\n", 14);
        wake(s);
    }
}

void sse_shutdown(sse_hub *h) {
    h->closing = 1;
    for (sub *s = h->subs; s; s = s->next) {
        s->done = 1;
        wake(s);
    }
}

long sse_hangups(sse_hub *h) { return h->hangups; }

int sse_count(sse_hub *h) { return h->count; }
