// ac_cuda_ssm.cu - see ac_cuda_ssm_int.h. Notation as src/runtime/ssm_cpu.c:
// di = nh*P inner width, C = di + 2GN conv channels, SI = di + C + nh in_proj
// columns; head h reads group g = h / (nh/G) of B and C.
#include "ac_cuda_ssm_int.h"

#ifndef AC_CUDA_EMU
// Launches and dynamic shared memory go through these macros so that
// tests/cuda_emu can compile this file for the CPU and run its kernels.
#define AC_LAUNCH(k, grid, block, shm, stream, ...) k<<<(grid), (block), (shm), (stream)>>>(__VA_ARGS__)
#endif

#include <cmath>

#include "ac_cuda_reduce_int.h"

typedef __nv_bfloat16 bf16;

// Threads of the block kernels (a multiple of 32).
#define SSM_TB 64

static unsigned nblk(size_t n) { return (unsigned)((n + 255) / 256); }

static __device__ float ssm_sigm(float x) { return 1.0f / (1.0f + expf(-x)); }
static __device__ float ssm_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }


// ---------------------------------------------------------------- conv

// One thread per (sequence b, channel c): the last K-1 inputs in a window.
__global__ void ks_conv_fwd(float *out, const float *zx, const float *w, const float *bias, float *cst, int cont,
                            int B, int n, int C, int di, int SI, int K) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)B * C) return;
    int b = (int)(i / C), c = (int)(i % C);
    float win[ACC_SSM_MAX_K];
    for (int k = 0; k < K - 1; k++)
        win[k] = cst && cont ? cst[((size_t)b * (K - 1) + k) * C + c] : 0.0f;
    const float *wc = w + (size_t)c * K;
    float b0 = bias ? bias[c] : 0.0f;
    for (int t = 0; t < n; t++) {
        size_t row = (size_t)b * n + t;
        float v = zx[row * SI + di + c], acc = b0 + wc[K - 1] * v;
        for (int k = 0; k < K - 1; k++) acc += wc[k] * win[k];
        out[row * C + c] = acc * ssm_sigm(acc);
        for (int k = 0; k + 1 < K - 1; k++) win[k] = win[k + 1];
        if (K > 1) win[K - 2] = v;
    }
    for (int k = 0; cst && k < K - 1; k++) cst[((size_t)b * (K - 1) + k) * C + c] = win[k];
}

void acc_ssm_conv_fwd(const acc_ssm *s, float *out, const float *zx, int B, int n, float *cst, int cont,
                      cudaStream_t st) {
    (void)st; // (the emulator runs every launch in order)
    int C = acc_ssm_c(s);
    AC_LAUNCH(ks_conv_fwd, nblk((size_t)B * C), 256, 0, st, out, zx, s->conv_w, s->conv_b, cst, cont, B, n, C,
              acc_ssm_di(s), acc_ssm_si(s), s->K);
}

// Backward, one thread per channel c over every row: dp = dout silu'(pre),
// dconv_w[c][k] += dp * input, dconv_b[c] += dp, dzx's column written.
__global__ void ks_conv_bwd(float *dzx, float *dw, float *db, const float *dout, const float *zx, const float *w,
                            const float *bias, int B, int n, int C, int di, int SI, int K) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const float *wc = w + (size_t)c * K;
    float gw[ACC_SSM_MAX_K], gb = 0;
    for (int k = 0; k < K; k++) gw[k] = 0;
    for (size_t r = 0; r < (size_t)B * n; r++) dzx[r * SI + di + c] = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < n; t++) {
            size_t row = (size_t)b * n + t;
            float p = bias ? bias[c] : 0.0f;
            for (int k = 0; k < K; k++) {
                int j = t - (K - 1) + k;
                if (j >= 0) p += wc[k] * zx[((size_t)b * n + j) * SI + di + c];
            }
            float sg = ssm_sigm(p), dp = dout[row * C + c] * sg * (1.0f + p * (1.0f - sg));
            gb += dp;
            for (int k = 0; k < K; k++) {
                int j = t - (K - 1) + k;
                if (j < 0) continue;
                size_t at = ((size_t)b * n + j) * SI + di + c;
                gw[k] += dp * zx[at];
                dzx[at] += dp * wc[k];
            }
        }
    for (int k = 0; dw && k < K; k++) dw[(size_t)c * K + k] += gw[k];
    if (db) db[c] += gb;
}

