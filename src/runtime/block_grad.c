/* block_grad.c - see block_grad.h. N = B*T rows; hd head_dim; widths of
 * layer l by ac_dim (block.h). */
#include "runtime/block_grad.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "runtime/backward_cpu.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "ssm_cpu_int.h"

int ac_block_grad_supports(const ac_arch *a, int wdt, ac_err *e) {
    /* (softmax-routed MoE layers: every router and expert GEMM goes through ac_linear_w / ac_linear_dx_w) */
    if (a->hybrid && wdt != ST_F32)
        return ac_errf(e, "hybrid (nemotron_h) layers run backward on fp32 weights only (not in place on 16-bit ones; "
                          "the frozen trainer converts them layer by layer)");
    return 0;
}

/* Floats of layer l's matrices that ac_block_grad_layer_f32 converts:
 * attention, MLP, a Mamba layer's in and out projections, an MoE layer's
 * router (and on nemotron_h its shared expert and latent projections); not
 * the routed experts (one at a time: ac_block_grad_expert_floats). */
static size_t view_floats(const ac_arch *a, int l) {
    const ac_layer_arch *L = &a->layers[l];
    size_t H = a->hidden, Q = (size_t)L->n_heads * a->head_dim, KV = (size_t)L->n_kv_heads * a->head_dim;
    size_t n = 2 * Q * H + 2 * KV * H + 3 * (size_t)L->ffn * H + (size_t)L->n_experts * H;
    if (a->hybrid) n += ((size_t)ac_ssm_in_dim(a, l) + ac_ssm_inner(a, l)) * H;
    if (a->hybrid && L->n_experts) n += 2 * H * ((size_t)a->shared_ffn + a->moe_latent);
    return n;
}

size_t ac_block_grad_view_floats(const ac_arch *a) {
    size_t mx = 0;
    for (int l = 0; l < a->n_layers; l++)
        if (view_floats(a, l) > mx) mx = view_floats(a, l);
    return mx;
}

void ac_block_grad_layer_f32(const ac_model *m, int l, const ac_layer_w *ov, float *scr, ac_layer_w *w) {
    const ac_layer_w *src = &m->L[l];
    int wdt = ac_model_wdt(m);
    *w = *src;
    /* in ac_wmat order: AC_W_Q .. AC_W_D (the ones overrides may replace), then the hybrid's */
    float **d[] = {&w->wq,     &w->wk,      &w->wv,   &w->wo,   &w->wg,       &w->wu,    &w->wd,
                   &w->ssm_in, &w->ssm_out, &w->sh_u, &w->sh_d, &w->lat_down, &w->lat_up};
    float *o[sizeof d / sizeof *d] = {0};
    if (ov) {
        float *oo[7] = {ov->wq, ov->wk, ov->wv, ov->wo, ov->wg, ov->wu, ov->wd};
        memcpy(o, oo, sizeof oo);
        w->bq = ov->bq ? ov->bq : w->bq;
        w->bk = ov->bk ? ov->bk : w->bk;
        w->bv = ov->bv ? ov->bv : w->bv;
    }
    size_t off = 0;
    for (int i = 0; i < (int)(sizeof d / sizeof *d); i++) {
        size_t n = 0;
        ac_layer_matrix(m, l, (ac_wmat)i, &n);
        if (o[i])
            *d[i] = o[i];
        else if (*d[i] && n && wdt != ST_F32) {
            ac_to_f32(scr + off, *d[i], (st_dtype)wdt, n, NULL);
            *d[i] = scr + off;
            off += n;
        }
    }
    int E = m->a.layers[l].n_experts;
    if (E && wdt != ST_F32) { /* the router, after the other matrices */
        ac_to_f32(scr + off, src->router, (st_dtype)wdt, (size_t)E * m->a.hidden, NULL);
        w->router = scr + off;
    }
}

/* The scan's work area: the end of the scratch (block.h). */
static float *ssm_work(const ac_block_grad *c) {
    size_t N = (size_t)c->B * c->T;
    return c->scratch + ac_block_grad_scratch_floats(&c->m->a, c->B, c->T) - ac_block_ssm_work_floats(&c->m->a, N);
}

/* The EXPERTS op's work area: before the scan's (block.h). */
static float *moe_work(const ac_block_grad *c) {
    return ssm_work(c) - ac_block_moe_work_floats(&c->m->a, (size_t)c->B * c->T);
}

