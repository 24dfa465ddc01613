/*
 * train.c - see train.h. Shapes: N = B*T rows; H hidden; hd head_dim;
 * Q = n_heads*hd, KV = n_kv_heads*hd, F ffn width of the current layer;
 * V vocabulary. Per layer (llm.c style, over flat buffers):
 *   xn = rmsnorm(x) * w_in * gh            xh1 [N,H], r1 [N]
 *   q,k,v = xn Wq^T + bq, ...; rope(q,k)    q [N,Q], k,v [N,KV]
 *   o = causal_attention(q, k, v)           o [N,Q]
 *   x += s_attn * (o * g_head) Wo^T
 *   xn = rmsnorm(x) * w_post * gh           xh2 [N,H], r2 [N]
 *   x += s_mlp * ((silu(xn Wg^T) * xn Wu^T) * g_ffn) Wd^T    gp,u [N,F]
 * then logits = (rmsnorm(x) * w_final * gh) W_lm^T. Every rmsnorm is the
 * gated one of backward_cpu.h: its mean square is over the hidden gates'
 * mass, sum gh x^2 / sum gh, so hidden gates in {0,1} are the pruned model.
 */
#include "train.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backward_cpu.h"
#include "dtype.h"
#include "kernels_cpu.h"
#include "tensor.h"

typedef struct {
    size_t maxq, maxkv, maxf;
} widths;

static widths arch_widths(const ac_arch *a) {
    widths w = {1, 1, 1};
    for (int l = 0; l < a->n_layers; l++) {
        size_t q = (size_t)a->layers[l].n_heads * a->head_dim, kv = (size_t)a->layers[l].n_kv_heads * a->head_dim;
        if (q > w.maxq) w.maxq = q;
        if (kv > w.maxkv) w.maxkv = kv;
        if ((size_t)a->layers[l].ffn > w.maxf) w.maxf = a->layers[l].ffn;
    }
    return w;
}

/* Floats of layer l's seven matrices. */
static size_t layer_floats(const ac_arch *a, int l) {
    const ac_layer_arch *L = &a->layers[l];
    size_t H = a->hidden, Q = (size_t)L->n_heads * a->head_dim, KV = (size_t)L->n_kv_heads * a->head_dim;
    return 2 * Q * H + 2 * KV * H + 3 * (size_t)L->ffn * H;
}

static size_t max_layer_floats(const ac_arch *a) {
    size_t mx = 0;
    for (int l = 0; l < a->n_layers; l++)
        if (layer_floats(a, l) > mx) mx = layer_floats(a, l);
    return mx;
}

int ac_trainer_lm_rows(const ac_arch *a) {
    size_t r = max_layer_floats(a) / (a->hidden > 0 ? a->hidden : 1);
    if (r < 256) r = 256;
    return r > (size_t)a->vocab ? a->vocab : (int)r;
}

/* Floats of the conversion scratch: the largest layer, or an LM-head tile. */
static size_t scratch_floats(const ac_arch *a) {
    size_t lm = (size_t)ac_trainer_lm_rows(a) * a->hidden, ly = max_layer_floats(a);
    return lm > ly ? lm : ly;
}

