/* backward_cpu.c - see backward_cpu.h. */
#include "runtime/backward_cpu.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "core/dtype.h"
#include "runtime/kernels_cpu.h"

void ac_linear_backward(float *dX, float *dW, float *db, const float *dY, const float *X, const float *W, int N, int in,
                        int out, float alpha, int acc_dx) {
    if (dX) /* dX[N,in] (+)= alpha dY[N,out] W[out,in] */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, in, out, alpha, dY, out, W, in, acc_dx ? 1.0f : 0.0f,
                    dX, in);
    if (dW) /* dW[out,in] += alpha dY^T X */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, N, alpha, dY, out, X, in, 1.0f, dW, in);
    if (db)
        for (int r = 0; r < N; r++)
            for (int j = 0; j < out; j++) db[j] += alpha * dY[(long)r * out + j];
}

void ac_linear_dx_w(float *dX, const float *dY, const void *W, int wdt, int N, int in, int out, float alpha, int acc_dx,
                    float *wtile, int wtile_rows) {
    if (wdt == ST_F32) {
        ac_linear_backward(dX, NULL, NULL, dY, NULL, W, N, in, out, alpha, acc_dx);
        return;
    }
    for (int r0 = 0; r0 < out; r0 += wtile_rows) {
        int rt = out - r0 < wtile_rows ? out - r0 : wtile_rows;
        for (int r = 0; r < rt; r++) ac_row_f32(wtile + (size_t)r * in, W, wdt, (size_t)(r0 + r), in);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, in, rt, alpha, dY + r0, out, wtile, in,
                    acc_dx || r0 ? 1.0f : 0.0f, dX, in);
    }
}

void ac_rmsnorm_fwd(float *y, float *xhat, float *r, const float *x, const float *w, const float *gh, int N, int H,
                    float eps) {
    double gs = 0; /* G = sum_c gh_c: the gate mass (H exactly when every gate is 1, or gh == NULL) */
    for (int c = 0; c < H; c++) gs += gh ? gh[c] : 1.0f;
    for (int i = 0; i < N; i++) {
        const float *xr = x + (long)i * H;
        float *xh = xhat + (long)i * H, *yr = y + (long)i * H;
        double ss = 0;
        for (int c = 0; c < H; c++) ss += (double)(gh ? gh[c] : 1.0f) * xr[c] * xr[c];
        float s = (float)(1.0 / sqrt((gs > 0 ? ss / gs : 0.0) + eps));
        r[i] = s;
        for (int c = 0; c < H; c++) {
            xh[c] = xr[c] * s;
            yr[c] = xh[c] * w[c] * (gh ? gh[c] : 1.0f);
        }
    }
}

void ac_rmsnorm_backward(float *dx, float *dw, float *dgh, const float *dy, const float *xhat, const float *r,
                         const float *w, const float *gh, int N, int H) {
    double gs = 0;
    for (int c = 0; c < H; c++) gs += gh ? gh[c] : 1.0f;
    double ig = gs > 0 ? 1.0 / gs : 0.0;
    for (int i = 0; i < N; i++) {
        const float *dyr = dy + (long)i * H, *xh = xhat + (long)i * H;
        float *dxr = dx + (long)i * H;
        double dot = 0, ms = 0;
        for (int c = 0; c < H; c++) {
            float g = gh ? gh[c] : 1.0f;
            if (dw) dw[c] += dyr[c] * xh[c] * g;
            dot += (double)dyr[c] * w[c] * g * xh[c];
            ms += (double)g * xh[c] * xh[c];
        }
        float mean = (float)(gs > 0 ? dot / gs : 0.0);
        if (dgh) { /* direct term, and through r: d r / d gh_c = -r^3 (x_c^2 - S/G) / (2G) */
            double m = ms * ig, k = 0.5 * dot * ig;
            for (int c = 0; c < H; c++)
                dgh[c] += (float)((double)dyr[c] * xh[c] * w[c] - k * ((double)xh[c] * xh[c] - m));
        }
        for (int c = 0; c < H; c++) {
            float g = gh ? gh[c] : 1.0f;
            float dxh = dyr[c] * w[c] * g;
            dxr[c] += r[i] * (dxh - g * xh[c] * mean);
        }
    }
}

void ac_rope_backward(float *dx, int N, int nh, int hd, const int *pos, const float *cos_t, const float *sin_t) {
    /* forward: y1 = a c - b s, y2 = b c + a s  =>  da = dy1 c + dy2 s, db = dy2 c - dy1 s */
    int half = hd / 2;
    for (int r = 0; r < N; r++) {
        const float *c = cos_t + (long)pos[r] * half, *s = sin_t + (long)pos[r] * half;
        for (int h = 0; h < nh; h++) {
            float *v = dx + (long)r * nh * hd + (long)h * hd;
            for (int i = 0; i < half; i++) {
                float d1 = v[i], d2 = v[i + half];
                v[i] = d1 * c[i] + d2 * s[i];
                v[i + half] = d2 * c[i] - d1 * s[i];
            }
        }
    }
}

