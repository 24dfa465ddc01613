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
#include "runtime/train.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/backward_cpu.h"
#include "runtime/block_grad.h"
#include "core/dtype.h"
#include "runtime/kernels_cpu.h"
#include "core/tensor.h"

int ac_trainer_lm_rows(const ac_arch *a) {
    size_t r = ac_block_grad_view_floats(a) / (a->hidden > 0 ? a->hidden : 1);
    if (r < 256) r = 256;
    return r > (size_t)a->vocab ? a->vocab : (int)r;
}

/* Floats of the conversion scratch: the largest layer, or an LM-head tile. */
static size_t scratch_floats(const ac_arch *a) {
    size_t lm = (size_t)ac_trainer_lm_rows(a) * a->hidden, ly = ac_block_grad_view_floats(a);
    return lm > ly ? lm : ly;
}

/* Carve the one allocation: with base == NULL only count. Returns floats. */
static size_t layout(ac_trainer *t, const ac_arch *a, int B, int T, float *base) {
    size_t off = 0, N = (size_t)B * T, H = a->hidden, hd = a->head_dim, V = a->vocab;
    /* TAKE only evaluates ptr when assigning, so base == NULL (t == NULL) counts. */
#define TAKE(ptr, n)                                                                                                   \
    do {                                                                                                               \
        if (base) (ptr) = base + off;                                                                                  \
        off += (n);                                                                                                    \
    } while (0)
    for (int l = 0; l < a->n_layers; l++) {
        const ac_layer_arch *L = &a->layers[l];
        TAKE(t->tape[l], ac_block_tape_floats(a, l, N, 0));
        if (L->n_heads) {
            TAKE(t->gate.head[l], L->n_heads);
            TAKE(t->dgate.head[l], L->n_heads);
        }
        if (L->ffn) {
            TAKE(t->gate.ffn[l], L->ffn);
            TAKE(t->dgate.ffn[l], L->ffn);
        }
        if (L->n_experts) {
            size_t ne = L->n_experts, nc = ne * L->expert_ffn;
            TAKE(t->gate.expert[l], ne);
            TAKE(t->dgate.expert[l], ne);
            TAKE(t->gate.echan[l], nc);
            TAKE(t->dgate.echan[l], nc);
        }
        if (L->ssm_heads) {
            TAKE(t->gate.ssm[l], L->ssm_heads);
            TAKE(t->dgate.ssm[l], L->ssm_heads);
            TAKE(t->gate.ssm_dim[l], a->ssm_head_dim);
            TAKE(t->dgate.ssm_dim[l], a->ssm_head_dim);
        }
        if (a->hybrid && L->n_experts && a->shared_ffn) {
            TAKE(t->gate.shared[l], a->shared_ffn);
            TAKE(t->dgate.shared[l], a->shared_ffn);
        }
        if (a->hybrid && L->n_experts && a->moe_latent) {
            TAKE(t->gate.latent[l], a->moe_latent);
            TAKE(t->dgate.latent[l], a->moe_latent);
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
    TAKE(t->bscr, ac_block_grad_scratch_floats(a, B, T));
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
    return (layout(NULL, a, B, T, NULL) + scratch_floats(a) + ac_block_grad_expert_floats(a)) * sizeof(float) +
           (size_t)B * T * 2 * sizeof(int);
}

void ac_trainer_free(ac_trainer *t) {
    float ***ptrs[] = {&t->tape,        &t->gate.head,  &t->gate.ffn,     &t->dgate.head, &t->dgate.ffn,
                       &t->gate.expert, &t->gate.echan, &t->dgate.expert, &t->dgate.echan, &t->gate.ssm,
                       &t->dgate.ssm,   &t->gate.ssm_dim, &t->dgate.ssm_dim, &t->gate.shared, &t->dgate.shared,
                       &t->gate.latent, &t->dgate.latent};
    for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++) free(*ptrs[i]);
    free(t->mem);
    free(t->tok);
    free(t->pos);
    free(t->moe_rows);
    free(t->wscr);
    free(t->escr);
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
    /* the executor reads fp32: the model's own, or layer_view's conversions of a 16-bit one */
    if (ac_block_grad_supports(a, ST_F32, e)) return ac_errctx(e, "trainer");
    if (!frozen && ac_model_wdt(m) != ST_F32) /* the optimizer updates m in place: fp32 master weights */
        return ac_errf(e, "trainer: trained weights must be fp32 (a resident model needs ac_model_to_f32 first)");
    t->m = m;
    t->frozen = frozen;
    t->wl_at = -1;
    t->lm_rows = ac_trainer_lm_rows(a);
    t->max_B = max_B;
    t->max_T = max_T;
    int nl = a->n_layers;
    float ***ptrs[] = {&t->tape,        &t->gate.head,  &t->gate.ffn,     &t->dgate.head, &t->dgate.ffn,
                       &t->gate.expert, &t->gate.echan, &t->dgate.expert, &t->dgate.echan, &t->gate.ssm,
                       &t->dgate.ssm,   &t->gate.ssm_dim, &t->dgate.ssm_dim, &t->gate.shared, &t->dgate.shared,
                       &t->gate.latent, &t->dgate.latent};
    int ok = 1;
    for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++)
        ok = ok && (*ptrs[i] = calloc(nl ? nl : 1, sizeof(float *)));
    size_t nf = layout(NULL, a, max_B, max_T, NULL), N = (size_t)max_B * max_T;
    ok = ok && (t->mem = malloc(nf * sizeof(float))) && (t->tok = malloc(N * sizeof(int))) &&
         (t->pos = malloc(N * sizeof(int)));
    size_t nr = (size_t)ac_block_dim_max(a, AC_DIM_E) > N ? (size_t)ac_block_dim_max(a, AC_DIM_E) : N;
    ok = ok && (!ac_arch_has_moe(a) || (t->moe_rows = malloc(nr * sizeof(int))));
    if (ok && ac_model_wdt(m) != ST_F32) ok = (t->wscr = malloc(scratch_floats(a) * sizeof(float))) != NULL;
    if (ok && ac_model_wdt(m) != ST_F32 && ac_arch_has_moe(a)) /* one expert's matrices in fp32 */
        ok = (t->escr = malloc(ac_block_grad_expert_floats(a) * sizeof(float))) != NULL;
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
        for (int x = 0; x < a->layers[l].n_experts; x++) t->gate.expert[l][x] = 1;
        for (int c = 0; c < a->layers[l].n_experts * a->layers[l].expert_ffn; c++) t->gate.echan[l][c] = 1;
        for (int h = 0; h < a->layers[l].ssm_heads; h++) t->gate.ssm[l][h] = 1;
        for (int p = 0; t->gate.ssm_dim[l] && p < a->ssm_head_dim; p++) t->gate.ssm_dim[l][p] = 1;
        for (int c = 0; t->gate.shared[l] && c < a->shared_ffn; c++) t->gate.shared[l][c] = 1;
        for (int c = 0; t->gate.latent[l] && c < a->moe_latent; c++) t->gate.latent[l][c] = 1;
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
 * t->ovr's where set, else each matrix converted into t->wscr (exact,
 * ac_block_grad_layer_f32); the routed experts stay the model's (the
 * executor converts them one at a time into t->escr: layer_exec). Kept in
 * t->wl until the scratch is reused (wl_at). */
