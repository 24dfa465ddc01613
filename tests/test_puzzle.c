/*
 * test_puzzle.c - the puzzle arm (src/search/puzzle.c, puzzlemip.c,
 * src/pipeline/jobpuzzle.c) against independent computations: GLPK's
 * choice equals a brute-force enumeration of every combination on small
 * programs; the block-local distillation score of a removed FFN equals the
 * normalised error computed here from the stream's masked forward; the
 * scores rank a deliberately bad variant (the least important FFN channels
 * kept) below the good one, and training lowers a variant's score; the
 * search's structure meets the limit by the whole cost model; and a job
 * with the arm reports three arms, the puzzle one meeting its limit, with
 * a budget split that sums to distill.tokens.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cost/costmodel.h"
#include "cost/engines.h"
#include "pipeline/job.h"
#include "pipeline/jobspec.h"
#include "search/importance.h"
#include "search/puzzle.h"
#include "search/stream.h"
#include "synth.h"

static unsigned seed_ = 4242;
static double urand(void) {
    seed_ = seed_ * 1103515245u + 12345u;
    return ((seed_ >> 8) & 0xffffff) / 16777216.0;
}

/* ---- the program against brute force ---- */

/* The best feasible combination by enumeration; -1 when none. */
static double brute(const ac_puzzle_mip *p, int total, int *best) {
    int G = p->n_groups, idx[8] = {0};
    double bv = INFINITY;
    for (;;) {
        double ov = 0;
        int ok = 1, j0 = 0;
        for (int g = 0; g < G; g++) ov += p->obj[j0 + idx[g]], j0 += p->n_choices[g];
        for (int c = 0; c < p->n_cons && ok; c++) {
            double s = 0;
            j0 = 0;
            for (int g = 0; g < G; g++) s += p->coef[c * total + j0 + idx[g]], j0 += p->n_choices[g];
            ok = s <= p->rhs[c] + 1e-12;
        }
        if (ok && ov < bv) bv = ov, memcpy(best, idx, sizeof(int) * G);
        int g = 0;
        while (g < G && ++idx[g] == p->n_choices[g]) idx[g++] = 0;
        if (g == G) break;
    }
    return bv;
}

static void test_mip_equals_bruteforce(void) {
    int solved = 0, infeasible = 0;
    for (int t = 0; t < 60; t++) {
        int G = 2 + (int)(urand() * 4), nch[8], total = 0, C = (int)(urand() * 4);
        for (int g = 0; g < G; g++) total += nch[g] = 1 + (int)(urand() * 5);
        double obj[64], coef[4 * 64], rhs[4];
        for (int j = 0; j < total; j++) obj[j] = urand();
        for (int c = 0; c < C; c++) {
            double lo = 0, hi = 0;
            for (int j = 0, g = 0, k = 0; j < total; j++) {
                coef[c * total + j] = urand() * 2 - (c == 2 ? 1 : 0.5);
                if (++k == nch[g]) k = 0, g++;
            }
            for (int g = 0, j0 = 0; g < G; j0 += nch[g++]) { /* the row's range over combinations */
                double mn = INFINITY, mx = -INFINITY;
                for (int k = 0; k < nch[g]; k++) mn = fmin(mn, coef[c * total + j0 + k]), mx = fmax(mx, coef[c * total + j0 + k]);
                lo += mn, hi += mx;
            }
            rhs[c] = lo + (hi - lo) * (urand() * 1.1 - 0.05); /* sometimes below every combination */
        }
        ac_puzzle_mip p = {.n_groups = G, .n_choices = nch, .obj = obj, .n_cons = C, .coef = coef, .rhs = rhs};
        int want[8], got[8];
        double bv = brute(&p, total, want), gv = 0;
        ac_err e;
        int rc = ac_puzzle_mip_solve(&p, got, &gv, &e);
        if (isinf(bv)) {
            CHECK(rc == 1, "case %d: brute force finds no feasible combination, GLPK returns %d", t, rc);
            infeasible++;
            continue;
        }
        CHECK(rc == 0, "case %d: GLPK %d (%s)", t, rc, rc < 0 ? e.msg : "infeasible");
        if (rc) continue;
        solved++;
        CHECK(fabs(gv - bv) < 1e-9, "case %d: objective %.12f against brute force %.12f", t, gv, bv);
        for (int g = 0; g < G; g++) CHECK(got[g] == want[g], "case %d group %d: %d against %d", t, g, got[g], want[g]);
    }
    printf("   %d programs solved as brute force solves them, %d infeasible in both\n", solved, infeasible);
    CHECK(solved >= 20 && infeasible >= 1, "too few cases of a kind: %d solved, %d infeasible", solved, infeasible);
}

