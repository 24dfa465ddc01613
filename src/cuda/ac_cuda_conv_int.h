/*
 * ac_cuda_conv_int.h - the plugin's weight upload in the file dtype (internal to
 * src/cuda; defined in ac_cuda.cu, used by ac_cuda_train.cu too). A tensor's
 * raw host bytes (ST_F32, ST_BF16 or ST_F16, as the checkpoint stores them)
 * go to the device unchanged and a kernel converts them there: the host
 * never allocates a converted copy. The conversions are the host's
 * (src/core/tensor.c) bit for bit: BF16/F16 to fp32 exact (F16 subnormals,
 * infinities and NaN payloads kept), fp32 to BF16 round-to-nearest-even
 * with NaN made quiet (payload kept).
 */
#ifndef AC_CUDA_CONV_H
#define AC_CUDA_CONV_H

#include <stddef.h>

#include "cuda/ac_cuda.h"

/* The dtype (safetensors.h's st_dtype) of m's embed, lm_head and layer
 * matrices; norms and biases are always fp32. */
int acc_model_dt(const ac_model *m);

/* n elements of dtype dt at host src into the device's fp32 dst. BF16/F16
 * are copied into stage first (device memory of at least 2n bytes, e.g. the
 * tensor's gradient buffer, which the caller clears afterwards). */
int acc_put_f32(float *dst, const void *src, int dt, size_t n, void *stage, char *err, size_t errn);
/* n elements of dtype dt at host src into the device's BF16 dst (2n bytes):
 * BF16 copied as it is, F16 copied into dst and converted in place, F32 in
 * chunks of stage_n through the device buffer stage. */
int acc_put_bf16(void *dst, const void *src, int dt, size_t n, float *stage, size_t stage_n, char *err, size_t errn);

#endif
