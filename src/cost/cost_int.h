/*
 * cost_int.h - what the cost model's files share among themselves
 * (costtable.c, costroofline.c, costpredict.c) and nobody else calls.
 */
#ifndef AC_COST_INTERNAL_H
#define AC_COST_INTERNAL_H

#include "cost/costmodel.h"

/* GEMM of (m x k) by (k x n): warm = weights in cache (the warm grid when the table has one). */
double ac_cost_gemm_lookup(const ac_cost_table *t, double m, double n, double k, int warm);
/* An elementwise pass over `elements` values of act_bytes each. */
double ac_cost_elem_us(const ac_cost_table *t, double elements, int act_bytes);

/* The roofline answers of a table made by ac_cost_roofline (costroofline.c). */
double ac_roofline_gemm_us(const ac_cost_table *t, double m, double n, double k);
/* The same at a compute peak of peak_tflops (TFLOP/s) instead of the table's. */
double ac_roofline_gemm_peak_us(const ac_cost_table *t, double m, double n, double k, double peak_tflops);
double ac_roofline_attn_us(const ac_cost_table *t, double heads, double kv_heads, double batch, double nq, double s,
                           int head_dim);
/* The same with the KV cache in kv_bytes per element (an FP8 KV cache under BF16 weights). */
double ac_roofline_attn_kv_us(const ac_cost_table *t, double heads, double kv_heads, double batch, double nq, double s,
                              int head_dim, double kv_bytes);
/* Attention through any table: a roofline table reads the KV cache in
 * kv_bytes per element, a measured one as it was measured. */
double ac_cost_attn_kv_us(const ac_cost_table *t, double heads, double kv_heads, double batch, double nq, double s,
                          int head_dim, int kv_bytes);
double ac_roofline_elem_us(const ac_cost_table *t, double elements, int act_bytes);

#endif
