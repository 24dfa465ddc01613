/*
 * engine.c - see engine.h. Layout follows llm.c: one forward over flat
 * buffers, shapes in comments. N = B*n rows; H hidden; hd head_dim;
 * Q = n_heads*hd, KV = n_kv_heads*hd, F ffn width, for the current layer.
 */
#include "engine.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "kernels_cpu.h"
#include "rope.h"

void ac_engine_free(ac_engine *en) {
    float *bufs[] = {en->x,  en->x0, en->xn,     en->q,      en->att,   en->g,    en->u,
                     en->kt, en->vt, en->scores, en->logits, en->cos_t, en->sin_t};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    if (en->kc)
        for (int l = 0; l < en->m->a.n_layers; l++) {
            free(en->kc[l]);
            free(en->vc[l]);
        }
    free(en->kc);
    free(en->vc);
    free(en->pos);
    ac_wscratch_free(&en->ws);
    memset(en, 0, sizeof *en);
}

int ac_engine_init(ac_engine *en, const ac_model *m, int max_batch, int max_ctx, ac_err *e) {
    memset(en, 0, sizeof *en);
    const ac_arch *a = &m->a;
    if (max_batch <= 0 || max_ctx <= 0) return ac_errf(e, "engine: batch and context must be positive");
    en->m = m;
    en->max_batch = max_batch;
    en->max_ctx = max_ctx;
    size_t N = (size_t)max_batch * max_ctx, H = a->hidden, hd = a->head_dim;
    size_t maxq = 0, maxf = 0, maxkv = 0;
    for (int l = 0; l < a->n_layers; l++) {
        if ((size_t)a->layers[l].n_kv_heads * hd > maxkv) maxkv = a->layers[l].n_kv_heads * hd;
        if ((size_t)a->layers[l].n_heads * hd > maxq) maxq = a->layers[l].n_heads * hd;
        if ((size_t)a->layers[l].ffn > maxf) maxf = a->layers[l].ffn;
    }
    en->x = malloc(N * H * 4);
    en->x0 = malloc(N * H * 4);
    en->xn = malloc(N * H * 4);
    en->q = malloc(N * (maxq + 1) * 4);
    en->att = malloc(N * (maxq + 1) * 4);
    en->g = malloc(N * (maxf + 1) * 4);
    en->u = malloc(N * (maxf + 1) * 4);
    en->kt = malloc(N * (maxkv + 1) * 4);
    en->vt = malloc(N * (maxkv + 1) * 4);
    en->scores = malloc((size_t)max_ctx * max_ctx * 4);
    en->logits = malloc(N * a->vocab * 4);
    en->cos_t = malloc((size_t)max_ctx * hd / 2 * 4);
    en->sin_t = malloc((size_t)max_ctx * hd / 2 * 4);
    en->pos = malloc(N * sizeof(int));
    en->kc = calloc(a->n_layers, sizeof *en->kc);
    en->vc = calloc(a->n_layers, sizeof *en->vc);
    size_t maxin = H > maxq ? H : maxq;
    if (maxf > maxin) maxin = maxf;
    int ok = ac_model_wdt(m) == ST_F32 || ac_wscratch_alloc(&en->ws, (int)N, (int)maxin) == 0;
    ok = ok && en->x && en->x0 && en->xn && en->q && en->att && en->g && en->u && en->kt && en->vt && en->scores &&
         en->logits && en->cos_t && en->sin_t && en->pos && en->kc && en->vc;
    for (int l = 0; ok && l < a->n_layers; l++) {
        size_t kv = (size_t)a->layers[l].n_kv_heads * hd;
        if (!kv) continue;
        en->kc[l] = malloc(N * kv * 4);
        en->vc[l] = malloc(N * kv * 4);
        ok = en->kc[l] && en->vc[l];
    }
    if (!ok) {
        ac_engine_free(en);
        return ac_errf(e, "engine: out of memory for batch %d x context %d", max_batch, max_ctx);
    }
    if (ac_rope_tables(a, max_ctx, en->cos_t, en->sin_t, e)) {
        ac_engine_free(en);
        return -1;
    }
    return 0;
}

/* Causal attention for layer l over the cache. q,att: [N, Q]; cache
 * [B][max_ctx][KV]; GQA: query head h reads KV head h / group. */
static void attention(ac_engine *en, int l, int B, int n, int pos0) {
    const ac_arch *a = &en->m->a;
    const ac_layer_arch *L = &a->layers[l];
    int hd = a->head_dim, Q = L->n_heads * hd, KV = L->n_kv_heads * hd, grp = L->n_heads / L->n_kv_heads;
    for (int b = 0; b < B; b++) {
        const float *kb = en->kc[l] + (size_t)b * en->max_ctx * KV, *vb = en->vc[l] + (size_t)b * en->max_ctx * KV;
        for (int h = 0; h < L->n_heads; h++)
            ac_attention_head(en->att + (size_t)b * n * Q + h * hd, en->q + (size_t)b * n * Q + h * hd,
                              kb + (h / grp) * hd, vb + (h / grp) * hd, n, pos0, hd, Q, KV, a->sliding_window,
                              en->scores);
    }
}

