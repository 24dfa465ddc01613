// ac_cuda_train.cu - see ac_cuda_train_int.h. Shapes as in src/runtime/train.c: N = B*T
// rows, H hidden, hd head_dim, Q/KV/F the current layer's widths, V vocab.
// Row-major buffers throughout; gemm() maps row-major products onto
// cuBLAS's column-major contract. Kernels are simple (a block per row or per
// (row, head)) and correct first; the GEMMs carry the cost.
#include "ac_cuda_train_int.h"
#include "runtime/block.h"

#include "ac_cuda_conv_int.h"
#include "ac_cuda_ssm_int.h"

#ifdef AC_CUDA_EMU
#include "cuda_emu.h"
#else
#include <cublas_v2.h>
#include <cuda_runtime.h>
#define AC_LAUNCH(k, grid, block, shm, stream, ...) k<<<(grid), (block), (shm), (stream)>>>(__VA_ARGS__)
#define AC_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

#include "ac_cuda_reduce_int.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define TCK(x)                                                                                                         \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            snprintf(err, errn, "%s:%d: %s: %s", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                      \
            return -1;                                                                                                 \
        }                                                                                                              \
    } while (0)
#define TCB(x)                                                                                                         \
    do {                                                                                                               \
        cublasStatus_t s_ = (x);                                                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                             \
            snprintf(err, errn, "%s:%d: %s: cuBLAS status %d", __FILE__, __LINE__, #x, (int)s_);                       \
            return -1;                                                                                                 \
        }                                                                                                              \
    } while (0)

// Threads per block of the row kernels (a multiple of 32; the kernels loop
// with stride blockDim.x, and head_dim may be up to 4 * TB). The tests build
// the CPU emulation with 64: half the emulated threads, two warps still
// reduced through shared memory, and rows of the tiny model's 128 wide
// hidden state looped over twice.
#ifndef AC_TRAIN_TB
#define AC_TRAIN_TB 128
#endif
#define TB AC_TRAIN_TB

// ---------------------------------------------------------------- kernels

static __device__ float tr_max(float v) {
    __shared__ float red[32];
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = -INFINITY;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) r = fmaxf(r, red[i]);
    __syncthreads();
    return r;
}

__global__ void kt_embed(float *x, const float *emb, const int *tok, int H) {
    int r = blockIdx.x;
    for (int i = threadIdx.x; i < H; i += blockDim.x) x[(size_t)r * H + i] = emb[(size_t)tok[r] * H + i];
}

// y = xhat * w * gh with xhat = x * r, r = rsqrt(S/G + eps), S = sum gh x^2, G = sum gh
// (the gated norm of backward_cpu.h: gates {0,1} are the norm of the kept channels); one block per row
__global__ void kt_rmsnorm(float *y, float *xhat, float *rr, const float *x, const float *w, const float *gh, int H,
                           float eps) {
    int r = blockIdx.x;
    const float *xr = x + (size_t)r * H;
    float ss = 0, gs = 0;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        ss += gh[i] * xr[i] * xr[i];
        gs += gh[i];
    }
    ss = acc_block_sum(ss);
    gs = acc_block_sum(gs);
    float s = rsqrtf((gs > 0 ? ss / gs : 0.0f) + eps);
    if (threadIdx.x == 0) rr[r] = s;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        xhat[(size_t)r * H + i] = xr[i] * s;
        y[(size_t)r * H + i] = xr[i] * s * w[i] * gh[i];
    }
}

// Each hd-wide row (a head of q or k) RMS-normed times w[hd] (Qwen3's
// q_norm / k_norm): y = x * r * w, r = rsqrt(mean x^2 + eps); one block per row.
__global__ void kt_head_norm(float *y, const float *x, const float *w, int hd, float eps) {
    const float *xr = x + (size_t)blockIdx.x * hd;
    float ss = 0;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) ss += xr[i] * xr[i];
    float r = rsqrtf(acc_block_sum(ss) / hd + eps);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) y[(size_t)blockIdx.x * hd + i] = xr[i] * r * w[i];
}

// Its backward from x: dx = r * (dy*w - xhat * sum(dy w xhat) / hd), written
// (dx may be dy: each thread reads its own elements before writing them);
// prod = dy * xhat (for dw).
__global__ void kt_head_norm_bwd(float *dx, float *prod, const float *dy, const float *x, const float *w, int hd,
                                 float eps) {
    size_t o = (size_t)blockIdx.x * hd;
    float ss = 0;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) ss += x[o + i] * x[o + i];
    float r = rsqrtf(acc_block_sum(ss) / hd + eps), dot = 0;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) dot += dy[o + i] * w[i] * x[o + i] * r;
    float mean = acc_block_sum(dot) / hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float xh = x[o + i] * r, d = dy[o + i];
        prod[o + i] = d * xh;
        dx[o + i] = r * (d * w[i] - xh * mean);
    }
}

__global__ void kt_scale_cols(float *y, const float *xhat, const float *w, const float *gh, int H) {
    int r = blockIdx.x;
    for (int i = threadIdx.x; i < H; i += blockDim.x) y[(size_t)r * H + i] = xhat[(size_t)r * H + i] * w[i] * gh[i];
}

// dxh = dy * w * gh, dot = sum dxh * xhat, G = sum gh, m = sum gh xhat^2 / G:
// dx += r * (dxh - gh * xhat * dot / G); prod = dy * xhat * gh (for dw),
// prod2 = dy * xhat * w - dot / (2G) * (xhat^2 - m) (for dgh)
__global__ void kt_rmsnorm_bwd(float *dx, float *prod, float *prod2, const float *dy, const float *xhat,
                               const float *rr, const float *w, const float *gh, int H) {
    int r = blockIdx.x;
    const float *d = dy + (size_t)r * H, *xh = xhat + (size_t)r * H;
    float dot = 0, ms = 0, gs = 0;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        dot += d[i] * w[i] * gh[i] * xh[i];
        ms += gh[i] * xh[i] * xh[i];
        gs += gh[i];
    }
    dot = acc_block_sum(dot);
    ms = acc_block_sum(ms);
    gs = acc_block_sum(gs);
    float ig = gs > 0 ? 1.0f / gs : 0.0f, mean = dot * ig, m = ms * ig, k = 0.5f * dot * ig;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        prod[(size_t)r * H + i] = d[i] * xh[i] * gh[i];
        prod2[(size_t)r * H + i] = d[i] * xh[i] * w[i] - k * (xh[i] * xh[i] - m);
        dx[(size_t)r * H + i] += rr[r] * (d[i] * w[i] * gh[i] - gh[i] * xh[i] * mean);
    }
}

// y[i] = x[i] * g[(i % C) / wpg]: per-channel (wpg 1) or per-head (wpg hd) gates
__global__ void kt_gate_cols(float *y, const float *x, const float *g, int C, int wpg, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * g[(i % C) / wpg];
}

__global__ void kt_mul(float *y, const float *a, const float *b, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] * b[i];
}

// out[c] += sum over rows of in[r*C + c]
__global__ void kt_colsum(float *out, const float *in, int rows, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0;
    for (int r = 0; r < rows; r++) s += in[(size_t)r * C + c];
    out[c] += s;
}

// dg[k] += sum of csum over unit k (wpg columns each). One block.
__global__ void kt_unit_reduce(float *dg, const float *csum, int C, int wpg) {
    for (int k = threadIdx.x; k < C / wpg; k += blockDim.x) {
        float q = 0;
        for (int c = k * wpg; c < (k + 1) * wpg; c++) q += csum[c];
        dg[k] += q;
    }
}

// The Mamba gates' gradients from csum [nh * P] (each channel's d loss / d m,
// m = hg[h] pg[p]): dh[h] += sum_p csum[h P + p] pg[p], dp[p] += sum_h
// csum[h P + p] hg[h]. One block.
__global__ void kt_ssm_gate_reduce(float *dh, float *dp, const float *csum, const float *hg, const float *pg, int nh,
                                   int P) {
    for (int h = threadIdx.x; h < nh; h += blockDim.x) {
        float q = 0;
        for (int p = 0; p < P; p++) q += csum[h * P + p] * pg[p];
        dh[h] += q;
    }
    for (int p = threadIdx.x; p < P; p += blockDim.x) {
        float q = 0;
        for (int h = 0; h < nh; h++) q += csum[h * P + p] * hg[h];
        dp[p] += q;
    }
}

// *out += sum of in[0..n). One block.
__global__ void kt_sum_acc(float *out, const float *in, int n) {
    float part = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) part += in[i];
    part = acc_block_sum(part);
    if (threadIdx.x == 0) *out += part;
}

__global__ void kt_scale(float *y, float s, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] *= s;
}

__global__ void kt_add_bias(float *y, const float *b, int C, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += b[i % C];
}

// rotate-half RoPE (inv = 0) or its transpose (inv = 1) on [N, nh*hd], pos = r % T
__global__ void kt_rope(float *x, int nh, int hd, int T, const float *cs, const float *sn, int inv) {
    int r = blockIdx.x, half = hd / 2, pos = r % T;
    for (int idx = threadIdx.x; idx < nh * half; idx += blockDim.x) {
        int h = idx / half, i = idx % half;
        float *v = x + (size_t)r * nh * hd + (size_t)h * hd;
        float c = cs[(size_t)pos * half + i], s = sn[(size_t)pos * half + i], a = v[i], b = v[i + half];
        v[i] = inv ? a * c + b * s : a * c - b * s;
        v[i + half] = inv ? b * c - a * s : b * c + a * s;
    }
}

// Query rows t of sequence b see keys [first, t]; first = t - window + 1 with a window.
static __device__ int first_key(int t, int window) { return window > 0 && t + 1 > window ? t + 1 - window : 0; }

// One block per (row r = b*T + t, head h): p = softmax(scale q k^T) over the
// visible keys (shared memory [T]), o = p v, lse = log-sum-exp of the row.
__global__ void kt_attn_fwd(float *o, float *lse, const float *q, const float *k, const float *v, int nh, int nkv,
                            int hd, int T, float scale, int window) {
    AC_DYNAMIC_SHARED(float, p);
    int r = blockIdx.x, h = blockIdx.y, b = r / T, t = r % T, kh = h / (nh / nkv), Q = nh * hd, KV = nkv * hd,
        f = first_key(t, window);
    const float *qr = q + (size_t)r * Q + (size_t)h * hd;
    float mx = -INFINITY;
    for (int j = f + threadIdx.x; j <= t; j += blockDim.x) {
        const float *kr = k + ((size_t)b * T + j) * KV + (size_t)kh * hd;
        float d = 0;
        for (int i = 0; i < hd; i++) d += qr[i] * kr[i];
        p[j] = d * scale;
        mx = fmaxf(mx, p[j]);
    }
    mx = tr_max(mx);
    float sum = 0;
    for (int j = f + threadIdx.x; j <= t; j += blockDim.x) {
        p[j] = expf(p[j] - mx);
        sum += p[j];
    }
    sum = acc_block_sum(sum); // its barriers also publish p
    if (threadIdx.x == 0) lse[(size_t)r * nh + h] = mx + logf(sum);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float acc = 0;
        for (int j = f; j <= t; j++) acc += p[j] * v[((size_t)b * T + j) * KV + (size_t)kh * hd + i];
        o[(size_t)r * Q + (size_t)h * hd + i] = acc / sum;
    }
}

// Backward, query side, one block per (row, head): p_j = exp(s_j - lse),
// dp_j = do . v_j, delta = sum p dp, ds_j = p_j (dp_j - delta),
// dq = scale sum_j ds_j k_j. delta is kept for the key side.
__global__ void kt_attn_bwd_q(float *dq, float *delta, const float *dout, const float *q, const float *k,
                              const float *v, const float *lse, int nh, int nkv, int hd, int T, float scale,
                              int window) {
    AC_DYNAMIC_SHARED(float, ds);
    int r = blockIdx.x, h = blockIdx.y, b = r / T, t = r % T, kh = h / (nh / nkv), Q = nh * hd, KV = nkv * hd,
        f = first_key(t, window);
    const float *qr = q + (size_t)r * Q + (size_t)h * hd, *dr = dout + (size_t)r * Q + (size_t)h * hd;
    float l = lse[(size_t)r * nh + h], part = 0;
    for (int j = f + threadIdx.x; j <= t; j += blockDim.x) {
        const float *kr = k + ((size_t)b * T + j) * KV + (size_t)kh * hd,
                    *vr = v + ((size_t)b * T + j) * KV + (size_t)kh * hd;
        float s = 0, dp = 0;
        for (int i = 0; i < hd; i++) {
            s += qr[i] * kr[i];
            dp += dr[i] * vr[i];
        }
        float pj = expf(s * scale - l);
        ds[j] = pj;
        ds[T + j] = dp;
        part += pj * dp;
    }
    float dl = acc_block_sum(part);
    if (threadIdx.x == 0) delta[(size_t)r * nh + h] = dl;
    for (int j = f + threadIdx.x; j <= t; j += blockDim.x) ds[j] = ds[j] * (ds[T + j] - dl);
    __syncthreads();
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float acc = 0;
        for (int j = f; j <= t; j++) acc += ds[j] * k[((size_t)b * T + j) * KV + (size_t)kh * hd + i];
        dq[(size_t)r * Q + (size_t)h * hd + i] = scale * acc;
    }
}

