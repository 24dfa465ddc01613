/*
 * api.h - the request/response JSON that the CLI and the daemon's HTTP
 * routes share, so both answer the same request the same way:
 * POST /v1/estimate (`autocompress estimate`) and the cost-table
 * measurement request of POST /v1/cost-tables.
 */
#ifndef AC_API_H
#define AC_API_H

#include <jansson.h>

#include "cost/costmodel.h"
#include "core/err.h"

/* {"model": dir | "architecture": {...}, "target": {...}} -> predicted
 * figures. The target is parsed by jobspec.c's target table. Only cached or
 * roofline tables are used (nothing is measured here); a CPU target's is
 * the table of `threads` threads (the key a job on that many plans with).
 * *field names the offending field on failure. */
int ac_estimate_json(const json_t *req, const ac_cost_cache *cache, int threads, json_t **out, const char **field,
                     ac_err *e);

/* {"device":"cpu","threads":N,"dtype":"fp32"|"bf16"} -> validate / the
 * threads (2 unless given) / the weights' dtype (fp32 unless given) /
 * table key / measure. */
int ac_cost_measure_validate(const json_t *req, const char **field, ac_err *e);
int ac_cost_measure_threads(const json_t *req);
const char *ac_cost_measure_dtype(const json_t *req);
void ac_cost_measure_key(const json_t *req, char *key, size_t n);
int ac_cost_measure_json(const json_t *req, json_t **table, ac_err *e);

#endif