size_t ac_block_grad_expert_floats(const ac_arch *a) {
    size_t mx = 0, Hin = a->hybrid && a->moe_latent ? (size_t)a->moe_latent : (size_t)a->hidden;
    for (int l = 0; l < a->n_layers; l++) {
        size_t n = (a->hybrid ? 2 : 3) * (size_t)a->layers[l].expert_ffn * Hin * (a->layers[l].n_experts > 0);
        if (n > mx) mx = n;
    }
    return mx;
}

/* Expert e's matrices as its GEMMs read them: mw[3] its gate (NULL without one), up and down matrices, in the
 * returned dtype: the layer's own in c->wdt, or with c->escr each one converted from c->ewdt into it. */
static int expert_mats(const ac_block_grad *c, int e, size_t n, const void *mw[3]) {
    const void *s[3] = {c->w->eg ? c->w->eg[e] : NULL, c->w->eu[e], c->w->ed[e]};
    if (!c->escr) {
        memcpy(mw, s, sizeof s);
        return c->wdt;
    }
    float *d = c->escr;
    for (int i = 0; i < 3; i++) {
        mw[i] = NULL;
        if (!s[i]) continue;
        ac_to_f32(d, s[i], (st_dtype)c->ewdt, n, NULL);
        mw[i] = d, d += n;
    }
    return ST_F32;
}

/* Expert e of layer l on the rows of xn ([N][H], H the experts' input
 * width) routed to it (r[N][E] != 0): gathers them into xe (c->rows gets
 * their indices), computes g, u ([ne][Fe] gate and up projections), h =
 * silu(g) * u, or relu(u)^2 without a gate (nemotron_h), and y = h Wd^T
 * ([ne][H]). Returns ne; mw[3] and *dt get the matrices it read (expert_mats;
 * unset when ne is 0). */
static int expert_fwd(const ac_block_grad *c, int l, int e, const float *xn, const float *r, int H, float *xe,
                      float *g, float *u, float *h, float *y, const void *mw[3], int *dt) {
    const ac_layer_arch *la = &c->m->a.layers[l];
    int E = la->n_experts, Fe = la->expert_ffn, N = c->B * c->T, ne = 0;
    for (int i = 0; i < N; i++)
        if (r[(size_t)i * E + e] != 0) {
            memcpy(xe + (size_t)ne * H, xn + (size_t)i * H, sizeof(float) * H);
            c->rows[ne++] = i;
        }
    if (!ne) return 0;
    *dt = expert_mats(c, e, (size_t)Fe * H, mw);
    ac_linear_w(u, xe, mw[1], *dt, NULL, ne, H, Fe, 0, c->ws);
    if (mw[0]) {
        ac_linear_w(g, xe, mw[0], *dt, NULL, ne, H, Fe, 0, c->ws);
        memcpy(h, g, sizeof(float) * ne * Fe);
        ac_silu_mul(h, u, (long)ne * Fe);
    } else
        ac_relu2_fwd(h, u, (size_t)ne * Fe);
    const float *gc = c->gate[AC_DIM_FE] ? c->gate[AC_DIM_FE] + (size_t)e * Fe : NULL; /* the channel gates */
    for (size_t j = 0; gc && j < (size_t)ne; j++)
        for (int ch = 0; ch < Fe; ch++) h[j * Fe + ch] *= gc[ch];
    ac_linear_w(y, h, mw[2], *dt, NULL, ne, Fe, H, 0, c->ws);
    return ne;
}

/* x[N][H] += alpha * the routed experts of xn (forward; H the experts'
 * width). */
static void experts_fwd(const ac_block_grad *c, int l, float *x, const float *xn, const float *r, int H, float alpha) {
    const ac_layer_arch *la = &c->m->a.layers[l];
    int E = la->n_experts;
    size_t N = (size_t)c->B * c->T, Fe = (size_t)ac_block_dim_max(&c->m->a, AC_DIM_FE), Hm = (size_t)c->m->a.hidden;
    float *xe = moe_work(c), *y = xe + N * Hm, *g = y + 2 * N * Hm, *u = g + N * Fe, *h = u + N * Fe;
    for (int e = 0; e < E; e++) {
        const void *mw[3];
        int dt, ne = expert_fwd(c, l, e, xn, r, H, xe, g, u, h, y, mw, &dt);
        for (int j = 0; j < ne; j++) {
            float w = alpha * r[(size_t)c->rows[j] * E + e], *xr = x + (size_t)c->rows[j] * H;
            for (int ch = 0; ch < H; ch++) xr[ch] += w * y[(size_t)j * H + ch];
        }
    }
}

