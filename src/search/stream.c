/* stream.c - see stream.h. Shapes as in engine.c: N = B*n rows, H hidden,
 * hd head_dim, Q = n_heads*hd, KV = n_kv_heads*hd, F ffn width. */
#include "stream.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_cpu.h"
#include "rope.h"
#include "safetensors.h"

void ac_stream_free(ac_stream *s) {
    float *bufs[] = {s->xn, s->q, s->kt, s->vt, s->att, s->g, s->u, s->x0, s->scores, s->cos_t, s->sin_t, s->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    free(s->pos);
    ac_wscratch_free(&s->ws);
    memset(s, 0, sizeof *s);
}

int ac_stream_init(ac_stream *s, const ac_model *m, int B, int n, ac_err *e) {
    memset(s, 0, sizeof *s);
    const ac_arch *a = &m->a;
    if (B < 1 || n < 2) return ac_errf(e, "stream: batch must be >= 1 and window >= 2");
    s->m = m;
    s->B = B;
    s->n = n;
    size_t N = (size_t)B * n, H = a->hidden, hd = a->head_dim, mq = 1, mkv = 1, mf = 1;
    for (int l = 0; l < a->n_layers; l++) {
        const ac_layer_arch *la = &a->layers[l];
        if ((size_t)la->n_heads * hd > mq) mq = (size_t)la->n_heads * hd;
        if ((size_t)la->n_kv_heads * hd > mkv) mkv = (size_t)la->n_kv_heads * hd;
        if ((size_t)la->ffn > mf) mf = la->ffn;
    }
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
    if (!s->xn || !s->x0 || !s->q || !s->att || !s->kt || !s->vt || !s->g || !s->u || !s->scores || !s->cos_t ||
        !s->sin_t || !s->logits || !s->pos ||
        (ac_model_wdt(m) != ST_F32 && ac_wscratch_alloc(&s->ws, (int)N, (int)(mf > mq ? mf : mq) + (int)H))) {
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

int ac_stream_embed(const ac_model *m, const int *tok, long N, float *x, ac_err *e) {
    int H = m->a.hidden;
    for (long r = 0; r < N; r++) {
        if (tok[r] < 0 || tok[r] >= m->a.vocab)
            return ac_errf(e, "stream: token id %d outside vocabulary of %d", tok[r], m->a.vocab);
        ac_row_f32(x + (size_t)r * H, m->embed, ac_model_wdt(m), (size_t)tok[r], H);
    }
    return 0;
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

static void attention_block(ac_stream *s, int l, float *x, int B, const ac_stream_mod *mod, const ac_engine_hooks *hk) {
    const ac_arch *a = &s->m->a;
    const ac_layer_arch *la = &a->layers[l];
    const ac_layer_w *w = &s->m->L[l];
    int H = a->hidden, hd = a->head_dim, n = s->n, N = B * n, Q = la->n_heads * hd, KV = la->n_kv_heads * hd;
    int grp = la->n_heads / la->n_kv_heads, wdt = ac_layer_wdt(s->m, l);
    ac_rmsnorm(s->xn, x, w->in_norm, N, H, a->eps);
    if (hk && hk->normed) hk->normed(hk->ud, l, 0, s->xn, N, H);
    ac_linear_w(s->q, s->xn, w->wq, wdt, w->bq, N, H, Q, 0, &s->ws);
    ac_rope(s->q, N, la->n_heads, hd, s->pos, s->cos_t, s->sin_t);
    ac_linear_w(s->kt, s->xn, w->wk, wdt, w->bk, N, H, KV, 0, &s->ws);
    ac_linear_w(s->vt, s->xn, w->wv, wdt, w->bv, N, H, KV, 0, &s->ws);
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
    if (hk && hk->head_out) hk->head_out(hk->ud, l, s->att, N, la->n_heads, hd);
    ac_linear_w(x, s->att, mod && mod->wo ? mod->wo : w->wo, mod && mod->wo ? ST_F32 : wdt, NULL, N, Q, H, 1, &s->ws);
}

void ac_stream_layer(ac_stream *s, int l, float *x, int B, const ac_stream_mod *mod, const ac_engine_hooks *hk) {
    const ac_arch *a = &s->m->a;
    const ac_layer_arch *la = &a->layers[l];
    const ac_layer_w *w = &s->m->L[l];
    int H = a->hidden, N = B * s->n, F = la->ffn, wdt = ac_layer_wdt(s->m, l);
    if (hk && hk->begin) hk->begin(hk->ud, B, s->n);
    if (hk && hk->layer_io) memcpy(s->x0, x, (size_t)N * H * 4);
    if (la->n_heads) attention_block(s, l, x, B, mod, hk);
    if (F) {
        ac_rmsnorm(s->xn, x, w->post_norm, N, H, a->eps);
        if (hk && hk->normed) hk->normed(hk->ud, l, 1, s->xn, N, H);
        ac_linear_w(s->g, s->xn, w->wg, wdt, NULL, N, H, F, 0, &s->ws);
        ac_linear_w(s->u, s->xn, w->wu, wdt, NULL, N, H, F, 0, &s->ws);
        ac_silu_mul(s->g, s->u, (long)N * F);
        if (hk && hk->ffn_act) hk->ffn_act(hk->ud, l, s->g, N, F);
        ac_linear_w(x, s->g, mod && mod->wd ? mod->wd : w->wd, mod && mod->wd ? ST_F32 : wdt, NULL, N, F, H, 1, &s->ws);
    }
    if (hk && hk->layer_io) hk->layer_io(hk->ud, l, s->x0, x, N, H);
}

double ac_stream_nll(ac_stream *s, const float *x, const int *tok, int B, long *count) {
    const ac_model *m = s->m;
    int H = m->a.hidden, V = m->a.vocab, n = s->n;
    double nll = 0;
    long c = 0;
    for (int b = 0; b < B; b++) {
        ac_rmsnorm(s->xn, x + (size_t)b * n * H, m->final_norm, n, H, m->a.eps);
        ac_linear_w(s->logits, s->xn, m->lm_head, ac_model_wdt(m), NULL, n, H, V, 0, &s->ws);
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
