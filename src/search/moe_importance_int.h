/*
 * moe_importance_int.h - which experts of a mixture-of-experts model matter:
 * Model-Optimizer's Minitron score, the mean over the calibration tokens of
 * the L2 norm of each expert's routed output, here weighted by the token's
 * routing weight for that expert (what the expert adds to the residual
 * stream), gathered through the engine's expert_out hook. The orders feed
 * ac_prune (slice.h), which keeps the best experts of a layer.
 * Each expert's channels (its width, Model-Optimizer's moe_ffn_hidden_size:
 * an L2NormHook on each expert's down-projection input, which on the
 * expert's 2-D input [its tokens, Fe] is, per forward call, the mean over
 * the expert's tokens of |act| per channel, squared and summed over the
 * calls, then the square root), through the expert_act hook: ac_prune keeps
 * each expert's best channels by it (each expert ranked on its own, one
 * width for all, as Model-Optimizer's homogeneous pruning).
 *
 * Ownership: the orders and scores are imp's (ac_importance_free).
 */
#ifndef AC_MOE_IMPORTANCE_H
#define AC_MOE_IMPORTANCE_H

#include <stddef.h>

#include "core/err.h"
#include "search/importance.h"
#include "format/model.h"

/* imp->expert_order[l] / expert_score[l] and echan_order[l] / echan_score[l]
 * for every MoE layer of m (NULL for dense ones) over ids (windows of ctx tokens, at most `windows`); other
 * fields of imp are left as they are (imp->n_layers must be m's). */
int ac_expert_importance(const ac_model *m, const int *ids, size_t n, int ctx, int windows, ac_importance *imp,
                         ac_err *e);

#endif
