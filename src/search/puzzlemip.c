/*
 * puzzlemip.c - Puzzle's choice of one block per layer (see puzzle.h): the
 * mixed-integer program on GLPK, the per-layer linearisation of the cost
 * model's figures, and the verification of the chosen structure with the
 * whole cost model (tightening a missed limit and solving again).
 */
#include <glpk.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "search/constraints.h"
#include "search/puzzle.h"
#include "cost/engines.h"

/* A choice with a NaN or infinite objective or cost is left out (its
 * variable fixed at 0), as Model-Optimizer drops such replacements: GLPK
 * would abort the process on a non-finite coefficient. */
static int usable(const ac_puzzle_mip *p, int total, int j) {
    if (!isfinite(p->obj[j])) return 0;
    for (int c = 0; c < p->n_cons; c++)
        if (!isfinite(p->coef[(size_t)c * total + j])) return 0;
    return 1;
}

int ac_puzzle_mip_solve(const ac_puzzle_mip *p, int *choice, double *objval, ac_err *e) {
    int G = p->n_groups, total = 0;
    for (int g = 0; g < G; g++) {
        if (p->n_choices[g] < 1) return ac_errf(e, "puzzle mip: group %d has no choice", g);
        total += p->n_choices[g];
    }
    for (int c = 0; c < p->n_cons; c++)
        if (!isfinite(p->rhs[c])) return ac_errf(e, "puzzle mip: the bound of row %d is not finite", c);
    double oscale = 0;
    for (int j = 0; j < total; j++)
        if (usable(p, total, j)) oscale = fmax(oscale, fabs(p->obj[j]));
    oscale = oscale > 0 ? 1 / oscale : 1;
    size_t cap = (size_t)total * (1 + p->n_cons) + 1;
    int *ia = malloc(cap * sizeof(int)), *ja = malloc(cap * sizeof(int));
    double *ar = malloc(cap * sizeof(double));
    if (!ia || !ja || !ar) {
        free(ia), free(ja), free(ar);
        return ac_errf(e, "out of memory");
    }
    glp_term_out(GLP_OFF);
    glp_prob *lp = glp_create_prob();
    glp_set_obj_dir(lp, GLP_MIN);
    glp_add_rows(lp, G + p->n_cons);
    glp_add_cols(lp, total);
    int ne = 0;
    for (int g = 0, j = 0; g < G; g++) { /* exactly one block per layer */
        glp_set_row_bnds(lp, g + 1, GLP_FX, 1, 1);
        for (int k = 0; k < p->n_choices[g]; k++, j++) {
            glp_set_col_kind(lp, j + 1, GLP_BV);
            if (usable(p, total, j))
                glp_set_obj_coef(lp, j + 1, p->obj[j] * oscale);
            else
                glp_set_col_bnds(lp, j + 1, GLP_FX, 0, 0);
            ne++, ia[ne] = g + 1, ja[ne] = j + 1, ar[ne] = 1;
        }
    }
    for (int c = 0; c < p->n_cons; c++) { /* each row scaled by its largest magnitude */
        const double *row = p->coef + (size_t)c * total;
        double s = fabs(p->rhs[c]);
        for (int j = 0; j < total; j++)
            if (usable(p, total, j)) s = fmax(s, fabs(row[j]));
        s = s > 0 ? 1 / s : 1;
        glp_set_row_bnds(lp, G + c + 1, GLP_UP, 0, p->rhs[c] * s);
        for (int j = 0; j < total; j++)
            if (row[j] != 0 && usable(p, total, j)) ne++, ia[ne] = G + c + 1, ja[ne] = j + 1, ar[ne] = row[j] * s;
    }
    glp_load_matrix(lp, ne, ia, ja, ar);
    free(ia), free(ja), free(ar);
    glp_iocp parm;
    glp_init_iocp(&parm);
    parm.presolve = GLP_ON;
    parm.msg_lev = GLP_MSG_OFF;
    parm.tm_lim = p->time_limit_s > 0 ? (int)(p->time_limit_s * 1000) : INT_MAX;
    parm.mip_gap = p->gap > 0 ? p->gap : 0;
    parm.br_tech = GLP_BR_PCH; /* pseudo-costs */
    parm.fp_heur = GLP_ON;
    /* cuts that close the gap of a multiple-choice knapsack quickly; not the
     * cover cuts, which abort the process in GLPK 5.0 on some knapsack rows
     * (glp_cov_init: "ncs = 0; invalid number of columns") */
    parm.gmi_cuts = GLP_ON, parm.mir_cuts = GLP_ON, parm.clq_cuts = GLP_ON;
    int ret = glp_intopt(lp, &parm), st = glp_mip_status(lp), rc = 0;
    if (ret == GLP_ENOPFS || ret == GLP_ENODFS || st == GLP_NOFEAS ||
        (ret == GLP_ETMLIM && st != GLP_OPT && st != GLP_FEAS)) { /* or nothing found in the time */
        rc = 1;
    } else if ((ret != 0 && ret != GLP_ETMLIM && ret != GLP_EMIPGAP) || (st != GLP_OPT && st != GLP_FEAS)) {
        rc = ac_errf(e, "puzzle mip: GLPK failed (glp_intopt %d, status %d)", ret, st);
    } else {
        double ov = 0;
        for (int g = 0, j = 0; g < G; g++) {
            choice[g] = -1;
            for (int k = 0; k < p->n_choices[g]; k++, j++)
                if (glp_mip_col_val(lp, j + 1) > 0.5) choice[g] = k, ov += p->obj[j];
            if (choice[g] < 0) rc = ac_errf(e, "puzzle mip: GLPK left layer %d without a block", g);
        }
        if (objval) *objval = ov;
    }
    glp_delete_prob(lp);
    return rc;
}

