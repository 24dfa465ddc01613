/*
 * test_dnas_moe.c - expert gates in the differentiable search (issue 30,
 * item 3), on the random-init fixture Qwen3-MoE (layers 0 and 2: 5 experts,
 * top-2 without renormalisation; layer 1 dense) and Mixtral (3 experts,
 * top-2 renormalised). The gate gradients themselves are checked against
 * PyTorch in float64 by test_train (gen_grad_fixtures.py's expert gates).
 *
 * 1. Gates in {0,1} are the pruned model: the trainer with some expert
 *    gates at 0, and each expert's channel gates at 0 on its 16 last
 *    channels by a ranking of its own, gives the logits of ac_prune's model
 *    without those experts (the router's softmax, top-k and
 *    renormalisation over the kept ones) and with experts 16 channels
 *    narrower (imp->echan_order: each expert's channels sliced by its own
 *    ranking).
 * 2. ac_search_dnas (150 gate steps from the surrogate's structure, as a
 *    job starts it) under a parameter limit that needs experts removed
 *    reaches a feasible structure with fewer experts, one count for every
 *    MoE layer (what the export targets hold), at least top_k; its
 *    held-out KL to the unpruned model is no more than its start's (the
 *    surrogate's structure in importance order); and among every choice of
 *    that many experts in each MoE layer (on the structure the search
 *    picked) the gates' choice is in the best fifth.
 *    Mutation check (as test_dnas_gain): with ac_dnas_opts.zero_task_grad
 *    the gates see only the limit's cost gradient, the same for every expert
 *    of a layer, and the claim fails.
 * 3. The gate training (expert and expert-width gates) on the BF16
 *    checkpoint held resident (the frozen trainer converts each layer's
 *    router and experts to fp32 as it reaches them) equals the training on
 *    its fp32 load bit for bit: the last step's task gradient and the
 *    log_alphas; ac_dnas_gates_ok then lets jobs run dnas there and on a
 *    CUDA target.
 * 4. The same training on the CUDA trainer (tests/run_all.sh runs it on the
 *    CPU emulator with AC_DNAS_CUDA_ONLY) against the CPU's: the first
 *    step's task gradient within 1e-3 (relative), the log_alphas after 5
 *    steps within 1e-2 (test_dnas's tolerances for dense models), and the
 *    resident BF16 model on CUDA equal to its fp32 load there bit for bit.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "expert_search.h"
#include "cost/device.h"
#include "runtime/cuda_plugin.h"
#include "runtime/kernels_cpu.h"
#include "runtime/train.h"
#include "search/dnas.h"
#include "search/minitron.h"
#include "search/slice.h"
#include "search/topk.h"

static void gates_equal_pruned(const char *name) {
    ac_model m, pm;
    ac_err e;
    if (es_load(name, &m)) SKIP("no fixture %s (make fixtures)", name);
    int B = 2, T = 24, L = m.a.n_layers, *tok = es_rand_ids((size_t)B * T, m.a.vocab, 11);
    float *gates[8] = {0}, *chans[8] = {0};
    int cut = 16; /* each expert loses 16 channels (its own worst by a random order) */
    orders_t o;
    es_orders_init(&o, &m.a);
    ac_arch ta;
    ac_arch_copy(&ta, &m.a, &e);
    for (int l = 0; l < L; l++) { /* layer l keeps every expert but one (a different one per layer) ... */
        int E = m.a.layers[l].n_experts;
        if (!E) continue;
        unsigned mask = (1u << E) - 1;
        mask &= ~(1u << ((l + 1) % E));
        if (E - m.a.top_k >= 2) mask &= ~(1u << ((l + 3) % E)); /* ... or two, where top_k allows */
        gates[l] = malloc(sizeof(float) * E);
        for (int x = 0; x < E; x++) gates[l][x] = (float)(mask >> x & 1);
        es_order_from_mask(o.ex[l], E, mask);
        ta.layers[l].n_experts = __builtin_popcount(mask);
        int Fe = m.a.layers[l].expert_ffn;
        chans[l] = malloc(sizeof(float) * E * Fe);
        unsigned long long s = 77 + l;
        for (int x = 0; x < E; x++) { /* expert x's ranking: a random permutation, its last `cut` gated off */
            int *ord = o.ch[l] + (size_t)x * Fe;
            for (int c = 0; c < Fe; c++) ord[c] = c;
            for (int c = Fe - 1; c > 0; c--) {
                s = s * 6364136223846793005ULL + 1442695040888963407ULL;
                int j = (int)((s >> 33) % (unsigned long long)(c + 1)), tmp = ord[c];
                ord[c] = ord[j], ord[j] = tmp;
            }
            for (int r = 0; r < Fe; r++) chans[l][(size_t)x * Fe + ord[r]] = r < Fe - cut ? 1.0f : 0.0f;
        }
        ta.layers[l].expert_ffn = Fe - cut;
    }
    float *full = es_logits(&m, tok, B, T, NULL);
    float *gated = es_logits_gated(&m, tok, B, T, (const float *const *)gates, (const float *const *)chans);
    CHECK(ac_prune(&m, &ta, &o.imp, &pm, &e) == 0, "prune: %s", e.msg);
    float *pruned = es_logits(&pm, tok, B, T, NULL);
    double md = 0, mr = 0, moved = 0;
    size_t n = (size_t)B * T * m.a.vocab;
    for (size_t i = 0; full && gated && pruned && i < n; i++) {
        md = fmax(md, fabs(gated[i] - pruned[i]));
        mr = fmax(mr, fabs(pruned[i]));
        moved = fmax(moved, fabs(full[i] - pruned[i]));
    }
    printf("   %s: gated vs pruned max|diff| %.3g of max|logit| %.3g (removing the experts moved them %.3g)\n", name,
           md, mr, moved);
    CHECK(md <= 2e-6 * mr, "%s: expert gates at 0 are not the pruned model (%.3g)", name, md);
    CHECK(moved > 1e3 * md, "%s: removing the experts changed nothing measurable (%.3g)", name, moved);
    free(full), free(gated), free(pruned), free(tok);
    for (int l = 0; l < L; l++) free(gates[l]), free(chans[l]);
    es_orders_free(&o);
    ac_arch_free(&ta);
    ac_model_free(&pm);
    ac_model_free(&m);
}

