/*
 * search.h - choose a pruned architecture that meets hardware constraints
 * with the least predicted quality loss.
 *
 * AutoCompress: a continuous relaxation (kept fraction per layer of KV
 * groups and of FFN width, and of the hidden width) optimised by projected
 * Adam on quality loss + Lagrange multipliers x constraint violations, with
 * the cost model's gradient; multipliers by dual ascent. The result is
 * rounded to the export target's granularity and then made exactly feasible
 * by a greedy repair on the discrete architecture (cheapest quality per unit
 * of violation first), then greedily refilled while it stays feasible.
 * The Minitron baseline is in minitron.h (Model-Optimizer's search).
 * Deterministic for a given seed.
 *
 * Hybrid Mamba-Transformer models (nemotron_h; surrogate_hybrid.c): the
 * export holds one width per layer type (mamba_num_heads, num_key_value_
 * heads, intermediate_size, n_routed_experts) and model-wide ones
 * (mamba_head_dim, moe_intermediate_size, moe_shared_expert_intermediate_
 * size, moe_latent_size, hidden_size), so the search is discrete: the gate
 * search's per-type moves (dnas_hybrid.c: a type's width one grid step,
 * a model-wide width one step, a type's weakest layer removed) from the
 * full model, each priced by the cost model and by its change of the
 * predicted loss increase; shrink by least loss per violation removed
 * until feasible, then grow by most loss recovered while feasible; then a
 * local search: from the result each single move (either way) and each
 * pair of layer moves (two layers removed, or one removed and one put
 * back), the greedy again (after a layer move on the widths alone), the
 * lowest predicted loss kept, until none improves (a whole layer frees
 * many parameters at once, which the unit-priced shrink does not
 * prefer). The
 * axes are those ac_dnas_gates_init gates (search.prune_hidden,
 * prune_experts, prune_expert_ffn as there). The predicted loss
 * (ac_search_pred_loss) adds per layer: a Mamba layer's head curve
 * (ssm_sens) at the share of its x channels removed, 1 - (heads kept /
 * heads) (head dim kept / head dim) (no curve measures the head dim: it
 * is priced as the same share of heads); an attention layer's KV curve;
 * an MLP layer's channel curve; an MoE layer's experts curve over its
 * expert capacity in channels, C = experts x expert width (times the kept
 * latent share) + the shared expert's width: the curve at the share
 * (C_base - C) / ((E - top_k) Fe) of the removable capacity removed, and
 * past the curve's end (below top_k experts' worth, down to the layer
 * removed at C = 0) its last point times that share (expert width,
 * latent, shared width and the layer's removal have no curve: each is
 * priced as that much expert capacity; no calibration point removes
 * more than E - top_k experts); the hidden curve. Which layer
 * of a type goes first: the least loss with it removed (its curves' last
 * points; result detail.layer_removal_loss). Needs the curves: an error
 * without them (every calibration method gives them, on the CPU and on a
 * CUDA target; ac_search_has_curves).
 */
#ifndef AC_SEARCH_H
#define AC_SEARCH_H

#include <jansson.h>

#include "search/constraints.h"
#include "cost/costmodel.h"
#include "search/importance.h"
#include "format/model.h"
#include "runtime/tasks.h"


typedef enum { AC_EXPORT_DECI, AC_EXPORT_LLAMA, AC_EXPORT_GGUF } ac_export_target;
/* search.method: differentiable gates (src/search/dnas.c) or the surrogate relaxation only */
typedef enum { AC_SEARCH_DNAS, AC_SEARCH_SURROGATE } ac_search_method;

typedef struct {
    int steps;
    unsigned seed;
    double lr;
    int ffn_multiple, hidden_multiple;
    int prune_hidden;
    int prune_experts; /* mixture-of-experts models: 0 keeps every expert */
    int prune_expert_ffn; /* mixture-of-experts models: 1 lets every expert's width be cut (one width for the model;
                           * Minitron's moe_ffn_hidden_size, dnas's expert-width gates) */
    int min_top_k;        /* mixture-of-experts models: top_k searched in [min_top_k, the model's] (topk.h); 0: kept */
    ac_export_target target;
    int gguf;                                 /* with AC_EXPORT_LLAMA: also write model.gguf (gguf.h) */
    ac_search_method method;                  /* method autocompress: dnas or surrogate */
    int dnas_steps, dnas_batch, dnas_seq_len; /* dnas gate training (ac_dnas_opts) */
    double dnas_lr;
    int cotrain; /* dnas: weights (a copy) trained with the gates */
    int keep_weights; /* dnas with cotrain: the result keeps the co-trained weights (ac_search_result.trained) */
} ac_search_opts;

