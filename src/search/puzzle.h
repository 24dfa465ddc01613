/*
 * puzzle.h - the third arm: Puzzle's heterogeneous search (arXiv
 * 2411.19146, NVIDIA Model-Optimizer's Puzzletron), in our own code. See
 * docs/puzzle.md.
 *
 * What it owns:
 * - the library of block variants of each layer: the attention with the
 *   parent's KV heads, with fewer KV heads (the divisors of the count down
 *   to an eighth, every query head kept, KV heads mean-pooled as
 *   DeciLM's n_heads_in_group expresses), or removed (no-op); the FFN at
 *   the parent's width, at fractions of it (ac_puzzle_opts.ffn_fracs, on
 *   the export grid) or removed; a block is one attention variant and one
 *   FFN variant;
 * - block-local distillation (BLD, "decoupled"): each attention variant
 *   is trained inside the parent's block (the parent's FFN kept, frozen)
 *   and each FFN variant with the parent's attention, on the parent's own
 *   layer inputs over calibration windows (layer-streamed: stream.h), to
 *   match the parent layer's output by Puzzle's normalised MSE
 *   sum |y_child - y_parent|^2 / sum |y_parent|^2; AdamW, a few steps;
 *   each variant starts from the parent's weights sliced by importance
 *   (slice.h: FFN channels by ffn_order, KV heads merged);
 * - the score of every block (each attention variant with each FFN
 *   variant, the trained sub-blocks put together) = that loss on held-out
 *   calibration windows (the parent block scores ~0, removals score high);
 * - the choice: one block per layer by a mixed-integer program (GLPK),
 *   minimising the summed scores under the job's limits, the cost model's
 *   figures linearised per layer as Puzzle does (base figure + the sum of
 *   each layer's change when only that layer is replaced); the chosen
 *   structure is then predicted whole by the cost model and, while it
 *   misses a limit, that limit's right-hand side is tightened by the miss
 *   and the program solved again.
 *
 * Ownership: ac_puzzle_library owns its arrays and, with keep_weights, the
 * trained one-layer models of every variant (ac_puzzle_library_free).
 */
#ifndef AC_PUZZLE_H
#define AC_PUZZLE_H

#include <jansson.h>

#include "search/search.h"

#define AC_PUZZLE_MAX_V 8   /* variants of one sub-block (the no-op included) */
#define AC_PUZZLE_MAX_TIGHTEN 12

typedef struct {
    int steps;       /* BLD steps per trained variant */
    int batch;       /* calibration windows per step */
    int windows;     /* calibration windows used (a quarter, at least one, held out for the scores) */
    double lr;       /* AdamW peak rate (cosine to lr/10) */
    int keep_weights; /* keep every trained variant for ac_puzzle_realize */
    int n_ffn_fracs;
    double ffn_fracs[AC_PUZZLE_MAX_V - 2]; /* FFN widths besides the parent's and the no-op, as fractions */
    int ffn_multiple;                      /* FFN widths rounded to this (>= 1) */
} ac_puzzle_opts;

/* steps 40, batch 4, windows 32, lr 1e-3, keep_weights 1, FFN 3/4, 1/2, 1/4, 1/10, multiple 1. */
void ac_puzzle_opts_default(ac_puzzle_opts *o);

typedef struct {
    int n_layers;
    int (*kv)[AC_PUZZLE_MAX_V];  /* [l][a]: KV heads of attention variant a (0: no-op); a = 0 is the parent's */
    int (*ffn)[AC_PUZZLE_MAX_V]; /* [l][f]: FFN width (0: no-op); f = 0 the parent's */
    int *na, *nf;                /* [l] variant counts */
    double (*score)[AC_PUZZLE_MAX_V * AC_PUZZLE_MAX_V]; /* [l][a * nf[l] + f]: held-out BLD loss of the block */
    double (*attn_loss)[AC_PUZZLE_MAX_V], (*ffn_loss)[AC_PUZZLE_MAX_V]; /* [l][v]: each sub-block variant's */
    long tokens;      /* calibration tokens the BLD streamed through the parent (training windows x steps' reuse not counted twice) */
    long train_tokens; /* tokens of all variants' training steps together */
    double seconds;
    /* keep_weights: [l][a] and [l][f] one-layer fp32 models (vocab 1) of
     * each trained variant (the parent's sub-block where a or f is 0; an
     * empty model for a no-op), NULL otherwise */
    ac_model **attn_w, **ffn_w;
} ac_puzzle_library;

/* The variants of layer l of base (dense layers with attention and FFN
 * only): kv[na] and ffn[nf], the parent's first, the no-op last. */
void ac_puzzle_variants(const ac_arch *base, int l, const ac_puzzle_opts *o, int *kv, int *na, int *ffn, int *nf);

/* BLD over the parent m (read only; resident 16-bit allowed) on the
 * calibration tokens ids[n] in windows of ctx, slicing by imp. Refuses
 * mixture-of-experts and hybrid models and layers without attention or
 * FFN. progress (may be NULL) gets the fraction of layers done. */
int ac_puzzle_library_build(const ac_model *m, const ac_importance *imp, const int *ids, size_t n, int ctx,
                            const ac_puzzle_opts *o, void (*progress)(void *ud, double frac), void *ud,
                            ac_puzzle_library *lib, ac_err *e);
void ac_puzzle_library_free(ac_puzzle_library *lib);

/* A mixed-integer program of Puzzle's form: groups (layers) g of
 * n_choices[g] binary choices each, exactly one chosen per group;
 * minimise sum obj[j] x[j] subject to sum_j coef[c][j] x[j] <= rhs[c] for
 * each of n_cons rows (j runs over every group's choices in order;
 * coef is [n_cons][total]). choice[g] gets the chosen index in group g,
 * *objval its objective. gap: the relative optimality gap at which the
 * branch and bound may stop (0: proven optimal); time_limit_s (0: none):
 * past it the best solution found is returned. Returns 0 when solved, 1
 * when infeasible (or no solution within the time), -1 on an error
 * (GLPK's). */
typedef struct {
    int n_groups;
    const int *n_choices;
    const double *obj;
    int n_cons;
    const double *coef;
    const double *rhs;
    double gap, time_limit_s;
} ac_puzzle_mip;
/* The search's: python-mip's default gap (Model-Optimizer's solver), 30 s. */
#define AC_PUZZLE_MIP_GAP 1e-4
#define AC_PUZZLE_MIP_SECONDS 30
int ac_puzzle_mip_solve(const ac_puzzle_mip *p, int *choice, double *objval, ac_err *e);

/* The search: per-layer costs of every block predicted with p's cost
 * model, the program solved and verified (above). r->arch is the chosen
 * structure (base with each layer's block; the base when infeasible),
 * r->cost its prediction, r->pred_loss the summed BLD score; choice[l]
 * (may be NULL; n_layers ints) the block index a * nf + f of each layer.
 * r->detail: {"library": [...per layer variants and scores], "mip": {...},
 * "bld": {...}}. */
int ac_search_puzzle(const ac_search_problem *p, const ac_puzzle_library *lib, ac_search_result *r, int *choice,
                     ac_err *e);

/* Put the trained sub-blocks of the chosen blocks (lib kept its weights)
 * into student, whose architecture is the chosen one with every layer kept
 * (ac_prune of the parent to r->arch): its fp32 or BF16 matrices and fp32
 * norms. Layers whose block is the parent's are left as they are. */
int ac_puzzle_realize(const ac_puzzle_library *lib, const int *choice, ac_model *student, ac_err *e);

#endif
