/* openapi.c - see openapi.h. */
#include "openapi.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "autocompress.h"

static const char DESCRIPTION[] =
    "Hardware-targeted structured pruning as a service. Errors are always JSON: "
    "{\"error\":{\"code\",\"message\",\"field\"}}. With tokens configured (the config's, or users' from "
    "`autocompressd token add`) every /v1 route needs 'Authorization: Bearer TOKEN' (or ?access_token= for "
    "EventSource): 401 without a live one. A token has a role: read (GET routes), submit (also POST /v1/jobs, "
    "/v1/validate, /v1/estimate, DELETE /v1/jobs/{id}) or admin (also POST /v1/cost-tables, DELETE "
    "/v1/cost-tables/measurements/{id}, GET /v1/audit, and every user's jobs); a lower role gets 403. A job belongs "
    "to the user who submitted it: another user's job answers 404 unless the caller is an admin. The config's tokens "
    "are the user admin. /healthz and /metrics stay open. Request bodies are limited to max_body_bytes (413). HEAD "
    "is answered wherever GET is. The daemon generates this document from its route table and field tables "
    "(`autocompressd --openapi`), the job spec's schema from the spec's field table (`autocompress schema`).";

/* Query and header parameters a route names (route.params). */
static const struct {
    const char *key, *name, *in, *schema, *desc;
} PARAMS[] = {
    {"limit", "limit", "query", "{\"type\": \"integer\", \"minimum\": 1, \"maximum\": 1000, \"default\": 100}", NULL},
    {"after", "after", "query", "{\"type\": \"integer\", \"minimum\": 0}", "the next_after of the page before"},
    {"state", "state", "query", NULL, "only jobs in this state"}, /* schema: the job states */
    {"user", "user", "query", "{\"type\": \"string\"}", "only this user's entries"},
    {"Idempotency-Key", "Idempotency-Key", "header", "{\"type\": \"string\", \"minLength\": 1, \"maxLength\": 200}",
     "A retry with the same key and spec returns the first job (200, Idempotent-Replayed: true); the same key with "
     "another spec is 409"},
    {"Last-Event-ID", "Last-Event-ID", "header", "{\"type\": \"integer\"}",
     "resume the stream after this event id (an EventSource sends it on reconnecting)"},
    {"events-after", "after", "query", "{\"type\": \"integer\"}", "events after this id"},
    {"format", "format", "query", "{\"type\": \"string\", \"enum\": [\"json\"]}", "json: one JSON answer, no stream"},
    {"events-limit", "limit", "query", "{\"type\": \"integer\", \"maximum\": 10000}", "with format=json"},
    {"access_token", "access_token", "query", "{\"type\": \"string\"}",
     "the bearer token, for EventSource (which cannot set headers)"},
};

/* Response headers an answer names (STATUS=WHAT+HEADER). */
static const struct {
    const char *name, *schema, *desc;
} HEADERS[] = {
    {"Location", "{\"type\": \"string\"}", "the new resource's URL"},
    {"Idempotent-Replayed", "{\"type\": \"string\", \"enum\": [\"true\"]}",
     "true: an earlier submission with this Idempotency-Key and spec"},
};

static const char *reason_phrase(int st) {
    switch (st) {
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 409: return "Conflict";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 503: return "Service Unavailable";
    default: return "answer";
    }
}

static json_t *load(const char *text) { return text ? json_loads(text, 0, NULL) : NULL; }

/* One media type's object for WHAT (a schema, "object" or a media type),
 * set into content. */
static int add_media(json_t *content, const char *what, size_t n, ac_err *e) {
    char w[128];
    if (n >= sizeof w) return ac_errf(e, "answer %.*s: too long", (int)n, what);
    memcpy(w, what, n);
    w[n] = 0;
    json_t *media;
    if (strchr(w, '/')) { /* a media type: its bytes */
        media = json_pack("{s:{s:s}}", "schema", "type", "string");
        if (!strncmp(w, "application/octet-stream", n))
            json_object_set_new(json_object_get(media, "schema"), "contentMediaType", json_string(w));
        return json_object_set_new(content, w, media);
    }
    if (!strcmp(w, "object"))
        media = json_pack("{s:{s:s}}", "schema", "type", "object");
    else if (openapi_schema_known(w)) {
        char ref[160];
        snprintf(ref, sizeof ref, "#/components/schemas/%s", w);
        media = json_pack("{s:{s:s}}", "schema", "$ref", ref);
        json_t *ex = openapi_example(w);
        if (ex) json_object_set_new(media, "example", ex);
    } else
        return ac_errf(e, "answer %s: no such schema", w);
    return json_object_set_new(content, "application/json", media);
}

