/* ssm_cpu.c - see ssm_cpu_int.h. Notation: di = nh*P inner width, C = di + 2GN
 * conv channels, SI = di + C + nh in_proj rows; head h reads group
 * g = h / (nh/G) of B and C. */
#include "ssm_cpu_int.h"

#include <math.h>
#include <string.h>

ac_ssm ac_ssm_of(const ac_arch *a, const ac_layer_w *w, int l) {
    ac_ssm s = {a->layers[l].ssm_heads, a->ssm_head_dim, a->ssm_state, a->ssm_groups, a->ssm_conv,
                w->conv_w,              w->conv_b,       w->dt_bias,   w->a_log,      w->ssm_d,
                w->ssm_norm,            a->eps,          NULL,         NULL};
    return s;
}

int ac_ssm_di(const ac_ssm *s) { return s->nh * s->P; }
int ac_ssm_c(const ac_ssm *s) { return s->nh * s->P + 2 * s->G * s->Ns; }
int ac_ssm_si(const ac_ssm *s) { return 2 * s->nh * s->P + 2 * s->G * s->Ns + s->nh; }

static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }
static double softplus(double x) { return x > 20 ? x : log1p(exp(x)); }

/* The conv's pre-activation of channel c at row t of sequence b (input
 * rows before 0 from the state when cont, else 0). */
static double conv_pre(const ac_ssm *s, const float *zx, int b, int n, int t, int c, const float *cst, int cont) {
    int di = ac_ssm_di(s), C = ac_ssm_c(s), SI = ac_ssm_si(s), K = s->K;
    double acc = s->conv_b ? s->conv_b[c] : 0.0;
    for (int k = 0; k < K; k++) {
        int j = t - (K - 1) + k; /* input row */
        double v;
        if (j >= 0)
            v = zx[((size_t)b * n + j) * SI + di + c];
        else if (cont && cst)
            v = cst[((size_t)b * (K - 1) + (K - 1 + j)) * C + c];
        else
            continue;
        acc += (double)s->conv_w[(size_t)c * K + k] * v;
    }
    return acc;
}

void ac_ssm_conv_fwd(const ac_ssm *s, float *out, const float *zx, int B, int n, float *cst, int cont) {
    int di = ac_ssm_di(s), C = ac_ssm_c(s), SI = ac_ssm_si(s), K = s->K;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < n; t++)
            for (int c = 0; c < C; c++) {
                double p = conv_pre(s, zx, b, n, t, c, cst, cont);
                out[((size_t)b * n + t) * C + c] = (float)(p * sigm(p));
            }
    if (!cst || K < 2) return;
    for (int b = 0; b < B; b++) /* the last K-1 inputs: shift the state, append this call's rows */
        for (int r = 0; r < K - 1; r++) {
            int j = n - (K - 1) + r; /* input row of this call (negative: from the old state) */
            float *dst = cst + ((size_t)b * (K - 1) + r) * C;
            if (j >= 0)
                memcpy(dst, zx + ((size_t)b * n + j) * SI + di, sizeof(float) * C);
            else if (cont)
                memmove(dst, cst + ((size_t)b * (K - 1) + (K - 1 + j)) * C, sizeof(float) * C);
            else
                memset(dst, 0, sizeof(float) * C);
        }
}

void ac_ssm_scan_fwd(const ac_ssm *s, float *y, const float *xbc, const float *zx, int B, int n, float *sst, int cont,
                     float *work) {
    int P = s->P, Ns = s->Ns, nh = s->nh, di = ac_ssm_di(s), C = ac_ssm_c(s), SI = ac_ssm_si(s), hpg = nh / s->G;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++) {
            int g = h / hpg;
            float *S = sst ? sst + ((size_t)b * nh + h) * P * Ns : work;
            if (!sst || !cont) memset(S, 0, sizeof(float) * P * Ns);
            double A = -exp((double)s->a_log[h]);
            for (int t = 0; t < n; t++) {
                size_t row = (size_t)b * n + t;
                const float *x = xbc + row * C + h * P, *Bv = xbc + row * C + di + g * Ns,
                            *Cv = xbc + row * C + di + s->G * Ns + g * Ns;
                double dt = softplus((double)zx[row * SI + di + C + h] + s->dt_bias[h]), a = exp(dt * A);
                float *yr = y + row * di + h * P;
                for (int p = 0; p < P; p++) {
                    float *Sp = S + (size_t)p * Ns;
                    double acc = 0, dx = dt * x[p];
                    for (int k = 0; k < Ns; k++) {
                        Sp[k] = (float)(a * Sp[k] + dx * Bv[k]);
                        acc += (double)Sp[k] * Cv[k];
                    }
                    yr[p] = (float)(acc + (double)s->d[h] * x[p]);
                }
            }
        }
}