void acc_ssm_conv_bwd(const acc_ssm *s, float *dzx, float *dconv_w, float *dconv_b, const float *dout,
                      const float *zx, int B, int n, cudaStream_t st) {
    (void)st; // (the emulator runs every launch in order)
    int C = acc_ssm_c(s);
    AC_LAUNCH(ks_conv_bwd, nblk(C), 256, 0, st, dzx, dconv_w, dconv_b, dout, zx, s->conv_w, s->conv_b, B, n, C,
              acc_ssm_di(s), acc_ssm_si(s), s->K);
}

// ---------------------------------------------------------------- scan

// One thread per (sequence b, head h, channel p), its state row S[p][:] in
// state ([B][nh][P][Ns]), the tokens in order.
__global__ void ks_scan_fwd(float *y, const float *xbc, const float *zx, const float *dt_bias, const float *a_log,
                            const float *D, float *state, int cont, int B, int n, int nh, int P, int Ns, int G) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)B * nh * P) return;
    int p = (int)(i % P), h = (int)(i / P % nh), b = (int)(i / ((size_t)P * nh)), g = h / (nh / G);
    int di = nh * P, C = di + 2 * G * Ns, SI = di + C + nh;
    float *S = state + i * Ns;
    if (!cont)
        for (int k = 0; k < Ns; k++) S[k] = 0;
    float A = -expf(a_log[h]);
    for (int t = 0; t < n; t++) {
        size_t row = (size_t)b * n + t;
        const float *Bv = xbc + row * C + di + (size_t)g * Ns, *Cv = xbc + row * C + di + (size_t)G * Ns + (size_t)g * Ns;
        float x = xbc[row * C + (size_t)h * P + p], dt = ssm_softplus(zx[row * SI + di + C + h] + dt_bias[h]);
        float a = expf(dt * A), dx = dt * x, acc = 0;
        for (int k = 0; k < Ns; k++) {
            S[k] = a * S[k] + dx * Bv[k];
            acc += S[k] * Cv[k];
        }
        y[row * di + (size_t)h * P + p] = acc + D[h] * x;
    }
}

void acc_ssm_scan_fwd(const acc_ssm *s, float *y, const float *xbc, const float *zx, int B, int n, float *state,
                      int cont, cudaStream_t st) {
    (void)st; // (the emulator runs every launch in order)
    AC_LAUNCH(ks_scan_fwd, nblk((size_t)B * s->nh * s->P), 256, 0, st, y, xbc, zx, s->dt_bias, s->a_log, s->d, state,
              cont, B, n, s->nh, s->P, s->Ns, s->G);
}

// The work of the backward scan: per head, every step's state of one
// sequence and a state's gradient ((n+2) P Ns), then per head the B and C
// gradients of every row ([nh][B*n][2 Ns]); at least the forward's
// [B][nh][P][Ns] state.
size_t acc_ssm_scan_work_floats(const acc_ssm *s, int B, int n) {
    size_t st = (size_t)s->P * s->Ns, per = ((size_t)n + 2) * st * s->nh + (size_t)s->nh * B * n * 2 * s->Ns;
    size_t fwd = (size_t)B * s->nh * st;
    return per > fwd ? per : fwd;
}

