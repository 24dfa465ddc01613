/*
 * cuda_plugin.h - finds and loads the CUDA backend plugin (libac_cuda.so,
 * built from src/cuda when nvcc is present) with dlopen, so the library and
 * its binaries run unchanged on machines without CUDA. ac_cuda() returns
 * NULL when the plugin, the driver or a device is missing; *why says which.
 * Search order: $AC_CUDA_PLUGIN, the executable's directory and its parent,
 * the loader path.
 */
#ifndef AC_CUDA_PLUGIN_H
#define AC_CUDA_PLUGIN_H

#include <stddef.h>

#include "costmodel.h"
#include "model.h"
#include "train.h"

typedef struct acc_engine acc_engine;
typedef struct acc_trainer acc_trainer;

typedef struct {
    int (*device_count)(void);
    int (*device_info)(int dev, char *name, size_t n, double *mem_gib, int *sms, int *cc);
    int (*engine_create)(int dev, const ac_model *m, int max_batch, int max_ctx, acc_engine **out, char *err, size_t errn);
    int (*engine_forward)(acc_engine *en, const int *tokens, int B, int n, int pos0, int last_only, float *logits, char *err, size_t errn);
    int (*engine_nll)(acc_engine *en, const int *tokens, const int *targets, int B, int n, int pos0, float *nll, char *err, size_t errn);
    int (*engine_update)(acc_engine *en, int layer, int which, const float *w, size_t n, char *err, size_t errn);
    void (*engine_free)(acc_engine *en);
    int (*time_gemm)(int dev, int m, int n, int k, double *us, char *err, size_t errn);
    int (*measure_table)(int dev, ac_cost_table *t, char *err, size_t errn);
    /* training (src/cuda/ac_cuda_train.h); NULL when the plugin predates it */
    int (*trainer_create)(int dev, const ac_model *m, int max_B, int max_T, acc_trainer **out, char *err, size_t errn);
    int (*trainer_grad)(acc_trainer *t, const int *tokens, const int *targets, const float *teacher, int B, int T, float tau, float kd_weight,
                        float scale, double *loss, char *err, size_t errn);
    int (*trainer_step)(acc_trainer *t, float lr, float beta1, float beta2, float eps, float weight_decay, float clip, long step, double *gnorm,
                        char *err, size_t errn);
    int (*trainer_download)(acc_trainer *t, ac_model *w, ac_model *g, char *err, size_t errn);
    int (*trainer_gates)(acc_trainer *t, const ac_gates *g, ac_gates *dg, int zero_grad, char *err, size_t errn);
    void (*trainer_free)(acc_trainer *t);
} ac_cuda_api;

const ac_cuda_api *ac_cuda(const char **why);

#endif
