/*
 * test_quiet.c - quiet measurements (src/cost/quiet.c) on scripted probes
 * and units: disturbed units are measured again until their probes are
 * within the tolerance, each keeping its minimum; an anchor from an earlier
 * measurement holds units to it; rounds and errors stop it. Then the real
 * reference probe, and the table's quiet fields through JSON.
 */
#include <math.h>
#include <string.h>

#include "check.h"
#include "cost/costmodel.h"
#include "runtime/engine.h"
#include "pipeline/measure_int.h"
#include "cost/quiet.h"
#include "synth_cost.h"

/* Probes answer from a script (its last value repeats); unit i's k-th
 * measurement reads time[i][k], keeping the minimum as a real unit does. */
typedef struct {
    const double *probes;
    int np, pi;
    double time[8][8];
    int calls[8];
    double best[8];
    int fail_at; /* unit that fails on its first call, -1: none */
} script;

static double s_probe(void *p) {
    script *s = p;
    double v = s->probes[s->pi < s->np ? s->pi : s->np - 1];
    s->pi++;
    return v;
}

static int s_unit(void *p, int i) {
    script *s = p;
    if (i == s->fail_at) return -7;
    double t = s->time[i][s->calls[i] < 8 ? s->calls[i] : 7];
    s->calls[i]++;
    s->best[i] = fmin(s->best[i], t);
    return 0;
}

static void script_init(script *s, const double *probes, int np) {
    memset(s, 0, sizeof *s);
    s->probes = probes;
    s->np = np;
    s->fail_at = -1;
    for (int i = 0; i < 8; i++) {
        s->best[i] = INFINITY;
        for (int k = 0; k < 8; k++) s->time[i][k] = 100 + i;
    }
}

/* Four units, 2 and 3 run while the probe was twice as slow (and taking
 * 1.8x as long); 3 rounds and 60 s allowed. */
static ac_quiet disturbed_pair(script *s) {
    static const double pr[] = {10, 10, 10.5, 20, 20, 10, 10, 10, 10};
    script_init(s, pr, sizeof pr / sizeof *pr);
    s->time[2][0] = 180;
    s->time[3][0] = 185;
    return (ac_quiet){s_unit, s_probe, s, 4, 1.10, 0, 3, 60};
}

/* One round measures units 2 and 3 again, quiet, and their minima are the
 * quiet times. */
static void test_disturbed_units_measured_again(void) {
    script s;
    ac_quiet q = disturbed_pair(&s);
    ac_quiet_result r;
    CHECK(ac_quiet_run(&q, &r) == 0, "run");
    CHECK(s.calls[0] == 1 && s.calls[1] == 1 && s.calls[2] == 2 && s.calls[3] == 2, "calls %d %d %d %d", s.calls[0],
          s.calls[1], s.calls[2], s.calls[3]);
    CHECK(r.remeasured == 2 && r.rounds == 1 && r.disturbed == 0, "remeasured %d rounds %d disturbed %d", r.remeasured,
          r.rounds, r.disturbed);
    CHECK(s.best[2] == 102 && s.best[3] == 103, "minima %g %g", s.best[2], s.best[3]);
    CHECK(r.ref_us == 10 && r.quiet_us == 10 && fabs(r.worst_ratio - 1.05) < 1e-12, "ref %g quiet %g worst %g",
          r.ref_us, r.quiet_us, r.worst_ratio);
    /* unit 1 sat between probes 10 and 10.5: within 10%, not measured again */
}

/* A whole measurement in one slow period looks quiet to itself; an anchor
 * (the cost table's reference) shows it is not: every unit is measured
 * again for the rounds allowed and what stays disturbed is reported. */
