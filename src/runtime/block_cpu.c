/* block_cpu.c - see block_cpu.h. N = B*n rows; hd head_dim; widths per
 * layer as in block.h. */
#include "runtime/block_cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ssm_cpu_int.h"

void ac_block_cpu_norm(float *out, const float *x, const float *w, int N, int H, float eps, const ac_block_mod *mod) {
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

/* Mean-pool each run of f adjacent KV heads (rows of nkv*hd floats) in
 * place: what ac_prune's KV merging computes, since k and v are linear in W. */
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

/* att = causal GQA attention of q over this call's k, v (appended to the
 * cache first when there is one). */
static void attention(const ac_block_cpu *c, int l, float *att, const float *q, const float *k, const float *v, int B,
                      int n, int pos0) {
    const ac_arch *a = &c->m->a;
    const ac_layer_arch *la = &a->layers[l];
    int hd = a->head_dim, Q = la->n_heads * hd, KV = la->n_kv_heads * hd, grp = la->n_heads / la->n_kv_heads;
    size_t seq = (size_t)n; /* rows of keys per sequence in k/v */
    if (c->kc) {
        for (int b = 0; b < B; b++) {
            memcpy(c->kc[l] + ((size_t)b * c->max_ctx + pos0) * KV, k + (size_t)b * n * KV, (size_t)n * KV * 4);
            memcpy(c->vc[l] + ((size_t)b * c->max_ctx + pos0) * KV, v + (size_t)b * n * KV, (size_t)n * KV * 4);
        }
        k = c->kc[l];
        v = c->vc[l];
        seq = (size_t)c->max_ctx;
    }
    for (int b = 0; b < B; b++)
        for (int h = 0; h < la->n_heads; h++)
            ac_attention_head(att + (size_t)b * n * Q + h * hd, q + (size_t)b * n * Q + h * hd,
                              k + (size_t)b * seq * KV + (h / grp) * hd, v + (size_t)b * seq * KV + (h / grp) * hd, n,
                              pos0, hd, Q, KV, a->sliding_window, c->scores);
}

static void mask(float *t, const ac_block_cpu *c, const ac_op *op, int N, int width) {
    const ac_block_mod *mod = c->mod;
    const float *mk = !mod                    ? NULL
                      : op->dout == AC_DIM_Q ? mod->head_mask
                      : op->dout == AC_DIM_F ? mod->ffn_mask
                                             : NULL; /* (the shared expert's and latent channels: no engine mask) */
    if (!mk) return;
    int unit = ac_block_mask_unit(&c->m->a, (ac_dim)op->dout);
    for (size_t r = 0; r < (size_t)N; r++)
        for (int c = 0; c < width; c++) t[r * width + c] *= mk[c / unit];
}

int ac_block_cpu_expert(float *x, const float *in, const float *r, int N, int H, int E, int e, const void *wg,
                        const void *wu, const void *wd, int wdt, int Fe, const ac_expert_scratch *s,
                        const ac_engine_hooks *hk, int l) {
    float *xe = s->xe, *g = s->g, *u = s->u;
    int ne = 0;
    for (int i = 0; i < N; i++)
        if (r[(size_t)i * E + e] != 0) {
            memcpy(xe + (size_t)ne * H, in + (size_t)i * H, sizeof(float) * H);
            s->rows[ne++] = i;
        }
    if (!ne) return 0;
    ac_linear_w(u, xe, wu, wdt, NULL, ne, H, Fe, 0, s->ws);
    if (!wg)
        ac_relu2_fwd(g, u, (size_t)ne * Fe);
    else {
        ac_linear_w(g, xe, wg, wdt, NULL, ne, H, Fe, 0, s->ws);
        ac_silu_mul(g, u, (long)ne * Fe);
    }
    if (hk && hk->expert_act) hk->expert_act(hk->ud, l, e, g, ne, Fe);
    ac_linear_w(xe, g, wd, wdt, NULL, ne, Fe, H, 0, s->ws);
    if (hk && hk->expert_out) hk->expert_out(hk->ud, l, e, s->rows, ne, r, E, xe, H);
    for (int j = 0; j < ne; j++) {
        float w = r[(size_t)s->rows[j] * E + e], *xr = x + (size_t)s->rows[j] * H;
        const float *y = xe + (size_t)j * H;
        for (int ch = 0; ch < H; ch++) xr[ch] += w * y[ch];
    }
    return ne;
}

/* x[N][W] += the weighted experts of in[N][W] (routing weights r[N][E];
 * W the hidden width, or a LatentMoE layer's latent one; x zeroed first
 * unless acc): each expert through ac_block_cpu_expert, a hybrid
 * (nemotron_h) model's without a gate. */
static void experts(const ac_block_cpu *c, int l, float *x, const float *in, const float *r, int N, int H, int acc) {
    const ac_model *m = c->m;
    const ac_layer_arch *la = &m->a.layers[l];
    const ac_layer_w *lw = &m->L[l];
    int E = la->n_experts, Fe = la->expert_ffn, wdt = ac_model_wdt(m);
    if (!acc) memset(x, 0, sizeof(float) * (size_t)N * H);
    ac_expert_scratch s = {c->slot[AC_T_XE], c->slot[AC_T_EG], c->slot[AC_T_EU], c->rows, c->ws};
    for (int e = 0; e < E; e++)
        ac_block_cpu_expert(x, in, r, N, H, E, e, m->a.hybrid ? NULL : lw->eg[e], lw->eu[e], lw->ed[e], wdt, Fe, &s,
                            c->hooks, l);
}

void ac_block_cpu_forward_sub(const ac_block_cpu *c, int l, int sb, int B, int n, int pos0) {
    const ac_model *m = c->m;
    const ac_arch *a = &m->a;
    const ac_layer_w *lw = &m->L[l];
    const ac_subblock *sub = &ac_block_recipe_of(a, l)->sub[sb];
    const ac_block_mod *mod = c->mod;
    const ac_engine_hooks *hk = c->hooks;
    int N = B * n, hd = a->head_dim, wdt = ac_model_wdt(m);
    int dim[AC_DIM_COUNT];
    for (int d = 0; d < AC_DIM_COUNT; d++) dim[d] = ac_block_dim(a, l, (ac_dim)d);
    float *const *s = c->slot;
    if (!ac_block_sub_present(a, l, sub)) return;
    for (int i = 0; i < sub->n_ops; i++) {
        const ac_op *op = &sub->ops[i];
        switch ((ac_op_kind)op->kind) {
        case AC_OP_RMSNORM:
            ac_block_cpu_norm(s[op->out], s[op->in], ac_block_norm(lw, op->w), N, dim[AC_DIM_H], a->eps, mod);
            break;
        case AC_OP_LINEAR:
            ac_linear_w(s[op->out], s[op->in], ac_block_matrix(lw, op->w), wdt, ac_block_bias(lw, op->w), N,
                        dim[op->din], dim[op->dout], op->acc, c->ws);
            break;
        case AC_OP_ROPE: ac_rope(s[op->out], N, dim[op->heads] / hd, hd, c->pos, c->cos_t, c->sin_t); break;
        case AC_OP_HEAD_NORM:
            ac_rmsnorm(s[op->out], s[op->in], ac_block_norm(lw, op->w), N * (dim[op->heads] / hd), hd, a->eps);
            break;
        case AC_OP_ROUTE:
            ac_linear_w(s[op->out], s[op->in], lw->router, wdt, NULL, N, dim[AC_DIM_H], dim[AC_DIM_E], 0, c->ws);
            for (int x = 0; mod && mod->expert_mask && x < dim[AC_DIM_E]; x++)
                for (int i2 = 0; !mod->expert_mask[x] && i2 < N; i2++)
                    s[op->out][(size_t)i2 * dim[AC_DIM_E] + x] = -INFINITY;
            if (a->router_sigmoid)
                ac_moe_route_sigmoid(s[op->out], lw->router_bias, NULL, N, dim[AC_DIM_E], a->top_k, a->norm_topk,
                                     a->routed_scale, c->rows);
            else
                ac_moe_route(s[op->out], NULL, N, dim[AC_DIM_E], a->top_k, a->norm_topk, c->rows);
            break;
        case AC_OP_EXPERTS: experts(c, l, s[op->out], s[op->in], s[op->in2], N, dim[op->din], op->acc); break;
        case AC_OP_KV_MERGE: {
            int nkv = dim[AC_DIM_KV] / hd;
            if (mod && mod->kv_merge > 0 && mod->kv_merge < nkv) {
                merge_heads(s[op->out], N, nkv, hd, nkv / mod->kv_merge);
                merge_heads(s[op->in], N, nkv, hd, nkv / mod->kv_merge);
            }
            break;
        }
        case AC_OP_ATTENTION: attention(c, l, s[op->out], s[op->in], s[op->in2], s[op->in3], B, n, pos0); break;
        case AC_OP_SWIGLU: ac_silu_mul(s[op->out], s[op->in], (long)N * dim[AC_DIM_F]); break;
        case AC_OP_RELU2: ac_relu2_fwd(s[op->out], s[op->in], (size_t)N * dim[op->dout]); break;
        case AC_OP_SSM_CONV: {
            ac_ssm ss = ac_ssm_of(a, lw, l);
            ac_ssm_conv_fwd(&ss, s[op->out], s[op->in], B, n, c->conv_s[l], pos0 > 0);
            break;
        }
        case AC_OP_SSM_SCAN: {
            ac_ssm ss = ac_ssm_of(a, lw, l);
            ac_ssm_scan_fwd(&ss, s[op->out], s[op->in], s[op->in2], B, n, c->ssm_s[l], pos0 > 0, NULL);
            break;
        }
        case AC_OP_GATED_NORM: {
            ac_ssm ss = ac_ssm_of(a, lw, l);
            ss.head_gate = c->mod ? c->mod->ssm_mask : NULL;
            ac_ssm_gated_norm_fwd(&ss, s[op->out], s[op->in], s[op->in2], N);
            break;
        }
        case AC_OP_MASK: mask(s[op->out], c, op, N, dim[op->dout]); break;
        case AC_OP_MASK_HIDDEN:
            if (mod && mod->hid_mask) {
                float *x = s[op->out];
                int H = dim[AC_DIM_H];
                for (size_t r = 0; r < (size_t)N; r++)
                    for (int c = 0; c < H; c++) x[r * H + c] *= mod->hid_mask[c];
            }
            break;
        }
        if (!hk || op->hook == AC_HOOK_NONE) continue;
        if (op->hook == AC_HOOK_NORMED && hk->normed) hk->normed(hk->ud, l, sb, s[op->out], N, dim[AC_DIM_H]);
        if (op->hook == AC_HOOK_HEAD_OUT && hk->head_out)
            hk->head_out(hk->ud, l, s[op->out], N, dim[AC_DIM_Q] / hd, hd);
        if (op->hook == AC_HOOK_FFN_ACT && hk->ffn_act) hk->ffn_act(hk->ud, l, s[op->out], N, dim[AC_DIM_F]);
        if (op->hook == AC_HOOK_SHARED_ACT && hk->shared_act)
            hk->shared_act(hk->ud, l, s[op->out], N, dim[AC_DIM_FS]);
        if (op->hook == AC_HOOK_SSM_IN && hk->ssm_in)
            hk->ssm_in(hk->ud, l, s[op->out], N, dim[AC_DIM_SSM], dim[AC_DIM_SI]);
    }
}

void ac_block_cpu_forward(const ac_block_cpu *c, int l, int B, int n, int pos0) {
    const ac_block_recipe *r = ac_block_recipe_of(&c->m->a, l);
    for (int sb = 0; sb < r->n_sub; sb++) ac_block_cpu_forward_sub(c, l, sb, B, n, pos0);
}

size_t ac_block_cpu_kind_alloc(const ac_arch *a, size_t N, float *ks[AC_T_COUNT]) {
    size_t w[AC_T_COUNT] = {0}, in = 1;
    if (ac_arch_has_moe(a)) {
        size_t H = a->hidden, lat = a->moe_latent > 0 ? (size_t)a->moe_latent : 0;
        w[AC_T_R] = ac_block_dim_max(a, AC_DIM_E);
        w[AC_T_XE] = H > lat ? H : lat;
        w[AC_T_EG] = w[AC_T_EU] = ac_block_dim_max(a, AC_DIM_FE);
    }
    if (a->hybrid) {
        w[AC_T_ZX] = ac_block_dim_max(a, AC_DIM_SI);
        w[AC_T_XBC] = ac_block_dim_max(a, AC_DIM_SC);
        w[AC_T_Y] = w[AC_T_YN] = ac_block_dim_max(a, AC_DIM_SSM);
        if (ac_arch_has_moe(a)) w[AC_T_SU] = w[AC_T_SG] = ac_block_dim_max(a, AC_DIM_FS);
    }
    if (ac_arch_has_moe(a) && a->moe_latent) w[AC_T_XL] = w[AC_T_YL] = a->moe_latent;
    for (int t = 0; t < AC_T_COUNT; t++) {
        if (!w[t]) continue;
        if (!(ks[t] = malloc(N * w[t] * sizeof(float)))) return 0;
        if (t != AC_T_R && w[t] > in) in = w[t]; /* the routing weights are no GEMM's input */
    }
    return in;
}

void ac_block_cpu_kind_free(float *ks[AC_T_COUNT]) {
    for (int t = 0; t < AC_T_COUNT; t++) free(ks[t]), ks[t] = NULL;
}

void ac_block_cpu_kind_slots(float *slot[AC_T_COUNT], float *const ks[AC_T_COUNT]) {
    for (int t = 0; t < AC_T_COUNT; t++)
        if (ks[t]) slot[t] = ks[t];
}
