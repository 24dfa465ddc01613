/*
 * test_block.c - the block recipe and its ops, in the manner of llama.cpp's
 * test-backend-ops: every CPU op (forward and backward) against a float64
 * reference written here from the op's definition, on odd shapes; the BF16
 * weight path against the fp32 op; the recipe's own consistency; and the
 * CPU executor of the recipe (the engine's and streamed calibration's
 * layer) on pruned, heterogeneous layers with a KV cache and with masks,
 * against a float64 layer written from the Hugging Face semantics.
 */
#include <math.h>
#include <stdint.h>

#include "check.h"
#include "synth.h"

#include "runtime/backward_cpu.h"
#include "runtime/block.h"
#include "runtime/block_cpu.h"
#include "runtime/block_grad.h"
#include "runtime/cuda_plugin.h"
#include "runtime/kernels_cpu.h"
#include "runtime/rope.h"
#include "runtime/ssm_cpu_int.h"

static unsigned rng = 12345u;
static float frand(void) { /* uniform in [-1, 1) */
    rng = rng * 1664525u + 1013904223u;
    return (float)((rng >> 8) / 8388608.0 - 1.0);
}
static float *rnd(size_t n, float scale) {
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; p && i < n; i++) p[i] = frand() * scale;
    return p;
}
/* max |a - b| / (max |b| + tiny) */
static double relerr(const float *a, const double *b, size_t n) {
    double mx = 1e-30, d = 0;
    for (size_t i = 0; i < n; i++) {
        if (fabs(b[i]) > mx) mx = fabs(b[i]);
        if (fabs(a[i] - b[i]) > d) d = fabs(a[i] - b[i]);
    }
    return d / mx;
}

/* ---- float64 references of the ops ---- */
static void ref_rmsnorm(double *y, const float *x, const float *w, int N, int H, double eps) {
    for (int r = 0; r < N; r++) {
        double ss = 0;
        for (int c = 0; c < H; c++) ss += (double)x[r * H + c] * x[r * H + c];
        double s = 1.0 / sqrt(ss / H + eps);
        for (int c = 0; c < H; c++) y[r * H + c] = x[r * H + c] * s * w[c];
    }
}
static void ref_linear(double *y, const float *x, const float *W, const float *b, int N, int in, int out) {
    for (int r = 0; r < N; r++)
        for (int o = 0; o < out; o++) {
            double s = b ? b[o] : 0;
            for (int i = 0; i < in; i++) s += (double)x[r * in + i] * W[o * in + i];
            y[r * out + o] = s;
        }
}
/* rotate-half RoPE of head rows in double, angles from the float tables */
static void ref_rope(double *x, int N, int nh, int hd, const int *pos, const float *cs, const float *sn) {
    int half = hd / 2;
    for (int r = 0; r < N; r++)
        for (int h = 0; h < nh; h++) {
            double *v = x + ((size_t)r * nh + h) * hd;
            for (int i = 0; i < half; i++) {
                double c = cs[pos[r] * half + i], s = sn[pos[r] * half + i], a = v[i], b = v[i + half];
                v[i] = a * c - b * s;
                v[i + half] = b * c + a * s;
            }
        }
}
/* one head: q rows t (position pos0+t) over keys 0..pos0+t (window) */
static void ref_attention(double *out, const double *q, const double *k, const double *v, int n, int pos0, int hd,
                          int qs, int kvs, int window) {
    int S = pos0 + n;
    double *p = malloc(S * sizeof *p);
    for (int t = 0; t < n; t++) {
        int vis = pos0 + t + 1, first = window > 0 && vis > window ? vis - window : 0;
        double mx = -1e300, z = 0;
        for (int j = first; j < vis; j++) {
            double s = 0;
            for (int i = 0; i < hd; i++) s += q[(size_t)t * qs + i] * k[(size_t)j * kvs + i];
            p[j] = s / sqrt((double)hd);
            if (p[j] > mx) mx = p[j];
        }
        for (int j = first; j < vis; j++) z += p[j] = exp(p[j] - mx);
        for (int i = 0; i < hd; i++) {
            double s = 0;
            for (int j = first; j < vis; j++) s += p[j] / z * v[(size_t)j * kvs + i];
            out[(size_t)t * qs + i] = s;
        }
    }
    free(p);
}
static double silu(double g) { return g / (1 + exp(-g)); }

static ac_arch rope_arch(int hd) {
    ac_arch a = mk_arch(1, 8, hd, 1, 1, 4, 16);
    return a;
}

/* Forward ops on odd shapes against float64. */
static void test_ops_forward_f64(void) {
    int shapes[][3] = {{1, 7, 5}, {3, 13, 9}, {17, 33, 65}, {5, 64, 31}};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        int N = shapes[si][0], in = shapes[si][1], out = shapes[si][2];
        float *x = rnd((size_t)N * in, 1), *W = rnd((size_t)out * in, 0.5f), *b = rnd(out, 0.5f), *w = rnd(in, 1);
        float *y = malloc((size_t)N * (out > in ? out : in) * 4);
        double *r = malloc((size_t)N * (out > in ? out : in) * 8);
        ac_linear(y, x, W, b, N, in, out);
        ref_linear(r, x, W, b, N, in, out);
        CHECK(relerr(y, r, (size_t)N * out) < 1e-5, "linear %dx%dx%d: %g", N, in, out, relerr(y, r, (size_t)N * out));
        for (size_t i = 0; i < (size_t)N * out; i++) y[i] = 0.25f;
        ac_linear_w(y, x, W, ST_F32, NULL, N, in, out, 1, NULL); /* acc: the residual add */
        ref_linear(r, x, W, NULL, N, in, out);
        for (size_t i = 0; i < (size_t)N * out; i++) r[i] += 0.25;
        CHECK(relerr(y, r, (size_t)N * out) < 1e-5, "linear acc %dx%dx%d", N, in, out);
        ac_rmsnorm(y, x, w, N, in, 1e-5f);
        ref_rmsnorm(r, x, w, N, in, 1e-5);
        CHECK(relerr(y, r, (size_t)N * in) < 1e-6, "rmsnorm %dx%d: %g", N, in, relerr(y, r, (size_t)N * in));
        float *u = rnd((size_t)N * in, 2);
        memcpy(y, x, (size_t)N * in * 4);
        ac_silu_mul(y, u, (long)N * in);
        for (size_t i = 0; i < (size_t)N * in; i++) r[i] = silu(x[i]) * u[i];
        CHECK(relerr(y, r, (size_t)N * in) < 1e-6, "swiglu %dx%d", N, in);
        free(x), free(W), free(b), free(w), free(y), free(r), free(u);
    }
    /* RoPE and attention: GQA strides, a window, a continuation at pos0 > 0 */
    int hd = 6, nh = 3, nkv = 1, n = 5, pos0 = 4, S = pos0 + n, Q = nh * hd, KV = nkv * hd;
    ac_arch a = rope_arch(hd);
    float *cs = malloc((size_t)S * hd / 2 * 4), *sn = malloc((size_t)S * hd / 2 * 4);
    ac_err e = {0};
    CHECK(ac_rope_tables(&a, S, cs, sn, &e) == 0, "%s", e.msg);
    int pos[9];
    for (int i = 0; i < S; i++) pos[i] = i;
    float *q = rnd((size_t)S * Q, 1), *kv = rnd((size_t)S * KV, 1), *v = rnd((size_t)S * KV, 1);
    double *rq = malloc((size_t)S * Q * 8), *rk = malloc((size_t)S * KV * 8), *rv = malloc((size_t)S * KV * 8);
    for (int i = 0; i < S * Q; i++) rq[i] = q[i];
    for (int i = 0; i < S * KV; i++) rk[i] = kv[i], rv[i] = v[i];
    ac_rope(q, S, nh, hd, pos, cs, sn);
    ac_rope(kv, S, nkv, hd, pos, cs, sn);
    ref_rope(rq, S, nh, hd, pos, cs, sn);
    ref_rope(rk, S, nkv, hd, pos, cs, sn);
    CHECK(relerr(q, rq, (size_t)S * Q) < 1e-6 && relerr(kv, rk, (size_t)S * KV) < 1e-6, "rope");
    for (int window = 0; window <= 3; window += 3) {
        float *o = calloc((size_t)n * Q, 4), *sc = malloc((size_t)n * S * 4);
        double *ro = calloc((size_t)n * Q, 8);
        for (int h = 0; h < nh; h++) {
            ac_attention_head(o + h * hd, q + (size_t)pos0 * Q + h * hd, kv, v, n, pos0, hd, Q, KV, window, sc);
            ref_attention(ro + h * hd, rq + (size_t)pos0 * Q + h * hd, rk, rv, n, pos0, hd, Q, KV, window);
        }
        CHECK(relerr(o, ro, (size_t)n * Q) < 1e-5, "attention window %d: %g", window, relerr(o, ro, (size_t)n * Q));
        free(o), free(sc), free(ro);
    }
    free(cs), free(sn), free(q), free(kv), free(v), free(rq), free(rk), free(rv);
    ac_arch_free(&a);
    /* HEAD_NORM: each hd-wide head of a row normed with one [hd] weight, in place */
    int hn_shapes[][3] = {{1, 1, 2}, {3, 5, 6}, {4, 3, 24}, {7, 2, 130}};
    for (size_t si = 0; si < sizeof hn_shapes / sizeof *hn_shapes; si++) {
        int Nr = hn_shapes[si][0], heads = hn_shapes[si][1], d = hn_shapes[si][2];
        size_t cnt = (size_t)Nr * heads * d;
        float *t = rnd(cnt, 2), *w = rnd(d, 1);
        double *r = malloc(cnt * 8);
        ref_rmsnorm(r, t, w, Nr * heads, d, 1e-6);
        ac_rmsnorm(t, t, w, Nr * heads, d, 1e-6f);
        CHECK(relerr(t, r, cnt) < 1e-6, "head norm %dx%dx%d: %g", Nr, heads, d, relerr(t, r, cnt));
        free(t), free(w), free(r);
    }
}

