/* optim.c - see optim.h. The update follows torch.optim.AdamW's
 * single-tensor code path operation by operation, so both round alike. */
#include "runtime/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void ac_adamw_defaults(ac_adamw_opts *o) {
    *o = (ac_adamw_opts){.lr = 1e-3f,
                         .min_lr = 1e-4f,
                         .beta1 = 0.9f,
                         .beta2 = 0.95f,
                         .eps = 1e-8f,
                         .weight_decay = 0.1f,
                         .clip = 1.0f,
                         .warmup = 0,
                         .total_steps = 1};
}

void ac_adamw_init(ac_adamw *a, const ac_adamw_opts *o) {
    memset(a, 0, sizeof *a);
    a->o = *o;
}

void ac_adamw_free(ac_adamw *a) {
    free(a->ps);
    free(a->m);
    memset(a, 0, sizeof *a);
}

int ac_adamw_add(ac_adamw *a, float *p, const float *g, size_t n, int decay, ac_err *e) {
    if (a->m) return ac_errf(e, "optimizer: parameters added after the first step");
    if (!p || !g || !n) return 0;
    if (a->np == a->cap) {
        int cap = a->cap ? 2 * a->cap : 32;
        ac_param *ps = realloc(a->ps, cap * sizeof *ps);
        if (!ps) return ac_errf(e, "out of memory");
        a->ps = ps;
        a->cap = cap;
    }
    a->ps[a->np++] = (ac_param){p, g, n, a->total, decay};
    a->total += n;
    return 0;
}

int ac_adamw_add_model(ac_adamw *a, ac_model *m, const ac_model *g, ac_err *e) {
    const ac_arch *ar = &m->a;
    size_t H = ar->hidden, hd = ar->head_dim, V = ar->vocab;
    int rc = ac_adamw_add(a, m->embed, g->embed, V * H, 1, e);
    if (!ar->tie_embeddings) rc = rc || ac_adamw_add(a, m->lm_head, g->lm_head, V * H, 1, e);
    rc = rc || ac_adamw_add(a, m->final_norm, g->final_norm, H, 0, e);
    for (int l = 0; !rc && l < ar->n_layers; l++) {
        const ac_layer_arch *L = &ar->layers[l];
        ac_layer_w *w = &m->L[l];
        const ac_layer_w *d = &g->L[l];
        size_t Q = L->n_heads * hd, KV = L->n_kv_heads * hd, F = L->ffn;
        rc = ac_adamw_add(a, w->in_norm, d->in_norm, L->n_heads ? H : 0, 0, e) ||
             ac_adamw_add(a, w->wq, d->wq, Q * H, 1, e) || ac_adamw_add(a, w->wk, d->wk, KV * H, 1, e) ||
             ac_adamw_add(a, w->wv, d->wv, KV * H, 1, e) || ac_adamw_add(a, w->wo, d->wo, H * Q, 1, e) ||
             ac_adamw_add(a, w->bq, d->bq, w->bq ? Q : 0, 0, e) ||
             ac_adamw_add(a, w->bk, d->bk, w->bk ? KV : 0, 0, e) ||
             ac_adamw_add(a, w->bv, d->bv, w->bv ? KV : 0, 0, e) ||
             ac_adamw_add(a, w->post_norm, d->post_norm, F ? H : 0, 0, e) ||
             ac_adamw_add(a, w->wg, d->wg, F * H, 1, e) || ac_adamw_add(a, w->wu, d->wu, F * H, 1, e) ||
             ac_adamw_add(a, w->wd, d->wd, H * F, 1, e) ||
             ac_adamw_add(a, w->q_norm, d->q_norm, w->q_norm ? hd : 0, 0, e) ||
             ac_adamw_add(a, w->k_norm, d->k_norm, w->k_norm ? hd : 0, 0, e);
        if (!rc && L->ssm_heads) { /* Mamba-2: its norm, in_proj, conv, per-head vectors, gated norm, out_proj */
            size_t di = ac_ssm_inner(ar, l), C = ac_ssm_conv_dim(ar, l), nh = L->ssm_heads;
            rc = ac_adamw_add(a, w->in_norm, d->in_norm, H, 0, e) ||
                 ac_adamw_add(a, w->ssm_in, d->ssm_in, (size_t)ac_ssm_in_dim(ar, l) * H, 1, e) ||
                 ac_adamw_add(a, w->ssm_out, d->ssm_out, H * di, 1, e) ||
                 ac_adamw_add(a, w->conv_w, d->conv_w, C * ar->ssm_conv, 1, e) ||
                 ac_adamw_add(a, w->conv_b, d->conv_b, w->conv_b ? C : 0, 0, e) ||
                 ac_adamw_add(a, w->dt_bias, d->dt_bias, nh, 0, e) || ac_adamw_add(a, w->a_log, d->a_log, nh, 0, e) ||
                 ac_adamw_add(a, w->ssm_d, d->ssm_d, nh, 0, e) || ac_adamw_add(a, w->ssm_norm, d->ssm_norm, di, 0, e);
        }
        if (!rc && L->n_experts) { /* the MoE FFN: its norm, the router and every expert (nemotron_h: no gate, the
                                    * shared expert, LatentMoE's projections; the correction bias is not trained) */
            size_t E = L->n_experts, Fe = L->expert_ffn, Fs = ar->hybrid ? (size_t)ar->shared_ffn : 0,
                   Hin = ar->hybrid && ar->moe_latent ? (size_t)ar->moe_latent : H;
            rc = ac_adamw_add(a, w->post_norm, d->post_norm, H, 0, e) ||
                 ac_adamw_add(a, w->router, d->router, E * H, 1, e) ||
                 ac_adamw_add(a, w->sh_u, d->sh_u, Fs * H, 1, e) || ac_adamw_add(a, w->sh_d, d->sh_d, H * Fs, 1, e) ||
                 ac_adamw_add(a, w->lat_down, d->lat_down, w->lat_down ? Hin * H : 0, 1, e) ||
                 ac_adamw_add(a, w->lat_up, d->lat_up, w->lat_up ? H * Hin : 0, 1, e);
            for (size_t x = 0; !rc && x < E; x++)
                rc = ac_adamw_add(a, w->eg[x], d->eg[x], Fe * H, 1, e) ||
                     ac_adamw_add(a, w->eu[x], d->eu[x], Fe * Hin, 1, e) ||
                     ac_adamw_add(a, w->ed[x], d->ed[x], Hin * Fe, 1, e);
        }
    }
    return rc ? -1 : 0;
}

