/* sse.c - see sse.h. */
#include "sse.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

typedef struct sub {
    struct sub *next;
    sse_hub *hub;
    struct MHD_Connection *conn;
    long job, queued_id; /* last event id put into buf */
    char *buf;
    size_t len, off, cap;
    int suspended, done, dropped, gone;
    int fd;               /* the connection's socket, watched for hang-up */
    unsigned long serial; /* epoll tag: a freed sub is never touched */
} sub;

struct sse_hub {
    pthread_mutex_t mu;
    sub *subs;
    size_t max_buf;
    int count, closing, max_streams;
    int epfd, stop_pipe[2];
    unsigned long next_serial;
    long hangups;
    void (*on_resume)(void *);
    void *on_resume_arg;
    pthread_t watcher;
};

static void wake(sub *s);

/* The hang-up watcher: a closed client resumes its stream at once. */
static void *watch(void *arg) {
    sse_hub *h = arg;
    struct epoll_event ev[64];
    for (;;) {
        int n = epoll_wait(h->epfd, ev, 64, -1);
        if (n < 0) continue;
        pthread_mutex_lock(&h->mu);
        for (int i = 0; i < n; i++) {
            if (ev[i].data.u64 == 0) {
                pthread_mutex_unlock(&h->mu);
                return NULL;
            } /* stop pipe */
            for (sub *s = h->subs; s; s = s->next)
                if (s->serial == ev[i].data.u64 && !s->gone) {
                    s->gone = 1;
                    h->hangups++;
                    epoll_ctl(h->epfd, EPOLL_CTL_DEL, s->fd, NULL);
                    wake(s);
                }
        }
        pthread_mutex_unlock(&h->mu);
    }
}

sse_hub *sse_hub_new(size_t max_buffer_bytes, int max_streams) {
    sse_hub *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    h->max_buf = max_buffer_bytes;
    h->max_streams = max_streams;
    h->next_serial = 1;
    h->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (h->epfd < 0 || pipe2(h->stop_pipe, O_CLOEXEC)) {
        if (h->epfd >= 0) close(h->epfd);
        free(h);
        return NULL;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 0};
    pthread_mutex_init(&h->mu, NULL);
    if (epoll_ctl(h->epfd, EPOLL_CTL_ADD, h->stop_pipe[0], &ev) || pthread_create(&h->watcher, NULL, watch, h)) {
        close(h->epfd);
        close(h->stop_pipe[0]);
        close(h->stop_pipe[1]);
        pthread_mutex_destroy(&h->mu);
        free(h);
        return NULL;
    }
    return h;
}

void sse_hub_free(sse_hub *h) {
    if (!h) return;
    if (write(h->stop_pipe[1], "x", 1) == 1) pthread_join(h->watcher, NULL);
    close(h->epfd);
    close(h->stop_pipe[0]);
    close(h->stop_pipe[1]);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

/* Append bytes to a subscriber's buffer; mark it dropped on overflow. Lock held. */
static void append(sub *s, const char *p, size_t n) {
    if (s->dropped || s->done) return;
    if (s->off > 0 && s->off == s->len) s->off = s->len = 0;
    if (s->len - s->off + n > s->hub->max_buf) {
        s->dropped = 1;
        return;
    }
    if (s->len + n > s->cap) {
        if (s->off) { /* compact first */
            memmove(s->buf, s->buf + s->off, s->len - s->off);
            s->len -= s->off;
            s->off = 0;
        }
        size_t nc = s->cap ? s->cap : 4096;
        while (nc < s->len + n) nc *= 2;
        char *nb = realloc(s->buf, nc);
        if (!nb) {
            s->dropped = 1;
            return;
        }
        s->buf = nb;
        s->cap = nc;
    }
    memcpy(s->buf + s->len, p, n);
    s->len += n;
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
    pthread_mutex_lock(&h->mu);
    ssize_t r;
    if (s->len > s->off) {
        size_t n = s->len - s->off < max ? s->len - s->off : max;
        memcpy(out, s->buf + s->off, n);
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
    pthread_mutex_unlock(&h->mu);
    return r;
}

static void free_sub(void *cls) {
    sub *s = cls;
    sse_hub *h = s->hub;
    pthread_mutex_lock(&h->mu);
    for (sub **p = &h->subs; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            break;
        }
    h->count--;
    if (!s->gone && s->fd >= 0) epoll_ctl(h->epfd, EPOLL_CTL_DEL, s->fd, NULL);
    /* the connection ended before its stream did (not finished, dropped or
     * shut down): its client went away, and MHD noticed first (a write
     * failed) rather than the watcher */
    if (!s->gone && !s->done && !s->dropped && !h->closing) h->hangups++;
    pthread_mutex_unlock(&h->mu);
    free(s->buf);
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
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    s->fd = ci ? ci->connect_fd : -1;
    pthread_mutex_lock(&h->mu);
    if (h->count >= h->max_streams) {
        pthread_mutex_unlock(&h->mu);
        free(s);
        *full = 1;
        return NULL;
    }
    s->serial = h->next_serial++;
    if (s->fd >= 0) {
        struct epoll_event ev = {.events = EPOLLRDHUP | EPOLLHUP | EPOLLERR, .data.u64 = s->serial};
        if (epoll_ctl(h->epfd, EPOLL_CTL_ADD, s->fd, &ev)) s->fd = -1;
    }
    s->next = h->subs;
    h->subs = s;
    h->count++;
    /* Replay under the lock so a concurrent publish cannot slip between the
     * query and the registration (ids make the merge exact). */
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
    pthread_mutex_unlock(&h->mu);
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
    pthread_mutex_lock(&h->mu);
    for (sub *s = h->subs; s; s = s->next)
        if (s->job == job && id > s->queued_id) {
            append_event(s, id, kind, data);
            wake(s);
        }
    pthread_mutex_unlock(&h->mu);
}

void sse_finish(sse_hub *h, long job) {
    pthread_mutex_lock(&h->mu);
    for (sub *s = h->subs; s; s = s->next)
        if (s->job == job) {
            s->done = 1;
            wake(s);
        }
    pthread_mutex_unlock(&h->mu);
}

void sse_keepalive(sse_hub *h) {
    pthread_mutex_lock(&h->mu);
    for (sub *s = h->subs; s; s = s->next) {
        append(s, ": keep-alive\n\n", 14);
        wake(s);
    }
    pthread_mutex_unlock(&h->mu);
}

void sse_shutdown(sse_hub *h) {
    pthread_mutex_lock(&h->mu);
    h->closing = 1;
    for (sub *s = h->subs; s; s = s->next) {
        s->done = 1;
        wake(s);
    }
    pthread_mutex_unlock(&h->mu);
}

long sse_hangups(sse_hub *h) {
    pthread_mutex_lock(&h->mu);
    long n = h->hangups;
    pthread_mutex_unlock(&h->mu);
    return n;
}

int sse_count(sse_hub *h) {
    pthread_mutex_lock(&h->mu);
    int n = h->count;
    pthread_mutex_unlock(&h->mu);
    return n;
}