/* Carve the one allocation: with base == NULL only count. Returns floats. */
static size_t layout(ac_trainer *t, const ac_arch *a, int B, int T, float *base) {
    size_t off = 0, N = (size_t)B * T, H = a->hidden, hd = a->head_dim, V = a->vocab;
    widths w = arch_widths(a);
    /* TAKE only evaluates ptr when assigning, so base == NULL (t == NULL) counts. */
#define TAKE(ptr, n)                                                                                                   \
    do {                                                                                                               \
        if (base) (ptr) = base + off;                                                                                  \
        off += (n);                                                                                                    \
    } while (0)
    for (int l = 0; l < a->n_layers; l++) {
        const ac_layer_arch *L = &a->layers[l];
        size_t Q = (size_t)L->n_heads * hd, KV = (size_t)L->n_kv_heads * hd, F = L->ffn;
        if (L->n_heads) {
            TAKE(t->xh1[l], N * H);
            TAKE(t->r1[l], N);
            TAKE(t->q[l], N * Q);
            TAKE(t->k[l], N * KV);
            TAKE(t->v[l], N * KV);
            TAKE(t->o[l], N * Q);
            TAKE(t->gate.head[l], L->n_heads);
            TAKE(t->dgate.head[l], L->n_heads);
        }
        if (F) {
            TAKE(t->xh2[l], N * H);
            TAKE(t->r2[l], N);
            TAKE(t->gp[l], N * F);
            TAKE(t->u[l], N * F);
            TAKE(t->gate.ffn[l], F);
            TAKE(t->dgate.ffn[l], F);
        }
    }
    TAKE(t->xhf, N * H);
    TAKE(t->rf, N);
    TAKE(t->logits, N * V);
    TAKE(t->dlogits, N * V);
    TAKE(t->x, N * H);
    TAKE(t->dx, N * H);
    TAKE(t->xn, N * H);
    TAKE(t->dxn, N * H);
    TAKE(t->sq, N * w.maxq);
    TAKE(t->dq, N * w.maxq);
    TAKE(t->dk, N * w.maxkv);
    TAKE(t->dv, N * w.maxkv);
    TAKE(t->sf, N * w.maxf);
    TAKE(t->df, N * w.maxf);
    TAKE(t->du, N * w.maxf);
    TAKE(t->att, 2 * (size_t)T * T);
    TAKE(t->cos_t, (size_t)T * hd / 2);
    TAKE(t->sin_t, (size_t)T * hd / 2);
    TAKE(t->gate.hidden, H);
    TAKE(t->dgate.hidden, H);
    TAKE(t->gate.attn, a->n_layers);
    TAKE(t->dgate.attn, a->n_layers);
    TAKE(t->gate.mlp, a->n_layers);
    TAKE(t->dgate.mlp, a->n_layers);
#undef TAKE
    return off;
}

size_t ac_trainer_bytes(const ac_arch *a, int B, int T) {
    return layout(NULL, a, B, T, NULL) * sizeof(float) + (size_t)B * T * 2 * sizeof(int) +
           (size_t)ac_arch_params(a) * sizeof(float);
}

size_t ac_trainer_bytes_frozen(const ac_arch *a, int B, int T) {
    return (layout(NULL, a, B, T, NULL) + scratch_floats(a)) * sizeof(float) + (size_t)B * T * 2 * sizeof(int);
}

void ac_trainer_free(ac_trainer *t) {
    float ***ptrs[] = {&t->xh1, &t->r1, &t->q, &t->k,         &t->v,        &t->o,          &t->xh2,
                       &t->r2,  &t->gp, &t->u, &t->gate.head, &t->gate.ffn, &t->dgate.head, &t->dgate.ffn};
    for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++) free(*ptrs[i]);
    free(t->mem);
    free(t->tok);
    free(t->pos);
    free(t->wscr);
    if (t->frozen)
        free(t->g.L); /* its fields are the caller's */
    else if (t->g.L)
        ac_model_free(&t->g);
    memset(t, 0, sizeof *t);
}