static void test_gates_equal_pruned_qwen3moe(void) { gates_equal_pruned("qwen3moe_mixed_bf16"); }
static void test_gates_equal_pruned_mixtral(void) { gates_equal_pruned("mixtral_f32"); }

/* ---- the search ---- */

static ac_model M;
static ac_importance IMP;
static int *IDS, *HIDS, HAVE;
static size_t NIDS, NH;
#define HB 8
#define HT 32

static int setup(void) {
    if (HAVE) return HAVE > 0;
    NH = HB * HT;
    HAVE = es_setup("qwen3moe_mixed_bf16", &M, &IMP, &IDS, &NIDS, &HIDS, NH) ? 1 : -1;
    return HAVE > 0;
}

static void make_problem(problem_t *P, int keep) { es_make_problem(P, &M, &IMP, IDS, NIDS, keep, 32, 16); }

/* The search (from the surrogate's structure, as a job starts it); *frac,
 * *kl, *best from es_rank_experts, *start the held-out KL of the surrogate's
 * structure pruned in importance order (where the gates start). */
static int run_search(int zero_task, int width, ac_search_result *r, ac_importance *ord, double *frac, double *kl,
                      double *best, double *start) {
    problem_t P;
    ac_err e;
    make_problem(&P, 3);
    P.p.opts.prune_expert_ffn = width;
    ac_dnas_opts o;
    ac_dnas_defaults(&o);
    o.steps = 150;
    o.batch = 4;
    o.seq_len = 32;
    o.zero_task_grad = zero_task;
    if (ac_search_dnas(&P.p, &M, IDS, NIDS, &o, r, ord, &e)) {
        CHECK(0, "dnas: %s", e.msg);
        return -1;
    }
    float *teacher = es_logits(&M, HIDS, HB, HT, NULL);
    *frac = es_rank_experts(&M, &r->arch, ord, teacher, HIDS, HB, HT, kl, best);
    ac_search_result sr;
    if (ac_search_autocompress(&P.p, &sr, &e) == 0) {
        *start = es_heldout_kl(&M, &sr.arch, &IMP, teacher, HIDS, HB, HT);
        ac_search_result_free(&sr);
    } else
        CHECK(0, "surrogate: %s", e.msg);
    free(teacher);
    return 0;
}

