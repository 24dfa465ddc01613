/* kernels_cpu.c - see kernels_cpu.h. */
#include "kernels_cpu.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_amx.h"
#include "tensor.h"

void openblas_set_num_threads(int);

static int n_threads = 1, bf16_rows = 32;

void ac_set_threads(int n) {
    n_threads = n > 0 ? n : 1;
    openblas_set_num_threads(n_threads);
}

int ac_kernels_threads(void) { return n_threads; }

void ac_blas_threads(int n) { openblas_set_num_threads(n > 0 ? n : 1); }

int ac_bf16_amx_rows(int N) { return bf16_rows > 0 && N >= bf16_rows && ac_amx_available(); }

void ac_set_bf16_gemm_rows(int rows) { bf16_rows = rows < 0 ? 0 : rows; }

int ac_bf16_gemm_rows(void) { return bf16_rows; }

#define WTILE_FLOATS (64 * 1024) /* 256 KB of converted weight rows: stays in L2 */

int ac_wscratch_alloc(ac_wscratch *s, int N, int in) {
    memset(s, 0, sizeof *s);
    s->wtile_n = WTILE_FLOATS > (size_t)in ? WTILE_FLOATS : (size_t)in;
    s->wtile = malloc(s->wtile_n * 4);
    if (ac_amx_available()) {
        s->xpack_n = ac_amx_pack_size(N, in, n_threads);
        s->xpack = malloc(s->xpack_n * 2);
    }
    if (!s->wtile || (s->xpack_n && !s->xpack)) {
        ac_wscratch_free(s);
        return -1;
    }
    return 0;
}

void ac_wscratch_free(ac_wscratch *s) {
    free(s->wtile);
    free(s->xpack);
    memset(s, 0, sizeof *s);
}

void ac_row_f32(float *dst, const void *W, int wdt, size_t r, int n) {
    if (wdt == ST_BF16 || wdt == ST_F16) ac_to_f32(dst, (const uint16_t *)W + r * n, (st_dtype)wdt, n, NULL);
    else memcpy(dst, (const float *)W + r * n, (size_t)n * 4);
}

void ac_linear_w(float *Y, const float *X, const void *W, int wdt, const float *b, int N, int in, int out, int acc,
                 ac_wscratch *s) {
    if (wdt != ST_BF16 && wdt != ST_F16) {
        if (acc && !b) ac_linear_acc(Y, X, W, N, in, out);
        else if (!acc) ac_linear(Y, X, W, b, N, in, out);
        else {
            for (int r = 0; r < N; r++)
                for (int j = 0; j < out; j++) Y[(long)r * out + j] += b[j];
            ac_linear_acc(Y, X, W, N, in, out);
        }
        return;
    }
    if (wdt == ST_BF16 && bf16_rows > 0 && N >= bf16_rows && s->xpack && ac_amx_pack_size(N, in, n_threads) <= s->xpack_n &&
        ac_amx_linear(Y, X, W, b, N, in, out, acc, s->xpack, n_threads) == 0)
        return;
    /* per tile of T weight rows: convert, then Y[:, j0:j0+T] (+)= X W_tile^T */
    int T = (int)(s->wtile_n / (size_t)in);
    if (T > out) T = out;
    if (b) {
        for (int r = 0; r < N; r++)
            for (int j = 0; j < out; j++) Y[(long)r * out + j] = (acc ? Y[(long)r * out + j] : 0) + b[j];
        acc = 1;
    }
    for (int j0 = 0; j0 < out; j0 += T) {
        int t = out - j0 < T ? out - j0 : T;
        ac_to_f32(s->wtile, (const uint16_t *)W + (size_t)j0 * in, (st_dtype)wdt, (size_t)t * in, NULL);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, t, in, 1.0f, X, in, s->wtile, in, acc ? 1.0f : 0.0f,
                    Y + j0, out);
    }
}

void ac_linear(float *Y, const float *X, const float *W, const float *b, int N, int in, int out) {
    if (b) {
        for (int r = 0; r < N; r++)
            for (int j = 0; j < out; j++) Y[(long)r * out + j] = b[j];
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, out, in, 1.0f, X, in, W, in, b ? 1.0f : 0.0f, Y, out);
}

void ac_linear_acc(float *Y, const float *X, const float *W, int N, int in, int out) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, out, in, 1.0f, X, in, W, in, 1.0f, Y, out);
}

void ac_rmsnorm(float *out, const float *x, const float *w, int N, int H, float eps) {
    for (int r = 0; r < N; r++) {
        const float *xr = x + (long)r * H;
        float *o = out + (long)r * H;
        double ss = 0;
        for (int i = 0; i < H; i++) ss += (double)xr[i] * xr[i];
        float s = (float)(1.0 / sqrt(ss / H + eps));
        for (int i = 0; i < H; i++) o[i] = xr[i] * s * w[i];
    }
}

void ac_rope(float *x, int N, int nh, int hd, const int *pos, const float *cos_t, const float *sin_t) {
    int half = hd / 2;
    for (int r = 0; r < N; r++) {
        const float *c = cos_t + (long)pos[r] * half, *s = sin_t + (long)pos[r] * half;
        for (int h = 0; h < nh; h++) {
            float *v = x + (long)r * nh * hd + (long)h * hd;
            for (int i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * c[i] - b * s[i];
                v[i + half] = b * c[i] + a * s[i];
            }
        }
    }
}

void ac_silu_mul(float *g, const float *u, long n) {
    for (long i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void ac_softmax(float *x, int n) {
    float mx = x[0];
    for (int i = 1; i < n; i++) if (x[i] > mx) mx = x[i];
    float s = 0;
    for (int i = 0; i < n; i++) { x[i] = expf(x[i] - mx); s += x[i]; }
    float inv = 1.0f / s;
    for (int i = 0; i < n; i++) x[i] *= inv;
}

void ac_rope_inv_freq(float *inv, int hd, float theta, int llama3, float factor, float lo, float hi, int orig) {
    for (int i = 0; i < hd / 2; i++) {
        float f = 1.0f / powf(theta, (float)(2 * i) / (float)hd);
        if (llama3) {
            float lo_wl = orig / lo, hi_wl = orig / hi, wl = 2.0f * (float)M_PI / f;
            if (wl > lo_wl) f = f / factor;
            else if (wl >= hi_wl) {
                float s = ((float)orig / wl - lo) / (hi - lo);
                f = (1 - s) * f / factor + s * f;
            }
        }
        inv[i] = f;
    }
}

void ac_attention_head(float *out, const float *q, const float *k, const float *v, int n, int pos0, int hd, int q_stride,
                       int kv_stride, int window, float *scores) {
    int S = pos0 + n;
    float scale = 1.0f / sqrtf((float)hd);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, S, hd, scale, q, q_stride, k, kv_stride, 0.0f, scores, S);
    for (int t = 0; t < n; t++) {
        float *row = scores + (size_t)t * S;
        int vis = pos0 + t + 1, first = window > 0 && vis > window ? vis - window : 0;
        for (int j = 0; j < first; j++) row[j] = 0;
        ac_softmax(row + first, vis - first);
        for (int j = vis; j < S; j++) row[j] = 0;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hd, S, 1.0f, scores, S, v, kv_stride, 0.0f, out, q_stride);
}