static int trainer_init(ac_trainer *t, ac_model *m, int max_B, int max_T, int frozen, ac_err *e) {
    memset(t, 0, sizeof *t);
    const ac_arch *a = &m->a;
    if (max_B <= 0 || max_T <= 0) return ac_errf(e, "trainer: batch and context must be positive");
    if (!frozen && ac_model_wdt(m) != ST_F32) /* the optimizer updates m in place: fp32 master weights */
        return ac_errf(e, "trainer: trained weights must be fp32 (a resident model needs ac_model_to_f32 first)");
    t->m = m;
    t->frozen = frozen;
    t->wl_at = -1;
    t->lm_rows = ac_trainer_lm_rows(a);
    t->max_B = max_B;
    t->max_T = max_T;
    int nl = a->n_layers;
    float ***ptrs[] = {&t->xh1, &t->r1, &t->q, &t->k,         &t->v,        &t->o,          &t->xh2,
                       &t->r2,  &t->gp, &t->u, &t->gate.head, &t->gate.ffn, &t->dgate.head, &t->dgate.ffn};
    int ok = 1;
    for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++)
        ok = ok && (*ptrs[i] = calloc(nl ? nl : 1, sizeof(float *)));
    size_t nf = layout(NULL, a, max_B, max_T, NULL), N = (size_t)max_B * max_T;
    ok = ok && (t->mem = malloc(nf * sizeof(float))) && (t->tok = malloc(N * sizeof(int))) &&
         (t->pos = malloc(N * sizeof(int)));
    if (ok && ac_model_wdt(m) != ST_F32) ok = (t->wscr = malloc(scratch_floats(a) * sizeof(float))) != NULL;
    if (ok && frozen) ok = (t->g.L = calloc(nl ? nl : 1, sizeof(ac_layer_w))) != NULL;
    if (ok && frozen) t->g.a = *a; /* the shapes, for readers of g (borrowed: g.a is never freed here) */
    if (!ok) {
        ac_trainer_free(t);
        return ac_errf(e, "trainer: out of memory for batch %d x context %d (%.1f MiB)", max_B, max_T,
                       nf * 4.0 / 1048576);
    }
    layout(t, a, max_B, max_T, t->mem);
    if (!frozen && ac_model_alloc(&t->g, a, e)) {
        ac_trainer_free(t);
        return ac_errctx(e, "trainer gradients");
    }
    for (int l = 0; l < nl; l++) {
        for (int h = 0; h < a->layers[l].n_heads; h++) t->gate.head[l][h] = 1;
        for (int c = 0; c < a->layers[l].ffn; c++) t->gate.ffn[l][c] = 1;
        t->gate.attn[l] = t->gate.mlp[l] = 1;
    }
    for (int c = 0; c < a->hidden; c++) t->gate.hidden[c] = 1;
    int hd = a->head_dim;
    float *inv = malloc(hd / 2 * sizeof(float));
    if (!inv) {
        ac_trainer_free(t);
        return ac_errf(e, "out of memory");
    }
    ac_rope_inv_freq(inv, hd, a->rope_theta, a->rope_llama3, a->rs_factor, a->rs_low, a->rs_high, a->rs_orig);
    for (int p = 0; p < max_T; p++)
        for (int i = 0; i < hd / 2; i++) {
            float ang = (float)p * inv[i];
            t->cos_t[p * hd / 2 + i] = cosf(ang);
            t->sin_t[p * hd / 2 + i] = sinf(ang);
        }
    free(inv);
    ac_train_zero_grad(t);
    return 0;
}

int ac_trainer_init(ac_trainer *t, ac_model *m, int max_B, int max_T, ac_err *e) {
    return trainer_init(t, m, max_B, max_T, 0, e);
}

int ac_trainer_init_frozen(ac_trainer *t, ac_model *m, int max_B, int max_T, ac_err *e) {
    return trainer_init(t, m, max_B, max_T, 1, e);
}

/* The fp32 view of layer l: the model's own fields where they are fp32,
 * t->ovr's where set, else the matrix converted into t->wscr (exact). Kept
 * in t->wl until the scratch is reused (wl_at). */
static const ac_layer_w *layer_view(ac_trainer *t, int l) {
    const ac_model *m = t->m;
    const ac_layer_w *src = &m->L[l], *ov = t->ovr ? &t->ovr[l] : NULL;
    int wdt = ac_model_wdt(m);
    if (wdt == ST_F32 && !ov) return src;
    if (t->wl_at == l) return &t->wl;
    ac_layer_w *w = &t->wl;
    *w = *src;
    float **d[7] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->wg, &w->wu, &w->wd};
    float *o[7] = {0};
    if (ov) {
        float *oo[7] = {ov->wq, ov->wk, ov->wv, ov->wo, ov->wg, ov->wu, ov->wd};
        memcpy(o, oo, sizeof o);
        w->bq = ov->bq ? ov->bq : w->bq;
        w->bk = ov->bk ? ov->bk : w->bk;
        w->bv = ov->bv ? ov->bv : w->bv;
    }
    size_t off = 0;
    for (int i = 0; i < 7; i++) {
        size_t n = 0;
        ac_layer_matrix(m, l, (ac_wmat)i, &n);
        if (o[i])
            *d[i] = o[i];
        else if (*d[i] && n && wdt != ST_F32) {
            ac_to_f32(t->wscr + off, *d[i], (st_dtype)wdt, n, NULL);
            *d[i] = t->wscr + off;
            off += n;
        }
    }
    t->wl_at = l;
    return w;
}

