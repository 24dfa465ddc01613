// ac_cuda.cu - see ac_cuda.h. Kernels are deliberately simple and correct
// first (one block per row / per (row, head)); cuBLAS carries the GEMMs,
// which dominate the cost.
#include "cuda/ac_cuda.h"
#include "ac_cuda_conv_int.h"
#include "ac_cuda_ssm_int.h"
#include "ac_cuda_train_int.h"
#include "runtime/block.h"

#ifdef AC_CUDA_EMU
#include "cuda_emu.h" // tests: the CPU emulation in tests/cuda_emu
#else
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
// Launches and dynamic shared memory go through these two macros so that
// tests/cuda_emu can compile this file for the CPU and run its kernels.
#define AC_LAUNCH(k, grid, block, shm, stream, ...) k<<<(grid), (block), (shm), (stream)>>>(__VA_ARGS__)
#define AC_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

typedef __nv_bfloat16 bf16;

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            snprintf(err, errn, "%s:%d: %s: %s", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                      \
            goto fail;                                                                                                 \
        }                                                                                                              \
    } while (0)
#define CB(x)                                                                                                          \
    do {                                                                                                               \
        cublasStatus_t s_ = (x);                                                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                             \
            snprintf(err, errn, "%s:%d: %s: cuBLAS status %d", __FILE__, __LINE__, #x, (int)s_);                       \
            goto fail;                                                                                                 \
        }                                                                                                              \
    } while (0)

// ---------------------------------------------------------------- kernels

__global__ void k_embed(float *x, const bf16 *emb, const int *tok, int H) {
    int r = blockIdx.x;
    const bf16 *e = emb + (size_t)tok[r] * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) x[(size_t)r * H + i] = __bfloat162float(e[i]);
}

__global__ void k_bias(float *y, const float *b, int cols, int rows) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)rows * cols) y[i] += b[i % cols];
}

// rotate-half RoPE on [N, nh*hd] with pos = pos0 + r % n
__global__ void k_rope(float *x, int nh, int hd, int n, int pos0, const float *cs, const float *sn) {
    int r = blockIdx.x, half = hd / 2, pos = pos0 + r % n;
    for (int idx = threadIdx.x; idx < nh * half; idx += blockDim.x) {
        int h = idx / half, i = idx % half;
        float *v = x + (size_t)r * nh * hd + (size_t)h * hd;
        float c = cs[(size_t)pos * half + i], s = sn[(size_t)pos * half + i], a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
    }
}

// k, v rows [N, KV] -> cache [B][max_ctx][KV] at position pos0 + t (bf16)
__global__ void k_store_kv(bf16 *kc, bf16 *vc, const float *k, const float *v, int KV, int n, int pos0, int max_ctx) {
    int r = blockIdx.x, b = r / n, t = r % n;
    size_t dst = ((size_t)b * max_ctx + pos0 + t) * KV;
    for (int i = threadIdx.x; i < KV; i += blockDim.x) {
        kc[dst + i] = __float2bfloat16(k[(size_t)r * KV + i]);
        vc[dst + i] = __float2bfloat16(v[(size_t)r * KV + i]);
    }
}

// Sum (op 0) or max (op 1) of v over the block; every thread gets the result.
// blockDim.x must be a multiple of 32 (full-warp shuffles).
__device__ float block_reduce(float v, int op) {
    __shared__ float red[32];
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffff, v, o);
        v = op ? fmaxf(v, w) : v + w;
    }
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = red[0];
    for (int i = 1; i < (int)(blockDim.x >> 5); i++) r = op ? fmaxf(r, red[i]) : r + red[i];
    __syncthreads(); // all have read red before the next reduction writes it
    return r;
}

// Keys per tile of the attention kernel's online softmax (the tests build the
// CPU emulation with a tiny tile so that several tiles are exercised).
#ifndef AC_ATTN_TILE
#define AC_ATTN_TILE 1024
#endif
// Rows of logits computed at a time: the head's output buffer is
// AC_LOGIT_ROWS x vocab, not (batch x context) x vocab (a 32 x 2048 prefill
// of a 128k-vocabulary model would need 34 GB for it).
#ifndef AC_LOGIT_ROWS
#define AC_LOGIT_ROWS 1024
#endif

#define ATTN_THREADS 128
#define ATTN_MAX_HD (4 * ATTN_THREADS)

static size_t attn_shared_bytes(int hd) { return (size_t)(AC_ATTN_TILE + hd) * sizeof(float); }

// One block per (query row, head); keys in tiles of AC_ATTN_TILE with an
// online softmax (running max and sum, accumulator rescaled per tile), so the
// context length is not bounded by shared memory. Thread i owns output dims
// i, i + 128, ... (hd <= 512). out: bf16 [N, nh*hd].
__global__ void k_attention(bf16 *out, const float *q, const bf16 *kc, const bf16 *vc, int nh, int nkv, int hd, int n,
                            int pos0, int max_ctx, float scale, int window) {
    AC_DYNAMIC_SHARED(float, sm);
    int r = blockIdx.x, h = blockIdx.y, b = r / n, t = r % n, S = pos0 + t + 1, kh = h / (nh / nkv), KV = nkv * hd;
    int first = window > 0 && S > window ? S - window : 0; // sliding window: keys [first, S)
    float *qs = sm, *sc = sm + hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = q[(size_t)r * nh * hd + (size_t)h * hd + i];
    __syncthreads();
    const bf16 *kb = kc + (size_t)b * max_ctx * KV + (size_t)kh * hd,
               *vb = vc + (size_t)b * max_ctx * KV + (size_t)kh * hd;
    float m = -INFINITY, l = 0, acc[4] = {0, 0, 0, 0};
    for (int t0 = first; t0 < S; t0 += AC_ATTN_TILE) {
        int len = S - t0 < AC_ATTN_TILE ? S - t0 : AC_ATTN_TILE;
        float mx = -INFINITY;
        for (int j = threadIdx.x; j < len; j += blockDim.x) {
            const bf16 *kr = kb + (size_t)(t0 + j) * KV;
            float d = 0;
            for (int i = 0; i < hd; i++) d += qs[i] * __bfloat162float(kr[i]);
            sc[j] = d * scale;
            mx = fmaxf(mx, sc[j]);
        }
        float mn = fmaxf(m, block_reduce(mx, 1)), sum = 0;
        for (int j = threadIdx.x; j < len; j += blockDim.x) {
            sc[j] = __expf(sc[j] - mn);
            sum += sc[j];
        }
        sum = block_reduce(sum, 0); // its barriers also publish sc
        float c = __expf(m - mn);   // 0 on the first tile (m = -inf)
        l = l * c + sum;
        for (int u = 0, i = threadIdx.x; u < 4 && i < hd; u++, i += blockDim.x) {
            float a = acc[u] * c;
            for (int j = 0; j < len; j++) a += sc[j] * __bfloat162float(vb[(size_t)(t0 + j) * KV + i]);
            acc[u] = a;
        }
        m = mn;
        __syncthreads(); // sc is rewritten by the next tile
    }
    for (int u = 0, i = threadIdx.x; u < 4 && i < hd; u++, i += blockDim.x)
        out[(size_t)r * nh * hd + (size_t)h * hd + i] = __float2bfloat16(acc[u] / l);
}

