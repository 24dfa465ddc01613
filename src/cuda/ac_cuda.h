/*
 * ac_cuda.h - the CUDA backend's C interface (built as the plugin
 * build/libac_cuda.so when nvcc is found; loaded at run time by
 * src/runtime/cuda_plugin.c, so the CPU binaries never need CUDA libraries).
 *
 * Engine: the same forward as src/runtime/engine.c (RMSNorm, RoPE, GQA attention
 * with a KV cache, SwiGLU; nemotron_h's Mamba-2 mixer with its conv and SSM
 * state per sequence, and squared-ReLU MLP: ac_cuda_ssm_int.h) with BF16
 * weights and KV cache, cuBLAS GEMMs with
 * FP32 accumulation (cublasGemmEx, CUBLAS_COMPUTE_32F), FP32 residual
 * stream, Mamba state and logits. All device memory is allocated once at
 * create. nemotron_h's MoE layers (the sigmoid router with its correction
 * bias and routed scale on the host, as the softmax routers; squared-ReLU
 * experts, the shared expert, LatentMoE's projections) run too.
 * Micro-benchmarks: GEMM and attention timed with CUDA events (cold weights
 * rotated through a pool larger than L2), returned as raw timings
 * (acc_timings, a plain struct): src/cost/costmeasure.c builds the
 * ac_cost_table from them, so this ABI does not depend on costmodel.h.
 * The plugin exports two symbols: acc_abi_version (ACC_ABI_VERSION it was
 * built with; the loader refuses any other) and acc_api, the table of its
 * functions.
 *
 * Weights cross the ABI in their file dtype (ac_model.wdt: ST_F32, or ST_BF16
 * / ST_F16 for a resident model): each tensor's raw bytes are copied to the device as they
 * are and converted there (k_to_bf16 for the engine's BF16 weights,
 * kt_to_f32 for the trainer's fp32 ones), so the host never holds a
 * converted copy of a tensor, let alone of the model.
 */
#ifndef AC_CUDA_H
#define AC_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "runtime/block.h"
#include "core/dtype.h"
#include "format/model.h"
#include "runtime/train.h"

typedef struct acc_engine acc_engine;

/* Bumped whenever ac_cuda_api, acc_timings or the ac_model fields the plugin
 * reads change. 2: weights in their file dtype (engine_update's dtype,
 * convert).  4: op_test. 6: ac_arch/ac_layer_arch/ac_layer_w gained the hybrid (Mamba-2) fields. 7: ac_arch and ac_layer_w
 * gained nemotron_h's MoE fields (sigmoid router, correction bias, shared expert). */
#define ACC_ABI_VERSION 7

/* Raw micro-benchmark timings of one device (measure_timings): the grids
 * the plugin chose and the median microseconds at each point. */
#define ACC_TM_MAXG 16
typedef struct {
    char name[128]; /* device name (cudaDeviceProp.name) */
    int sms, cc;    /* multiprocessors, compute capability major*10+minor */
    double mem_gib; /* device memory */
    int nm, nn, nk; /* GEMM grid: y[m,n] = x[m,k] w[n,k]^T, BF16 in, FP32 accumulate */
    double gm[ACC_TM_MAXG], gn[ACC_TM_MAXG], gk[ACC_TM_MAXG];
    double gemm_us[ACC_TM_MAXG * ACC_TM_MAXG * ACC_TM_MAXG]; /* [nm][nn][nk], weights cold */
    int nhd, naq, nas;                                       /* attention grid: head_dim, query rows, context */
    double ahd[ACC_TM_MAXG], aq[ACC_TM_MAXG], as[ACC_TM_MAXG];
    double attn_us[ACC_TM_MAXG * ACC_TM_MAXG * ACC_TM_MAXG]; /* [nhd][naq][nas], one head, one sequence */
    double launch_us;                                        /* an empty kernel's launch */
    double elem_ns;                                          /* per element of an RMSNorm pass */
} acc_timings;

/* The trainer's per-layer tensors (trainer_tensor's which). */
enum {
    ACC_T_IN,
    ACC_T_Q,
    ACC_T_K,
    ACC_T_V,
    ACC_T_O,
    ACC_T_BQ,
    ACC_T_BK,
    ACC_T_BV,
    ACC_T_POST,
    ACC_T_G,
    ACC_T_U,
    ACC_T_D,
    ACC_T_QN, /* q_norm [head_dim] (qk_norm archs; 0 elements otherwise) */
    ACC_T_KN, /* k_norm */
    ACC_T_N
};
typedef struct acc_trainer acc_trainer;

/* op_test's host buffers, N = B*T rows each of its slot's width. */
typedef struct {
    const float *x[AC_T_COUNT]; /* the slots the op reads (a residual add and SwiGLU also read their output's) */
    float *y;                   /* its output (a residual add: x[X] with the add; ROPE: the rotated input) */
    const float *dy;            /* the output's gradient */
    float *dx[AC_T_COUNT];      /* the gradients of the slots it reads (RMSNORM: added to dx[X]) */
    const float *w, *b;         /* LINEAR: W [dout][din] and its bias (NULL: none); RMSNORM: its weight [H];
                                 * HEAD_NORM: its weight [head_dim] (its input's gradient is written, in place) */
    const float *gate, *gh;     /* MASK: a gate per unit; the hidden gates [H] (NULL: all 1) */
    float alpha;                /* a residual add's scale */
    float *dw, *db, *dgate, *dgh, *dalpha; /* added to (NULL: not wanted) */
} acc_op_io;