/* The search's structure: feasible, one expert count below the base's (at
 * least top_k) in every MoE layer; 1 when so. */
static int experts_removed(const ac_search_result *r) {
    int kept = -1, uniform = 1, fewer = 1;
    for (int l = 0; l < M.a.n_layers; l++) {
        int n = r->arch.layers[l].n_experts, E = M.a.layers[l].n_experts;
        if (!E) continue;
        uniform &= kept < 0 || n == kept;
        kept = n;
        fewer &= n < E && n >= M.a.top_k;
    }
    return r->feasible && uniform && fewer;
}

static void print_arch(const char *what, const ac_search_result *r, double secs) {
    json_t *aj = ac_arch_to_json(&r->arch);
    char *s = json_dumps(aj, JSON_COMPACT);
    printf("   %s (%d steps, %.1f s): params %.0f, feasible %d: %s\n", what, r->steps_run, secs, r->cost.params,
           r->feasible, s);
    free(s);
    json_decref(aj);
}

static void test_dnas_removes_experts(void) {
    if (!setup()) SKIP("no fixture qwen3moe_mixed_bf16 (make fixtures)");
    ac_search_result r;
    ac_importance ord;
    double frac, kl, best, start, t0 = ac_now();
    if (run_search(0, 0, &r, &ord, &frac, &kl, &best, &start)) return;
    print_arch("dnas", &r, ac_now() - t0);
    printf("   held-out KL to the unpruned model: start (surrogate) %.5f, dnas %.5f; best expert choice of its count "
           "%.5f, %.0f%% of the choices better than the gates'\n",
           start, kl, best, 100 * frac);
    CHECK(experts_removed(&r), "not a feasible structure with one expert count below the base's (>= top_k)");
    CHECK(kl <= start, "the search does not beat its start: KL %.5f vs %.5f", kl, start);
    CHECK(frac <= 0.2, "the gates' expert choice is not among the best fifth (%.0f%% better)", 100 * frac);
    ac_search_result_free(&r);
    ac_importance_free(&ord);
    /* mutation: no gradient from the network (every expert gate of a layer then moves alike) */
    t0 = ac_now();
    if (run_search(1, 0, &r, &ord, &frac, &kl, &best, &start)) return;
    print_arch("zero task gradients", &r, ac_now() - t0);
    printf("   zero task gradients: held-out KL %.5f (start %.5f)\n", kl, start);
    CHECK(!(experts_removed(&r) && kl <= start && frac <= 0.2),
          "without task gradients the claim still holds (it cannot fail)");
    ac_search_result_free(&r);
    ac_importance_free(&ord);
}

/* With search.prune_expert_ffn the gates on each expert's channel groups
 * (the same rank groups in every expert, each expert ranked on its own)
 * cut the expert width instead (under the same limit): one width below the
 * base's for every MoE layer, on the group grid (3 channels), feasible, and
 * no worse than the start on held-out KL; with zero task gradients not so. */