/* Rows [r0, r0+nr) of the LM head as fp32 (the model's own, or converted
 * into the scratch). */
static const float *lm_tile(ac_trainer *t, size_t r0, size_t nr) {
    const ac_model *m = t->m;
    int wdt = ac_model_wdt(m);
    size_t H = m->a.hidden;
    if (wdt == ST_F32) return m->lm_head + r0 * H;
    ac_to_f32(t->wscr, (const uint16_t *)(const void *)m->lm_head + r0 * H, (st_dtype)wdt, nr * H, NULL);
    t->wl_at = -1;
    return t->wscr;
}

static void zero(float *p, size_t n) {
    if (p) memset(p, 0, n * sizeof(float));
}

void ac_train_zero_grad(ac_trainer *t) {
    const ac_arch *a = &t->m->a;
    size_t H = a->hidden, hd = a->head_dim, V = a->vocab;
    zero(t->g.embed, V * H);
    if (!a->tie_embeddings) zero(t->g.lm_head, V * H);
    zero(t->g.final_norm, H);
    zero(t->dgate.hidden, H);
    for (int l = 0; l < a->n_layers; l++) {
        const ac_layer_arch *L = &a->layers[l];
        ac_layer_w *w = &t->g.L[l];
        size_t Q = L->n_heads * hd, KV = L->n_kv_heads * hd, F = L->ffn;
        zero(w->in_norm, L->n_heads ? H : 0);
        zero(w->wq, Q * H);
        zero(w->wk, KV * H);
        zero(w->wv, KV * H);
        zero(w->wo, H * Q);
        zero(w->bq, w->bq ? Q : 0);
        zero(w->bk, w->bk ? KV : 0);
        zero(w->bv, w->bv ? KV : 0);
        zero(w->post_norm, F ? H : 0);
        zero(w->wg, F * H);
        zero(w->wu, F * H);
        zero(w->wd, H * F);
        zero(t->dgate.head[l], L->n_heads);
        zero(t->dgate.ffn[l], F);
        t->dgate.attn[l] = t->dgate.mlp[l] = 0;
    }
}

/* xn[N,H] = xhat * w * gh. */
static void renorm(float *xn, const float *xhat, const float *w, const float *gh, int N, int H) {
    for (int r = 0; r < N; r++)
        for (int c = 0; c < H; c++) xn[(size_t)r * H + c] = xhat[(size_t)r * H + c] * w[c] * gh[c];
}

