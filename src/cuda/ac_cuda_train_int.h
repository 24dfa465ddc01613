/*
 * ac_cuda_train_int.h - the training pass on CUDA (part of the plugin
 * libac_cuda.so; src/cuda/ac_cuda_train.cu): the same forward with kept
 * activations, losses (next-token CE, temperature-scaled distillation KL)
 * and backward as src/runtime/train.c, and the AdamW update of src/runtime/optim.c, on
 * device memory allocated once at create.
 *
 * Precision: fp32 master weights, gradients, Adam moments and activations
 * on the device; GEMMs are cublasGemmEx with FP32 inputs and FP32 compute.
 * (BF16 weights would halve weight traffic, but then an fp32 master copy is
 * needed anyway for the updates; for the small students distillation trains
 * fp32 everywhere keeps the gradients comparable to the CPU's at 1e-4.)
 * Attention backward follows FlashAttention-2's split: the forward keeps each
 * row's log-sum-exp, the backward recomputes probabilities per query row for
 * dq and per key row for dk and dv, so there are no atomics and no T x T buffer.
 * Gates (train.h's ac_gates: per query head, FFN channel, hidden channel,
 * sub-block, expert, expert channel; nemotron_h's Mamba head and head dim,
 * shared-expert channel, LatentMoE latent channel) are on the device too, all 1 after
 * create; their gradients accumulate with the weights' (acc_trainer_gates
 * reads and clears them).
 * Mixture-of-experts layers (softmax routers: Mixtral, Qwen3-MoE) run the
 * router's and every expert's GEMMs on the device over the rows routed to
 * it; the routing rule and its backward run on the host over the N x E
 * logits (block.h's ac_moe_route_gated and ac_moe_route_gated_bwd), as the
 * inference engine routes. nemotron_h's dense layers train here too: the
 * Mamba-2 mixer (ac_cuda_ssm_int.h: the conv and the scan taped, the scan's
 * states recomputed by its backward; gradients into in_proj, the conv's
 * weight and bias, dt_bias, A_log, D, the gated norm and out_proj; a gate
 * per Mamba head and per head dim, its sub-block on the mlp gate as
 * train.c's) and the
 * squared-ReLU MLP, and its MoE layers (the sigmoid router's rule and
 * backward on the host, block.h's ac_moe_route_sigmoid and
 * ac_moe_route_sigmoid_bwd; squared-ReLU experts without a gate; the shared
 * expert, its channel gates); LatentMoE's layers too (the down projection
 * into the latent, the experts in the latent width into their own taped
 * slot, the up projection back under the sub-block gate; the latent
 * channel gates on both latent slots, as train.c's).
 * Every function returns 0 or -1 with a message in err. They are reached
 * through the plugin's acc_api table (ac_cuda.h).
 */
#ifndef AC_CUDA_TRAIN_H
#define AC_CUDA_TRAIN_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "cuda/ac_cuda.h"
#include "format/model.h"
#include "runtime/train.h"

typedef struct acc_trainer acc_trainer;

/* Upload m's weights and the host's RoPE tables (rope_cos, rope_sin:
 * [max_T][head_dim/2], ac_rope_tables) and allocate gradients, moments,
 * activations for batch max_B x context max_T. m may be resident (BF16/F16
 * matrices): each tensor goes up in its file dtype and is widened to fp32 on
 * the device (ac_cuda_conv_int.h), exactly; the host holds no fp32 copy. */
int acc_trainer_create(int dev, const ac_model *m, int max_B, int max_T, const float *rope_cos, const float *rope_sin,
                       acc_trainer **out, char *err, size_t errn);
/* Forward tokens[B*T] from position 0, loss (as ac_loss_backward: targets
 * < 0 not scored, may be NULL; teacher logits [B*T][V] on the host or NULL;
 * kd_weight; scale), backward accumulating into the device gradients. */
int acc_trainer_grad(acc_trainer *t, const int *tokens, const int *targets, const float *teacher, int B, int T,
                     float tau, float kd_weight, float scale, double *loss, char *err, size_t errn);
/* One AdamW update at learning rate lr (update number step, 0-based) from
 * the accumulated gradients, clipped to global norm clip (<= 0: none), as
 * ac_adamw_step; then the gradients are zeroed. *gnorm gets the norm. */
int acc_trainer_step(acc_trainer *t, float lr, float beta1, float beta2, float eps, float weight_decay, float clip,
                     long step, double *gnorm, char *err, size_t errn);
/* Copy weights into w and/or gradients into g (either may be NULL; same arch
 * as at create, fp32, allocated by the caller). */
int acc_trainer_download(acc_trainer *t, ac_model *w, ac_model *g, char *err, size_t errn);
/* Set the gates from g (NULL: leave them) and/or copy their accumulated
 * gradients into dg (NULL: skip; both in train.h's ac_gates layout, caller's
 * buffers); zero_grad clears the device's gate gradients afterwards. */
int acc_trainer_gates(acc_trainer *t, const ac_gates *g, ac_gates *dg, int zero_grad, char *err, size_t errn);
/* Forward only (the current gates), logits [B*T][V] copied into logits. */
int acc_trainer_forward(acc_trainer *t, const int *tokens, int B, int T, float *logits, char *err, size_t errn);
/* One tensor of layer `layer` (which: ac_cuda.h's ACC_T_*; n its element
 * count): upload weights from w and/or copy its gradient into grad (either
 * may be NULL). */
int acc_trainer_tensor(acc_trainer *t, int layer, int which, const float *w, float *grad, size_t n, char *err,
                       size_t errn);
/* Zero every weight gradient (acc_trainer_step does it after an update). */
int acc_trainer_zero_grad(acc_trainer *t, char *err, size_t errn);
int acc_op_test(int dev, const ac_arch *a, const ac_op *op, int B, int T, const float *rope_cos, const float *rope_sin,
                acc_op_io *io, char *err, size_t errn);
void acc_trainer_free(acc_trainer *t);

#ifdef __cplusplus
}
#endif

#endif
