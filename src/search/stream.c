/* stream.c - see stream.h. Shapes as in engine.c: N = B*n rows, H hidden,
 * hd head_dim, Q = n_heads*hd, KV = n_kv_heads*hd, F ffn width. */
#include "stream.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backward_cpu.h"
#include "dtype.h"
#include "kernels_cpu.h"
#include "rope.h"

void ac_stream_free(ac_stream *s) {
    float *bufs[] = {s->xn,    s->q,     s->kt,     s->vt,  s->att, s->g,    s->u,  s->x0,   s->scores,
                     s->cos_t, s->sin_t, s->logits, s->xh1, s->xh2, s->r1,   s->r2, s->x1,   s->dxn,
                     s->dq,    s->dk,    s->dv,     s->du,  s->dg,  s->dscr, s->dw, s->wtile};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    free(s->pos);
    ac_wscratch_free(&s->ws);
    memset(s, 0, sizeof *s);
}

/* Widest query, KV and FFN width over the layers (at least 1). */
static void widths(const ac_arch *a, size_t *mq, size_t *mkv, size_t *mf) {
    *mq = *mkv = *mf = 1;
    for (int l = 0; l < a->n_layers; l++) {
        const ac_layer_arch *la = &a->layers[l];
        if ((size_t)la->n_heads * a->head_dim > *mq) *mq = (size_t)la->n_heads * a->head_dim;
        if ((size_t)la->n_kv_heads * a->head_dim > *mkv) *mkv = (size_t)la->n_kv_heads * a->head_dim;
        if ((size_t)la->ffn > *mf) *mf = la->ffn;
    }
}

int ac_stream_init(ac_stream *s, const ac_model *m, int B, int n, ac_err *e) {
    memset(s, 0, sizeof *s);
    const ac_arch *a = &m->a;
    if (B < 1 || n < 2) return ac_errf(e, "stream: batch must be >= 1 and window >= 2");
    s->m = m;
    s->B = B;
    s->n = n;
    s->wdt = ac_model_wdt(m);
    size_t N = (size_t)B * n, H = a->hidden, hd = a->head_dim, mq, mkv, mf;
    widths(a, &mq, &mkv, &mf);
    size_t maxin = H > mq ? H : mq;
    if (mf > maxin) maxin = mf;
    s->xn = malloc(N * H * 4);
    s->x0 = malloc(N * H * 4);
    s->q = malloc(N * mq * 4);
    s->att = malloc(N * mq * 4);
    s->kt = malloc(N * mkv * 4);
    s->vt = malloc(N * mkv * 4);
    s->g = malloc(N * mf * 4);
    s->u = malloc(N * mf * 4);
    s->scores = malloc((size_t)n * n * 4);
    s->cos_t = malloc((size_t)n * (hd / 2 + 1) * 4);
    s->sin_t = malloc((size_t)n * (hd / 2 + 1) * 4);
    s->logits = malloc((size_t)n * a->vocab * 4); /* one window at a time */
    s->pos = malloc(N * sizeof(int));
    int ws_ok = s->wdt == ST_F32 || ac_wscratch_alloc(&s->ws, (int)N, (int)maxin) == 0;
    if (!ws_ok || !s->xn || !s->x0 || !s->q || !s->att || !s->kt || !s->vt || !s->g || !s->u || !s->scores ||
        !s->cos_t || !s->sin_t || !s->logits || !s->pos) {
        ac_stream_free(s);
        return ac_errf(e, "stream: out of memory for %d windows of %d tokens", B, n);
    }
    for (size_t r = 0; r < N; r++) s->pos[r] = (int)(r % n);
    if (ac_rope_tables(a, n, s->cos_t, s->sin_t, e)) {
        ac_stream_free(s);
        return -1;
    }
    return 0;
}

