/*
 * openapi.h - the OpenAPI document the daemon serves at GET /openapi.json:
 * proto/openapi.json (embedded at build time) with the job spec's schema
 * (components.schemas.JobSpec) generated from the spec's field table and
 * the daemon's version. openapi_check_routes compares it with the route
 * table (routes.c) so that neither can change without the other: the test
 * tests/test_openapi.c runs it. Private to daemon/.
 */
#ifndef AC_OPENAPI_H
#define AC_OPENAPI_H

#include <jansson.h>

#include "autocompress.h"
#include "http.h"

/* The embedded proto/openapi.json (build/daemon/openapi_doc.c). */
extern const char openapi_json_text[];

/* The document as served (owned by the caller), or NULL with e. */
json_t *openapi_doc(ac_err *e);

/* Every route (method, path) is an operation of doc and every operation of
 * doc a route: 0, or -1 with e naming the first difference. A "*" route is
 * the document's "get" (its "head" optional); a GET route needs its "head"
 * too (HEAD is served wherever GET is); path parameters compare by position, not by name
 * ({id} and {rest} against any {name}). */
int openapi_check_routes(const json_t *doc, const route *routes, size_t n, ac_err *e);

#endif
