/* kernels_cpu.c - see kernels_cpu.h. */
#include "kernels_cpu.h"

#include <cblas.h>
#include <math.h>

void openblas_set_num_threads(int);

void ac_set_threads(int n) { openblas_set_num_threads(n > 0 ? n : 1); }

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