int ac_stream_want_grad(ac_stream *s, ac_err *e) {
    const ac_arch *a = &s->m->a;
    size_t N = (size_t)s->B * s->n, H = a->hidden, mq, mkv, mf;
    widths(a, &mq, &mkv, &mf);
    size_t maxin = H > mq ? H : mq;
    if (mf > maxin) maxin = mf;
    s->wtile_rows = 64;
    s->xh1 = malloc(N * H * 4);
    s->xh2 = malloc(N * H * 4);
    s->x1 = malloc(N * H * 4);
    s->dxn = malloc(N * H * 4);
    s->r1 = malloc(N * 4);
    s->r2 = malloc(N * 4);
    s->dq = malloc(N * mq * 4);
    s->dk = malloc(N * mkv * 4);
    s->dv = malloc(N * mkv * 4);
    s->du = malloc(N * mf * 4);
    s->dg = malloc(N * mf * 4);
    s->dscr = malloc((size_t)2 * s->n * s->n * 4);
    s->dw = malloc(H * 4);
    s->wtile = s->wdt == ST_F32 ? malloc(4) : malloc((size_t)s->wtile_rows * maxin * 4);
    if (!s->xh1 || !s->xh2 || !s->x1 || !s->dxn || !s->r1 || !s->r2 || !s->dq || !s->dk || !s->dv || !s->du || !s->dg ||
        !s->dscr || !s->dw || !s->wtile)
        return ac_errf(e, "stream: out of memory for the backward of %d windows of %d tokens", s->B, s->n);
    return 0;
}

int ac_stream_embed(const ac_model *m, const int *tok, long N, float *x, ac_err *e) {
    int H = m->a.hidden, wdt = ac_model_wdt(m);
    for (long r = 0; r < N; r++) {
        if (tok[r] < 0 || tok[r] >= m->a.vocab)
            return ac_errf(e, "stream: token id %d outside vocabulary of %d", tok[r], m->a.vocab);
        ac_row_f32(x + (size_t)r * H, m->embed, wdt, (size_t)tok[r], H);
    }
    return 0;
}

/* RMSNorm over the kept hidden channels (x is 0 on the others); the plain
 * kernel without a hidden mask. */
static void norm(float *out, const float *x, const float *w, int N, int H, float eps, const ac_stream_mod *mod) {
    if (!mod || !mod->hid_mask) {
        ac_rmsnorm(out, x, w, N, H, eps);
        return;
    }
    for (int r = 0; r < N; r++) {
        const float *xr = x + (size_t)r * H;
        float *o = out + (size_t)r * H;
        double ss = 0;
        for (int c = 0; c < H; c++) ss += (double)xr[c] * xr[c];
        float sc = (float)(1.0 / sqrt(ss / mod->hid_kept + eps));
        for (int c = 0; c < H; c++) o[c] = xr[c] * sc * w[c];
    }
}

/* Zero the masked hidden channels of x[N][H] (after a residual add). */
static void mask_hidden(float *x, int N, int H, const ac_stream_mod *mod) {
    if (!mod || !mod->hid_mask) return;
    for (size_t i = 0; i < (size_t)N * H; i++) x[i] *= mod->hid_mask[i % H];
}

/* Mean-pool each run of f adjacent KV heads (rows of KV floats) in place:
 * what ac_prune's KV merging computes, since k and v are linear in W. */
static void merge_heads(float *t, int N, int nkv, int hd, int f) {
    int KV = nkv * hd;
    for (int r = 0; r < N; r++)
        for (int j = 0; j < nkv / f; j++)
            for (int i = 0; i < hd; i++) {
                float *p = t + (size_t)r * KV + (size_t)j * f * hd + i;
                double sum = 0;
                for (int k = 0; k < f; k++) sum += p[k * hd];
                for (int k = 0; k < f; k++) p[k * hd] = (float)(sum / f);
            }
}