static void attn_forward(ac_trainer *t, int l, const ac_layer_w *w) {
    const ac_arch *a = &t->m->a;
    const ac_layer_arch *L = &a->layers[l];
    int B = t->B, T = t->T, N = B * T, H = a->hidden, hd = a->head_dim;
    int Q = L->n_heads * hd, KV = L->n_kv_heads * hd, grp = L->n_heads / L->n_kv_heads;
    ac_rmsnorm_fwd(t->xn, t->xh1[l], t->r1[l], t->x, w->in_norm, t->gate.hidden, N, H, a->eps);
    ac_linear(t->q[l], t->xn, w->wq, w->bq, N, H, Q);
    ac_linear(t->k[l], t->xn, w->wk, w->bk, N, H, KV);
    ac_linear(t->v[l], t->xn, w->wv, w->bv, N, H, KV);
    ac_rope(t->q[l], N, L->n_heads, hd, t->pos, t->cos_t, t->sin_t);
    ac_rope(t->k[l], N, L->n_kv_heads, hd, t->pos, t->cos_t, t->sin_t);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < L->n_heads; h++) {
            size_t qo = (size_t)b * T * Q + h * hd, ko = (size_t)b * T * KV + (h / grp) * hd;
            ac_attention_head(t->o[l] + qo, t->q[l] + qo, t->k[l] + ko, t->v[l] + ko, T, 0, hd, Q, KV,
                              a->sliding_window, t->att);
        }
    const float *gh = t->gate.head[l];
    for (size_t i = 0; i < (size_t)N * Q; i++) t->sq[i] = t->o[l][i] * gh[(i % Q) / hd];
    /* x[N,H] += s_attn * sq[N,Q] Wo[H,Q]^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, H, Q, t->gate.attn[l], t->sq, Q, w->wo, Q, 1.0f, t->x, H);
}

/* sf[N,F] = silu(gp) * u (ungated). */
static void ffn_act(float *sf, const float *gp, const float *u, size_t n) {
    for (size_t i = 0; i < n; i++) sf[i] = gp[i] / (1.0f + expf(-gp[i])) * u[i];
}

static void ffn_forward(ac_trainer *t, int l, const ac_layer_w *w) {
    const ac_arch *a = &t->m->a;
    int N = t->B * t->T, H = a->hidden, F = a->layers[l].ffn;
    ac_rmsnorm_fwd(t->xn, t->xh2[l], t->r2[l], t->x, w->post_norm, t->gate.hidden, N, H, a->eps);
    ac_linear(t->gp[l], t->xn, w->wg, NULL, N, H, F);
    ac_linear(t->u[l], t->xn, w->wu, NULL, N, H, F);
    ffn_act(t->sf, t->gp[l], t->u[l], (size_t)N * F);
    const float *gf = t->gate.ffn[l];
    for (size_t i = 0; i < (size_t)N * F; i++) t->sf[i] *= gf[i % F];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, H, F, t->gate.mlp[l], t->sf, F, w->wd, F, 1.0f, t->x, H);
}

int ac_train_forward(ac_trainer *t, const int *tokens, int B, int T, ac_err *e) {
    const ac_model *m = t->m;
    const ac_arch *a = &m->a;
    if (B <= 0 || T <= 0 || B > t->max_B || T > t->max_T)
        return ac_errf(e, "trainer: batch %d x %d tokens exceeds its %d x %d", B, T, t->max_B, t->max_T);
    int N = B * T, H = a->hidden;
    for (int r = 0; r < N; r++)
        if (tokens[r] < 0 || tokens[r] >= a->vocab)
            return ac_errf(e, "trainer: token id %d outside vocabulary of %d", tokens[r], a->vocab);
    t->B = B;
    t->T = T;
    t->wl_at = -1; /* the weights (or the KV-merge overrides) may have changed since the last call */
    for (int r = 0; r < N; r++) {
        t->tok[r] = tokens[r];
        t->pos[r] = r % T;
        ac_row_f32(t->x + (size_t)r * H, m->embed, ac_model_wdt(m), (size_t)tokens[r], H);
    }
    for (int l = 0; l < a->n_layers; l++) {
        if (!a->layers[l].n_heads && !a->layers[l].ffn) continue;
        const ac_layer_w *w = layer_view(t, l);
        if (a->layers[l].n_heads) attn_forward(t, l, w);
        if (a->layers[l].ffn) ffn_forward(t, l, w);
    }
    ac_rmsnorm_fwd(t->xn, t->xhf, t->rf, t->x, m->final_norm, t->gate.hidden, N, H, a->eps);
    /* logits[N,V] = xn W_lm^T, tile by tile of LM-head rows (one tile on small models: ac_linear's call) */
    for (int r0 = 0; r0 < a->vocab; r0 += t->lm_rows) {
        int nr = a->vocab - r0 < t->lm_rows ? a->vocab - r0 : t->lm_rows;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, nr, H, 1.0f, t->xn, H, lm_tile(t, r0, nr), H, 0.0f,
                    t->logits + r0, a->vocab);
    }
    return 0;
}