static uint16_t to_bf16(float f) { /* round to nearest even */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The BF16 weight path against the fp32 op on the widened weights: bit for
 * bit on the exact path; within BF16 activation rounding on the kernels. */
static void test_linear_bf16_vs_f32(void) {
    int shapes[][3] = {{1, 31, 17}, {4, 64, 33}, {40, 96, 70}, {33, 17, 9}};
    int saved = ac_bf16_gemm_rows();
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        int N = shapes[si][0], in = shapes[si][1], out = shapes[si][2];
        float *x = rnd((size_t)N * in, 1), *W = rnd((size_t)out * in, 0.5f), *b = rnd(out, 0.2f);
        uint16_t *Wb = malloc((size_t)out * in * 2);
        for (size_t i = 0; i < (size_t)out * in; i++) W[i] = from_bf16(Wb[i] = to_bf16(W[i]));
        float *y32 = malloc((size_t)N * out * 4), *y16 = malloc((size_t)N * out * 4);
        ac_wscratch ws = {0};
        CHECK(ac_wscratch_alloc(&ws, N, in) == 0, "scratch");
        ac_linear(y32, x, W, b, N, in, out);
        ac_set_bf16_gemm_rows(0);
        ac_linear_w(y16, x, Wb, ST_BF16, b, N, in, out, 0, &ws);
        CHECK(!memcmp(y16, y32, (size_t)N * out * 4), "exact BF16 path %dx%dx%d differs from fp32", N, in, out);
        ac_set_bf16_gemm_rows(saved);
        ac_linear_w(y16, x, Wb, ST_BF16, b, N, in, out, 0, &ws);
        double mx = 0, d = 0;
        for (size_t i = 0; i < (size_t)N * out; i++) {
            if (fabs(y32[i]) > mx) mx = fabs(y32[i]);
            if (fabs(y16[i] - y32[i]) > d) d = fabs(y16[i] - y32[i]);
        }
        CHECK(d <= 2e-2 * mx, "BF16 kernel path %dx%dx%d: %g of %g", N, in, out, d, mx);
        ac_wscratch_free(&ws);
        free(x), free(W), free(b), free(Wb), free(y32), free(y16);
    }
    ac_set_bf16_gemm_rows(saved);
}

/* Backward ops: <dy, d f(x)/dx . dir> against a float64 central difference
 * of the op's float64 reference, and parameter gradients likewise. */
static double dot_f(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}
static void test_ops_backward_f64(void) {
    int N = 3, H = 11, in = 9, out = 7;
    double h = 1e-4;
    /* linear: dX and dW, db */
    float *x = rnd((size_t)N * in, 1), *W = rnd((size_t)out * in, 0.5f), *dy = rnd((size_t)N * out, 1);
    float *dx = calloc((size_t)N * in, 4), *dW = calloc((size_t)out * in, 4), *db = calloc(out, 4), *b = rnd(out, 1);
    ac_linear_backward(dx, dW, db, dy, x, W, N, in, out, 1.0f, 0);
    float *dir = rnd((size_t)N * in, 1);
    double *yp = malloc((size_t)N * out * 8), *ym = malloc((size_t)N * out * 8);
    float *xp = malloc((size_t)N * in * 4), *xm = malloc((size_t)N * in * 4);
    /* linear is exact in x: (f(x+d) - f(x-d)) / 2 with unit steps */
    for (size_t i = 0; i < (size_t)N * in; i++) xp[i] = x[i] + dir[i], xm[i] = x[i] - dir[i];
    ref_linear(yp, xp, W, b, N, in, out);
    ref_linear(ym, xm, W, b, N, in, out);
    double fd = 0;
    for (size_t i = 0; i < (size_t)N * out; i++) fd += dy[i] * (yp[i] - ym[i]) / 2;
    CHECK(fabs(dot_f(dx, dir, (size_t)N * in) - fd) < 1e-4 * (fabs(fd) + 1), "linear dX");
    double sdb = 0, rdb = 0;
    for (int o = 0; o < out; o++) {
        sdb += db[o];
        for (int r = 0; r < N; r++) rdb += dy[r * out + o];
    }
    CHECK(fabs(sdb - rdb) < 1e-4, "linear db");
    double rdw = 0; /* dW[o][i] = sum_r dy[r][o] x[r][i] */
    for (int o = 0; o < out; o++)
        for (int i = 0; i < in; i++) {
            double s = 0;
            for (int r = 0; r < N; r++) s += (double)dy[r * out + o] * x[r * in + i];
            rdw = fmax(rdw, fabs(s - dW[o * in + i]));
        }
    CHECK(rdw < 1e-5, "linear dW: %g", rdw);
    /* rmsnorm: dx, dw */
    float *xn = rnd((size_t)N * H, 1), *w = rnd(H, 1), *dyn = rnd((size_t)N * H, 1);
    float *xh = malloc((size_t)N * H * 4), *rr = malloc(N * 4), *yy = malloc((size_t)N * H * 4);
    float *dxn = calloc((size_t)N * H, 4), *dwn = calloc(H, 4), *dirn = rnd((size_t)N * H, 1);
    ac_rmsnorm_fwd(yy, xh, rr, xn, w, NULL, N, H, 1e-5f);
    ac_rmsnorm_backward(dxn, dwn, NULL, dyn, xh, rr, w, NULL, N, H);
    double *rp = malloc((size_t)N * H * 8), *rm = malloc((size_t)N * H * 8);
    float *xnp = malloc((size_t)N * H * 4), *xnm = malloc((size_t)N * H * 4);
    for (size_t i = 0; i < (size_t)N * H; i++) xnp[i] = xn[i] + h * dirn[i], xnm[i] = xn[i] - h * dirn[i];
    ref_rmsnorm(rp, xnp, w, N, H, 1e-5);
    ref_rmsnorm(rm, xnm, w, N, H, 1e-5);
    fd = 0;
    for (size_t i = 0; i < (size_t)N * H; i++) fd += dyn[i] * (rp[i] - rm[i]) / (2 * h);
    CHECK(fabs(dot_f(dxn, dirn, (size_t)N * H) - fd) < 2e-3 * (fabs(fd) + 1), "rmsnorm dx: %g vs %g",
          dot_f(dxn, dirn, (size_t)N * H), fd);
    double rdwn = 0;
    for (int c = 0; c < H; c++) {
        double s = 0;
        for (int r = 0; r < N; r++) s += (double)dyn[r * H + c] * xh[r * H + c];
        rdwn = fmax(rdwn, fabs(s - dwn[c]));
    }
    CHECK(rdwn < 1e-5, "rmsnorm dw: %g", rdwn);
    /* head norm (Qwen3's q_norm / k_norm): dx written in place over dy, dw added */
    {
        int rows = 7, d = 10;
        float *hx = rnd((size_t)rows * d, 1.5f), *hw = rnd(d, 1), *hdy = rnd((size_t)rows * d, 1),
              *hdir = rnd((size_t)rows * d, 1), *hg = malloc((size_t)rows * d * 4), *hdw = calloc(d, 4);
        float *hp = malloc((size_t)rows * d * 4), *hm = malloc((size_t)rows * d * 4), *ones = malloc((size_t)d * 4);
        double *yp2 = malloc((size_t)rows * d * 8), *ym2 = malloc((size_t)rows * d * 8);
        memcpy(hg, hdy, (size_t)rows * d * 4);
        ac_head_norm_backward(hg, hdw, hg, hx, hw, rows, d, 1e-6f);
        for (int i = 0; i < rows * d; i++) hp[i] = hx[i] + h * hdir[i], hm[i] = hx[i] - h * hdir[i];
        ref_rmsnorm(yp2, hp, hw, rows, d, 1e-6);
        ref_rmsnorm(ym2, hm, hw, rows, d, 1e-6);
        double hfd = 0;
        for (int i = 0; i < rows * d; i++) hfd += hdy[i] * (yp2[i] - ym2[i]) / (2 * h);
        CHECK(fabs(dot_f(hg, hdir, (size_t)rows * d) - hfd) < 2e-3 * (fabs(hfd) + 1), "head norm dx: %g vs %g",
              dot_f(hg, hdir, (size_t)rows * d), hfd);
        for (int c = 0; c < d; c++) ones[c] = 1;
        ref_rmsnorm(yp2, hx, ones, rows, d, 1e-6); /* xhat: dw[c] = sum_r dy xhat */
        double rdw2 = 0;
        for (int c = 0; c < d; c++) {
            double s2 = 0;
            for (int r = 0; r < rows; r++) s2 += (double)hdy[r * d + c] * yp2[r * d + c];
            rdw2 = fmax(rdw2, fabs(s2 - hdw[c]));
        }
        CHECK(rdw2 < 1e-5, "head norm dw: %g", rdw2);
        free(hx), free(hw), free(hdy), free(hdir), free(hg), free(hdw), free(hp), free(hm), free(ones), free(yp2),
            free(ym2);
    }
    /* swiglu: dg, du */
    float *g = rnd(40, 2), *u = rnd(40, 2), *dh = rnd(40, 1), *dg = malloc(160), *du = malloc(160);
    ac_silu_mul_backward(dg, du, dh, g, u, 40);
    double e1 = 0, e2 = 0;
    for (int i = 0; i < 40; i++) {
        double dsilu = (silu(g[i] + h) - silu(g[i] - h)) / (2 * h);
        e1 = fmax(e1, fabs(dg[i] - dh[i] * u[i] * dsilu));
        e2 = fmax(e2, fabs(du[i] - dh[i] * silu(g[i])));
    }
    CHECK(e1 < 1e-4 && e2 < 1e-5, "swiglu backward: %g %g", e1, e2);
    /* rope: the backward is the transposed rotation: <R^T dy, d> == <dy, R d> */
    int hd = 6, nh = 2, T = 5;
    ac_arch a = rope_arch(hd);
    float *cs = malloc((size_t)T * hd / 2 * 4), *sn = malloc((size_t)T * hd / 2 * 4);
    ac_err e = {0};
    CHECK(ac_rope_tables(&a, T, cs, sn, &e) == 0, "%s", e.msg);
    int pos[5] = {0, 1, 2, 3, 4};
    float *ry = rnd((size_t)T * nh * hd, 1), *rd = rnd((size_t)T * nh * hd, 1);
    double *rdd = malloc((size_t)T * nh * hd * 8);
    for (int i = 0; i < T * nh * hd; i++) rdd[i] = rd[i];
    ref_rope(rdd, T, nh, hd, pos, cs, sn);
    double lhs = 0, rhs = 0;
    for (int i = 0; i < T * nh * hd; i++) rhs += ry[i] * rdd[i];
    ac_rope_backward(ry, T, nh, hd, pos, cs, sn);
    lhs = dot_f(ry, rd, (size_t)T * nh * hd);
    CHECK(fabs(lhs - rhs) < 1e-5 * (fabs(rhs) + 1), "rope backward: %g vs %g", lhs, rhs);
    /* attention head (pos0 0, GQA strides, a window): dq, dk, dv */
    int n = 6, Qs = 2 * hd, KVs = hd;
    for (int window = 0; window <= 4; window += 4) {
        float *q = rnd((size_t)n * Qs, 1), *k = rnd((size_t)n * KVs, 1), *v = rnd((size_t)n * KVs, 1);
        float *dout = rnd((size_t)n * Qs, 1), *dq = calloc((size_t)n * Qs, 4), *dk = calloc((size_t)n * KVs, 4),
              *dv = calloc((size_t)n * KVs, 4), *scr = malloc((size_t)2 * n * n * 4);
        ac_attention_head_backward(dq, dk, dv, dout, q, k, v, n, hd, Qs, KVs, window, scr);
        float *dirs[3] = {rnd((size_t)n * Qs, 1), rnd((size_t)n * KVs, 1), rnd((size_t)n * KVs, 1)};
        double *o1 = calloc((size_t)n * Qs, 8), *o2 = calloc((size_t)n * Qs, 8);
        double *dq64 = malloc((size_t)n * Qs * 8), *dk64 = malloc((size_t)n * KVs * 8),
               *dv64 = malloc((size_t)n * KVs * 8);
        for (int sgn = 0; sgn < 2; sgn++) {
            double s = sgn ? -h : h;
            for (int i = 0; i < n * Qs; i++) dq64[i] = q[i] + s * dirs[0][i];
            for (int i = 0; i < n * KVs; i++) dk64[i] = k[i] + s * dirs[1][i], dv64[i] = v[i] + s * dirs[2][i];
            ref_attention(sgn ? o2 : o1, dq64, dk64, dv64, n, 0, hd, Qs, KVs, window);
        }
        fd = 0;
        for (int t = 0; t < n; t++)
            for (int i = 0; i < hd; i++) fd += dout[t * Qs + i] * (o1[t * Qs + i] - o2[t * Qs + i]) / (2 * h);
        double an = 0;
        for (int t = 0; t < n; t++)
            for (int i = 0; i < hd; i++) an += (double)dq[t * Qs + i] * dirs[0][t * Qs + i];
        an += dot_f(dk, dirs[1], (size_t)n * KVs) + dot_f(dv, dirs[2], (size_t)n * KVs);
        CHECK(fabs(an - fd) < 1e-3 * (fabs(fd) + 1), "attention backward window %d: %g vs %g", window, an, fd);
        free(q), free(k), free(v), free(dout), free(dq), free(dk), free(dv), free(scr), free(o1), free(o2);
        free(dq64), free(dk64), free(dv64);
        for (int i = 0; i < 3; i++) free(dirs[i]);
    }
    free(cs), free(sn), free(ry), free(rd), free(rdd);
    ac_arch_free(&a);
    free(x), free(W), free(dy), free(dx), free(dW), free(db), free(b), free(dir), free(yp), free(ym), free(xp),
        free(xm);
    free(xn), free(w), free(dyn), free(xh), free(rr), free(yy), free(dxn), free(dwn), free(dirn), free(rp), free(rm);
    free(xnp), free(xnm), free(g), free(u), free(dh), free(dg), free(du);
}