/* q, kt, vt (roped) and att of layer l from the normed input s->xn. */
static void attention_core(ac_stream *s, int l, int B, const ac_stream_mod *mod) {
    const ac_arch *a = &s->m->a;
    const ac_layer_arch *la = &a->layers[l];
    const ac_layer_w *w = &s->m->L[l];
    int H = a->hidden, hd = a->head_dim, n = s->n, N = B * n, Q = la->n_heads * hd, KV = la->n_kv_heads * hd;
    int grp = la->n_heads / la->n_kv_heads;
    ac_linear_w(s->q, s->xn, w->wq, s->wdt, w->bq, N, H, Q, 0, &s->ws);
    ac_rope(s->q, N, la->n_heads, hd, s->pos, s->cos_t, s->sin_t);
    ac_linear_w(s->kt, s->xn, w->wk, s->wdt, w->bk, N, H, KV, 0, &s->ws);
    ac_linear_w(s->vt, s->xn, w->wv, s->wdt, w->bv, N, H, KV, 0, &s->ws);
    if (mod && mod->kv_merge > 0 && mod->kv_merge < la->n_kv_heads) {
        merge_heads(s->kt, N, la->n_kv_heads, hd, la->n_kv_heads / mod->kv_merge);
        merge_heads(s->vt, N, la->n_kv_heads, hd, la->n_kv_heads / mod->kv_merge);
    }
    ac_rope(s->kt, N, la->n_kv_heads, hd, s->pos, s->cos_t, s->sin_t);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < la->n_heads; h++)
            ac_attention_head(s->att + (size_t)b * n * Q + h * hd, s->q + (size_t)b * n * Q + h * hd,
                              s->kt + (size_t)b * n * KV + (h / grp) * hd, s->vt + (size_t)b * n * KV + (h / grp) * hd,
                              n, 0, hd, Q, KV, a->sliding_window, s->scores);
}

static void attention_block(ac_stream *s, int l, float *x, int B, const ac_stream_mod *mod, const ac_engine_hooks *hk) {
    const ac_arch *a = &s->m->a;
    const ac_layer_arch *la = &a->layers[l];
    const ac_layer_w *w = &s->m->L[l];
    int H = a->hidden, hd = a->head_dim, N = B * s->n, Q = la->n_heads * hd;
    norm(s->xn, x, w->in_norm, N, H, a->eps, mod);
    if (hk && hk->normed) hk->normed(hk->ud, l, 0, s->xn, N, H);
    attention_core(s, l, B, mod);
    if (hk && hk->head_out) hk->head_out(hk->ud, l, s->att, N, la->n_heads, hd);
    if (mod && mod->head_mask)
        for (size_t i = 0; i < (size_t)N * Q; i++) s->att[i] *= mod->head_mask[(i % Q) / hd];
    ac_linear_w(x, s->att, w->wo, s->wdt, NULL, N, Q, H, 1, &s->ws);
    mask_hidden(x, N, H, mod);
}

void ac_stream_layer(ac_stream *s, int l, float *x, int B, const ac_stream_mod *mod, const ac_engine_hooks *hk) {
    const ac_arch *a = &s->m->a;
    const ac_layer_arch *la = &a->layers[l];
    const ac_layer_w *w = &s->m->L[l];
    int H = a->hidden, N = B * s->n, F = la->ffn;
    if (hk && hk->begin) hk->begin(hk->ud, B, s->n);
    if (hk && hk->layer_io) memcpy(s->x0, x, (size_t)N * H * 4);
    if (la->n_heads) attention_block(s, l, x, B, mod, hk);
    if (F) {
        norm(s->xn, x, w->post_norm, N, H, a->eps, mod);
        if (hk && hk->normed) hk->normed(hk->ud, l, 1, s->xn, N, H);
        ac_linear_w(s->g, s->xn, w->wg, s->wdt, NULL, N, H, F, 0, &s->ws);
        ac_linear_w(s->u, s->xn, w->wu, s->wdt, NULL, N, H, F, 0, &s->ws);
        ac_silu_mul(s->g, s->u, (long)N * F);
        if (hk && hk->ffn_act) hk->ffn_act(hk->ud, l, s->g, N, F);
        if (mod && mod->ffn_mask)
            for (size_t i = 0; i < (size_t)N * F; i++) s->g[i] *= mod->ffn_mask[i % F];
        ac_linear_w(x, s->g, w->wd, s->wdt, NULL, N, F, H, 1, &s->ws);
        mask_hidden(x, N, H, mod);
    }
    if (hk && hk->layer_io) hk->layer_io(hk->ud, l, s->x0, x, N, H);
}