// Backward, key side, one block per (key row b*T + j, KV head): over the
// group's query heads and the query rows t that see key j,
// dk_j = scale sum ds_tj q_t, dv_j = sum p_tj do_t (written, not added).
__global__ void kt_attn_bwd_kv(float *dk, float *dv, const float *dout, const float *q, const float *k, const float *v,
                               const float *lse, const float *delta, int nh, int nkv, int hd, int T, float scale,
                               int window) {
    AC_DYNAMIC_SHARED(float, sm);
    int rj = blockIdx.x, kh = blockIdx.y, b = rj / T, j = rj % T, grp = nh / nkv, Q = nh * hd, KV = nkv * hd;
    int last = window > 0 && j + window < T ? j + window : T; // rows t in [j, last) see key j
    float *pp = sm, *dsp = sm + T;
    const float *kr = k + (size_t)rj * KV + (size_t)kh * hd, *vr = v + (size_t)rj * KV + (size_t)kh * hd;
    float acck[4] = {0, 0, 0, 0}, accv[4] = {0, 0, 0, 0}; // hd <= 4 * TB
    for (int h = kh * grp; h < (kh + 1) * grp; h++) {
        for (int t = j + threadIdx.x; t < last; t += blockDim.x) {
            size_t rt = (size_t)b * T + t;
            const float *qt = q + rt * Q + (size_t)h * hd, *dt = dout + rt * Q + (size_t)h * hd;
            float s = 0, dp = 0;
            for (int i = 0; i < hd; i++) {
                s += qt[i] * kr[i];
                dp += dt[i] * vr[i];
            }
            float p = expf(s * scale - lse[rt * nh + h]);
            pp[t] = p;
            dsp[t] = p * (dp - delta[rt * nh + h]);
        }
        __syncthreads();
        for (int i = threadIdx.x, c = 0; i < hd; i += blockDim.x, c++)
            for (int t = j; t < last; t++) {
                size_t rt = (size_t)b * T + t;
                acck[c] += dsp[t] * q[rt * Q + (size_t)h * hd + i];
                accv[c] += pp[t] * dout[rt * Q + (size_t)h * hd + i];
            }
        __syncthreads();
    }
    for (int i = threadIdx.x, c = 0; i < hd; i += blockDim.x, c++) {
        dk[(size_t)rj * KV + (size_t)kh * hd + i] = scale * acck[c];
        dv[(size_t)rj * KV + (size_t)kh * hd + i] = accv[c];
    }
}

__global__ void kt_silu_mul(float *h, const float *g, const float *u, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) h[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

// MoE: dst[j] = src[rows[j]] ([H] rows), one block per row.
__global__ void kt_gather(float *dst, const float *src, const int *rows, int H) {
    for (int c = threadIdx.x; c < H; c += blockDim.x) dst[(size_t)blockIdx.x * H + c] = src[(size_t)rows[blockIdx.x] * H + c];
}

// MoE: x[rows[j]] += alpha * w[j] * y[j] (w NULL: 1; rows distinct within a launch), one block per row.
__global__ void kt_scatter_add(float *x, const float *y, const int *rows, const float *w, float alpha, int H) {
    float f = alpha * (w ? w[blockIdx.x] : 1.0f);
    for (int c = threadIdx.x; c < H; c += blockDim.x) x[(size_t)rows[blockIdx.x] * H + c] += f * y[(size_t)blockIdx.x * H + c];
}

// MoE backward of x[rows[j]] += alpha w[j] y[j] for expert e, one block per
// row j: dr[rows[j]][e] = alpha <dx[rows[j]], y[j]>, dot[j] = w[j] <dx, y[j]>
// (the sub-block gate's part), then y[j] becomes dy = alpha w[j] dx[rows[j]].
__global__ void kt_moe_dy(float *y, float *dr, float *dot, const float *dx, const int *rows, const float *w,
                          float alpha, int e, int E, int H) {
    size_t row = (size_t)rows[blockIdx.x];
    float *yj = y + (size_t)blockIdx.x * H;
    const float *d = dx + row * H;
    float s = 0;
    for (int c = threadIdx.x; c < H; c += blockDim.x) s += d[c] * yj[c];
    s = acc_block_sum(s);
    if (threadIdx.x == 0) {
        dr[row * E + e] = alpha * s;
        dot[blockIdx.x] = w[blockIdx.x] * s;
    }
    for (int c = threadIdx.x; c < H; c += blockDim.x) yj[c] = alpha * w[blockIdx.x] * d[c];
}

// dg = dh u silu'(g) (in place over dh), du = dh silu(g)
__global__ void kt_silu_mul_bwd(float *dh, float *du, const float *g, const float *u, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float sg = 1.0f / (1.0f + expf(-g[i])), d = dh[i];
    du[i] = d * g[i] * sg;
    dh[i] = d * u[i] * sg * (1.0f + g[i] * (1.0f - sg));
}

// One block per row: CE (target >= 0) and tau^2 KL(teacher || student), their
// gradient into dz (fce, fkd: the factors of ac_loss_backward), row losses
// into rl[2r], rl[2r+1].
__global__ void kt_loss(float *dz, float *rl, const float *z, const int *tgt, const float *tz, int V, float tau,
                        float fce, float fkd) {
    int r = blockIdx.x, tg = tgt ? tgt[r] : -1;
    const float *zr = z + (size_t)r * V;
    float *d = dz + (size_t)r * V;
    float mx = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, zr[v]);
    mx = tr_max(mx);
    float s = 0;
    for (int v = threadIdx.x; v < V; v += blockDim.x) s += expf(zr[v] - mx);
    float ls = logf(acc_block_sum(s)) + mx;
    for (int v = threadIdx.x; v < V; v += blockDim.x) d[v] = tg >= 0 ? fce * (expf(zr[v] - ls) - (v == tg)) : 0.0f;
    if (threadIdx.x == 0) {
        rl[2 * r] = tg >= 0 ? ls - zr[tg] : 0.0f;
        rl[2 * r + 1] = 0;
    }
    if (!tz) return;
    const float *tr = tz + (size_t)r * V;
    float ms = -INFINITY, mt = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        ms = fmaxf(ms, zr[v] / tau);
        mt = fmaxf(mt, tr[v] / tau);
    }
    ms = tr_max(ms);
    mt = tr_max(mt);
    float ss = 0, st = 0;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        ss += expf(zr[v] / tau - ms);
        st += expf(tr[v] / tau - mt);
    }
    float lss = logf(acc_block_sum(ss)) + ms, lst = logf(acc_block_sum(st)) + mt, kl = 0;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float lps = zr[v] / tau - lss, lpt = tr[v] / tau - lst, pt = expf(lpt);
        kl += pt * (lpt - lps);
        d[v] += fkd * (expf(lps) - pt);
    }
    kl = acc_block_sum(kl);
    if (threadIdx.x == 0) rl[2 * r + 1] = tau * tau * kl;
}

// Embedding backward over tokens grouped on the host: block u adds the dx
// rows rows[off[u] .. off[u+1]) into the embedding row of token uniq[u].
__global__ void kt_embed_bwd(float *ge, const float *dx, const int *uniq, const int *off, const int *rows, int H) {
    int u = blockIdx.x;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        float s = 0;
        for (int k = off[u]; k < off[u + 1]; k++) s += dx[(size_t)rows[k] * H + i];
        ge[(size_t)uniq[u] * H + i] += s;
    }
}

// part[blockIdx] = sum of squares of its slice
__global__ void kt_sumsq(float *part, const float *g, size_t n) {
    float s = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        s += g[i] * g[i];
    s = acc_block_sum(s);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// torch.optim.AdamW's update, operation by operation (optim.c's order)
__global__ void kt_adamw(float *p, float *g, float *m, float *v, size_t n, float coef, float wd, float b1, float b2,
                         float step_size, float bc2s, float eps) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float gi = g[i] * coef;
    p[i] *= wd;
    m[i] = m[i] * b1 + (1.0f - b1) * gi;
    v[i] = v[i] * b2 + (1.0f - b2) * gi * gi;
    p[i] -= step_size * m[i] / (sqrtf(v[i]) / bc2s + eps);
    g[i] = 0;
}

// ---------------------------------------------------------------- trainer

// A layer's parameter tensors by name: ac_cuda.h's ACC_T_* (what the
// library reads and writes through acc_trainer_tensor), then the Mamba-2
// mixer's (in_proj, out_proj, the gated norm's weight, the conv's weight and
// bias, dt_bias, A_log, D), which have no ACC_T_ name, and the MoE ones
// (LatentMoE's down and up projections among them).
// T_EXPERTS: the index of expert 0's gate matrix; expert e's gate, up and
// down matrices follow at 3e, 3e+1, 3e+2 (host_tensors).
enum {
    T_SSM_IN = ACC_T_N,
    T_SSM_OUT,
    T_SSM_NORM,
    T_CONV_W,
    T_CONV_B,
    T_DT_BIAS,
    T_A_LOG,
    T_SSM_D,
    T_SH_U, // nemotron_h MoE: the shared expert's up and down projections
    T_SH_D,
    T_LAT_D, // LatentMoE: fc1_latent_proj [LT][H] (into the latent) and fc2_latent_proj [H][LT] (back)
    T_LAT_U,
    T_ROUTER,
    T_EXPERTS,
    T_NAMES
};

// The arch fields the trainer needs (the plugin does not link the library,
// so no ac_arch_copy / ac_arch_free here).
struct tarch {
    int n_layers, hidden, head_dim, vocab, sliding_window, tie_embeddings, qk_norm, top_k, norm_topk;
    int hybrid, ssm_head_dim, ssm_state, ssm_groups, ssm_conv; // nemotron_h's Mamba-2 shapes
    int router_sigmoid, shared_ffn;                            // nemotron_h's MoE: the sigmoid router, shared expert
    int moe_latent;                                            // LatentMoE's latent width (0: plain MoE)
    float eps, routed_scale;
    std::vector<ac_layer_arch> layers;
};

struct acc_trainer {
    tarch a;
    int max_B, max_T, nt; // nt parameter tensors
    cublasHandle_t blas;
    // parameter tensor i: device weights, gradients, moments; host size; decay
    std::vector<float *> p, g, m, v;
    std::vector<size_t> n;
    std::vector<int> decay;
    std::vector<int> tix; // [n_layers][T_NAMES]: the tensor index of each layer's named tensor, -1 none
    int head_idx;              // index of the LM head tensor (== embed's when tied)
    std::vector<float *> bufs; // every other device allocation, freed at the end
    // per layer: what the block recipe's backward needs, kept by its forward
    // (tape_floats: the costly ops' outputs, each norm's xhat and 1/rms,
    // each attention's log-sum-exp)
    std::vector<float *> tape;
    float *bscr; // the recomputed cheap outputs of one sub-block, then one gradient buffer per slot
    float *xhf, *rf, *logits, *dlogits, *teacher, *rowloss, *x, *dx, *xn, *dxn, *delta, *prod, *part, *cos_t, *sin_t;
    int *tok, *tgt, *csr; // csr: uniq [N], off [N+1], rows [N]
    std::vector<int> host_csr;
    int ntok_uniq;
    // gates (train.h's meaning) and their gradients, one device buffer each:
    // hidden [H], attn [L], mlp [L], then per layer head [n_heads], ffn [F]
    // (MoE layers: then expert [E], expert channels [E * Fe]; Mamba layers:
    // ssm [ssm_heads], ssm_dim [ssm_head_dim]; nemotron_h's MoE layers:
    // shared [shared_ffn], LatentMoE's latent [moe_latent])
    float *gates, *dgates, *csum, *prod2;
    float *prodg; // (hybrids) the gated norm's per-channel gate gradients [N][di]
    std::vector<size_t> off_head, off_ffn, off_exp, off_echan, off_ssm, off_pd, off_sh, off_lt;
    size_t ngates;
    std::vector<float> s_attn, s_mlp; // host copies of the sub-block gates (GEMM alphas)
    // MoE: the expert gates on the host too (the routing runs there, as the
    // engine's: block.h's ac_moe_route_gated and its backward), host copies
    // of one layer's logits / weights, softmax, gradient, and the rows
    // routed to each expert (concatenated, with their weights) on the device
    std::vector<float> hz, hr, hp, hd, hdz, hw;
    std::vector<int> horder, hrows, hoff;
    int *mrows;
    float *mw, *mdot, *mdz;
    float *ssm_work; // Mamba-2: the scan's state and backward work (acc_ssm_scan_work_floats, the largest layer's)
    std::vector<std::vector<float>> rbias; // nemotron_h MoE: each layer's router correction bias (host; not trained)
};