static void test_dnas_cuts_expert_width(void) {
    if (!setup()) SKIP("no fixture qwen3moe_mixed_bf16 (make fixtures)");
    for (int z = 0; z < 2; z++) {
        ac_search_result r;
        ac_importance ord;
        double frac, kl, best, start, t0 = ac_now();
        if (run_search(z, 1, &r, &ord, &frac, &kl, &best, &start)) return;
        print_arch(z ? "zero task gradients" : "dnas, expert width gated", &r, ac_now() - t0);
        int w = -1, uniform = 1;
        for (int l = 0; l < M.a.n_layers; l++)
            if (M.a.layers[l].n_experts)
                uniform &= w < 0 || r.arch.layers[l].expert_ffn == w, w = r.arch.layers[l].expert_ffn;
        int claim = r.feasible && uniform && w < 48 && w % 3 == 0 && kl <= start;
        printf("   expert width %d; held-out KL %.5f (start %.5f)\n", w, kl, start);
        if (!z)
            CHECK(claim, "not one expert width under the base's, feasible and no worse than the start");
        else
            CHECK(!claim, "without task gradients the claim still holds (it cannot fail)");
        ac_search_result_free(&r);
        ac_importance_free(&ord);
    }
}

/* The limits' gradient through the expert and expert-width gates (the
 * cost model's expert-count derivative; the width's central difference at
 * the expected architecture) against central differences of the expected
 * metric, at random log_alphas, for params, memory and TPOT. */
static void test_expert_cost_gradient(void) {
    if (!setup()) SKIP("no fixture qwen3moe_mixed_bf16 (make fixtures)");
    problem_t P;
    ac_err e;
    make_problem(&P, 3);
    P.p.opts.prune_expert_ffn = 1;
    ac_dnas_gates g;
    CHECK(ac_dnas_gates_init(&g, &M.a, &P.p.opts, &e) == 0, "%s", e.msg);
    unsigned long long s = 3;
    for (int i = 0; i < g.np; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        g.la[i] = -2 + 5.0 * (s >> 11) / 9007199254740992.0;
    }
    double *an = malloc(sizeof(double) * g.np), h = 1e-4, worst = 0;
    ac_metric ms[] = {AC_M_PARAMS, AC_M_MEM, AC_M_TPOT};
    const char *names[] = {"params", "memory", "tpot"};
    for (int k = 0; k < 3; k++) {
        ac_dnas_expected_metric(&g, &P.p, ms[k], an);
        double num = 0, den = 0;
        for (int l = 0; l < g.L; l++)
            for (int i = g.ex_off[l]; i < g.xg_off[l] + g.nxg[l]; i++) { /* the layer's expert then width gates */
                if (i >= g.ex_off[l] + g.nex[l] && i < g.xg_off[l]) continue;
                double o = g.la[i];
                g.la[i] = o + h;
                double a = ac_dnas_expected_metric(&g, &P.p, ms[k], NULL);
                g.la[i] = o - h;
                double b = ac_dnas_expected_metric(&g, &P.p, ms[k], NULL);
                g.la[i] = o;
                double fd = (a - b) / (2 * h);
                num = fmax(num, fabs(fd - an[i]));
                den = fmax(den, fabs(fd));
            }
        double rel = den > 0 ? num / den : num;
        printf("   %s: expert and width gates, max|grad - fd| / max|fd| %.2e (max|fd| %.3g)\n", names[k], rel, den);
        CHECK(den > 0, "%s: no gradient through the expert gates", names[k]);
        worst = fmax(worst, rel);
    }
    CHECK(worst <= 1e-5, "expert gates' cost gradient off by %.3g", worst);
    free(an);
    ac_dnas_gates_free(&g);
}

/* Minitron's expert width (Model-Optimizer's moe_ffn_hidden_size): under a
 * parameter limit that its other axes cannot meet at full expert width,
 * the arm cuts every expert to one searched width, and the student keeps
 * each expert's best channels by the expert-width score (checked here by
 * sorting imp->echan_score independently: the pruned gate/up rows and
 * down columns are the source's at those channels). */
