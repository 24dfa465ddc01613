/*
 * ssm_prune.h - the hybrid Mamba-Transformer (nemotron_h) side of
 * importance and slicing: Mamba heads ranked and removed group-aware, and
 * a hybrid model sliced to a smaller one layer type by layer type.
 *
 * Mamba heads (and head dims), as Model-Optimizer's Minitron ranks them for Nemotron-H
 * (modelopt's MambaNumHeadsHp and its in_proj hook): per channel of
 * in_proj's x output, per sequence the mean over tokens of |x|, its square
 * summed over sequences (stats.h, mt_ssm); a head's score is the L2 over
 * its head_dim channels of those channels' square roots; heads are ranked
 * within each of the n_groups groups (the heads that share one B and C),
 * and a target keeps the same number of heads, its best, in every group
 * (Minitron-SSM's group-aware pruning: B, C and the conv channels of B and
 * C stay whole, the gated norm keeps its n_groups groups).
 *
 * ac_prune_hybrid (what ac_prune does for nemotron_h): each layer of the
 * target is the source's type (Mamba, attention, MLP or MoE) or removed
 * (every width 0, the identity); Mamba layers keep heads as above (in_proj's
 * z, x and dt rows, conv channels, dt_bias, A_log, D, the gated norm's
 * weight, out_proj's columns), attention layers are cut as slice.c cuts
 * them (KV groups or heads within groups), MLP layers keep their best
 * channels (relu^2: up rows, down columns), MoE layers keep their best
 * experts (the router's rows and correction bias with them), each on its
 * own best expert_ffn channels (imp->echan_order: up rows, down columns),
 * their shared expert on its best shared_ffn channels (imp->sh_order: up
 * rows, down columns) and their latent projections whole; every matrix keeps
 * the hidden channels
 * imp->hid_order ranks best. A BF16 student is sliced a row at a time
 * straight into its matrices (each row gathered in fp32 and rounded as
 * ac_model_to_bf16 rounds; an MoE layer one expert after another): no
 * layer in fp32 beside it.
 *
 * Ownership: *dst is a new model the caller frees; imp is borrowed.
 */
#ifndef AC_SSM_PRUNE_H
#define AC_SSM_PRUNE_H

#include "search/importance.h"
#include "format/model.h"

/* imp->ssm_head_order / ssm_head_score (importance.h) from the statistics
 * mt_ssm[l][d_inner] (NULL rows for other layers). */
int ac_ssm_rank_heads(const double *const *mt_ssm, const ac_arch *a, ac_importance *imp, ac_err *e);
/* The same one layer at a time (the layer-streamed calibration ranks each
 * layer as soon as its statistics are complete): ac_ssm_rank_alloc sets
 * the three row arrays (all rows NULL), ac_ssm_rank_layer fills layer l's
 * rows from its statistic mt_ssm_l[d_inner] (nothing for a layer without
 * Mamba heads or without a statistic). */
int ac_ssm_rank_alloc(const ac_arch *a, ac_importance *imp, ac_err *e);
int ac_ssm_rank_layer(const double *mt_ssm_l, const ac_arch *a, int l, ac_importance *imp, ac_err *e);
/* imp->sh_order / sh_score (importance.h) from the statistics mt_shared[l][shared_ffn] (NULL rows for other
 * layers): a channel's score is the sqrt of its statistic, ranked best first (ties: the lower index). */
int ac_rank_shared(const double *const *mt_shared, const ac_arch *a, ac_importance *imp, ac_err *e);
/* The kept heads of Mamba layer l when t keeps t->layers[l].ssm_heads of
 * src's: per group its best (imp->ssm_head_order; NULL: the first), in
 * ascending order, into kept (room for src's heads). Returns the count, or
 * -1 when the target is not a multiple of the groups or exceeds the source.
 * With a narrower t->ssm_head_dim the heads are ranked on the kept dims'
 * channels (ac_ssm_kept_dims) as Model-Optimizer ranks them. */
int ac_ssm_kept_heads(const ac_arch *src, const ac_arch *t, const ac_importance *imp, int l, int *kept);
/* The head dims Mamba layer l keeps when t->ssm_head_dim is narrower than
 * src's: the dims with the largest L2 over the heads of their channel
 * scores (imp->ssm_chan_score; NULL: the first), ascending, into dims (room
 * for src's head dim); the same dims in every head of the layer
 * (Model-Optimizer's mamba_head_dim ranking). Returns the count or -1. */
int ac_ssm_kept_dims(const ac_arch *src, const ac_arch *t, const ac_importance *imp, int l, int *dims);
/* Mamba layer l's head dims best first (the L2 over the heads of their channel scores; identity without scores)
 * into order[ssm_head_dim]; imp->ssm_dim_order, where set, takes precedence in ac_ssm_kept_dims. 0, or -1 out of
 * memory. */
int ac_ssm_dim_order(const ac_arch *src, const ac_importance *imp, int l, int *order);
/* src sliced to t (see above); bf16: the student's matrices BF16 (wown). */
int ac_prune_hybrid(const ac_model *src, const ac_arch *t, const ac_importance *imp, ac_model *dst, int bf16,
                    ac_err *e);

#endif