/* ---- the search ---- */

static int predict(const ac_search_problem *p, const ac_arch *a, ac_cost *out, ac_err *e) {
    ac_carch c;
    if (ac_carch_from_arch(a, &c, e)) return -1;
    ac_cost_predict(p->table, &c, p->workload, p->profile, 0, out);
    ac_carch_free(&c);
    return 0;
}

/* Layer l of a set to block k of the library. */
static void set_block(const ac_puzzle_library *lib, const ac_arch *base, int l, int k, ac_arch *a) {
    int nf = lib->nf[l], kv = lib->kv[l][k / nf];
    a->layers[l].n_heads = kv ? base->layers[l].n_heads : 0;
    a->layers[l].n_kv_heads = kv;
    a->layers[l].ffn = lib->ffn[l][k % nf];
}

typedef struct {
    int n;                           /* active limits */
    const ac_constraint *row[AC_NCONSTRAINTS];
    double limit[AC_NCONSTRAINTS], sign[AC_NCONSTRAINTS];
} active_t;

static json_t *library_json(const ac_puzzle_library *lib) {
    json_t *j = json_array();
    for (int l = 0; l < lib->n_layers; l++) {
        json_t *kv = json_array(), *ff = json_array(), *al = json_array(), *fl = json_array(), *sc = json_array();
        for (int a = 0; a < lib->na[l]; a++) {
            json_array_append_new(kv, json_integer(lib->kv[l][a]));
            json_array_append_new(al, lib->attn_loss[l][a] < 0 ? json_null() : json_real(lib->attn_loss[l][a]));
            json_t *r = json_array();
            for (int f = 0; f < lib->nf[l]; f++) json_array_append_new(r, json_real(lib->score[l][a * lib->nf[l] + f]));
            json_array_append_new(sc, r);
        }
        for (int f = 0; f < lib->nf[l]; f++) {
            json_array_append_new(ff, json_integer(lib->ffn[l][f]));
            json_array_append_new(fl, lib->ffn_loss[l][f] < 0 ? json_null() : json_real(lib->ffn_loss[l][f]));
        }
        json_array_append_new(j, json_pack("{s:i,s:o,s:o,s:o,s:o,s:o}", "layer", l, "kv_heads", kv, "ffn", ff,
                                           "attention_loss", al, "ffn_loss", fl, "scores", sc));
    }
    return j;
}

