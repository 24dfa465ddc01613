/*
 * slice_int.h - slice.c's own steps, for the nemotron_h slicing in
 * ssm_prune.c (the one other file that cuts weights): its row/column
 * gather (into fp32, or into a 16-bit student a row at a time), its
 * per-layer check and its layer cut (attention merged or cut by KV groups,
 * dense FFN, experts), which a hybrid's attention layers reuse.
 */
#ifndef AC_SLICE_INT_H
#define AC_SLICE_INT_H

#include "search/importance.h"
#include "format/model.h"

/* What a slice writes into and its scratch (the caller's; sized for the
 * source: row and out the widest source row, acc 2 hidden doubles). */
typedef struct {
    int ddt;     /* the student's matrix dtype: ST_F32, or ST_BF16 (each row gathered in fp32, then rounded) */
    float *row;  /* one source row converted to fp32 */
    float *out;  /* one student row before it is rounded */
    double *acc; /* KV merging's sums */
} ac_slice_buf;

/* dst[r][c] = src[rows[r]][cols[c]] (rows/cols NULL = identity); src in
 * dtype wdt with src_cols columns; row: scratch of src_cols floats. */
void ac_slice_gather(float *dst, const void *src, int wdt, int src_cols, const int *rows, int nr, const int *cols,
                     int nc, float *row);
/* The same into a student matrix dst stored in b->ddt (a 16-bit one a row
 * at a time through b->out: the values ac_slice_gather gives, rounded). */
void ac_slice_put(void *dst, const ac_slice_buf *b, const void *src, int wdt, int src_cols, const int *rows, int nr,
                  const int *cols, int nc);
/* Whether layer l of t can be cut from src's (the reason in e when not). */
int ac_slice_check_layer(const ac_arch *src, const ac_arch *t, int l, ac_err *e);
/* Layer l of t into dw (matrices in b->ddt, norms and biases fp32): its
 * attention and FFN as ac_prune cuts them; hk the Ht kept hidden channels. */
int ac_slice_layer(const ac_model *src, const ac_arch *t, const ac_importance *imp, int l, ac_layer_w *dw,
                   const int *hk, const ac_slice_buf *b, ac_err *e);

#endif
