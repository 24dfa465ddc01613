/* worker_post.c - see worker_post.h. */
#include "worker_post.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define POST_MAX_LINES 256
#define POST_MAX_BYTES (256u << 10) /* well under the daemon's max_body_bytes (1 MB by default) */

struct wpost {
    FILE *f;          /* the events file, appended */
    char path[1100];
    char url[700];    /* .../v1/jobs/ID/worker-events, "" when none */
    char auth[200];   /* "Authorization: Bearer ..." */
    long seq;         /* the last seq written */
    long written;     /* bytes in the file (complete lines) */
    long sent;        /* bytes of it the daemon has */
    int closing, gave_up;
    double flush_s;
    pthread_t th;
    int has_thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The last seq in an existing file and its length up to its last newline. */
static void scan_file(const char *path, long *seq, long *len) {
    *seq = 0;
    *len = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long off = 0;
    while ((n = getline(&line, &cap, f)) > 0) {
        if (line[n - 1] != '\n') break; /* a partial last line: cut off below */
        off += n;
        json_t *j = json_loadb(line, (size_t)n, 0, NULL);
        long s = (long)json_integer_value(json_object_get(j, "seq"));
        if (s > *seq) *seq = s;
        json_decref(j);
    }
    free(line);
    fclose(f);
    *len = off;
}

static size_t sink(char *p, size_t s, size_t n, void *ud) {
    (void)p;
    (void)ud;
    return s * n;
}

/* POST the lines [from, end of complete lines): the HTTP status (0: no
 * answer), *upto the offset posted through. */
static long post_range(wpost *p, long from, long to, long *upto) {
    FILE *f = fopen(p->path, "r");
    if (!f) return 0;
    if (fseek(f, from, SEEK_SET)) {
        fclose(f);
        return 0;
    }
    json_t *arr = json_array();
    char *line = NULL;
    size_t cap = 0, bytes = 0;
    ssize_t n;
    long off = from;
    while (off < to && json_array_size(arr) < POST_MAX_LINES && bytes < POST_MAX_BYTES &&
           (n = getline(&line, &cap, f)) > 0 && line[n - 1] == '\n') {
        off += n;
        bytes += (size_t)n;
        json_t *j = json_loadb(line, (size_t)n, 0, NULL);
        if (j) json_array_append_new(arr, j);
    }
    free(line);
    fclose(f);
    *upto = off;
    json_t *body = json_pack("{s:o}", "events", arr);
    char *s = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!s) return 0;
    long code = 0;
    CURL *c = curl_easy_init();
    if (c) {
        struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
        h = curl_slist_append(h, p->auth);
        curl_easy_setopt(c, CURLOPT_URL, p->url);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, s);
        curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 5L);
        curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink);
        if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
        curl_slist_free_all(h);
        curl_easy_cleanup(c);
    }
    free(s);
    return code;
}

static void *poster(void *arg) {
    wpost *p = arg;
    double backoff = 0.2, deadline = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->closing && p->sent >= p->written) pthread_cond_wait(&p->cv, &p->mu);
        if (p->closing && !deadline) deadline = mono() + p->flush_s;
        if (p->sent >= p->written || p->gave_up || (deadline && mono() > deadline)) break;
        long from = p->sent, to = p->written, upto = from;
        pthread_mutex_unlock(&p->mu);
        long code = post_range(p, from, to, &upto);
        pthread_mutex_lock(&p->mu);
        if (code == 200) {
            p->sent = upto;
            backoff = 0.2;
        } else if (code == 413) {
            /* larger than the daemon takes (max_body_bytes): skipped here, the
             * daemon reads these lines from the file when it sees the gap */
            fprintf(stderr, "worker: events of %ld bytes are too large to post; the daemon reads them from %s\n",
                    upto - from, p->path);
            p->sent = upto;
        } else if (code >= 400 && code < 500) {
            /* 409: the job has ended (cancelled, failed by Slurm); 401 / 404:
             * not ours. The daemon will not take these: the file keeps them. */
            fprintf(stderr, "worker: the daemon refused the job's events (HTTP %ld); they stay in %s\n", code,
                    p->path);
            p->gave_up = 1;
        } else {
            if (backoff <= 0.2)
                fprintf(stderr, "worker: cannot deliver events to %s (HTTP %ld); retrying\n", p->url, code);
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            double until = ts.tv_sec + ts.tv_nsec * 1e-9 + backoff;
            ts.tv_sec = (time_t)until;
            ts.tv_nsec = (long)((until - (double)ts.tv_sec) * 1e9);
            pthread_cond_timedwait(&p->cv, &p->mu, &ts);
            backoff = backoff * 2 > 5 ? 5 : backoff * 2;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

wpost *wpost_open(const char *events_path, const char *url, long job, const char *secret, double flush_s, ac_err *e) {
    wpost *p = calloc(1, sizeof *p);
    if (!p) return ac_errf(e, "out of memory"), NULL;
    snprintf(p->path, sizeof p->path, "%s", events_path);
    scan_file(events_path, &p->seq, &p->written);
    if (truncate(events_path, p->written) && errno != ENOENT) { /* drop a partial last line */
        ac_errf(e, "cannot truncate %s: %s", events_path, strerror(errno));
        free(p);
        return NULL;
    }
    p->f = fopen(events_path, "a");
    if (!p->f) {
        ac_errf(e, "cannot open %s: %s", events_path, strerror(errno));
        free(p);
        return NULL;
    }
    p->flush_s = flush_s;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (url && *url) {
        size_t ul = strlen(url);
        while (ul && url[ul - 1] == '/') ul--;
        snprintf(p->url, sizeof p->url, "%.*s/v1/jobs/%ld/worker-events", (int)ul, url, job);
        snprintf(p->auth, sizeof p->auth, "Authorization: Bearer %s", secret ? secret : "");
    }
    /* Lines from an earlier run of this job (a requeue) were seen, or will
     * be read from the file by the daemon: post only new ones. */
    p->sent = p->written;
    if (p->url[0]) {
        curl_global_init(CURL_GLOBAL_DEFAULT);
        p->has_thread = pthread_create(&p->th, NULL, poster, p) == 0;
    }
    return p;
}

void wpost_emit(wpost *p, const char *kind, json_t *data) {
    pthread_mutex_lock(&p->mu);
    json_t *ev = json_pack("{s:I,s:s,s:O}", "seq", (json_int_t)(p->seq + 1), "kind", kind, "data", data);
    char *s = ev ? json_dumps(ev, JSON_COMPACT) : NULL;
    json_decref(ev);
    if (s) {
        size_t n = strlen(s);
        if (fwrite(s, 1, n, p->f) == n && fputc('\n', p->f) != EOF && fflush(p->f) == 0) {
            p->seq++;
            p->written += (long)n + 1;
            pthread_cond_signal(&p->cv);
        } else
            fprintf(stderr, "worker: cannot write %s: %s\n", p->path, strerror(errno));
        free(s);
    }
    pthread_mutex_unlock(&p->mu);
}

void wpost_close(wpost *p) {
    if (!p) return;
    fflush(p->f);
    fsync(fileno(p->f));
    fclose(p->f);
    pthread_mutex_lock(&p->mu);
    p->closing = 1;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (p->has_thread) pthread_join(p->th, NULL);
    if (p->url[0]) curl_global_cleanup();
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}