static int wi(const acc_trainer *t, int l, int w) { return t->tix[(size_t)l * T_NAMES + w]; } // -1: none
static float *GH(const acc_trainer *t) { return t->gates; }
static float *P(const acc_trainer *t, int l, int w) { return wi(t, l, w) >= 0 ? t->p[wi(t, l, w)] : NULL; }
static float *G(const acc_trainer *t, int l, int w) { return wi(t, l, w) >= 0 ? t->g[wi(t, l, w)] : NULL; }
// Layer l's Mamba-2 mixer on the device weights.
static acc_ssm tssm(const acc_trainer *t, int l) {
    const tarch *a = &t->a;
    acc_ssm s = {a->layers[l].ssm_heads, a->ssm_head_dim,  a->ssm_state,   a->ssm_groups,
                 a->ssm_conv,            P(t, l, T_CONV_W), P(t, l, T_CONV_B), P(t, l, T_DT_BIAS),
                 P(t, l, T_A_LOG),       P(t, l, T_SSM_D),  P(t, l, T_SSM_NORM), a->eps, NULL, NULL};
    return s;
}

static float *gate_of(const acc_trainer *t, int l, int d);
static float *dgate_of(const acc_trainer *t, int l, int d);

// The recipe's weight names (block.h) as the trainer's tensor names.
static int tw_mat(int w) {
    static const int m[] = {ACC_T_Q,   ACC_T_K,   ACC_T_V,   ACC_T_O, ACC_T_G, ACC_T_U,
                            ACC_T_D,   T_SSM_IN,  T_SSM_OUT, T_SH_U,  T_SH_D,  T_LAT_D, T_LAT_U};
    return w >= 0 && w < (int)(sizeof m / sizeof *m) ? m[w] : -1;
}
static int tw_bias(int w) { return w == AC_W_Q ? ACC_T_BQ : w == AC_W_K ? ACC_T_BK : w == AC_W_V ? ACC_T_BV : -1; }
static int tw_norm(int w) {
    return w == AC_NORM_IN     ? ACC_T_IN
           : w == AC_NORM_POST ? ACC_T_POST
           : w == AC_NORM_Q    ? ACC_T_QN
           : w == AC_NORM_K    ? ACC_T_KN
           : w == AC_NORM_SSM  ? T_SSM_NORM
                               : -1;
}

// Host pointers of m's tensors in the trainer's order, with sizes, decay and
// stored dtype (matrices: m's file dtype, or fp32; norms and biases fp32):
// the embedding, the LM head, the final norm, then each layer's tensors as
// its block recipe (block.h) names them, in the order its ops use them:
// each LINEAR's matrix and bias (n 0 where the layer has none), each norm's
// weight, once each. tix (may be NULL) receives each layer's index of every
// named tensor ([n_layers][T_NAMES], -1 where the recipe has none).
static void host_tensors(const ac_model *m, std::vector<const void *> &hp, std::vector<size_t> &n,
                         std::vector<int> &decay, std::vector<int> &dt, std::vector<int> *tix) {
    const ac_arch *a = &m->a;
    size_t H = a->hidden, hd = a->head_dim, V = a->vocab;
    int d32 = ST_F32, t = acc_model_dt(m);
    auto add = [&](const void *p, size_t c, int d, int ty) {
        hp.push_back(p);
        n.push_back(p ? c : 0);
        decay.push_back(d);
        dt.push_back(ty);
    };
    add(m->embed, V * H, 1, t);
    add(a->tie_embeddings ? NULL : m->lm_head, V * H, 1, t);
    add(m->final_norm, H, 0, d32);
    std::vector<int> ix((size_t)a->n_layers * T_NAMES, -1);
    for (int l = 0; l < a->n_layers; l++) {
        const ac_block_recipe *r = ac_block_recipe_of(a, l);
        const ac_layer_w *w = &m->L[l];
        int *li = &ix[(size_t)l * T_NAMES];
        auto name = [&](int id, const void *p, size_t c, int d, int ty) {
            if (id < 0 || li[id] >= 0) return; // no name, or already listed
            li[id] = (int)hp.size();
            add(p, c, d, ty);
        };
        for (int s = 0; s < r->n_sub; s++)
            for (int i = 0; i < r->sub[s].n_ops; i++) {
                const ac_op *op = &r->sub[s].ops[i];
                size_t din = (size_t)ac_block_dim(a, l, (ac_dim)op->din), dout = (size_t)ac_block_dim(a, l, (ac_dim)op->dout);
                if (op->kind == AC_OP_LINEAR) {
                    name(tw_mat(op->w), ac_block_matrix(w, op->w), dout * din, 1, t);
                    name(tw_bias(op->w), ac_block_bias(w, op->w), dout, 0, d32);
                } else if (op->kind == AC_OP_RMSNORM)
                    name(tw_norm(op->w), ac_block_norm(w, op->w), H, 0, d32);
                else if (op->kind == AC_OP_HEAD_NORM)
                    name(tw_norm(op->w), ac_block_norm(w, op->w), hd, 0, d32);
                else if (op->kind == AC_OP_GATED_NORM)
                    name(T_SSM_NORM, w->ssm_norm, dout, 0, d32);
                else if (op->kind == AC_OP_SSM_CONV) { // the depthwise conv [C][K] (decayed, as optim.c) and its bias
                    name(T_CONV_W, w->conv_w, dout * a->ssm_conv, 1, d32);
                    name(T_CONV_B, w->conv_b, dout, 0, d32);
                } else if (op->kind == AC_OP_SSM_SCAN) { // per head
                    size_t nh = a->layers[l].ssm_heads;
                    name(T_DT_BIAS, w->dt_bias, nh, 0, d32);
                    name(T_A_LOG, w->a_log, nh, 0, d32);
                    name(T_SSM_D, w->ssm_d, nh, 0, d32);
                } else if (op->kind == AC_OP_ROUTE)
                    name(T_ROUTER, w->router, (size_t)a->layers[l].n_experts * H, 1, t);
                else if (op->kind == AC_OP_EXPERTS && li[T_EXPERTS] < 0) { // gate, up, down of each expert
                    size_t Fe = a->layers[l].expert_ffn;                     // (on din: H, or LatentMoE's LT)
                    li[T_EXPERTS] = (int)hp.size();
                    for (int e = 0; e < a->layers[l].n_experts; e++) {
                        add(w->eg ? w->eg[e] : NULL, Fe * din, 1, t);
                        add(w->eu ? w->eu[e] : NULL, Fe * din, 1, t);
                        add(w->ed ? w->ed[e] : NULL, din * Fe, 1, t);
                    }
                }
            }
    }
    if (tix) *tix = ix;
}

static int dalloc(acc_trainer *t, float **p, size_t n, char *err, size_t errn) {
    *p = NULL;
    if (!n) return 0;
    TCK(cudaMalloc(p, n * sizeof(float)));
    t->bufs.push_back(*p);
    return 0;
}

// Row-major C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C (ta/tb: transpose A/B).
static int gemm(acc_trainer *t, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                const float *B, int ldb, float beta, float *C, int ldc, char *err, size_t errn) {
    if (!M || !N || !K) return 0;
    TCB(cublasGemmEx(t->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B,
                     CUDA_R_32F, ldb, A, CUDA_R_32F, lda, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT));
    return 0;
}

static unsigned blocks(size_t n) { return (unsigned)((n + 255) / 256); }

extern "C" void acc_trainer_free(acc_trainer *t) {
    if (!t) return;
    for (float *b : t->bufs) cudaFree(b);
    for (int i = 0; i < t->nt; i++) {
        cudaFree(t->p[i]);
        cudaFree(t->g[i]);
        cudaFree(t->m[i]);
        cudaFree(t->v[i]);
    }
    cudaFree(t->tok);
    cudaFree(t->tgt);
    cudaFree(t->csr);
    cudaFree(t->mrows);
    if (t->blas) cublasDestroy(t->blas);
    delete t;
}

// ---------------------------------------------------------------- the block recipe

// The arch as block.h reads it (a view over the trainer's copy: the
// plugin does not link the library's arch code).
static ac_arch tview(const tarch *a) {
    ac_arch v;
    memset(&v, 0, sizeof v);
    v.n_layers = a->n_layers, v.hidden = a->hidden, v.head_dim = a->head_dim, v.vocab = a->vocab;
    v.qk_norm = a->qk_norm, v.top_k = a->top_k, v.norm_topk = a->norm_topk;
    v.hybrid = a->hybrid, v.ssm_head_dim = a->ssm_head_dim, v.ssm_state = a->ssm_state;
    v.ssm_groups = a->ssm_groups, v.ssm_conv = a->ssm_conv;
    v.router_sigmoid = a->router_sigmoid, v.shared_ffn = a->shared_ffn, v.routed_scale = a->routed_scale;
    v.moe_latent = a->moe_latent;
    v.layers = const_cast<ac_layer_arch *>(a->layers.data());
    return v;
}
static const ac_block_recipe *trecipe(const tarch *a, int l) {
    ac_arch v = tview(a);
    return ac_block_recipe_of(&v, l);
}
static int tdim(const tarch *a, int l, int d) {
    ac_arch v = tview(a);
    return ac_block_dim(&v, l, (ac_dim)d);
}
static bool tpresent(const tarch *a, int l, const ac_subblock *s) { return tdim(a, l, s->present) > 0; }
// Layer l's tape: block.h's rule, each attention also keeping its log-sum-exp per row and head.
static size_t tape_floats(const acc_trainer *t, int l, size_t N) {
    ac_arch v = tview(&t->a);
    return ac_block_tape_floats(&v, l, N, 1);
}
static size_t op_tape(const tarch *a, int l, const ac_op *op, size_t N) {
    ac_arch v = tview(a);
    return ac_block_op_tape(&v, l, op, N, 1);
}
static size_t scratch_floats(const acc_trainer *t, size_t N) {
    ac_arch v = tview(&t->a);
    return ac_block_scratch_floats(&v, N);
}
static int tdim_max(const tarch *a, int d) {
    ac_arch v = tview(a);
    return ac_block_dim_max(&v, (ac_dim)d);
}

