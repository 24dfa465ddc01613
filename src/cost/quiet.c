/* quiet.c - see quiet.h. */
#include "quiet.h"

#include <assert.h>
#include <math.h>

#include "err.h"

/* The probes around a unit: it was only as quiet as the slower of the two. */
static double around(double before, double after) { return before > after ? before : after; }

int ac_quiet_run(const ac_quiet *q, ac_quiet_result *r) {
    *r = (ac_quiet_result){0};
    double level[AC_QUIET_MAX_UNITS];
    assert(q->n >= 0 && q->n <= AC_QUIET_MAX_UNITS);
    double t0 = ac_now(), p = q->probe(q->ud), best = p;
    int rc = 0;
    for (int i = 0; i < q->n && !rc; i++) {
        rc = q->unit(q->ud, i);
        double p2 = q->probe(q->ud);
        level[i] = around(p, p2);
        best = fmin(best, p2);
        p = p2;
    }
    double quiet = q->anchor_us > 0 ? fmin(best, q->anchor_us) : best;
    while (!rc && r->rounds < q->max_rounds && ac_now() - t0 < q->budget_s) {
        int any = 0;
        for (int i = 0; i < q->n; i++) any |= level[i] > q->tol * quiet;
        if (!any) break;
        r->rounds++;
        p = q->probe(q->ud);
        best = fmin(best, p);
        for (int i = 0; i < q->n && !rc && ac_now() - t0 < q->budget_s; i++) {
            if (level[i] <= q->tol * quiet) continue;
            rc = q->unit(q->ud, i);
            r->remeasured++;
            double p2 = q->probe(q->ud);
            level[i] = fmin(level[i], around(p, p2));
            best = fmin(best, p2);
            p = p2;
        }
        quiet = q->anchor_us > 0 ? fmin(best, q->anchor_us) : best;
    }
    r->ref_us = best;
    r->quiet_us = quiet;
    for (int i = 0; i < q->n; i++) {
        r->disturbed += level[i] > q->tol * quiet;
        r->worst_ratio = fmax(r->worst_ratio, level[i] / quiet);
    }
    return rc;
}