// Cross-entropy per row: nll[r] = logsumexp(logits[r]) - logits[r][target[r]],
// 0 where target[r] < 0. One block per row of V logits.
__global__ void k_nll(float *nll, const float *logits, const int *target, int V) {
    int r = blockIdx.x;
    const float *x = logits + (size_t)r * V;
    float mx = -INFINITY, s = 0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, x[j]);
    mx = block_reduce(mx, 1);
    for (int j = threadIdx.x; j < V; j += blockDim.x) s += expf(x[j] - mx);
    s = block_reduce(s, 0);
    if (threadIdx.x == 0) nll[r] = target[r] < 0 ? 0.0f : mx + logf(s) - x[target[r]];
}

__global__ void k_silu_mul(bf16 *h, const float *g, const float *u, size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) {
        float x = g[i];
        h[i] = __float2bfloat16(x / (1.0f + __expf(-x)) * u[i]);
    }
}

// dst[i] = src[i] as BF16 (fp32 rows a GEMM reads)
__global__ void k_f32_to_bf16(bf16 *dst, const float *src, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = __float2bfloat16(src[i]);
}

__global__ void k_gather_last(float *dst, const float *x, int H, int n) {
    int b = blockIdx.x;
    for (int i = threadIdx.x; i < H; i += blockDim.x) dst[(size_t)b * H + i] = x[((size_t)b * n + n - 1) * H + i];
}

__global__ void k_empty() {}

// MoE: dst[j] = src[rows[j]] (BF16 rows of H), one block per row.
__global__ void k_gather_rows(bf16 *dst, const bf16 *src, const int *rows, int H) {
    for (int c = threadIdx.x; c < H; c += blockDim.x)
        dst[(size_t)blockIdx.x * H + c] = src[(size_t)rows[blockIdx.x] * H + c];
}

// MoE: x[rows[j]] += w[j] * y[j] (rows distinct within a launch), one block per row.
__global__ void k_scatter_add(float *x, const float *y, const int *rows, const float *w, int H) {
    for (int c = threadIdx.x; c < H; c += blockDim.x)
        x[(size_t)rows[blockIdx.x] * H + c] += w[blockIdx.x] * y[(size_t)blockIdx.x * H + c];
}

// In place, each hd-wide row of x (a head of q or k) RMS-normed times w[hd]
// (Qwen3's q_norm / k_norm); one block per row.
__global__ void k_head_norm(float *x, const float *w, int hd, float eps) {
    float *xr = x + (size_t)blockIdx.x * hd;
    float s = 0;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) s += xr[i] * xr[i];
    float sc = rsqrtf(block_reduce(s, 0) / hd + eps);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) xr[i] = xr[i] * sc * w[i];
}

// out[r] = x[r] * rsqrt(mean(x^2) + eps) * w, as bf16 (GEMM input)
__global__ void k_rmsnorm(bf16 *out, const float *x, const float *w, int H, float eps) {
    int r = blockIdx.x;
    const float *xr = x + (size_t)r * H;
    float s = 0;
    for (int i = threadIdx.x; i < H; i += blockDim.x) s += xr[i] * xr[i];
    float sc = rsqrtf(block_reduce(s, 0) / H + eps);
    for (int i = threadIdx.x; i < H; i += blockDim.x) out[(size_t)r * H + i] = __float2bfloat16(xr[i] * sc * w[i]);
}

// ---------------------------------------------------------------- weight upload (ac_cuda_conv_int.h)

// The host's conversions (src/core/tensor.c), bit for bit.
__device__ inline float cv_f16_to_f32(unsigned h) {
    unsigned sign = (h & 0x8000u) << 16, ex = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (ex == 0) { // zero or subnormal: man * 2^-24, exact in fp32
        float f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    return __uint_as_float(ex == 31 ? sign | 0x7f800000u | (man << 13) : sign | ((ex + 112) << 23) | (man << 13));
}

__device__ inline unsigned short cv_f32_to_bf16(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u); // quiet NaN, payload kept
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__device__ inline float cv_to_f32(const void *src, int dt, size_t i) {
    if (dt == ST_F32) return ((const float *)src)[i];
    unsigned h = ((const unsigned short *)src)[i];
    return dt == ST_BF16 ? __uint_as_float(h << 16) : cv_f16_to_f32(h);
}

// dst[i] = src[i] as fp32 (src BF16 or F16; distinct buffers). Grid-stride.
__global__ void k_to_f32(float *dst, const void *src, int dt, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = cv_to_f32(src, dt, i);
}

// dst[i] = src[i] as BF16 bits (src F32 or F16; F16 may be dst itself: each
// element is read and written by the same thread). Grid-stride.
__global__ void k_to_bf16(unsigned short *dst, const void *src, int dt, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = cv_f32_to_bf16(cv_to_f32(src, dt, i));
}

static unsigned cv_blocks(size_t n) { return (unsigned)std::min<size_t>((n + 255) / 256, 4096); }

static int cv_check_dt(int dt, char *err, size_t errn) {
    if (dt == ST_F32 || dt == ST_BF16 || dt == ST_F16) return 0;
    snprintf(err, errn, "weight dtype %d: the CUDA upload takes F32, BF16 or F16", dt);
    return -1;
}

int acc_model_dt(const ac_model *m) { return m->wdt == ST_BF16 || m->wdt == ST_F16 ? m->wdt : ST_F32; }

int acc_put_f32(float *dst, const void *src, int dt, size_t n, void *stage, char *err, size_t errn) {
    if (cv_check_dt(dt, err, errn)) return -1;
    if (!n) return 0;
    if (dt == ST_F32) {
        CK(cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyHostToDevice));
        return 0;
    }
    CK(cudaMemcpy(stage, src, n * 2, cudaMemcpyHostToDevice));
    AC_LAUNCH(k_to_f32, cv_blocks(n), 256, 0, 0, dst, stage, dt, n);
    CK(cudaGetLastError());
    return 0;
fail:
    return -1;
}

int acc_put_bf16(void *dst, const void *src, int dt, size_t n, float *stage, size_t stage_n, char *err, size_t errn) {
    if (cv_check_dt(dt, err, errn)) return -1;
    if (!n) return 0;
    if (dt == ST_F32 && (!stage || !stage_n)) {
        snprintf(err, errn, "an F32 upload needs a staging buffer");
        return -1;
    }
    if (dt != ST_F32) {
        CK(cudaMemcpy(dst, src, n * 2, cudaMemcpyHostToDevice));
        if (dt == ST_F16) AC_LAUNCH(k_to_bf16, cv_blocks(n), 256, 0, 0, (unsigned short *)dst, dst, dt, n);
    } else
        for (size_t i = 0; i < n; i += stage_n) {
            size_t c = std::min(stage_n, n - i);
            CK(cudaMemcpy(stage, (const float *)src + i, c * sizeof(float), cudaMemcpyHostToDevice));
            AC_LAUNCH(k_to_bf16, cv_blocks(c), 256, 0, 0, (unsigned short *)dst + i, stage, dt, c);
        }
    CK(cudaGetLastError());
    return 0;
fail:
    return -1;
}

// ---------------------------------------------------------------- engine

