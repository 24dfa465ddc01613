/* stats.c - see stats.h. */
#include "search/stats.h"

#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int ac_stats_init(ac_stats *s, const ac_arch *a, ac_err *e) {
    memset(s, 0, sizeof *s);
    s->n_layers = a->n_layers;
    s->hidden = a->hidden;
    s->head = calloc(a->n_layers, sizeof *s->head);
    s->ffn = calloc(a->n_layers, sizeof *s->ffn);
    s->hidden_a = calloc(a->hidden, sizeof *s->hidden_a);
    s->layer = calloc(a->n_layers, sizeof *s->layer);
    int ok = s->head && s->ffn && s->hidden_a && s->layer;
    for (int l = 0; ok && l < a->n_layers; l++) {
        s->head[l] = calloc(a->layers[l].n_heads + 1, sizeof **s->head);
        s->ffn[l] = calloc(a->layers[l].ffn + 1, sizeof **s->ffn);
        ok = s->head[l] && s->ffn[l];
    }
    if (!ok) {
        ac_stats_free(s);
        return ac_errf(e, "out of memory for activation statistics");
    }
    return 0;
}

int ac_stats_want_gram(ac_stats *s, const ac_arch *a, ac_err *e) {
    s->ffn_gram = calloc(a->n_layers, sizeof *s->ffn_gram);
    if (!s->ffn_gram) return ac_errf(e, "out of memory");
    for (int l = 0; l < a->n_layers; l++) {
        size_t F = a->layers[l].ffn;
        if (F && !(s->ffn_gram[l] = calloc(F * F, sizeof(float))))
            return ac_errf(e, "out of memory for FFN Gram matrices");
    }
    return 0;
}

int ac_stats_want_minitron(ac_stats *s, const ac_arch *a, ac_err *e) {
    int L = a->n_layers, H = a->hidden, wide = H;
    s->mt_attn = calloc(L, sizeof *s->mt_attn);
    s->mt_ffn = calloc(L, sizeof *s->mt_ffn);
    s->mt_norm = calloc(2 * L, sizeof *s->mt_norm);
    s->mt_ssm = calloc(L, sizeof *s->mt_ssm);
    s->mt_shared = calloc(L, sizeof *s->mt_shared);
    if (!s->mt_attn || !s->mt_ffn || !s->mt_norm || !s->mt_ssm || !s->mt_shared) return ac_errf(e, "out of memory");
    for (int l = 0; l < L; l++) {
        int Q = a->layers[l].n_heads * a->head_dim, F = a->layers[l].ffn, D = ac_ssm_inner(a, l);
        int Fs = a->hybrid && a->layers[l].n_experts ? a->shared_ffn : 0;
        wide = D > wide ? D : wide;
        wide = Fs > wide ? Fs : wide;
        if (D && !(s->mt_ssm[l] = calloc(D, sizeof(double)))) return ac_errf(e, "out of memory");
        if (Fs && !(s->mt_shared[l] = calloc(Fs, sizeof(double)))) return ac_errf(e, "out of memory");
        wide = Q > wide ? Q : wide;
        wide = F > wide ? F : wide;
        s->mt_attn[l] = calloc(Q + 1, sizeof(double));
        s->mt_ffn[l] = calloc(F + 1, sizeof(double));
        s->mt_norm[2 * l] = calloc(H, sizeof(double));
        s->mt_norm[2 * l + 1] = calloc(H, sizeof(double));
        if (!s->mt_attn[l] || !s->mt_ffn[l] || !s->mt_norm[2 * l] || !s->mt_norm[2 * l + 1])
            return ac_errf(e, "out of memory");
    }
    if (!(s->mt_tmp = calloc(wide, sizeof(double)))) return ac_errf(e, "out of memory");
    return 0;
}

void ac_stats_free(ac_stats *s) {
    for (int l = 0; l < s->n_layers; l++) {
        if (s->head) free(s->head[l]);
        if (s->ffn) free(s->ffn[l]);
        if (s->ffn_gram) free(s->ffn_gram[l]);
        if (s->mt_attn) free(s->mt_attn[l]);
        if (s->mt_ffn) free(s->mt_ffn[l]);
        if (s->mt_ssm) free(s->mt_ssm[l]);
        if (s->mt_shared) free(s->mt_shared[l]);
        if (s->mt_norm) {
            free(s->mt_norm[2 * l]);
            free(s->mt_norm[2 * l + 1]);
        }
    }
    free(s->mt_attn);
    free(s->mt_ffn);
    free(s->mt_norm);
    free(s->mt_ssm);
    free(s->mt_shared);
    free(s->mt_tmp);
    free(s->ffn_gram);
    free(s->head);
    free(s->ffn);
    free(s->hidden_a);
    free(s->layer);
    memset(s, 0, sizeof *s);
}

/* Model-Optimizer's hook statistic: acc[c] += sum_b (mean_t |x[b][t][c]|)^2
 * for x [B][n][C] (row stride C); tmp holds C doubles. */
