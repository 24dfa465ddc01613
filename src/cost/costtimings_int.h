/*
 * costtimings_int.h - a measured cost table from the CUDA plugin's raw timings
 * (acc_timings, src/cuda/ac_cuda.h): the plugin only times its micro-
 * benchmarks, this layer owns the table (implemented in costmeasure.c).
 */
#ifndef AC_COSTTIMINGS_H
#define AC_COSTTIMINGS_H

#include "cost/costmodel.h"
#include "cuda/ac_cuda.h"
#include "core/err.h"

/* Checks the grids (2..ACC_TM_MAXG points per axis, 1.. head dims) and that
 * every point is positive and finite; t gets the device's identity (key
 * "cuda:<name>|bf16|cublas|v<AC_CT_VERSION>"), grids and timings. */
int ac_cost_table_from_timings(const acc_timings *tm, ac_cost_table *t, ac_err *e);

#endif