double ac_stream_nll(ac_stream *s, const float *x, const int *tok, int B, const ac_stream_mod *mod, long *count) {
    const ac_model *m = s->m;
    int H = m->a.hidden, V = m->a.vocab, n = s->n;
    double nll = 0;
    long c = 0;
    for (int b = 0; b < B; b++) {
        norm(s->xn, x + (size_t)b * n * H, m->final_norm, n, H, m->a.eps, mod);
        ac_linear_w(s->logits, s->xn, m->lm_head, s->wdt, NULL, n, H, V, 0, &s->ws);
        for (int t = 0; t < n - 1; t++) {
            const float *lg = s->logits + (size_t)t * V;
            float mx = lg[0];
            for (int i = 1; i < V; i++)
                if (lg[i] > mx) mx = lg[i];
            double z = 0; /* float exp (double exp over a V-wide row costs as much as its GEMM) */
            for (int i = 0; i < V; i++) z += expf(lg[i] - mx);
            nll += log(z) + mx - lg[tok[(size_t)b * n + t + 1]];
            c++;
        }
    }
    if (count) *count = c;
    return nll;
}

/* dX[N,in] (+)= dY[N,out] W[out,in], W in the model's dtype: one sgemm for
 * fp32, else per tile of converted rows. */
static void linear_dx(ac_stream *s, float *dX, const float *dY, const void *W, int N, int in, int out, int acc) {
    if (s->wdt == ST_F32) {
        ac_linear_backward(dX, NULL, NULL, dY, NULL, W, N, in, out, 1.0f, acc);
        return;
    }
    for (int r0 = 0; r0 < out; r0 += s->wtile_rows) {
        int rt = out - r0 < s->wtile_rows ? out - r0 : s->wtile_rows;
        for (int r = 0; r < rt; r++) ac_row_f32(s->wtile + (size_t)r * in, W, s->wdt, (size_t)(r0 + r), in);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, in, rt, 1.0f, dY + r0, out, s->wtile, in,
                    acc || r0 ? 1.0f : 0.0f, dX, in);
    }
}

double ac_stream_nll_grad(ac_stream *s, const float *x, const int *tok, int B, unsigned *rng, float *dx) {
    const ac_model *m = s->m;
    int H = m->a.hidden, V = m->a.vocab, n = s->n;
    double nll = 0;
    for (int b = 0; b < B; b++) {
        const float *xb = x + (size_t)b * n * H;
        ac_rmsnorm_fwd(s->xn, s->xh1, s->r1, xb, m->final_norm, NULL, n, H, m->a.eps);
        ac_linear_w(s->logits, s->xn, m->lm_head, s->wdt, NULL, n, H, V, 0, &s->ws);
        for (int t = 0; t < n; t++) { /* logits -> d(sum of CE)/dlogits, in place */
            float *lg = s->logits + (size_t)t * V;
            if (t == n - 1) {
                memset(lg, 0, (size_t)V * 4);
                continue;
            }
            float mx = lg[0];
            for (int i = 1; i < V; i++)
                if (lg[i] > mx) mx = lg[i];
            int y = tok[(size_t)b * n + t + 1];
            double z = 0, ly = (double)lg[y] - mx;
            for (int i = 0; i < V; i++) z += lg[i] = expf(lg[i] - mx);
            nll += log(z) - ly;
            for (int i = 0; i < V; i++) lg[i] = (float)(lg[i] / z);
            if (rng) { /* a label drawn from the model's own distribution */
                *rng = *rng * 1103515245u + 12345u;
                double u = ((*rng >> 8) & 0xffffff) / 16777216.0, c = 0;
                for (y = 0; y < V - 1 && (c += lg[y]) <= u; y++) {}
            }
            lg[y] -= 1.0f;
        }
        linear_dx(s, s->dxn, s->logits, m->lm_head, n, H, V, 0);
        float *db = dx + (size_t)b * n * H;
        memset(db, 0, (size_t)n * H * 4);
        ac_rmsnorm_backward(db, s->dw, NULL, s->dxn, s->xh1, s->r1, m->final_norm, NULL, n, H);
    }
    return nll;
}

/* Backward of the FFN sub-block: x1 is its input (the residual after
 * attention), dx[N][H] the gradient at its output; dx += the sub-block's
 * share, i.e. dx becomes the gradient at x1. */