int ac_engine_forward(ac_engine *en, const int *tokens, int B, int n, int pos0, int last_only, ac_err *e) {
    const ac_model *m = en->m;
    const ac_arch *a = &m->a;
    if (B <= 0 || n <= 0 || B > en->max_batch || pos0 < 0 || pos0 + n > en->max_ctx)
        return ac_errf(e, "engine: batch %d, tokens %d at position %d exceed the engine's %d x %d", B, n, pos0,
                       en->max_batch, en->max_ctx);
    int H = a->hidden, hd = a->head_dim, N = B * n, wdt = ac_model_wdt(m);
    ac_wscratch *ws = &en->ws;
    for (int r = 0; r < N; r++) {
        int tok = tokens[r];
        if (tok < 0 || tok >= a->vocab)
            return ac_errf(e, "engine: token id %d outside vocabulary of %d", tok, a->vocab);
        ac_row_f32(en->x + (size_t)r * H, m->embed, wdt, (size_t)tok, H);
        en->pos[r] = pos0 + r % n;
    }
    int blas1 = ac_blas_one_for_bf16(wdt, N); /* see ac_blas_threads */
    const ac_engine_hooks *hk = en->hooks;
#define HOOK(f, ...)                                                                                                   \
    do {                                                                                                               \
        if (hk && hk->f) hk->f(hk->ud, __VA_ARGS__);                                                                   \
    } while (0)
    HOOK(begin, B, n);
    for (int l = 0; l < a->n_layers; l++) {
        const ac_layer_arch *L = &a->layers[l];
        const ac_layer_w *w = &m->L[l];
        int lw = ac_model_wdt(m);
        if (hk && hk->layer_io) memcpy(en->x0, en->x, (size_t)N * H * 4);
        if (L->n_heads) {
            int Q = L->n_heads * hd, KV = L->n_kv_heads * hd;
            ac_rmsnorm(en->xn, en->x, w->in_norm, N, H, a->eps);
            HOOK(normed, l, 0, en->xn, N, H);
            ac_linear_w(en->q, en->xn, w->wq, lw, w->bq, N, H, Q, 0, ws);
            ac_rope(en->q, N, L->n_heads, hd, en->pos, en->cos_t, en->sin_t);
            /* k and v for all rows in one GEMM each, then into the cache
             * rows of their positions. */
            ac_linear_w(en->kt, en->xn, w->wk, lw, w->bk, N, H, KV, 0, ws);
            ac_linear_w(en->vt, en->xn, w->wv, lw, w->bv, N, H, KV, 0, ws);
            ac_rope(en->kt, N, L->n_kv_heads, hd, en->pos, en->cos_t, en->sin_t);
            for (int b = 0; b < B; b++) {
                memcpy(en->kc[l] + ((size_t)b * en->max_ctx + pos0) * KV, en->kt + (size_t)b * n * KV,
                       (size_t)n * KV * 4);
                memcpy(en->vc[l] + ((size_t)b * en->max_ctx + pos0) * KV, en->vt + (size_t)b * n * KV,
                       (size_t)n * KV * 4);
            }
            attention(en, l, B, n, pos0);
            HOOK(head_out, l, en->att, N, L->n_heads, hd);
            ac_linear_w(en->x, en->att, w->wo, lw, NULL, N, Q, H, 1, ws);
        }
        if (L->ffn) {
            int F = L->ffn;
            ac_rmsnorm(en->xn, en->x, w->post_norm, N, H, a->eps);
            HOOK(normed, l, 1, en->xn, N, H);
            ac_linear_w(en->g, en->xn, w->wg, lw, NULL, N, H, F, 0, ws);
            ac_linear_w(en->u, en->xn, w->wu, lw, NULL, N, H, F, 0, ws);
            ac_silu_mul(en->g, en->u, (long)N * F);
            HOOK(ffn_act, l, en->g, N, F);
            ac_linear_w(en->x, en->g, w->wd, lw, NULL, N, F, H, 1, ws);
        }
        HOOK(layer_io, l, en->x0, en->x, N, H);
    }
    HOOK(rows, N);
#undef HOOK
    /* Final norm and LM head, on every row or the last row of each sequence. */
    int rows = last_only ? B : N;
    if (last_only)
        for (int b = 0; b < B; b++) memmove(en->x + (size_t)b * H, en->x + ((size_t)b * n + n - 1) * H, H * 4);
    ac_rmsnorm(en->xn, en->x, m->final_norm, rows, H, a->eps);
    ac_linear_w(en->logits, en->xn, m->lm_head, wdt, NULL, rows, H, a->vocab, 0, ws);
    ac_blas_restore(blas1);
    return 0;
}

double ac_engine_nll(const ac_engine *en, const int *tokens, int B, int n, int from, long *count) {
    int V = en->m->a.vocab;
    double nll = 0;
    long c = 0;
    for (int b = 0; b < B; b++)
        for (int t = from; t < n - 1; t++) {
            const float *lg = en->logits + ((size_t)b * n + t) * V;
            nll += ac_logsumexp(lg, V) - lg[tokens[(size_t)b * n + t + 1]];
            c++;
        }
    if (count) *count = c;
    return c ? nll / c : 0;
}