static void test_minitron_expert_width(void) {
    if (!setup()) SKIP("no fixture qwen3moe_mixed_bf16 (make fixtures)");
    CHECK(IMP.echan_order && IMP.echan_score, "calibration gave no expert-channel ranking");
    if (!IMP.echan_order) return;
    problem_t P;
    ac_err e;
    make_problem(&P, 3);
    P.p.model = &M;
    P.p.opts.prune_expert_ffn = 1;
    ac_arch a;
    ac_arch_copy(&a, &M.a, &e);
    double pw[2];
    for (int k = 0; k < 2; k++) { /* the smallest searched grid point but the expert width: 48, then 42 */
        for (int l = 0; l < a.n_layers; l++) {
            if (a.layers[l].n_experts) a.layers[l].n_experts = 4, a.layers[l].expert_ffn = k ? 42 : 48;
            if (a.layers[l].ffn) a.layers[l].ffn = 100;
        }
        pw[k] = ac_arch_params(&a);
    }
    ac_arch_free(&a);
    P.p.limits.max_params = 0.5 * (pw[0] + pw[1]);
    ac_search_result r;
    CHECK(ac_search_minitron(&P.p, &r, &e) == 0, "minitron: %s", e.msg);
    json_t *ax = json_object_get(json_object_get(r.detail, "axes"), "moe_ffn_hidden_size");
    char *s = json_dumps(ax, JSON_COMPACT);
    printf("   minitron: params %.0f (limit %.0f), feasible %d; moe_ffn_hidden_size axis %s\n", r.cost.params,
           P.p.limits.max_params, r.feasible, s ? s : "(none)");
    free(s);
    CHECK(ax && json_integer_value(json_object_get(ax, "divisor")) == 3, "no moe_ffn_hidden_size axis of divisor 3");
    int w = -1, uniform = 1;
    for (int l = 0; l < M.a.n_layers; l++)
        if (M.a.layers[l].n_experts)
            uniform &= w < 0 || r.arch.layers[l].expert_ffn == w, w = r.arch.layers[l].expert_ffn;
    CHECK(r.feasible && uniform && w < 48 && w >= 30 && w % 3 == 0, "expert width %d: not one searched width under 48",
          w);
    ac_importance view;
    ac_minitron_importance_view(&IMP, &view);
    ac_model pm;
    CHECK(ac_prune(&M, &r.arch, &view, &pm, &e) == 0, "prune: %s", e.msg);
    int checked;
    int good = es_experts_hold_best_channels(&M, &pm, &r.arch, &IMP, w, &checked);
    CHECK(good && checked > 0, "the student's experts are not the source's best-scored channels");
    if (pm.L) ac_model_free(&pm);
    ac_search_result_free(&r);
}

/* Top-k as a global choice (search.min_top_k 1 on the top-2 fixture): the
 * measured loss increase of routing to 1 expert equals the mean
 * next-token cross-entropy difference computed independently (the trainer's
 * forward on the same windows); the job's search runs at k = 2 and 1 and
 * keeps the feasible result with the least search prediction + increase. */
