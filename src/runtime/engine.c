/*
 * engine.c - see engine.h. Layout follows llm.c: one forward over flat
 * buffers, shapes in comments. N = B*n rows; H hidden. Each layer is its
 * block recipe run by the CPU executor (block_cpu.h).
 */
#include "runtime/engine.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/block_cpu.h"
#include "core/dtype.h"
#include "runtime/kernels_cpu.h"
#include "runtime/rope.h"

void ac_engine_free(ac_engine *en) {
    float *bufs[] = {en->x,  en->x0, en->xn,     en->q,      en->att,   en->g,    en->u,
                     en->kt, en->vt, en->scores, en->logits, en->cos_t, en->sin_t};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    ac_block_cpu_kind_free(en->kind_slot);
    free(en->rows);
    if (en->kc)
        for (int l = 0; l < en->m->a.n_layers; l++) {
            free(en->kc[l]);
            free(en->vc[l]);
        }
    free(en->kc);
    free(en->vc);
    for (int l = 0; en->conv_s && l < en->m->a.n_layers; l++) {
        free(en->conv_s[l]);
        free(en->ssm_s[l]);
    }
    free(en->conv_s);
    free(en->ssm_s);
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
    size_t maxq = ac_block_dim_max(a, AC_DIM_Q), maxf = ac_block_dim_max(a, AC_DIM_F),
           maxkv = ac_block_dim_max(a, AC_DIM_KV);
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
    int moe_ok = 1;
    if (ac_arch_has_moe(a)) { /* the routing order */
        size_t E = ac_block_dim_max(a, AC_DIM_E);
        moe_ok = (en->rows = malloc((N > E ? N : E) * sizeof(int))) != NULL;
    }
    size_t hin = ac_block_cpu_kind_alloc(a, N, en->kind_slot); /* MoE, Mamba-2, shared-expert, latent slots */
    moe_ok = moe_ok && hin;
    if (hin > maxin) maxin = hin;
    if (a->hybrid) { /* each Mamba layer's decode state */
        en->conv_s = calloc(a->n_layers, sizeof *en->conv_s);
        en->ssm_s = calloc(a->n_layers, sizeof *en->ssm_s);
        moe_ok = moe_ok && en->conv_s && en->ssm_s;
        for (int l = 0; moe_ok && l < a->n_layers; l++) {
            size_t nh = a->layers[l].ssm_heads, K = a->ssm_conv > 1 ? a->ssm_conv - 1 : 1;
            if (!nh) continue;
            en->conv_s[l] = malloc((size_t)max_batch * K * ac_block_dim(a, l, AC_DIM_SC) * 4);
            en->ssm_s[l] = malloc((size_t)max_batch * nh * a->ssm_head_dim * a->ssm_state * 4);
            moe_ok = en->conv_s[l] && en->ssm_s[l];
        }
    }
    int ok = moe_ok && (ac_model_wdt(m) == ST_F32 || ac_wscratch_alloc(&en->ws, (int)N, (int)maxin) == 0);
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

int ac_engine_forward(ac_engine *en, const int *tokens, int B, int n, int pos0, int last_only, ac_err *e) {
    const ac_model *m = en->m;
    const ac_arch *a = &m->a;
    if (B <= 0 || n <= 0 || B > en->max_batch || pos0 < 0 || pos0 + n > en->max_ctx)
        return ac_errf(e, "engine: batch %d, tokens %d at position %d exceed the engine's %d x %d", B, n, pos0,
                       en->max_batch, en->max_ctx);
    int H = a->hidden, N = B * n, wdt = ac_model_wdt(m);
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
    ac_block_cpu bc = {.m = m,
                       .pos = en->pos,
                       .cos_t = en->cos_t,
                       .sin_t = en->sin_t,
                       .kc = en->kc,
                       .vc = en->vc,
                       .conv_s = en->conv_s,
                       .ssm_s = en->ssm_s,
                       .max_ctx = en->max_ctx,
                       .scores = en->scores,
                       .rows = en->rows,
                       .ws = ws,
                       .hooks = hk};
    float *slots[AC_T_COUNT] = {[AC_T_X] = en->x,  [AC_T_XN] = en->xn,   [AC_T_Q] = en->q,   [AC_T_K] = en->kt,
                                [AC_T_V] = en->vt, [AC_T_ATT] = en->att, [AC_T_G] = en->g,   [AC_T_U] = en->u};
    memcpy(bc.slot, slots, sizeof slots);
    ac_block_cpu_kind_slots(bc.slot, en->kind_slot);
    for (int l = 0; l < a->n_layers; l++) {
        if (hk && hk->layer_io) memcpy(en->x0, en->x, (size_t)N * H * 4);
        ac_block_cpu_forward(&bc, l, B, n, pos0);
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