/* Channel c's gate (of di): its head's times its head dim's (1 without gates). */
static double dgate_of(const ac_ssm *s, int c) {
    return (s->dim_gate ? s->dim_gate[c % s->P] : 1.0) * (s->head_gate ? s->head_gate[c / s->P] : 1.0);
}

void ac_ssm_gated_norm_fwd(const ac_ssm *s, float *out, const float *y, const float *zx, int N) {
    int di = ac_ssm_di(s), SI = ac_ssm_si(s), gs = di / s->G;
    for (size_t r = 0; r < (size_t)N; r++)
        for (int gi = 0; gi < s->G; gi++) {
            const float *yr = y + r * di + gi * gs, *z = zx + r * SI + gi * gs;
            float *o = out + r * di + gi * gs;
            double ss = 0, M = 0;
            for (int c = 0; c < gs; c++) {
                double v = yr[c] * z[c] * sigm(z[c]), m = dgate_of(s, gi * gs + c);
                ss += m * v * v;
                M += m;
            }
            double rs = M > 0 ? 1.0 / sqrt(ss / M + s->eps) : 0;
            for (int c = 0; c < gs; c++)
                o[c] = (float)(yr[c] * z[c] * sigm(z[c]) * rs * s->norm_w[gi * gs + c] * dgate_of(s, gi * gs + c));
        }
}

void ac_relu2_fwd(float *out, const float *in, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = in[i] > 0 ? in[i] * in[i] : 0.0f;
}

void ac_ssm_conv_bwd(const ac_ssm *s, float *dzx, float *dconv_w, float *dconv_b, const float *dout, const float *zx,
                     int B, int n) {
    int di = ac_ssm_di(s), C = ac_ssm_c(s), SI = ac_ssm_si(s), K = s->K;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < n; t++) memset(dzx + ((size_t)b * n + t) * SI + di, 0, sizeof(float) * C);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < n; t++)
            for (int c = 0; c < C; c++) {
                double p = conv_pre(s, zx, b, n, t, c, NULL, 0), sg = sigm(p);
                double dp = dout[((size_t)b * n + t) * C + c] * sg * (1 + p * (1 - sg)); /* silu' */
                if (dconv_b) dconv_b[c] += (float)dp;
                for (int k = 0; k < K; k++) {
                    int j = t - (K - 1) + k;
                    if (j < 0) continue;
                    size_t at = ((size_t)b * n + j) * SI + di + c;
                    if (dconv_w) dconv_w[(size_t)c * K + k] += (float)(dp * zx[at]);
                    dzx[at] += (float)(dp * s->conv_w[(size_t)c * K + k]);
                }
            }
}

size_t ac_ssm_scan_work(const ac_ssm *s, int n) {
    size_t st = (size_t)s->P * s->Ns;
    return ((size_t)n + 2) * st + 2 * (size_t)n;
}

void ac_ssm_scan_bwd(const ac_ssm *s, float *dxbc, float *dzx, float *ddt_bias, float *da_log, float *dd,
                     const float *dy, const float *xbc, const float *zx, int B, int n, float *work) {
    int P = s->P, Ns = s->Ns, nh = s->nh, di = ac_ssm_di(s), C = ac_ssm_c(s), SI = ac_ssm_si(s), hpg = nh / s->G;
    size_t st = (size_t)P * Ns;
    float *Sall = work, *dS = work + ((size_t)n + 1) * st, *dts = dS + st, *as = dts + n;
    for (size_t r = 0; r < (size_t)B * n; r++) memset(dxbc + r * C + di, 0, sizeof(float) * (C - di)); /* B, C: summed */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++) {
            int g = h / hpg;
            double A = -exp((double)s->a_log[h]), dA = 0, dD = 0, dbias = 0;
            memset(Sall, 0, sizeof(float) * st);
            for (int t = 0; t < n; t++) { /* the forward again, every state kept: Sall[t+1] after row t */
                size_t row = (size_t)b * n + t;
                const float *x = xbc + row * C + h * P, *Bv = xbc + row * C + di + g * Ns;
                double u = (double)zx[row * SI + di + C + h] + s->dt_bias[h], dt = softplus(u), a = exp(dt * A);
                dts[t] = (float)dt, as[t] = (float)a;
                const float *S0 = Sall + (size_t)t * st;
                float *S1 = Sall + ((size_t)t + 1) * st;
                for (int p = 0; p < P; p++)
                    for (int k = 0; k < Ns; k++)
                        S1[p * Ns + k] = (float)(a * S0[p * Ns + k] + dt * x[p] * Bv[k]);
            }
            memset(dS, 0, sizeof(float) * st);
            for (int t = n - 1; t >= 0; t--) {
                size_t row = (size_t)b * n + t;
                const float *x = xbc + row * C + h * P, *Bv = xbc + row * C + di + g * Ns,
                            *Cv = xbc + row * C + di + s->G * Ns + g * Ns, *dyt = dy + row * di + h * P;
                float *dx = dxbc + row * C + h * P, *dB = dxbc + row * C + di + g * Ns,
                      *dC = dxbc + row * C + di + s->G * Ns + g * Ns;
                const float *S0 = Sall + (size_t)t * st, *S1 = Sall + ((size_t)t + 1) * st;
                double dt = dts[t], a = as[t], da = 0, ddt = 0;
                for (int p = 0; p < P; p++) { /* y = S1 C + D x */
                    dD += (double)dyt[p] * x[p];
                    dx[p] = (float)(s->d[h] * dyt[p]);
                    for (int k = 0; k < Ns; k++) {
                        dC[k] += dyt[p] * S1[p * Ns + k];
                        dS[p * Ns + k] += dyt[p] * Cv[k];
                    }
                }
                for (int p = 0; p < P; p++) { /* S1 = a S0 + dt x B^T */
                    double dxp = 0;
                    for (int k = 0; k < Ns; k++) {
                        double g1 = dS[p * Ns + k];
                        da += g1 * S0[p * Ns + k];
                        ddt += g1 * x[p] * Bv[k];
                        dxp += g1 * Bv[k];
                        dB[k] += (float)(dt * g1 * x[p]);
                    }
                    dx[p] += (float)(dt * dxp);
                }
                ddt += da * a * A; /* a = exp(dt A) */
                dA += da * a * dt;
                double u = (double)zx[row * SI + di + C + h] + s->dt_bias[h], du = ddt * sigm(u);
                dzx[row * SI + di + C + h] = (float)du;
                dbias += du;
                for (size_t i = 0; i < st; i++) dS[i] = (float)(dS[i] * a);
            }
            if (dd) dd[h] += (float)dD;
            if (ddt_bias) ddt_bias[h] += (float)dbias;
            if (da_log) da_log[h] += (float)(dA * A); /* A = -exp(A_log) */
        }
}