void ac_next_token_targets(int *target, const int *tokens, int B, int T) {
    for (int b = 0; b < B; b++)
        for (int i = 0; i < T; i++) target[b * T + i] = i + 1 < T ? tokens[b * T + i + 1] : -1;
}

double ac_train_loss(ac_trainer *t, const int *target, const float *teacher, float tau, float kd_weight, float scale,
                     double *ce, double *kd) {
    return ac_loss_backward(t->dlogits, t->logits, target, teacher, t->B * t->T, t->m->a.vocab, tau, kd_weight, scale,
                            ce, kd);
}

static void ffn_backward(ac_trainer *t, int l, const ac_layer_w *w) {
    const ac_arch *a = &t->m->a;
    ac_layer_w *gw = &t->g.L[l];
    int N = t->B * t->T, H = a->hidden, F = a->layers[l].ffn;
    float s = t->gate.mlp[l], *gf = t->gate.ffn[l], *dgf = t->dgate.ffn[l];
    ffn_act(t->sf, t->gp[l], t->u[l], (size_t)N * F); /* h (ungated) */
    /* df[N,F] = dx[N,H] Wd[H,F]: the gradient of the gated activation, before s */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, F, H, 1.0f, t->dx, H, w->wd, F, 0.0f, t->df, F);
    double ds = 0;
    for (size_t i = 0; i < (size_t)N * F; i++) {
        size_t c = i % F;
        float d = t->df[i], h = t->sf[i];
        dgf[c] += s * d * h;
        ds += (double)d * h * gf[c];
        t->sf[i] = h * gf[c];
        t->df[i] = d * s * gf[c];
    }
    t->dgate.mlp[l] += (float)ds;
    /* dWd[H,F] += s dx^T (h*gf) */
    if (gw->wd) cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, H, F, N, s, t->dx, H, t->sf, F, 1.0f, gw->wd, F);
    ac_silu_mul_backward(t->df, t->du, t->df, t->gp[l], t->u[l], (long)N * F);
    renorm(t->xn, t->xh2[l], w->post_norm, t->gate.hidden, N, H);
    ac_linear_backward(t->dxn, gw->wg, NULL, t->df, t->xn, w->wg, N, H, F, 1.0f, 0);
    ac_linear_backward(t->dxn, gw->wu, NULL, t->du, t->xn, w->wu, N, H, F, 1.0f, 1);
    ac_rmsnorm_backward(t->dx, gw->post_norm, t->dgate.hidden, t->dxn, t->xh2[l], t->r2[l], w->post_norm,
                        t->gate.hidden, N, H);
}

