/*
 * test_dnas_gain.c - the differentiable search earns its keep (issue 35,
 * item 2). On the tiny trained model, under one limit, the structure
 * ac_search_dnas picks (gates trained through the network on calibration
 * text, discretised, repaired to the limit) has a lower held-out loss than
 * the structure the search starts from: the surrogate search's result
 * (what init_surrogate sets the gates to), pruned in importance order and
 * repaired to the same limit. Both are measured the way a job measures an
 * arm: ac_prune, then ac_perplexity over the held-out text. The claim must
 * hold for every seed, by at least the case's margin on average.
 *
 * Mutation check: with ac_dnas_opts.zero_task_grad the gates get only the
 * limit's cost gradient, nothing from the network; the same comparison
 * must then show no such gain, so the gain comes from the gradients, not
 * from the initialisation or the repair.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "expert_search.h"
#include "search/dnas.h"
#include "runtime/eval.h"
#include "runtime/kernels_cpu.h"
#include "search/slice.h"
#include "synth.h"

static ac_model M;
static ac_importance IMP;
static int *IDS, *HIDS, HAVE;
static size_t NIDS, NH;

static int setup(void) {
    if (HAVE) return HAVE > 0;
    ac_err e;
    char tiny[1100], held[1200];
    HAVE = -1;
    if (ck_load_tiny(&M, &IDS, &NIDS, 8192, &e)) return 0;
    ck_build_path(tiny, sizeof tiny, "models/tiny");
    ck_build_path(held, sizeof held, "data/heldout.txt");
    if (ac_load_text_ids(tiny, held, &HIDS, &NH, M.a.vocab, &e)) return 0;
    if (ac_importance_compute(&M, IDS, NIDS, 64, 32, 0, NULL, NULL, &IMP, &e)) return 0;
    HAVE = 1;
    return 1;
}

/* Held-out loss (mean nll, nats) of src pruned to a with the unit orders imp. */
static double heldout_nll_of(const ac_model *src, const ac_arch *a, const ac_importance *imp) {
    ac_model pm;
    ac_err e;
    ac_ppl_result r;
    ac_ppl_opts po = {.ctx = 128, .batch = 4};
    if (ac_prune(src, a, imp, &pm, &e)) return NAN;
    int rc = ac_perplexity(&pm, HIDS, NH, &po, NULL, NULL, NULL, &r, &e);
    ac_model_free(&pm);
    return rc ? NAN : r.nll;
}

static double heldout_nll(const ac_arch *a, const ac_importance *imp) { return heldout_nll_of(&M, a, imp); }

typedef struct {
    const char *name;
    ac_export_target target;
    int ffn_multiple; /* the job's default grid: 256 on deci, 32 otherwise */
    const char *device;
    ac_workload w;
    double params, mem; /* limits as fractions of the unpruned model's predicted figure (0: none) */
    double margin;      /* nats: the least mean gain the claim asks for */
} gain_case;


static int make_problem(problem_t *P, const gain_case *c, unsigned seed) {
    ac_err e;
    if (ac_cost_roofline(ac_device_spec_find(c->device), "bf16", &P->t, &e)) return -1;
    P->w = c->w;
    ac_engine_profile_default(&P->pr, 0);
    ac_search_opts so = {.steps = 300, /* the job's defaults */
                         .seed = seed,
                         .lr = 0.03,
                         .ffn_multiple = c->ffn_multiple,
                         .hidden_multiple = 16,
                         .prune_hidden = 1,
                         .target = c->target};
    P->p = (ac_search_problem){
        .table = &P->t, .workload = &P->w, .profile = &P->pr, .imp = &IMP, .base = &M.a, .opts = so};
    ac_carch ca;
    ac_cost k;
    ac_carch_from_arch(&M.a, &ca, NULL);
    ac_cost_predict(&P->t, &ca, &P->w, &P->pr, 0, &k);
    ac_carch_free(&ca);
    P->p.limits.max_params = c->params * k.params;
    P->p.limits.max_mem_gib = c->mem * k.mem_gib;
    return 0;
}

/* Held-out loss of the search's start and of its result for one seed:
 * out[0] start, out[1] result. Returns -1 on a failure (printed). */