/* 4000 random programs of the shapes that make GLPK 5.0's cover cuts abort
 * the process (integer costs, zero coefficients, negative right-hand
 * sides): each is solved or found infeasible, never an error. */
static void test_mip_never_aborts(void) {
    int st[3] = {0};
    for (int t = 0; t < 4000; t++) {
        int G = 1 + (int)(urand() * 8), nch[8], total = 0, C = (int)(urand() * 5), kind = t % 4;
        for (int g = 0; g < G; g++) total += nch[g] = 1 + (int)(urand() * 8);
        double obj[64], coef[5 * 64], rhs[5];
        for (int j = 0; j < total; j++) obj[j] = kind == 1 ? (int)(urand() * 3) : urand();
        for (int c = 0; c < C; c++) {
            for (int j = 0; j < total; j++)
                coef[c * total + j] = kind == 2   ? -(int)(urand() * 4)
                                      : kind == 3 ? (urand() < 0.5 ? 0 : urand())
                                                  : urand() - 0.5;
            rhs[c] = kind == 2 ? -(int)(urand() * 10) : urand() * 2 - 1;
        }
        ac_puzzle_mip p = {.n_groups = G, .n_choices = nch, .obj = obj, .n_cons = C, .coef = coef, .rhs = rhs,
                           .gap = t % 2 ? AC_PUZZLE_MIP_GAP : 0, .time_limit_s = 5};
        int ch[8];
        double v;
        ac_err e;
        int rc = ac_puzzle_mip_solve(&p, ch, &v, &e);
        st[rc + 1]++;
        CHECK(rc >= 0, "case %d: %s", t, e.msg);
    }
    printf("   %d solved, %d infeasible\n", st[1], st[2]);
    /* NaN and infinite entries: those choices are left out, never chosen */
    int nch[3] = {3, 3, 2};
    double obj[8] = {0.5, NAN, 0.9, 0.1, 0.4, 0.2, 0.3, 0.05}, coef[8] = {1, 0, 0, INFINITY, 1, 1, 0, 1}, rhs = 1.5;
    ac_puzzle_mip p = {.n_groups = 3, .n_choices = nch, .obj = obj, .n_cons = 1, .coef = coef, .rhs = &rhs};
    int ch[3];
    double v = 0;
    ac_err e;
    int rc = ac_puzzle_mip_solve(&p, ch, &v, &e);
    /* brute force over the finite choices: group 0 {0: .5 c1, 2: .9 c0}, group 1 {4: .4 c1, 5: .2 c1},
     * group 2 {6: .3 c0, 7: .05 c1}; cost <= 1.5 allows one c1 at most: best 0.9 + 0.2 + 0.3 = 1.4
     * against 0.5 + ... (two c1) infeasible */
    CHECK(rc == 0 && ch[0] == 2 && ch[1] == 2 && ch[2] == 0 && fabs(v - 1.4) < 1e-12,
          "rc %d, choice %d %d %d, objective %g", rc, ch[0], ch[1], ch[2], v);
}

/* ---- the library on the tiny model ---- */

static ac_model M;
static int *IDS, HAVE;
static size_t NIDS;
static ac_importance IMP;
static ac_puzzle_library LIB;
static ac_puzzle_opts OPTS;
#define CTX 64

static int setup(void) {
    if (HAVE) return HAVE > 0;
    ac_err e;
    HAVE = -1;
    if (ck_load_tiny(&M, &IDS, &NIDS, 8192, &e)) return 0;
    if (ac_importance_compute(&M, IDS, NIDS, CTX, 32, 0, NULL, NULL, &IMP, &e)) return 0;
    ac_puzzle_opts_default(&OPTS);
    OPTS.steps = 30, OPTS.windows = 16, OPTS.batch = 4;
    if (ac_puzzle_library_build(&M, &IMP, IDS, NIDS, CTX, &OPTS, NULL, NULL, &LIB, &e)) {
        fprintf(stderr, "library: %s\n", e.msg);
        return 0;
    }
    HAVE = 1;
    return 1;
}

