/*
 * test_openapi.c - the OpenAPI document the daemon generates (daemon/openapi.c)
 * against the route table it dispatches on (daemon/routes.c) and the JSON its
 * views send (daemon/views.c): every route is documented and every
 * documented operation is a route; a route added to the table appears in the
 * document with its HEAD and the answers its rules imply, and one without a
 * summary makes the document fail to build; the job spec's schema is the
 * generated one; the field tables name exactly the fields the views send.
 */
#include "check.h"
#include "openapi.h"
#include "pipeline/job.h"
#include "views.h"

static json_t *schema(json_t *doc, const char *name) {
    return json_object_get(json_object_get(json_object_get(doc, "components"), "schemas"), name);
}

/* The keys of object o and the properties of schema s are the same set. */
static int same_keys(json_t *o, json_t *s, char *why, size_t n) {
    json_t *props = json_object_get(s, "properties");
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) if (!json_object_get(props, k)) return snprintf(why, n, "%s not documented", k), 0;
    json_object_foreach(props, k, v) if (!json_object_get(o, k)) return snprintf(why, n, "%s not sent", k), 0;
    return 1;
}

static void test_document_matches_route_table(void) {
    ac_err e = {{0}};
    json_t *doc = openapi_doc(&e);
    CHECK(doc, "%s", e.msg);
    if (!doc) return;
    CHECK(!strncmp(json_string_value(json_object_get(doc, "openapi")), "3.1", 3), "not OpenAPI 3.1");
    int rc = openapi_check_routes(doc, http_routes, http_nroutes, &e);
    CHECK(rc == 0, "%s", e.msg);
    json_t *gen = ac_job_spec_schema();
    CHECK(json_equal(schema(doc, "JobSpec"), gen), "JobSpec is not the generated schema");
    json_decref(gen);
    /* conventions: 201 with Location on submit, DELETE without a request body, HEAD on every GET */
    json_t *paths = json_object_get(doc, "paths");
    json_t *post = json_object_get(json_object_get(paths, "/v1/jobs"), "post");
    CHECK(json_object_get(json_object_get(json_object_get(json_object_get(post, "responses"), "201"), "headers"),
                          "Location"),
          "no Location on 201");
    const char *k;
    json_t *item;
    int gets = 0;
    json_object_foreach(paths, k, item) {
        CHECK(!json_object_get(json_object_get(item, "delete"), "requestBody"), "DELETE %s has a body", k);
        if (!json_object_get(item, "get")) continue;
        gets++;
        CHECK(json_object_get(item, "head") != NULL, "no HEAD on %s", k);
    }
    CHECK(gets >= 15, "%d GET paths", gets);
    json_decref(doc);
}

static void test_schemas_are_the_views(void) {
    ac_err e = {{0}};
    json_t *doc = openapi_doc(&e);
    if (!doc) return;
    char why[200] = "";
    db_transition tr = {0, JOB_QUEUED, JOB_QUEUED, 1.0, NULL};
    db_job j = {
        .id = 3, .name = "n", .state = JOB_RUNNING, .owner = "u", .spec = "{}", .transitions = &tr, .ntransitions = 1};
    json_t *one = view_job(&j);
    /* GET /v1/jobs/{id} adds executor and slurm (exec_job_view, which needs the store) to view_job's fields */
    json_t *js = json_deep_copy(schema(doc, "Job"));
    CHECK(json_object_del(json_object_get(js, "properties"), "executor") == 0 &&
              json_object_del(json_object_get(js, "properties"), "slurm") == 0,
          "no executor or slurm in Job");
    CHECK(same_keys(one, js, why, sizeof why), "Job: %s", why);
    json_decref(js);
    /* a page's jobs: the Job without spec, has_result and transitions (not required) */
    j.spec = NULL;
    json_t *page = view_job_page(&j, 1, 10), *req = json_object_get(schema(doc, "Job"), "required");
    json_t *pj = json_array_get(json_object_get(page, "jobs"), 0);
    size_t i;
    json_t *r;
    json_array_foreach(req, i, r)
        CHECK(json_object_get(pj, json_string_value(r)), "page job lacks %s", json_string_value(r));
    CHECK(same_keys(page, schema(doc, "JobPage"), why, sizeof why), "JobPage: %s", why);
    db_audit_row ar = {.action = "GET /v1/jobs"};
    json_t *audit = view_audit_page(&ar, 1, 10);
    CHECK(same_keys(json_array_get(json_object_get(audit, "entries"), 0),
                    json_object_get(json_object_get(json_object_get(schema(doc, "AuditPage"), "properties"), "entries"),
                                    "items"),
                    why, sizeof why),
          "AuditPage entry: %s", why);
    db_event ev = {1, "log", "{}", 2.0};
    json_t *evs = view_events(&ev, 1);
    CHECK(same_keys(json_array_get(json_object_get(evs, "events"), 0), schema(doc, "Event"), why, sizeof why),
          "Event: %s", why);
    db_cost_row cr = {0};
    json_t *ct = view_cost_tables(&cr, 1);
    CHECK(same_keys(json_array_get(json_object_get(ct, "tables"), 0),
                    json_object_get(json_object_get(json_object_get(schema(doc, "CostTables"), "properties"), "tables"),
                                    "items"),
                    why, sizeof why),
          "CostTables row: %s", why);
    /* the job states are the store's */
    json_t *en = json_object_get(json_object_get(json_object_get(schema(doc, "Job"), "properties"), "state"), "enum");
    CHECK(json_array_size(en) == JOB_NSTATES, "%zu states", json_array_size(en));
    for (int s = 0; s < JOB_NSTATES; s++)
        CHECK(!strcmp(json_string_value(json_array_get(en, (size_t)s)), job_state_name((job_state)s)), "state %d", s);
    json_decref(one), json_decref(page), json_decref(audit), json_decref(evs), json_decref(ct);
    json_decref(doc);
}