static int start_and_result(const gain_case *c, unsigned seed, int steps, int zero, double *out) {
    problem_t P;
    ac_err e;
    if (make_problem(&P, c, seed)) return -1;
    ac_search_result s, r;
    ac_importance ord;
    ac_dnas_opts o;
    ac_dnas_defaults(&o);
    o.steps = steps;
    o.zero_task_grad = zero;
    int rc = ac_search_autocompress(&P.p, &s, &e);
    if (!rc) {
        rc = ac_search_dnas(&P.p, &M, IDS, NIDS, &o, &r, &ord, &e);
        if (rc) ac_search_result_free(&s);
    }
    if (rc) {
        fprintf(stderr, "  search: %s\n", e.msg);
        ac_cost_table_free(&P.t);
        return -1;
    }
    out[0] = s.feasible ? heldout_nll(&s.arch, &IMP) : NAN;
    out[1] = r.feasible ? heldout_nll(&r.arch, &ord) : NAN;
    json_t *ja = ac_arch_to_json(&s.arch), *jb = ac_arch_to_json(&r.arch);
    char *sa = json_dumps(ja, JSON_COMPACT), *sb = json_dumps(jb, JSON_COMPACT);
    printf("   seed %u%s: start %.5f  dnas %.5f  gain %+.5f nats\n     start %s\n     dnas  %s\n", seed,
           zero ? " (task gradient zeroed)" : "", out[0], out[1], out[0] - out[1], sa, sb);
    free(sa);
    free(sb);
    json_decref(ja);
    json_decref(jb);
    ac_search_result_free(&s);
    ac_search_result_free(&r);
    ac_importance_free(&ord);
    ac_cost_table_free(&P.t);
    return 0;
}

/* The claim for case c: every seed's result below its start, and the mean
 * gain at least the case's margin. 1 holds, 0 not, -1 a search failed. */
static int claim_holds(const gain_case *c, int seeds, int steps, int zero, double *mean) {
    double v[2], sum = 0;
    int every = 1;
    for (int s = 1; s <= seeds; s++) {
        if (start_and_result(c, (unsigned)s, steps, zero, v) || !isfinite(v[0]) || !isfinite(v[1])) return -1;
        every &= v[1] < v[0];
        sum += v[0] - v[1];
    }
    *mean = sum / seeds;
    return every && *mean >= c->margin;
}

/* gguf under a memory limit at a KV-cache-bound workload (the suite's
 * case); the deci target (the job's default, its FFN grid 256) under a
 * parameter limit. */
static const gain_case CASES[] = {
    {"memory 0.85x, L4 batch 512, gguf",
     AC_EXPORT_GGUF,
     32,
     "L4",
     {.batch = 512, .prompt_len = 1024, .gen_len = 256},
     0,
     0.85,
     0.005},
    {"params 0.7x, deci", AC_EXPORT_DECI, 256, "H100", {.batch = 8, .prompt_len = 256, .gen_len = 64}, 0.7, 0, 0.02},
};

/* The suite runs case 0 with 3 seeds (its mutation run with 1) and SHORT_STEPS gate steps;
 * AC_DNAS_GAIN_FULL=1 (bench/run_all.sh, docs/benchmarks.md) every case
 * with 5 seeds at the job's 300 steps. */
#define SHORT_STEPS 150
static void test_dnas_beats_its_start(void) {
    if (!setup()) SKIP("no tiny model or held-out text (make tiny-model)");
    int full = getenv("AC_DNAS_GAIN_FULL") != NULL, seeds = full ? 5 : 3, steps = full ? 300 : SHORT_STEPS;
    int ncase = full ? (int)(sizeof CASES / sizeof *CASES) : 1;
    for (int k = 0; k < ncase; k++) {
        const gain_case *c = &CASES[k];
        double mean = 0, mmean = 0;
        printf("   %s, %d seeds, %d gate steps\n", c->name, seeds, steps);
        int ok = claim_holds(c, seeds, steps, 0, &mean);
        printf("   mean gain %+.5f nats (margin %.3f)\n", mean, c->margin);
        CHECK(ok == 1, "%s: the search does not beat its start by %.3f nats: mean gain %.5f", c->name, c->margin, mean);
        /* the suite's mutation run takes one seed: the claim over one seed is
         * easier to meet than over three, so its failing there is the
         * stricter check (with the task gradient zeroed, seeds 1-3 gave
         * the same gain, +0.00156 nats, in the 2026-12-07 suite run) */
        int mut = claim_holds(c, full ? seeds : 1, steps, 1, &mmean);
        printf("   mutation (no task gradient): mean gain %+.5f nats\n", mmean);
        CHECK(mut == 0, "%s: with the gates' task gradient zeroed the claim still holds (mean gain %.5f)", c->name,
              mmean);
    }
}

