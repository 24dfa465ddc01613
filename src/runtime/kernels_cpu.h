/*
 * kernels_cpu.h - the fp32 CPU kernels the engine is made of. Shapes are in
 * the comment of each; buffers are row-major and owned by the caller.
 * GEMMs go through cblas (OpenBLAS); the rest is plain C loops.
 */
#ifndef AC_KERNELS_CPU_H
#define AC_KERNELS_CPU_H

/* Y[N,out] = X[N,in] W[out,in]^T (+ b[out] when b != NULL). */
void ac_linear(float *Y, const float *X, const float *W, const float *b, int N, int in, int out);
/* Y[N,out] += X[N,in] W[out,in]^T  (residual add fused into the GEMM). */
void ac_linear_acc(float *Y, const float *X, const float *W, int N, int in, int out);
/* out[N,H] = x * rsqrt(mean(x^2) + eps) * w, row by row. out may alias x. */
void ac_rmsnorm(float *out, const float *x, const float *w, int N, int H, float eps);
/* Rotate-half RoPE on rows of nh heads of dim hd, positions pos[r] per row;
 * cos/sin tables are [max_pos][hd/2]. x is [N, nh*hd]. */
void ac_rope(float *x, int N, int nh, int hd, const int *pos, const float *cos_t, const float *sin_t);
/* g[i] = silu(g[i]) * u[i]. */
void ac_silu_mul(float *g, const float *u, long n);
/* In-place softmax of a row of n values. */
void ac_softmax(float *x, int n);
/* Causal attention of one query head over one sequence's cache.
 * q: n rows (stride q_stride), k/v: S = pos0+n rows (stride kv_stride) of hd
 * values; query row t sees keys 0..pos0+t, or only the last `window` of
 * them when window > 0 (sliding-window attention). out: n rows (stride
 * q_stride). scores: scratch of n*S floats. */
void ac_attention_head(float *out, const float *q, const float *k, const float *v, int n, int pos0, int hd, int q_stride,
                       int kv_stride, int window, float *scores);
/* Inverse frequencies for head_dim hd with optional llama3 scaling. */
void ac_rope_inv_freq(float *inv, int hd, float theta, int llama3, float factor, float lo, float hi, int orig);
/* Set the number of threads the CPU kernels (OpenBLAS) use. */
void ac_set_threads(int n);

#endif
