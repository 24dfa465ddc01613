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
 *    a table (a mixture-of-experts model: experts kept and expert FFN width
 *    too, and each arm's top-k with the top-k choices the search tried);
 *  - task accuracy (eval.tasks): per task and arm, acc +- its standard
 *    error and acc_norm, before distillation beside it;
 *  - curves: the search loss and each arm's distillation loss per step,
 *    gathered from the job's events (ac_report_curves_add): the job gathers
 *    them as it emits them for its own file, the daemon from the stored
 *    events when it serves GET /v1/jobs/{id}/report.html, so both pages are
 *    the same; a page made from report.json alone has none.
 * Every string from the report is HTML-escaped.
 */
#ifndef AC_REPORTHTML_H
#define AC_REPORTHTML_H

#include <jansson.h>

#include "core/err.h"

/* Empty curves: {"search": [], "search_label": "search loss", "distill":
 * {}} (owned by the caller), or NULL when out of memory. */
json_t *ac_report_curves_new(void);
/* Add one job event (kind and data as the job emits them, proto/events.md)
 * to curves when it is a point of one: a "search" event of the gate trainer
 * (phase "dnas": [step, task_loss]) or of the Lagrangian search (phase
 * "autocompress": [step, loss]), or a "distill" event ([step, loss] under
 * its arm). Other events, and a NULL curves, are ignored. */
void ac_report_curves_add(json_t *curves, const char *kind, const json_t *data);

/* curves, or NULL (report.json alone): as ac_report_curves_new makes them.
 * The page's text (owned by the caller), or NULL when out of memory. */
char *ac_report_html(const json_t *report, const json_t *curves);

/* Write it as DIR/report.html, confined (fsafe_write.h): 0, or -1 with e. */
int ac_report_html_write(const json_t *report, const json_t *curves, const char *dir, ac_err *e);

#endif
