/*
 * distill.h - knowledge distillation of a pruned student from its unpruned
 * teacher on the CPU: the teacher runs forward only (ac_engine), the student
 * trains on tau^2 KL(teacher || student) of temperature-scaled logits,
 * optionally mixed with next-token cross-entropy, with AdamW (optim.h) on
 * its fp32 weights, updated in place. Also the body of the job's distill
 * stage (job.c fills the options from the spec section "distill"), run between
 * prune and evaluate for every arm it reports.
 *
 * Memory of one distillation (ac_distill_mem_bytes, docs/architecture.md):
 *   student weights + gradients + 2 Adam moments   4 x 4 bytes x P_student
 *   student activations (ac_trainer_bytes)          per layer 4 x N x (2H + 2Q + 2KV + 2F + 2)
 *                                                   + 4 x (2 N V + N (6H + 2Qmax + 2KVmax + 3Fmax) + 2 T^2)
 *   teacher weights + forward buffers               4 x P_teacher + ac_engine (N (3H + ...) + N V + KV cache)
 * with N = batch x seq_len rows.
 *
 * With opts.cuda both run on CUDA device 0 through the plugin (the teacher on
 * its BF16 inference engine, the student on src/cuda/ac_cuda_train.cu in
 * fp32); the student's weights come back to the host at the end.
 */
#ifndef AC_DISTILL_H
#define AC_DISTILL_H

#include <jansson.h>
#include <stddef.h>

#include "core/err.h"
#include "runtime/eval.h"
#include "format/model.h"

#define AC_DISTILL_MAX_TOKENS 1000000000L /* the cap on distill.tokens (a 400 above it) */

typedef struct {
    long tokens; /* budget: student tokens trained on (batch x seq_len per step); 0 = off */
    int seq_len, batch;
    float lr, min_lr; /* peak, final (cosine) */
    int warmup;       /* steps; < 0 = 5 % of the steps */
    float weight_decay, clip;
    float temperature;
    float ce_weight; /* loss = (1 - ce_weight) KL + ce_weight CE */
    unsigned long long seed;
    double mem_limit; /* bytes allowed; 0 = this host's available memory (the GPU's with cuda) */
    int cuda;         /* 1: teacher forward and student training on CUDA device 0 (the plugin) */
} ac_distill_opts;

typedef struct {
    long tokens;
    int steps;
    double seconds;
    double loss_first, loss_last; /* mean loss of the first and of the last 5 % of steps (at least one) */
} ac_distill_result;

/* Called after each step: step (1-based) of steps, its loss, learning rate.
 * Return nonzero to stop (cancellation). */
typedef int (*ac_distill_cb)(void *ud, int step, int steps, double loss, double lr);

void ac_distill_defaults(ac_distill_opts *o);
/* Bytes the distillation needs (formula above). */
double ac_distill_mem_bytes(const ac_arch *teacher, const ac_arch *student, int batch, int seq_len);
/* Distil student (updated in place) from teacher on token ids[n]: windows of
 * seq_len tokens drawn at seeded random offsets. Errors: vocabularies
 * differ, text shorter than one batch, memory over the limit. */
int ac_distill(const ac_model *teacher, ac_model *student, const int *ids, size_t n, const ac_distill_opts *o,
               ac_distill_cb cb, void *ud, ac_distill_result *r, ac_err *e);

/* The job's distill stage (job.c calls it when o->tokens > 0; nothing is
 * done otherwise): for each arm i, measures its held-out perplexity (po on
 * hids) as "perplexity_pruned", distils it in place from teacher with o on
 * the token ids of the file `text` (tokenized with model_dir's tokenizer;
 * NULL or "": cids[nc]), emitting "distill" events {arm, step, steps, loss,
 * lr}; a BF16 arm (the job's students, ac_prune_bf16) is trained on an
 * fp32 copy of itself (fp32 master weights for AdamW; the BF16 one freed
 * first) and rounded back to BF16 in place when trained.
 * *out = {arm name: {"perplexity_pruned": x, "distill": {tokens,
 * steps, seconds, loss_first, loss_last, lr, seq_len, batch, temperature}}},
 * which report.c merges into the report's arm objects. */
int ac_distill_job(const ac_distill_opts *o, const char *model_dir, const char *text, const ac_model *teacher,
                   const int *cids, size_t nc, ac_model *const *arms, const char *const *names, int narms,
                   const int *hids, size_t nh, const ac_ppl_opts *po,
                   void (*emit)(void *ud, const char *kind, json_t *data), void *ud, volatile int *cancelled,
                   json_t **out, ac_err *e);

#endif