/* The block with the parent's attention and no FFN: its held-out
 * normalised error computed here from the stream (the FFN masked to 0 is
 * its removal), on the library's windows (16, the last 4 held out). */
static void test_bld_score_of_removed_ffn(void) {
    if (!setup()) SKIP("no tiny model or calibration text (make tiny-model)");
    int W = 16, Wh = 4, H = M.a.hidden, F = M.a.layers[0].ffn;
    size_t row = (size_t)CTX * H, rows = (size_t)W * CTX;
    ac_stream s;
    ac_err e;
    CHECK(ac_stream_init(&s, &M, 4, CTX, &e) == 0, "%s", e.msg);
    float *X = malloc(rows * H * 4), *Y = malloc(rows * H * 4), *Z = malloc(rows * H * 4), *mask = calloc(F, 4);
    CHECK(ac_stream_embed(&M, IDS, (long)rows, X, &e) == 0, "%s", e.msg);
    ac_stream_mod mod = {.ffn_mask = mask};
    for (int l = 0; l < M.a.n_layers; l++) {
        memcpy(Y, X, rows * H * 4);
        memcpy(Z, X, rows * H * 4);
        for (int b = 0; b < W; b += 4) {
            ac_stream_layer(&s, l, Y + b * row, 4, NULL, NULL);
            ac_stream_layer(&s, l, Z + b * row, 4, &mod, NULL);
        }
        double num = 0, den = 0;
        for (size_t i = (W - Wh) * row; i < rows * H; i++) num += (double)(Z[i] - Y[i]) * (Z[i] - Y[i]), den += (double)Y[i] * Y[i];
        int nf = LIB.nf[l];
        double got = LIB.score[l][nf - 1], want = num / den;
        CHECK(LIB.ffn[l][nf - 1] == 0 && fabs(got - want) <= 1e-3 * want + 1e-9,
              "layer %d: score of the removed FFN %.6g, computed here %.6g", l, got, want);
        memcpy(X, Y, rows * H * 4);
    }
    free(X), free(Y), free(Z), free(mask);
    ac_stream_free(&s);
}

/* Ranking: in every layer of the tiny model (4 KV heads, FFN 384) 4
 * attention x 6 FFN variants, every block but the parent's (0 by
 * definition) scoring above 0; removing a sub-block scores worse than its widest reduced variant;
 * a variant sliced from the least important channels (untrained) scores
 * worse than the same width from the most important ones; training lowers
 * a variant's score. */
