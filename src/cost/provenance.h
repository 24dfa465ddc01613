/*
 * provenance.h - where the inputs of a prediction come from, and how far
 * the figures of overlapping sources disagree (issue 32, item 5).
 *
 * A prediction combines a cost table (measured on the local CPU or GPU, or
 * a spec profile's roofline) with the serving engine's constants (per-step
 * overhead, runtime memory, all-reduce link: engines.c, assumed unless the
 * spec names them). ac_cost_provenance says which input came from where,
 * and, where a second source covers the same figures, predicts them with
 * both and reports each figure's ratio:
 * - a table measured on a GPU that has a spec profile (device.c): the
 *   profile's roofline for the same model, workload and engine;
 * - a measured CPU table with decode bands (decode steps of the engine
 *   itself): the same table's operator grids alone (bands off), the model
 *   a table without bands falls back to.
 * A roofline table has no second source (its constants are the profile's).
 * For a mixture-of-experts model, inputs.experts says what priced the
 * experts (ac_cost_expert_source) and, where a measured CPU table's expert
 * grid did, compares the figures with those of its GEMM grid.
 */
#ifndef AC_PROVENANCE_H
#define AC_PROVENANCE_H

#include <jansson.h>

#include "cost/costmodel.h"

/* {"table": ..., "inputs": {...}, "compared_with": ..., "figures": {name:
 * {"used", "other", "ratio"}}} for architecture c (the base model, in a
 * job's report) under workload w and engine p on table t; NULL when out of
 * memory. The comparison's fields are absent when there is no second
 * source. */
json_t *ac_cost_provenance(const ac_cost_table *t, const ac_carch *c, const ac_workload *w,
                           const ac_engine_profile *p);

#endif
