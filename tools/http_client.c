/* http_client.c - see http_client.h. */
#include "http_client.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "autocompress.h"

#define HC_MAX_BODY ((size_t)1 << 30)

int hc_global_init(ac_err *e) {
    CURLcode rc = curl_global_init(CURL_GLOBAL_DEFAULT);
    return rc == CURLE_OK ? 0 : ac_errf(e, "libcurl: %s", curl_easy_strerror(rc));
}

void hc_global_cleanup(void) { curl_global_cleanup(); }

void hc_resp_free(hc_resp *r) {
    free(r->body);
    memset(r, 0, sizeof *r);
}

static size_t write_buf(char *p, size_t sz, size_t n, void *ud) {
    return ac_buf_append(ud, p, sz * n, HC_MAX_BODY) ? 0 : sz * n;
}

/* Copy a header's value (trimmed) into out when the line is "name: value". */
static void header_value(const char *line, size_t n, const char *name, char *out, size_t cap) {
    size_t nl = strlen(name);
    if (n <= nl || strncasecmp(line, name, nl) || line[nl] != ':') return;
    const char *v = line + nl + 1, *end = line + n;
    while (v < end && (*v == ' ' || *v == '\t')) v++;
    while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ')) end--;
    size_t k = (size_t)(end - v) < cap - 1 ? (size_t)(end - v) : cap - 1;
    memcpy(out, v, k);
    out[k] = 0;
}

static size_t on_header(char *p, size_t sz, size_t n, void *ud) {
    hc_resp *r = ud;
    header_value(p, sz * n, "Content-Type", r->ctype, sizeof r->ctype);
    header_value(p, sz * n, "Location", r->location, sizeof r->location);
    return sz * n;
}

/* A handle for base+path with the common options and headers (*hl owned by the caller). */
static CURL *open_handle(const hc_conn *c, const char *path, const char *accept, int json_ctype, const char *idem_key,
                         struct curl_slist **hl, ac_err *e) {
    char url[4096];
    if ((size_t)snprintf(url, sizeof url, "%s%s", c->base, path) >= sizeof url) {
        ac_errf(e, "URL too long");
        return NULL;
    }
    CURL *h = curl_easy_init();
    if (!h) {
        ac_errf(e, "libcurl: cannot create a handle");
        return NULL;
    }
    char hdr[700];
    struct curl_slist *l = NULL;
    snprintf(hdr, sizeof hdr, "Accept: %s", accept);
    l = curl_slist_append(l, hdr);
    if (c->token && *c->token) {
        snprintf(hdr, sizeof hdr, "Authorization: Bearer %s", c->token);
        l = curl_slist_append(l, hdr);
    }
    if (json_ctype) l = curl_slist_append(l, "Content-Type: application/json");
    if (idem_key) {
        snprintf(hdr, sizeof hdr, "Idempotency-Key: %s", idem_key);
        l = curl_slist_append(l, hdr);
    }
    *hl = l;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, l);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "autocompress-cli");
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    /* only http and https, here and on any redirect */
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    return h;
}

static int perform(CURL *h, const hc_conn *c, ac_err *e) {
    CURLcode rc = curl_easy_perform(h);
    if (rc == CURLE_OK) return 0;
    return ac_errf(e, "%s: %s", c->base, curl_easy_strerror(rc));
}

int hc_request(const hc_conn *c, const char *method, const char *path, const char *json_body, const char *idem_key,
               hc_resp *r, ac_err *e) {
    memset(r, 0, sizeof *r);
    struct curl_slist *hl = NULL;
    /* the API wants a JSON content type on POST; DELETE has no body and needs none */
    int ctype = json_body || !strcmp(method, "POST");
    CURL *h = open_handle(c, path, "application/json", ctype, idem_key, &hl, e);
    if (!h) return -1;
    ac_buf b = {0};
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    if (!strcmp(method, "HEAD")) curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    if (json_body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, json_body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(json_body));
    }
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write_buf);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
    if (c->timeout_s > 0) curl_easy_setopt(h, CURLOPT_TIMEOUT, c->timeout_s);
    int rc = perform(h, c, e);
    if (!rc) {
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
        if (ac_buf_append(&b, "", 1, 0)) rc = ac_errf(e, "out of memory");
    }
    if (!rc) {
        r->body = b.data;
        r->len = b.len - 1;
    } else
        ac_buf_free(&b);
    curl_easy_cleanup(h);
    curl_slist_free_all(hl);
    return rc;
}

typedef struct {
    FILE *f;
    CURL *h;
    long status;
    ac_buf err; /* a non-200 body */
} dl_state;

static size_t write_file(char *p, size_t sz, size_t n, void *ud) {
    dl_state *s = ud;
    if (!s->status) curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &s->status);
    if (s->status != 200) return ac_buf_append(&s->err, p, sz * n, 1 << 20) ? 0 : sz * n;
    return fwrite(p, 1, sz * n, s->f);
}