static void test_bld_ranks_variants(void) {
    if (!setup()) SKIP("no tiny model or calibration text (make tiny-model)");
    for (int l = 0; l < LIB.n_layers; l++) {
        int na = LIB.na[l], nf = LIB.nf[l];
        CHECK(na == 4 && nf == 6, "layer %d: %d attention x %d FFN variants, not 4 x 6", l, na, nf);
        for (int k = 1; k < na * nf; k++) CHECK(LIB.score[l][k] > 0, "layer %d block %d: %g", l, k, LIB.score[l][k]);
        CHECK(LIB.score[l][nf - 1] > LIB.score[l][1], "layer %d: FFN removed %g <= FFN at %d %g", l,
              LIB.score[l][nf - 1], LIB.ffn[l][1], LIB.score[l][1]);
        CHECK(LIB.score[l][(na - 1) * nf] > LIB.score[l][nf], "layer %d: attention removed %g <= %d KV heads %g", l,
              LIB.score[l][(na - 1) * nf], LIB.kv[l][1], LIB.score[l][nf]);
    }
    /* untrained libraries: the importance order, and the order reversed */
    ac_importance bad = IMP;
    int L = M.a.n_layers, F = M.a.layers[0].ffn;
    int **rev = malloc(sizeof(int *) * L);
    for (int l = 0; l < L; l++) {
        rev[l] = malloc(sizeof(int) * F);
        for (int c = 0; c < F; c++) rev[l][c] = IMP.ffn_order[l][F - 1 - c];
    }
    bad.ffn_order = rev;
    ac_puzzle_opts o = OPTS;
    o.steps = 0, o.keep_weights = 0;
    ac_puzzle_library good0, bad0;
    ac_err e;
    CHECK(ac_puzzle_library_build(&M, &IMP, IDS, NIDS, CTX, &o, NULL, NULL, &good0, &e) == 0, "%s", e.msg);
    CHECK(ac_puzzle_library_build(&M, &bad, IDS, NIDS, CTX, &o, NULL, NULL, &bad0, &e) == 0, "%s", e.msg);
    int f = 2; /* half the FFN */
    for (int l = 0; l < L; l++) {
        printf("   layer %d, FFN %d: untrained %.4g (least important kept %.4g), trained %.4g\n", l, LIB.ffn[l][f],
               good0.score[l][f], bad0.score[l][f], LIB.score[l][f]);
        CHECK(bad0.score[l][f] > good0.score[l][f], "layer %d: the bad slice %g <= the good one %g", l,
              bad0.score[l][f], good0.score[l][f]);
        CHECK(LIB.score[l][f] < good0.score[l][f], "layer %d: trained %g >= untrained %g", l, LIB.score[l][f],
              good0.score[l][f]);
    }
    ac_puzzle_library_free(&good0);
    ac_puzzle_library_free(&bad0);
    for (int l = 0; l < L; l++) free(rev[l]);
    free(rev);
}

/* The target spec tj (decref'd), its cost table and engine profile; 0 when ready. */
static int target_of(json_t *tj, ac_target_spec *ts, ac_cost_table *t, ac_engine_profile *pr) {
    ac_err e;
    int hit = 0, rc = ac_target_spec_parse(tj, ts, NULL, NULL, &e);
    json_decref(tj);
    if (!rc) rc = ac_cost_table_for(&ts->dev, ac_target_table_dtype(ts, ST_BF16), NULL, 2, 0, NULL, NULL, t, &hit, &e);
    CHECK(rc == 0, "%s", e.msg);
    if (!rc) ac_target_engine_for(ts, ST_BF16, pr);
    return rc;
}

/* The search under a latency limit on an H100 table: the chosen structure
 * meets it by the whole cost model, its objective is the sum of its
 * blocks' scores, and it is heterogeneous where the limit bites. */
static void test_search_meets_limit(void) {
    if (!setup()) SKIP("no tiny model or calibration text (make tiny-model)");
    ac_err e;
    ac_target_spec ts;
    ac_cost_table t;
    ac_engine_profile pr;
    if (target_of(json_pack("{s:s,s:{s:i,s:i,s:i}}", "device", "H100", "workload", "batch", 8, "prompt_len", 64,
                           "gen_len", 16), &ts, &t, &pr)) return;
    ac_search_problem p = {.table = &t, .workload = &ts.workload, .profile = &pr, .imp = &IMP, .base = &M.a};
    ac_carch c;
    ac_cost base;
    CHECK(ac_carch_from_arch(&M.a, &c, &e) == 0, "%s", e.msg);
    ac_cost_predict(&t, &c, &ts.workload, &pr, 0, &base);
    ac_carch_free(&c);
    double fr[3] = {0.9, 0.75, 0.6};
    for (int i = 0; i < 3; i++) {
        memset(&p.limits, 0, sizeof p.limits);
        p.limits.max_tpot_ms = fr[i] * base.tpot_ms;
        p.limits.max_params = (0.5 + 0.2 * i) * base.params;
        ac_search_result r;
        int ch[64];
        CHECK(ac_search_puzzle(&p, &LIB, &r, ch, &e) == 0, "%s", e.msg);
        double sum = 0;
        for (int l = 0; l < LIB.n_layers; l++) sum += LIB.score[l][ch[l]];
        ac_cost k;
        CHECK(ac_carch_from_arch(&r.arch, &c, &e) == 0, "%s", e.msg);
        ac_cost_predict(&t, &c, &ts.workload, &pr, 0, &k);
        ac_carch_free(&c);
        json_t *its = json_object_get(json_object_get(r.detail, "mip"), "iterations");
        printf("   tpot <= %.4f ms, params <= %.0f: tpot %.4f, params %.0f, score %.4g, %zu solve(s)\n",
               p.limits.max_tpot_ms, p.limits.max_params, k.tpot_ms, k.params, r.pred_loss, json_array_size(its));
        CHECK(r.feasible && k.tpot_ms <= p.limits.max_tpot_ms * (1 + 1e-9) && k.params <= p.limits.max_params,
              "limit %d missed: feasible %d, tpot %g, params %g", i, r.feasible, k.tpot_ms, k.params);
        CHECK(fabs(sum - r.pred_loss) <= 1e-12 + 1e-9 * sum, "objective %g, blocks' scores sum to %g", r.pred_loss, sum);
        ac_search_result_free(&r);
    }
    ac_cost_table_free(&t);
}

