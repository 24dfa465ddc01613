/*
 * slice.h - slice a model's weights to a smaller architecture, keeping the
 * most important KV groups (with their query heads), FFN channels and hidden
 * channels (the orders in importance.h). The search evaluates candidates
 * through it (importance, Minitron, DNAS); compress/prune.h adds the
 * least-squares repair of the sliced FFN layers.
 *
 * Ownership: *dst is a new model the caller frees (ac_model_free).
 */
#ifndef AC_SLICE_H
#define AC_SLICE_H

#include "search/importance.h"
#include "format/model.h"

int ac_prune(const ac_model *src, const ac_arch *target, const ac_importance *imp, ac_model *dst, ac_err *e);
/* The same student with BF16 matrices (wown; norms and biases fp32): each
 * matrix gathered in fp32 as ac_prune does, then rounded to nearest even,
 * so it is bit for bit ac_model_to_bf16 of ac_prune's student (and what
 * ac_model_save's BF16 export of that writes). Every matrix is gathered a
 * row at a time straight into the student (a mixture-of-experts layer one
 * expert after another): beside the student only two rows of fp32 scratch,
 * never a layer's matrices in fp32. A job's students
 * (pipeline/job.c): half the memory of fp32 ones, and the weights its
 * report measures are the ones it exports. */
int ac_prune_bf16(const ac_model *src, const ac_arch *target, const ac_importance *imp, ac_model *dst, ac_err *e);

/* What ac_prune(src, target, imp) keeps, as 0/1 masks over src's units, so
 * that the pruned model's outputs can be computed on src's own weights
 * (stream.h's masks are exactly removal): head_mask[n_heads] and
 * ffn_mask[ffn] of layer l (a target layer without attention or FFN: all 0).
 * Only for layers that keep every KV group (Minitron's head trimming, FFN
 * and hidden width, layer drop): returns 1, masks untouched, for a layer
 * that merges or removes KV groups or that ac_prune refuses; 0 when done.
 * The caller checks what ac_prune checks of the whole architecture (same
 * layers, head_dim and vocabulary, hidden width at most the source's).
 * ac_prune_hidden_mask: hid_mask[hidden] of the kept hidden channels. */
int ac_prune_layer_masks(const ac_arch *src, const ac_arch *target, const ac_importance *imp, int l, float *head_mask,
                         float *ffn_mask);
void ac_prune_hidden_mask(const ac_arch *src, const ac_arch *target, const ac_importance *imp, float *hid_mask);
/* A mixture-of-experts layer l: expert_mask[src experts] 1 on the experts
 * ac_prune keeps (imp->expert_order's best, or the first without it), 0 on
 * the others (stream.h removes those from the routing, as ac_prune does).
 * Returns 1 (mask untouched) where masks cannot express the target layer
 * (its expert width differs, or it has no experts while src has). */
int ac_prune_expert_mask(const ac_arch *src, const ac_arch *target, const ac_importance *imp, int l, float *expert_mask);

/* The first k entries of order, ascending (the kept units in their
 * original order); malloc'd (k + 1 ints), NULL when out of memory. */
int *ac_prune_kept(const int *order, int k);

#endif
