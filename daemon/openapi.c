/* openapi.c - see openapi.h. */
#include "openapi.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "autocompress.h"

json_t *openapi_doc(ac_err *e) {
    json_error_t je;
    json_t *doc = json_loads(openapi_json_text, 0, &je);
    if (!doc) {
        ac_errf(e, "embedded proto/openapi.json: %s (line %d)", je.text, je.line);
        return NULL;
    }
    json_t *schemas = json_object_get(json_object_get(doc, "components"), "schemas");
    json_t *spec = ac_job_spec_schema();
    if (!json_is_object(schemas) || !spec || json_object_set_new(schemas, "JobSpec", spec) ||
        json_object_set_new(json_object_get(doc, "info"), "x-server-version", json_string(AC_VERSION))) {
        json_decref(doc);
        ac_errf(e, "cannot build the OpenAPI document");
        return NULL;
    }
    return doc;
}

/* path with every "{...}" segment written as "{}" into out. */
static void shape(const char *path, char *out, size_t n) {
    size_t k = 0;
    for (const char *p = path; *p && k + 3 < n; p++) {
        if (*p == '{') {
            const char *q = strchr(p, '}');
            if (!q) break;
            out[k++] = '{';
            out[k++] = '}';
            p = q;
        } else
            out[k++] = *p;
    }
    out[k] = 0;
}

static const char *const METHODS[] = {"get", "put", "post", "delete", "options", "head", "patch", "trace"};

/* The doc's path whose shape is that of path, or NULL. */
static json_t *doc_path(const json_t *paths, const char *path) {
    char want[512], have[512];
    shape(path, want, sizeof want);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)paths, k, v) {
        shape(k, have, sizeof have);
        if (!strcmp(have, want)) return v;
    }
    return NULL;
}

int openapi_check_routes(const json_t *doc, const route *routes, size_t n, ac_err *e) {
    const json_t *paths = json_object_get(doc, "paths");
    if (!json_is_object(paths)) return ac_errf(e, "the document has no paths");
    for (size_t i = 0; i < n; i++) { /* every route is documented */
        char m[16];
        const char *rm = strcmp(routes[i].method, "*") ? routes[i].method : "GET";
        size_t j = 0;
        for (; rm[j] && j < sizeof m - 1; j++) m[j] = (char)tolower((unsigned char)rm[j]);
        m[j] = 0;
        json_t *p = doc_path(paths, routes[i].path);
        if (!p || !json_is_object(json_object_get(p, m)))
            return ac_errf(e, "route %s %s is not in the OpenAPI document", routes[i].method, routes[i].path);
        if (!strcmp(routes[i].method, "GET") && !json_is_object(json_object_get(p, "head"))) /* HEAD where GET is */
            return ac_errf(e, "route HEAD %s (served by its GET) is not in the OpenAPI document", routes[i].path);
    }
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)paths, k, v) { /* every documented operation is a route */
        char have[512], want[512];
        shape(k, have, sizeof have);
        for (size_t mi = 0; mi < sizeof METHODS / sizeof *METHODS; mi++) {
            if (!json_object_get(v, METHODS[mi])) continue;
            int found = 0;
            for (size_t i = 0; i < n && !found; i++) {
                shape(routes[i].path, want, sizeof want);
                int head = !strcmp(METHODS[mi], "head");
                found = !strcmp(have, want) && (!strcmp(routes[i].method, "*") ? !strcmp(METHODS[mi], "get") || head
                                                : !strcasecmp(routes[i].method, head ? "GET" : METHODS[mi]));
            }
            if (!found) return ac_errf(e, "the OpenAPI document has %s %s but no route serves it", METHODS[mi], k);
        }
    }
    return 0;
}

enum MHD_Result r_openapi(req_ctx *rc, json_t *body) {
    (void)body;
    ac_err e = {{0}};
    json_t *doc = openapi_doc(&e);
    if (!doc)
        rep_error(rc->d, &rc->rep, 500, "internal", e.msg, NULL);
    else
        rep_json(&rc->rep, 200, doc);
    return http_reply(rc);
}
