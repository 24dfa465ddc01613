/*
 * minitron.h - the Minitron baseline as NVIDIA Model-Optimizer's
 * mcore_minitron prunes: the comparison arm AutoCompress is measured against.
 *
 * What it owns, following modelopt/torch/prune/plugins/mcore_minitron.py and
 * modelopt/torch/nas/plugins/megatron.py:
 * - uniform axes searched independently: hidden size, FFN size, attention
 *   heads (every KV group kept, heads trimmed within each group by
 *   importance: choices are h x n_kv_groups for h = 1 .. heads per group),
 *   number of layers (the lowest-scored layers by 1 - cos(input, output)
 *   dropped, not necessarily contiguous);
 * - per-axis choices on a divisor grid: every multiple of the divisor up to
 *   the base value, plus the base value. Model-Optimizer's divisors (hidden
 *   256, FFN 512, layers 2, experts 8) give about 16 choices per axis on
 *   8B-class models; by default each divisor here is the smaller of that and
 *   max(1, round(base / 16)), so 8B-class and larger models get
 *   Model-Optimizer's own and small models keep about 16 choices
 *   (ac_minitron_default_divisor). Capped as Model-Optimizer caps them: width
 *   axes keep the top 40 % of their choices (sorted(v)[int(0.6 n):]), depth
 *   the top 20 % (sorted(v)[int(0.8 n):]). Caps, divisors and top_k are
 *   options (ac_minitron_opts, the spec's "minitron" section);
 * - the full grid filtered by the same cost model and limits AutoCompress
 *   gets (Model-Optimizer filters by parameter count only; latency,
 *   throughput and memory limits are the fair comparison here);
 * - the AC_MINITRON_TOP_K feasible candidates closest to the binding limit
 *   (largest worst-case constraint value first; with a parameter limit this
 *   is Model-Optimizer's "sorted by params, descending") each pruned for real
 *   (ac_prune with Minitron's importance) and scored: by default on the
 *   calibration split by perplexity (the lowest kept); with a score task
 *   (search.h, p->score_task) by that multiple-choice task's accuracy, the
 *   highest kept, the first of equals, as Model-Optimizer keeps
 *   max(candidates, key=score) with its score_func (MMLU accuracy).
 * Importance is ac_importance's Minitron part (importance.h).
 *
 * A hybrid (nemotron_h) base runs minitron_hybrid.c's grid instead (Mamba
 * heads by group, per-type depth; docs/hybrid.md).
 *
 * A dropped layer is a layer with neither attention nor FFN in the
 * architecture (n_heads = n_kv_heads = ffn = 0), which the engine, the cost
 * model and ac_prune already treat as the identity; ac_minitron_compact
 * removes such layers from a pruned model (a plain Llama for export).
 */
#ifndef AC_MINITRON_H
#define AC_MINITRON_H

#include "search/search.h"

/* Model-Optimizer's defaults (MCoreMinitronSearcher, MCoreMinitronConfig) */
#define AC_MINITRON_TOP_K 10
#define AC_MINITRON_MAX_WIDTH_PRUNING 0.40
#define AC_MINITRON_MAX_DEPTH_PRUNING 0.20
#define AC_MINITRON_HIDDEN_DIVISOR 256
#define AC_MINITRON_FFN_DIVISOR 512
#define AC_MINITRON_LAYERS_DIVISOR 2
#define AC_MINITRON_EXPERTS_DIVISOR 8

/* Divisor that leaves about 16 choices for an axis whose base value is max. */
int ac_minitron_divisor(int max);
/* The default divisor of an axis whose Model-Optimizer default is mo (256
 * hidden, 512 FFN, 2 layers, 8 experts): min(mo, ac_minitron_divisor(max)). */
int ac_minitron_default_divisor(int mo, int max);
/* Every multiple of divisor in [divisor, max] and max itself, ascending, into
 * out (room for max + 1 values); returns the count. */
int ac_minitron_choices(int max, int divisor, int *out);
/* Index of the first value kept when n sorted choices are capped at
 * max_pruning (0.40 width, 0.20 depth): int((1 - max_pruning) * n), at
 * most n - 1 (the base value stays a choice). */
int ac_minitron_cap_start(int n, double max_pruning);
/* Layers by Minitron's depth importance (1 - cos, imp->layer_bi), most
 * important first, into order[n_layers]. */
void ac_minitron_layer_order(const ac_importance *imp, int *order);
/* A shallow copy of imp whose FFN and hidden orders are Minitron's (not to be
 * freed): what ac_prune and ac_repair_ffn take for the Minitron arm. */
void ac_minitron_importance_view(const ac_importance *imp, ac_importance *view);
/* Remove the layers that have neither attention nor FFN (moves pointers;
 * keeps at least one layer). */
void ac_minitron_compact(ac_model *m);

/* Model-Optimizer's Minitron search (above). With p->model and
 * p->calib_ids the top-k candidates are scored (on the CPU as masked views
 * of p->model, layer by layer; on a GPU pruned for real); without them the
 * candidate closest to the limit is taken unscored. r->detail gets the
 * report: axes, grid size, layer scores and `candidates` (architecture,
 * predicted figures, calibration or task score of each). Infeasible when no grid
 * point meets the limits (r->arch is then the closest one). */
int ac_search_minitron(const ac_search_problem *p, ac_search_result *r, ac_err *e);

#endif
