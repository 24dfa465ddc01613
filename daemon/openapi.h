/*
 * openapi.h - the OpenAPI 3.1 document the daemon serves at GET
 * /openapi.json (and `autocompressd --openapi` prints), generated at each
 * request from the tables the server itself runs on, so that it cannot
 * drift from them: the paths and operations from the route table
 * (routes.c: method, path, rules, summary, answers, parameters, request
 * body), the answers the rules imply (401, 403, 404, 400/413/415, 503),
 * HEAD wherever GET is, and components.schemas from the field tables of
 * openapi_schemas.c (the API's bodies) and the job spec's field table
 * (JobSpec, as `autocompress schema`). proto/openapi.json is its output,
 * checked by tests/test_openapi.py. Private to daemon/.
 */
#ifndef AC_OPENAPI_H
#define AC_OPENAPI_H

#include <jansson.h>

#include "autocompress.h"
#include "db.h"
#include "http.h"

/* The document of routes[0..n) (owned by the caller), or NULL with e (a
 * route without summary or answers, an unknown schema, parameter or
 * header, a route twice). openapi_doc: of http_routes. */
json_t *openapi_build(const route *routes, size_t n, ac_err *e);
json_t *openapi_doc(ac_err *e);

/* Every route (method, path) is an operation of doc and every operation of
 * doc a route: 0, or -1 with e naming the first difference. A "*" route is
 * the document's "get" (its "head" optional); a GET route needs its "head"
 * too (HEAD is served wherever GET is); path parameters compare by position, not by name. */
int openapi_check_routes(const json_t *doc, const route *routes, size_t n, ac_err *e);

/* openapi_schemas.c: components.schemas (owned), or NULL with e. */
json_t *openapi_schemas(ac_err *e);
/* 1 when name is a component schema. */
int openapi_schema_known(const char *name);
/* The example shown with schema's bodies (owned), or NULL without one. */
json_t *openapi_example(const char *schema);
/* The property names of a field table (owned array), or NULL. */
json_t *openapi_fields(const char *schema);

#endif