void ac_silu_mul_backward(float *dg, float *du, const float *dh, const float *g, const float *u, long n) {
    for (long i = 0; i < n; i++) {
        float sg = 1.0f / (1.0f + expf(-g[i])), d = dh[i];
        du[i] = d * g[i] * sg;
        dg[i] = d * u[i] * sg * (1.0f + g[i] * (1.0f - sg));
    }
}

void ac_attention_head_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                                const float *v, int n, int hd, int q_stride, int kv_stride, int window,
                                float *scratch) {
    float scale = 1.0f / sqrtf((float)hd);
    float *P = scratch, *dS = scratch + (size_t)n * n;
    /* P[n,n] = softmax(mask(scale q k^T)), as the forward computes it */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, hd, scale, q, q_stride, k, kv_stride, 0.0f, P, n);
    for (int t = 0; t < n; t++) {
        float *row = P + (size_t)t * n;
        int vis = t + 1, first = window > 0 && vis > window ? vis - window : 0;
        for (int j = 0; j < first; j++) row[j] = 0;
        ac_softmax(row + first, vis - first);
        for (int j = vis; j < n; j++) row[j] = 0;
    }
    /* dv[n,hd] += P^T dout */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hd, n, 1.0f, P, n, dout, q_stride, 1.0f, dv, kv_stride);
    /* dP[n,n] = dout v^T, then the softmax backward in place */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, hd, 1.0f, dout, q_stride, v, kv_stride, 0.0f, dS, n);
    for (int t = 0; t < n; t++) {
        float *p = P + (size_t)t * n, *d = dS + (size_t)t * n;
        double s = 0;
        for (int j = 0; j <= t; j++) s += (double)p[j] * d[j];
        for (int j = 0; j < n; j++) d[j] = j <= t ? p[j] * (d[j] - (float)s) : 0.0f;
    }
    /* dq[n,hd] = scale dS k;  dk[n,hd] += scale dS^T q */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hd, n, scale, dS, n, k, kv_stride, 0.0f, dq, q_stride);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hd, n, scale, dS, n, q, q_stride, 1.0f, dk, kv_stride);
}

/* log-sum-exp of z[V] / tau (double). */
static double lse(const float *z, int V, float tau, float *mx_out) {
    float mx = z[0];
    for (int v = 1; v < V; v++)
        if (z[v] > mx) mx = z[v];
    double s = 0;
    for (int v = 0; v < V; v++) s += exp(((double)z[v] - mx) / tau);
    *mx_out = mx;
    return log(s);
}

double ac_loss_backward(float *dz, const float *z, const int *target, const float *tz, int N, int V, float tau,
                        float kd_weight, float scale, double *ce_out, double *kd_out) {
    long nce = 0;
    for (int r = 0; r < N; r++) nce += target && target[r] >= 0;
    float wkd = tz ? kd_weight : 0.0f, wce = 1.0f - wkd;
    double ce = 0, kd = 0;
    memset(dz, 0, (size_t)N * V * sizeof(float));
    for (int r = 0; r < N; r++) {
        const float *zr = z + (size_t)r * V;
        float *d = dz + (size_t)r * V;
        if (target && target[r] >= 0) { /* the CE value is reported even when its weight is 0 */
            float mx;
            double l = lse(zr, V, 1.0f, &mx);
            ce += l + mx - zr[target[r]];
            float f = scale * wce / (float)nce;
            if (wce > 0) {
                for (int v = 0; v < V; v++) d[v] += f * (float)exp((double)zr[v] - mx - l);
                d[target[r]] -= f;
            }
        }
        if (wkd > 0) {
            const float *tr = tz + (size_t)r * V;
            float ms, mt;
            double ls = lse(zr, V, tau, &ms), lt = lse(tr, V, tau, &mt), kl = 0;
            float f = scale * wkd * tau / (float)N; /* d(tau^2 KL)/dz = tau (pS - pT) */
            for (int v = 0; v < V; v++) {
                double lps = ((double)zr[v] - ms) / tau - ls, lpt = ((double)tr[v] - mt) / tau - lt, pt = exp(lpt);
                kl += pt * (lpt - lps);
                d[v] += f * (float)(exp(lps) - pt);
            }
            kd += (double)tau * tau * kl;
        }
    }
    ce = nce ? ce / nce : 0;
    kd = N ? kd / N : 0;
    if (ce_out) *ce_out = ce;
    if (kd_out) *kd_out = kd;
    return wkd * kd + wce * ce;
}

void ac_head_norm_backward(float *dx, float *dw, const float *dy, const float *x, const float *w, long rows, int n,
                           float eps) {
    for (long i = 0; i < rows; i++) {
        const float *xr = x + i * n, *dyr = dy + i * n;
        float *dxr = dx + i * n;
        double ss = 0, dot = 0;
        for (int c = 0; c < n; c++) ss += (double)xr[c] * xr[c];
        double r = 1.0 / sqrt(ss / n + eps);
        for (int c = 0; c < n; c++) {
            double xh = xr[c] * r;
            dot += (double)dyr[c] * w[c] * xh;
            if (dw) dw[c] += (float)(dyr[c] * xh);
        }
        double mean = dot / n;
        for (int c = 0; c < n; c++) dxr[c] = (float)(r * ((double)dyr[c] * w[c] - xr[c] * r * mean));
    }
}