// Backward, one block per head h, the sequences one after another: the
// forward again with every state kept (work), then the steps in reverse.
// Threads own head channels p (dS rows, dx) in one phase and state entries k
// (dB, dC) in the next. dxbc's x columns and dzx's dt column are written;
// this head's dB, dC rows go to dbc ([nh][N][2 Ns]) for ks_scan_bc to sum
// over the group's heads; the head's parameter gradients accumulate.
__global__ void ks_scan_bwd(float *dxbc, float *dzx, float *dbc, float *ddt_bias, float *da_log, float *dd,
                            const float *dy, const float *xbc, const float *zx, const float *dt_bias,
                            const float *a_log, const float *D, float *work, int B, int n, int nh, int P, int Ns,
                            int G) {
    int h = blockIdx.x, g = h / (nh / G), di = nh * P, C = di + 2 * G * Ns, SI = di + C + nh;
    size_t st = (size_t)P * Ns, N = (size_t)B * n;
    float *Sall = work + (size_t)h * (n + 2) * st, *dS = Sall + ((size_t)n + 1) * st, *dbch = dbc + (size_t)h * N * 2 * Ns;
    float A = -expf(a_log[h]), dA = 0, dbias = 0, dD = 0;
    for (int b = 0; b < B; b++) {
        for (int p = threadIdx.x; p < P; p += blockDim.x) { // the forward again: Sall[t+1] after row t
            for (int k = 0; k < Ns; k++) Sall[(size_t)p * Ns + k] = 0, dS[(size_t)p * Ns + k] = 0;
            for (int t = 0; t < n; t++) {
                size_t row = (size_t)b * n + t;
                const float *Bv = xbc + row * C + di + (size_t)g * Ns;
                float x = xbc[row * C + (size_t)h * P + p], dt = ssm_softplus(zx[row * SI + di + C + h] + dt_bias[h]);
                float a = expf(dt * A);
                const float *S0 = Sall + (size_t)t * st + (size_t)p * Ns;
                float *S1 = Sall + ((size_t)t + 1) * st + (size_t)p * Ns;
                for (int k = 0; k < Ns; k++) S1[k] = a * S0[k] + dt * x * Bv[k];
            }
        }
        __syncthreads();
        for (int t = n - 1; t >= 0; t--) {
            size_t row = (size_t)b * n + t;
            const float *x = xbc + row * C + (size_t)h * P, *Bv = xbc + row * C + di + (size_t)g * Ns,
                        *Cv = xbc + row * C + di + (size_t)G * Ns + (size_t)g * Ns, *dyt = dy + row * di + (size_t)h * P;
            const float *S0 = Sall + (size_t)t * st, *S1 = Sall + ((size_t)t + 1) * st;
            float u = zx[row * SI + di + C + h] + dt_bias[h], dt = ssm_softplus(u), a = expf(dt * A);
            float da = 0, ddt = 0;
            for (int p = threadIdx.x; p < P; p += blockDim.x) { // y = S1 C + D x;  S1 = a S0 + dt x B^T
                float dxp = 0;
                dD += dyt[p] * x[p];
                for (int k = 0; k < Ns; k++) {
                    float g1 = dS[(size_t)p * Ns + k] + dyt[p] * Cv[k];
                    dS[(size_t)p * Ns + k] = g1;
                    da += g1 * S0[(size_t)p * Ns + k];
                    ddt += g1 * x[p] * Bv[k];
                    dxp += g1 * Bv[k];
                }
                dxbc[row * C + (size_t)h * P + p] = D[h] * dyt[p] + dt * dxp;
            }
            da = acc_block_sum(da); // (its barriers also publish dS)
            ddt = acc_block_sum(ddt);
            for (int k = threadIdx.x; k < Ns; k += blockDim.x) {
                float dc = 0, db = 0;
                for (int p = 0; p < P; p++) {
                    dc += dyt[p] * S1[(size_t)p * Ns + k];
                    db += dS[(size_t)p * Ns + k] * x[p];
                }
                dbch[row * 2 * Ns + k] = dt * db;
                dbch[row * 2 * Ns + Ns + k] = dc;
            }
            ddt += da * a * A; // a = exp(dt A)
            dA += da * a * dt;
            float du = ddt * ssm_sigm(u);
            dbias += du;
            if (threadIdx.x == 0) dzx[row * SI + di + C + h] = du;
            __syncthreads(); // every thread has read dS
            for (int p = threadIdx.x; p < P; p += blockDim.x)
                for (int k = 0; k < Ns; k++) dS[(size_t)p * Ns + k] *= a;
            __syncthreads();
        }
    }
    dD = acc_block_sum(dD);
    if (threadIdx.x == 0) {
        if (dd) dd[h] += dD;
        if (ddt_bias) ddt_bias[h] += dbias;
        if (da_log) da_log[h] += dA * A; // A = -exp(A_log)
    }
}