/* Expert e's channel gates (gate[AC_DIM_FE] at e*Fe: h = act * gate
 * before the down projection) in the backward: d gate += sum over its ne
 * rows of dh * act (act recomputed from the projections g, u: silu(g) u,
 * or relu(u)^2 without a gate, glu 0), then dh becomes the gradient at act. */
static void channel_gates_bwd(ac_block_grad *c, int e, int ne, int Fe, int glu, const float *g, const float *u,
                              float *dh) {
    const float *gc = c->gate[AC_DIM_FE] ? c->gate[AC_DIM_FE] + (size_t)e * Fe : NULL;
    float *dgc = c->dgate[AC_DIM_FE] ? c->dgate[AC_DIM_FE] + (size_t)e * Fe : NULL;
    for (size_t j = 0; (gc || dgc) && j < (size_t)ne; j++)
        for (int ch = 0; ch < Fe; ch++) {
            size_t o = j * Fe + ch;
            if (dgc) {
                float act = glu ? g[o] / (1.0f + expf(-g[o])) * u[o] : (u[o] > 0 ? u[o] * u[o] : 0.0f);
                dgc[ch] += dh[o] * act;
            }
            if (gc) dh[o] *= gc[ch];
        }
}

/* The backward of x += alpha * sum_e r[:,e] * expert_e(xn) (H the
 * experts' width; alpha the sub-block's gate when it is a residual add,
 * gated, else 1): dxn (written, or added when acc_dxn), dr (written: alpha
 * * <dx, y_e> where routed), the experts' weight gradients and d alpha
 * (added, gated only). */
static void experts_bwd(ac_block_grad *c, int l, int s, const float *dx, const float *xn, const float *r, float *dxn,
                        float *dr, int H, int gated, int acc_dxn) {
    const ac_layer_arch *la = &c->m->a.layers[l];
    int E = la->n_experts, Fe = la->expert_ffn;
    size_t N = (size_t)c->B * c->T, FeM = (size_t)ac_block_dim_max(&c->m->a, AC_DIM_FE), Hm = (size_t)c->m->a.hidden;
    float alpha = gated && c->sub_gate ? c->sub_gate[s] : 1.0f;
    float *xe = moe_work(c), *y = xe + N * Hm, *dxe = y + N * Hm, *g = dxe + N * Hm, *u = g + N * FeM,
          *h = u + N * FeM, *dh = h + N * FeM, *du = dh + N * FeM;
    double dalpha = 0;
    if (!acc_dxn) memset(dxn, 0, sizeof(float) * N * H);
    memset(dr, 0, sizeof(float) * N * E);
    for (int e = 0; e < E; e++) {
        const void *mw[3];
        int dt, ne = expert_fwd(c, l, e, xn, r, H, xe, g, u, h, y, mw, &dt);
        if (!ne) continue;
        for (int j = 0; j < ne; j++) { /* y becomes dy = alpha r dx on the expert's rows */
            size_t row = (size_t)c->rows[j];
            const float *d = dx + row * H;
            float *yj = y + (size_t)j * H, rw = r[row * E + e];
            double dot = 0;
            for (int ch = 0; ch < H; ch++) dot += (double)d[ch] * yj[ch];
            dr[row * E + e] = (float)(alpha * dot);
            dalpha += rw * dot;
            for (int ch = 0; ch < H; ch++) yj[ch] = alpha * rw * d[ch];
        }
        ac_linear_dx_w(dh, y, mw[2], dt, ne, Fe, H, 1.0f, 0, c->wtile, c->wtile_rows); /* dh = dy Wd */
        if (c->gw && c->gw->ed) /* dWd[H][Fe] += dy^T h */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, H, Fe, ne, 1.0f, y, H, h, Fe, 1.0f, c->gw->ed[e], Fe);
        channel_gates_bwd(c, e, ne, Fe, mw[0] != NULL, g, u, dh);
        if (!mw[0]) { /* relu(u)^2 (nemotron_h): du = dh * 2 relu(u) */
            ac_relu2_bwd(du, dh, u, (size_t)ne * Fe);
            ac_linear_dx_w(dxe, du, mw[1], dt, ne, H, Fe, 1.0f, 0, c->wtile, c->wtile_rows);
        } else {
            ac_silu_mul_backward(dh, du, dh, g, u, (long)ne * Fe); /* dh becomes dg */
            ac_linear_dx_w(dxe, dh, mw[0], dt, ne, H, Fe, 1.0f, 0, c->wtile, c->wtile_rows);
            ac_linear_dx_w(dxe, du, mw[1], dt, ne, H, Fe, 1.0f, 1, c->wtile, c->wtile_rows);
        }
        if (c->gw && c->gw->eg && c->gw->eg[e]) /* dWg [Fe][H] += dg^T xe */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Fe, H, ne, 1.0f, dh, Fe, xe, H, 1.0f, c->gw->eg[e], H);
        if (c->gw && c->gw->eu) /* dWu [Fe][H] += du^T xe */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Fe, H, ne, 1.0f, du, Fe, xe, H, 1.0f, c->gw->eu[e], H);
        for (int j = 0; j < ne; j++) {
            float *o = dxn + (size_t)c->rows[j] * H;
            const float *d = dxe + (size_t)j * H;
            for (int ch = 0; ch < H; ch++) o[ch] += d[ch];
        }
    }
    if (gated && c->dsub_gate) c->dsub_gate[s] += (float)dalpha;
}