/* With m_c the head-dim gates, M = sum m, ms = sum m v^2 / M, rs = (ms + eps)^-1/2, vh = v rs and dot = sum_c d_c
 * w_c m_c vh_c: dv_c = rs m_c (d_c w_c - vh_c dot / M), dm_c = d_c w_c vh_c - dot (vh_c^2 - rs^2 ms) / (2 M). */
void ac_ssm_gated_norm_bwd(const ac_ssm *s, float *dy, float *dzx, float *dnorm_w, float *ddim_gate, float *dhead_gate,
                           const float *dout, const float *y, const float *zx, int N) {
    int di = ac_ssm_di(s), SI = ac_ssm_si(s), gs = di / s->G;
    for (size_t r = 0; r < (size_t)N; r++)
        for (int gi = 0; gi < s->G; gi++) {
            const float *yr = y + r * di + gi * gs, *z = zx + r * SI + gi * gs, *d = dout + r * di + gi * gs,
                        *w = s->norm_w + gi * gs;
            float *dyr = dy + r * di + gi * gs, *dz = dzx + r * SI + gi * gs;
            double ss = 0, dot = 0, M = 0;
            for (int c = 0; c < gs; c++) {
                double v = yr[c] * z[c] * sigm(z[c]), m = dgate_of(s, gi * gs + c);
                ss += m * v * v;
                M += m;
            }
            if (M <= 0) { /* every dim gated off: the output is 0 whatever the input */
                for (int c = 0; c < gs; c++) dyr[c] = dz[c] = 0;
                continue;
            }
            double ms = ss / M, rs = 1.0 / sqrt(ms + s->eps);
            for (int c = 0; c < gs; c++) {
                double vh = yr[c] * z[c] * sigm(z[c]) * rs, m = dgate_of(s, gi * gs + c);
                dot += (double)d[c] * w[c] * m * vh;
                if (dnorm_w) dnorm_w[gi * gs + c] += (float)(d[c] * vh * m);
            }
            for (int c = 0; c < gs; c++) {
                int ch = gi * gs + c;
                double sg = sigm(z[c]), sz = z[c] * sg, vh = yr[c] * sz * rs, m = dgate_of(s, ch);
                double dv = rs * m * ((double)d[c] * w[c] - vh * dot / M);
                double dm = d[c] * w[c] * vh - dot * (vh * vh - rs * rs * ms) / (2 * M); /* d loss / d m_c */
                dyr[c] = (float)(dv * sz);
                dz[c] = (float)(dv * yr[c] * sg * (1 + z[c] * (1 - sg)));
                if (ddim_gate) ddim_gate[ch % s->P] += (float)(dm * (s->head_gate ? s->head_gate[ch / s->P] : 1.0));
                if (dhead_gate) dhead_gate[ch / s->P] += (float)(dm * (s->dim_gate ? s->dim_gate[ch % s->P] : 1.0));
            }
        }
}

void ac_relu2_bwd(float *din, const float *dout, const float *in, size_t n) {
    for (size_t i = 0; i < n; i++) din[i] = in[i] > 0 ? 2.0f * in[i] * dout[i] : 0.0f;
}