/* The recipe is consistent: each op reads slots written before it in its
 * sub-block (or x), each LINEAR's widths are its slots' widths, and every
 * weight and norm of the layer is used exactly once. */
static void test_recipe_consistent(void) {
    for (int qk = 0; qk < 2; qk++) {
        ac_arch a = mk_arch(1, 8, 4, 2, 1, 6, 16);
        a.qk_norm = qk;
        const ac_block_recipe *r = ac_block_recipe_of(&a, 0);
        int width[AC_T_COUNT] = {AC_DIM_H, AC_DIM_H, AC_DIM_Q, AC_DIM_KV, AC_DIM_KV, AC_DIM_Q, AC_DIM_F, AC_DIM_F};
        int wused[7] = {0}, nused[4] = {0};
        CHECK(r && r->n_sub == 2 && r->n_sub <= AC_BLOCK_MAX_SUB, "two sub-blocks");
        CHECK(r && !strcmp(r->name, qk ? "qwen3" : "llama"), "recipe %s", r ? r->name : "none");
        for (int s = 0; r && s < r->n_sub; s++) {
            int written = 1 << AC_T_X, merged = 0, roped = 0;
            CHECK(r->sub[s].n_ops <= AC_BLOCK_MAX_OPS, "%s has %d ops", r->sub[s].name, r->sub[s].n_ops);
            for (int i = 0; i < r->sub[s].n_ops; i++) {
                const ac_op *op = &r->sub[s].ops[i];
                CHECK(written >> op->in & 1, "%s op %d reads slot %d before it is written", r->sub[s].name, i, op->in);
                if (op->kind == AC_OP_ATTENTION)
                    CHECK((written >> op->in2 & 1) && (written >> op->in3 & 1), "attention reads k, v unwritten");
                if (op->kind == AC_OP_LINEAR) {
                    CHECK(op->w >= 0 && op->w < 7, "matrix");
                    wused[op->w]++;
                    CHECK(width[op->in] == op->din && width[op->out] == op->dout, "%s op %d widths", r->sub[s].name, i);
                }
                if (op->kind == AC_OP_RMSNORM || op->kind == AC_OP_HEAD_NORM) nused[op->w]++;
                if (op->kind == AC_OP_HEAD_NORM) /* in place on q or k, over its own heads, after a KV merge
                                                    * (as the merged export norms the pooled head), before RoPE */
                    CHECK(op->in == op->out && width[op->out] == op->heads && op->dout == op->heads &&
                              (op->w == AC_NORM_Q) == (op->out == AC_T_Q) && merged && !(roped >> op->out & 1),
                          "head norm op %d", i);
                if (op->kind == AC_OP_KV_MERGE) merged = 1;
                if (op->kind == AC_OP_ROPE) roped |= 1 << op->out;
                written |= 1 << op->out;
            }
        }
        for (int i = 0; i < 7; i++) CHECK(wused[i] == 1, "matrix %d used %d times", i, wused[i]);
        CHECK(nused[0] == 1 && nused[1] == 1 && nused[2] == qk && nused[3] == qk, "norms used %d, %d, %d, %d times",
              nused[0], nused[1], nused[2], nused[3]);
        ac_arch_free(&a);
    }
}

/* ---- the Mamba-2 ops (nemotron_h), float64 from their definitions ---- */
typedef struct {
    int B, n, nh, P, Ns, G, K;
    double *zx, *xbc, *y, *cw, *cb, *dtb, *alog, *d, *nw, *dout; /* the op's inputs, parameters, output weights */
    int op; /* 0 conv, 1 scan, 2 gated norm */
} ssm_ref;
static int sr_di(const ssm_ref *r) { return r->nh * r->P; }
static int sr_c(const ssm_ref *r) { return sr_di(r) + 2 * r->G * r->Ns; }
static int sr_si(const ssm_ref *r) { return sr_di(r) + sr_c(r) + r->nh; }
static double sr_sig(double x) { return 1 / (1 + exp(-x)); }
/* out[B*n][C] = silu(b + sum_k w[c][k] xBC[t-K+1+k][c]) */
static void sr_conv(const ssm_ref *r, double *out) {
    int di = sr_di(r), C = sr_c(r), SI = sr_si(r);
    for (int b = 0; b < r->B; b++)
        for (int t = 0; t < r->n; t++)
            for (int c = 0; c < C; c++) {
                double p = r->cb[c];
                for (int k = 0; k < r->K; k++) {
                    int j = t - r->K + 1 + k;
                    if (j >= 0) p += r->cw[c * r->K + k] * r->zx[((size_t)b * r->n + j) * SI + di + c];
                }
                out[((size_t)b * r->n + t) * C + c] = p * sr_sig(p);
            }
}
/* S = exp(dt A) S + dt x B^T, y = S C + D x per head, A = -exp(A_log), dt = softplus(dt + dt_bias) */
static void sr_scan(const ssm_ref *r, double *out) {
    int di = sr_di(r), C = sr_c(r), SI = sr_si(r), P = r->P, Ns = r->Ns;
    double *S = malloc(sizeof(double) * P * Ns);
    for (int b = 0; b < r->B; b++)
        for (int h = 0; h < r->nh; h++) {
            int g = h / (r->nh / r->G);
            memset(S, 0, sizeof(double) * P * Ns);
            for (int t = 0; t < r->n; t++) {
                size_t row = (size_t)b * r->n + t;
                const double *x = r->xbc + row * C + h * P, *Bv = r->xbc + row * C + di + g * Ns,
                             *Cv = r->xbc + row * C + di + r->G * Ns + g * Ns;
                double dt = log1p(exp(r->zx[row * SI + di + C + h] + r->dtb[h])), a = exp(-dt * exp(r->alog[h]));
                for (int p = 0; p < P; p++) {
                    double acc = 0;
                    for (int k = 0; k < Ns; k++) {
                        S[p * Ns + k] = a * S[p * Ns + k] + dt * x[p] * Bv[k];
                        acc += S[p * Ns + k] * Cv[k];
                    }
                    out[row * di + h * P + p] = acc + r->d[h] * x[p];
                }
            }
        }
    free(S);
}
/* out = rmsnorm per group of (y * silu(z)) * w */
static void sr_gnorm(const ssm_ref *r, double *out) {
    int di = sr_di(r), SI = sr_si(r), gs = di / r->G;
    for (size_t row = 0; row < (size_t)r->B * r->n; row++)
        for (int g = 0; g < r->G; g++) {
            double ss = 0, v[64];
            for (int c = 0; c < gs; c++) {
                double z = r->zx[row * SI + g * gs + c];
                v[c] = r->y[row * di + g * gs + c] * z * sr_sig(z);
                ss += v[c] * v[c];
            }
            for (int c = 0; c < gs; c++) out[row * di + g * gs + c] = v[c] / sqrt(ss / gs + 1e-5) * r->nw[g * gs + c];
        }
}
/* L = <dout, op(...)> */
static double sr_loss(const ssm_ref *r) {
    size_t N = (size_t)r->B * r->n, w = r->op == 0 ? (size_t)sr_c(r) : (size_t)sr_di(r);
    double *o = malloc(sizeof(double) * N * w), L = 0;
    if (r->op == 0) sr_conv(r, o);
    if (r->op == 1) sr_scan(r, o);
    if (r->op == 2) sr_gnorm(r, o);
    for (size_t i = 0; i < N * w; i++) L += r->dout[i] * o[i];
    free(o);
    return L;
}
/* (L(p + h dir) - L(p - h dir)) / 2h against <grad, dir>, relative */
static double sr_fd(ssm_ref *r, double *p, const float *grad, size_t n, double h) {
    double *dir = malloc(sizeof(double) * n), an = 0;
    for (size_t i = 0; i < n; i++) dir[i] = frand(), an += dir[i] * grad[i];
    for (size_t i = 0; i < n; i++) p[i] += h * dir[i];
    double lp = sr_loss(r);
    for (size_t i = 0; i < n; i++) p[i] -= 2 * h * dir[i];
    double lm = sr_loss(r);
    for (size_t i = 0; i < n; i++) p[i] += h * dir[i];
    free(dir);
    double fd = (lp - lm) / (2 * h);
    return fabs(an - fd) / (fabs(fd) + 1e-3);
}
static double *sr_dbl(const float *f, size_t n) {
    double *d = malloc(sizeof(double) * n);
    for (size_t i = 0; i < n; i++) d[i] = f[i];
    return d;
}