/* A served workload (arrivals, a simulated engine) is not additive over
 * layers: the first program's structure misses some limits by the whole
 * cost model, each is tightened and solved again until it is met. The
 * library is made up (scores growing with what a block removes) on an
 * 8-layer 2048-wide architecture: the search needs no weights. */
static ac_puzzle_library made_up_library(const ac_arch *A) {
    ac_puzzle_opts o;
    ac_puzzle_opts_default(&o);
    int L = A->n_layers;
    ac_puzzle_library lib = {.n_layers = L};
    lib.kv = calloc(L, sizeof *lib.kv), lib.ffn = calloc(L, sizeof *lib.ffn);
    lib.na = calloc(L, sizeof(int)), lib.nf = calloc(L, sizeof(int));
    lib.score = calloc(L, sizeof *lib.score);
    lib.attn_loss = calloc(L, sizeof *lib.attn_loss), lib.ffn_loss = calloc(L, sizeof *lib.ffn_loss);
    for (int l = 0; l < L; l++) {
        ac_puzzle_variants(A, l, &o, lib.kv[l], &lib.na[l], lib.ffn[l], &lib.nf[l]);
        for (int a = 0; a < lib.na[l]; a++)
            for (int f = 0; f < lib.nf[l]; f++) {
                double ra = 1 - (double)lib.kv[l][a] / A->layers[l].n_kv_heads,
                       rf = 1 - (double)lib.ffn[l][f] / A->layers[l].ffn;
                lib.score[l][a * lib.nf[l] + f] = (ra * ra + rf * rf) * (1 + 0.5 * urand());
            }
    }
    return lib;
}

static void test_search_tightens_missed_limits(void) {
    ac_arch A = mk_arch(8, 2048, 128, 16, 8, 5632, 32000);
    ac_puzzle_library lib = made_up_library(&A);
    ac_err e;
    ac_target_spec ts;
    ac_cost_table t;
    ac_engine_profile pr;
    if (target_of(json_pack("{s:s,s:{s:f,s:i,s:i,s:i,s:f}}", "device", "L4", "workload", "arrival_rate", 6.0,
                           "prompt_len", 1024, "gen_len", 256, "requests", 64, "length_spread", 0.5), &ts, &t, &pr)) return;
    ac_search_problem p = {.table = &t, .workload = &ts.workload, .profile = &pr, .base = &A};
    ac_carch c;
    ac_cost base;
    CHECK(ac_carch_from_arch(&A, &c, &e) == 0, "%s", e.msg);
    ac_cost_predict(&t, &c, &ts.workload, &pr, 0, &base);
    ac_carch_free(&c);
    int tightened = 0;
    for (int i = 0; i < 4; i++) {
        memset(&p.limits, 0, sizeof p.limits);
        double fr = 0.5 + 0.12 * i;
        p.limits.max_tpot_ms = fr * base.tpot_ms;
        p.limits.max_p99_e2e_ms = fr * base.p99_e2e_ms;
        ac_search_result r;
        CHECK(ac_search_puzzle(&p, &lib, &r, NULL, &e) == 0, "%s", e.msg);
        json_t *its = json_object_get(json_object_get(r.detail, "mip"), "iterations");
        size_t n = json_array_size(its);
        ac_cost k;
        CHECK(ac_carch_from_arch(&r.arch, &c, &e) == 0, "%s", e.msg);
        ac_cost_predict(&t, &c, &ts.workload, &pr, 0, &k);
        ac_carch_free(&c);
        printf("   limits at %.2f of the base: %zu solve(s), feasible %d (tpot %.3f <= %.3f, p99 e2e %.1f <= %.1f)\n",
               fr, n, r.feasible, k.tpot_ms, p.limits.max_tpot_ms, k.p99_e2e_ms, p.limits.max_p99_e2e_ms);
        if (r.feasible)
            CHECK(ac_constraints_violation(&p.limits, &k) <= 1e-9, "feasible but the whole model says %g",
                  ac_constraints_violation(&p.limits, &k));
        if (n > 1 && r.feasible) {
            tightened++;
            CHECK(!json_is_true(json_object_get(json_array_get(its, 0), "met")) &&
                      json_object_size(json_object_get(json_array_get(its, 0), "limits_tightened_to")) > 0,
                  "solve 1 of %zu met its limits or tightened none", n);
        }
        ac_search_result_free(&r);
    }
    CHECK(tightened >= 1, "no case needed a tightened limit: the served workload was additive after all");
    ac_cost_table_free(&t);
    ac_arch_free(&A);
    ac_puzzle_library_free(&lib);
}

