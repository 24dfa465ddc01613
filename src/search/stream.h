/*
 * stream.h - one transformer layer at a time over cached activations, for
 * layer-streamed calibration (importance.c): the residual stream of the
 * calibration windows is kept in memory, layer l runs over it (statistics
 * hooks see what the engine's hooks see), and its output is layer l+1's
 * input. Also runs a layer with a replaced o_proj/down_proj (masked units)
 * or with its KV heads merged, and the final norm + LM head's loss.
 *
 * Same arithmetic as engine.c's forward (kernels_cpu.h), windows always
 * start at position 0 (no KV cache: a window's keys are its own rows).
 * Ownership: ac_stream owns its scratch buffers (ac_stream_free); the model
 * is borrowed.
 */
#ifndef AC_STREAM_H
#define AC_STREAM_H

#include "engine.h"
#include "err.h"
#include "model.h"

typedef struct {
    const ac_model *m;
    int B, n; /* at most B windows of n tokens per call */
    float *xn, *q, *kt, *vt, *att, *g, *u, *x0, *scores, *cos_t, *sin_t, *logits;
    int *pos;
    ac_wscratch ws; /* ac_linear_w's tiles for a resident (BF16/F16) model */
} ac_stream;

/* What differs from the model's layer in one call (NULL = nothing). */
typedef struct {
    const float *wo, *wd; /* replacement o_proj [H][Q] / down_proj [H][F], or NULL */
    int kv_merge;         /* > 0: KV heads mean-pooled to this many (a divisor), as ac_prune merges */
} ac_stream_mod;

int ac_stream_init(ac_stream *s, const ac_model *m, int B, int n, ac_err *e);
void ac_stream_free(ac_stream *s);
/* x[B*n][H] (B <= s->B windows of s->n tokens): x = layer l (x), in place.
 * hk (may be NULL) sees normed/head_out/ffn_act/layer_io as in the engine. */
void ac_stream_layer(ac_stream *s, int l, float *x, int B, const ac_stream_mod *mod, const ac_engine_hooks *hk);
/* Rows of the token embedding: x[N][H] for tok[N]; -1 on an id outside the vocabulary. */
int ac_stream_embed(const ac_model *m, const int *tok, long N, float *x, ac_err *e);
/* Sum over the B windows of the cross-entropy of predicting tok[b][t+1]
 * from row (b, t) of the final residual x, t < n-1 (x is not modified);
 * *count predictions. */
double ac_stream_nll(ac_stream *s, const float *x, const int *tok, int B, long *count);

#endif