/* The Mamba-2 ops and the squared ReLU: forward against float64 references
 * of their definitions (odd shapes: 4 heads of width 3 in 2 groups, state
 * 5, kernel 4); the conv and scan continued from their decode state equal
 * one call over all rows; every backward (inputs and parameters) against
 * central differences of the float64 references; the nemotron_h recipe's
 * consistency. */
static void test_ssm_ops_f64(void) {
    int B = 2, n = 6, nh = 4, P = 3, Ns = 5, G = 2, K = 4;
    int di = nh * P, C = di + 2 * G * Ns, SI = di + C + nh;
    size_t N = (size_t)B * n;
    float *zx = rnd(N * SI, 1), *cw = rnd((size_t)C * K, 0.6f), *cb = rnd(C, 0.3f), *dtb = rnd(nh, 1),
          *alog = rnd(nh, 1), *dd = rnd(nh, 1), *nw = rnd(di, 1);
    ac_ssm s = {nh, P, Ns, G, K, cw, cb, dtb, alog, dd, nw, 1e-5f, NULL, NULL};
    float *xbc = malloc(N * C * 4), *y = malloc(N * di * 4), *yn = malloc(N * di * 4), *work = malloc(4096 * 4);
    ac_ssm_conv_fwd(&s, xbc, zx, B, n, NULL, 0);
    ac_ssm_scan_fwd(&s, y, xbc, zx, B, n, NULL, 0, work);
    ac_ssm_gated_norm_fwd(&s, yn, y, zx, (int)N);
    ssm_ref r = {B, n, nh, P, Ns, G, K, sr_dbl(zx, N * SI), sr_dbl(xbc, N * C), sr_dbl(y, N * di), sr_dbl(cw, C * K),
                 sr_dbl(cb, C), sr_dbl(dtb, nh), sr_dbl(alog, nh), sr_dbl(dd, nh), sr_dbl(nw, di), NULL, 0};
    double *ref = malloc(sizeof(double) * N * C);
    sr_conv(&r, ref);
    CHECK(relerr(xbc, ref, N * C) < 1e-6, "ssm conv: %g", relerr(xbc, ref, N * C));
    sr_scan(&r, ref);
    CHECK(relerr(y, ref, N * di) < 1e-5, "ssm scan: %g", relerr(y, ref, N * di));
    sr_gnorm(&r, ref);
    CHECK(relerr(yn, ref, N * di) < 1e-5, "gated norm: %g", relerr(yn, ref, N * di));
    /* decode state: rows [0, 4) then [4, 6) of each sequence equal one call */
    {
        int n1 = 4, n2 = n - n1;
        float *cst = malloc((size_t)B * (K - 1) * C * 4), *sst = malloc((size_t)B * nh * P * Ns * 4);
        float *z1 = malloc((size_t)B * n1 * SI * 4), *z2 = malloc((size_t)B * n2 * SI * 4);
        float *x1 = malloc((size_t)B * n1 * C * 4), *x2 = malloc((size_t)B * n2 * C * 4);
        float *y1 = malloc((size_t)B * n1 * di * 4), *y2 = malloc((size_t)B * n2 * di * 4);
        for (int b = 0; b < B; b++) {
            memcpy(z1 + (size_t)b * n1 * SI, zx + (size_t)b * n * SI, (size_t)n1 * SI * 4);
            memcpy(z2 + (size_t)b * n2 * SI, zx + ((size_t)b * n + n1) * SI, (size_t)n2 * SI * 4);
        }
        ac_ssm_conv_fwd(&s, x1, z1, B, n1, cst, 0);
        ac_ssm_scan_fwd(&s, y1, x1, z1, B, n1, sst, 0, NULL);
        ac_ssm_conv_fwd(&s, x2, z2, B, n2, cst, 1);
        ac_ssm_scan_fwd(&s, y2, x2, z2, B, n2, sst, 1, NULL);
        double dx = 0, dy = 0;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < n2; t++) {
                for (int c = 0; c < C; c++)
                    dx = fmax(dx, fabs(x2[((size_t)b * n2 + t) * C + c] - xbc[((size_t)b * n + n1 + t) * C + c]));
                for (int c = 0; c < di; c++)
                    dy = fmax(dy, fabs(y2[((size_t)b * n2 + t) * di + c] - y[((size_t)b * n + n1 + t) * di + c]));
            }
        CHECK(dx < 1e-6 && dy < 1e-5, "ssm state continuation: conv %g, scan %g", dx, dy);
        free(cst), free(sst), free(z1), free(z2), free(x1), free(x2), free(y1), free(y2);
    }
    /* backward, each op against central differences (h = 1e-5 in float64) */
    float *g_out = rnd(N * C, 1), *dzx = calloc(N * SI, 4), *dxbc = calloc(N * C, 4), *dy = calloc(N * di, 4);
    float *gcw = calloc((size_t)C * K, 4), *gcb = calloc(C, 4), *gdtb = calloc(nh, 4), *gal = calloc(nh, 4),
          *gd = calloc(nh, 4), *gnw = calloc(di, 4), *swork = malloc(ac_ssm_scan_work(&s, n) * 4);
    r.dout = sr_dbl(g_out, N * C);
    double h = 1e-5, tol = 1e-4;
    /* gated norm: dy, dz, dw */
    r.op = 2;
    ac_ssm_gated_norm_bwd(&s, dy, dzx, gnw, NULL, NULL, g_out, y, zx, (int)N);
    {
        float *dzc = calloc(N * SI, 4); /* the z columns only: the direction lives there */
        for (size_t i = 0; i < N; i++) memcpy(dzc + i * SI, dzx + i * SI, di * 4);
        double *zs = r.zx;
        double e1 = sr_fd(&r, r.y, dy, N * di, h), e2 = sr_fd(&r, zs, dzc, N * SI, h), e3 = sr_fd(&r, r.nw, gnw, di, h);
        CHECK(e1 < tol && e2 < tol && e3 < tol, "gated norm backward: dy %g, dz %g, dw %g", e1, e2, e3);
        free(dzc);
    }
    /* scan: dxbc, d dt (zx's dt columns), d dt_bias, d A_log, dD */
    r.op = 1;
    memset(dzx, 0, N * SI * 4);
    ac_ssm_scan_bwd(&s, dxbc, dzx, gdtb, gal, gd, g_out, xbc, zx, B, n, swork);
    {
        double e1 = sr_fd(&r, r.xbc, dxbc, N * C, h), e2 = sr_fd(&r, r.zx, dzx, N * SI, h),
               e3 = sr_fd(&r, r.dtb, gdtb, nh, h), e4 = sr_fd(&r, r.alog, gal, nh, h), e5 = sr_fd(&r, r.d, gd, nh, h);
        CHECK(e1 < tol && e2 < tol && e3 < tol && e4 < tol && e5 < tol,
              "scan backward: dxbc %g, ddt %g, ddt_bias %g, dA_log %g, dD %g", e1, e2, e3, e4, e5);
    }
    /* conv: zx's xBC columns, dw, db */
    r.op = 0;
    memset(dzx, 0, N * SI * 4);
    ac_ssm_conv_bwd(&s, dzx, gcw, gcb, g_out, zx, B, n);
    {
        double e1 = sr_fd(&r, r.zx, dzx, N * SI, h), e2 = sr_fd(&r, r.cw, gcw, (size_t)C * K, h),
               e3 = sr_fd(&r, r.cb, gcb, C, h);
        CHECK(e1 < tol && e2 < tol && e3 < tol, "conv backward: dx %g, dw %g, db %g", e1, e2, e3);
    }
    /* relu^2 */
    {
        float *u = rnd(40, 1), *o = malloc(40 * 4), *du = malloc(40 * 4);
        ac_relu2_fwd(o, u, 40);
        ac_relu2_bwd(du, g_out, u, 40);
        double md = 0;
        for (int i = 0; i < 40; i++) {
            double want = u[i] > 0 ? (double)u[i] * u[i] : 0, dwant = u[i] > 0 ? 2.0 * u[i] * g_out[i] : 0;
            md = fmax(md, fabs(o[i] - want) + fabs(du[i] - dwant));
        }
        CHECK(md < 1e-6, "relu2: %g", md);
        free(u), free(o), free(du);
    }
    /* the recipe: every slot written before it is read, each op's widths those of its slots */
    {
        ac_arch a = mk_arch(3, 8, 4, 2, 1, 6, 16);
        a.hybrid = 1, a.ssm_head_dim = P, a.ssm_state = Ns, a.ssm_groups = G, a.ssm_conv = K;
        a.layers[0] = (ac_layer_arch){0, 0, 0, 0, 0, nh};
        a.layers[1] = (ac_layer_arch){0, 0, 6, 0, 0, 0};
        a.layers[2] = (ac_layer_arch){2, 1, 0, 0, 0, 0};
        const ac_block_recipe *rc = ac_block_recipe_of(&a, 0);
        CHECK(rc && !strcmp(rc->name, "nemotron_h") && rc->n_sub == 4, "nemotron_h recipe");
        for (int l = 0; rc && l < 3; l++) {
            int present = 0;
            for (int sb = 0; sb < rc->n_sub; sb++) {
                present += ac_block_sub_present(&a, l, &rc->sub[sb]);
                int written = 1 << AC_T_X;
                for (int i = 0; i < rc->sub[sb].n_ops; i++) {
                    const ac_op *op = &rc->sub[sb].ops[i];
                    CHECK(written >> op->in & 1, "%s op %d reads slot %d unwritten", rc->sub[sb].name, i, op->in);
                    if (op->kind == AC_OP_SSM_SCAN || op->kind == AC_OP_GATED_NORM)
                        CHECK(written >> op->in2 & 1 && op->in2 == AC_T_ZX, "%s op %d reads zx", rc->sub[sb].name, i);
                    if (op->kind == AC_OP_LINEAR || op->kind >= AC_OP_RELU2)
                        CHECK(ac_block_slot_dim(op->in) == op->din && ac_block_slot_dim(op->out) == op->dout,
                              "%s op %d widths", rc->sub[sb].name, i);
                    written |= 1 << op->out;
                }
            }
            CHECK(present == 1, "layer %d runs %d sub-blocks", l, present);
        }
        CHECK(ac_block_dim(&a, 0, AC_DIM_SI) == SI && ac_block_dim(&a, 0, AC_DIM_SC) == C &&
                  ac_block_dim(&a, 1, AC_DIM_SSM) == 0,
              "ssm widths");
        ac_arch_free(&a);
    }
    free(zx), free(cw), free(cb), free(dtb), free(alog), free(dd), free(nw), free(xbc), free(y), free(yn), free(work);
    free(ref), free(g_out), free(dzx), free(dxbc), free(dy), free(gcw), free(gcb), free(gdtb), free(gal), free(gd);
    free(gnw), free(swork);
    double *dbl[] = {r.zx, r.xbc, r.y, r.cw, r.cb, r.dtb, r.alog, r.d, r.nw, r.dout};
    for (size_t i = 0; i < sizeof dbl / sizeof *dbl; i++) free(dbl[i]);
}

