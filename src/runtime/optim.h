/*
 * optim.h - AdamW (decoupled weight decay, as torch.optim.AdamW) over a list
 * of fp32 parameter buffers (the master weights) and their gradients, with a
 * linear-warmup + cosine-decay learning rate and global-norm gradient
 * clipping (as torch.nn.utils.clip_grad_norm_). Gradient accumulation is the
 * caller's: gradients add up in their buffers (ac_train_backward) until
 * ac_adamw_step consumes them. Deterministic: no randomness, fixed order.
 *
 * Ownership: the optimizer borrows parameter and gradient buffers and owns
 * its moment buffers (one allocation of 2 x total parameters, made at the
 * first step).
 */
#ifndef AC_OPTIM_H
#define AC_OPTIM_H

#include <stddef.h>

#include "core/err.h"
#include "format/model.h"

typedef struct {
    float lr, min_lr; /* peak and final learning rate */
    float beta1, beta2, eps;
    float weight_decay;      /* decoupled; only on tensors added with decay = 1 */
    float clip;              /* global gradient-norm limit; <= 0 = none */
    int warmup, total_steps; /* schedule, in optimizer steps */
} ac_adamw_opts;

typedef struct {
    float *p;
    const float *g;
    size_t n, off;
    int decay;
} ac_param;

typedef struct {
    ac_adamw_opts o;
    ac_param *ps;
    int np, cap;
    size_t total;
    float *m, *v; /* [total] each, in one allocation */
    long step;    /* updates done */
} ac_adamw;

/* lr 1e-3 -> 1e-4, betas (0.9, 0.95), eps 1e-8, decay 0.1, clip 1, no warmup, 1 step. */
void ac_adamw_defaults(ac_adamw_opts *o);
void ac_adamw_init(ac_adamw *a, const ac_adamw_opts *o);
void ac_adamw_free(ac_adamw *a);
int ac_adamw_add(ac_adamw *a, float *p, const float *g, size_t n, int decay, ac_err *e);
/* Every weight of m with its gradient in g (same arch): matrices and
 * embeddings decayed, norms and biases not; a tied head once. */
int ac_adamw_add_model(ac_adamw *a, ac_model *m, const ac_model *g, ac_err *e);
/* Learning rate of update number `step` (0-based): lr*(step+1)/warmup during
 * warmup, then min_lr + (lr-min_lr)/2 * (1 + cos(pi * progress)), progress =
 * (step-warmup)/(total-warmup) clamped to [0,1]. */
float ac_lr_at(const ac_adamw_opts *o, long step);
/* Global L2 norm of all gradients. */
double ac_grad_norm(const ac_adamw *a);
/* One update from the current gradients (clipped to o.clip); *gnorm (may be
 * NULL) gets the norm before clipping. Gradients are left as they are. */
int ac_adamw_step(ac_adamw *a, double *gnorm, ac_err *e);

#endif