static void test_anchor_holds_units(void) {
    static const double pr[] = {13};
    script s;
    script_init(&s, pr, 1);
    ac_quiet q = {s_unit, s_probe, &s, 3, 1.10, 0, 2, 60};
    ac_quiet_result r;
    CHECK(ac_quiet_run(&q, &r) == 0 && r.disturbed == 0 && r.remeasured == 0, "no anchor: quiet to itself");
    script_init(&s, pr, 1);
    q.anchor_us = 10;
    CHECK(ac_quiet_run(&q, &r) == 0, "anchored run");
    CHECK(r.rounds == 2 && r.remeasured == 6 && r.disturbed == 3, "rounds %d remeasured %d disturbed %d", r.rounds,
          r.remeasured, r.disturbed);
    CHECK(r.quiet_us == 10 && r.ref_us == 13 && fabs(r.worst_ratio - 1.3) < 1e-12, "quiet %g ref %g worst %g",
          r.quiet_us, r.ref_us, r.worst_ratio);
    /* the machine quiet again (probes at the anchor): one round settles it */
    static const double pr2[] = {13, 13, 13, 13, 10};
    script_init(&s, pr2, 5);
    CHECK(ac_quiet_run(&q, &r) == 0 && r.rounds == 1 && r.disturbed == 0 && r.remeasured == 3,
          "rounds %d disturbed %d remeasured %d", r.rounds, r.disturbed, r.remeasured);
}

/* One lucky probe (half the others) does not hold every unit to itself:
 * the level is the second-quickest probe. */
static void test_one_lucky_probe(void) {
    static const double pr[] = {10, 5, 10.2, 10.4};
    script s;
    script_init(&s, pr, 4);
    ac_quiet q = {s_unit, s_probe, &s, 3, 1.10, 0, 3, 60};
    ac_quiet_result r;
    CHECK(ac_quiet_run(&q, &r) == 0 && r.remeasured == 0 && r.disturbed == 0 && r.ref_us == 10,
          "remeasured %d disturbed %d level %g", r.remeasured, r.disturbed, r.ref_us);
}

/* A unit's error stops the run and is returned; no rounds follow. */
static void test_unit_error_stops(void) {
    static const double pr[] = {10};
    script s;
    script_init(&s, pr, 1);
    s.fail_at = 1;
    ac_quiet q = {s_unit, s_probe, &s, 4, 1.10, 5, 3, 60};
    ac_quiet_result r;
    CHECK(ac_quiet_run(&q, &r) == -7, "the unit's status");
    CHECK(s.calls[0] == 1 && s.calls[2] == 0 && s.calls[3] == 0 && r.rounds == 0, "stopped at the failing unit");
}

/* The time budget ends the rounds even when units stay disturbed. */
static void test_budget(void) {
    static const double pr[] = {20};
    script s;
    script_init(&s, pr, 1);
    ac_quiet q = {s_unit, s_probe, &s, 2, 1.10, 10, 50, 0};
    ac_quiet_result r;
    CHECK(ac_quiet_run(&q, &r) == 0 && r.rounds == 0 && r.remeasured == 0 && r.disturbed == 2,
          "budget 0: rounds %d disturbed %d", r.rounds, r.disturbed);
}

/* The process-wide cap (the daemon's quiet_budget_s): 0 keeps the first
 * pass only, however large q's budget; a cap above the budget changes
 * nothing; a negative cap removes it. */
static void test_budget_cap(void) {
    int rounds[3], remeasured[3], disturbed[3];
    double caps[3] = {0, 1e6, -1};
    for (int c = 0; c < 3; c++) {
        script s;
        ac_quiet q = disturbed_pair(&s);
        ac_quiet_result r;
        ac_quiet_set_budget_cap(caps[c]);
        CHECK(ac_quiet_run(&q, &r) == 0, "run");
        rounds[c] = r.rounds, remeasured[c] = r.remeasured, disturbed[c] = r.disturbed;
    }
    ac_quiet_set_budget_cap(-1);
    CHECK(rounds[0] == 0 && remeasured[0] == 0 && disturbed[0] == 2, "cap 0: rounds %d remeasured %d disturbed %d",
          rounds[0], remeasured[0], disturbed[0]);
    for (int c = 1; c < 3; c++)
        CHECK(rounds[c] == 1 && remeasured[c] == 2 && disturbed[c] == 0, "cap %g: rounds %d remeasured %d disturbed %d",
              caps[c], rounds[c], remeasured[c], disturbed[c]);
}