/* search.keep_weights (issue 39 item 4): with cotrain and keep the search
 * hands over the weights it trained with the gates. They are not the base
 * model's, and the search's structure pruned from them has a lower held-out
 * loss than the same structure, in the same unit orders, pruned from the
 * base weights (what the search gave before: the co-trained copy was
 * discarded). Without keep nothing is handed over. Mutation check: at a
 * weight rate of 1e-12 the kept weights are the base's to within rounding
 * and the held-out losses agree, so the gain is the training's. */
#define KEEP_STEPS 60
static int kept_search(unsigned seed, double w_lr, int keep, ac_search_result *r, ac_importance *ord, problem_t *P) {
    ac_err e;
    if (make_problem(P, &CASES[0], seed)) return -1;
    ac_dnas_opts o;
    ac_dnas_defaults(&o);
    o.steps = KEEP_STEPS;
    o.cotrain = 1;
    o.keep = keep;
    o.w_lr = w_lr;
    if (ac_search_dnas(&P->p, &M, IDS, NIDS, &o, r, ord, &e)) {
        fprintf(stderr, "  search: %s\n", e.msg);
        ac_cost_table_free(&P->t);
        return -1;
    }
    return 0;
}

/* The largest |difference| between the layer-0 query projections of src and M pruned to a (fp32). */
static double wq_diff(const ac_model *src, const ac_arch *a, const ac_importance *imp) {
    ac_model x, y;
    ac_err e;
    if (ac_prune(src, a, imp, &x, &e)) return NAN;
    if (ac_prune(&M, a, imp, &y, &e)) {
        ac_model_free(&x);
        return NAN;
    }
    double d = 0;
    size_t n = (size_t)a->layers[0].n_heads * a->head_dim * a->hidden;
    for (size_t i = 0; x.L[0].wq && i < n; i++) d = fmax(d, fabs((double)x.L[0].wq[i] - y.L[0].wq[i]));
    ac_model_free(&x);
    ac_model_free(&y);
    return d;
}

static void test_kept_weights_are_trained(void) {
    if (!setup()) SKIP("no tiny model or held-out text (make tiny-model)");
    const double lrs[2] = {1e-4, 1e-12}; /* the default weight rate; the mutation's */
    for (int k = 0; k < 2; k++) {
        problem_t P;
        ac_search_result r;
        ac_importance ord;
        if (kept_search(1, lrs[k], 1, &r, &ord, &P)) {
            CHECK(0, "cotrain search with keep failed");
            return;
        }
        CHECK(r.trained && r.trained->a.n_layers == M.a.n_layers && r.trained->a.hidden == M.a.hidden,
              "keep: no co-trained model of the base architecture handed over");
        if (!r.trained || !r.feasible) {
            CHECK(r.feasible, "keep: infeasible result");
            ac_search_result_free(&r), ac_importance_free(&ord), ac_cost_table_free(&P.t);
            return;
        }
        double kept = heldout_nll_of(r.trained, &r.arch, &ord), base = heldout_nll(&r.arch, &ord);
        double dw = wq_diff(r.trained, &r.arch, &ord);
        printf("   w_lr %g, %d steps: held-out nll kept %.5f, base weights %.5f (gain %+.5f); max |dWq| %.3g\n",
               lrs[k], KEEP_STEPS, kept, base, base - kept, dw);
        if (k == 0) {
            CHECK(dw > 1e-4, "keep: the export's weights are the base's (max |dWq| %.3g)", dw);
            CHECK(kept < base - 0.005, "keep: the kept weights' held-out loss %.5f is not below the base weights' %.5f",
                  kept, base);
        } else {
            CHECK(dw < 1e-5, "mutation: at w_lr 1e-12 the weights moved (max |dWq| %.3g)", dw);
            CHECK(fabs(kept - base) < 1e-4, "mutation: at w_lr 1e-12 the losses differ (%.5f, %.5f)", kept, base);
        }
        ac_search_result_free(&r);
        ac_importance_free(&ord);
        ac_cost_table_free(&P.t);
    }
    problem_t P;
    ac_search_result r;
    ac_importance ord;
    if (kept_search(1, 1e-4, 0, &r, &ord, &P)) {
        CHECK(0, "cotrain search without keep failed");
        return;
    }
    CHECK(r.trained == NULL, "without keep the co-trained copy is handed over");
    ac_search_result_free(&r);
    ac_importance_free(&ord);
    ac_cost_table_free(&P.t);
}

int main(int argc, char **argv) {
    ac_set_threads(ck_threads());
    if (!(argc > 1 && !strcmp(argv[1], "keep"))) RUN(test_dnas_beats_its_start); /* "keep": that test alone */
    RUN(test_kept_weights_are_trained);
    ac_importance_free(&IMP);
    ac_model_free(&M);
    free(IDS);
    free(HIDS);
    return DONE();
}