/* ---- the layer in float64, from the HF semantics (with the masks) ---- */
typedef struct {
    const float *hm, *fm, *hid;
    int merge, kept;
    const float *gh;  /* hidden gates of the gated RMSNorm (block_grad.h), NULL = 1 */
    const float *sub; /* [2] scales of the sub-blocks' residual adds, NULL = 1 */
} ref_mod;
static void ref_norm(double *y, const double *x, const float *w, int N, int H, double eps, const ref_mod *md) {
    const float *gh = md ? md->gh : NULL;
    double G = 0;
    for (int c = 0; c < H; c++) G += gh ? gh[c] : 1;
    for (int r = 0; r < N; r++) {
        double ss = 0;
        for (int c = 0; c < H; c++) ss += (gh ? gh[c] : 1) * x[r * H + c] * x[r * H + c];
        double s = 1.0 / sqrt(ss / (md && md->hid ? md->kept : G) + eps);
        for (int c = 0; c < H; c++) y[r * H + c] = x[r * H + c] * s * w[c] * (gh ? gh[c] : 1);
    }
}
static void ref_lin(double *y, const double *x, const float *W, const float *b, int N, int in, int out, double acc) {
    for (int r = 0; r < N; r++)
        for (int o = 0; o < out; o++) {
            double s = b ? b[o] : 0;
            for (int i = 0; i < in; i++) s += x[r * in + i] * W[o * in + i];
            y[r * out + o] = (acc != 0 ? y[r * out + o] + acc * s : s);
        }
}
/* x[B*n][H] of sequences whose rows sit at positions pos0.. with keys and
 * values k, v [B][S][KV] filled for positions < pos0 (cache) */
static void ref_layer(double *x, const ac_model *m, int l, int B, int n, int pos0, double *kc, double *vc, int S,
                      const float *cs, const float *sn, const ref_mod *md) {
    const ac_arch *a = &m->a;
    const ac_layer_arch *la = &a->layers[l];
    const ac_layer_w *w = &m->L[l];
    int H = a->hidden, hd = a->head_dim, N = B * n, Q = la->n_heads * hd, KV = la->n_kv_heads * hd, F = la->ffn;
    double *xn = malloc((size_t)N * H * 8), *q = malloc((size_t)N * (Q + 1) * 8), *k = malloc((size_t)N * (KV + 1) * 8),
           *v = malloc((size_t)N * (KV + 1) * 8), *att = calloc((size_t)N * (Q + 1), 8),
           *gg = malloc((size_t)N * (F + 1) * 8), *uu = malloc((size_t)N * (F + 1) * 8);
    int *pos = malloc(N * sizeof *pos);
    for (int r = 0; r < N; r++) pos[r] = pos0 + r % n;
    if (Q) {
        ref_norm(xn, x, w->in_norm, N, H, a->eps, md);
        ref_lin(q, xn, w->wq, w->bq, N, H, Q, 0);
        ref_lin(k, xn, w->wk, w->bk, N, H, KV, 0);
        ref_lin(v, xn, w->wv, w->bv, N, H, KV, 0);
        if (md && md->merge) {
            int nkv = la->n_kv_heads, f = nkv / md->merge;
            for (double *t = k; t; t = t == k ? v : NULL)
                for (int r = 0; r < N; r++)
                    for (int j = 0; j < md->merge; j++)
                        for (int i = 0; i < hd; i++) {
                            double s = 0;
                            for (int z = 0; z < f; z++) s += t[r * KV + (j * f + z) * hd + i];
                            for (int z = 0; z < f; z++) t[r * KV + (j * f + z) * hd + i] = s / f;
                        }
        }
        ref_rope(q, N, la->n_heads, hd, pos, cs, sn);
        ref_rope(k, N, la->n_kv_heads, hd, pos, cs, sn);
        int grp = la->n_heads / la->n_kv_heads;
        for (int b = 0; b < B; b++) {
            memcpy(kc + ((size_t)b * S + pos0) * KV, k + (size_t)b * n * KV, (size_t)n * KV * 8);
            memcpy(vc + ((size_t)b * S + pos0) * KV, v + (size_t)b * n * KV, (size_t)n * KV * 8);
            for (int hh = 0; hh < la->n_heads; hh++)
                ref_attention(att + (size_t)b * n * Q + hh * hd, q + (size_t)b * n * Q + hh * hd,
                              kc + (size_t)b * S * KV + (hh / grp) * hd, vc + (size_t)b * S * KV + (hh / grp) * hd, n,
                              pos0, hd, Q, KV, a->sliding_window);
        }
        if (md && md->hm)
            for (int i = 0; i < N * Q; i++) att[i] *= md->hm[(i % Q) / hd];
        ref_lin(x, att, w->wo, NULL, N, Q, H, md && md->sub ? md->sub[0] : 1);
        if (md && md->hid)
            for (int i = 0; i < N * H; i++) x[i] *= md->hid[i % H];
    }
    if (F) {
        ref_norm(xn, x, w->post_norm, N, H, a->eps, md);
        ref_lin(gg, xn, w->wg, NULL, N, H, F, 0);
        ref_lin(uu, xn, w->wu, NULL, N, H, F, 0);
        for (int i = 0; i < N * F; i++) gg[i] = silu(gg[i]) * uu[i] * (md && md->fm ? md->fm[i % F] : 1);
        ref_lin(x, gg, w->wd, NULL, N, F, H, md && md->sub ? md->sub[1] : 1);
        if (md && md->hid)
            for (int i = 0; i < N * H; i++) x[i] *= md->hid[i % H];
    }
    free(xn), free(q), free(k), free(v), free(att), free(gg), free(uu), free(pos);
}

static void fill(float *p, size_t n, float scale) {
    for (size_t i = 0; p && i < n; i++) p[i] = frand() * scale;
}
/* A random model of heterogeneous layers (attention-only, FFN-only, GQA,
 * qkv biases), odd widths. */
static int random_model(ac_model *m, ac_err *e) {
    ac_arch a = mk_arch(4, 13, 6, 3, 1, 7, 11);
    a.layers[1] = (ac_layer_arch){4, 2, 0, 0, 0, 0};
    a.layers[2] = (ac_layer_arch){0, 0, 9, 0, 0, 0};
    a.layers[3] = (ac_layer_arch){2, 2, 5, 0, 0, 0};
    a.sliding_window = 4; /* a window shorter than the rows */
    a.qkv_bias = 1;
    int rc = ac_model_alloc(m, &a, e);
    ac_arch_free(&a);
    if (rc) return rc;
    for (int l = 0; l < m->a.n_layers; l++) {
        ac_layer_w *w = &m->L[l];
        const ac_layer_arch *la = &m->a.layers[l];
        size_t H = m->a.hidden, Q = la->n_heads * 6, KV = la->n_kv_heads * 6, F = la->ffn;
        fill(w->in_norm, Q ? H : 0, 1), fill(w->post_norm, F ? H : 0, 1);
        fill(w->wq, Q * H, 0.4f), fill(w->wk, KV * H, 0.4f), fill(w->wv, KV * H, 0.4f), fill(w->wo, H * Q, 0.4f);
        fill(w->bq, w->bq ? Q : 0, 0.2f), fill(w->bk, w->bk ? KV : 0, 0.2f), fill(w->bv, w->bv ? KV : 0, 0.2f);
        fill(w->wg, F * H, 0.4f), fill(w->wu, F * H, 0.4f), fill(w->wd, H * F, 0.4f);
    }
    return 0;
}

/* The executor with a KV cache (the engine's prefill, then a continuation)
 * and with masks (streamed calibration), layer by layer against float64. */