static const ac_layer_w *layer_view(ac_trainer *t, int l) {
    const ac_layer_w *ov = t->ovr ? &t->ovr[l] : NULL;
    if (ac_model_wdt(t->m) == ST_F32 && !ov) return &t->m->L[l];
    if (t->wl_at == l) return &t->wl;
    ac_block_grad_layer_f32(t->m, l, ov, t->wscr, &t->wl);
    t->wl_at = l;
    return &t->wl;
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
        zero(w->q_norm, w->q_norm ? hd : 0);
        zero(w->k_norm, w->k_norm ? hd : 0);
        if (L->n_experts) {
            size_t E = L->n_experts, Fe = L->expert_ffn;
            zero(w->post_norm, H);
            zero(w->router, E * H);
            size_t Hin = a->hybrid && a->moe_latent ? (size_t)a->moe_latent : H, Fs = a->hybrid ? (size_t)a->shared_ffn : 0;
            for (size_t x = 0; x < E; x++) /* (a frozen trainer's arrays are NULL: no expert gradient) */
                zero(w->eg ? w->eg[x] : NULL, Fe * H), zero(w->eu ? w->eu[x] : NULL, Fe * Hin),
                    zero(w->ed ? w->ed[x] : NULL, Hin * Fe);
            zero(w->sh_u, Fs * H), zero(w->sh_d, H * Fs); /* nemotron_h: the shared expert, LatentMoE's projections */
            zero(w->lat_down, w->lat_down ? Hin * H : 0), zero(w->lat_up, w->lat_up ? H * Hin : 0);
        }
        if (L->ssm_heads) { /* Mamba-2: its norm, in_proj, conv, per-head vectors, gated norm, out_proj */
            size_t di = ac_ssm_inner(a, l), C = ac_ssm_conv_dim(a, l), nh = L->ssm_heads;
            zero(w->in_norm, H);
            zero(w->ssm_in, (size_t)ac_ssm_in_dim(a, l) * H);
            zero(w->ssm_out, H * di);
            zero(w->conv_w, C * a->ssm_conv);
            zero(w->conv_b, w->conv_b ? C : 0);
            zero(w->dt_bias, nh), zero(w->a_log, nh), zero(w->ssm_d, nh), zero(w->ssm_norm, di);
        }
        zero(t->dgate.head[l], L->n_heads);
        zero(t->dgate.ffn[l], F);
        zero(t->dgate.expert[l], L->n_experts);
        zero(t->dgate.echan[l], (size_t)L->n_experts * L->expert_ffn);
        zero(t->dgate.ssm[l], L->ssm_heads);
        zero(t->dgate.ssm_dim[l], t->dgate.ssm_dim[l] ? (size_t)a->ssm_head_dim : 0);
        zero(t->dgate.shared[l], t->dgate.shared[l] ? (size_t)a->shared_ffn : 0);
        zero(t->dgate.latent[l], t->dgate.latent[l] ? (size_t)a->moe_latent : 0);
        t->dgate.attn[l] = t->dgate.mlp[l] = 0;
    }
}

