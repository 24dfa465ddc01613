/*
 * backward_cpu.h - the fp32 CPU backward kernels, one per forward op of
 * kernels_cpu.h (llm.c's layout: a forward/backward pair over flat row-major
 * buffers, the shapes in the comment). Every backward ACCUMULATES (+=) into
 * its parameter gradients, so micro-batches add up; activation gradients are
 * accumulated too where noted (residual stream), else overwritten.
 * GEMMs go through cblas; the rest is plain C loops.
 */
#ifndef AC_BACKWARD_CPU_H
#define AC_BACKWARD_CPU_H

/* Backward of Y[N,out] = alpha * X[N,in] W[out,in]^T (+ b[out]).
 * dX[N,in] (+)= alpha * dY W   (accumulate when acc_dx, else overwrite; dX may be NULL)
 * dW[out,in] += alpha * dY^T X;  db[out] += alpha * sum_rows dY  (db may be NULL). */
void ac_linear_backward(float *dX, float *dW, float *db, const float *dY, const float *X, const float *W, int N, int in,
                        int out, float alpha, int acc_dx);

/* dX[N,in] (+)= alpha dY[N,out] W[out,in] with W stored in wdt (dtype.h):
 * one sgemm for fp32, else per tile of wtile_rows rows converted into
 * wtile (wtile_rows * in floats, the caller's) for 16-bit weights read in
 * place. */
void ac_linear_dx_w(float *dX, const float *dY, const void *W, int wdt, int N, int in, int out, float alpha, int acc_dx,
                    float *wtile, int wtile_rows);

/* RMSNorm with per-channel gates gh[H] (NULL: all 1) that average over the
 * gate mass, so gates in {0,1} are exactly the norm of the kept channels:
 *   r[N] = rsqrt(S/G + eps), S = sum_c gh_c x_c^2, G = sum_c gh_c;
 *   xhat[N,H] = x * r;  y = xhat * w * gh.
 * With every gate 1 this is the plain RMSNorm bit for bit (G == H).
 * Forward: writes xhat and r (kept for backward) and y. */
void ac_rmsnorm_fwd(float *y, float *xhat, float *r, const float *x, const float *w, const float *gh, int N, int H,
                    float eps);
/* Backward, with dxh = dy*w*gh, dot = sum_c dxh_c xhat_c, m = sum_c gh_c xhat_c^2 / G:
 * dw[H] += sum dy*xhat*gh  (when dw: NULL for frozen weights);  dx[N,H] += r * (dxh - gh * xhat * dot / G);
 * dgh[H] += sum dy*xhat*w - dot/(2G) * (xhat^2 - m)   (when dgh). */
void ac_rmsnorm_backward(float *dx, float *dw, float *dgh, const float *dy, const float *xhat, const float *r,
                         const float *w, const float *gh, int N, int H);
/* RMSNorm of each of `rows` vectors of width n (a head of q or k, Qwen3's
 * q_norm / k_norm) with one weight w[n]: y = x * r * w, r = 1/sqrt(mean x^2 + eps).
 * Backward from x itself (r and xhat recomputed), with dxh = dy*w:
 * dx = r * (dxh - xhat * sum(dxh xhat) / n), written (not added; dx may be
 * dy, in place); dw[n] += sum dy * xhat when dw. */
void ac_head_norm_backward(float *dx, float *dw, const float *dy, const float *x, const float *w, long rows, int n,
                           float eps);

/* Backward of rotate-half RoPE (ac_rope): the inverse (transposed) rotation
 * applied in place to dx[N, nh*hd]. */
void ac_rope_backward(float *dx, int N, int nh, int hd, const int *pos, const float *cos_t, const float *sin_t);

/* Backward of h = silu(g) * u: dg[i] = dh*u*silu'(g), du[i] = dh*silu(g)
 * (overwrite; dg may alias dh). */
void ac_silu_mul_backward(float *dg, float *du, const float *dh, const float *g, const float *u, long n);

/* Backward of ac_attention_head at pos0 = 0 over one sequence (n rows):
 * recomputes the probabilities P from q and k (nothing of n*n is kept
 * between forward and backward), then
 *   dv += P^T dout, dP = dout v^T, dS = P * (dP - rowsum(dP*P)),
 *   dq = scale dS k (overwrite), dk += scale dS^T q.
 * Strides as in the forward (q, dq, dout: q_stride; k, v, dk, dv: kv_stride).
 * scratch: 2*n*n floats. */
void ac_attention_head_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                                const float *v, int n, int hd, int q_stride, int kv_stride, int window, float *scratch);

/* Row losses on logits z[N,V] (fp32), gradient into dz[N,V] (overwrite):
 *   CE over rows with target[r] >= 0:  mean_r -log softmax(z_r)[target_r]
 *   KD over rows with teacher (tz != NULL, all rows):
 *     tau^2 * mean_r sum_v pT (log pT - log pS), p = softmax(z / tau)
 *   loss = kd_weight * KD + (1 - kd_weight) * CE   (kd_weight 0 without teacher)
 * dz = scale * d loss / dz. Returns the loss (double); *ce and *kd (may be
 * NULL) get the two parts. */
double ac_loss_backward(float *dz, const float *z, const int *target, const float *tz, int N, int V, float tau,
                        float kd_weight, float scale, double *ce, double *kd);

#endif