/* The real probe: positive, and repeatable within a factor on an idle or
 * busy machine alike: each figure the least of three probes (as the quiet
 * runner reads a reference), since a neighbour may deschedule any one of
 * them (on a 2-core machine at load 17, one single probe took 1.3 ms where
 * the next took 0.17). */
static double probe_min3(void) {
    double m = ac_cost_ref_probe_us();
    for (int i = 0; i < 2; i++) {
        double v = ac_cost_ref_probe_us();
        if (v < m) m = v;
    }
    return m;
}

static void test_real_probe(void) {
    ac_set_threads(1);
    double a = probe_min3(), b = probe_min3();
    CHECK(a > 0 && b > 0 && isfinite(a) && isfinite(b), "probe %g %g us", a, b);
    CHECK(a < 4 * b && b < 4 * a, "two probes %g and %g us", a, b);
    /* 128 x 256 x 256 multiply-adds: not faster than 10 TFLOP/s on a CPU thread */
    CHECK(a > 2.0 * 128 * 256 * 256 / 10e12 * 1e6, "probe %g us is implausibly fast", a);
}

/* The quiet fields of a table survive JSON; a bad reference is refused by name. */
static void test_table_json(void) {
    ac_err e;
    ac_cost_table t, got;
    synth_table(&t);
    json_t *j = ac_cost_table_to_json(&t);
    CHECK(json_object_get(j, "quiet") == NULL, "no reference, no quiet object");
    json_object_set_new(j, "quiet",
                        json_pack("{s:f,s:i,s:i}", "reference_probe_us", 812.5, "remeasured", 3, "disturbed", 1));
    CHECK(ac_cost_table_from_json(j, &got, &e) == 0, "%s", e.msg);
    CHECK(got.ref_us == 812.5 && got.quiet_remeasured == 3 && got.quiet_disturbed == 1, "read %g %d %d", got.ref_us,
          got.quiet_remeasured, got.quiet_disturbed);
    json_t *j2 = ac_cost_table_to_json(&got);
    CHECK(json_equal(j, j2), "round trip");
    json_decref(j2);
    ac_cost_table_free(&got);
    json_object_set_new(json_object_get(j, "quiet"), "reference_probe_us", json_real(-1));
    const char *field = NULL;
    CHECK(ac_cost_table_validate(j, &field, &e) != 0 && field && !strcmp(field, "quiet.reference_probe_us"),
          "negative reference refused: %s", field ? field : "(none)");
    json_decref(j);
    ac_cost_table_free(&t);
}

/* measure_int.h's check of the timings' state against the table's: off when
 * either model's probe level is more than the tolerance quicker or slower
 * than the table's reference, giving that level (the slower one's when too
 * slow); never without references. */
static void test_timing_off_table(void) {
    ac_cost_table t = {0};
    t.ref_us = 100;
    ac_local_timing lt = {0};
    struct {
        double b, r, off;
    } c[] = {{100, 100, 0}, {109, 95, 0},  {92, 108, 0}, {112, 100, 112}, {100, 112, 112},
             {90, 100, 90}, {100, 85, 85}, {0, 100, 0},  {100, 0, 0},     {85, 120, 120}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        lt.qb.ref_us = c[i].b;
        lt.qres.ref_us = c[i].r;
        double got = ac_local_timing_off_table(&lt, &t);
        CHECK(got == c[i].off, "base %g result %g against 100: %g, expected %g", c[i].b, c[i].r, got, c[i].off);
    }
    lt.qb.ref_us = lt.qres.ref_us = 150;
    t.ref_us = 0;
    CHECK(!ac_local_timing_off_table(&lt, &t) && !ac_local_timing_off_table(&lt, NULL), "no table reference");
}

int main(void) {
    RUN(test_disturbed_units_measured_again);
    RUN(test_anchor_holds_units);
    RUN(test_one_lucky_probe);
    RUN(test_unit_error_stops);
    RUN(test_budget);
    RUN(test_budget_cap);
    RUN(test_real_probe);
    RUN(test_table_json);
    RUN(test_timing_off_table);
    return DONE();
}