/* responses[status] for one STATUS[=WHAT[|WHAT]][+HEADER] token. */
static int add_answer(json_t *responses, const char *tok, size_t n, ac_err *e) {
    char *end;
    long st = strtol(tok, &end, 10);
    if (st < 100 || st > 599 || (end != tok + n && *end != '=' && *end != '+'))
        return ac_errf(e, "answer %.*s: not STATUS[=WHAT][+HEADER]", (int)n, tok);
    char code[8];
    snprintf(code, sizeof code, "%ld", st);
    const char *plus = memchr(tok, '+', n), *what = *end == '=' ? end + 1 : NULL;
    const char *wend = plus ? plus : tok + n;
    if (!what) {
        if (st >= 400)
            return json_object_set_new(responses, code, json_pack("{s:s}", "$ref", "#/components/responses/Error"));
        return json_object_set_new(responses, code, json_pack("{s:s}", "description", reason_phrase((int)st)));
    }
    json_t *r = json_pack("{s:s,s:{}}", "description", reason_phrase((int)st), "content");
    while (what < wend) {
        const char *bar = memchr(what, '|', (size_t)(wend - what));
        size_t k = bar ? (size_t)(bar - what) : (size_t)(wend - what);
        if (add_media(json_object_get(r, "content"), what, k, e)) {
            json_decref(r);
            return -1;
        }
        what += k + (bar != NULL);
    }
    if (plus) {
        size_t i = 0, hn = (size_t)(tok + n - plus - 1);
        while (i < sizeof HEADERS / sizeof *HEADERS &&
               !(strlen(HEADERS[i].name) == hn && !strncmp(HEADERS[i].name, plus + 1, hn)))
            i++;
        if (i == sizeof HEADERS / sizeof *HEADERS) {
            json_decref(r);
            return ac_errf(e, "answer %.*s: no such header", (int)n, tok);
        }
        json_object_set_new(r, "headers",
                            json_pack("{s:{s:s,s:o}}", HEADERS[i].name, "description", HEADERS[i].desc, "schema",
                                      load(HEADERS[i].schema)));
    }
    return json_object_set_new(responses, code, r);
}

/* Path parameters from the template: {id} an integer id, a last {NAME} a string. */
static void path_params(const char *path, json_t *params) {
    for (const char *p = strchr(path, '{'); p; p = strchr(p + 1, '{')) {
        const char *q = strchr(p, '}');
        if (!q) break;
        json_t *schema = !strncmp(p, "{id}", 4) ? json_pack("{s:s,s:i}", "type", "integer", "minimum", 1)
                                                : json_pack("{s:s}", "type", "string");
        if (!strcmp(path, "/v1/jobs/{id}/files/{name}") && strncmp(p, "{id}", 4))
            json_object_set_new(schema, "pattern", json_string("^[A-Za-z0-9_-][A-Za-z0-9._-]*$"));
        json_array_append_new(params, json_pack("{s:s%,s:s,s:b,s:o}", "name", p + 1, (size_t)(q - p - 1), "in", "path",
                                                "required", 1, "schema", schema));
    }
}

static int named_params(const char *names, json_t *params, ac_err *e) {
    for (const char *p = names; p && *p;) {
        size_t n = strcspn(p, " ");
        size_t i = 0, np = sizeof PARAMS / sizeof *PARAMS;
        while (i < np && !(strlen(PARAMS[i].key) == n && !strncmp(PARAMS[i].key, p, n))) i++;
        if (i == np) return ac_errf(e, "parameter %.*s: not in the parameter table", (int)n, p);
        json_t *schema = PARAMS[i].schema ? load(PARAMS[i].schema) : json_pack("{s:s,s:[]}", "type", "string", "enum");
        if (!PARAMS[i].schema) /* state: the store's state names */
            for (int s = 0; s < JOB_NSTATES; s++)
                json_array_append_new(json_object_get(schema, "enum"), json_string(job_state_name((job_state)s)));
        json_t *o =
            json_pack("{s:s,s:s,s:b,s:o}", "name", PARAMS[i].name, "in", PARAMS[i].in, "required", 0, "schema", schema);
        if (PARAMS[i].desc) json_object_set_new(o, "description", json_string(PARAMS[i].desc));
        json_array_append_new(params, o);
        p += n;
        while (*p == ' ') p++;
    }
    return 0;
}