int hc_download(const hc_conn *c, const char *path, const char *out_path, long *status, ac_err *e) {
    char part[4200];
    if ((size_t)snprintf(part, sizeof part, "%s.part", out_path) >= sizeof part) return ac_errf(e, "path too long");
    struct curl_slist *hl = NULL;
    CURL *h = open_handle(c, path, "*/*", 0, NULL, &hl, e);
    if (!h) return -1;
    dl_state s = {.f = fopen(part, "wb"), .h = h};
    int rc = -1;
    if (!s.f)
        ac_errf(e, "cannot write %s", part);
    else {
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write_file);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
        /* no whole-transfer limit for a checkpoint: a stalled one (under 1 byte/s for 60 s) fails */
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 60L);
        rc = perform(h, c, e);
        if (!rc) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &s.status);
        if (fclose(s.f) && !rc) rc = ac_errf(e, "cannot write %s", part);
        if (!rc && s.status == 200 && rename(part, out_path)) rc = ac_errf(e, "cannot rename %s", part);
        if (rc || s.status != 200) remove(part);
    }
    *status = s.status;
    ac_buf_free(&s.err);
    curl_easy_cleanup(h);
    curl_slist_free_all(hl);
    return rc;
}

/* The SSE parser over the bytes of one connection. */
typedef struct {
    CURL *h;
    long status;
    ac_buf line, data, err;
    char kind[64];
    long id, *last_id, *retry_ms;
    int has_id, stopped, oom;
    hc_event_fn fn;
    void *ud;
} sse_state;

/* One line of the stream (without its end of line). */
static void sse_line(sse_state *s, const char *l, size_t n) {
    if (n == 0) { /* end of an event */
        if (s->data.len || s->kind[0]) {
            if (ac_buf_append(&s->data, "", 1, 0)) {
                s->oom = 1;
                return;
            }
            if (s->has_id) *s->last_id = s->id;
            if (s->fn(s->ud, s->has_id ? s->id : 0, s->kind[0] ? s->kind : "message", s->data.data)) s->stopped = 1;
        }
        s->data.len = 0;
        s->kind[0] = 0;
        s->has_id = 0;
        return;
    }
    if (l[0] == ':') return; /* a comment (keep-alive) */
    const char *colon = memchr(l, ':', n);
    size_t fl = colon ? (size_t)(colon - l) : n;
    const char *v = colon ? colon + 1 : l + n;
    if (v < l + n && *v == ' ') v++;
    size_t vl = (size_t)(l + n - v);
    char val[64];
    size_t k = vl < sizeof val - 1 ? vl : sizeof val - 1;
    memcpy(val, v, k);
    val[k] = 0;
    if (fl == 4 && !memcmp(l, "data", 4)) {
        if ((s->data.len && ac_buf_append(&s->data, "\n", 1, 0)) || ac_buf_append(&s->data, v, vl, HC_MAX_BODY))
            s->oom = 1;
    } else if (fl == 5 && !memcmp(l, "event", 5))
        snprintf(s->kind, sizeof s->kind, "%s", val);
    else if (fl == 2 && !memcmp(l, "id", 2)) {
        char *end;
        long id = strtol(val, &end, 10);
        if (end != val && !*end) {
            s->id = id;
            s->has_id = 1;
        }
    } else if (fl == 5 && !memcmp(l, "retry", 5)) {
        long ms = strtol(val, NULL, 10);
        if (ms > 0 && s->retry_ms) *s->retry_ms = ms;
    }
}

static size_t on_sse(char *p, size_t sz, size_t n, void *ud) {
    sse_state *s = ud;
    size_t len = sz * n;
    if (!s->status) curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &s->status);
    if (s->status != 200) return ac_buf_append(&s->err, p, len, 1 << 20) ? 0 : len;
    for (size_t i = 0; i < len; i++) {
        char ch = p[i];
        if (ch == '\n') {
            size_t ll = s->line.len;
            if (ll && s->line.data[ll - 1] == '\r') ll--;
            sse_line(s, s->line.data, ll);
            s->line.len = 0;
            if (s->stopped || s->oom) return 0;
        } else if (ac_buf_append(&s->line, &ch, 1, HC_MAX_BODY)) {
            s->oom = 1;
            return 0;
        }
    }
    return len;
}

int hc_sse(const hc_conn *c, const char *path, long *last_id, long max_ms, long *retry_ms, hc_event_fn fn, void *ud,
           long *status, char **err_body, ac_err *e) {
    *status = 0;
    *err_body = NULL;
    struct curl_slist *hl = NULL;
    CURL *h = open_handle(c, path, "text/event-stream", 0, NULL, &hl, e);
    if (!h) return -1;
    if (*last_id > 0) {
        char hdr[80];
        snprintf(hdr, sizeof hdr, "Last-Event-ID: %ld", *last_id);
        hl = curl_slist_append(hl, hdr);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    }
    sse_state s = {.h = h, .last_id = last_id, .retry_ms = retry_ms, .fn = fn, .ud = ud};
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_sse);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
    /* the server sends a keep-alive comment every sse_keepalive_s (15 s by
     * default): 60 s without a byte is a dead connection */
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 60L);
    if (max_ms > 0) curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, max_ms);
    CURLcode cc = curl_easy_perform(h);
    int rc = 0;
    if (s.oom)
        rc = ac_errf(e, "out of memory reading the event stream");
    else if (cc != CURLE_OK && !s.stopped)
        rc = ac_errf(e, "%s: %s", c->base, curl_easy_strerror(cc));
    if (!s.status) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &s.status);
    *status = s.status;
    if (!rc && s.status != 200 && !ac_buf_append(&s.err, "", 1, 0)) {
        *err_body = s.err.data;
        s.err.data = NULL;
    }
    ac_buf_free(&s.err);
    ac_buf_free(&s.line);
    ac_buf_free(&s.data);
    curl_easy_cleanup(h);
    curl_slist_free_all(hl);
    return rc;
}