// dxbc's B and C columns: the sums of the group's heads' rows of dbc, one
// thread per (row, column of B or C).
__global__ void ks_scan_bc(float *dxbc, const float *dbc, int N, int nh, int Ns, int G, int di, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * 2 * G * Ns) return;
    int col = (int)(i % (2 * G * Ns)), r = (int)(i / (2 * G * Ns)), which = col / (G * Ns), g = col % (G * Ns) / Ns,
        k = col % Ns, hpg = nh / G;
    float s = 0;
    for (int h = g * hpg; h < (g + 1) * hpg; h++) s += dbc[((size_t)h * N + r) * 2 * Ns + (size_t)which * Ns + k];
    dxbc[(size_t)r * C + di + col] = s;
}

void acc_ssm_scan_bwd(const acc_ssm *s, float *dxbc, float *dzx, float *ddt_bias, float *da_log, float *dd,
                      const float *dy, const float *xbc, const float *zx, int B, int n, float *work, cudaStream_t st) {
    (void)st; // (the emulator runs every launch in order)
    size_t N = (size_t)B * n, sts = (size_t)s->P * s->Ns;
    float *dbc = work + ((size_t)n + 2) * sts * s->nh;
    AC_LAUNCH(ks_scan_bwd, s->nh, SSM_TB, 0, st, dxbc, dzx, dbc, ddt_bias, da_log, dd, dy, xbc, zx, s->dt_bias,
              s->a_log, s->d, work, B, n, s->nh, s->P, s->Ns, s->G);
    AC_LAUNCH(ks_scan_bc, nblk(N * 2 * s->G * s->Ns), 256, 0, st, dxbc, dbc, (int)N, s->nh, s->Ns, s->G,
              acc_ssm_di(s), acc_ssm_c(s));
}

// ---------------------------------------------------------------- gated norm

// Channel ch's gate: its head's times its head dim's (hg[ch / P] * pg[ch % P]; a missing one 1).
static __device__ float head_gate_at(const float *hg, const float *pg, int ch, int P) {
    return (hg ? hg[ch / P] : 1.0f) * (pg ? pg[ch % P] : 1.0f);
}

// One block per (row r, group gi) of gs = di/G channels; channel c weighs
// m_c (its head's gate times its dim's, hg[c / P] pg[c % P]; 1 without gates) in the group's
// statistic: rs = (sum m v^2 / sum m + eps)^-1/2, out = v rs w m.
__global__ void ks_gnorm_fwd(float *outf, bf16 *outb, const float *y, const float *zx, const float *w,
                             const float *hg, const float *pg, int di, int SI, int G, int P, float eps) {
    int r = blockIdx.x / G, gi = blockIdx.x % G, gs = di / G;
    const float *yr = y + (size_t)r * di + (size_t)gi * gs, *z = zx + (size_t)r * SI + (size_t)gi * gs;
    float ss = 0, M = 0;
    for (int c = threadIdx.x; c < gs; c += blockDim.x) {
        float v = yr[c] * z[c] * ssm_sigm(z[c]), m = head_gate_at(hg, pg, gi * gs + c, P);
        ss += m * v * v, M += m;
    }
    ss = acc_block_sum(ss), M = acc_block_sum(M);
    float rs = M > 0 ? rsqrtf(ss / M + eps) : 0.0f;
    for (int c = threadIdx.x; c < gs; c += blockDim.x) {
        float m = head_gate_at(hg, pg, gi * gs + c, P);
        float o = yr[c] * z[c] * ssm_sigm(z[c]) * rs * w[(size_t)gi * gs + c] * m;
        size_t at = (size_t)r * di + (size_t)gi * gs + c;
        if (outf) outf[at] = o;
        if (outb) outb[at] = __float2bfloat16(o);
    }
}

void acc_ssm_gated_norm_fwd(const acc_ssm *s, float *outf, bf16 *outb, const float *y, const float *zx, int N,
                            cudaStream_t st) {
    (void)st; // (the emulator runs every launch in order)
    AC_LAUNCH(ks_gnorm_fwd, (unsigned)N * s->G, SSM_TB, 0, st, outf, outb, y, zx, s->norm_w, s->head_gate,
              s->dim_gate, acc_ssm_di(s), acc_ssm_si(s), s->G, s->P, s->eps);
}