/* The backward of r = route(xn Wr^T) from dr (overwritten with the
 * logits' gradient): dxn and the router's gradient added. p: the softmax
 * over all experts; r: the routing weights (0 where not routed). */
static void route_bwd(ac_block_grad *c, int l, const float *p, const float *r, float *dr, const float *xn, float *dxn) {
    const ac_arch *a = &c->m->a;
    int H = a->hidden, E = a->layers[l].n_experts, N = c->B * c->T;
    /* expert gates z: the sigmoid router weighs a chosen expert by q = z s (ac_moe_route_sigmoid), the softmax
     * router's probabilities are q = z p (ac_moe_route_gated) */
    const float *z = c->gate[AC_DIM_E];
    float *dz = c->dgate[AC_DIM_E];
    if (a->router_sigmoid) /* p: the sigmoid s */
        ac_moe_route_sigmoid_bwd(dr, p, r, z, dz, N, E, a->norm_topk, a->routed_scale);
    else /* softmax: d z += p (dq - pd) */
        ac_moe_route_gated_bwd(dr, p, r, z, dz, N, E, a->norm_topk);
    ac_linear_dx_w(dxn, dr, c->w->router, c->wdt, N, H, E, 1.0f, 1, c->wtile, c->wtile_rows);
    if (c->gw && c->gw->router) /* dWr[E][H] += dlogits^T xn */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, E, H, N, 1.0f, dr, E, xn, H, 1.0f, c->gw->router, H);
}

size_t ac_block_grad_scratch_floats(const ac_arch *a, int B, int T) {
    return 2 * (size_t)T * T + ac_block_scratch_floats(a, (size_t)B * T);
}

/* One sub-block's walk: the buffer each op read (in, in2, in3) and the
 * value its output slot held before it (SwiGLU's gate projection). */
typedef struct {
    const float *in[AC_BLOCK_MAX_OPS], *in2[AC_BLOCK_MAX_OPS], *in3[AC_BLOCK_MAX_OPS], *pre[AC_BLOCK_MAX_OPS];
    const float *xhat[AC_BLOCK_MAX_OPS], *r[AC_BLOCK_MAX_OPS];
} walk;

static void attention_fwd(const ac_block_grad *c, int l, float *out, const float *q, const float *k, const float *v,
                          float *scr) {
    const ac_arch *a = &c->m->a;
    const ac_layer_arch *la = &a->layers[l];
    int hd = a->head_dim, T = c->T, Q = la->n_heads * hd, KV = la->n_kv_heads * hd, grp = la->n_heads / la->n_kv_heads;
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < la->n_heads; h++) {
            size_t qo = (size_t)b * T * Q + h * hd, ko = (size_t)b * T * KV + (h / grp) * hd;
            ac_attention_head(out + qo, q + qo, k + ko, v + ko, T, 0, hd, Q, KV, a->sliding_window, scr);
        }
}

