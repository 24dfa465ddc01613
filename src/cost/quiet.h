/*
 * quiet.h - measurements that hold on a shared machine.
 *
 * On a VM a neighbour on the same physical core can slow compute-bound code
 * 1.3-2x for tens of seconds at a time (seen on the 2-core AMD machine: a
 * whole 16-s cost table measured 25% slow, its large-M GEMMs 60% slow). The
 * minimum of back-to-back repeats cannot escape a slow period that long, and
 * the hypervisor reports no steal time to detect it by.
 *
 * So a measurement is split into units, and a reference probe (a fixed
 * compute-bound GEMM, ac_cost_ref_probe_us) is timed before the first unit
 * and after each one. A unit is quiet when both probes around it ran within
 * tol of the machine's quiet level (the second-quickest probe seen, so one
 * lucky probe does not set it; or an anchor, the quiet reference of an
 * earlier measurement such as the cost table's, when quicker); the
 * disturbed units are measured again, each unit keeping its own minimum,
 * for up to max_rounds rounds and budget_s seconds after the first pass.
 * What stays disturbed is reported, not hidden.
 *
 * The module knows nothing of what a unit measures: the caller's callbacks
 * time it and keep its minimum (tests script both).
 */
#ifndef AC_QUIET_H
#define AC_QUIET_H

#define AC_QUIET_MAX_UNITS 64
/* The tolerance the cost table and measure.c use: probes within 10% of the quietest. */
#define AC_QUIET_TOL 1.10

typedef struct {
    int (*unit)(void *ud, int i); /* measure unit i (again), keeping its minimum; nonzero stops the run */
    double (*probe)(void *ud);    /* the reference probe, microseconds */
    void *ud;
    int n;            /* units, at most AC_QUIET_MAX_UNITS */
    double tol;       /* a unit is quiet when its probes are within tol x the quietest (1.10) */
    double anchor_us; /* > 0: a quiet reference known beforehand */
    int max_rounds;   /* rounds of re-measurement after the first pass */
    double budget_s;  /* seconds those rounds may take in all (after the first pass) */
} ac_quiet;

typedef struct {
    double ref_us;      /* the run's quiet level: its second-quickest probe (the quickest below 3 probes) */
    double quiet_us;    /* what units were judged against: min(ref_us, anchor) */
    int remeasured;     /* unit measurements beyond the first pass */
    int disturbed;      /* units still disturbed at the end */
    int rounds;         /* rounds of re-measurement run */
    double worst_ratio; /* the most disturbed unit's probe / quiet_us at the end */
} ac_quiet_result;

/* Run q; the first unit error is returned (its status), else 0. The units
 * may be measured in any order but each at least once. */
int ac_quiet_run(const ac_quiet *q, ac_quiet_result *r);

/* A process-wide cap on budget_s, in seconds (< 0, the default: none):
 * ac_quiet_run re-measures for min(q->budget_s, cap). The daemon's
 * quiet_budget_s, for a machine where a quick cost table matters more than
 * a quiet one (its test runs); 0 keeps the first pass only. */
void ac_quiet_set_budget_cap(double seconds);

#endif