// Its backward, one block per (row, group), as ssm_cpu.c's: with M = sum m,
// ms = sum m v^2 / M, vh = v rs and dot = sum d w m vh: dv = rs m (d w - vh
// dot / M); dy = dv silu(z), dz = dv y silu'(z); prod = d vh m (for
// dnorm_w); prodg = d w vh - dot (vh^2 - rs^2 ms) / (2 M) (the gate m's
// gradient). A group whose gates are all 0 passes nothing back.
__global__ void ks_gnorm_bwd(float *dy, float *dzx, float *prod, float *prodg, const float *dout, const float *y,
                             const float *zx, const float *w, const float *hg, const float *pg, int di, int SI,
                             int G, int P, float eps) {
    int r = blockIdx.x / G, gi = blockIdx.x % G, gs = di / G;
    size_t o = (size_t)r * di + (size_t)gi * gs;
    const float *yr = y + o, *z = zx + (size_t)r * SI + (size_t)gi * gs, *d = dout + o, *wg = w + (size_t)gi * gs;
    float ss = 0, M = 0;
    for (int c = threadIdx.x; c < gs; c += blockDim.x) {
        float v = yr[c] * z[c] * ssm_sigm(z[c]), m = head_gate_at(hg, pg, gi * gs + c, P);
        ss += m * v * v, M += m;
    }
    ss = acc_block_sum(ss), M = acc_block_sum(M);
    if (M <= 0) {
        for (int c = threadIdx.x; c < gs; c += blockDim.x) {
            prod[o + c] = dy[o + c] = dzx[(size_t)r * SI + (size_t)gi * gs + c] = 0;
            if (prodg) prodg[o + c] = 0;
        }
        return;
    }
    float ms = ss / M, rs = rsqrtf(ms + eps), dot = 0;
    for (int c = threadIdx.x; c < gs; c += blockDim.x) {
        float m = head_gate_at(hg, pg, gi * gs + c, P);
        dot += d[c] * wg[c] * m * yr[c] * z[c] * ssm_sigm(z[c]) * rs;
    }
    dot = acc_block_sum(dot);
    for (int c = threadIdx.x; c < gs; c += blockDim.x) {
        float m = head_gate_at(hg, pg, gi * gs + c, P);
        float sg = ssm_sigm(z[c]), sz = z[c] * sg, vh = yr[c] * sz * rs, dv = rs * m * (d[c] * wg[c] - vh * dot / M);
        prod[o + c] = d[c] * vh * m;
        if (prodg) prodg[o + c] = d[c] * wg[c] * vh - dot * (vh * vh - rs * rs * ms) / (2 * M);
        dy[o + c] = dv * sz;
        dzx[(size_t)r * SI + (size_t)gi * gs + c] = dv * yr[c] * sg * (1.0f + z[c] * (1.0f - sg));
    }
}

void acc_ssm_gated_norm_bwd(const acc_ssm *s, float *dy, float *dzx, float *prod, float *prodg, const float *dout,
                            const float *y, const float *zx, int N, cudaStream_t st) {
    (void)st; // (the emulator runs every launch in order)
    AC_LAUNCH(ks_gnorm_bwd, (unsigned)N * s->G, SSM_TB, 0, st, dy, dzx, prod,
              s->head_gate || s->dim_gate ? prodg : nullptr, dout, y, zx, s->norm_w, s->head_gate, s->dim_gate,
              acc_ssm_di(s), acc_ssm_si(s), s->G, s->P, s->eps);
}

// ---------------------------------------------------------------- squared ReLU

__global__ void ks_relu2_fwd(float *outf, bf16 *outb, const float *in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = in[i] > 0 ? in[i] * in[i] : 0.0f;
    if (outf) outf[i] = v;
    if (outb) outb[i] = __float2bfloat16(v);
}

void acc_relu2_fwd(float *outf, bf16 *outb, const float *in, size_t n, cudaStream_t st) {
    (void)st; // (the emulator runs every launch in order)
    AC_LAUNCH(ks_relu2_fwd, nblk(n), 256, 0, st, outf, outb, in, n);
}

__global__ void ks_relu2_bwd(float *din, const float *dout, const float *in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) din[i] = in[i] > 0 ? 2.0f * in[i] * dout[i] : 0.0f;
}

void acc_relu2_bwd(float *din, const float *dout, const float *in, size_t n, cudaStream_t st) {
    (void)st; // (the emulator runs every launch in order)
    AC_LAUNCH(ks_relu2_bwd, nblk(n), 256, 0, st, din, dout, in, n);
}
