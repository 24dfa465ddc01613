/* stream.c - see stream.h. Shapes as in engine.c: N = B*n rows, H hidden,
 * hd head_dim, Q = n_heads*hd, KV = n_kv_heads*hd, F ffn width. */
#include "search/stream.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/backward_cpu.h"
#include "runtime/block_cpu.h"
#include "runtime/block_grad.h"
#include "core/dtype.h"
#include "runtime/kernels_cpu.h"
#include "runtime/rope.h"

void ac_stream_free(ac_stream *s) {
    float *bufs[] = {s->xn,    s->q,     s->kt,     s->vt,  s->att, s->g,  s->u,        s->x0,     s->scores,
                     s->cos_t, s->sin_t, s->logits, s->xh1, s->r1,  s->x1, s->dxn,      s->tape,   s->bscr,
                     s->dw,    s->wtile, s->conv_buf, s->ssm_buf, s->wscr, s->escr};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    free(s->pos);
    free(s->rows);
    free(s->conv_s);
    free(s->ssm_s);
    ac_block_cpu_kind_free(s->kind_slot);
    ac_wscratch_free(&s->ws);
    memset(s, 0, sizeof *s);
}

/* Widest query, KV and FFN width over the layers (at least 1). */
static void widths(const ac_arch *a, size_t *mq, size_t *mkv, size_t *mf) {
    *mq = ac_block_dim_max(a, AC_DIM_Q);
    *mkv = ac_block_dim_max(a, AC_DIM_KV);
    *mf = ac_block_dim_max(a, AC_DIM_F);
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
    int moe_ok = 1;
    if (ac_arch_has_moe(a)) { /* the routing order, as the engine's (engine.c) */
        size_t E = ac_block_dim_max(a, AC_DIM_E);
        moe_ok = (s->rows = malloc((N > E ? N : E) * sizeof(int))) != NULL;
    }
    size_t hin = ac_block_cpu_kind_alloc(a, N, s->kind_slot); /* as the engine's */
    moe_ok = moe_ok && hin;
    if (hin > maxin) maxin = hin;
    if (a->hybrid) { /* one conv and one SSM state for every layer (restarted at each call) */
        size_t SC = ac_block_dim_max(a, AC_DIM_SC), K = a->ssm_conv > 1 ? a->ssm_conv - 1 : 1, nh = 0;
        for (int l = 0; l < a->n_layers; l++)
            if ((size_t)a->layers[l].ssm_heads > nh) nh = a->layers[l].ssm_heads;
        s->conv_buf = malloc(((size_t)B * K * SC + 1) * 4);
        s->ssm_buf = malloc(((size_t)B * nh * a->ssm_head_dim * a->ssm_state + 1) * 4);
        s->conv_s = malloc(a->n_layers * sizeof *s->conv_s);
        s->ssm_s = malloc(a->n_layers * sizeof *s->ssm_s);
        moe_ok = moe_ok && s->conv_buf && s->ssm_buf && s->conv_s && s->ssm_s;
        for (int l = 0; moe_ok && l < a->n_layers; l++) s->conv_s[l] = s->conv_buf, s->ssm_s[l] = s->ssm_buf;
    }
    int ws_ok = s->wdt == ST_F32 || ac_wscratch_alloc(&s->ws, (int)N, (int)maxin) == 0;
    if (!moe_ok || !ws_ok || !s->xn || !s->x0 || !s->q || !s->att || !s->kt || !s->vt || !s->g || !s->u || !s->scores ||
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
    /* a hybrid on 16-bit weights: each layer converted for the fp32 executor (layer_backward) */
    int view = a->hybrid && s->wdt != ST_F32;
    if (ac_block_grad_supports(a, view ? ST_F32 : s->wdt, e)) return ac_errctx(e, "stream backward");
    size_t N = (size_t)s->B * s->n, H = a->hidden, mq, mkv, mf;
    widths(a, &mq, &mkv, &mf);
    size_t maxin = H > mq ? H : mq;
    if (mf > maxin) maxin = mf;
    if ((size_t)ac_block_dim_max(a, AC_DIM_FE) > maxin) maxin = ac_block_dim_max(a, AC_DIM_FE); /* experts' down */
    s->wtile_rows = 64;
    size_t tape = 0;
    for (int l = 0; l < a->n_layers; l++)
        if (ac_block_tape_floats(a, l, N, 0) > tape) tape = ac_block_tape_floats(a, l, N, 0);
    s->tape = malloc((tape + 1) * 4);
    s->bscr = malloc(ac_block_grad_scratch_floats(a, s->B, s->n) * 4);
    s->xh1 = malloc(N * H * 4);
    s->x1 = malloc(N * H * 4);
    s->dxn = malloc(N * H * 4);
    s->r1 = malloc(N * 4);
    s->dw = malloc(H * 4);
    s->wtile = s->wdt == ST_F32 ? malloc(4) : malloc((size_t)s->wtile_rows * maxin * 4);
    if (view) {
        s->wscr = malloc((ac_block_grad_view_floats(a) + 1) * 4);
        s->escr = malloc((ac_block_grad_expert_floats(a) + 1) * 4);
    }
    if (!s->tape || !s->bscr || !s->xh1 || !s->x1 || !s->dxn || !s->r1 || !s->dw || !s->wtile ||
        (view && (!s->wscr || !s->escr)))
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

/* The CPU executor over s's buffers, windows from position 0 (no cache). */
static ac_block_cpu executor(ac_stream *s, float *x, const ac_stream_mod *mod, const ac_engine_hooks *hk) {
    ac_block_cpu c = {.m = s->m,
                      .pos = s->pos,
                      .cos_t = s->cos_t,
                      .sin_t = s->sin_t,
                      .scores = s->scores,
                      .rows = s->rows,
                      .conv_s = s->conv_s,
                      .ssm_s = s->ssm_s,
                      .ws = &s->ws,
                      .mod = mod,
                      .hooks = hk};
    float *slots[AC_T_COUNT] = {
        [AC_T_X] = x,    [AC_T_XN] = s->xn, [AC_T_Q] = s->q, [AC_T_K] = s->kt, [AC_T_V] = s->vt, [AC_T_ATT] = s->att,
        [AC_T_G] = s->g, [AC_T_U] = s->u};
    memcpy(c.slot, slots, sizeof slots);
    ac_block_cpu_kind_slots(c.slot, s->kind_slot);
    return c;
}

void ac_stream_layer(ac_stream *s, int l, float *x, int B, const ac_stream_mod *mod, const ac_engine_hooks *hk) {
    int N = B * s->n, H = s->m->a.hidden;
    if (hk && hk->begin) hk->begin(hk->ud, B, s->n);
    if (hk && hk->layer_io) memcpy(s->x0, x, (size_t)N * H * 4);
    ac_block_cpu c = executor(s, x, mod, hk);
    ac_block_cpu_forward(&c, l, B, s->n, 0);
    if (hk && hk->layer_io) hk->layer_io(hk->ud, l, s->x0, x, N, H);
}

double ac_stream_nll(ac_stream *s, const float *x, const int *tok, int B, const ac_stream_mod *mod, long *count) {
    const ac_model *m = s->m;
    int H = m->a.hidden, V = m->a.vocab, n = s->n;
    double nll = 0;
    long c = 0;
    for (int b = 0; b < B; b++) {
        ac_block_cpu_norm(s->xn, x + (size_t)b * n * H, m->final_norm, n, H, m->a.eps, mod);
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
        ac_linear_dx_w(s->dxn, s->logits, m->lm_head, s->wdt, n, H, V, 1.0f, 0, s->wtile, s->wtile_rows);
        float *db = dx + (size_t)b * n * H;
        memset(db, 0, (size_t)n * H * 4);
        ac_rmsnorm_backward(db, s->dw, NULL, s->dxn, s->xh1, s->r1, m->final_norm, NULL, n, H);
    }
    return nll;
}

/* Layer l's forward again from x_in (keeping what its backward needs),
 * then its backward: the recipe on the CPU backward executor, nothing
 * learning, the weights read in the model's dtype. */
static void layer_backward(ac_stream *s, int l, const float *x_in, float *dx, int B) {
    size_t N = (size_t)B * s->n, H = s->m->a.hidden;
    ac_block_grad c = {.m = s->m,
                       .w = &s->m->L[l],
                       .wdt = s->wdt,
                       .B = B,
                       .T = s->n,
                       .pos = s->pos,
                       .cos_t = s->cos_t,
                       .sin_t = s->sin_t,
                       .tape = s->tape,
                       .scratch = s->bscr,
                       .ws = &s->ws,
                       .wtile = s->wtile,
                       .wtile_rows = s->wtile_rows,
                       .rows = s->rows};
    if (s->wscr) { /* a hybrid's 16-bit layer, in fp32 (its experts converted as their rows reach them) */
        if (s->wl_at != l + 1) ac_block_grad_layer_f32(s->m, l, NULL, s->wscr, &s->wl);
        s->wl_at = l + 1;
        c.w = &s->wl, c.wdt = ST_F32, c.escr = s->escr, c.ewdt = s->wdt;
    }
    memcpy(s->x1, x_in, N * H * 4);
    ac_block_grad_forward(&c, l, s->x1);
    ac_block_grad_backward(&c, l, dx);
}

void ac_stream_layer_backward(ac_stream *s, int l, const float *x_in, float *dx, int B) {
    size_t rows = (size_t)s->n * s->m->a.hidden;
    for (int b = 0; b < B; b += s->B) {
        int nb = B - b < s->B ? B - b : s->B;
        layer_backward(s, l, x_in + b * rows, dx + b * rows, nb);
    }
}
