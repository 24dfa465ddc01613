/*
 * slice_int.h - slice.c's own steps, for the nemotron_h slicing in
 * ssm_prune.c (the one other file that cuts weights): its row/column
 * gather, its per-layer check and its layer cut (attention merged or cut by
 * KV groups, dense FFN, experts), which a hybrid's attention layers reuse.
 */
#ifndef AC_SLICE_INT_H
#define AC_SLICE_INT_H

#include "search/importance.h"
#include "format/model.h"

/* dst[r][c] = src[rows[r]][cols[c]] (rows/cols NULL = identity); src in
 * dtype wdt with src_cols columns; row: scratch of src_cols floats. */
void ac_slice_gather(float *dst, const void *src, int wdt, int src_cols, const int *rows, int nr, const int *cols,
                     int nc, float *row);
/* Whether layer l of t can be cut from src's (the reason in e when not). */
int ac_slice_check_layer(const ac_arch *src, const ac_arch *t, int l, ac_err *e);
/* Layer l of t into dw (fp32): its attention and FFN as ac_prune cuts them;
 * hk the Ht kept hidden channels; row, acc: scratch of the widest row and
 * 2 H doubles. */
int ac_slice_layer(const ac_model *src, const ac_arch *t, const ac_importance *imp, int l, ac_layer_w *dw,
                   const int *hk, float *row, double *acc, ac_err *e);

#endif