/* The plugin's ABI, written once: the table acc_api() returns. Every
 * function returns 0 or -1 with a message in err (errn bytes). */
typedef struct {
    int (*device_count)(void);
    int (*device_info)(int dev, char *name, size_t n, double *mem_gib, int *sms, int *cc);
    /* rope_cos/rope_sin: the host's RoPE tables, [max_ctx][head_dim/2]
     * (ac_rope_tables), so both backends rotate by the same numbers. m's
     * matrices in any of F32/BF16/F16 (above); on the device they are BF16. */
    int (*engine_create)(int dev, const ac_model *m, int max_batch, int max_ctx, const float *rope_cos,
                         const float *rope_sin, acc_engine **out, char *err, size_t errn);
    /* Same contract as ac_engine_forward; logits copied to host (B*n or B rows of V). */
    int (*engine_forward)(acc_engine *en, const int *tokens, int B, int n, int pos0, int last_only, float *logits,
                          char *err, size_t errn);
    /* Forward over all B*n positions, then cross-entropy on the device:
     * nll[i] = -log softmax(logits[i])[targets[i]] for row i = b*n + t, 0
     * where targets[i] < 0. Only B*n floats come back to the host. */
    int (*engine_nll)(acc_engine *en, const int *tokens, const int *targets, int B, int n, int pos0, float *nll,
                      char *err, size_t errn);
    /* Re-upload one weight matrix of a layer (which: ac_wmat) from the host
     * after the caller changed it: n elements of dtype (ST_F32, ST_BF16,
     * ST_F16; n must be the matrix's element count). */
    int (*engine_update)(acc_engine *en, int layer, int which, const void *w, int dtype, size_t n, char *err,
                         size_t errn);
    void (*engine_free)(acc_engine *en);
    /* Time one BF16 GEMM (FP32 accumulate): y[m,n] = x[m,k] w[n,k]^T, median microseconds. */
    int (*time_gemm)(int dev, int m, int n, int k, double *us, char *err, size_t errn);
    /* Time the cost model's micro-benchmarks on device dev (raw points;
     * ac_cost_table_from_timings builds the table). */
    int (*measure_timings)(int dev, acc_timings *t, char *err, size_t errn);
    /* Training (ac_cuda_train_int.h, whose acc_trainer_* functions these are):
     * the training pass of train.c and the AdamW step of optim.c on the
     * device, for distillation on a local GPU. rope_cos/rope_sin as for
     * engine_create ([max_T][head_dim/2]); m's matrices in any of
     * F32/BF16/F16, fp32 on the device. */
    int (*trainer_create)(int dev, const ac_model *m, int max_B, int max_T, const float *rope_cos,
                          const float *rope_sin, acc_trainer **out, char *err, size_t errn);
    int (*trainer_grad)(acc_trainer *t, const int *tokens, const int *targets, const float *teacher, int B, int T,
                        float tau, float kd_weight, float scale, double *loss, char *err, size_t errn);
    int (*trainer_step)(acc_trainer *t, float lr, float beta1, float beta2, float eps, float weight_decay, float clip,
                        long step, double *gnorm, char *err, size_t errn);
    int (*trainer_download)(acc_trainer *t, ac_model *w, ac_model *g, char *err, size_t errn);
    int (*trainer_gates)(acc_trainer *t, const ac_gates *g, ac_gates *dg, int zero_grad, char *err, size_t errn);
    void (*trainer_free)(acc_trainer *t);
    /* Gate search on the device (src/search/dnas.c): forward only with the
     * logits to the host; one layer tensor's weights up / gradient down
     * (which: ACC_T_*); zero the weight gradients. */
    int (*trainer_forward)(acc_trainer *t, const int *tokens, int B, int T, float *logits, char *err, size_t errn);
    int (*trainer_tensor)(acc_trainer *t, int layer, int which, const float *w, float *grad, size_t n, char *err,
                          size_t errn);
    int (*trainer_zero_grad)(acc_trainer *t, char *err, size_t errn);
    /* The upload's device conversion on its own (tests): n elements of
     * src_dt (ST_F32/ST_BF16/ST_F16) to the device, converted there into
     * dst_dt (ST_BF16: the engine's weights, ST_F32: the trainer's), back
     * into dst. */
    int (*convert)(int dev, void *dst, int dst_dt, const void *src, int src_dt, size_t n, char *err, size_t errn);
    /* One op of a block recipe alone on the device through the CUDA
     * trainer's op kernels (fp32), forward then backward, on host buffers
     * (tests/test_block.c checks every op against the CPU's): widths from
     * layer 0 of a (its sliding window and eps too), B sequences of T
     * tokens from position 0, RoPE tables [T][head_dim/2]. */
    int (*op_test)(int dev, const ac_arch *a, const ac_op *op, int B, int T, const float *rope_cos,
                   const float *rope_sin, acc_op_io *io, char *err, size_t errn);
} ac_cuda_api;

/* The plugin's exported entry points. */
int acc_abi_version(void);
const ac_cuda_api *acc_api(void);

#ifdef __cplusplus
}
#endif

#endif