static void mask_fwd(float *out, const float *in, const float *g, size_t N, int width, int unit) {
    if (!g) {
        memcpy(out, in, N * width * sizeof(float));
        return;
    }
    for (size_t r = 0; r < N; r++)
        for (int c = 0; c < width; c++) out[r * width + c] = in[r * width + c] * g[c / unit];
}

/* Run sub-block sb of layer l over x. With fwd, compute and fill the tape;
 * without, restore from the tape (recompute only the cheap outputs) and
 * record what the backward reads in *w. Returns the scratch end. */
static float *sub_walk(ac_block_grad *c, int l, int sb, float *x, float **tp, float *sc, int fwd, walk *w) {
    const ac_arch *a = &c->m->a;
    const ac_subblock *sub = &ac_block_recipe_of(a, l)->sub[sb];
    int N = c->B * c->T, hd = a->head_dim, dim[AC_DIM_COUNT];
    for (int d = 0; d < AC_DIM_COUNT; d++) dim[d] = ac_block_dim(a, l, (ac_dim)d);
    float *cur[AC_T_COUNT] = {0};
    cur[AC_T_X] = x;
    float *attscr = c->scratch; /* the first 2*T*T floats */
    for (int i = 0; i < sub->n_ops; i++) {
        const ac_op *op = &sub->ops[i];
        int dout = dim[op->dout];
        w->in[i] = cur[op->in];
        w->in2[i] = cur[op->in2];
        w->in3[i] = cur[op->in3];
        w->pre[i] = cur[op->out];
        switch ((ac_op_kind)op->kind) {
        case AC_OP_RMSNORM: {
            float *xh = *tp, *r = *tp + (size_t)N * dim[AC_DIM_H];
            *tp += (size_t)N * (dim[AC_DIM_H] + 1);
            const float *nw = ac_block_norm(c->w, op->w), *gh = c->gate[AC_DIM_H];
            if (fwd)
                ac_rmsnorm_fwd(sc, xh, r, cur[op->in], nw, gh, N, dim[AC_DIM_H], a->eps);
            else /* xn = xhat * w * gh */
                for (size_t r = 0, H = dim[AC_DIM_H]; r < (size_t)N; r++)
                    for (size_t ch = 0; ch < H; ch++) sc[r * H + ch] = xh[r * H + ch] * nw[ch] * (gh ? gh[ch] : 1.0f);
            w->xhat[i] = xh;
            w->r[i] = r;
            cur[op->out] = sc;
            sc += (size_t)N * dim[AC_DIM_H];
            break;
        }
        case AC_OP_LINEAR:
            if (op->acc) {
                float alpha = c->sub_gate ? c->sub_gate[sb] : 1.0f;
                if (fwd && c->wdt == ST_F32) /* x[N,H] += alpha * in[N,din] W[H,din]^T */
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, dout, dim[op->din], alpha, cur[op->in],
                                dim[op->din], (const float *)ac_block_matrix(c->w, op->w), dim[op->din], 1.0f,
                                cur[op->out], dout);
                else if (fwd)
                    ac_linear_w(cur[op->out], cur[op->in], ac_block_matrix(c->w, op->w), c->wdt, NULL, N, dim[op->din],
                                dout, 1, c->ws);
                break;
            }
            if (fwd)
                ac_linear_w(*tp, cur[op->in], ac_block_matrix(c->w, op->w), c->wdt, ac_block_bias(c->w, op->w), N,
                            dim[op->din], dout, 0, c->ws);
            cur[op->out] = *tp;
            *tp += (size_t)N * dout;
            break;
        case AC_OP_HEAD_NORM: /* taped: its input stays on the tape (the LINEAR's output) */
            if (fwd) ac_rmsnorm(*tp, cur[op->in], ac_block_norm(c->w, op->w), N * (dim[op->heads] / hd), hd, a->eps);
            cur[op->out] = *tp;
            *tp += (size_t)N * dout;
            break;
        case AC_OP_ROPE: /* in place on a taped output: the tape keeps the rotated value */
            if (fwd) ac_rope(cur[op->out], N, dim[op->heads] / hd, hd, c->pos, c->cos_t, c->sin_t);
            break;
        case AC_OP_ATTENTION:
            if (fwd) attention_fwd(c, l, *tp, cur[op->in], cur[op->in2], cur[op->in3], attscr);
            cur[op->out] = *tp;
            *tp += (size_t)N * dout;
            break;
        case AC_OP_SWIGLU:
            memcpy(sc, cur[op->out], (size_t)N * dout * sizeof(float));
            ac_silu_mul(sc, cur[op->in], (long)N * dout);
            cur[op->out] = sc;
            sc += (size_t)N * dout;
            break;
        case AC_OP_MASK:
            mask_fwd(sc, cur[op->in], c->gate[op->dout], (size_t)N, dout, ac_block_mask_unit(a, (ac_dim)op->dout));
            cur[op->out] = sc;
            sc += (size_t)N * dout;
            break;
        case AC_OP_KV_MERGE:
        case AC_OP_MASK_HIDDEN: break; /* not differentiated here (block_grad.h) */
        case AC_OP_ROUTE: {            /* taped: the softmax over the experts, then the routing weights */
            int E = dim[AC_DIM_E];
            float *p = *tp, *r = *tp + (size_t)N * E;
            if (fwd) {
                ac_linear_w(r, cur[op->in], c->w->router, c->wdt, NULL, N, dim[AC_DIM_H], E, 0, c->ws);
                if (a->router_sigmoid) { /* nemotron_h: p keeps the sigmoid of every logit */
                    for (size_t j = 0; j < (size_t)N * E; j++) p[j] = (float)(1.0 / (1.0 + exp(-(double)r[j])));
                    ac_moe_route_sigmoid(r, c->w->router_bias, c->gate[AC_DIM_E], N, E, a->top_k, a->norm_topk, a->routed_scale,
                                         c->rows);
                } else
                    ac_moe_route_gated(r, p, c->gate[AC_DIM_E], N, E, a->top_k, a->norm_topk, c->rows);
            }
            w->xhat[i] = p; /* (the walk's norm fields hold the route's softmax and weights) */
            w->r[i] = r;
            cur[op->out] = r;
            *tp += 2 * (size_t)N * E;
            break;
        }
        case AC_OP_EXPERTS:
            if (!op->acc) { /* LatentMoE: into its own (taped) slot, not a residual add */
                if (fwd) {
                    memset(*tp, 0, sizeof(float) * (size_t)N * dout);
                    experts_fwd(c, l, *tp, cur[op->in], cur[op->in2], dim[op->din], 1.0f);
                }
                cur[op->out] = *tp;
                *tp += (size_t)N * dout;
            } else if (fwd)
                experts_fwd(c, l, cur[op->out], cur[op->in], cur[op->in2], dim[op->din],
                            c->sub_gate ? c->sub_gate[sb] : 1.0f);
            break;
        case AC_OP_RELU2:
            ac_relu2_fwd(sc, cur[op->in], (size_t)N * dout);
            cur[op->out] = sc;
            sc += (size_t)N * dout;
            break;
        case AC_OP_GATED_NORM: {
            ac_ssm ss = ac_ssm_of(a, c->w, l);
            ss.dim_gate = c->ssm_dim_gate, ss.head_gate = c->gate[AC_DIM_SSM];
            ac_ssm_gated_norm_fwd(&ss, sc, cur[op->in], cur[op->in2], N);
            cur[op->out] = sc;
            sc += (size_t)N * dout;
            break;
        }
        case AC_OP_SSM_CONV: /* taped: silu(conv); the backward recomputes the pre-activation */
        case AC_OP_SSM_SCAN: /* taped: y; the backward recomputes the states */
            if (fwd) {
                ac_ssm ss = ac_ssm_of(a, c->w, l);
                if (op->kind == AC_OP_SSM_CONV)
                    ac_ssm_conv_fwd(&ss, *tp, cur[op->in], c->B, c->T, NULL, 0);
                else
                    ac_ssm_scan_fwd(&ss, *tp, cur[op->in], cur[op->in2], c->B, c->T, NULL, 0, ssm_work(c));
            }
            cur[op->out] = *tp;
            *tp += (size_t)N * dout;
            break;
        }
    }
    return sc;
}