struct layer_d {
    bf16 *wq, *wk, *wv, *wo, *wg, *wu, *wd;
    float *in_norm, *post_norm, *bq, *bk, *bv, *q_norm, *k_norm;
    bf16 *kc, *vc;
    bf16 *router;                   // MoE [E][H]
    std::vector<bf16 *> eg, eu, ed; // MoE: each expert's [Fe][H] [Fe][H] [H][Fe]
    // Mamba-2 (nemotron_h `M` layers): in_proj [SI][H], out_proj [H][di], the
    // fp32 conv, per-head and norm parameters, and the decode state of each
    // sequence (fp32, as the KV cache is for attention): conv [B][K-1][C],
    // SSM [B][nh][P][Ns]
    bf16 *ssm_in, *ssm_out;
    float *conv_w, *conv_b, *dt_bias, *a_log, *ssm_d, *ssm_norm, *conv_st, *ssm_st;
    // nemotron_h MoE (`E` layers): the shared expert's up [Fs][H] and down
    // [H][Fs], LatentMoE's down [Lt][H] and up [H][Lt]; the router's
    // score-correction bias on the host (the routing rule runs there)
    bf16 *sh_u, *sh_d, *lat_down, *lat_up;
    std::vector<float> rbias;
};

struct acc_engine {
    int dev, max_batch, max_ctx;
    ac_arch a;
    cublasHandle_t blas;
    cudaStream_t st;
    bf16 *embed, *lm_head, *xn, *att, *h, *yn; // yn: the gated norm's output (out_proj's input)
    float *final_norm, *x, *x2, *q, *k, *v, *g, *u, *logits, *cs, *sn, *nll;
    float *zx, *xbc, *y; // Mamba-2: in_proj's output, the conv's, the scan's
    float *su, *xl, *yl; // nemotron_h MoE: the shared expert's up projection; LatentMoE's latent rows in, out
    bf16 *cvt;           // BF16 copies of fp32 rows a GEMM or a gather reads (LatentMoE's latent rows)
    int *tok, *target;
    float *stage; // F32 uploads pass through it (stage_n elements)
    size_t stage_n;
    std::vector<layer_d> L;
    // MoE: an expert's gathered rows and SwiGLU, its output, the router's
    // logits, the routed rows and weights (device), and their host copies
    bf16 *mxe, *mh;
    float *mg, *mu, *my, *mlog, *mw;
    int *mrows;
    std::vector<float> hr, hw;
    std::vector<int> hrows, horder;
};

// Elements of the F32 upload's staging buffer (acc_put_bf16): 16 MiB at most.
static const size_t STAGE_MAX = (size_t)1 << 22;

// A new device BF16 buffer of n elements from the host tensor h in dtype dt.
static int upload_bf16(acc_engine *en, bf16 **d, const void *h, int dt, size_t n, char *err, size_t errn) {
    CK(cudaMalloc(d, n * sizeof(bf16)));
    return acc_put_bf16(*d, h, dt, n, en->stage, en->stage_n, err, errn);
fail:
    return -1;
}

static int upload_f32(float **d, const float *h, size_t n, char *err, size_t errn) {
    CK(cudaMalloc(d, n * sizeof(float)));
    CK(cudaMemcpy(*d, h, n * sizeof(float), cudaMemcpyHostToDevice));
    return 0;
fail:
    return -1;
}

// y[N,out] (fp32) = x[N,in] (bf16) W[out,in]^T (bf16), beta 0 or 1
static cublasStatus_t gemm(cublasHandle_t hdl, float *y, const bf16 *x, const bf16 *w, int N, int in, int out,
                           float beta) {
    float alpha = 1.0f;
    return cublasGemmEx(hdl, CUBLAS_OP_T, CUBLAS_OP_N, out, N, in, &alpha, w, CUDA_R_16BF, in, x, CUDA_R_16BF, in,
                        &beta, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

static int acc_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
    return n;
}

static int acc_device_info(int dev, char *name, size_t n, double *mem_gib, int *sms, int *cc) {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) return -1;
    size_t l = strnlen(p.name, sizeof p.name);
    if (n) {
        if (l >= n) l = n - 1;
        memcpy(name, p.name, l);
        name[l] = 0;
    }
    *mem_gib = p.totalGlobalMem / 1073741824.0;
    *sms = p.multiProcessorCount;
    *cc = p.major * 10 + p.minor;
    return 0;
}

static void acc_engine_free(acc_engine *en) {
    if (!en) return;
    cudaSetDevice(en->dev);
    for (auto &l : en->L) {
        void *ps[] = {l.wq,      l.wk,     l.wv,     l.wo,     l.wg,      l.wu,       l.wd,     l.in_norm,
                      l.post_norm, l.bq,     l.bk,     l.bv,     l.q_norm,  l.k_norm,   l.kc,     l.vc,
                      l.router,    l.ssm_in, l.ssm_out, l.conv_w, l.conv_b, l.dt_bias, l.a_log, l.ssm_d,
                      l.ssm_norm,  l.conv_st, l.ssm_st,  l.sh_u,    l.sh_d,    l.lat_down, l.lat_up};
        for (void *p : ps) cudaFree(p);
        for (auto *v : {&l.eg, &l.eu, &l.ed})
            for (bf16 *p : *v) cudaFree(p);
    }
    void *ps[] = {en->embed, en->lm_head, en->xn,  en->att,    en->h,    en->final_norm, en->x,
                  en->x2,    en->q,       en->k,   en->v,      en->g,    en->u,          en->logits,
                  en->cs,    en->sn,      en->tok, en->target, en->nll,  en->stage,      en->mxe,
                  en->mh,    en->mg,      en->mu,  en->my,     en->mlog, en->mw,         en->mrows,
                  en->yn,    en->zx,      en->xbc, en->y,      en->su,   en->xl,         en->yl,
                  en->cvt};
    for (void *p : ps) cudaFree(p);
    if (en->blas) cublasDestroy(en->blas);
    if (en->st) cudaStreamDestroy(en->st);
    free(en->a.layers);
    delete en;
}