/* The program's per-layer rows for the active limits: coef[c][j] = sign *
 * (figure with layer l's block j - base figure), rhs[c] = sign * (limit -
 * base figure); sign -1 turns a lower bound into an upper one. */
static int linearise(const ac_search_problem *p, const ac_puzzle_library *lib, const active_t *act,
                     const ac_cost *cb, double *obj, double *coef, double *rhs, int total, ac_err *e) {
    const ac_arch *b = p->base;
    ac_arch w;
    if (ac_arch_copy(&w, b, e)) return -1;
    int rc = 0;
    for (int l = 0, j = 0; l < b->n_layers && !rc; l++) {
        for (int k = 0; k < lib->na[l] * lib->nf[l] && !rc; k++, j++) {
            obj[j] = lib->score[l][k];
            set_block(lib, b, l, k, &w);
            ac_cost c;
            if ((rc = predict(p, &w, &c, e))) break;
            for (int i = 0; i < act->n; i++)
                coef[(size_t)i * total + j] =
                    act->sign[i] * (ac_cost_metric(&c, act->row[i]->m) - ac_cost_metric(cb, act->row[i]->m));
        }
        w.layers[l] = b->layers[l];
    }
    for (int i = 0; i < act->n; i++) rhs[i] = act->sign[i] * (act->limit[i] - ac_cost_metric(cb, act->row[i]->m));
    ac_arch_free(&w);
    return rc;
}

static json_t *blocks_json(const ac_puzzle_library *lib, const int *choice) {
    json_t *j = json_array();
    for (int l = 0; l < lib->n_layers; l++) {
        int nf = lib->nf[l], k = choice[l];
        json_array_append_new(j, json_pack("{s:i,s:i,s:i,s:f}", "layer", l, "kv_heads", lib->kv[l][k / nf], "ffn",
                                           lib->ffn[l][k % nf], "score", lib->score[l][k]));
    }
    return j;
}

/* Solve, verify with the whole cost model, tighten each missed limit by its
 * miss and solve again. Leaves r's arch, cost, feasible, pred_loss (the
 * last structure found; r untouched when the first program is infeasible). */
static int solve_verify(const ac_search_problem *p, const ac_puzzle_library *lib, const active_t *act,
                        const ac_cost *cb, ac_puzzle_mip *mip, double *rhs, const double *rhs0, int *choice,
                        ac_search_result *r, json_t *iters, ac_err *e) {
    const ac_arch *b = p->base;
    int *ch = malloc(sizeof(int) * b->n_layers);
    if (!ch) return ac_errf(e, "out of memory");
    int rc = 0;
    for (int it = 0; it < AC_PUZZLE_MAX_TIGHTEN && !rc; it++) {
        double ov = 0;
        int s = ac_puzzle_mip_solve(mip, ch, &ov, e);
        if (s) {
            if (s == 1) json_array_append_new(iters, json_pack("{s:i,s:s}", "iteration", it, "status", "infeasible"));
            rc = s < 0 ? -1 : 0;
            break;
        }
        ac_arch a;
        if ((rc = ac_arch_copy(&a, b, e))) break;
        for (int l = 0; l < b->n_layers; l++) set_block(lib, b, l, ch[l], &a);
        ac_cost c;
        if ((rc = predict(p, &a, &c, e))) {
            ac_arch_free(&a);
            break;
        }
        int met = ac_constraints_violation(&p->limits, &c) <= 1e-9;
        json_t *tight = json_object();
        for (int i = 0; i < act->n && !met; i++) { /* what the whole model says is missed: tightened by the miss */
            double v = ac_cost_metric(&c, act->row[i]->m);
            if (ac_constraint_met(act->row[i], v, act->limit[i])) continue;
            double got = act->sign[i] * (v - ac_cost_metric(cb, act->row[i]->m));
            rhs[i] -= fmax(got - rhs0[i], 1e-4 * fabs(act->limit[i]));
            json_object_set_new(tight, act->row[i]->name,
                                json_real(act->sign[i] * rhs[i] + ac_cost_metric(cb, act->row[i]->m)));
        }
        json_array_append_new(iters, json_pack("{s:i,s:s,s:f,s:o,s:b,s:o}", "iteration", it, "status", "solved",
                                               "objective", ov, "predicted", ac_cost_to_json(&c), "met", met,
                                               "limits_tightened_to", tight));
        ac_arch_free(&r->arch);
        r->arch = a, r->cost = c, r->pred_loss = ov, r->feasible = met;
        memcpy(choice, ch, sizeof(int) * b->n_layers);
        if (met) break;
    }
    free(ch);
    return rc;
}

