/*
 * modelcard.h - the model card every export carries: README.md in the
 * Hugging Face format (a YAML header with base_model, library_name,
 * pipeline_tag and tags, then Markdown), written from the job's report
 * (report.c's JSON, proto/events.md) alone: what was pruned (per layer,
 * before and after), for which target, workload and limits (each met or
 * missed, predicted for the base and for the export), held-out perplexity
 * of the base and of both arms with the chosen one marked, the timings on
 * the job's CPU, and how to load it (Transformers, vLLM, llama.cpp).
 */
#ifndef AC_MODELCARD_H
#define AC_MODELCARD_H

#include <jansson.h>

#include "core/err.h"

/* The card's text (owned by the caller), or NULL when out of memory. */
char *ac_model_card(const json_t *report);

/* Write it as DIR/README.md: 0, or -1 with e. */
int ac_model_card_write(const json_t *report, const char *dir, ac_err *e);

#endif