// Layer l's weights and KV cache on the device (matrices in m's dtype, converted there).
static int upload_layer(acc_engine *en, const ac_model *m, int l, char *err, size_t errn) {
    const ac_layer_arch *la = &en->a.layers[l];
    const ac_layer_w *w = &m->L[l];
    layer_d &d = en->L[l];
    size_t H = en->a.hidden, hd = en->a.head_dim, Q = la->n_heads * hd, KV = la->n_kv_heads * hd, F = la->ffn,
           N = (size_t)en->max_batch * en->max_ctx;
    int dt = acc_model_dt(m);
    if (la->n_heads) {
        if (upload_f32(&d.in_norm, w->in_norm, H, err, errn) || upload_bf16(en, &d.wq, w->wq, dt, Q * H, err, errn) ||
            upload_bf16(en, &d.wk, w->wk, dt, KV * H, err, errn) ||
            upload_bf16(en, &d.wv, w->wv, dt, KV * H, err, errn) || upload_bf16(en, &d.wo, w->wo, dt, H * Q, err, errn))
            return -1;
        if (en->a.qkv_bias && (upload_f32(&d.bq, w->bq, Q, err, errn) || upload_f32(&d.bk, w->bk, KV, err, errn) ||
                               upload_f32(&d.bv, w->bv, KV, err, errn)))
            return -1;
        if (en->a.qk_norm &&
            (upload_f32(&d.q_norm, w->q_norm, hd, err, errn) || upload_f32(&d.k_norm, w->k_norm, hd, err, errn)))
            return -1;
        CK(cudaMalloc(&d.kc, N * KV * sizeof(bf16)));
        CK(cudaMalloc(&d.vc, N * KV * sizeof(bf16)));
    }
    if (F && (upload_f32(&d.post_norm, w->post_norm, H, err, errn) ||
              (w->wg && upload_bf16(en, &d.wg, w->wg, dt, F * H, err, errn)) || // (nemotron_h's MLP has no gate)
              upload_bf16(en, &d.wu, w->wu, dt, F * H, err, errn) || upload_bf16(en, &d.wd, w->wd, dt, H * F, err, errn)))
        return -1;
    if (la->ssm_heads) {
        const ac_arch *a = &en->a;
        size_t nh = la->ssm_heads, di = nh * a->ssm_head_dim, C = di + 2 * (size_t)a->ssm_groups * a->ssm_state,
               SI = di + C + nh, K = a->ssm_conv, B = en->max_batch;
        if (upload_f32(&d.in_norm, w->in_norm, H, err, errn) ||
            upload_bf16(en, &d.ssm_in, w->ssm_in, dt, SI * H, err, errn) ||
            upload_bf16(en, &d.ssm_out, w->ssm_out, dt, H * di, err, errn) ||
            upload_f32(&d.conv_w, w->conv_w, C * K, err, errn) ||
            (w->conv_b && upload_f32(&d.conv_b, w->conv_b, C, err, errn)) ||
            upload_f32(&d.dt_bias, w->dt_bias, nh, err, errn) || upload_f32(&d.a_log, w->a_log, nh, err, errn) ||
            upload_f32(&d.ssm_d, w->ssm_d, nh, err, errn) || upload_f32(&d.ssm_norm, w->ssm_norm, di, err, errn))
            return -1;
        CK(cudaMalloc(&d.conv_st, std::max<size_t>(1, B * (K - 1) * C) * sizeof(float)));
        CK(cudaMalloc(&d.ssm_st, B * di * a->ssm_state * sizeof(float)));
    }
    if (la->n_experts) {
        const ac_arch *a = &en->a;
        size_t E = la->n_experts, Fe = la->expert_ffn, Fs = ac_block_dim(a, l, AC_DIM_FS),
               Lt = ac_block_dim(a, l, AC_DIM_LT), Hin = Lt ? Lt : H; // the experts' input width
        d.eg.assign(E, nullptr), d.eu.assign(E, nullptr), d.ed.assign(E, nullptr);
        if (upload_f32(&d.post_norm, w->post_norm, H, err, errn) ||
            upload_bf16(en, &d.router, w->router, dt, E * H, err, errn))
            return -1;
        for (size_t x = 0; x < E; x++) // (nemotron_h's experts have no gate)
            if ((w->eg && w->eg[x] && upload_bf16(en, &d.eg[x], w->eg[x], dt, Fe * Hin, err, errn)) ||
                upload_bf16(en, &d.eu[x], w->eu[x], dt, Fe * Hin, err, errn) ||
                upload_bf16(en, &d.ed[x], w->ed[x], dt, Hin * Fe, err, errn))
                return -1;
        if ((Fs && (upload_bf16(en, &d.sh_u, w->sh_u, dt, Fs * H, err, errn) ||
                    upload_bf16(en, &d.sh_d, w->sh_d, dt, H * Fs, err, errn))) ||
            (Lt && (upload_bf16(en, &d.lat_down, w->lat_down, dt, Lt * H, err, errn) ||
                    upload_bf16(en, &d.lat_up, w->lat_up, dt, H * Lt, err, errn))))
            return -1;
        if (w->router_bias) d.rbias.assign(w->router_bias, w->router_bias + E);
    }
    return 0;
fail:
    return -1;
}

static int acc_engine_create(int dev, const ac_model *m, int max_batch, int max_ctx, const float *rope_cos,
                             const float *rope_sin, acc_engine **out, char *err, size_t errn) {
    const ac_arch *a = &m->a;
    if (a->hybrid && (a->ssm_conv < 1 || a->ssm_conv > ACC_SSM_MAX_K)) {
        snprintf(err, errn, "conv kernel %d: the CUDA Mamba-2 conv takes 1 to %d", a->ssm_conv, ACC_SSM_MAX_K);
        return -1;
    }
    acc_engine *en = new acc_engine();
    memset(&en->a, 0, sizeof en->a);
    en->dev = dev;
    en->max_batch = max_batch;
    en->max_ctx = max_ctx;
    en->a = *a;
    en->a.layers = (ac_layer_arch *)malloc(sizeof(ac_layer_arch) * a->n_layers);
    memcpy(en->a.layers, a->layers, sizeof(ac_layer_arch) * a->n_layers);
    size_t H = a->hidden, hd = a->head_dim, V = a->vocab, N = (size_t)max_batch * max_ctx, maxq = 1, maxkv = 1,
           maxf = 1;
    for (int l = 0; l < a->n_layers; l++) {
        maxq = std::max(maxq, (size_t)a->layers[l].n_heads * hd);
        maxkv = std::max(maxkv, (size_t)a->layers[l].n_kv_heads * hd);
        maxf = std::max(maxf, (size_t)a->layers[l].ffn);
    }
    en->stage_n = std::min(STAGE_MAX, std::max(V, std::max(maxq, maxf)) * H);
    if (hd > ATTN_MAX_HD || hd % 2) {
        snprintf(err, errn, "head_dim %zu: the attention kernel takes even head dims up to %d", hd, ATTN_MAX_HD);
        free(en->a.layers);
        delete en;
        return -1;
    }
    en->L.resize(a->n_layers);
    CK(cudaSetDevice(dev));
    CK(cudaStreamCreate(&en->st));
    CB(cublasCreate(&en->blas));
    CB(cublasSetStream(en->blas, en->st));
    CK(cudaMalloc(&en->stage, en->stage_n * sizeof(float)));
    if (upload_bf16(en, &en->embed, m->embed, acc_model_dt(m), V * H, err, errn) ||
        upload_bf16(en, &en->lm_head, m->lm_head, acc_model_dt(m), V * H, err, errn) ||
        upload_f32(&en->final_norm, m->final_norm, H, err, errn))
        goto fail;
    for (int l = 0; l < a->n_layers; l++)
        if (upload_layer(en, m, l, err, errn)) goto fail;
    CK(cudaMalloc(&en->x, N * H * 4));
    CK(cudaMalloc(&en->x2, (size_t)max_batch * H * 4));
    CK(cudaMalloc(&en->xn, N * H * 2));
    CK(cudaMalloc(&en->q, N * maxq * 4));
    CK(cudaMalloc(&en->att, N * maxq * 2));
    CK(cudaMalloc(&en->k, N * maxkv * 4));
    CK(cudaMalloc(&en->v, N * maxkv * 4));
    if (ac_block_dim_max(a, AC_DIM_E) > 1 || a->layers[0].n_experts) { // MoE: an expert's rows, SwiGLU, output
        size_t E = ac_block_dim_max(a, AC_DIM_E), Fe = ac_block_dim_max(a, AC_DIM_FE);
        // the experts' rows are hidden wide, or LatentMoE's latent wide: wider than hidden in a model pruned to a
        // hidden size under its latent (the engine method's hidden-width curve)
        size_t Hx = std::max(H, (size_t)ac_block_dim_max(a, AC_DIM_LT));
        CK(cudaMalloc(&en->mxe, N * Hx * 2));
        CK(cudaMalloc(&en->mh, N * Fe * 2));
        CK(cudaMalloc(&en->mg, N * Fe * 4));
        CK(cudaMalloc(&en->mu, N * Fe * 4));
        CK(cudaMalloc(&en->my, N * Hx * 4));
        CK(cudaMalloc(&en->mlog, N * E * 4));
        CK(cudaMalloc(&en->mw, N * 4));
        CK(cudaMalloc(&en->mrows, N * sizeof(int)));
        en->hr.resize(N * E), en->hw.resize(N), en->hrows.resize(N), en->horder.resize(std::max(N, E));
    }
    if (a->hybrid) { // Mamba-2 slots: in_proj's output, conv, scan, gated norm
        size_t SI = ac_block_dim_max(a, AC_DIM_SI), C = ac_block_dim_max(a, AC_DIM_SC),
               di = ac_block_dim_max(a, AC_DIM_SSM);
        CK(cudaMalloc(&en->zx, N * SI * 4));
        CK(cudaMalloc(&en->xbc, N * C * 4));
        CK(cudaMalloc(&en->y, N * di * 4));
        CK(cudaMalloc(&en->yn, N * di * 2));
    }
    if (a->hybrid && ac_block_dim_max(a, AC_DIM_FS) > 1) { // nemotron_h MoE: the shared expert, LatentMoE's rows
        size_t Fs = ac_block_dim_max(a, AC_DIM_FS), Lt = ac_block_dim_max(a, AC_DIM_LT);
        maxf = std::max(maxf, Fs); // (its relu^2 goes through h)
        CK(cudaMalloc(&en->su, N * Fs * 4));
        CK(cudaMalloc(&en->xl, N * Lt * 4));
        CK(cudaMalloc(&en->yl, N * Lt * 4));
        CK(cudaMalloc(&en->cvt, N * Lt * 2));
    }
    CK(cudaMalloc(&en->g, N * maxf * 4));
    CK(cudaMalloc(&en->u, N * maxf * 4));
    CK(cudaMalloc(&en->h, N * maxf * 2));
    CK(cudaMalloc(&en->logits, std::min(N, (size_t)AC_LOGIT_ROWS) * V * 4));
    CK(cudaMalloc(&en->tok, N * sizeof(int)));
    CK(cudaMalloc(&en->target, N * sizeof(int)));
    CK(cudaMalloc(&en->nll, N * sizeof(float)));
    if (upload_f32(&en->cs, rope_cos, (size_t)max_ctx * hd / 2, err, errn) ||
        upload_f32(&en->sn, rope_sin, (size_t)max_ctx * hd / 2, err, errn))
        goto fail;
    *out = en;
    return 0;
fail:
    acc_engine_free(en);
    return -1;
}