static int search_lib(const ac_search_problem *p, const ac_puzzle_library *lib, ac_search_result *r, int *choice,
                      ac_err *e) {
    memset(r, 0, sizeof *r);
    const ac_arch *b = p->base;
    if (lib->n_layers != b->n_layers) return ac_errf(e, "puzzle: the library is for another model");
    active_t act = {0};
    const ac_constraint *tab = ac_constraint_table();
    for (int i = 0; i < AC_NCONSTRAINTS; i++) {
        double lim = ac_constraint_limit(&tab[i], &p->limits);
        if (lim <= 0) continue;
        act.row[act.n] = &tab[i], act.limit[act.n] = lim, act.sign[act.n] = tab[i].ge ? -1 : 1;
        act.n++;
    }
    int L = b->n_layers, total = 0, *nch = malloc(sizeof(int) * L), *ch = calloc(L, sizeof(int));
    for (int l = 0; nch && l < L; l++) total += nch[l] = lib->na[l] * lib->nf[l];
    double *obj = malloc(sizeof(double) * (total + 1)), *coef = calloc((size_t)total * act.n + 1, sizeof(double)),
           *rhs = malloc(sizeof(double) * (act.n + 1)), *rhs0 = malloc(sizeof(double) * (act.n + 1));
    ac_cost cb;
    int rc = nch && ch && obj && coef && rhs && rhs0 ? predict(p, b, &cb, e) : ac_errf(e, "out of memory");
    if (!rc) rc = linearise(p, lib, &act, &cb, obj, coef, rhs, total, e);
    json_t *iters = json_array();
    if (!rc) {
        memcpy(rhs0, rhs, sizeof(double) * act.n);
        ac_puzzle_mip mip = {.n_groups = L,
                             .n_choices = nch,
                             .obj = obj,
                             .n_cons = act.n,
                             .coef = coef,
                             .rhs = rhs,
                             .gap = AC_PUZZLE_MIP_GAP,
                             .time_limit_s = AC_PUZZLE_MIP_SECONDS};
        rc = solve_verify(p, lib, &act, &cb, &mip, rhs, rhs0, ch, r, iters, e);
    }
    if (!rc && !r->arch.layers) { /* the first program was infeasible: the base, reported as missing */
        rc = ac_arch_copy(&r->arch, b, e);
        r->cost = cb, r->feasible = 0, r->pred_loss = 0;
    }
    if (!rc) {
        json_t *names = json_array();
        for (int i = 0; i < act.n; i++) json_array_append_new(names, json_string(act.row[i]->name));
        char solver[64];
        snprintf(solver, sizeof solver, "GLPK %s", glp_version());
        r->detail = json_pack("{s:o,s:o,s:{s:s,s:i,s:o,s:o,s:s},s:{s:I,s:I,s:f}}", "library", library_json(lib),
                              "blocks", blocks_json(lib, ch), "mip", "solver", solver, "variables",
                              total, "limits", names, "iterations", json_incref(iters), "objective",
                              "sum of the chosen blocks' held-out BLD losses", "bld", "tokens", (json_int_t)lib->tokens,
                              "train_tokens", (json_int_t)lib->train_tokens, "seconds", lib->seconds);
        if (choice) memcpy(choice, ch, sizeof(int) * L);
    }
    json_decref(iters);
    if (rc) ac_search_result_free(r);
    free(nch), free(ch), free(obj), free(coef), free(rhs), free(rhs0);
    return rc;
}