static void mt_acc(double *acc, double *tmp, const float *x, int B, int n, int C) {
    for (int b = 0; b < B; b++) {
        memset(tmp, 0, sizeof(double) * C);
        for (int t = 0; t < n; t++) {
            const float *r = x + ((size_t)b * n + t) * C;
            for (int c = 0; c < C; c++) tmp[c] += fabsf(r[c]);
        }
        for (int c = 0; c < C; c++) acc[c] += (tmp[c] / n) * (tmp[c] / n);
    }
}

static void on_begin(void *ud, int B, int n) {
    ac_stats *st = ud;
    st->cur_B = B;
    st->cur_n = n;
}

/* mt_acc over a column slice: channels off .. off+C-1 of rows of width W. */
static void mt_acc_cols(double *acc, double *tmp, const float *x, int B, int n, int W, int off, int C) {
    for (int b = 0; b < B; b++) {
        memset(tmp, 0, sizeof(double) * C);
        for (int t = 0; t < n; t++) {
            const float *r = x + ((size_t)b * n + t) * W + off;
            for (int c = 0; c < C; c++) tmp[c] += fabsf(r[c]);
        }
        for (int c = 0; c < C; c++) acc[c] += (tmp[c] / n) * (tmp[c] / n);
    }
}

static void on_normed(void *ud, int l, int block, const float *xn, int N, int H) {
    ac_stats *st = ud;
    for (long i = 0; i < (long)N * H; i++) st->hidden_a[i % H] += fabsf(xn[i]);
    assert(st->cur_B * st->cur_n == N);
    /* nemotron_h's sub-blocks 2 (Mamba: the input norm) and 3 (MoE: the post norm) share 0's and 1's slot */
    if (st->mt_norm) mt_acc(st->mt_norm[2 * l + block % 2], st->mt_tmp, xn, st->cur_B, st->cur_n, H);
}

/* Model-Optimizer ranks Mamba heads by in_proj's x channels (its ablation's choice over z and dt). */
static void on_ssm_in(void *ud, int l, const float *zx, int N, int d_inner, int width) {
    ac_stats *st = ud;
    assert(st->cur_B * st->cur_n == N);
    if (st->mt_ssm && st->mt_ssm[l])
        mt_acc_cols(st->mt_ssm[l], st->mt_tmp, zx, st->cur_B, st->cur_n, width, d_inner, d_inner);
}

/* The shared expert's width, as Model-Optimizer's MLP hook (on linear_fc2's input) scores a dense MLP's. */
static void on_shared_act(void *ud, int l, const float *act, int N, int Fs) {
    ac_stats *st = ud;
    assert(st->cur_B * st->cur_n == N);
    if (st->mt_shared && st->mt_shared[l]) mt_acc(st->mt_shared[l], st->mt_tmp, act, st->cur_B, st->cur_n, Fs);
}

static void on_head_out(void *ud, int l, const float *att, int N, int n_heads, int hd) {
    ac_stats *st = ud;
    int Q = n_heads * hd;
    for (int r = 0; r < N; r++)
        for (int h = 0; h < n_heads; h++) {
            const float *v = att + (size_t)r * Q + h * hd;
            double s = 0;
            for (int i = 0; i < hd; i++) s += (double)v[i] * v[i];
            st->head[l][h] += s;
        }
    if (st->mt_attn) mt_acc(st->mt_attn[l], st->mt_tmp, att, st->cur_B, st->cur_n, Q);
}

static void on_ffn_act(void *ud, int l, const float *g, int N, int F) {
    ac_stats *st = ud;
    for (long i = 0; i < (long)N * F; i++) st->ffn[l][i % F] += fabsf(g[i]);
    if (st->mt_ffn) mt_acc(st->mt_ffn[l], st->mt_tmp, g, st->cur_B, st->cur_n, F);
    if (st->ffn_gram && st->ffn_gram[l])
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, F, F, N, 1.0f, g, F, g, F, 1.0f, st->ffn_gram[l], F);
}

static void on_layer_io(void *ud, int l, const float *x_in, const float *x_out, int N, int H) {
    ac_stats *st = ud;
    for (int r = 0; r < N; r++) {
        const float *p = x_in + (size_t)r * H, *q = x_out + (size_t)r * H;
        double d = 0, np = 0, nq = 0;
        for (int i = 0; i < H; i++) {
            d += (double)p[i] * q[i];
            np += (double)p[i] * p[i];
            nq += (double)q[i] * q[i];
        }
        st->layer[l] += 1.0 - d / (sqrt(np * nq) + 1e-12);
    }
}

static void on_rows(void *ud, int N) { ((ac_stats *)ud)->tokens += N; }

void ac_stats_hooks(ac_stats *s, ac_engine_hooks *h) {
    *h = (ac_engine_hooks){.ud = s,
                           .begin = on_begin,
                           .normed = on_normed,
                           .head_out = on_head_out,
                           .ffn_act = on_ffn_act,
                           .layer_io = on_layer_io,
                           .rows = on_rows,
                           .ssm_in = on_ssm_in,
                           .shared_act = on_shared_act};
}