// Layer l's weights by the recipe's names (block.h).
static const bf16 *dmat(const layer_d &d, int w) {
    const bf16 *m[] = {d.wq, d.wk, d.wv, d.wo, d.wg, d.wu, d.wd, d.ssm_in, d.ssm_out, d.sh_u, d.sh_d, d.lat_down, d.lat_up};
    return w >= 0 && w < (int)(sizeof m / sizeof *m) ? m[w] : nullptr;
}
static const float *dbias(const layer_d &d, int w) {
    return w == AC_W_Q ? d.bq : w == AC_W_K ? d.bk : w == AC_W_V ? d.bv : nullptr;
}

// Layer l of the forward: its block recipe (block.h) with each op on the
// device. A slot holds fp32 rows, or BF16 ones where the op makes what a
// GEMM reads next (the norms' output, attention, SwiGLU); KV-merge and mask
// points are the search's and not run here.
static int layer_forward(acc_engine *en, int l, int B, int n, int pos0, char *err, size_t errn) {
    const ac_arch *a = &en->a;
    const ac_subblock *subs = ac_block_recipe_of(a, l)->sub;
    int nsub = ac_block_recipe_of(a, l)->n_sub, hd = a->head_dim, N = B * n, dim[AC_DIM_COUNT];
    layer_d &d = en->L[l];
    cudaStream_t s = en->st;
    (void)s; // unused where the launches ignore streams (tests/cuda_emu)
    for (int i = 0; i < AC_DIM_COUNT; i++) dim[i] = ac_block_dim(a, l, (ac_dim)i);
    float *fbuf[AC_T_COUNT] = {en->x, nullptr, en->q, en->k, en->v, nullptr, en->g, en->u};
    fbuf[AC_T_ZX] = en->zx, fbuf[AC_T_XBC] = en->xbc, fbuf[AC_T_Y] = en->y;
    fbuf[AC_T_SU] = en->su, fbuf[AC_T_XL] = en->xl, fbuf[AC_T_YL] = en->yl;
    float *cf[AC_T_COUNT]; // a slot's current fp32 rows, or
    bf16 *ch[AC_T_COUNT];  // its current BF16 rows
    for (int i = 0; i < AC_T_COUNT; i++) cf[i] = fbuf[i], ch[i] = nullptr;
    for (int sb = 0; sb < nsub; sb++) {
        if (!ac_block_sub_present(a, l, &subs[sb])) continue;
        for (int i = 0; i < subs[sb].n_ops; i++) {
            const ac_op *op = &subs[sb].ops[i];
            int dout = dim[op->dout];
            switch ((ac_op_kind)op->kind) {
            case AC_OP_RMSNORM:
                AC_LAUNCH(k_rmsnorm, N, 256, 0, s, en->xn, cf[op->in], op->w == AC_NORM_IN ? d.in_norm : d.post_norm,
                          dim[AC_DIM_H], a->eps);
                ch[op->out] = en->xn;
                break;
            case AC_OP_LINEAR:
                if (!ch[op->in]) { // fp32 rows (LatentMoE's experts' sum): a BF16 copy for the GEMM
                    size_t c = (size_t)N * dim[op->din];
                    AC_LAUNCH(k_f32_to_bf16, (unsigned)((c + 255) / 256), 256, 0, s, en->cvt, cf[op->in], c);
                    ch[op->in] = en->cvt;
                }
                if (!op->acc) cf[op->out] = fbuf[op->out];
                CB(gemm(en->blas, cf[op->out], ch[op->in], dmat(d, op->w), N, dim[op->din], dout, op->acc ? 1 : 0));
                if (dbias(d, op->w))
                    AC_LAUNCH(k_bias, (N * dout + 255) / 256, 256, 0, s, cf[op->out], dbias(d, op->w), dout, N);
                break;
            case AC_OP_ROPE:
                AC_LAUNCH(k_rope, N, 128, 0, s, cf[op->out], dim[op->heads] / hd, hd, n, pos0, en->cs, en->sn);
                break;
            case AC_OP_HEAD_NORM: // in place on the fp32 rows of q or k
                AC_LAUNCH(k_head_norm, N * (dim[op->heads] / hd), 64, 0, s, cf[op->out],
                          op->w == AC_NORM_Q ? d.q_norm : d.k_norm, hd, a->eps);
                break;
            case AC_OP_ATTENTION: {
                const ac_layer_arch *la = &a->layers[l];
                AC_LAUNCH(k_store_kv, N, 128, 0, s, d.kc, d.vc, cf[op->in2], cf[op->in3], dim[AC_DIM_KV], n, pos0,
                          en->max_ctx);
                AC_LAUNCH(k_attention, dim3(N, la->n_heads), ATTN_THREADS, attn_shared_bytes(hd), s, en->att,
                          cf[op->in], d.kc, d.vc, la->n_heads, la->n_kv_heads, hd, n, pos0, en->max_ctx,
                          1.0f / sqrtf((float)hd), a->sliding_window);
                ch[op->out] = en->att;
                break;
            }
            case AC_OP_SWIGLU:
                AC_LAUNCH(k_silu_mul, (unsigned)(((size_t)N * dout + 255) / 256), 256, 0, s, en->h, cf[op->out],
                          cf[op->in], (size_t)N * dout);
                ch[op->out] = en->h;
                break;
            case AC_OP_ROUTE: { // the router's logits on the device, the routing rule (block.h) on the host
                int E = dim[AC_DIM_E];
                CB(gemm(en->blas, en->mlog, ch[op->in], d.router, N, dim[AC_DIM_H], E, 0));
                CK(cudaMemcpy(en->hr.data(), en->mlog, (size_t)N * E * 4, cudaMemcpyDeviceToHost));
                if (a->router_sigmoid) // nemotron_h: sigmoid, the correction bias to choose, the routed scale
                    ac_moe_route_sigmoid(en->hr.data(), d.rbias.empty() ? nullptr : d.rbias.data(), nullptr, N, E,
                                         a->top_k, a->norm_topk, a->routed_scale, en->horder.data());
                else
                    ac_moe_route(en->hr.data(), nullptr, N, E, a->top_k, a->norm_topk, en->horder.data());
                break;
            }
            case AC_OP_EXPERTS: { // each expert on its rows: gather, SwiGLU (nemotron_h: relu(up)^2), down, weighted add
                int E = dim[AC_DIM_E], Fe = dim[AC_DIM_FE], H = dim[op->din];
                if (!op->acc) { // LatentMoE: the experts' sum in its own slot
                    cf[op->out] = fbuf[op->out];
                    CK(cudaMemset(cf[op->out], 0, (size_t)N * H * 4));
                }
                if (!ch[op->in]) { // LatentMoE's latent rows (fp32): a BF16 copy to gather from
                    AC_LAUNCH(k_f32_to_bf16, (unsigned)(((size_t)N * H + 255) / 256), 256, 0, s, en->cvt, cf[op->in],
                              (size_t)N * H);
                    ch[op->in] = en->cvt;
                }
                for (int e = 0; e < E; e++) {
                    int ne = 0;
                    for (int i2 = 0; i2 < N; i2++)
                        if (en->hr[(size_t)i2 * E + e] != 0)
                            en->hrows[ne] = i2, en->hw[ne] = en->hr[(size_t)i2 * E + e], ne++;
                    if (!ne) continue;
                    CK(cudaMemcpy(en->mrows, en->hrows.data(), ne * sizeof(int), cudaMemcpyHostToDevice));
                    CK(cudaMemcpy(en->mw, en->hw.data(), ne * sizeof(float), cudaMemcpyHostToDevice));
                    AC_LAUNCH(k_gather_rows, ne, 128, 0, s, en->mxe, ch[op->in], en->mrows, H);
                    CB(gemm(en->blas, en->mu, en->mxe, d.eu[e], ne, H, Fe, 0));
                    if (a->hybrid)
                        acc_relu2_fwd(nullptr, en->mh, en->mu, (size_t)ne * Fe, s);
                    else {
                        CB(gemm(en->blas, en->mg, en->mxe, d.eg[e], ne, H, Fe, 0));
                        AC_LAUNCH(k_silu_mul, (unsigned)(((size_t)ne * Fe + 255) / 256), 256, 0, s, en->mh, en->mg,
                                  en->mu, (size_t)ne * Fe);
                    }
                    CB(gemm(en->blas, en->my, en->mh, d.ed[e], ne, Fe, H, 0));
                    AC_LAUNCH(k_scatter_add, ne, 128, 0, s, cf[op->out], en->my, en->mrows, en->mw, H);
                }
                break;
            }
            case AC_OP_KV_MERGE:
            case AC_OP_MASK:
            case AC_OP_MASK_HIDDEN: break;
            case AC_OP_RELU2: // into BF16 rows: the down projection's input
                acc_relu2_fwd(nullptr, en->h, cf[op->in], (size_t)N * dout, s);
                ch[op->out] = en->h;
                break;
            case AC_OP_SSM_CONV: // the decode state continues from the previous call past position 0
            case AC_OP_SSM_SCAN:
            case AC_OP_GATED_NORM: {
                acc_ssm ss = {a->layers[l].ssm_heads, a->ssm_head_dim, a->ssm_state, a->ssm_groups, a->ssm_conv,
                              d.conv_w, d.conv_b, d.dt_bias, d.a_log, d.ssm_d, d.ssm_norm, a->eps, NULL, NULL};
                if (op->kind == AC_OP_SSM_CONV)
                    acc_ssm_conv_fwd(&ss, cf[op->out], cf[op->in], B, n, d.conv_st, pos0 > 0, s);
                else if (op->kind == AC_OP_SSM_SCAN)
                    acc_ssm_scan_fwd(&ss, cf[op->out], cf[op->in], cf[op->in2], B, n, d.ssm_st, pos0 > 0, s);
                else {
                    acc_ssm_gated_norm_fwd(&ss, nullptr, en->yn, cf[op->in], cf[op->in2], N, s);
                    ch[op->out] = en->yn;
                }
                break;
            }
            }
        }
    }
    return 0;
fail:
    return -1;
}