/* Tensor parallelism over 2 GPUs: only blocks the engine splits are
 * chosen (the 1/10 FFN width, 563, is odd), and the choice maps back to
 * the library's blocks. */
static void test_search_tensor_parallel(void) {
    ac_arch A = mk_arch(8, 2048, 128, 16, 8, 5632, 32000);
    ac_puzzle_library lib = made_up_library(&A);
    ac_err e;
    ac_target_spec ts;
    ac_cost_table t;
    ac_engine_profile pr;
    if (target_of(json_pack("{s:s,s:i,s:{s:i,s:i,s:i}}", "device", "H100", "tp", 2, "workload", "batch", 8,
                           "prompt_len", 512, "gen_len", 128), &ts, &t, &pr)) return;
    CHECK(pr.tp == 2, "profile tp %d", pr.tp);
    ac_search_problem p = {.table = &t, .workload = &ts.workload, .profile = &pr, .base = &A};
    p.limits.max_params = 0.3 * ac_arch_params(&A);
    ac_search_result r;
    int ch[8];
    CHECK(ac_search_puzzle(&p, &lib, &r, ch, &e) == 0, "%s", e.msg);
    int odd = 0;
    for (int l = 0; l < 8; l++) {
        int v = 0, nf = lib.nf[l];
        const char *what = ac_tp_layer_unsplit(2, &r.arch.layers[l], &v);
        CHECK(!what, "layer %d: %d %s do not split", l, v, what ? what : "");
        CHECK(lib.kv[l][ch[l] / nf] == r.arch.layers[l].n_kv_heads && lib.ffn[l][ch[l] % nf] == r.arch.layers[l].ffn,
              "layer %d: choice %d is not the structure's block", l, ch[l]);
        for (int f = 0; f < nf; f++) odd += lib.ffn[l][f] % 2;
    }
    CHECK(r.feasible && odd > 0, "feasible %d, odd widths in the library %d", r.feasible, odd);
    ac_search_result_free(&r);
    ac_cost_table_free(&t);
    ac_arch_free(&A);
    ac_puzzle_library_free(&lib);
}

/* ---- the job ---- */

static void quiet(void *ud, const char *kind, json_t *data) { (void)ud, (void)kind, (void)data; }

