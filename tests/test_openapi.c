/*
 * test_openapi.c - the OpenAPI document the daemon serves (daemon/openapi.c)
 * against the route table it dispatches on (daemon/routes.c): every route is
 * documented and every documented operation is a route; the job spec's
 * schema in it is the generated one; and the check itself catches a route
 * added without its documentation and a documented operation without a route.
 */
#include "check.h"
#include "pipeline/job.h"
#include "openapi.h"

static void test_document_matches_route_table(void) {
    ac_err e = {{0}};
    json_t *doc = openapi_doc(&e);
    CHECK(doc, "%s", e.msg);
    if (!doc) return;
    CHECK(!strncmp(json_string_value(json_object_get(doc, "openapi")), "3.1", 3), "not OpenAPI 3.1");
    int rc = openapi_check_routes(doc, http_routes, http_nroutes, &e);
    CHECK(rc == 0, "%s", e.msg);
    json_t *gen = ac_job_spec_schema();
    CHECK(json_equal(json_object_get(json_object_get(json_object_get(doc, "components"), "schemas"), "JobSpec"), gen),
          "JobSpec is not the generated schema");
    json_decref(gen);
    json_decref(doc);
}

static void my_handler_unused(void) {}

static void test_check_catches_drift(void) {
    ac_err e = {{0}};
    json_t *doc = openapi_doc(&e);
    if (!doc) return;
    /* a route without documentation */
    route *more = calloc(http_nroutes + 1, sizeof *more);
    memcpy(more, http_routes, http_nroutes * sizeof *more);
    more[http_nroutes] = (route){"PUT", "/v1/jobs/{id}", (route_fn)(void (*)(void))my_handler_unused, R_API};
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
    RUN(test_check_catches_drift);
    return DONE();
}