// The forward up to the final norm, left on the device in en->xn (B rows
// when last_only, else B*n); the head runs in chunks (head_chunk). Returns
// the number of rows, or -1.
static int forward_device(acc_engine *en, const int *tokens, int B, int n, int pos0, int last_only, char *err,
                          size_t errn) {
    const ac_arch *a = &en->a;
    int H = a->hidden, N = B * n, rows;
    cudaStream_t s = en->st;
    float *xf;
    if (B <= 0 || B > en->max_batch || n <= 0 || pos0 < 0 || pos0 + n > en->max_ctx) {
        snprintf(err, errn, "batch %d x %d tokens at position %d exceeds the engine (%d x %d)", B, n, pos0,
                 en->max_batch, en->max_ctx);
        return -1;
    }
    CK(cudaSetDevice(en->dev));
    CK(cudaMemcpyAsync(en->tok, tokens, N * sizeof(int), cudaMemcpyHostToDevice, s));
    AC_LAUNCH(k_embed, N, 128, 0, s, en->x, en->embed, en->tok, H);
    for (int l = 0; l < a->n_layers; l++)
        if (layer_forward(en, l, B, n, pos0, err, errn)) goto fail;
    rows = last_only ? B : N;
    xf = en->x;
    if (last_only) {
        AC_LAUNCH(k_gather_last, B, 128, 0, s, en->x2, en->x, H, n);
        xf = en->x2;
    }
    AC_LAUNCH(k_rmsnorm, rows, 256, 0, s, en->xn, xf, en->final_norm, H, a->eps);
    CK(cudaGetLastError());
    return rows;
fail:
    return -1;
}

// Logits of normed rows [r0, r0 + c) into en->logits (c <= AC_LOGIT_ROWS).
static cublasStatus_t head_chunk(acc_engine *en, int r0, int c) {
    return gemm(en->blas, en->logits, en->xn + (size_t)r0 * en->a.hidden, en->lm_head, c, en->a.hidden, en->a.vocab, 0);
}