/* The Minitron arm's options (minitron.h; the spec's "minitron" section).
 * A value <= 0 takes Model-Optimizer's default: caps 0.40 (width) and 0.20
 * (depth), top_k 10, divisors as ac_minitron_default_divisor gives them. */
typedef struct {
    double max_width_pruning, max_depth_pruning;
    int top_k;
    int hidden_divisor, ffn_divisor, layers_divisor, experts_divisor;
    int score_norm; /* with a score task: 0 acc, 1 acc_norm */
} ac_minitron_opts;

typedef struct {
    const ac_cost_table *table;
    const ac_workload *workload;
    const ac_engine_profile *profile;
    const ac_importance *imp;
    const ac_arch *base;
    ac_constraints limits;
    ac_search_opts opts;
    void (*emit)(void *ud, json_t *progress); /* progress events (borrowed) */
    void *ud;
    /* Minitron scores its candidates by pruning them (minitron.h): the
     * unpruned model and calibration tokens (windows of ctx), scored on CUDA
     * device 0 when cuda; model NULL: unscored. */
    const ac_model *model;
    const int *calib_ids;
    size_t n_calib;
    int ctx, cuda;
    ac_minitron_opts minitron;
    /* Minitron's score: NULL, calibration loss (lowest wins); else this
     * task's accuracy (minitron.score_norm: acc_norm), highest wins, as
     * Model-Optimizer's score_func (MMLU) does. score_name: its report name. */
    const ac_mc_task *score_task;
    const char *score_name;
} ac_search_problem;

typedef struct {
    ac_arch arch; /* owned */
    ac_cost cost;
    double pred_loss; /* predicted calibration-loss increase */
    int feasible;
    int steps_run;
    json_t *detail; /* method-specific report fields (owned), or NULL */
    ac_model *trained; /* dnas with cotrain and keep_weights: the co-trained weights (fp32, the base architecture,
                        * every unit; prune it to arch in the gate-score orders), owned; else NULL */
} ac_search_result;

int ac_search_autocompress(const ac_search_problem *p, ac_search_result *r, ac_err *e);
void ac_search_result_free(ac_search_result *r);
/* Worst relative violation of the limits by c (<= 0 when feasible). */
double ac_constraints_violation(const ac_constraints *l, const ac_cost *c);
json_t *ac_constraints_report(const ac_constraints *l, const ac_cost *c);
/* The exact feasibility repair and refill on a discrete architecture a
 * (in place); cost gets its prediction. Returns 1 when a meets every limit. */
int ac_search_repair(const ac_search_problem *p, ac_arch *a, ac_cost *cost);
/* Tensor parallelism (p->profile->tp > 1): refuses a base model whose
 * layers the serving engine cannot split tp ways (engines.h,
 * ac_tp_layer_unsplit) and, with check_grid, an FFN grid (ffn_multiple)
 * that is not a multiple of tp. The searches then keep every pruned layer
 * splittable: KV counts (and with them query heads) only on the counts
 * ac_tp_attn_splits allows, FFN widths on the grid. */
int ac_search_check_tp(const ac_search_problem *p, int check_grid, ac_err *e);
/* Predicted loss increase of a discrete architecture: its layers' curves added up (a hybrid's: see "Hybrid
 * Mamba-Transformer models" below; 0 without curves). */
double ac_search_pred_loss(const ac_search_problem *p, const ac_arch *a);
/* Whether the surrogate search has the curves it scores by: a dense or MoE model always, a hybrid when its
 * calibration measured them (importance.h: ssm_sens; every method on the CPU, streamed with a CUDA target). */
int ac_search_has_curves(const ac_search_problem *p);

#endif
