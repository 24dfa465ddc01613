/*
 * routes_files.c - a succeeded job's exported files, for `autocompress
 * download`: GET /v1/jobs/{id}/files lists the regular files directly in the
 * report's export directory (export.dir), GET /v1/jobs/{id}/files/{name}
 * sends one. Only plain names ([A-Za-z0-9._-], not starting with a dot) are
 * served, opened beneath the directory without following a symbolic link;
 * anything else is a 404. GET /v1/jobs/{id}/report.html renders the
 * report (reporthtml.h) from the stored result with the loss curves of the
 * job's events. All run on the thread pool. See http.h.
 */
#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "http.h"
#include "autocompress.h"

static int plain_name(const char *s) {
    if (!*s || *s == '.' || strlen(s) > 255) return 0;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '.' && *s != '_' && *s != '-') return 0;
    return 1;
}

/* The report of the path's job once it ended (owned), or NULL with the
 * reply made: 404 unknown, 409 not ended or no report (failed, cancelled). */
static json_t *ended_report(req_ctx *rc) {
    ac_daemon *d = rc->d;
    ac_err e = {{0}};
    db_job j;
    int found;
    if (db_job_get(d->db, rc->id, &j, &found, &e)) {
        rep_store(d, &rc->rep, e.msg);
        return NULL;
    }
    if (!found) {
        rep_error(d, &rc->rep, 404, "not_found", "no such job", NULL);
        return NULL;
    }
    int ended = job_state_terminal(j.state);
    db_job_clear(&j);
    if (!ended) {
        rep_error(d, &rc->rep, 409, "not_finished", "job has not finished", NULL);
        return NULL;
    }
    char *res = NULL;
    if (db_job_result(d->db, rc->id, &res, &e)) {
        rep_store(d, &rc->rep, e.msg);
        return NULL;
    }
    json_t *r = res ? json_loads(res, 0, NULL) : NULL;
    free(res);
    if (!json_is_object(r)) {
        json_decref(r);
        rep_error(d, &rc->rep, 409, "no_result", "job did not succeed; see its reason and events", NULL);
    }
    return r;
}

/* The export directory of the path's job, opened: the fd, or -1 with the reply made. */
static int open_export_dir(req_ctx *rc, char *dir, size_t n) {
    json_t *r = ended_report(rc);
    if (!r) return -1;
    const char *ed = json_string_value(json_object_get(json_object_get(r, "export"), "dir"));
    if (!ed) {
        json_decref(r);
        rep_error(rc->d, &rc->rep, 409, "no_result", "job did not succeed; it exported nothing", NULL);
        return -1;
    }
    snprintf(dir, n, "%s", ed);
    json_decref(r);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) rep_error(rc->d, &rc->rep, 404, "not_found", "the job's export directory is gone", NULL);
    return fd;
}

static int by_name(const void *a, const void *b) {
    return strcmp(json_string_value(json_object_get(*(json_t *const *)a, "name")),
                  json_string_value(json_object_get(*(json_t *const *)b, "name")));
}

static void task_files(req_ctx *rc) {
    char dir[4096];
    int fd = open_export_dir(rc, dir, sizeof dir);
    if (fd < 0) return;
    DIR *dp = fdopendir(fd);
    if (!dp) {
        close(fd);
        rep_error(rc->d, &rc->rep, 503, "busy", "cannot read the export directory", NULL);
        return;
    }
    json_t *items[512];
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(dp)) && n < sizeof items / sizeof *items) {
        struct stat st;
        if (!plain_name(de->d_name) || fstatat(dirfd(dp), de->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode))
            continue;
        json_t *o = json_pack("{s:s,s:I}", "name", de->d_name, "size", (json_int_t)st.st_size);
        if (o) items[n++] = o;
    }
    closedir(dp);
    qsort(items, n, sizeof *items, by_name);
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, items[i]);
    rep_view(rc, 200, json_pack("{s:I,s:s,s:o}", "id", (json_int_t)rc->id, "dir", dir, "files", a));
}

static void task_file(req_ctx *rc) {
    char dir[4096];
    if (!plain_name(rc->url)) {
        rep_error(rc->d, &rc->rep, 404, "not_found", "no such file", NULL);
        return;
    }
    int dfd = open_export_dir(rc, dir, sizeof dir);
    if (dfd < 0) return;
    int fd = openat(dfd, rc->url, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    close(dfd);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        if (fd >= 0) close(fd);
        rep_error(rc->d, &rc->rep, 404, "not_found", "no such file", NULL);
        return;
    }
    struct MHD_Response *resp = MHD_create_response_from_fd64((uint64_t)st.st_size, fd); /* owns fd */
    if (!resp) {
        close(fd);
        rep_error(rc->d, &rc->rep, 503, "busy", "out of memory", NULL);
        return;
    }
    MHD_add_response_header(resp, "Content-Type", "application/octet-stream");
    rc->rep.status = 200;
    rc->rep.resp = resp;
}

/* The curves report.html draws from the job's stored events
 * (ac_report_curves_add: the same the job gathered for its own file). NULL
 * when the store cannot be read. */
static json_t *event_curves(req_ctx *rc) {
    json_t *c = ac_report_curves_new();
    long after = 0;
    for (int n = 1000; c && n == 1000;) {
        db_event *ev = NULL;
        ac_err e = {{0}};
        if (db_events(rc->d->db, rc->id, after, 1000, &ev, &n, &e)) {
            json_decref(c);
            return NULL;
        }
        for (int i = 0; i < n; i++) {
            after = ev[i].id;
            if (strcmp(ev[i].kind, "search") && strcmp(ev[i].kind, "distill")) continue;
            json_t *d = json_loads(ev[i].data, 0, NULL);
            ac_report_curves_add(c, ev[i].kind, d);
            json_decref(d);
        }
        db_events_free(ev, n);
    }
    return c;
}

static void task_report_html(req_ctx *rc) {
    json_t *r = ended_report(rc);
    if (!r) return;
    json_t *curves = event_curves(rc);
    char *page = ac_report_html(r, curves);
    json_decref(curves);
    json_decref(r);
    if (!page)
        rep_error(rc->d, &rc->rep, 503, "busy", "out of memory", NULL);
    else { /* no script, nothing fetched: the page needs only its inline style */
        rep_text(&rc->rep, 200, "text/html; charset=utf-8", page, strlen(page));
        rc->rep.hdr_name = "Content-Security-Policy";
        rc->rep.hdr_value = "default-src 'none'; style-src 'unsafe-inline'";
    }
}

enum MHD_Result r_job_report_html(req_ctx *rc, json_t *body) {
    (void)body;
    return http_offload(rc, task_report_html);
}

enum MHD_Result r_job_files(req_ctx *rc, json_t *body) {
    (void)body;
    return http_offload(rc, task_files);
}

enum MHD_Result r_job_file(req_ctx *rc, json_t *body) {
    (void)body;
    if (strlen(rc->rest) >= sizeof rc->url) {
        rep_error(rc->d, &rc->rep, 404, "not_found", "no such file", NULL);
        return http_reply(rc);
    }
    snprintf(rc->url, sizeof rc->url, "%s", rc->rest); /* rest points into the connection's URL */
    return http_offload(rc, task_file);
}