static enum MHD_Result my_handler_unused(req_ctx *rc, json_t *body) {
    (void)rc, (void)body;
    return MHD_NO;
}

static void test_check_catches_drift(void) {
    ac_err e = {{0}};
    json_t *doc = openapi_doc(&e);
    if (!doc) return;
    route *more = calloc(http_nroutes + 1, sizeof *more);
    memcpy(more, http_routes, http_nroutes * sizeof *more);
    /* a route added to the table is in the generated document, with the answers its rules imply */
    more[http_nroutes] =
        (route){"PUT", "/v1/jobs/{id}", my_handler_unused, R_API | R_JSON, "Replace", "200=Job", NULL, "JobSpec", NULL};
    json_t *gen = openapi_build(more, http_nroutes + 1, &e);
    CHECK(gen, "%s", e.msg);
    json_t *put = json_object_get(json_object_get(json_object_get(gen, "paths"), "/v1/jobs/{id}"), "put");
    json_t *resp = json_object_get(put, "responses");
    CHECK(put && json_object_get(put, "requestBody"), "the added route is not documented");
    const char *implied[] = {"200", "400", "401", "403", "404", "413", "415", "503"};
    for (size_t i = 0; i < sizeof implied / sizeof *implied; i++)
        CHECK(json_object_get(resp, implied[i]), "no %s", implied[i]);
    CHECK(openapi_check_routes(gen, more, http_nroutes + 1, &e) == 0, "%s", e.msg);
    json_decref(gen);
    /* ... and without its documentation the document is refused */
    more[http_nroutes].summary = NULL;
    CHECK(openapi_build(more, http_nroutes + 1, &e) == NULL && strstr(e.msg, "PUT /v1/jobs/{id}"), "%s", e.msg);
    more[http_nroutes].summary = "Replace", more[http_nroutes].answers = "200=NoSuchSchema";
    CHECK(openapi_build(more, http_nroutes + 1, &e) == NULL && strstr(e.msg, "NoSuchSchema"), "%s", e.msg);
    more[http_nroutes].answers = "200", more[http_nroutes].params = "no-such-param";
    CHECK(openapi_build(more, http_nroutes + 1, &e) == NULL && strstr(e.msg, "no-such-param"), "%s", e.msg);
    /* the check against an older document: a route without documentation */
    more[http_nroutes].params = NULL;
    CHECK(openapi_check_routes(doc, more, http_nroutes + 1, &e) == -1 && strstr(e.msg, "PUT /v1/jobs/{id}"), "%s",
          e.msg);
    /* a documented operation whose route is gone */
    size_t k = 0;
    for (size_t i = 0; i < http_nroutes; i++)
        if (strcmp(http_routes[i].path, "/v1/jobs/{id}/log")) more[k++] = http_routes[i];
    CHECK(k == http_nroutes - 1, "no log route");
    CHECK(openapi_check_routes(doc, more, k, &e) == -1 && strstr(e.msg, "/v1/jobs/{id}/log"), "%s", e.msg);
    /* a path parameter's name does not matter, its place does */
    json_t *paths = json_object_get(doc, "paths");
    json_t *p = json_object_get(paths, "/v1/jobs/{id}/files/{name}");
    CHECK(p != NULL, "no files route documented");
    json_object_set(paths, "/v1/jobs/{job}/files/{file}", p);
    json_object_del(paths, "/v1/jobs/{id}/files/{name}");
    CHECK(openapi_check_routes(doc, http_routes, http_nroutes, &e) == 0, "%s", e.msg);
    json_object_set(paths, "/v1/jobs/{job}/files/{file}/more", p);
    CHECK(openapi_check_routes(doc, http_routes, http_nroutes, &e) == -1, "an extra path passed");
    json_object_del(paths, "/v1/jobs/{job}/files/{file}/more");
    /* HEAD is served wherever GET is: a GET route whose head is not documented */
    json_t *log = json_object_get(paths, "/v1/jobs/{id}/log");
    CHECK(json_object_del(log, "head") == 0, "no head on the log route");
    CHECK(openapi_check_routes(doc, http_routes, http_nroutes, &e) == -1 && strstr(e.msg, "HEAD /v1/jobs/{id}/log"),
          "%s", e.msg);
    free(more);
    json_decref(doc);
}

int main(void) {
    RUN(test_document_matches_route_table);
    RUN(test_schemas_are_the_views);
    RUN(test_check_catches_drift);
    return DONE();
}