static void test_job_three_arms(void) {
    if (!setup()) SKIP("no tiny model or calibration text (make tiny-model)");
    static ac_job_spec spec;
    char tiny[1100], calib[1100], held[1100], out[] = "/tmp/ac_test_puzzle_job_XXXXXX";
    ck_build_path(tiny, sizeof tiny, "models/tiny");
    ck_build_path(calib, sizeof calib, "data/calib.txt");
    ck_build_path(held, sizeof held, "data/heldout.txt");
    CHECK(mkdtemp(out) != NULL, "mkdtemp");
    double limit = 0.7 * ac_arch_params(&M.a);
    json_t *js = json_pack("{s:s,s:s,s:s,s:s,s:{s:s,s:{s:i,s:i,s:i}},s:{s:f},s:{s:i,s:i},s:i,s:{s:i,s:i},"
                           "s:{s:i,s:i,s:i},s:{s:b,s:i,s:i}}",
                           "model", tiny, "calibration", calib, "heldout", held, "output", out, "target", "device",
                           "H100", "workload", "batch", 1, "prompt_len", 64, "gen_len", 16, "constraints", "max_params",
                           limit, "search", "steps", 60, "dnas_steps", 20, "calibration_tokens", 4096, "eval", "ctx",
                           64, "windows", 8, "distill", "tokens", 8192, "seq_len", 64, "batch", 4, "puzzle", "enabled",
                           1, "steps", 10, "windows", 16);
    ac_err e;
    json_t *res = NULL;
    ac_job_ctx ctx = {.emit = quiet, .threads = ck_threads()};
    int rc = ac_job_spec_parse(js, &spec, NULL, &e) || ac_job_run(&spec, &ctx, &res, &e);
    json_decref(js);
    CHECK(rc == 0, "job: %s", e.msg);
    if (rc) return;
    json_t *arms = json_object_get(res, "arms"), *pz = json_object_get(res, "puzzle");
    CHECK(json_array_size(arms) == 3 && pz && json_object_get(res, "minitron") && json_object_get(res, "autocompress"),
          "arms: %zu", json_array_size(arms));
    double params = json_real_value(json_object_get(json_object_get(pz, "predicted"), "params")),
           ppl = json_number_value(json_object_get(pz, "perplexity")),
           pre = json_number_value(json_object_get(pz, "perplexity_pruned"));
    json_t *bud = json_object_get(pz, "budget");
    long bld = (long)json_integer_value(json_object_get(bud, "bld_tokens")),
         dist = (long)json_integer_value(json_object_get(bud, "distill_tokens"));
    printf("   puzzle: params %.0f (limit %.0f), perplexity %.3f after distillation (%.3f before; base %.3f, minitron "
           "%.3f, autocompress %.3f), %ld BLD + %ld distillation tokens\n",
           params, limit, ppl, pre, json_number_value(json_object_get(json_object_get(res, "baseline"), "perplexity")),
           json_number_value(json_object_get(json_object_get(res, "minitron"), "perplexity")),
           json_number_value(json_object_get(json_object_get(res, "autocompress"), "perplexity")), bld, dist);
    CHECK(json_is_true(json_object_get(pz, "feasible")) && params <= limit && params > 0, "params %g, limit %g", params,
          limit);
    CHECK(isfinite(ppl) && ppl > 1 && ppl < pre, "perplexity %g after distillation, %g before", ppl, pre);
    CHECK(bld > 0 && bld + dist == 8192, "budget %ld + %ld", bld, dist);
    long trained = (long)json_integer_value(json_object_get(json_object_get(pz, "distill"), "tokens"));
    CHECK(trained > 0 && trained <= dist, "distilled %ld tokens of its %ld", trained, dist);
    /* the report page and the model card list the arm */
    const char *files[2] = {"report.html", "README.md"}, *want[2] = {"arm<sub>p</sub> (puzzle)", "Puzzle block library"};
    for (int i = 0; i < 2; i++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/%s", out, files[i]);
        FILE *f = fopen(path, "r");
        static char buf[1 << 20];
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f) fclose(f);
        buf[n] = 0;
        CHECK(strstr(buf, want[i]) != NULL, "%s does not name the puzzle arm", files[i]);
    }
    json_decref(res);
    ck_rmtree(out);
}

int main(void) {
    RUN(test_mip_equals_bruteforce);
    RUN(test_mip_never_aborts);
    RUN(test_bld_score_of_removed_ffn);
    RUN(test_bld_ranks_variants);
    RUN(test_search_meets_limit);
    RUN(test_search_tightens_missed_limits);
    RUN(test_search_tensor_parallel);
    RUN(test_job_three_arms);
    ac_puzzle_library_free(&LIB);
    ac_importance_free(&IMP);
    ac_model_free(&M);
    free(IDS);
    return DONE();
}