void ac_block_grad_forward(ac_block_grad *c, int l, float *x) {
    const ac_block_recipe *r = ac_block_recipe_of(&c->m->a, l);
    float *tp = c->tape, *sc = c->scratch + 2 * (size_t)c->T * c->T;
    walk w;
    for (int s = 0; s < r->n_sub; s++)
        if (ac_block_sub_present(&c->m->a, l, &r->sub[s])) sub_walk(c, l, s, x, &tp, sc, 1, &w);
}

void ac_block_grad_backward(ac_block_grad *c, int l, float *dx) {
    const ac_arch *a = &c->m->a;
    const ac_block_recipe *r = ac_block_recipe_of(a, l);
    int N = c->B * c->T, T = c->T, hd = a->head_dim, dim[AC_DIM_COUNT];
    for (int d = 0; d < AC_DIM_COUNT; d++) dim[d] = ac_block_dim(a, l, (ac_dim)d);
    /* the tape offset of each present sub-block, in forward order */
    float *tps[AC_BLOCK_MAX_SUB], *tp = c->tape;
    walk w;
    for (int s = 0; s < r->n_sub; s++) {
        tps[s] = tp;
        if (!ac_block_sub_present(a, l, &r->sub[s])) continue;
        for (int i = 0; i < r->sub[s].n_ops; i++) {
            const ac_op *op = &r->sub[s].ops[i];
            tp += ac_block_op_tape(a, l, op, (size_t)N, 0);
        }
    }
    float *attscr = c->scratch;
    for (int s = r->n_sub - 1; s >= 0; s--) {
        const ac_subblock *sub = &r->sub[s];
        if (!ac_block_sub_present(a, l, sub)) continue;
        /* restore what the forward of this sub-block left (x is only read for the slot table) */
        float *stp = tps[s];
        float *g0 = sub_walk(c, l, s, dx, &stp, c->scratch + 2 * (size_t)T * T, 0, &w);
        float *dS[AC_T_COUNT];
        int has[AC_T_COUNT] = {0};
        for (int t = 0; t < AC_T_COUNT; t++) {
            dS[t] = g0;
            g0 += (size_t)N * ac_block_dim_max(a, (ac_dim)ac_block_slot_dim(t));
        }
        dS[AC_T_X] = dx;
        has[AC_T_X] = 1;
        for (int i = sub->n_ops - 1; i >= 0; i--) {
            const ac_op *op = &sub->ops[i];
            int din = dim[op->din], dout = dim[op->dout];
            float *dO = dS[op->out];
            switch ((ac_op_kind)op->kind) {
            case AC_OP_LINEAR: {
                const void *W = ac_block_matrix(c->w, op->w);
                float *gW = c->gw ? (float *)ac_block_matrix(c->gw, op->w) : NULL;
                float *gb = c->gw ? (float *)ac_block_bias(c->gw, op->w) : NULL;
                float *dI = dS[op->in];
                if (op->acc) { /* x += alpha * in W^T: dI = alpha * dx W; d alpha = <dx W, in> */
                    float alpha = c->sub_gate ? c->sub_gate[s] : 1.0f;
                    ac_linear_dx_w(dI, dO, W, c->wdt, N, din, dout, 1.0f, 0, c->wtile, c->wtile_rows);
                    if (c->dsub_gate) {
                        double ds = 0;
                        for (size_t j = 0; j < (size_t)N * din; j++) ds += (double)dI[j] * w.in[i][j];
                        c->dsub_gate[s] += (float)ds;
                    }
                    if (gW) /* dW[H,din] += alpha dx^T in */
                        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, dout, din, N, alpha, dO, dout, w.in[i],
                                    din, 1.0f, gW, din);
                    if (alpha != 1.0f)
                        for (size_t j = 0; j < (size_t)N * din; j++) dI[j] *= alpha;
                } else {
                    ac_linear_dx_w(dI, dO, W, c->wdt, N, din, dout, 1.0f, has[op->in], c->wtile, c->wtile_rows);
                    if (gW || gb) ac_linear_backward(NULL, gW, gb, dO, w.in[i], W, N, din, dout, 1.0f, 0);
                }
                has[op->in] = 1;
                break;
            }
            case AC_OP_MASK: { /* out = in * g: dg += sum dout * in; din = dout * g (in place) */
                const float *g = c->gate[op->dout];
                float *dg = c->dgate[op->dout];
                int unit = ac_block_mask_unit(a, (ac_dim)op->dout);
                for (size_t r = 0; r < (size_t)N; r++) {
                    float *d = dO + r * dout;
                    const float *in = w.in[i] + r * dout;
                    for (int ch = 0; dg && ch < dout; ch++) dg[ch / unit] += d[ch] * in[ch];
                    for (int ch = 0; g && ch < dout; ch++) d[ch] *= g[ch / unit];
                }
                dS[op->in] = dO;
                has[op->in] = 1;
                break;
            }
            case AC_OP_SWIGLU: /* out = silu(pre) * in */
                ac_silu_mul_backward(dO, dS[op->in], dO, w.pre[i], w.in[i], (long)N * dout);
                has[op->in] = 1;
                break;
            case AC_OP_ROPE: ac_rope_backward(dO, N, dim[op->heads] / hd, hd, c->pos, c->cos_t, c->sin_t); break;
            case AC_OP_HEAD_NORM: /* in place: the slot's gradient becomes its input's */
                ac_head_norm_backward(dO, c->gw ? (float *)ac_block_norm(c->gw, op->w) : NULL, dO, w.in[i],
                                      ac_block_norm(c->w, op->w), (long)N * (dim[op->heads] / hd), hd, a->eps);
                break;
            case AC_OP_ATTENTION: {
                const ac_layer_arch *la = &a->layers[l];
                int Q = dim[AC_DIM_Q], KV = dim[AC_DIM_KV], grp = la->n_heads / la->n_kv_heads;
                float *dq = dS[op->in], *dk = dS[op->in2], *dv = dS[op->in3];
                memset(dk, 0, (size_t)N * KV * sizeof(float));
                memset(dv, 0, (size_t)N * KV * sizeof(float));
                for (int b = 0; b < c->B; b++)
                    for (int h = 0; h < la->n_heads; h++) {
                        size_t qo = (size_t)b * T * Q + h * hd, ko = (size_t)b * T * KV + (h / grp) * hd;
                        ac_attention_head_backward(dq + qo, dk + ko, dv + ko, dO + qo, w.in[i] + qo, w.in2[i] + ko,
                                                   w.in3[i] + ko, T, hd, Q, KV, a->sliding_window, attscr);
                    }
                has[op->in] = has[op->in2] = has[op->in3] = 1;
                break;
            }
            case AC_OP_RMSNORM: {
                float *gn = c->gw ? (float *)ac_block_norm(c->gw, op->w) : NULL;
                ac_rmsnorm_backward(dS[op->in], gn, c->dgate[AC_DIM_H], dO, w.xhat[i], w.r[i],
                                    ac_block_norm(c->w, op->w), c->gate[AC_DIM_H], N, dim[AC_DIM_H]);
                break;
            }
            case AC_OP_EXPERTS:
                experts_bwd(c, l, s, dO, w.in[i], w.in2[i], dS[op->in], dS[op->in2], din, op->acc, has[op->in]);
                has[op->in] = has[op->in2] = 1;
                break;
            case AC_OP_ROUTE: route_bwd(c, l, w.xhat[i], w.r[i], dO, w.in[i], dS[op->in]); break;
            case AC_OP_RELU2:
                ac_relu2_bwd(dS[op->in], dO, w.in[i], (size_t)N * dout);
                has[op->in] = 1;
                break;
            case AC_OP_GATED_NORM: /* dy written, z's columns of dzx written */
            case AC_OP_SSM_SCAN:   /* dxbc written, dt's columns of dzx written */
            case AC_OP_SSM_CONV: { /* xBC's columns of dzx written */
                ac_ssm ss = ac_ssm_of(a, c->w, l);
                ac_layer_w *g = c->gw;
                ss.dim_gate = c->ssm_dim_gate, ss.head_gate = c->gate[AC_DIM_SSM];
                if (op->kind == AC_OP_GATED_NORM)
                    ac_ssm_gated_norm_bwd(&ss, dS[op->in], dS[op->in2], g ? g->ssm_norm : NULL, c->dssm_dim_gate,
                                          c->dgate[AC_DIM_SSM], dO, w.in[i], w.in2[i], N);
                else if (op->kind == AC_OP_SSM_SCAN)
                    ac_ssm_scan_bwd(&ss, dS[op->in], dS[op->in2], g ? g->dt_bias : NULL, g ? g->a_log : NULL,
                                    g ? g->ssm_d : NULL, dO, w.in[i], w.in2[i], c->B, c->T, ssm_work(c));
                else
                    ac_ssm_conv_bwd(&ss, dS[op->in], g ? g->conv_w : NULL, g ? g->conv_b : NULL, dO, w.in[i], c->B,
                                    c->T);
                has[op->in] = 1;
                break;
            }
            case AC_OP_KV_MERGE:
            case AC_OP_MASK_HIDDEN: break;
            }
        }
    }
}