static void test_top_k_choice(void) {
    if (!setup()) SKIP("no fixture qwen3moe_mixed_bf16 (make fixtures)");
    problem_t P;
    ac_err e;
    make_problem(&P, 3);
    double dl;
    CHECK(ac_top_k_loss_increase(&P.p, &M, 1, &dl, &e) == 0, "%s", e.msg);
    int nw = 16, T = 32, *tgt = malloc(sizeof(int) * nw * T);
    const int *tok = IDS + NIDS - (size_t)nw * T;
    ac_next_token_targets(tgt, tok, nw, T);
    double ce[2];
    for (int k = 0; k < 2; k++) {
        ac_model v = M;
        v.a.top_k = k ? 1 : M.a.top_k;
        ac_trainer t;
        CHECK(ac_trainer_init_frozen(&t, &v, nw, T, &e) == 0, "%s", e.msg);
        CHECK(ac_train_forward(&t, tok, nw, T, &e) == 0, "%s", e.msg);
        ac_train_loss(&t, tgt, NULL, 1.0f, 0.0f, 1.0f, &ce[k], NULL);
        ac_trainer_free(&t);
    }
    free(tgt);
    printf("   top_k 2 -> 1: loss increase %.6f (independent cross-entropy difference %.6f)\n", dl, ce[1] - ce[0]);
    CHECK(dl > 0 && fabs(dl - (ce[1] - ce[0])) <= 1e-5, "loss increase %.6g vs %.6g", dl, ce[1] - ce[0]);
    ac_search_opts so = P.p.opts;
    so.method = AC_SEARCH_SURROGATE;
    so.min_top_k = 1;
    ac_search_result r;
    ac_importance ord;
    CHECK(ac_dnas_job_search(&P.p, &M, &so, IDS, NIDS, &r, &ord, &e) == 0, "%s", e.msg);
    json_t *ch = json_object_get(r.detail, "top_k_choices");
    size_t i;
    json_t *c;
    int want = 0, nf = 0;
    double best = INFINITY;
    json_array_foreach(ch, i, c) {
        int f = json_is_true(json_object_get(c, "feasible"));
        double sc = json_number_value(json_object_get(c, "score"));
        printf("   top_k %lld: search prediction %.5f + increase %.5f = %.5f, feasible %d\n",
               json_integer_value(json_object_get(c, "top_k")),
               json_number_value(json_object_get(c, "search_pred_loss")),
               json_number_value(json_object_get(c, "loss_increase")), sc, f);
        if (f && sc < best) best = sc, want = (int)json_integer_value(json_object_get(c, "top_k"));
        nf += f;
    }
    CHECK(json_array_size(ch) == 2 && nf > 0, "top_k choices: %zu, %d feasible", json_array_size(ch), nf);
    CHECK(r.arch.top_k == want && r.feasible, "chose top_k %d, the rule says %d", r.arch.top_k, want);
    ac_model pm;
    CHECK(ac_prune(&M, &r.arch, &IMP, &pm, &e) == 0, "prune: %s", e.msg);
    CHECK(pm.a.top_k == want, "the student routes to %d experts", pm.a.top_k);
    ac_model_free(&pm);
    ac_search_result_free(&r);
    ac_importance_free(&ord);
}

/* Gate training on model m (fp32 or resident) for `steps` steps of P's
 * problem with expert and expert-width gates; *np the gates, tg[4096] the
 * last step's task gradient (NULL: not wanted). 0 on success. */
static int train_gates(ac_model *m, int steps, int cuda, ac_dnas_gates *g, double *tg) {
    problem_t P;
    ac_err e = {{0}};
    make_problem(&P, 3);
    P.p.opts.prune_expert_ffn = 1;
    ac_dnas_opts o;
    ac_dnas_defaults(&o);
    o.steps = steps;
    o.batch = 2;
    o.seq_len = 32;
    o.cuda = cuda;
    int rc = ac_dnas_train_gates(&P.p, m, IDS, NIDS, &o, g, tg, &e);
    CHECK(rc == 0 && g->np <= 4096, "%s gate training: %s", cuda ? "CUDA" : "CPU", e.msg);
    ac_cost_table_free(&P.t);
    return rc;
}

/* The resident BF16 checkpoint of the fixture (ac_model_load_resident). */
static int load_resident(ac_model *R) {
    char fx[1024], dir[1200];
    ac_err e = {{0}};
    ck_build_path(fx, sizeof fx, "fixtures");
    snprintf(dir, sizeof dir, "%s/models/qwen3moe_mixed_bf16", fx);
    if (ac_model_load_resident(dir, R, &e)) {
        CHECK(0, "resident: %s", e.msg);
        return -1;
    }
    CHECK(ac_model_wdt(R) == ST_BF16, "the checkpoint is resident in BF16");
    return 0;
}