static void attn_backward(ac_trainer *t, int l, const ac_layer_w *w) {
    const ac_arch *a = &t->m->a;
    const ac_layer_arch *L = &a->layers[l];
    ac_layer_w *gw = &t->g.L[l];
    int B = t->B, T = t->T, N = B * T, H = a->hidden, hd = a->head_dim;
    int Q = L->n_heads * hd, KV = L->n_kv_heads * hd, grp = L->n_heads / L->n_kv_heads;
    float s = t->gate.attn[l], *gh = t->gate.head[l], *dgh = t->dgate.head[l];
    /* sq[N,Q] = dx Wo: the gradient of the gated attention output, before s */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, Q, H, 1.0f, t->dx, H, w->wo, Q, 0.0f, t->sq, Q);
    double ds = 0;
    for (size_t i = 0; i < (size_t)N * Q; i++) {
        int h = (int)((i % Q) / hd);
        float d = t->sq[i], o = t->o[l][i];
        dgh[h] += s * d * o;
        ds += (double)d * o * gh[h];
        t->dq[i] = o * gh[h];     /* gated output, for dWo */
        t->sq[i] = d * s * gh[h]; /* d o */
    }
    t->dgate.attn[l] += (float)ds;
    if (gw->wo) cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, H, Q, N, s, t->dx, H, t->dq, Q, 1.0f, gw->wo, Q);
    zero(t->dk, (size_t)N * KV);
    zero(t->dv, (size_t)N * KV);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < L->n_heads; h++) {
            size_t qo = (size_t)b * T * Q + h * hd, ko = (size_t)b * T * KV + (h / grp) * hd;
            ac_attention_head_backward(t->dq + qo, t->dk + ko, t->dv + ko, t->sq + qo, t->q[l] + qo, t->k[l] + ko,
                                       t->v[l] + ko, T, hd, Q, KV, a->sliding_window, t->att);
        }
    ac_rope_backward(t->dq, N, L->n_heads, hd, t->pos, t->cos_t, t->sin_t);
    ac_rope_backward(t->dk, N, L->n_kv_heads, hd, t->pos, t->cos_t, t->sin_t);
    renorm(t->xn, t->xh1[l], w->in_norm, t->gate.hidden, N, H);
    ac_linear_backward(t->dxn, gw->wq, gw->bq, t->dq, t->xn, w->wq, N, H, Q, 1.0f, 0);
    ac_linear_backward(t->dxn, gw->wk, gw->bk, t->dk, t->xn, w->wk, N, H, KV, 1.0f, 1);
    ac_linear_backward(t->dxn, gw->wv, gw->bv, t->dv, t->xn, w->wv, N, H, KV, 1.0f, 1);
    ac_rmsnorm_backward(t->dx, gw->in_norm, t->dgate.hidden, t->dxn, t->xh1[l], t->r1[l], w->in_norm, t->gate.hidden, N,
                        H);
}

/* dxn[N,H] = dlogits W_lm (tile by tile, accumulated in tile order);
 * g.lm_head[tile] += dlogits[:,tile]^T xn when it is trained. */
static void lm_backward(ac_trainer *t) {
    const ac_arch *a = &t->m->a;
    int N = t->B * t->T, H = a->hidden, V = a->vocab;
    for (int r0 = 0; r0 < V; r0 += t->lm_rows) {
        int nr = V - r0 < t->lm_rows ? V - r0 : t->lm_rows;
        const float *w = lm_tile(t, r0, nr);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, H, nr, 1.0f, t->dlogits + r0, V, w, H,
                    r0 ? 1.0f : 0.0f, t->dxn, H);
        if (t->g.lm_head)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nr, H, N, 1.0f, t->dlogits + r0, V, t->xn, H, 1.0f,
                        t->g.lm_head + (size_t)r0 * H, H);
    }
}

void ac_train_backward(ac_trainer *t) {
    const ac_model *m = t->m;
    const ac_arch *a = &m->a;
    int N = t->B * t->T, H = a->hidden;
    renorm(t->xn, t->xhf, m->final_norm, t->gate.hidden, N, H);
    lm_backward(t);
    zero(t->dx, (size_t)N * H);
    ac_rmsnorm_backward(t->dx, t->g.final_norm, t->dgate.hidden, t->dxn, t->xhf, t->rf, m->final_norm, t->gate.hidden,
                        N, H);
    for (int l = a->n_layers - 1; l >= 0; l--) {
        if (!a->layers[l].n_heads && !a->layers[l].ffn) continue;
        const ac_layer_w *w = layer_view(t, l);
        if (a->layers[l].ffn) ffn_backward(t, l, w);
        if (a->layers[l].n_heads) attn_backward(t, l, w);
    }
    for (int r = 0; r < N && t->g.embed; r++) {
        float *ge = t->g.embed + (size_t)t->tok[r] * H;
        const float *d = t->dx + (size_t)r * H;
        for (int c = 0; c < H; c++) ge[c] += d[c];
    }
}

void ac_train_kv_group_grad(const ac_trainer *t, int l, float *out) {
    const ac_layer_arch *L = &t->m->a.layers[l];
    if (!L->n_heads) return;
    int grp = L->n_heads / L->n_kv_heads;
    for (int g = 0; g < L->n_kv_heads; g++) out[g] = 0;
    for (int h = 0; h < L->n_heads; h++) out[h / grp] += t->dgate.head[l][h];
}