/* Tensor parallelism: the blocks the serving engine splits tp ways only
 * (ac_tp_attn_splits; FFN widths that are multiples of tp; removals
 * always), as a view of lib whose layer l keeps attention variants
 * am[l][..] and FFN variants fm[l][..] of lib's. */
static int tp_view(const ac_puzzle_library *lib, const ac_arch *b, int tp, ac_puzzle_library *v,
                   int (*am)[AC_PUZZLE_MAX_V], int (*fm)[AC_PUZZLE_MAX_V]) {
    int L = lib->n_layers;
    memset(v, 0, sizeof *v);
    v->n_layers = L;
    v->kv = calloc(L, sizeof *v->kv), v->ffn = calloc(L, sizeof *v->ffn);
    v->na = calloc(L, sizeof(int)), v->nf = calloc(L, sizeof(int));
    v->score = calloc(L, sizeof *v->score);
    v->attn_loss = calloc(L, sizeof *v->attn_loss), v->ffn_loss = calloc(L, sizeof *v->ffn_loss);
    if (!v->kv || !v->ffn || !v->na || !v->nf || !v->score || !v->attn_loss || !v->ffn_loss) return -1;
    v->tokens = lib->tokens, v->train_tokens = lib->train_tokens, v->seconds = lib->seconds;
    for (int l = 0; l < L; l++) {
        for (int a = 0; a < lib->na[l]; a++) {
            int kv = lib->kv[l][a];
            if (kv && !ac_tp_attn_splits(tp, b->layers[l].n_heads, kv)) continue;
            am[l][v->na[l]] = a, v->kv[l][v->na[l]] = kv, v->attn_loss[l][v->na[l]++] = lib->attn_loss[l][a];
        }
        for (int f = 0; f < lib->nf[l]; f++) {
            int w = lib->ffn[l][f];
            if (w % tp) continue;
            fm[l][v->nf[l]] = f, v->ffn[l][v->nf[l]] = w, v->ffn_loss[l][v->nf[l]++] = lib->ffn_loss[l][f];
        }
        for (int a = 0; a < v->na[l]; a++)
            for (int f = 0; f < v->nf[l]; f++)
                v->score[l][a * v->nf[l] + f] = lib->score[l][am[l][a] * lib->nf[l] + fm[l][f]];
    }
    return 0;
}

int ac_search_puzzle(const ac_search_problem *p, const ac_puzzle_library *lib, ac_search_result *r, int *choice,
                     ac_err *e) {
    int tp = p->profile && p->profile->tp > 1 ? p->profile->tp : 1;
    if (tp == 1) return search_lib(p, lib, r, choice, e);
    memset(r, 0, sizeof *r);
    if (lib->n_layers != p->base->n_layers) return ac_errf(e, "puzzle: the library is for another model");
    if (ac_search_check_tp(p, 0, e)) return -1;
    int L = lib->n_layers, (*am)[AC_PUZZLE_MAX_V] = calloc(L, sizeof *am), (*fm)[AC_PUZZLE_MAX_V] = calloc(L, sizeof *fm),
        *ch = calloc(L, sizeof(int));
    ac_puzzle_library v = {0};
    int rc = am && fm && ch && tp_view(lib, p->base, tp, &v, am, fm) == 0 ? search_lib(p, &v, r, ch, e)
                                                                         : ac_errf(e, "out of memory");
    for (int l = 0; !rc && choice && l < L; l++) /* back to lib's block indexes */
        choice[l] = am[l][ch[l] / v.nf[l]] * lib->nf[l] + fm[l][ch[l] % v.nf[l]];
    ac_puzzle_library_free(&v);
    free(am), free(fm), free(ch);
    return rc;
}