// rope_cos/rope_sin: the host tables (src/runtime/rope.c), [max_T][head_dim/2], as the inference engine gets them.
static int create(acc_trainer *t, const ac_model *mdl, const float *rope_cos, const float *rope_sin, char *err,
                  size_t errn) {
    const tarch *a = &t->a;
    size_t N = (size_t)t->max_B * t->max_T, H = a->hidden, hd = a->head_dim, V = a->vocab, T = t->max_T, mq = 1, mf = 1;
    std::vector<const void *> hp;
    std::vector<int> dt;
    host_tensors(mdl, hp, t->n, t->decay, dt, &t->tix);
    t->nt = (int)hp.size();
    t->p.assign(t->nt, NULL), t->g.assign(t->nt, NULL), t->m.assign(t->nt, NULL), t->v.assign(t->nt, NULL);
    for (int i = 0; i < t->nt; i++) {
        if (!t->n[i]) continue;
        size_t b = t->n[i] * sizeof(float);
        TCK(cudaMalloc(&t->p[i], b));
        TCK(cudaMalloc(&t->g[i], b));
        TCK(cudaMalloc(&t->m[i], b));
        TCK(cudaMalloc(&t->v[i], b));
        // BF16/F16 weights: raw into the gradient buffer, converted from there (then zeroed)
        if (acc_put_f32(t->p[i], hp[i], dt[i], t->n[i], t->g[i], err, errn)) return -1;
        TCK(cudaMemset(t->g[i], 0, b));
        TCK(cudaMemset(t->m[i], 0, b));
        TCK(cudaMemset(t->v[i], 0, b));
    }
    t->head_idx = a->tie_embeddings ? 0 : 1;
    t->rbias.assign(a->n_layers, std::vector<float>());
    for (int l = 0; l < a->n_layers; l++) // the sigmoid router's correction bias: only its choice reads it (host)
        if (mdl->L[l].router_bias) t->rbias[l].assign(mdl->L[l].router_bias, mdl->L[l].router_bias + a->layers[l].n_experts);
    t->tape.assign(a->n_layers, NULL);
    for (int l = 0; l < a->n_layers; l++) {
        const ac_layer_arch *L = &a->layers[l];
        size_t Q = L->n_heads * hd, F = L->ffn;
        mq = std::max(mq, Q), mf = std::max(mf, std::max(F, (size_t)L->expert_ffn));
        if (hd > 4 * TB) {
            snprintf(err, errn, "head_dim %zu above %d", hd, 4 * TB);
            return -1;
        }
        if (dalloc(t, &t->tape[l], tape_floats(t, l, N), err, errn)) return -1;
    }
    size_t mw = std::max(std::max(H, mq), mf), sw = 0;
    if (a->hybrid) { // the gated norm's and the SSM mask's column sums (and the shared expert's); the scan's work
        mw = std::max(mw, (size_t)std::max(tdim_max(a, AC_DIM_SI), tdim_max(a, AC_DIM_FS)));
        for (int l = 0; l < a->n_layers; l++)
            if (a->layers[l].ssm_heads) {
                acc_ssm s = {};
                s.nh = a->layers[l].ssm_heads, s.P = a->ssm_head_dim, s.Ns = a->ssm_state, s.G = a->ssm_groups;
                sw = std::max(sw, acc_ssm_scan_work_floats(&s, t->max_B, t->max_T));
            }
    }
    if (dalloc(t, &t->xhf, N * H, err, errn) || dalloc(t, &t->rf, N, err, errn) ||
        dalloc(t, &t->logits, N * V, err, errn) || dalloc(t, &t->dlogits, N * V, err, errn) ||
        dalloc(t, &t->teacher, N * V, err, errn) || dalloc(t, &t->rowloss, 2 * N, err, errn) ||
        dalloc(t, &t->x, N * H, err, errn) || dalloc(t, &t->dx, N * H, err, errn) ||
        dalloc(t, &t->xn, N * H, err, errn) || dalloc(t, &t->dxn, N * H, err, errn) ||
        dalloc(t, &t->bscr, scratch_floats(t, N), err, errn) || dalloc(t, &t->delta, N * (mq / hd + 1), err, errn) ||
        dalloc(t, &t->prod, N * mw, err, errn) || dalloc(t, &t->part, 1024, err, errn) ||
        dalloc(t, &t->cos_t, T * hd / 2, err, errn) || dalloc(t, &t->sin_t, T * hd / 2, err, errn) ||
        dalloc(t, &t->ssm_work, sw, err, errn) || (a->hybrid && dalloc(t, &t->prodg, N * mw, err, errn)))
        return -1;
    {
        size_t L = a->n_layers, off = H + 2 * L;
        t->off_head.assign(L, 0), t->off_ffn.assign(L, 0), t->off_exp.assign(L, 0), t->off_echan.assign(L, 0);
        t->off_ssm.assign(L, 0), t->off_pd.assign(L, 0), t->off_sh.assign(L, 0), t->off_lt.assign(L, 0);
        for (size_t l = 0; l < L; l++) {
            t->off_head[l] = off, off += a->layers[l].n_heads;
            t->off_ffn[l] = off, off += a->layers[l].ffn;
            t->off_exp[l] = off, off += a->layers[l].n_experts;
            t->off_echan[l] = off, off += (size_t)a->layers[l].n_experts * a->layers[l].expert_ffn;
            t->off_ssm[l] = off, off += a->layers[l].ssm_heads;
            t->off_pd[l] = off, off += a->layers[l].ssm_heads ? a->ssm_head_dim : 0;
            t->off_sh[l] = off, off += tdim(a, (int)l, AC_DIM_FS);
            t->off_lt[l] = off, off += tdim(a, (int)l, AC_DIM_LT);
        }
        t->ngates = off;
        std::vector<float> ones(off, 1.0f);
        if (dalloc(t, &t->gates, off, err, errn) || dalloc(t, &t->dgates, off, err, errn) ||
            dalloc(t, &t->csum, mw, err, errn) || dalloc(t, &t->prod2, N * H, err, errn))
            return -1;
        TCK(cudaMemcpy(t->gates, ones.data(), off * sizeof(float), cudaMemcpyHostToDevice));
        TCK(cudaMemset(t->dgates, 0, off * sizeof(float)));
        t->s_attn.assign(L, 1.0f), t->s_mlp.assign(L, 1.0f);
        t->hz.assign(off, 1.0f); // (the expert gates' host copy, at the device offsets)
    }
    size_t E = (size_t)std::max(1, tdim_max(a, AC_DIM_E));
    if (tdim_max(a, AC_DIM_E) > 0) {
        t->hr.resize(N * E), t->hp.resize(N * E), t->hd.resize(N * E), t->hdz.resize(E), t->hw.resize(N * E);
        t->horder.resize(E), t->hrows.resize(N * E), t->hoff.resize(E + 1);
        TCK(cudaMalloc(&t->mrows, N * E * sizeof(int)));
        if (dalloc(t, &t->mw, N * E, err, errn) || dalloc(t, &t->mdot, N, err, errn) || dalloc(t, &t->mdz, E, err, errn))
            return -1;
    }
    TCK(cudaMalloc(&t->tok, N * sizeof(int)));
    TCK(cudaMalloc(&t->tgt, N * sizeof(int)));
    TCK(cudaMalloc(&t->csr, (3 * N + 1) * sizeof(int)));
    TCK(cudaMemcpy(t->cos_t, rope_cos, T * hd / 2 * sizeof(float), cudaMemcpyHostToDevice));
    TCK(cudaMemcpy(t->sin_t, rope_sin, T * hd / 2 * sizeof(float), cudaMemcpyHostToDevice));
    TCB(cublasCreate(&t->blas));
    return 0;
}