float ac_lr_at(const ac_adamw_opts *o, long step) {
    if (o->warmup > 0 && step < o->warmup) return o->lr * (float)(step + 1) / (float)o->warmup;
    long span = o->total_steps - o->warmup;
    double prog = (double)(step - o->warmup) / (double)(span > 1 ? span : 1);
    if (prog > 1) prog = 1;
    if (prog < 0) prog = 0;
    return (float)(o->min_lr + (o->lr - o->min_lr) * 0.5 * (1 + cos(M_PI * prog)));
}

double ac_grad_norm(const ac_adamw *a) {
    double ss = 0;
    for (int i = 0; i < a->np; i++)
        for (size_t j = 0; j < a->ps[i].n; j++) ss += (double)a->ps[i].g[j] * a->ps[i].g[j];
    return sqrt(ss);
}

int ac_adamw_step(ac_adamw *a, double *gnorm, ac_err *e) {
    if (!a->m) {
        if (!(a->m = calloc(2 * a->total + 1, sizeof(float))))
            return ac_errf(e, "optimizer: out of memory for %zu moments", 2 * a->total);
        a->v = a->m + a->total;
    }
    const ac_adamw_opts *o = &a->o;
    double norm = ac_grad_norm(a);
    if (gnorm) *gnorm = norm;
    float coef = 1.0f;
    if (o->clip > 0) {
        float c = (float)(o->clip / (norm + 1e-6));
        if (c < 1.0f) coef = c;
    }
    float lr = ac_lr_at(o, a->step);
    a->step++;
    double bc1 = 1 - pow(o->beta1, (double)a->step), bc2 = 1 - pow(o->beta2, (double)a->step);
    float step_size = (float)(lr / bc1), bc2s = (float)sqrt(bc2);
    for (int i = 0; i < a->np; i++) {
        const ac_param *P = &a->ps[i];
        float *m = a->m + P->off, *v = a->v + P->off, wd = P->decay ? 1.0f - lr * o->weight_decay : 1.0f;
        for (size_t j = 0; j < P->n; j++) {
            float g = P->g[j] * coef;
            P->p[j] *= wd;
            m[j] = m[j] * o->beta1 + (1.0f - o->beta1) * g;
            v[j] = v[j] * o->beta2 + (1.0f - o->beta2) * g * g;
            float denom = sqrtf(v[j]) / bc2s + o->eps;
            P->p[j] -= step_size * m[j] / denom;
        }
    }
    return 0;
}
