/*
 * reporthtml.h - report.html: the job's report as one self-contained page a
 * person opens or attaches to a review (inline CSS and SVG, no script, no
 * external asset, nothing fetched), written from the report (report.c's
 * JSON, proto/events.md) alone, beside report.json and the model card:
 *  - the choice: which arm was exported and why, and the note when the arm
 *    not exported met every limit with a lower perplexity;
 *  - the limits: for every limit and every arm (the base included) the
 *    predicted figure, met or missed, and whether each arm met all of them;
 *  - quality before and after: held-out perplexity of the base and each arm
 *    (before distillation too), parameters, distillation's first and last
 *    loss;
 *  - cost: every predicted figure for the target per arm, and the figures
 *    measured on the job's CPU (and on a local GPU target) against the cost
 *    table's prediction, with the relative error;
 *  - structure per layer before and after for both arms, as bars (SVG) and
 *    a table;
 *  - curves (optional): the search loss and each arm's distillation loss
 *    per step, from the job's events; the daemon passes them when it serves
 *    GET /v1/jobs/{id}/report.html, the job's own file has none.
 * Every string from the report is HTML-escaped.
 */
#ifndef AC_REPORTHTML_H
#define AC_REPORTHTML_H

#include <jansson.h>

#include "err.h"

/* curves, or NULL: {"search": [[step, loss], ...], "search_label": TEXT,
 * "distill": {ARM: [[step, loss], ...]}}. The page's text (owned by the
 * caller), or NULL when out of memory. */
char *ac_report_html(const json_t *report, const json_t *curves);

/* Write it (no curves) as DIR/report.html, confined (fsafe_write.h): 0, or
 * -1 with e. */
int ac_report_html_write(const json_t *report, const char *dir, ac_err *e);

#endif