static void ffn_backward(ac_stream *s, int l, const float *x1, float *dx, int N) {
    const ac_arch *a = &s->m->a;
    const ac_layer_w *w = &s->m->L[l];
    int H = a->hidden, F = a->layers[l].ffn;
    ac_rmsnorm_fwd(s->xn, s->xh2, s->r2, x1, w->post_norm, NULL, N, H, a->eps);
    ac_linear_w(s->g, s->xn, w->wg, s->wdt, NULL, N, H, F, 0, &s->ws);
    ac_linear_w(s->u, s->xn, w->wu, s->wdt, NULL, N, H, F, 0, &s->ws);
    linear_dx(s, s->dg, dx, w->wd, N, F, H, 0);                         /* dh = dx Wd */
    ac_silu_mul_backward(s->dg, s->du, s->dg, s->g, s->u, (long)N * F); /* dg in place of dh */
    linear_dx(s, s->dxn, s->dg, w->wg, N, H, F, 0);
    linear_dx(s, s->dxn, s->du, w->wu, N, H, F, 1);
    memset(s->dw, 0, (size_t)H * 4);
    ac_rmsnorm_backward(dx, s->dw, NULL, s->dxn, s->xh2, s->r2, w->post_norm, NULL, N, H);
}

/* Backward of the attention sub-block (its forward q, kt, vt recomputed
 * into s by the caller from the normed input, xh1/r1 kept); dx: the
 * gradient at its output, becomes the gradient at its input. */
static void attention_backward(ac_stream *s, int l, float *dx, int B) {
    const ac_arch *a = &s->m->a;
    const ac_layer_arch *la = &a->layers[l];
    const ac_layer_w *w = &s->m->L[l];
    int H = a->hidden, hd = a->head_dim, n = s->n, N = B * n, Q = la->n_heads * hd, KV = la->n_kv_heads * hd;
    int grp = la->n_heads / la->n_kv_heads;
    linear_dx(s, s->att, dx, w->wo, N, Q, H, 0); /* d(att) = dx Wo, over att (no longer needed) */
    memset(s->dk, 0, (size_t)N * KV * 4);
    memset(s->dv, 0, (size_t)N * KV * 4);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < la->n_heads; h++) {
            size_t qo = (size_t)b * n * Q + h * hd, ko = (size_t)b * n * KV + (h / grp) * hd;
            ac_attention_head_backward(s->dq + qo, s->dk + ko, s->dv + ko, s->att + qo, s->q + qo, s->kt + ko,
                                       s->vt + ko, n, hd, Q, KV, a->sliding_window, s->dscr);
        }
    ac_rope_backward(s->dq, N, la->n_heads, hd, s->pos, s->cos_t, s->sin_t);
    ac_rope_backward(s->dk, N, la->n_kv_heads, hd, s->pos, s->cos_t, s->sin_t);
    linear_dx(s, s->dxn, s->dq, w->wq, N, H, Q, 0);
    linear_dx(s, s->dxn, s->dk, w->wk, N, H, KV, 1);
    linear_dx(s, s->dxn, s->dv, w->wv, N, H, KV, 1);
    memset(s->dw, 0, (size_t)H * 4);
    ac_rmsnorm_backward(dx, s->dw, NULL, s->dxn, s->xh1, s->r1, w->in_norm, NULL, N, H);
}

static void layer_backward(ac_stream *s, int l, const float *x_in, float *dx, int B) {
    const ac_arch *a = &s->m->a;
    const ac_layer_arch *la = &a->layers[l];
    const ac_layer_w *w = &s->m->L[l];
    int H = a->hidden, N = B * s->n;
    const float *x1 = x_in;
    if (la->n_heads) { /* forward: x1 = x_in + attention, keeping q, k, v */
        ac_rmsnorm_fwd(s->xn, s->xh1, s->r1, x_in, w->in_norm, NULL, N, H, a->eps);
        attention_core(s, l, B, NULL);
        memcpy(s->x1, x_in, (size_t)N * H * 4);
        ac_linear_w(s->x1, s->att, w->wo, s->wdt, NULL, N, la->n_heads * a->head_dim, H, 1, &s->ws);
        x1 = s->x1;
    }
    if (la->ffn) ffn_backward(s, l, x1, dx, N);
    if (la->n_heads) attention_backward(s, l, dx, B);
}

void ac_stream_layer_backward(ac_stream *s, int l, const float *x_in, float *dx, int B) {
    size_t rows = (size_t)s->n * s->m->a.hidden;
    for (int b = 0; b < B; b += s->B) {
        int nb = B - b < s->B ? B - b : s->B;
        layer_backward(s, l, x_in + b * rows, dx + b * rows, nb);
    }
}