static void test_executor_vs_f64(void) {
    ac_model m;
    ac_err e = {0};
    if (random_model(&m, &e)) {
        CHECK(0, "%s", e.msg);
        return;
    }
    const ac_arch *a = &m.a;
    int B = 2, n1 = 5, n2 = 3, S = n1 + n2, H = a->hidden, hd = a->head_dim;
    int mq = ac_block_dim_max(a, AC_DIM_Q), mkv = ac_block_dim_max(a, AC_DIM_KV), mf = ac_block_dim_max(a, AC_DIM_F);
    size_t N = (size_t)B * n1;
    float *slot[AC_T_COUNT];
    int widths[AC_T_COUNT] = {H, H, mq, mkv, mkv, mq, mf, mf};
    for (int i = 0; i < AC_T_COUNT; i++) slot[i] = calloc(N * widths[i], 4);
    float *cs = malloc((size_t)S * hd / 2 * 4), *sn = malloc((size_t)S * hd / 2 * 4), *sc = malloc((size_t)S * S * 4);
    CHECK(ac_rope_tables(a, S, cs, sn, &e) == 0, "%s", e.msg);
    float **kc = calloc(a->n_layers, sizeof *kc), **vc = calloc(a->n_layers, sizeof *vc);
    double **rk = calloc(a->n_layers, sizeof *rk), **rv = calloc(a->n_layers, sizeof *rv);
    for (int l = 0; l < a->n_layers; l++) {
        kc[l] = calloc((size_t)B * S * mkv, 4), vc[l] = calloc((size_t)B * S * mkv, 4);
        rk[l] = calloc((size_t)B * S * mkv, 8), rv[l] = calloc((size_t)B * S * mkv, 8);
    }
    int pos[16];
    ac_block_cpu c = {.m = &m, .pos = pos, .cos_t = cs, .sin_t = sn, .kc = kc, .vc = vc, .max_ctx = S, .scores = sc};
    memcpy(c.slot, slot, sizeof slot);
    double *rx = malloc(N * H * 8);
    fill(slot[AC_T_X], N * H, 1);
    for (size_t i = 0; i < N * H; i++) rx[i] = slot[AC_T_X][i];
    for (int step = 0; step < 2; step++) {
        int n = step ? n2 : n1, pos0 = step ? n1 : 0;
        if (step) { /* the continuation: new rows */
            fill(slot[AC_T_X], (size_t)B * n * H, 1);
            for (size_t i = 0; i < (size_t)B * n * H; i++) rx[i] = slot[AC_T_X][i];
        }
        for (int r = 0; r < B * n; r++) pos[r] = pos0 + r % n;
        for (int l = 0; l < a->n_layers; l++) {
            ac_block_cpu_forward(&c, l, B, n, pos0);
            ref_layer(rx, &m, l, B, n, pos0, rk[l], rv[l], S, cs, sn, NULL);
            double err = relerr(slot[AC_T_X], rx, (size_t)B * n * H);
            CHECK(err < 2e-5, "step %d layer %d: %g", step, l, err);
        }
    }
    /* masks, windows from 0 without a cache: heads, FFN channels, a KV merge, hidden channels */
    float hm[4] = {1, 0, 1, 0}, fm[9] = {1, 1, 0, 1, 0, 1, 1, 0, 1}, hid[13];
    for (int i = 0; i < H; i++) hid[i] = i % 4 == 2 ? 0 : 1;
    int kept = 0;
    for (int i = 0; i < H; i++) kept += hid[i] != 0;
    int layers_kvm[4] = {0, 1, 0, 0}; /* a merge of layer 1's two KV heads into one */
    for (int l = 0; l < a->n_layers; l++) {
        ac_block_mod mod = {.head_mask = l != 2 ? hm : NULL,
                            .ffn_mask = a->layers[l].ffn ? fm : NULL,
                            .kv_merge = layers_kvm[l],
                            .hid_mask = hid,
                            .hid_kept = kept};
        ref_mod md = {mod.head_mask, mod.ffn_mask, hid, layers_kvm[l], kept, NULL, NULL};
        c.kc = c.vc = NULL;
        c.mod = &mod;
        fill(slot[AC_T_X], N * H, 1);
        for (size_t i = 0; i < N * H; i++) rx[i] = slot[AC_T_X][i] *= hid[i % H];
        for (int r = 0; r < (int)N; r++) pos[r] = r % n1;
        ac_block_cpu_forward(&c, l, B, n1, 0);
        for (int i = 0; i < a->n_layers; i++) memset(rk[i], 0, (size_t)B * S * mkv * 8);
        ref_layer(rx, &m, l, B, n1, 0, rk[0], rv[0], n1, cs, sn, &md);
        double err = relerr(slot[AC_T_X], rx, N * H);
        CHECK(err < 2e-5, "masked layer %d: %g", l, err);
    }
    for (int l = 0; l < a->n_layers; l++) free(kc[l]), free(vc[l]), free(rk[l]), free(rv[l]);
    for (int i = 0; i < AC_T_COUNT; i++) free(slot[i]);
    free(kc), free(vc), free(rk), free(rv), free(cs), free(sn), free(sc), free(rx);
    ac_model_free(&m);
}

/* The CPU backward executor on heterogeneous layers with gates: the
 * gradient at the input, of every gate and of the weights, each along a
 * random direction, against a central difference of the float64 layer. */
static double ref_loss(const ac_model *m, int l, const float *x, const float *dy, int B, int n, const float *cs,
                       const float *sn, const ref_mod *md) {
    const ac_arch *a = &m->a;
    size_t N = (size_t)B * n, H = a->hidden, kvw = (size_t)ac_block_dim_max(a, AC_DIM_KV);
    double *rx = malloc(N * H * 8), *kc = calloc(N * kvw, 8), *vc = calloc(N * kvw, 8), s = 0;
    for (size_t i = 0; i < N * H; i++) rx[i] = x[i];
    ref_layer(rx, m, l, B, n, 0, kc, vc, n, cs, sn, md);
    for (size_t i = 0; i < N * H; i++) s += rx[i] * dy[i];
    free(rx), free(kc), free(vc);
    return s;
}

static void test_grad_executor_vs_f64(void) {
    ac_model m, gm;
    ac_err e = {0};
    if (random_model(&m, &e) || ac_model_alloc(&gm, &m.a, &e)) {
        CHECK(0, "%s", e.msg);
        return;
    }
    const ac_arch *a = &m.a;
    int B = 2, T = 5, N = B * T, H = a->hidden, hd = a->head_dim;
    float *cs = malloc((size_t)T * hd / 2 * 4), *sn = malloc((size_t)T * hd / 2 * 4);
    CHECK(ac_rope_tables(a, T, cs, sn, &e) == 0, "%s", e.msg);
    int pos[10];
    for (int r = 0; r < N; r++) pos[r] = r % T;
    float *scr = malloc(ac_block_grad_scratch_floats(a, B, T) * 4);
    for (int l = 0; l < a->n_layers; l++) {
        const ac_layer_arch *la = &a->layers[l];
        float *tape = malloc((ac_block_tape_floats(a, l, N, 0) + 1) * 4);
        float *gq = rnd(la->n_heads + 1, 0.5f), *gf = rnd(la->ffn + 1, 0.5f), *gh = rnd(H, 0.3f), sub[2] = {0.7f, 1.3f};
        for (int i = 0; i < la->n_heads; i++) gq[i] += 1;
        for (int i = 0; i < la->ffn; i++) gf[i] += 1;
        for (int i = 0; i < H; i++) gh[i] += 1;
        float *dq = calloc(la->n_heads + 1, 4), *df = calloc(la->ffn + 1, 4), *dh = calloc(H, 4), dsub[2] = {0, 0};
        ac_block_grad c = {.m = &m,
                           .w = &m.L[l],
                           .wdt = ST_F32,
                           .gw = &gm.L[l],
                           .B = B,
                           .T = T,
                           .pos = pos,
                           .cos_t = cs,
                           .sin_t = sn,
                           .tape = tape,
                           .scratch = scr,
                           .sub_gate = sub,
                           .dsub_gate = dsub};
        c.gate[AC_DIM_Q] = gq, c.gate[AC_DIM_F] = gf, c.gate[AC_DIM_H] = gh;
        c.dgate[AC_DIM_Q] = dq, c.dgate[AC_DIM_F] = df, c.dgate[AC_DIM_H] = dh;
        float *x = rnd((size_t)N * H, 1), *dy = rnd((size_t)N * H, 1), *xo = malloc((size_t)N * H * 4);
        float *dx = malloc((size_t)N * H * 4);
        memcpy(xo, x, (size_t)N * H * 4);
        memcpy(dx, dy, (size_t)N * H * 4);
        ac_block_grad_forward(&c, l, xo);
        ref_mod md = {gq, gf, NULL, 0, 0, gh, sub};
        /* the forward itself */
        size_t kvw = (size_t)ac_block_dim_max(a, AC_DIM_KV);
        double *rx = malloc((size_t)N * H * 8), *kc = calloc(N * kvw, 8), *vc = calloc(N * kvw, 8);
        for (int i = 0; i < N * H; i++) rx[i] = x[i];
        ref_layer(rx, &m, l, B, T, 0, kc, vc, T, cs, sn, &md);
        CHECK(relerr(xo, rx, (size_t)N * H) < 2e-5, "layer %d forward: %g", l, relerr(xo, rx, (size_t)N * H));
        free(rx), free(kc), free(vc);
        ac_block_grad_backward(&c, l, dx);
        double h = 1e-3;
        /* input: <dx, d> vs (L(x + h d) - L(x - h d)) / 2h */
        float *d = rnd((size_t)N * H, 1), *xp = malloc((size_t)N * H * 4);
        for (int i = 0; i < N * H; i++) xp[i] = x[i] + h * d[i];
        double lp = ref_loss(&m, l, xp, dy, B, T, cs, sn, &md);
        for (int i = 0; i < N * H; i++) xp[i] = x[i] - h * d[i];
        double lm = ref_loss(&m, l, xp, dy, B, T, cs, sn, &md), fd = (lp - lm) / (2 * h);
        double an = dot_f(dx, d, (size_t)N * H);
        CHECK(fabs(an - fd) < 2e-3 * (fabs(fd) + 1), "layer %d dx: %g vs %g", l, an, fd);
        /* each gate vector and the sub-block scales, along a random direction */
        struct {
            float *g, *dg;
            int n;
            const char *what;
        } gs[] = {{gq, dq, la->n_heads, "head gates"},
                  {gf, df, la->ffn, "FFN gates"},
                  {gh, dh, H, "hidden gates"},
                  {sub, dsub, 2, "sub-block gates"}};
        for (size_t k = 0; k < sizeof gs / sizeof *gs; k++) {
            if (!gs[k].n) continue;
            float *g0 = malloc(gs[k].n * 4), *dd = rnd(gs[k].n, 1);
            memcpy(g0, gs[k].g, gs[k].n * 4);
            for (int i = 0; i < gs[k].n; i++) gs[k].g[i] = g0[i] + h * dd[i];
            lp = ref_loss(&m, l, x, dy, B, T, cs, sn, &md);
            for (int i = 0; i < gs[k].n; i++) gs[k].g[i] = g0[i] - h * dd[i];
            lm = ref_loss(&m, l, x, dy, B, T, cs, sn, &md);
            memcpy(gs[k].g, g0, gs[k].n * 4);
            fd = (lp - lm) / (2 * h);
            an = dot_f(gs[k].dg, dd, gs[k].n);
            if (gs[k].g == sub && !la->n_heads) an -= dsub[0] * dd[0]; /* absent sub-blocks have no gradient */
            if (gs[k].g == sub && !la->ffn) an -= dsub[1] * dd[1];
            CHECK(fabs(an - fd) < 2e-3 * (fabs(fd) + 1), "layer %d %s: %g vs %g", l, gs[k].what, an, fd);
            free(g0), free(dd);
        }
        /* every weight matrix and bias of the layer */
        for (int wi = 0; wi < 10; wi++) {
            size_t cnt = 0;
            float *W = NULL, *G = NULL;
            if (wi < 7) {
                W = ac_layer_matrix(&m, l, (ac_wmat)wi, &cnt);
                G = ac_layer_matrix(&gm, l, (ac_wmat)wi, &cnt);
            } else {
                W = (float *)ac_block_bias(&m.L[l], wi - 7);
                G = (float *)ac_block_bias(&gm.L[l], wi - 7);
                cnt = W ? (size_t)ac_block_dim(a, l, wi == 7 ? AC_DIM_Q : AC_DIM_KV) : 0;
            }
            if (!W || !cnt) continue;
            float *w0 = malloc(cnt * 4), *dd = rnd(cnt, 1);
            memcpy(w0, W, cnt * 4);
            for (size_t i = 0; i < cnt; i++) W[i] = w0[i] + h * dd[i];
            lp = ref_loss(&m, l, x, dy, B, T, cs, sn, &md);
            for (size_t i = 0; i < cnt; i++) W[i] = w0[i] - h * dd[i];
            lm = ref_loss(&m, l, x, dy, B, T, cs, sn, &md);
            memcpy(W, w0, cnt * 4);
            fd = (lp - lm) / (2 * h);
            an = dot_f(G, dd, cnt);
            CHECK(fabs(an - fd) < 2e-3 * (fabs(fd) + 1), "layer %d weight %d: %g vs %g", l, wi, an, fd);
            free(w0), free(dd);
        }
        free(tape), free(gq), free(gf), free(gh), free(dq), free(df), free(dh), free(x), free(dy), free(xo), free(dx);
        free(d), free(xp);
    }
    free(cs), free(sn), free(scr);
    ac_model_free(&m);
    ac_model_free(&gm);
}