static void test_resident_gates_equal_fp32(void) {
    if (!setup()) SKIP("no fixture qwen3moe_mixed_bf16 (make fixtures)");
    ac_model R;
    if (load_resident(&R)) return;
    ac_dnas_gates g[2];
    double *tg[2] = {calloc(4096, sizeof(double)), calloc(4096, sizeof(double))};
    ac_model *ms[2] = {&R, &M};
    int ok = tg[0] && tg[1] && !train_gates(ms[0], 8, 0, &g[0], tg[0]) && !train_gates(ms[1], 8, 0, &g[1], tg[1]);
    es_check_same_training(g, tg, ok, 8);
    problem_t P;
    make_problem(&P, 3);
    CHECK(ac_dnas_gates_ok(&P.p, &R), "a job on the resident checkpoint runs dnas");
    P.p.cuda = 1;
    CHECK(ac_dnas_gates_ok(&P.p, &M), "a job on a CUDA target runs dnas");
    ac_cost_table_free(&P.t);
    for (int c = 0; ok && c < 2; c++) ac_dnas_gates_free(&g[c]);
    free(tg[0]), free(tg[1]);
    ac_model_free(&R);
}

static int train_gates_m(void *m, int steps, int cuda, ac_dnas_gates *g, double *tg) {
    return train_gates(m, steps, cuda, g, tg);
}

static void test_cuda_gates_match_cpu(void) {
    const char *why;
    if (!ac_cuda(&why)) SKIP("no CUDA: %s", why);
    if (!setup()) SKIP("no fixture qwen3moe_mixed_bf16 (make fixtures)");
    ac_dnas_gates g[2];
    double *tg[2] = {calloc(4096, sizeof(double)), calloc(4096, sizeof(double))}, rel = 1, gn = 0, dla = 0;
    int np = 0, ok = tg[0] && tg[1] && !es_cuda_vs_cpu(train_gates_m, &M, 5, &rel, &gn, &dla, &np);
    ac_model R; /* the resident checkpoint on CUDA: widened on the device, the same training */
    int same = 0;
    if (ok && !load_resident(&R)) {
        ok = !train_gates(&R, 3, 1, &g[0], tg[0]) && !train_gates(&M, 3, 1, &g[1], tg[1]);
        same = ok && !memcmp(g[0].la, g[1].la, sizeof(double) * np) && !memcmp(tg[0], tg[1], sizeof(double) * np);
        for (int c = 0; ok && c < 2; c++) ac_dnas_gates_free(&g[c]);
        ac_model_free(&R);
    }
    printf("   %d gates: first-step task gradient CUDA vs CPU relative diff %.2e (|grad| %.3g); log_alpha after 5 "
           "steps max |diff| %.2e; resident BF16 vs fp32 on CUDA (3 steps) %s\n",
           np, rel, gn, dla, same ? "identical" : "DIFFER");
    CHECK(ok && rel < 1e-3, "first-step gradients differ by %g", rel);
    CHECK(ok && dla < 1e-2, "log_alphas after 5 steps differ by %g", dla);
    CHECK(same, "resident and fp32 gate training on CUDA differ");
    free(tg[0]), free(tg[1]);
}

int main(void) {
    ac_set_threads(ck_threads());
    if (getenv("AC_DNAS_CUDA_ONLY")) { /* tests/run_all.sh: the gate training on the emulated plugin */
        RUN(test_cuda_gates_match_cpu);
    } else {
        RUN(test_gates_equal_pruned_qwen3moe);
        RUN(test_gates_equal_pruned_mixtral);
        RUN(test_dnas_removes_experts);
        RUN(test_expert_cost_gradient);
        RUN(test_dnas_cuts_expert_width);
        RUN(test_minitron_expert_width);
        RUN(test_top_k_choice);
        RUN(test_resident_gates_equal_fp32);
        RUN(test_cuda_gates_match_cpu);
    }
    if (HAVE > 0) {
        ac_importance_free(&IMP);
        ac_model_free(&M);
    }
    free(IDS);
    free(HIDS);
    return DONE();
}