/* xn[N,H] = xhat * w * gh (the final norm's output again, for the head's backward). */
static void renorm(float *xn, const float *xhat, const float *w, const float *gh, int N, int H) {
    for (int r = 0; r < N; r++)
        for (int c = 0; c < H; c++) xn[(size_t)r * H + c] = xhat[(size_t)r * H + c] * w[c] * gh[c];
}

/* Layer l's recipe on the CPU backward executor over t's tape and gates;
 * sub[AC_BLOCK_MAX_SUB] receives the sub-block gates it points at (the
 * trainer has gates for two: attention, FFN (on nemotron_h also its Mamba
 * and MoE mixers); others are 1). */
static ac_block_grad layer_exec(ac_trainer *t, int l, const ac_layer_w *w, float *sub, float *dsub) {
    ac_block_grad c = {.m = t->m,
                       .w = w,
                       .wdt = ST_F32,
                       .gw = &t->g.L[l],
                       .B = t->B,
                       .T = t->T,
                       .pos = t->pos,
                       .cos_t = t->cos_t,
                       .sin_t = t->sin_t,
                       .tape = t->tape[l],
                       .scratch = t->bscr,
                       .rows = t->moe_rows,
                       .sub_gate = sub,
                       .dsub_gate = dsub,
                       .escr = t->escr, /* 16-bit experts, converted one at a time */
                       .ewdt = ac_model_wdt(t->m)};
    c.gate[AC_DIM_Q] = t->gate.head[l];
    c.gate[AC_DIM_F] = t->gate.ffn[l];
    c.gate[AC_DIM_H] = t->gate.hidden;
    c.dgate[AC_DIM_Q] = t->dgate.head[l];
    c.dgate[AC_DIM_F] = t->dgate.ffn[l];
    c.dgate[AC_DIM_H] = t->dgate.hidden;
    c.gate[AC_DIM_E] = t->gate.expert[l];
    c.gate[AC_DIM_FE] = t->gate.echan[l];
    c.dgate[AC_DIM_E] = t->dgate.expert[l];
    c.dgate[AC_DIM_FE] = t->dgate.echan[l];
    c.gate[AC_DIM_SSM] = t->gate.ssm[l];
    c.dgate[AC_DIM_SSM] = t->dgate.ssm[l];
    c.gate[AC_DIM_FS] = t->gate.shared[l];
    c.dgate[AC_DIM_FS] = t->dgate.shared[l];
    c.gate[AC_DIM_LT] = t->gate.latent[l];
    c.dgate[AC_DIM_LT] = t->dgate.latent[l];
    c.ssm_dim_gate = t->gate.ssm_dim[l];
    c.dssm_dim_gate = t->dgate.ssm_dim[l];
    for (int i = 0; i < AC_BLOCK_MAX_SUB; i++) /* nemotron_h: its Mamba (2) and MoE (3) mixers on the mlp gate */
        sub[i] = i == 0 ? t->gate.attn[l] : i == 1 || (t->m->a.hybrid && i <= 3) ? t->gate.mlp[l] : 1.0f;
    return c;
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
        if (!a->layers[l].n_heads && !a->layers[l].ffn && !a->layers[l].n_experts && !a->layers[l].ssm_heads) continue;
        float sub[AC_BLOCK_MAX_SUB];
        ac_block_grad c = layer_exec(t, l, layer_view(t, l), sub, NULL);
        ac_block_grad_forward(&c, l, t->x);
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
        if (!a->layers[l].n_heads && !a->layers[l].ffn && !a->layers[l].n_experts && !a->layers[l].ssm_heads) continue;
        float sub[AC_BLOCK_MAX_SUB], dsub[AC_BLOCK_MAX_SUB] = {0};
        ac_block_grad c = layer_exec(t, l, layer_view(t, l), sub, dsub);
        ac_block_grad_backward(&c, l, t->dx);
        t->dgate.attn[l] += dsub[0];
        t->dgate.mlp[l] += dsub[1] + (t->m->a.hybrid ? dsub[2] + dsub[3] : 0.0f);
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