/* max |a - b| / (max |b| + tiny), both float */
static double relerr_f(const float *a, const float *b, size_t n) {
    double mx = 1e-30, d = 0;
    for (size_t i = 0; i < n; i++) {
        if (fabs(b[i]) > mx) mx = fabs(b[i]);
        if (fabs((double)a[i] - b[i]) > d) d = fabs((double)a[i] - b[i]);
    }
    return d / mx;
}

/* Every op of the recipe on the CUDA backend (the trainer's op kernels,
 * through the plugin's op_test: on the CPU emulator here, on the GPU when
 * there is one), forward and backward, against the CPU f32 op (the kernels
 * checked against float64 above), on odd widths with GQA and a window. */
static void cuda_ops(const ac_cuda_api *cu, int qk) {
    ac_arch a = mk_arch(1, 13, 6, 4, 2, 7, 11);
    a.sliding_window = 4;
    a.qk_norm = qk;
    int B = 2, T = 5, N = B * T, H = a.hidden, hd = a.head_dim;
    float *cs = malloc((size_t)T * hd / 2 * 4), *sn = malloc((size_t)T * hd / 2 * 4);
    ac_err e = {0};
    CHECK(ac_rope_tables(&a, T, cs, sn, &e) == 0, "%s", e.msg);
    int pos[10];
    for (int r = 0; r < N; r++) pos[r] = r % T;
    const ac_block_recipe *rec = ac_block_recipe_of(&a, 0);
    int dim[AC_DIM_COUNT], ops = 0;
    for (int d = 0; d < AC_DIM_COUNT; d++) dim[d] = ac_block_dim(&a, 0, (ac_dim)d);
    for (int sb = 0; sb < rec->n_sub; sb++)
        for (int i = 0; i < rec->sub[sb].n_ops; i++) {
            const ac_op *op = &rec->sub[sb].ops[i];
            if (op->kind == AC_OP_KV_MERGE || op->kind == AC_OP_MASK_HIDDEN) continue;
            ops++;
            int din = dim[op->din], dout = dim[op->dout];
            int unit = op->dout == AC_DIM_Q ? hd : 1, units = dout / unit;
            float *x[AC_T_COUNT] = {0}, *dx_c[AC_T_COUNT] = {0}, *dx_g[AC_T_COUNT] = {0};
            int slots[4] = {op->in, op->in2, op->in3, op->out};
            for (int k = 0; k < 4; k++) {
                int sl = slots[k], wd = dim[ac_block_slot_dim(sl)];
                if (x[sl]) continue;
                x[sl] = rnd((size_t)N * wd, 1);
                dx_c[sl] = calloc((size_t)N * wd, 4);
                dx_g[sl] = calloc((size_t)N * wd, 4);
            }
            float *W = rnd((size_t)din * dout + H, 0.4f), *bias = rnd(dout, 0.2f), *gate = rnd(units, 0.3f),
                  *gh = rnd(H, 0.3f), *dy = rnd((size_t)N * dout, 1), *yc = calloc((size_t)N * dout, 4),
                  *yg = calloc((size_t)N * dout, 4), *dwc = calloc((size_t)din * dout + H, 4),
                  *dwg = calloc((size_t)din * dout + H, 4), *dbc = calloc(dout, 4), *dbg = calloc(dout, 4),
                  *dgc = calloc(units > H ? units : H, 4), *dgg = calloc(units > H ? units : H, 4);
            for (int k = 0; k < units; k++) gate[k] += 1;
            for (int k = 0; k < H; k++) gh[k] += 1;
            float alpha = 0.7f, dac = 0, dag = 0;
            int has_b = op->kind == AC_OP_LINEAR && !op->acc && op->w <= AC_W_V;
            /* the CPU f32 op */
            switch ((ac_op_kind)op->kind) {
            case AC_OP_RMSNORM: {
                float *xh = malloc((size_t)N * H * 4), *r = malloc(N * 4);
                ac_rmsnorm_fwd(yc, xh, r, x[op->in], W, gh, N, H, a.eps);
                ac_rmsnorm_backward(dx_c[op->in], dwc, dgc, dy, xh, r, W, gh, N, H);
                free(xh), free(r);
                break;
            }
            case AC_OP_LINEAR:
                if (op->acc) {
                    float *tmp = malloc((size_t)N * dout * 4);
                    ac_linear(tmp, x[op->in], W, NULL, N, din, dout);
                    for (int k = 0; k < N * dout; k++) yc[k] = x[op->out][k] + alpha * tmp[k], dac += dy[k] * tmp[k];
                    ac_linear_backward(dx_c[op->in], dwc, NULL, dy, x[op->in], W, N, din, dout, alpha, 0);
                    free(tmp);
                } else {
                    ac_linear(yc, x[op->in], W, has_b ? bias : NULL, N, din, dout);
                    ac_linear_backward(dx_c[op->in], dwc, has_b ? dbc : NULL, dy, x[op->in], W, N, din, dout, 1.0f, 0);
                }
                break;
            case AC_OP_ROPE:
                memcpy(yc, x[op->out], (size_t)N * dout * 4);
                ac_rope(yc, N, dim[op->heads] / hd, hd, pos, cs, sn);
                memcpy(dx_c[op->in], dy, (size_t)N * dout * 4);
                ac_rope_backward(dx_c[op->in], N, dim[op->heads] / hd, hd, pos, cs, sn);
                break;
            case AC_OP_ATTENTION: {
                int Q = dim[AC_DIM_Q], KV = dim[AC_DIM_KV], grp = a.layers[0].n_heads / a.layers[0].n_kv_heads;
                float *scr = malloc((size_t)2 * T * T * 4);
                for (int b = 0; b < B; b++)
                    for (int h = 0; h < a.layers[0].n_heads; h++) {
                        size_t qo = (size_t)b * T * Q + h * hd, ko = (size_t)b * T * KV + (h / grp) * hd;
                        ac_attention_head(yc + qo, x[op->in] + qo, x[op->in2] + ko, x[op->in3] + ko, T, 0, hd, Q, KV,
                                          a.sliding_window, scr);
                        ac_attention_head_backward(dx_c[op->in] + qo, dx_c[op->in2] + ko, dx_c[op->in3] + ko, dy + qo,
                                                   x[op->in] + qo, x[op->in2] + ko, x[op->in3] + ko, T, hd, Q, KV,
                                                   a.sliding_window, scr);
                    }
                free(scr);
                break;
            }
            case AC_OP_SWIGLU:
                memcpy(yc, x[op->out], (size_t)N * dout * 4);
                ac_silu_mul(yc, x[op->in], (long)N * dout);
                ac_silu_mul_backward(dx_c[op->out], dx_c[op->in], dy, x[op->out], x[op->in], (long)N * dout);
                break;
            case AC_OP_HEAD_NORM: {
                int rows = N * (dim[op->heads] / hd);
                ac_rmsnorm(yc, x[op->in], W, rows, hd, a.eps);
                ac_head_norm_backward(dx_c[op->in], dwc, dy, x[op->in], W, rows, hd, a.eps);
                break;
            }
            case AC_OP_MASK:
                for (int k = 0; k < N * dout; k++) {
                    float g = gate[(k % dout) / unit];
                    yc[k] = x[op->in][k] * g;
                    dx_c[op->in][k] = dy[k] * g;
                    dgc[(k % dout) / unit] += dy[k] * x[op->in][k];
                }
                break;
            default: break;
            }
            /* the same op on the device */
            acc_op_io io = {.y = yg,
                            .dy = dy,
                            .w = W,
                            .b = has_b ? bias : NULL,
                            .gate = gate,
                            .gh = gh,
                            .alpha = alpha,
                            .dw = dwg,
                            .db = has_b ? dbg : NULL,
                            .dalpha = &dag};
            if (op->kind == AC_OP_MASK) io.dgate = dgg;
            if (op->kind == AC_OP_RMSNORM) io.dgh = dgg;
            for (int k = 0; k < AC_T_COUNT; k++) io.x[k] = x[k], io.dx[k] = dx_g[k];
            char err[300] = "";
            int rc = cu->op_test(0, &a, op, B, T, cs, sn, &io, err, sizeof err);
            CHECK(rc == 0, "%s op %d: %s", rec->sub[sb].name, i, err);
            double tol = 1e-4;
            CHECK(relerr_f(yg, yc, (size_t)N * dout) < tol, "%s op %d (kind %d) forward: %g", rec->sub[sb].name, i,
                  op->kind, relerr_f(yg, yc, (size_t)N * dout));
            for (int k = 0; k < 4; k++) {
                int sl = slots[k], wd = dim[ac_block_slot_dim(sl)];
                if (sl == op->out && sl != op->in && op->kind != AC_OP_SWIGLU) continue; /* inputs only */
                if (k && k < 3 && op->kind != AC_OP_ATTENTION) continue; /* in2, in3: attention's only */
                double er = relerr_f(dx_g[sl], dx_c[sl], (size_t)N * wd);
                CHECK(er < tol, "%s op %d (kind %d) gradient of slot %d: %g", rec->sub[sb].name, i, op->kind, sl, er);
            }
            if (op->kind == AC_OP_LINEAR || op->kind == AC_OP_RMSNORM || op->kind == AC_OP_HEAD_NORM) {
                size_t nw = op->kind == AC_OP_RMSNORM     ? (size_t)H
                            : op->kind == AC_OP_HEAD_NORM ? (size_t)hd
                                                          : (size_t)din * dout;
                CHECK(relerr_f(dwg, dwc, nw) < tol, "%s op %d weight gradient: %g", rec->sub[sb].name, i,
                      relerr_f(dwg, dwc, nw));
            }
            if (has_b) CHECK(relerr_f(dbg, dbc, dout) < tol, "%s op %d bias gradient", rec->sub[sb].name, i);
            if (op->kind == AC_OP_LINEAR && op->acc)
                CHECK(fabs(dag - dac) < tol * (fabs(dac) + 1), "%s residual scale gradient: %g vs %g",
                      rec->sub[sb].name, dag, dac);
            if (op->kind == AC_OP_MASK || op->kind == AC_OP_RMSNORM) {
                int ng = op->kind == AC_OP_MASK ? units : H;
                CHECK(relerr_f(dgg, dgc, ng) < tol, "%s op %d gate gradient: %g", rec->sub[sb].name, i,
                      relerr_f(dgg, dgc, ng));
            }
            for (int k = 0; k < AC_T_COUNT; k++) free(x[k]), free(dx_c[k]), free(dx_g[k]);
            free(W), free(bias), free(gate), free(gh), free(dy), free(yc), free(yg), free(dwc), free(dwg), free(dbc);
            free(dbg), free(dgc), free(dgg);
        }
    printf("   %d ops of the %s recipe on the CUDA backend (%s) against the CPU\n", ops, rec->name,
           getenv("AC_CUDA_PLUGIN") ? getenv("AC_CUDA_PLUGIN") : "plugin");
    free(cs), free(sn);
    ac_arch_free(&a);
}