extern "C" int acc_trainer_create(int dev, const ac_model *m, int max_B, int max_T, const float *rope_cos,
                                  const float *rope_sin, acc_trainer **out, char *err, size_t errn) {
    *out = NULL;
    if (max_B <= 0 || max_T <= 0) {
        snprintf(err, errn, "trainer: batch and context must be positive");
        return -1;
    }
    if ((size_t)2 * max_T * sizeof(float) > 48 * 1024) {
        snprintf(err, errn, "trainer: context %d above the CUDA trainer's 6144", max_T);
        return -1;
    }
    if (m->a.hybrid && (m->a.ssm_conv < 1 || m->a.ssm_conv > ACC_SSM_MAX_K)) {
        snprintf(err, errn, "trainer: conv kernel %d: the CUDA Mamba-2 conv takes 1 to %d", m->a.ssm_conv,
                 ACC_SSM_MAX_K);
        return -1;
    }
    TCK(cudaSetDevice(dev));
    acc_trainer *t = new acc_trainer();
    const ac_arch *a = &m->a;
    t->a.n_layers = a->n_layers, t->a.hidden = a->hidden, t->a.head_dim = a->head_dim, t->a.vocab = a->vocab;
    t->a.sliding_window = a->sliding_window, t->a.tie_embeddings = a->tie_embeddings, t->a.eps = a->eps;
    t->a.qk_norm = a->qk_norm, t->a.top_k = a->top_k, t->a.norm_topk = a->norm_topk;
    t->a.hybrid = a->hybrid, t->a.ssm_head_dim = a->ssm_head_dim, t->a.ssm_state = a->ssm_state;
    t->a.ssm_groups = a->ssm_groups, t->a.ssm_conv = a->ssm_conv;
    t->a.router_sigmoid = a->router_sigmoid, t->a.shared_ffn = a->shared_ffn, t->a.routed_scale = a->routed_scale;
    t->a.moe_latent = a->hybrid ? a->moe_latent : 0;
    t->a.layers.assign(a->layers, a->layers + a->n_layers);
    t->max_B = max_B, t->max_T = max_T;
    if (create(t, m, rope_cos, rope_sin, err, errn)) {
        acc_trainer_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

// One op of a block recipe with everything it reads and writes resolved (by
// the walkers below, or by acc_op_test): the device kernels of each op kind.
struct top {
    const ac_op *op;
    int l, B, T, N, H, hd, nh, nkv, window, din, dout, heads; // l: the layer; heads: ROPE's head count
    int unit;                                                 // MASK: the channels per gate (block.h)
    float eps;
    const float *in, *in2, *in3, *pre; // the inputs as the op saw them; pre: SwiGLU's gate projection
    float *out;                        // the output (a residual add: the residual, added to)
    float *xhat, *r, *lse;             // the op's own tape (RMSNORM, ATTENTION; ROUTE: softmax, weights)
    const float *w, *b, *gate, *gh;    // weight (LINEAR) or norm weight (RMSNORM), bias, MASK gates, hidden gates
    float alpha;                       // a residual add's scale (the sub-block gate)
    float *dO, *dI, *dI2, *dI3;        // gradients of the output, of the inputs (written, or added to: acc_dI)
    bool acc_dI;
    float *gw, *gb, *dgate, *dgh, *dalpha; // parameter gradients, accumulated (NULL: not wanted)
};

// ---------------------------------------------------------------- mixture of experts
// block_grad.c's ROUTE and EXPERTS on the device: the router's logits and
// every expert's GEMMs there, the routing rule and its backward (a few
// floats per row) on the host, as the inference engine routes.

// The EXPERTS op's work area: the end of the scratch (block.h), for max_B x max_T rows.
static float *moe_work(acc_trainer *t) {
    ac_arch v = tview(&t->a);
    size_t N = (size_t)t->max_B * t->max_T;
    return t->bscr + scratch_floats(t, N) - ac_block_moe_work_floats(&v, N);
}

// The rows routed to each expert (r [N][E] on the device, != 0): their
// indices and weights concatenated, expert e's at t->hoff[e], on the host
// and uploaded to t->mrows, t->mw.
static int moe_rows(acc_trainer *t, const float *r, int N, int E, char *err, size_t errn) {
    TCK(cudaMemcpy(t->hr.data(), r, (size_t)N * E * sizeof(float), cudaMemcpyDeviceToHost));
    int n = 0;
    for (int e = 0; e < E; e++) {
        t->hoff[e] = n;
        for (int i = 0; i < N; i++)
            if (t->hr[(size_t)i * E + e] != 0) t->hrows[n] = i, t->hw[n] = t->hr[(size_t)i * E + e], n++;
    }
    t->hoff[E] = n;
    if (!n) return 0;
    TCK(cudaMemcpy(t->mrows, t->hrows.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    TCK(cudaMemcpy(t->mw, t->hw.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    return 0;
}

// r = route(xn Wr^T): the logits on the device, ac_moe_route_gated with the
// layer's expert gates on the host; the tape gets the softmax (o->xhat) and
// the weights (o->r).
static int route_fwd(acc_trainer *t, const top *o, char *err, size_t errn) {
    int N = o->N, E = o->dout, H = o->din;
    size_t n = (size_t)N * E;
    if (gemm(t, 0, 1, N, E, H, 1.0f, o->in, H, P(t, o->l, T_ROUTER), H, 0.0f, o->r, E, err, errn)) return -1;
    TCK(cudaMemcpy(t->hr.data(), o->r, n * sizeof(float), cudaMemcpyDeviceToHost));
    const float *z = t->hz.data() + t->off_exp[o->l];
    if (t->a.router_sigmoid) { // nemotron_h: p keeps the sigmoid of every logit (block_grad.c's rule)
        const std::vector<float> &bias = t->rbias[o->l];
        for (size_t j = 0; j < n; j++) t->hp[j] = (float)(1.0 / (1.0 + exp(-(double)t->hr[j])));
        ac_moe_route_sigmoid(t->hr.data(), bias.empty() ? NULL : bias.data(), z, N, E, t->a.top_k, t->a.norm_topk,
                             t->a.routed_scale, t->horder.data());
    } else
        ac_moe_route_gated(t->hr.data(), t->hp.data(), z, N, E, t->a.top_k, t->a.norm_topk, t->horder.data());
    TCK(cudaMemcpy(o->r, t->hr.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    TCK(cudaMemcpy(o->xhat, t->hp.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    return 0;
}

// The router's backward from o->dO = dr [N][E] (overwritten with the
// logits' gradient): the expert gates' gradient, dxn and dWr accumulated.
static int route_bwd(acc_trainer *t, const top *o, char *err, size_t errn) {
    int l = o->l, N = o->N, E = o->dout, H = o->din;
    size_t n = (size_t)N * E;
    TCK(cudaMemcpy(t->hd.data(), o->dO, n * sizeof(float), cudaMemcpyDeviceToHost));
    TCK(cudaMemcpy(t->hp.data(), o->xhat, n * sizeof(float), cudaMemcpyDeviceToHost));
    TCK(cudaMemcpy(t->hr.data(), o->r, n * sizeof(float), cudaMemcpyDeviceToHost));
    std::fill(t->hdz.begin(), t->hdz.end(), 0.0f);
    if (t->a.router_sigmoid)
        ac_moe_route_sigmoid_bwd(t->hd.data(), t->hp.data(), t->hr.data(), t->hz.data() + t->off_exp[l], t->hdz.data(),
                                 N, E, t->a.norm_topk, t->a.routed_scale);
    else
        ac_moe_route_gated_bwd(t->hd.data(), t->hp.data(), t->hr.data(), t->hz.data() + t->off_exp[l], t->hdz.data(),
                               N, E, t->a.norm_topk);
    TCK(cudaMemcpy(o->dO, t->hd.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    TCK(cudaMemcpy(t->mdz, t->hdz.data(), E * sizeof(float), cudaMemcpyHostToDevice));
    AC_LAUNCH(kt_colsum, blocks(E), 256, 0, 0, t->dgates + t->off_exp[l], t->mdz, 1, E);
    float *gr = G(t, l, T_ROUTER);
    if (gemm(t, 0, 0, N, H, E, 1.0f, o->dO, E, P(t, l, T_ROUTER), H, o->acc_dI ? 1.0f : 0.0f, o->dI, H, err, errn) ||
        (gr && gemm(t, 1, 0, E, H, N, 1.0f, o->dO, E, o->in, H, 1.0f, gr, H, err, errn)))
        return -1;
    return 0;
}

// Expert e of layer o->l on its rows (moe_rows): xe the gathered rows of
// o->in, g and u its gate and up projections, h = silu(g) * u, hg = h times
// the expert's channel gates (may be h itself), y = hg Wd^T.
static int expert_fwd(acc_trainer *t, const top *o, int e, float *xe, float *g, float *u, float *h, float *hg,
                      float *y, char *err, size_t errn) {
    int l = o->l, H = o->din, Fe = t->a.layers[l].expert_ffn, ne = t->hoff[e + 1] - t->hoff[e];
    int x0 = wi(t, l, T_EXPERTS) + 3 * e;
    size_t n = (size_t)ne * Fe;
    AC_LAUNCH(kt_gather, ne, TB, 0, 0, xe, o->in, t->mrows + t->hoff[e], H);
    if (gemm(t, 0, 1, ne, Fe, H, 1.0f, xe, H, t->p[x0 + 1], H, 0.0f, u, Fe, err, errn)) return -1;
    if (!t->p[x0]) // nemotron_h: no gate, relu(up)^2
        acc_relu2_fwd(h, NULL, u, n, 0);
    else {
        if (gemm(t, 0, 1, ne, Fe, H, 1.0f, xe, H, t->p[x0], H, 0.0f, g, Fe, err, errn)) return -1;
        AC_LAUNCH(kt_silu_mul, blocks(n), 256, 0, 0, h, g, u, n);
    }
    AC_LAUNCH(kt_gate_cols, blocks(n), 256, 0, 0, hg, h, t->gates + t->off_echan[l] + (size_t)e * Fe, Fe, 1, n);
    return gemm(t, 0, 1, ne, H, Fe, 1.0f, hg, Fe, t->p[x0 + 2], Fe, 0.0f, y, H, err, errn);
}

// x += alpha * sum_e r[:,e] * expert_e(xn) (o->out the residual, o->in xn,
// o->in2 r); LatentMoE (the op without acc): yl = sum_e r[:,e] *
// expert_e(xl) into its own slot o->out (alpha 1: the sub-block gate scales
// the up projection after it), H the latent width.
static int experts_fwd(acc_trainer *t, const top *o, char *err, size_t errn) {
    int N = o->N, E = t->a.layers[o->l].n_experts, H = o->din;
    size_t HM = t->a.hidden, FeM = tdim_max(&t->a, AC_DIM_FE);
    float *xe = moe_work(t), *y = xe + N * HM, *g = y + 2 * N * HM, *u = g + N * FeM, *h = u + N * FeM;
    if (!o->op->acc) TCK(cudaMemset(o->out, 0, (size_t)N * H * sizeof(float)));
    if (moe_rows(t, o->in2, N, E, err, errn)) return -1;
    for (int e = 0; e < E; e++) {
        int ne = t->hoff[e + 1] - t->hoff[e];
        if (!ne) continue;
        if (expert_fwd(t, o, e, xe, g, u, h, h, y, err, errn)) return -1;
        AC_LAUNCH(kt_scatter_add, ne, TB, 0, 0, o->out, y, t->mrows + t->hoff[e], t->mw + t->hoff[e], o->alpha, H);
    }
    return 0;
}

// Its backward (block_grad.c's experts_bwd): o->dO = dx; dxn into o->dI
// (added when acc_dI), dr into o->dI2 (written); every expert's weight
// gradients, its channel gates' and the sub-block gate's accumulated.
static int experts_bwd(acc_trainer *t, const top *o, char *err, size_t errn) {
    int l = o->l, N = o->N, E = t->a.layers[l].n_experts, H = o->din, Fe = t->a.layers[l].expert_ffn;
    size_t HM = t->a.hidden, FeM = tdim_max(&t->a, AC_DIM_FE);
    float *xe = moe_work(t), *y = xe + N * HM, *dxe = y + N * HM, *g = dxe + N * HM, *u = g + N * FeM,
          *h = u + N * FeM, *dh = h + N * FeM, *du = dh + N * FeM;
    if (!o->acc_dI) TCK(cudaMemset(o->dI, 0, (size_t)N * H * sizeof(float)));
    TCK(cudaMemset(o->dI2, 0, (size_t)N * E * sizeof(float)));
    if (moe_rows(t, o->in2, N, E, err, errn)) return -1;
    for (int e = 0; e < E; e++) {
        int ne = t->hoff[e + 1] - t->hoff[e], x0 = wi(t, l, T_EXPERTS) + 3 * e;
        if (!ne) continue;
        const int *rows = t->mrows + t->hoff[e];
        size_t n = (size_t)ne * Fe;
        if (expert_fwd(t, o, e, xe, g, u, h, dh, y, err, errn)) return -1; // h: the activation; dh: it gated
        AC_LAUNCH(kt_moe_dy, ne, TB, 0, 0, y, o->dI2, t->mdot, o->dO, rows, t->mw + t->hoff[e], o->alpha, e, E, H);
        if (o->dalpha) AC_LAUNCH(kt_sum_acc, 1, TB, 0, 0, o->dalpha, t->mdot, ne);
        if ((t->g[x0 + 2] && gemm(t, 1, 0, H, Fe, ne, 1.0f, y, H, dh, Fe, 1.0f, t->g[x0 + 2], Fe, err, errn)) ||
            gemm(t, 0, 0, ne, Fe, H, 1.0f, y, H, t->p[x0 + 2], Fe, 0.0f, dh, Fe, err, errn)) // dWd; dh = dy Wd
            return -1;
        AC_LAUNCH(kt_mul, blocks(n), 256, 0, 0, t->prod, dh, h, n); // the channel gates: d gate += sum dh * act
        AC_LAUNCH(kt_colsum, blocks(Fe), 256, 0, 0, t->dgates + t->off_echan[l] + (size_t)e * Fe, t->prod, ne, Fe);
        AC_LAUNCH(kt_gate_cols, blocks(n), 256, 0, 0, dh, dh, t->gates + t->off_echan[l] + (size_t)e * Fe, Fe, 1, n);
        bool gated = t->p[x0] != NULL; // (nemotron_h's experts: relu(up)^2, no gate)
        if (gated)
            AC_LAUNCH(kt_silu_mul_bwd, blocks(n), 256, 0, 0, dh, du, g, u, n); // dh becomes dg
        else
            acc_relu2_bwd(du, dh, u, n, 0);
        if ((gated && gemm(t, 0, 0, ne, H, Fe, 1.0f, dh, Fe, t->p[x0], H, 0.0f, dxe, H, err, errn)) ||
            gemm(t, 0, 0, ne, H, Fe, 1.0f, du, Fe, t->p[x0 + 1], H, gated ? 1.0f : 0.0f, dxe, H, err, errn) ||
            (t->g[x0] && gemm(t, 1, 0, Fe, H, ne, 1.0f, dh, Fe, xe, H, 1.0f, t->g[x0], H, err, errn)) ||
            (t->g[x0 + 1] && gemm(t, 1, 0, Fe, H, ne, 1.0f, du, Fe, xe, H, 1.0f, t->g[x0 + 1], H, err, errn)))
            return -1;
        AC_LAUNCH(kt_scatter_add, ne, TB, 0, 0, o->dI, dxe, rows, (const float *)NULL, 1.0f, H);
    }
    return 0;
}

// The forward of o->op; with recompute, only what a backward's replay needs:
// the cheap outputs again from the tape (the costly ones are on it).
static int op_fwd(acc_trainer *t, const top *o, bool recompute, char *err, size_t errn) {
    const ac_op *op = o->op;
    size_t n = (size_t)o->N * o->dout;
    switch ((ac_op_kind)op->kind) {
    case AC_OP_RMSNORM:
        if (recompute)
            AC_LAUNCH(kt_scale_cols, o->N, TB, 0, 0, o->out, o->xhat, o->w, o->gh, o->H);
        else
            AC_LAUNCH(kt_rmsnorm, o->N, TB, 0, 0, o->out, o->xhat, o->r, o->in, o->w, o->gh, o->H, o->eps);
        break;
    case AC_OP_LINEAR:
        if (recompute) break;
        if (gemm(t, 0, 1, o->N, o->dout, o->din, op->acc ? o->alpha : 1.0f, o->in, o->din, o->w, o->din,
                 op->acc ? 1.0f : 0.0f, o->out, o->dout, err, errn))
            return -1;
        if (o->b) AC_LAUNCH(kt_add_bias, blocks(n), 256, 0, 0, o->out, o->b, o->dout, n);
        break;
    case AC_OP_ROPE:
        if (!recompute) AC_LAUNCH(kt_rope, o->N, TB, 0, 0, o->out, o->heads, o->hd, o->T, t->cos_t, t->sin_t, 0);
        break;
    case AC_OP_HEAD_NORM:
        if (!recompute) AC_LAUNCH(kt_head_norm, o->N * o->heads, TB, 0, 0, o->out, o->in, o->w, o->hd, o->eps);
        break;
    case AC_OP_ATTENTION:
        if (!recompute)
            AC_LAUNCH(kt_attn_fwd, dim3(o->N, o->nh), TB, o->T * sizeof(float), 0, o->out, o->lse, o->in, o->in2,
                      o->in3, o->nh, o->nkv, o->hd, o->T, 1.0f / sqrtf((float)o->hd), o->window);
        break;
    case AC_OP_SWIGLU: AC_LAUNCH(kt_silu_mul, blocks(n), 256, 0, 0, o->out, o->pre, o->in, n); break;
    case AC_OP_MASK: // (a width the trainer has no gates for: passed through)
        if (!o->gate) TCK(cudaMemcpy(o->out, o->in, n * sizeof(float), cudaMemcpyDeviceToDevice));
        else AC_LAUNCH(kt_gate_cols, blocks(n), 256, 0, 0, o->out, o->in, o->gate, o->dout, o->unit, n);
        break;
    case AC_OP_KV_MERGE:
    case AC_OP_MASK_HIDDEN: break; // not differentiated (block_grad.h)
    case AC_OP_ROUTE: return recompute ? 0 : route_fwd(t, o, err, errn);
    case AC_OP_EXPERTS: return recompute ? 0 : experts_fwd(t, o, err, errn);
    case AC_OP_RELU2: acc_relu2_fwd(o->out, NULL, o->in, n, 0); break;
    case AC_OP_GATED_NORM: { // recomputed (block.h), from the taped scan output; the Mamba head gates inside it
        acc_ssm s = tssm(t, o->l);
        s.head_gate = gate_of(t, o->l, AC_DIM_SSM), s.dim_gate = t->gates + t->off_pd[o->l];
        acc_ssm_gated_norm_fwd(&s, o->out, NULL, o->in, o->in2, o->N, 0);
        break;
    }
    case AC_OP_SSM_CONV: // taped (the backward recomputes the pre-activation)
    case AC_OP_SSM_SCAN: // taped (the backward recomputes the states)
        if (!recompute) {
            acc_ssm s = tssm(t, o->l);
            if (op->kind == AC_OP_SSM_CONV)
                acc_ssm_conv_fwd(&s, o->out, o->in, o->B, o->T, NULL, 0, 0);
            else
                acc_ssm_scan_fwd(&s, o->out, o->in, o->in2, o->B, o->T, t->ssm_work, 0, 0);
        }
        break;
    }
    return 0;
}

// The backward of o->op: o->dO is the gradient of its output; the inputs'
// gradients are written (or added to), the parameters' accumulate.
static int op_bwd(acc_trainer *t, const top *o, char *err, size_t errn) {
    const ac_op *op = o->op;
    int N = o->N, din = o->din, dout = o->dout, hd = o->hd;
    size_t n = (size_t)N * dout;
    switch ((ac_op_kind)op->kind) {
    case AC_OP_LINEAR:
        if (op->acc) { // dI = alpha dx W; d alpha += <dx W, in>; dW += alpha dx^T in
            size_t ni = (size_t)N * din;
            if (gemm(t, 0, 0, N, din, dout, 1.0f, o->dO, dout, o->w, din, 0.0f, o->dI, din, err, errn)) return -1;
            if (o->dalpha) {
                AC_LAUNCH(kt_mul, blocks(ni), 256, 0, 0, t->prod, o->dI, o->in, ni);
                (void)cudaMemset(t->csum, 0, din * sizeof(float)); // errors surface at the step's check
                AC_LAUNCH(kt_colsum, blocks(din), 256, 0, 0, t->csum, t->prod, N, din);
                AC_LAUNCH(kt_sum_acc, 1, TB, 0, 0, o->dalpha, t->csum, din);
            }
            if (o->gw && gemm(t, 1, 0, dout, din, N, o->alpha, o->dO, dout, o->in, din, 1.0f, o->gw, din, err, errn))
                return -1;
            if (o->alpha != 1.0f) AC_LAUNCH(kt_scale, blocks(ni), 256, 0, 0, o->dI, o->alpha, ni);
        } else {
            if (gemm(t, 0, 0, N, din, dout, 1.0f, o->dO, dout, o->w, din, o->acc_dI ? 1.0f : 0.0f, o->dI, din, err,
                     errn) ||
                (o->gw && gemm(t, 1, 0, dout, din, N, 1.0f, o->dO, dout, o->in, din, 1.0f, o->gw, din, err, errn)))
                return -1;
            if (o->gb) AC_LAUNCH(kt_colsum, blocks(dout), 256, 0, 0, o->gb, o->dO, N, dout);
        }
        break;
    case AC_OP_MASK: { // dg += colsum(dout * in) per unit; din = dout * g, in place
        if (!o->gate) break; // passed through (above)
        int unit = o->unit;
        if (o->dgate) {
            AC_LAUNCH(kt_mul, blocks(n), 256, 0, 0, t->prod, o->dO, o->in, n);
            (void)cudaMemset(t->csum, 0, dout * sizeof(float));
            AC_LAUNCH(kt_colsum, blocks(dout), 256, 0, 0, t->csum, t->prod, N, dout);
            AC_LAUNCH(kt_unit_reduce, 1, TB, 0, 0, o->dgate, t->csum, dout, unit);
        }
        AC_LAUNCH(kt_gate_cols, blocks(n), 256, 0, 0, o->dO, o->dO, o->gate, dout, unit, n);
        break;
    }
    case AC_OP_SWIGLU: AC_LAUNCH(kt_silu_mul_bwd, blocks(n), 256, 0, 0, o->dO, o->dI, o->pre, o->in, n); break;
    case AC_OP_ROPE: AC_LAUNCH(kt_rope, N, TB, 0, 0, o->dO, o->heads, hd, o->T, t->cos_t, t->sin_t, 1); break;
    case AC_OP_HEAD_NORM: // in place: the slot's gradient becomes its input's; dw accumulates
        AC_LAUNCH(kt_head_norm_bwd, N * o->heads, TB, 0, 0, o->dO, t->prod, o->dO, o->in, o->w, hd, o->eps);
        if (o->gw) AC_LAUNCH(kt_colsum, blocks(hd), 256, 0, 0, o->gw, t->prod, N * o->heads, hd);
        break;
    case AC_OP_ATTENTION: {
        float scale = 1.0f / sqrtf((float)hd);
        AC_LAUNCH(kt_attn_bwd_q, dim3(N, o->nh), TB, 2 * o->T * sizeof(float), 0, o->dI, t->delta, o->dO, o->in, o->in2,
                  o->in3, o->lse, o->nh, o->nkv, hd, o->T, scale, o->window);
        AC_LAUNCH(kt_attn_bwd_kv, dim3(N, o->nkv), TB, 2 * o->T * sizeof(float), 0, o->dI2, o->dI3, o->dO, o->in,
                  o->in2, o->in3, o->lse, t->delta, o->nh, o->nkv, hd, o->T, scale, o->window);
        break;
    }
    case AC_OP_RMSNORM: // dI += (the residual's gradient); dw, dgh accumulate
        AC_LAUNCH(kt_rmsnorm_bwd, N, TB, 0, 0, o->dI, t->prod, t->prod2, o->dO, o->xhat, o->r, o->w, o->gh, o->H);
        if (o->gw) AC_LAUNCH(kt_colsum, blocks(o->H), 256, 0, 0, o->gw, t->prod, N, o->H);
        if (o->dgh) AC_LAUNCH(kt_colsum, blocks(o->H), 256, 0, 0, o->dgh, t->prod2, N, o->H);
        break;
    case AC_OP_KV_MERGE:
    case AC_OP_MASK_HIDDEN: break;
    case AC_OP_ROUTE: return route_bwd(t, o, err, errn);
    case AC_OP_EXPERTS: return experts_bwd(t, o, err, errn);
    case AC_OP_RELU2: acc_relu2_bwd(o->dI, o->dO, o->in, n, 0); break;
    case AC_OP_GATED_NORM: // dy written, z's columns of dzx written
    case AC_OP_SSM_SCAN:   // dxbc written, dt's columns of dzx written
    case AC_OP_SSM_CONV: { // xBC's columns of dzx written
        acc_ssm s = tssm(t, o->l);
        int l = o->l;
        if (op->kind == AC_OP_GATED_NORM) { // dnorm_w: prod's column sums; the head and dim gates': prodg's
            float *gn = G(t, l, T_SSM_NORM);
            s.head_gate = gate_of(t, l, AC_DIM_SSM), s.dim_gate = t->gates + t->off_pd[l];
            acc_ssm_gated_norm_bwd(&s, o->dI, o->dI2, t->prod, t->prodg, o->dO, o->in, o->in2, N, 0);
            if (gn) AC_LAUNCH(kt_colsum, blocks(dout), 256, 0, 0, gn, t->prod, N, dout);
            (void)cudaMemset(t->csum, 0, dout * sizeof(float));
            AC_LAUNCH(kt_colsum, blocks(dout), 256, 0, 0, t->csum, t->prodg, N, dout);
            AC_LAUNCH(kt_ssm_gate_reduce, 1, TB, 0, 0, dgate_of(t, l, AC_DIM_SSM), t->dgates + t->off_pd[l], t->csum,
                      s.head_gate, s.dim_gate, s.nh, s.P);
        } else if (op->kind == AC_OP_SSM_SCAN)
            acc_ssm_scan_bwd(&s, o->dI, o->dI2, G(t, l, T_DT_BIAS), G(t, l, T_A_LOG), G(t, l, T_SSM_D), o->dO, o->in,
                             o->in2, o->B, o->T, t->ssm_work, 0);
        else
            acc_ssm_conv_bwd(&s, o->dI, G(t, l, T_CONV_W), G(t, l, T_CONV_B), o->dO, o->in, o->B, o->T, 0);
        break;
    }
    }
    return 0;
}

// A MASK's gates (and their gradients) by the width it masks: query heads,
// FFN channels, Mamba heads, the shared expert's channels, LatentMoE's
// latent channels (both of its MASKs, the same gates); and the channels each
// gate covers (block.h's ac_block_mask_unit).
static size_t gate_off(const acc_trainer *t, int l, int d) {
    return d == AC_DIM_Q     ? t->off_head[l]
           : d == AC_DIM_F   ? t->off_ffn[l]
           : d == AC_DIM_SSM ? t->off_ssm[l]
           : d == AC_DIM_FS  ? t->off_sh[l]
           : d == AC_DIM_LT  ? t->off_lt[l]
                             : 0;
}
// (NULL for a width it has none for.)
static bool has_gates(int d) {
    return d == AC_DIM_Q || d == AC_DIM_F || d == AC_DIM_SSM || d == AC_DIM_FS || d == AC_DIM_LT;
}
static float *gate_of(const acc_trainer *t, int l, int d) { return has_gates(d) ? t->gates + gate_off(t, l, d) : NULL; }
static float *dgate_of(const acc_trainer *t, int l, int d) {
    return has_gates(d) ? t->dgates + gate_off(t, l, d) : NULL;
}
static int mask_unit(const tarch *a, int d) {
    ac_arch v = tview(a);
    return ac_block_mask_unit(&v, (ac_dim)d);
}

// Op i of sub-block sb of layer l with the trainer's weights, gates and
// gradients (its activations are the walker's to fill).
static top layer_op(acc_trainer *t, int l, int sb, const ac_op *op, int B, int T) {
    const tarch *a = &t->a;
    const ac_layer_arch *L = &a->layers[l];
    top o = {};
    o.op = op, o.l = l, o.B = B, o.T = T, o.N = B * T, o.H = a->hidden, o.hd = a->head_dim, o.nh = L->n_heads;
    o.nkv = L->n_kv_heads, o.window = a->sliding_window, o.eps = a->eps;
    o.din = tdim(a, l, op->din), o.dout = tdim(a, l, op->dout), o.heads = tdim(a, l, op->heads) / a->head_dim;
    o.gh = GH(t), o.dgh = t->dgates;
    // the trainer's sub-block gates: attention's and the FFN's (on nemotron_h the Mamba and MoE mixers' too,
    // as train.c's; another sub-block would be unscaled)
    int mix = sb == 0 ? 0 : sb == 1 || (a->hybrid && sb <= 3) ? 1 : -1;
    o.alpha = mix == 0 ? t->s_attn[l] : mix == 1 ? t->s_mlp[l] : 1.0f;
    o.dalpha = mix >= 0 ? t->dgates + a->hidden + (size_t)mix * a->n_layers + l : NULL;
    o.unit = mask_unit(a, op->dout);
    if (op->kind == AC_OP_LINEAR) {
        int bi = tw_bias(op->w);
        o.w = P(t, l, tw_mat(op->w)), o.gw = G(t, l, tw_mat(op->w));
        o.b = bi >= 0 ? P(t, l, bi) : NULL, o.gb = bi >= 0 ? G(t, l, bi) : NULL;
    }
    if (op->kind == AC_OP_RMSNORM || op->kind == AC_OP_HEAD_NORM)
        o.w = P(t, l, tw_norm(op->w)), o.gw = G(t, l, tw_norm(op->w));
    if (op->kind == AC_OP_MASK) o.gate = gate_of(t, l, op->dout), o.dgate = dgate_of(t, l, op->dout);
    return o;
}

// One sub-block of layer l (block.h's recipe, as block_grad.c walks it on
// the CPU): with fwd, run it and fill the tape; without, restore what the
// forward left (the cheap outputs recomputed into the scratch from sc) and
// keep each op, resolved, in ops[] for the backward. Returns the scratch's
// end, or NULL.
static float *sub_walk(acc_trainer *t, int l, int sb, int B, int T, float **tp, float *sc, bool fwd, top *ops,
                       char *err, size_t errn) {
    const tarch *a = &t->a;
    const ac_subblock *sub = &trecipe(a, l)->sub[sb];
    size_t N = (size_t)B * T;
    float *cur[AC_T_COUNT] = {};
    cur[AC_T_X] = t->x;
    for (int i = 0; i < sub->n_ops; i++) {
        const ac_op *op = &sub->ops[i];
        top o = layer_op(t, l, sb, op, B, T);
        o.in = cur[op->in], o.in2 = cur[op->in2], o.in3 = cur[op->in3], o.pre = cur[op->out];
        size_t n = N * o.dout;
        switch ((ac_op_kind)op->kind) {
        case AC_OP_RMSNORM:
            o.xhat = *tp, o.r = *tp + N * o.H, o.out = sc;
            *tp += N * (o.H + 1), sc += N * o.H;
            break;
        case AC_OP_LINEAR:
            if (op->acc)
                o.out = cur[op->out];
            else
                o.out = *tp, *tp += n;
            break;
        case AC_OP_ROPE: o.out = cur[op->out]; break;       // in place on a taped output
        case AC_OP_HEAD_NORM: o.out = *tp, *tp += n; break; // its input stays taped (the LINEAR's output)
        case AC_OP_ATTENTION:
            o.out = *tp, o.lse = *tp + n;
            *tp += n + N * o.nh;
            break;
        case AC_OP_SWIGLU:
        case AC_OP_MASK: o.out = sc, sc += n; break;
        case AC_OP_ROUTE: // taped: the softmax over the experts, then the routing weights
            o.xhat = *tp, o.r = o.out = *tp + n;
            *tp += 2 * n;
            break;
        case AC_OP_EXPERTS:
            if (op->acc)
                o.out = cur[op->out];
            else { // LatentMoE: its own taped slot (yl, latent wide), unscaled and without a sub-block gate of its own
                o.out = *tp, *tp += n;
                o.alpha = 1.0f, o.dalpha = NULL;
            }
            break;
        case AC_OP_RELU2:
        case AC_OP_GATED_NORM: o.out = sc, sc += n; break; // recomputed
        case AC_OP_SSM_CONV:
        case AC_OP_SSM_SCAN: o.out = *tp, *tp += n; break; // taped
        case AC_OP_KV_MERGE:
        case AC_OP_MASK_HIDDEN: o.out = cur[op->out]; break;
        }
        if (op_fwd(t, &o, !fwd, err, errn)) return NULL;
        cur[op->out] = o.out;
        ops[i] = o;
    }
    return sc;
}

// Layer l's backward: t->dx, the gradient at its output, becomes the one at
// its input; weight and gate gradients accumulate. The recipe in reverse.
static int layer_bwd(acc_trainer *t, int l, int B, int T, char *err, size_t errn) {
    const tarch *a = &t->a;
    const ac_block_recipe *r = trecipe(a, l);
    int N = B * T;
    float *tps[AC_BLOCK_MAX_SUB], *tp = t->tape[l];
    for (int s = 0; s < r->n_sub; s++) {
        tps[s] = tp;
        for (int i = 0; tpresent(a, l, &r->sub[s]) && i < r->sub[s].n_ops; i++)
            tp += op_tape(a, l, &r->sub[s].ops[i], N);
    }
    for (int s = r->n_sub - 1; s >= 0; s--) {
        const ac_subblock *sub = &r->sub[s];
        if (!tpresent(a, l, sub)) continue;
        top ops[AC_BLOCK_MAX_OPS];
        float *stp = tps[s], *g0 = sub_walk(t, l, s, B, T, &stp, t->bscr, false, ops, err, errn), *dS[AC_T_COUNT];
        if (!g0) return -1;
        bool has[AC_T_COUNT] = {};
        for (int i = 0; i < AC_T_COUNT; i++) {
            dS[i] = g0;
            g0 += (size_t)N * tdim_max(a, ac_block_slot_dim(i));
        }
        dS[AC_T_X] = t->dx, has[AC_T_X] = true;
        for (int i = sub->n_ops - 1; i >= 0; i--) {
            top &o = ops[i];
            const ac_op *op = o.op;
            o.dO = dS[op->out], o.dI = dS[op->in], o.dI2 = dS[op->in2], o.dI3 = dS[op->in3], o.acc_dI = has[op->in];
            if (op_bwd(t, &o, err, errn)) return -1;
            if (op->kind == AC_OP_MASK) dS[op->in] = o.dO; // in place
            if (op->kind != AC_OP_ROPE && op->kind != AC_OP_KV_MERGE && op->kind != AC_OP_MASK_HIDDEN)
                has[op->in] = true;
            if (op->kind == AC_OP_ATTENTION) has[op->in2] = has[op->in3] = true;
            if (op->kind == AC_OP_EXPERTS) has[op->in2] = true; // (the routing weights' gradient, written)
        }
    }
    return 0;
}

static int forward(acc_trainer *t, int B, int T, char *err, size_t errn) {
    const tarch *a = &t->a;
    int N = B * T, H = a->hidden, V = a->vocab;
    AC_LAUNCH(kt_embed, N, TB, 0, 0, t->x, t->p[0], t->tok, H);
    for (int l = 0; l < a->n_layers; l++) {
        const ac_block_recipe *r = trecipe(a, l);
        float *tp = t->tape[l];
        top ops[AC_BLOCK_MAX_OPS];
        for (int sb = 0; sb < r->n_sub; sb++)
            if (tpresent(a, l, &r->sub[sb]) && !sub_walk(t, l, sb, B, T, &tp, t->bscr, true, ops, err, errn)) return -1;
    }
    AC_LAUNCH(kt_rmsnorm, N, TB, 0, 0, t->xn, t->xhf, t->rf, t->x, t->p[2], GH(t), H, a->eps);
    return gemm(t, 0, 1, N, V, H, 1.0f, t->xn, H, t->p[t->head_idx], H, 0.0f, t->logits, V, err, errn);
}

// d(norm input) from d(norm output) in t->dxn, into t->dx; dw += colsum(dy * xhat)
static void norm_bwd(acc_trainer *t, int N, const float *xhat, const float *rr, const float *w, float *dw) {
    int H = t->a.hidden;
    AC_LAUNCH(kt_rmsnorm_bwd, N, TB, 0, 0, t->dx, t->prod, t->prod2, t->dxn, xhat, rr, w, GH(t), H);
    AC_LAUNCH(kt_colsum, blocks(H), 256, 0, 0, dw, t->prod, N, H);
    AC_LAUNCH(kt_colsum, blocks(H), 256, 0, 0, t->dgates, t->prod2, N, H); // the hidden gate's gradient
}

// Tokens grouped by id for the embedding backward (host side, uploaded).
static int embed_bwd(acc_trainer *t, const int *tokens, int N, char *err, size_t errn) {
    std::vector<int> idx(N);
    for (int i = 0; i < N; i++) idx[i] = i;
    std::stable_sort(idx.begin(), idx.end(), [&](int x, int y) { return tokens[x] < tokens[y]; });
    std::vector<int> &h = t->host_csr;
    h.assign(3 * N + 1, 0);
    int nu = 0;
    for (int i = 0; i < N; i++) {
        if (!i || tokens[idx[i]] != tokens[idx[i - 1]]) {
            h[nu] = tokens[idx[i]];
            h[N + nu] = i;
            nu++;
        }
        h[2 * N + 1 + i] = idx[i];
    }
    h[N + nu] = N;
    // layout on the device: uniq [N], off [N+1], rows [N]
    TCK(cudaMemcpy(t->csr, h.data(), h.size() * sizeof(int), cudaMemcpyHostToDevice));
    AC_LAUNCH(kt_embed_bwd, nu, TB, 0, 0, t->g[0], t->dx, t->csr, t->csr + N, t->csr + 2 * N + 1, t->a.hidden);
    return 0;
}

// Check B x T and the token ids, upload the tokens.
static int upload_tokens(acc_trainer *t, const int *tokens, int B, int T, char *err, size_t errn) {
    if (B <= 0 || T <= 0 || B > t->max_B || T > t->max_T) {
        snprintf(err, errn, "trainer: batch %d x %d exceeds %d x %d", B, T, t->max_B, t->max_T);
        return -1;
    }
    int N = B * T, V = t->a.vocab;
    for (int i = 0; i < N; i++)
        if (tokens[i] < 0 || tokens[i] >= V) {
            snprintf(err, errn, "trainer: token id %d outside vocabulary of %d", tokens[i], V);
            return -1;
        }
    TCK(cudaMemcpy(t->tok, tokens, N * sizeof(int), cudaMemcpyHostToDevice));
    return 0;
}

extern "C" int acc_trainer_forward(acc_trainer *t, const int *tokens, int B, int T, float *logits, char *err,
                                   size_t errn) {
    if (upload_tokens(t, tokens, B, T, err, errn) || forward(t, B, T, err, errn)) return -1;
    TCK(cudaMemcpy(logits, t->logits, (size_t)B * T * t->a.vocab * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
}

extern "C" int acc_trainer_tensor(acc_trainer *t, int layer, int which, const float *w, float *grad, size_t n,
                                  char *err, size_t errn) {
    int i = layer >= 0 && layer < t->a.n_layers && which >= 0 && which < ACC_T_N ? wi(t, layer, which) : -1;
    if (i < 0 || t->n[i] != n || !n) {
        snprintf(err, errn, "trainer: layer %d tensor %d has %zu elements, not %zu", layer, which, i >= 0 ? t->n[i] : 0,
                 n);
        return -1;
    }
    if (w) TCK(cudaMemcpy(P(t, layer, which), w, n * sizeof(float), cudaMemcpyHostToDevice));
    if (grad) TCK(cudaMemcpy(grad, G(t, layer, which), n * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
}

extern "C" int acc_trainer_zero_grad(acc_trainer *t, char *err, size_t errn) {
    for (int i = 0; i < t->nt; i++)
        if (t->n[i]) TCK(cudaMemset(t->g[i], 0, t->n[i] * sizeof(float)));
    return 0;
}

extern "C" int acc_trainer_grad(acc_trainer *t, const int *tokens, const int *targets, const float *teacher, int B,
                                int T, float tau, float kd_weight, float scale, double *loss, char *err, size_t errn) {
    const tarch *a = &t->a;
    if (upload_tokens(t, tokens, B, T, err, errn)) return -1;
    int N = B * T, H = a->hidden, V = a->vocab;
    if (targets) TCK(cudaMemcpy(t->tgt, targets, N * sizeof(int), cudaMemcpyHostToDevice));
    if (teacher) TCK(cudaMemcpy(t->teacher, teacher, (size_t)N * V * sizeof(float), cudaMemcpyHostToDevice));
    if (forward(t, B, T, err, errn)) return -1;
    long nce = 0;
    for (int i = 0; targets && i < N; i++) nce += targets[i] >= 0;
    float wkd = teacher ? kd_weight : 0.0f, wce = 1.0f - wkd;
    float fce = nce ? scale * wce / (float)nce : 0.0f, fkd = scale * wkd * tau / (float)N;
    AC_LAUNCH(kt_loss, N, TB, 0, 0, t->dlogits, t->rowloss, t->logits, targets ? t->tgt : (const int *)NULL,
              teacher ? t->teacher : (const float *)NULL, V, tau, fce, fkd);
    std::vector<float> rl(2 * (size_t)N);
    TCK(cudaMemcpy(rl.data(), t->rowloss, rl.size() * sizeof(float), cudaMemcpyDeviceToHost));
    double ce = 0, kd = 0;
    for (int i = 0; i < N; i++) {
        ce += rl[2 * i];
        kd += rl[2 * i + 1];
    }
    ce = nce ? ce / nce : 0;
    kd /= N;
    if (loss) *loss = wkd * kd + wce * ce;
    // backward: head, final norm, layers in reverse, embedding
    AC_LAUNCH(kt_scale_cols, N, TB, 0, 0, t->xn, t->xhf, t->p[2], GH(t), H);
    if (gemm(t, 0, 0, N, H, V, 1.0f, t->dlogits, V, t->p[t->head_idx], H, 0.0f, t->dxn, H, err, errn) ||
        gemm(t, 1, 0, V, H, N, 1.0f, t->dlogits, V, t->xn, H, 1.0f, t->g[t->head_idx], H, err, errn))
        return -1;
    TCK(cudaMemset(t->dx, 0, (size_t)N * H * sizeof(float)));
    norm_bwd(t, N, t->xhf, t->rf, t->p[2], t->g[2]);
    for (int l = a->n_layers - 1; l >= 0; l--)
        if (layer_bwd(t, l, B, T, err, errn)) return -1;
    if (embed_bwd(t, tokens, N, err, errn)) return -1;
    TCK(cudaGetLastError());
    TCK(cudaStreamSynchronize(0));
    return 0;
}

extern "C" int acc_trainer_step(acc_trainer *t, float lr, float beta1, float beta2, float eps, float weight_decay,
                                float clip, long step, double *gnorm, char *err, size_t errn) {
    double ss = 0;
    std::vector<float> part(1024);
    for (int i = 0; i < t->nt; i++) {
        if (!t->n[i]) continue;
        unsigned nb = std::min(1024u, blocks(t->n[i]));
        AC_LAUNCH(kt_sumsq, nb, 256, 0, 0, t->part, t->g[i], t->n[i]);
        TCK(cudaMemcpy(part.data(), t->part, nb * sizeof(float), cudaMemcpyDeviceToHost));
        for (unsigned b = 0; b < nb; b++) ss += part[b];
    }
    double norm = sqrt(ss);
    if (gnorm) *gnorm = norm;
    float coef = 1.0f;
    if (clip > 0 && (float)(clip / (norm + 1e-6)) < 1.0f) coef = (float)(clip / (norm + 1e-6));
    double bc1 = 1 - pow(beta1, (double)(step + 1)), bc2 = 1 - pow(beta2, (double)(step + 1));
    for (int i = 0; i < t->nt; i++) {
        if (!t->n[i]) continue;
        AC_LAUNCH(kt_adamw, blocks(t->n[i]), 256, 0, 0, t->p[i], t->g[i], t->m[i], t->v[i], t->n[i], coef,
                  t->decay[i] ? 1.0f - lr * weight_decay : 1.0f, beta1, beta2, (float)(lr / bc1), (float)sqrt(bc2),
                  eps);
    }
    TCK(cudaGetLastError());
    TCK(cudaStreamSynchronize(0));
    return 0;
}

extern "C" int acc_trainer_download(acc_trainer *t, ac_model *w, ac_model *g, char *err, size_t errn) {
    ac_model *ms[2] = {w, g};
    for (int k = 0; k < 2; k++) {
        if (!ms[k]) continue;
        std::vector<const void *> hp;
        std::vector<size_t> n;
        std::vector<int> d, dt;
        host_tensors(ms[k], hp, n, d, dt, NULL);
        if ((int)hp.size() != t->nt) {
            snprintf(err, errn, "trainer: download into a model of another architecture");
            return -1;
        }
        if (std::count(dt.begin(), dt.end(), (int)ST_F32) != (long)dt.size()) {
            snprintf(err, errn, "trainer: download into fp32 weights only (not a resident model's mapping)");
            return -1;
        }
        for (int i = 0; i < t->nt; i++) {
            if (n[i] != t->n[i]) {
                snprintf(err, errn, "trainer: tensor %d has %zu elements, the device's %zu", i, n[i], t->n[i]);
                return -1;
            }
            if (n[i])
                TCK(cudaMemcpy((void *)hp[i], k ? t->g[i] : t->p[i], n[i] * sizeof(float), cudaMemcpyDeviceToHost));
        }
    }
    return 0;
}

extern "C" int acc_trainer_gates(acc_trainer *t, const ac_gates *g, ac_gates *dg, int zero_grad, char *err,
                                 size_t errn) {
    const tarch *a = &t->a;
    int H = a->hidden, L = a->n_layers;
    std::vector<float> h(t->ngates);
    // pack / unpack between train.h's ac_gates and the device layout
    auto walk = [&](const ac_gates *src, ac_gates *dst) {
        for (int c = 0; c < H; c++) src ? (void)(h[c] = src->hidden[c]) : (void)(dst->hidden[c] = h[c]);
        for (int l = 0; l < L; l++) {
            src ? (void)(h[H + l] = src->attn[l]) : (void)(dst->attn[l] = h[H + l]);
            src ? (void)(h[H + L + l] = src->mlp[l]) : (void)(dst->mlp[l] = h[H + L + l]);
            for (int k = 0; k < a->layers[l].n_heads; k++)
                src ? (void)(h[t->off_head[l] + k] = src->head[l][k]) : (void)(dst->head[l][k] = h[t->off_head[l] + k]);
            for (int k = 0; k < a->layers[l].ffn; k++)
                src ? (void)(h[t->off_ffn[l] + k] = src->ffn[l][k]) : (void)(dst->ffn[l][k] = h[t->off_ffn[l] + k]);
            const ac_gates *q = src ? src : dst; // expert gates: NULL arrays (the caller has none) are skipped
            int E = a->layers[l].n_experts, nc = E * a->layers[l].expert_ffn;
            for (int k = 0; q->expert && q->expert[l] && k < E; k++)
                src ? (void)(h[t->off_exp[l] + k] = src->expert[l][k]) : (void)(dst->expert[l][k] = h[t->off_exp[l] + k]);
            for (int k = 0; q->echan && q->echan[l] && k < nc; k++)
                src ? (void)(h[t->off_echan[l] + k] = src->echan[l][k])
                    : (void)(dst->echan[l][k] = h[t->off_echan[l] + k]);
            int ns = a->layers[l].ssm_heads; // Mamba heads and head dims: likewise (only a hybrid's layers have any)
            for (int k = 0; ns && q->ssm && q->ssm[l] && k < ns; k++)
                src ? (void)(h[t->off_ssm[l] + k] = src->ssm[l][k]) : (void)(dst->ssm[l][k] = h[t->off_ssm[l] + k]);
            for (int k = 0; ns && q->ssm_dim && q->ssm_dim[l] && k < a->ssm_head_dim; k++)
                src ? (void)(h[t->off_pd[l] + k] = src->ssm_dim[l][k]) : (void)(dst->ssm_dim[l][k] = h[t->off_pd[l] + k]);
            int fs = tdim(a, l, AC_DIM_FS), lt = tdim(a, l, AC_DIM_LT); // nemotron_h's MoE: shared expert, latent
            for (int k = 0; q->shared && q->shared[l] && k < fs; k++)
                src ? (void)(h[t->off_sh[l] + k] = src->shared[l][k]) : (void)(dst->shared[l][k] = h[t->off_sh[l] + k]);
            for (int k = 0; q->latent && q->latent[l] && k < lt; k++)
                src ? (void)(h[t->off_lt[l] + k] = src->latent[l][k]) : (void)(dst->latent[l][k] = h[t->off_lt[l] + k]);
        }
    };
    if (g) {
        h = t->hz; // (expert gates the caller leaves out stay as they are)
        walk(g, NULL);
        t->hz = h;
        TCK(cudaMemcpy(t->gates, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
        for (int l = 0; l < L; l++) t->s_attn[l] = g->attn[l], t->s_mlp[l] = g->mlp[l];
    }
    if (dg) {
        TCK(cudaMemcpy(h.data(), t->dgates, h.size() * sizeof(float), cudaMemcpyDeviceToHost));
        walk(NULL, dg);
    }
    if (zero_grad) TCK(cudaMemset(t->dgates, 0, t->ngates * sizeof(float)));
    return 0;
}

// The CUDA call's error into err: -1, else 0.
static int cu_ok(cudaError_t e, const char *what, char *err, size_t errn) {
    if (e == cudaSuccess) return 0;
    snprintf(err, errn, "%s: %s", what, cudaGetErrorString(e));
    return -1;
}

// A device copy of n host floats (zeros when h is NULL, ones with one), freed with t.
static float *dev_copy(acc_trainer *t, const float *h, size_t n, bool one, char *err, size_t errn) {
    float *d = NULL;
    size_t m = n ? n : 1;
    if (dalloc(t, &d, m, err, errn)) return NULL;
    std::vector<float> ones(one && !h ? m : 0, 1.0f);
    cudaError_t e = h     ? cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice)
                    : one ? cudaMemcpy(d, ones.data(), m * sizeof(float), cudaMemcpyHostToDevice)
                          : cudaMemset(d, 0, m * sizeof(float));
    return cu_ok(e, "op_test upload", err, errn) ? NULL : d;
}

// h[i] (+)= the n device floats at s (nothing when either is NULL).
static int get_back(float *h, const float *s, size_t n, bool add, char *err, size_t errn) {
    if (!h || !s) return 0;
    std::vector<float> v(n);
    if (cu_ok(cudaMemcpy(v.data(), s, n * sizeof(float), cudaMemcpyDeviceToHost), "op_test download", err, errn))
        return -1;
    for (size_t i = 0; i < n; i++) h[i] = add ? h[i] + v[i] : v[i];
    return 0;
}

extern "C" int acc_op_test(int dev, const ac_arch *a, const ac_op *op, int B, int T, const float *rope_cos,
                           const float *rope_sin, acc_op_io *io, char *err, size_t errn) {
    if (a->head_dim > 4 * TB || (size_t)2 * T * sizeof(float) > 48 * 1024) { // the trainer's kernels' limits
        snprintf(err, errn, "op_test: head_dim %d or context %d above the CUDA trainer's", a->head_dim, T);
        return -1;
    }
    if (op->kind == AC_OP_ROUTE || op->kind == AC_OP_EXPERTS) { // (tested through the trainer: test_train.c)
        snprintf(err, errn, "op_test: the MoE ops run in the trainer only");
        return -1;
    }
    if (op->kind == AC_OP_SSM_CONV || op->kind == AC_OP_SSM_SCAN || op->kind == AC_OP_GATED_NORM || a->hybrid) {
        snprintf(err, errn, "op_test: the Mamba-2 ops run in the trainer only"); // (test_train.c, their parameters)
        return -1;
    }
    if (cu_ok(cudaSetDevice(dev), "cudaSetDevice", err, errn)) return -1;
    acc_trainer *t = new acc_trainer();
    t->a.n_layers = 1, t->a.hidden = a->hidden, t->a.head_dim = a->head_dim, t->a.vocab = a->vocab;
    t->a.sliding_window = a->sliding_window, t->a.eps = a->eps, t->a.qk_norm = a->qk_norm;
    t->a.layers.assign(a->layers, a->layers + 1);
    size_t N = (size_t)B * T, H = a->hidden, hd = a->head_dim, w[AC_T_COUNT], mw = H;
    for (int s = 0; s < AC_T_COUNT; s++) w[s] = tdim(&t->a, 0, ac_block_slot_dim(s)), mw = std::max(mw, w[s]);
    top o = {};
    o.op = op, o.B = B, o.T = T, o.N = (int)N, o.H = (int)H, o.hd = (int)hd, o.nh = a->layers[0].n_heads;
    o.nkv = a->layers[0].n_kv_heads, o.window = a->sliding_window, o.eps = a->eps, o.alpha = io->alpha;
    o.din = tdim(&t->a, 0, op->din), o.dout = tdim(&t->a, 0, op->dout), o.heads = tdim(&t->a, 0, op->heads) / (int)hd;
    o.unit = op->dout == AC_DIM_Q ? (int)hd : 1;
    size_t nout = N * o.dout, nin = N * w[op->in], nw = (size_t)o.dout * o.din;
    size_t units = op->dout == AC_DIM_Q ? (size_t)o.nh : (size_t)o.dout;
    bool lin = op->kind == AC_OP_LINEAR, att = op->kind == AC_OP_ATTENTION, norm = op->kind == AC_OP_RMSNORM;
    bool hnorm = op->kind == AC_OP_HEAD_NORM;
    bool inplace = op->kind == AC_OP_ROPE || op->kind == AC_OP_MASK || hnorm; // the input's gradient is dO's buffer
    bool ok = cublasCreate(&t->blas) == CUBLAS_STATUS_SUCCESS;
    if (!ok) snprintf(err, errn, "cublasCreate failed");
    ok = ok && !dalloc(t, &t->prod, N * mw, err, errn) && !dalloc(t, &t->prod2, N * H, err, errn) &&
         !dalloc(t, &t->csum, mw, err, errn) && !dalloc(t, &t->delta, N * (o.nh + 1), err, errn) &&
         (t->cos_t = dev_copy(t, rope_cos, (size_t)T * hd / 2, false, err, errn)) &&
         (t->sin_t = dev_copy(t, rope_sin, (size_t)T * hd / 2, false, err, errn));
    // inputs, the output buffer (the residual for an add, the rotated slot for RoPE), SwiGLU's gate projection
    ok = ok && (op->kind == AC_OP_ROPE || (o.in = dev_copy(t, io->x[op->in], nin, false, err, errn)));
    ok = ok && (!att || ((o.in2 = dev_copy(t, io->x[op->in2], N * w[op->in2], false, err, errn)) &&
                         (o.in3 = dev_copy(t, io->x[op->in3], N * w[op->in3], false, err, errn)) &&
                         !dalloc(t, &o.lse, N * o.nh, err, errn)));
    ok = ok && (o.out = dev_copy(t, (lin && op->acc) || op->kind == AC_OP_ROPE ? io->x[op->out] : NULL, nout, false,
                                 err, errn));
    ok = ok && (op->kind != AC_OP_SWIGLU || (o.pre = dev_copy(t, io->x[op->out], nout, false, err, errn)));
    // parameters and gates, and their gradients when asked for
    ok = ok && (!norm ||
                (!dalloc(t, &o.xhat, N * H, err, errn) && !dalloc(t, &o.r, N, err, errn) &&
                 (o.w = dev_copy(t, io->w, H, false, err, errn)) && (o.gh = dev_copy(t, io->gh, H, true, err, errn)) &&
                 (!io->dw || (o.gw = dev_copy(t, NULL, H, false, err, errn))) &&
                 (!io->dgh || (o.dgh = dev_copy(t, NULL, H, false, err, errn)))));
    ok = ok && (!hnorm || ((o.w = dev_copy(t, io->w, hd, false, err, errn)) &&
                           (!io->dw || (o.gw = dev_copy(t, NULL, hd, false, err, errn)))));
    ok = ok && (!lin || ((o.w = dev_copy(t, io->w, nw, false, err, errn)) &&
                         (!io->b || (o.b = dev_copy(t, io->b, o.dout, false, err, errn))) &&
                         (!io->dw || (o.gw = dev_copy(t, NULL, nw, false, err, errn))) &&
                         (!io->db || (o.gb = dev_copy(t, NULL, o.dout, false, err, errn))) &&
                         (!io->dalpha || (o.dalpha = dev_copy(t, NULL, 1, false, err, errn)))));
    ok = ok && (op->kind != AC_OP_MASK || ((o.gate = dev_copy(t, io->gate, units, true, err, errn)) &&
                                           (!io->dgate || (o.dgate = dev_copy(t, NULL, units, false, err, errn)))));
    ok = ok && !op_fwd(t, &o, false, err, errn) && !get_back(io->y, o.out, nout, false, err, errn);
    // backward
    ok = ok && (o.dO = dev_copy(t, io->dy, nout, false, err, errn)) &&
         (inplace || (o.dI = dev_copy(t, NULL, nin, false, err, errn)));
    ok = ok && (!att || ((o.dI2 = dev_copy(t, NULL, N * w[op->in2], false, err, errn)) &&
                         (o.dI3 = dev_copy(t, NULL, N * w[op->in3], false, err, errn))));
    ok = ok && !op_bwd(t, &o, err, errn) && !cu_ok(cudaStreamSynchronize(0), "op_test", err, errn);
    if (op->kind == AC_OP_SWIGLU) // the gate projection's gradient replaces dO; the up projection's is dI
        ok = ok && !get_back(io->dx[op->out], o.dO, nout, false, err, errn);
    ok = ok && !get_back(io->dx[op->in], inplace ? o.dO : o.dI, nin, norm, err, errn);
    ok = ok && (!att || (!get_back(io->dx[op->in2], o.dI2, N * w[op->in2], false, err, errn) &&
                         !get_back(io->dx[op->in3], o.dI3, N * w[op->in3], false, err, errn)));
    ok = ok &&
         !get_back(io->dw, o.gw,
                   norm    ? H
                   : hnorm ? hd
                           : nw,
                   true, err, errn) &&
         !get_back(io->db, o.gb, o.dout, true, err, errn) && !get_back(io->dgh, o.dgh, H, true, err, errn) &&
         !get_back(io->dalpha, o.dalpha, 1, true, err, errn) && !get_back(io->dgate, o.dgate, units, true, err, errn);
    acc_trainer_free(t);
    return ok ? 0 : -1;
}