static int acc_engine_forward(acc_engine *en, const int *tokens, int B, int n, int pos0, int last_only, float *logits,
                              char *err, size_t errn) {
    int rows = forward_device(en, tokens, B, n, pos0, last_only, err, errn);
    if (rows < 0) return -1;
    for (int r0 = 0; r0 < rows; r0 += AC_LOGIT_ROWS) {
        int c = std::min(AC_LOGIT_ROWS, rows - r0);
        CB(head_chunk(en, r0, c));
        CK(cudaMemcpyAsync(logits + (size_t)r0 * en->a.vocab, en->logits, (size_t)c * en->a.vocab * sizeof(float),
                           cudaMemcpyDeviceToHost, en->st));
    }
    CK(cudaStreamSynchronize(en->st));
    return 0;
fail:
    return -1;
}

static int acc_engine_update(acc_engine *en, int layer, int which, const void *w, int dtype, size_t n, char *err,
                             size_t errn) {
    if (layer < 0 || layer >= en->a.n_layers) {
        snprintf(err, errn, "no layer %d", layer);
        return -1;
    }
    const ac_layer_arch *la = &en->a.layers[layer];
    layer_d &d = en->L[layer];
    size_t H = en->a.hidden, Q = (size_t)la->n_heads * en->a.head_dim, KV = (size_t)la->n_kv_heads * en->a.head_dim,
           F = la->ffn, want = 0;
    bf16 *dst = nullptr;
    switch (which) {
    case AC_W_Q:
        dst = d.wq;
        want = Q * H;
        break;
    case AC_W_K:
        dst = d.wk;
        want = KV * H;
        break;
    case AC_W_V:
        dst = d.wv;
        want = KV * H;
        break;
    case AC_W_O:
        dst = d.wo;
        want = H * Q;
        break;
    case AC_W_G:
        dst = d.wg;
        want = F * H;
        break;
    case AC_W_U:
        dst = d.wu;
        want = F * H;
        break;
    case AC_W_D:
        dst = d.wd;
        want = H * F;
        break;
    case AC_W_SSM_IN:
        dst = d.ssm_in;
        want = (size_t)ac_block_dim(&en->a, layer, AC_DIM_SI) * H;
        break;
    case AC_W_SSM_OUT:
        dst = d.ssm_out;
        want = H * ac_block_dim(&en->a, layer, AC_DIM_SSM);
        break;
    case AC_W_SH_U:
    case AC_W_SH_D:
        dst = which == AC_W_SH_U ? d.sh_u : d.sh_d;
        want = H * ac_block_dim(&en->a, layer, AC_DIM_FS);
        break;
    case AC_W_LAT_DOWN:
    case AC_W_LAT_UP:
        dst = which == AC_W_LAT_DOWN ? d.lat_down : d.lat_up;
        want = H * ac_block_dim(&en->a, layer, AC_DIM_LT);
        break;
    }
    if (!dst || n != want) {
        snprintf(err, errn, "layer %d has no matrix %d of %zu elements", layer, which, n);
        return -1;
    }
    CK(cudaSetDevice(en->dev));
    return acc_put_bf16(dst, w, dtype, n, en->stage, en->stage_n, err, errn);
fail:
    return -1;
}

static int acc_engine_nll(acc_engine *en, const int *tokens, const int *targets, int B, int n, int pos0, float *nll,
                          char *err, size_t errn) {
    for (int i = 0; B > 0 && n > 0 && i < B * n; i++) // checked before any work is done
        if (targets[i] >= en->a.vocab) {
            snprintf(err, errn, "target %d at row %d is outside the vocabulary (%d)", targets[i], i, en->a.vocab);
            return -1;
        }
    int rows = forward_device(en, tokens, B, n, pos0, 0, err, errn);
    if (rows < 0) return -1;
    CK(cudaMemcpyAsync(en->target, targets, (size_t)rows * sizeof(int), cudaMemcpyHostToDevice, en->st));
    for (int r0 = 0; r0 < rows; r0 += AC_LOGIT_ROWS) {
        int c = std::min(AC_LOGIT_ROWS, rows - r0);
        CB(head_chunk(en, r0, c));
        AC_LAUNCH(k_nll, c, 256, 0, en->st, en->nll + r0, en->logits, en->target + r0, en->a.vocab);
    }
    CK(cudaGetLastError());
    CK(cudaMemcpyAsync(nll, en->nll, (size_t)rows * sizeof(float), cudaMemcpyDeviceToHost, en->st));
    CK(cudaStreamSynchronize(en->st));
    return 0;
fail:
    return -1;
}

// ---------------------------------------------------------------- micro-benchmarks

static const size_t POOL_BYTES = (size_t)512 << 20; // larger than any L2: weights read cold

// Buffers and handles for a run of GEMM timings, allocated once for the
// largest shape (cublasCreate and half-gigabyte allocations per point would
// dominate a table's measurement time).
struct gemm_bench {
    cublasHandle_t h = nullptr;
    bf16 *pool = nullptr, *x = nullptr;
    float *y = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
};

static void gemm_bench_free(gemm_bench &b) {
    if (b.e0) cudaEventDestroy(b.e0);
    if (b.e1) cudaEventDestroy(b.e1);
    cudaFree(b.pool);
    cudaFree(b.x);
    cudaFree(b.y);
    if (b.h) cublasDestroy(b.h);
    b = gemm_bench();
}

static int gemm_bench_init(gemm_bench &b, int dev, size_t max_mk, size_t max_mn, char *err, size_t errn) {
    CK(cudaSetDevice(dev));
    CB(cublasCreate(&b.h));
    CK(cudaMalloc(&b.pool, POOL_BYTES));
    CK(cudaMalloc(&b.x, max_mk * 2));
    CK(cudaMalloc(&b.y, max_mn * 4));
    CK(cudaMemset(b.pool, 0, POOL_BYTES));
    CK(cudaMemset(b.x, 0, max_mk * 2));
    CK(cudaEventCreate(&b.e0));
    CK(cudaEventCreate(&b.e1));
    return 0;
fail:
    gemm_bench_free(b);
    return -1;
}

// Mean of 20 calls, weights rotating through the pool (cold), after a warm-up.
static int gemm_bench_time(gemm_bench &b, int m, int n, int k, double *us, char *err, size_t errn) {
    size_t wsz = (size_t)n * k, slots = std::max<size_t>(1, POOL_BYTES / (wsz * 2));
    const int reps = 20;
    float ms = 0;
    if (wsz * 2 > POOL_BYTES) {
        snprintf(err, errn, "GEMM %dx%d weights exceed the benchmark pool", n, k);
        return -1;
    }
    CB(gemm(b.h, b.y, b.x, b.pool, m, k, n, 0)); // warm-up (library heuristics, clocks)
    CK(cudaEventRecord(b.e0));
    for (int r = 0; r < reps; r++) CB(gemm(b.h, b.y, b.x, b.pool + (r % slots) * wsz, m, k, n, 0));
    CK(cudaEventRecord(b.e1));
    CK(cudaEventSynchronize(b.e1));
    CK(cudaEventElapsedTime(&ms, b.e0, b.e1));
    *us = ms * 1e3 / reps;
    return 0;
fail:
    return -1;
}

static int acc_time_gemm(int dev, int m, int n, int k, double *us, char *err, size_t errn) {
    gemm_bench b;
    if (gemm_bench_init(b, dev, (size_t)m * k, (size_t)m * n, err, errn)) return -1;
    int rc = gemm_bench_time(b, m, n, k, us, err, errn);
    gemm_bench_free(b);
    return rc;
}