/* The operation of route r (HEAD: the headers its GET answers). */
static json_t *operation(const route *r, int head, ac_err *e) {
    if (!r->summary || !r->answers)
        return ac_errf(e, "route %s %s has no summary or answers", r->method, r->path), NULL;
    json_t *op = json_object(), *responses = json_object(), *params = json_array();
    if (head) {
        char s[600];
        snprintf(s, sizeof s, "The headers GET %s would answer, without the body", r->path);
        json_object_set_new(op, "summary", json_string(s));
    } else {
        json_object_set_new(op, "summary", json_string(r->summary));
        if (r->desc) json_object_set_new(op, "description", json_string(r->desc));
    }
    int rc = 0;
    for (const char *p = r->answers; *p && !rc;) {
        size_t n = strcspn(p, " ");
        rc = add_answer(responses, p, n, e);
        p += n;
        while (*p == ' ') p++;
    }
    /* the answers the rules imply (http.c's checks before the handler) */
    const char *implied[] = {r->rules & R_AUTH ? "401" : NULL,
                             r->rules & (R_BROWSER | R_SUBMIT | R_ADMIN) ? "403" : NULL,
                             strstr(r->path, "{id}") ? "404" : NULL,
                             r->rules & R_JSON ? "400" : NULL,
                             r->rules & R_JSON ? "413" : NULL,
                             r->rules & R_JSON ? "415" : NULL,
                             "503"};
    for (size_t i = 0; i < sizeof implied / sizeof *implied && !rc; i++)
        if (implied[i] && !json_object_get(responses, implied[i])) rc = add_answer(responses, implied[i], 3, e);
    path_params(r->path, params);
    if (!rc) rc = named_params(r->params, params, e);
    if (!rc && (r->rules & R_QUERY_TOKEN)) rc = named_params("access_token", params, e);
    if (!rc && r->body && !head) {
        json_t *content = json_object();
        rc = add_media(content, r->body, strlen(r->body), e);
        json_object_set_new(op, "requestBody", json_pack("{s:b,s:o}", "required", 1, "content", content));
    }
    if (rc) {
        json_decref(op), json_decref(responses), json_decref(params);
        return NULL;
    }
    if (head) { /* the same statuses, headers only */
        const char *k;
        json_t *v;
        json_object_foreach(responses, k, v) {
            json_object_del(v, "content");
            json_object_del(v, "$ref");
            json_object_set_new(v, "description", json_string("as GET (headers only)"));
        }
    }
    if (!(r->rules & R_AUTH)) json_object_set_new(op, "security", json_array());
    json_object_set_new(op, "responses", responses);
    if (json_array_size(params))
        json_object_set_new(op, "parameters", params);
    else
        json_decref(params);
    return op;
}

json_t *openapi_build(const route *routes, size_t n, ac_err *e) {
    json_t *schemas = openapi_schemas(e);
    if (!schemas) return NULL;
    json_t *err = openapi_example("Error");
    json_t *doc =
        json_pack("{s:s,s:{s:s,s:s,s:s,s:s},s:{s:{s:{s:s,s:s}},s:{s:{s:s,s:{s:{s:{s:s},s:o}}}},s:o},s:[{s:[]}],s:{}}",
                  "openapi", "3.1.0", "info", "title", "AutoCompress daemon API", "version", "1", "description",
                  DESCRIPTION, "x-server-version", AC_VERSION, "components", "securitySchemes", "bearer", "type",
                  "http", "scheme", "bearer", "responses", "Error", "description", "error", "content",
                  "application/json", "schema", "$ref", "#/components/schemas/Error", "example",
                  err ? err : json_null(), "schemas", schemas, "security", "bearer", "paths");
    if (!doc) return ac_errf(e, "out of memory"), NULL;
    json_t *paths = json_object_get(doc, "paths");
    for (size_t i = 0; i < n; i++) {
        json_t *item = json_object_get(paths, routes[i].path);
        if (!item) json_object_set_new(paths, routes[i].path, item = json_object());
        int any = !strcmp(routes[i].method, "*");
        char m[16];
        size_t j = 0;
        for (const char *s = any ? "get" : routes[i].method; *s && j < sizeof m - 1; s++)
            m[j++] = (char)tolower((unsigned char)*s);
        m[j] = 0;
        if (json_object_get(item, m)) {
            json_decref(doc);
            return ac_errf(e, "route %s %s twice", routes[i].method, routes[i].path), NULL;
        }
        json_t *op = operation(&routes[i], 0, e), *hop = NULL;
        if (op && !strcmp(m, "get")) hop = operation(&routes[i], 1, e); /* HEAD is served wherever GET is */
        if (!op || (!strcmp(m, "get") && !hop)) {
            json_decref(op);
            json_decref(doc);
            return NULL;
        }
        json_object_set_new(item, m, op);
        if (hop) json_object_set_new(item, "head", hop);
    }
    return doc;
}

json_t *openapi_doc(ac_err *e) { return openapi_build(http_routes, http_nroutes, e); }

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
        if (!strcmp(m, "get") && !json_is_object(json_object_get(p, "head"))) /* HEAD where GET is */
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
                found = !strcmp(have, want) &&
                        (!strcmp(routes[i].method, "*") ? !strcmp(METHODS[mi], "get") || head
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
