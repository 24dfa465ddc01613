/*
 * tensor.h - number formats and the fp32 conversion of stored weights.
 *
 * The engine computes in fp32; checkpoints store F32, F16 or BF16. This
 * module owns the conversions (round-to-nearest-even for fp32 -> bf16/fp16)
 * and nothing else.
 */
#ifndef AC_TENSOR_H
#define AC_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/err.h"

float ac_bf16_to_f32(uint16_t h);
uint16_t ac_f32_to_bf16(float f);
float ac_f16_to_f32(uint16_t h);
uint16_t ac_f32_to_f16(float f);

/* Convert n elements of stored dtype src into fp32 dst. */
int ac_to_f32(float *dst, const void *src, st_dtype dt, size_t n, ac_err *e);
/* Convert n fp32 values into dtype dt (F32, F16, BF16). */
int ac_from_f32(void *dst, const float *src, st_dtype dt, size_t n, ac_err *e);
/* Convert n values between any two of F32, F16, BF16 (through fp32). */
int ac_convert(void *dst, st_dtype dd, const void *src, st_dtype sd, size_t n, ac_err *e);

#endif
