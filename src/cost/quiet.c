/* quiet.c - see quiet.h. */
#include "cost/quiet.h"

#include <assert.h>
#include <math.h>

#include "core/err.h"

/* The probes around a unit: it was only as quiet as the slower of the two. */
static double around(double before, double after) { return before > after ? before : after; }

/* The two quickest probes seen, and how many. */
typedef struct {
    double q1, q2;
    int n;
} quickest;

static double seen(quickest *k, double p) {
    if (p < k->q1) {
        k->q2 = k->q1;
        k->q1 = p;
    } else if (p < k->q2)
        k->q2 = p;
    k->n++;
    return p;
}

/* The machine's quiet level: the second-quickest probe once there are
 * three, so that one lucky probe does not hold every unit to itself. */
static double level_of(const quickest *k) { return k->n >= 3 ? k->q2 : k->q1; }

static double quiet_of(const ac_quiet *q, const quickest *k) {
    double l = level_of(k);
    return q->anchor_us > 0 ? fmin(l, q->anchor_us) : l;
}

static double budget_cap = -1;

void ac_quiet_set_budget_cap(double seconds) { budget_cap = seconds; }

int ac_quiet_run(const ac_quiet *q, ac_quiet_result *r) {
    *r = (ac_quiet_result){0};
    double budget = budget_cap >= 0 ? fmin(q->budget_s, budget_cap) : q->budget_s;
    double level[AC_QUIET_MAX_UNITS];
    assert(q->n >= 0 && q->n <= AC_QUIET_MAX_UNITS);
    quickest k = {INFINITY, INFINITY, 0};
    double p = seen(&k, q->probe(q->ud));
    int rc = 0;
    for (int i = 0; i < q->n && !rc; i++) {
        rc = q->unit(q->ud, i);
        double p2 = seen(&k, q->probe(q->ud));
        level[i] = around(p, p2);
        p = p2;
    }
    double t0 = ac_now(); /* the budget is for the rounds after the first pass */
    while (!rc && r->rounds < q->max_rounds && ac_now() - t0 < budget) {
        double quiet = quiet_of(q, &k);
        int any = 0;
        for (int i = 0; i < q->n; i++) any |= level[i] > q->tol * quiet;
        if (!any) break;
        r->rounds++;
        p = seen(&k, q->probe(q->ud));
        for (int i = 0; i < q->n && !rc && ac_now() - t0 < budget; i++) {
            if (level[i] <= q->tol * quiet) continue;
            rc = q->unit(q->ud, i);
            r->remeasured++;
            double p2 = seen(&k, q->probe(q->ud));
            level[i] = fmin(level[i], around(p, p2));
            p = p2;
        }
    }
    r->ref_us = level_of(&k);
    r->quiet_us = quiet_of(q, &k);
    for (int i = 0; i < q->n; i++) {
        r->disturbed += level[i] > q->tol * r->quiet_us;
        r->worst_ratio = fmax(r->worst_ratio, level[i] / r->quiet_us);
    }
    return rc;
}