static int time_attention(int nq, int extra, int hd, double *us, char *err, size_t errn) {
    int S = nq + extra - 1, nh = 8, nkv = 8, KV = nkv * hd;
    float *q = nullptr, ms = 0;
    bf16 *kc = nullptr, *vc = nullptr, *out = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    CK(cudaMalloc(&q, (size_t)nq * nh * hd * 4));
    CK(cudaMalloc(&kc, (size_t)S * KV * 2));
    CK(cudaMalloc(&vc, (size_t)S * KV * 2));
    CK(cudaMalloc(&out, (size_t)nq * nh * hd * 2));
    CK(cudaMemset(q, 0, (size_t)nq * nh * hd * 4));
    CK(cudaMemset(kc, 0, (size_t)S * KV * 2));
    CK(cudaMemset(vc, 0, (size_t)S * KV * 2));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    AC_LAUNCH(k_attention, dim3(nq, nh), ATTN_THREADS, attn_shared_bytes(hd), 0, out, q, kc, vc, nh, nkv, hd, nq,
              extra - 1, S, 0.1f, 0);
    CK(cudaEventRecord(e0));
    for (int r = 0; r < 10; r++)
        AC_LAUNCH(k_attention, dim3(nq, nh), ATTN_THREADS, attn_shared_bytes(hd), 0, out, q, kc, vc, nh, nkv, hd, nq,
                  extra - 1, S, 0.1f, 0);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaGetLastError());
    CK(cudaEventElapsedTime(&ms, e0, e1));
    *us = ms * 1e3 / 10 / nh; // per head, one sequence
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(q);
    cudaFree(kc);
    cudaFree(vc);
    cudaFree(out);
    return 0;
fail:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(q);
    cudaFree(kc);
    cudaFree(vc);
    cudaFree(out);
    return -1;
}

static int acc_measure_timings(int dev, acc_timings *t, char *err, size_t errn) {
    memset(t, 0, sizeof *t);
    static const double GM[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096};
    static const double GNK[] = {256, 512, 1024, 2048, 4096, 8192, 16384};
    static const double AQ[] = {1, 16, 256, 2048}, AS[] = {1, 256, 2048, 8192}, AHD[] = {64, 128};
    float ms = 0;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    if (acc_device_info(dev, t->name, sizeof t->name, &t->mem_gib, &t->sms, &t->cc)) {
        snprintf(err, errn, "no CUDA device %d", dev);
        return -1;
    }
    t->nm = 12;
    t->nn = t->nk = 7;
    t->naq = 4;
    t->nas = 4;
    t->nhd = 2;
    memcpy(t->gm, GM, sizeof GM);
    memcpy(t->gn, GNK, sizeof GNK);
    memcpy(t->gk, GNK, sizeof GNK);
    memcpy(t->aq, AQ, sizeof AQ);
    memcpy(t->as, AS, sizeof AS);
    memcpy(t->ahd, AHD, sizeof AHD);
    {
        gemm_bench gb;
        size_t mmax = (size_t)GM[t->nm - 1], nmax = (size_t)GNK[t->nn - 1];
        if (gemm_bench_init(gb, dev, mmax * nmax, mmax * nmax, err, errn)) goto fail;
        for (int a = 0; a < t->nm; a++)
            for (int b = 0; b < t->nn; b++)
                for (int c = 0; c < t->nk; c++)
                    if (gemm_bench_time(gb, (int)GM[a], (int)GNK[b], (int)GNK[c],
                                        &t->gemm_us[(a * t->nn + b) * t->nk + c], err, errn)) {
                        gemm_bench_free(gb);
                        goto fail;
                    }
        gemm_bench_free(gb);
    }
    for (int h = 0; h < t->nhd; h++)
        for (int a = 0; a < t->naq; a++)
            for (int b = 0; b < t->nas; b++)
                if (time_attention((int)AQ[a], (int)AS[b], (int)AHD[h], &t->attn_us[(h * t->naq + a) * t->nas + b], err,
                                   errn))
                    goto fail;
    // launch overhead and elementwise throughput
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    AC_LAUNCH(k_empty, 1, 1, 0, 0);
    CK(cudaEventRecord(e0));
    for (int r = 0; r < 1000; r++) AC_LAUNCH(k_empty, 1, 1, 0, 0);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    t->launch_us = ms * 1e3 / 1000;
    {
        const int R = 4096, H = 8192;
        float *x = nullptr, *w = nullptr;
        bf16 *o = nullptr;
        CK(cudaMalloc(&x, (size_t)R * H * 4));
        CK(cudaMalloc(&w, (size_t)H * 4));
        CK(cudaMalloc(&o, (size_t)R * H * 2));
        CK(cudaMemset(x, 0, (size_t)R * H * 4));
        CK(cudaMemset(w, 0, (size_t)H * 4));
        AC_LAUNCH(k_rmsnorm, R, 256, 0, 0, o, x, w, H, 1e-5f);
        CK(cudaEventRecord(e0));
        for (int r = 0; r < 10; r++) AC_LAUNCH(k_rmsnorm, R, 256, 0, 0, o, x, w, H, 1e-5f);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t->elem_ns = ms * 1e6 / 10 / ((double)R * H);
        cudaFree(x);
        cudaFree(w);
        cudaFree(o);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return 0;
fail:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return -1;
}

// The upload's conversion on its own (tests): host -> device in src_dt,
// converted there -> host in dst_dt. A 4,099-element stage, so F32 sources
// of test sizes go through it in several chunks.
static int acc_convert(int dev, void *dst, int dst_dt, const void *src, int src_dt, size_t n, char *err, size_t errn) {
    void *d = nullptr;
    float *stage = nullptr;
    size_t stage_n = std::max<size_t>(1, std::min<size_t>(n, 4099));
    int rc = -1;
    if (dst_dt != ST_F32 && dst_dt != ST_BF16) {
        snprintf(err, errn, "convert: the device holds weights in F32 or BF16, not dtype %d", dst_dt);
        return -1;
    }
    CK(cudaSetDevice(dev));
    CK(cudaMalloc(&d, std::max<size_t>(n, 1) * (dst_dt == ST_F32 ? 4 : 2)));
    CK(cudaMalloc(&stage, std::max(stage_n, n / 2 + 1) * sizeof(float)));
    if (dst_dt == ST_F32 ? acc_put_f32((float *)d, src, src_dt, n, stage, err, errn)
                         : acc_put_bf16(d, src, src_dt, n, stage, stage_n, err, errn))
        goto fail;
    CK(cudaMemcpy(dst, d, n * (dst_dt == ST_F32 ? 4 : 2), cudaMemcpyDeviceToHost));
    rc = 0;
fail:
    cudaFree(d);
    cudaFree(stage);
    return rc;
}

extern "C" int acc_abi_version(void) { return ACC_ABI_VERSION; }

extern "C" const ac_cuda_api *acc_api(void) {
    static const ac_cuda_api api = {acc_device_count,     acc_device_info,       acc_engine_create, acc_engine_forward,
                                    acc_engine_nll,       acc_engine_update,     acc_engine_free,   acc_time_gemm,
                                    acc_measure_timings,  acc_trainer_create,    acc_trainer_grad,  acc_trainer_step,
                                    acc_trainer_download, acc_trainer_gates,     acc_trainer_free,  acc_trainer_forward,
                                    acc_trainer_tensor,   acc_trainer_zero_grad, acc_convert,       acc_op_test};
    return &api;
}