/* The mixture-of-experts sub-block (ROUTE, EXPERTS) on the CPU against a
 * float64 reference written from the Hugging Face modules, with routing
 * ties: experts 1 and 3 have the same router row (equal probabilities on
 * every token), and in a second pass every router row is 0 (all experts
 * tie: the lowest indices win, weights 1/E, or 1/k renormalised). Odd
 * expert count, top-k 2 and 3, with and without renormalisation. */
/* nemotron_h's sigmoid router, by hand: chosen on sigmoid + bias, weighted
 * by the sigmoid alone, renormalised (+1e-20) or not, scaled; a masked
 * (-inf) expert never chosen; ties to the lower index. */
static void test_moe_route_sigmoid(void) {
    int order[4];
    double s0 = 0.5, s3 = 1 / (1 + exp(-2.0));
    for (int norm = 0; norm < 2; norm++) {
        /* choice = s + bias: 1.0, 0.731, 0.869, 0.881: experts 0 and 3 (without the bias: 3 and 1) */
        float r[4] = {0, 1, -1, 2}, bias[4] = {0.5f, 0, 0.6f, 0};
        ac_moe_route_sigmoid(r, bias, NULL, 1, 4, 2, norm, 2.0f, order);
        double d = norm ? s0 + s3 + 1e-20 : 1;
        CHECK(fabs(r[0] - 2 * s0 / d) < 1e-6 && r[1] == 0 && r[2] == 0 && fabs(r[3] - 2 * s3 / d) < 1e-6,
              "sigmoid route (norm %d): %g %g %g %g", norm, r[0], r[1], r[2], r[3]);
    }
    float m[4] = {-INFINITY, 1, -1, 1}, t[4] = {0, 0, 0, 0};
    ac_moe_route_sigmoid(m, NULL, NULL, 1, 4, 2, 0, 1.0f, order);
    CHECK(m[0] == 0 && m[1] > 0.73f && m[2] == 0 && m[3] > 0.73f, "masked expert chosen: %g %g %g %g", m[0], m[1],
          m[2], m[3]);
    ac_moe_route_sigmoid(t, NULL, NULL, 1, 4, 2, 1, 1.0f, order);
    CHECK(t[0] == 0.5f && t[1] == 0.5f && t[2] == 0 && t[3] == 0, "sigmoid ties: %g %g %g %g", t[0], t[1], t[2], t[3]);
}

static void test_moe_route_ties(void) {
    int H = 12, E = 5, Fe = 7, B = 3, n = 4, N = B * n;
    for (int pass = 0; pass < 4; pass++) {
        int k = pass % 2 ? 3 : 2, norm = pass >= 2, allzero = pass == 1 || pass == 3;
        ac_arch a = mk_arch(1, H, 4, 2, 1, 0, 16);
        a.layers[0].n_experts = E;
        a.layers[0].expert_ffn = Fe;
        a.top_k = k;
        a.norm_topk = norm;
        ac_model m;
        ac_err e = {0};
        CHECK(ac_model_alloc(&m, &a, &e) == 0, "%s", e.msg);
        ac_layer_w *w = &m.L[0];
        fill(w->post_norm, H, 1);
        fill(w->router, (size_t)E * H, 1);
        memcpy(w->router + 3 * H, w->router + 1 * H, sizeof(float) * H); /* experts 1 and 3 tie */
        if (allzero) memset(w->router, 0, sizeof(float) * E * H);
        for (int x = 0; x < E; x++) {
            fill(w->eg[x], (size_t)Fe * H, 0.5f);
            fill(w->eu[x], (size_t)Fe * H, 0.5f);
            fill(w->ed[x], (size_t)H * Fe, 0.5f);
        }
        float *slot[AC_T_COUNT];
        for (int i = 0; i < AC_T_COUNT; i++) {
            int d = ac_block_dim(&a, 0, (ac_dim)ac_block_slot_dim(i));
            slot[i] = calloc((size_t)N * (d > 0 ? d : 1), 4);
        }
        int rows[64];
        ac_block_cpu c = {.m = &m, .rows = rows};
        memcpy(c.slot, slot, sizeof slot);
        fill(slot[AC_T_X], (size_t)N * H, 1);
        double *x = malloc(sizeof(double) * N * H), *xn = malloc(sizeof(double) * N * H);
        for (int i = 0; i < N * H; i++) x[i] = slot[AC_T_X][i];
        ref_rmsnorm(xn, slot[AC_T_X], w->post_norm, N, H, a.eps);
        const ac_block_recipe *r = ac_block_recipe_of(&a, 0);
        CHECK(!strcmp(r->name, "mixtral") && !strcmp(r->sub[1].name, "moe"), "moe recipe");
        ac_block_cpu_forward_sub(&c, 0, 1, B, n, 0);
        for (int i = 0; i < N; i++) { /* the reference: softmax, top-k by (probability, lower index), weights */
            double p[5], mx = -1e300, sum = 0, kept = 0;
            int sel[5] = {0}, picked[3];
            for (int x2 = 0; x2 < E; x2++) {
                p[x2] = 0;
                for (int ch = 0; ch < H; ch++) p[x2] += xn[i * H + ch] * w->router[x2 * H + ch];
                mx = fmax(mx, p[x2]);
            }
            for (int x2 = 0; x2 < E; x2++) sum += p[x2] = exp(p[x2] - mx);
            for (int x2 = 0; x2 < E; x2++) p[x2] /= sum;
            for (int j = 0; j < k; j++) {
                int b = -1;
                for (int x2 = 0; x2 < E; x2++)
                    if (!sel[x2] && (b < 0 || p[x2] > p[b])) b = x2; /* strict: the lower index wins a tie */
                sel[b] = 1, picked[j] = b, kept += p[b];
            }
            if (allzero) CHECK(picked[0] == 0 && picked[1] == 1, "all tied: experts %d, %d picked", picked[0], picked[1]);
            for (int j = 0; j < k; j++) {
                int x2 = picked[j];
                double wt = norm ? p[x2] / kept : p[x2], hbuf[7];
                for (int f = 0; f < Fe; f++) {
                    double g = 0, u = 0;
                    for (int ch = 0; ch < H; ch++) {
                        g += xn[i * H + ch] * w->eg[x2][f * H + ch];
                        u += xn[i * H + ch] * w->eu[x2][f * H + ch];
                    }
                    hbuf[f] = silu(g) * u;
                }
                for (int ch = 0; ch < H; ch++) {
                    double y = 0;
                    for (int f = 0; f < Fe; f++) y += hbuf[f] * w->ed[x2][ch * Fe + f];
                    x[i * H + ch] += wt * y;
                }
            }
        }
        double er = relerr(slot[AC_T_X], x, (size_t)N * H);
        CHECK(er < 1e-5, "moe k=%d norm=%d ties=%s: %g", k, norm, allzero ? "all" : "1,3", er);
        for (int i = 0; i < AC_T_COUNT; i++) free(slot[i]);
        free(x), free(xn);
        ac_model_free(&m);
        ac_arch_free(&a);
    }
}

/* Every op of every recipe (Llama's, Qwen3's) on the CUDA backend against the CPU. */
static void test_cuda_ops(void) {
    const char *why = NULL;
    const ac_cuda_api *cu = ac_cuda(&why);
    if (!cu) SKIP("no CUDA: %s", why);
    for (int qk = 0; qk < 2; qk++) cuda_ops(cu, qk);
}

int main(void) {
    ac_set_threads(1);
    RUN(test_recipe_consistent);
    RUN(test_ops_forward_f64);
    RUN(test_linear_bf16_vs_f32);
    RUN(test_ops_backward_f64);
    RUN(test_executor_vs_f64);
    RUN(test_grad_executor_vs_f64);
    RUN(test_moe_route_ties);
    RUN(test_moe_route_sigmoid);
    RUN(test_ssm_ops_f64);
    RUN(test_cuda_ops);
    printf("RESULT %d %d %d\n", ck_pass, ck_fail, ck_skip);
    return ck_fail ? 1 : 0;
}
