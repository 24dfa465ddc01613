/*
 * test_kd_choice.c - the KD-aware choice's pick (src/pipeline/candidates.c,
 * ac_kd_pick): the candidate with the lowest loss AFTER its short
 * distillation wins, not the one with the lowest zero-shot loss, in a case
 * built so that the two rankings disagree (the losses of a tiny-model job,
 * docs/benchmarks.md); candidates left unranked (infeasible) never win.
 * The job-level checks (budget split, the report's candidates, the
 * zero-shot mutation on the tiny model) are tests/test_kd_budget.py.
 */
#include "check.h"
#include "pipeline/candidates_int.h"

/* three structures: the search's has the lowest zero-shot loss, the
 * surrogate's the lowest after the short distillation */
static const double BEFORE[3] = {4.0790, 4.0983, 4.0793}, AFTER[3] = {4.2223, 4.2012, 4.2035};

static void test_pick_after_distillation(void) {
    int ok[3] = {1, 1, 1};
    int kd = ac_kd_pick(BEFORE, AFTER, ok, 3, 1), zs = ac_kd_pick(BEFORE, AFTER, ok, 3, 0);
    CHECK(kd == 1, "picked %d, want the surrogate's (1): lowest loss after distillation", kd);
    CHECK(zs == 0, "the zero-shot ranking picks %d, want 0", zs);
    /* the mutation (zero-shot ranking) ends worse after distillation */
    CHECK(AFTER[zs] > AFTER[kd], "%g vs %g", AFTER[zs], AFTER[kd]);
    /* the pick is the argmin over every ranked candidate, whatever the order */
    for (int i = 0; i < 3; i++)
        CHECK(AFTER[kd] <= AFTER[i], "candidate %d has %g < %g", i, AFTER[i], AFTER[kd]);
}

static void test_pick_unranked_and_ties(void) {
    int ok[3] = {1, 0, 1};
    CHECK(ac_kd_pick(BEFORE, AFTER, ok, 3, 1) == 2, "the unranked (infeasible) candidate 1 must not win");
    int none[3] = {0, 0, 0};
    CHECK(ac_kd_pick(BEFORE, AFTER, none, 3, 1) == -1, "no ranked candidate: -1");
    double tie[3] = {4.1, 4.1, 4.2};
    int all[3] = {1, 1, 1};
    CHECK(ac_kd_pick(tie, tie, all, 3, 1) == 0, "a tie goes to the first (the search's own structure)");
}

int main(void) {
    RUN(test_pick_after_distillation);
    RUN(test_pick_unranked_and_ties);
    return DONE();
}
