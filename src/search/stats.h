/*
 * stats.h - activation statistics for importance scoring, gathered by
 * engine hooks during forward passes: per head the sum of squared output
 * norms, per FFN channel the sum of |silu(g)*u|, per hidden channel the sum
 * of |normed input|, per layer the block influence (1 - cos of the residual
 * stream before and after), optionally the Gram matrix of each layer's FFN
 * activations (least-squares repair).
 */
#ifndef AC_STATS_H
#define AC_STATS_H

#include "runtime/engine.h"
#include "core/err.h"
#include "format/model.h"

typedef struct {
    int n_layers, hidden;
    double **head;    /* [l][n_heads]: sum over tokens of ||head output||^2 */
    double **ffn;     /* [l][ffn]: sum over tokens of |silu(g)*u| */
    double *hidden_a; /* [H]: sum over tokens and norms of |normed x| */
    double *layer;    /* [l]: sum over tokens of 1 - cos(x_in, x_out) */
    float **ffn_gram; /* [l][ffn*ffn]: A^T A of FFN activations, or NULL (opt-in) */
    /* Minitron importance as NVIDIA Model-Optimizer's hooks gather it (opt-in,
     * NULL otherwise): per sequence the mean over its tokens of |x| per
     * channel, squared, summed over sequences (the reader takes the sqrt). */
    double **mt_attn; /* [l][n_heads*head_dim]: o_proj input */
    double **mt_ffn;  /* [l][ffn]: down_proj input */
    double **mt_norm; /* [2l] input_layernorm, [2l+1] post_attention_layernorm outputs, [H] */
    double **mt_ssm;  /* [l][d_inner]: a Mamba layer's x (in_proj's output, channels d_inner .. 2 d_inner),
                       * NULL rows elsewhere */
    double **mt_shared; /* [l][shared_ffn]: a nemotron_h MoE layer's shared-expert down_proj input, NULL rows
                         * elsewhere (Model-Optimizer's moe_shared_expert_intermediate_size statistic) */
    double *mt_tmp;   /* scratch, widest of the above */
    int cur_B, cur_n; /* shape of the forward in progress */
    long tokens;
} ac_stats;

int ac_stats_init(ac_stats *s, const ac_arch *a, ac_err *e);
/* Also accumulate the Gram matrix of each layer's FFN activations (for
 * least-squares repair); memory ffn^2 floats per layer. */
int ac_stats_want_gram(ac_stats *s, const ac_arch *a, ac_err *e);
/* Also gather the Minitron statistics (mt_*); a few widths per layer. */
int ac_stats_want_minitron(ac_stats *s, const ac_arch *a, ac_err *e);
void ac_stats_free(ac_stats *s);

/* The hooks that accumulate into s (s must outlive the engine using them). */
void ac_stats_hooks(ac_stats *s, ac_engine_hooks *h);

#endif
