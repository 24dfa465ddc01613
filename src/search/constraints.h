/*
 * constraints.h - the constraint list: ONE table of the limits a job may
 * set (the spec's name, the unit, the predicted figure it bounds, the
 * direction, the range a spec may give) and the violation formula. Read by
 * the job spec's field table (src/pipeline/jobspec.c, and from it
 * proto/job.schema.json), the searches' violation terms (search.c, dnas.c,
 * minitron.c through ac_constraints_violation), the report's "constraints"
 * (ac_constraints_report) and the dashboard (web/constraints.js, written by
 * `autocompress constraints`; tests/test_jobspec.c fails when either
 * generated file differs from this table).
 */
#ifndef AC_CONSTRAINTS_H
#define AC_CONSTRAINTS_H

#include <jansson.h>
#include <stddef.h>

#include "cost/costmodel.h"

typedef struct {
    double max_ttft_ms, max_tpot_ms, min_tokens_per_s, max_mem_gib, max_params; /* <= 0: none */
    double max_p99_ttft_ms, max_p99_tpot_ms, max_p99_e2e_ms;
} ac_constraints;

/* The rows: X(spec name, ac_constraints member, predicted figure, unit,
 * ac_metric, max|min, lowest and highest limit a spec may give, doc (a
 * string literal that follows the generated description: "" or ": ...")).
 * A macro so that the job spec's field table (jobspec.c) is built from the
 * same rows at compile time. */
#define AC_CONSTRAINT_ROWS(X)                                                                                          \
    X("max_ttft_ms", max_ttft_ms, "ttft_ms", "ms", AC_M_TTFT, max, 1e-6, 1e9, "")                                      \
    X("max_tpot_ms", max_tpot_ms, "tpot_ms", "ms", AC_M_TPOT, max, 1e-6, 1e9, "")                                      \
    X("min_tokens_per_s", min_tokens_per_s, "tokens_per_s", "tokens/s", AC_M_TOKENS_PER_S, min, 1e-6, 1e12,            \
      ": output tokens per second for the workload")                                                                   \
    X("max_memory_gib", max_mem_gib, "memory_gib", "GiB", AC_M_MEM, max, 1e-9, 1e6,                                    \
      ": weights + KV cache + activations + overhead")                                                                 \
    X("max_params", max_params, "params", "parameters", AC_M_PARAMS, max, 1, 1e15, "")                                 \
    X("max_p99_ttft_ms", max_p99_ttft_ms, "p99_ttft_ms", "ms", AC_M_P99_TTFT, max, 1e-6, 1e9,                          \
      ": the 99th percentile over a served workload's requests (a static batch: its TTFT)")                            \
    X("max_p99_tpot_ms", max_p99_tpot_ms, "p99_tpot_ms", "ms", AC_M_P99_TPOT, max, 1e-6, 1e9,                          \
      ": the 99th percentile over a served workload's requests")                                                       \
    X("max_p99_e2e_ms", max_p99_e2e_ms, "p99_e2e_ms", "ms", AC_M_P99_E2E, max, 1e-6, 1e12,                             \
      ": end-to-end latency, the 99th percentile over a served workload's requests")

#define AC_CONSTRAINT_GE_max 0
#define AC_CONSTRAINT_GE_min 1
/* "at most the predicted tpot_ms (ms)": a row's description (a string literal). */
#define AC_CONSTRAINT_DOC(metric, unit, kind, doc) AC_CONSTRAINT_BOUND_##kind " the predicted " metric " (" unit ")" doc
#define AC_CONSTRAINT_BOUND_max "at most"
#define AC_CONSTRAINT_BOUND_min "at least"

typedef struct {
    const char *name;   /* in the spec: "max_tpot_ms" */
    const char *metric; /* the predicted figure it bounds (ac_cost_to_json's name): "tpot_ms" */
    const char *unit;   /* "ms", "tokens/s", "GiB", "parameters" */
    ac_metric m;
    int ge;          /* 1: a lower bound (value >= limit), 0: an upper bound (value <= limit) */
    size_t off;      /* of the limit in ac_constraints */
    double lo, hi;   /* the range a spec may give */
    const char *doc; /* the description (AC_CONSTRAINT_DOC) */
} ac_constraint;

#define AC_NCONSTRAINTS 8

/* The table, AC_NCONSTRAINTS rows in the order the searches visit them. */
const ac_constraint *ac_constraint_table(void);
/* The limit l sets for row c (<= 0: none). */
double ac_constraint_limit(const ac_constraint *c, const ac_constraints *l);

/* The relative violation of limit by value: value / limit - 1 for an upper
 * bound, 1 - value / limit for a lower one (<= 0 when met). */
double ac_constraint_g(const ac_constraint *c, double value, double limit);
/* d g / d value (the sign of the direction over the limit). */
double ac_constraint_dg(const ac_constraint *c, double limit);
/* Whether value meets the limit (g <= 1e-9). */
int ac_constraint_met(const ac_constraint *c, double value, double limit);
/* {"value", "limit", "kind": "max"|"min", "met"}: one row of a report's "constraints". */
json_t *ac_constraint_report(const ac_constraint *c, double value, double limit);

/* The table as JSON (an array of {name, metric, unit, kind, minimum, maximum, description}). */
json_t *ac_constraint_table_json(void);
/* web/constraints.js: the table for the dashboard (malloc'd text). */
char *ac_constraint_table_js(void);

#endif
