/* dnas.c - see dnas.h. */
#include "search/dnas.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensor.h"
#include "cost/device.h"
#include "runtime/cuda_plugin.h"
#include "runtime/optim.h"
#include "runtime/rope.h"
#include "search/minitron.h"
#include "search/slice.h"
#include "search/topk.h"
#include "dnas_int.h"

#define HC_BETA (2.0 / 3.0)
#define HC_GAMMA (-0.1)
#define HC_ZETA 1.1

void ac_dnas_defaults(ac_dnas_opts *o) {
    *o = (ac_dnas_opts){.steps = 300,
                        .batch = 4,
                        .seq_len = 64,
                        .lr = 0.1,
                        .mu = 10.0,
                        .rho = 0.5,
                        .cotrain = 0,
                        .w_lr = 1e-4,
                        .init_surrogate = 1,
                        .teacher_cache_mib = 256,
                        .mc_tau0 = 2.0 / 3.0,
                        .mc_tau1 = 2.0 / 3.0,
                        .mc_hard_from = 1.0,
                        .mc_init_off = -1.0};
}

double ac_dnas_keep_prob(double la) { return 1.0 / (1.0 + exp(-(la - HC_BETA * log(-HC_GAMMA / HC_ZETA)))); }

double ac_dnas_sample(double la, double u, double *dz) {
    double s;
    if (u < 0) {
        s = 1.0 / (1.0 + exp(-la));
        double sb = s * (HC_ZETA - HC_GAMMA) + HC_GAMMA;
        if (dz) *dz = sb > 0 && sb < 1 ? (HC_ZETA - HC_GAMMA) * s * (1 - s) : 0;
        return fmin(1, fmax(0, sb));
    }
    s = 1.0 / (1.0 + exp(-(log(u) - log(1 - u) + la) / HC_BETA));
    double sb = s * (HC_ZETA - HC_GAMMA) + HC_GAMMA;
    if (dz) *dz = sb > 0 && sb < 1 ? (HC_ZETA - HC_GAMMA) * s * (1 - s) / HC_BETA : 0;
    return fmin(1, fmax(0, sb));
}

static int grp_of(const ac_layer_arch *b) { return b->n_heads ? b->n_heads / b->n_kv_heads : 1; }
int ac_dnas_gsize(int n, int m, int j) { return (j + 1) * m <= n ? m : n - j * m; }
#define gsize ac_dnas_gsize

int ac_dnas_gates_init(ac_dnas_gates *g, const ac_arch *b, const ac_search_opts *so, ac_err *e) {
    memset(g, 0, sizeof *g);
    int L = b->n_layers;
    g->L = L;
    g->H = b->hidden;
    g->fm = so->ffn_multiple > 0 ? so->ffn_multiple : 1;
    g->hm = so->hidden_multiple > 0 ? so->hidden_multiple : 1;
    g->gate_kv = so->target != AC_EXPORT_DECI;
    g->gate_depth = 1;
    g->hyb = b->hybrid;
    /* a uniform Llama drops whole layers only; a hybrid's layer is one mixer */
    g->tie_depth = so->target == AC_EXPORT_LLAMA || g->hyb;
    g->gate_hid = so->prune_hidden;
    g->nkv = calloc(L, sizeof(int));
    g->nfg = calloc(L, sizeof(int));
    g->kv_off = calloc(L, sizeof(int));
    g->ffn_off = calloc(L, sizeof(int));
    g->kv_on = calloc(L, sizeof(double));
    g->nmc = calloc(L, sizeof(int));
    g->mc_off = calloc(L, sizeof(int));
    g->nex = calloc(L, sizeof(int));
    g->ex_off = calloc(L, sizeof(int));
    g->nxg = calloc(L, sizeof(int));
    g->xg_off = calloc(L, sizeof(int));
    g->xfm = calloc(L, sizeof(int));
    g->nsg = calloc(L, sizeof(int));
    g->sg_off = calloc(L, sizeof(int));
    g->npd = calloc(L, sizeof(int));
    g->pd_off = calloc(L, sizeof(int));
    g->nshg = calloc(L, sizeof(int));
    g->shg_off = calloc(L, sizeof(int));
    g->nltg = calloc(L, sizeof(int));
    g->ltg_off = calloc(L, sizeof(int));
    if (!g->nltg || !g->ltg_off || !g->npd || !g->pd_off || !g->nshg || !g->shg_off ||
        !g->nsg || !g->sg_off || !g->nkv || !g->nfg || !g->kv_off || !g->ffn_off || !g->kv_on || !g->nmc || !g->mc_off || !g->nex ||
        !g->ex_off || !g->nxg || !g->xg_off || !g->xfm) {
        ac_dnas_gates_free(g);
        return ac_errf(e, "out of memory");
    }
    int n = 0;
    for (int l = 0; l < L; l++) {
        const ac_layer_arch *bl = &b->layers[l];
        g->kv_on[l] = bl->n_kv_heads;
        g->nkv[l] = g->gate_kv && bl->n_heads ? bl->n_kv_heads : 0;
        g->kv_off[l] = n;
        n += g->nkv[l];
        g->nfg[l] = (bl->ffn + g->fm - 1) / g->fm;
        g->ffn_off[l] = n;
        n += g->nfg[l];
    }
    g->attn_off = n;
    n += g->gate_depth ? L : 0;
    g->mlp_off = g->tie_depth ? g->attn_off : n;
    n += g->gate_depth && !g->tie_depth ? L : 0;
    g->hid_off = n;
    g->nhg = g->gate_hid ? (g->H + g->hm - 1) / g->hm : 0;
    n += g->nhg;
    for (int l = 0; l < L; l++) { /* deci: the divisors of n_kv_heads, when there is a choice */
        const ac_layer_arch *bl = &b->layers[l];
        int nd = 0;
        for (int d = 1; d <= bl->n_kv_heads; d++) nd += bl->n_kv_heads % d == 0;
        g->nmc[l] = !g->gate_kv && bl->n_heads && nd > 1 ? nd : 0;
        g->mc_off[l] = n;
        n += g->nmc[l];
    }
    for (int l = 0; l < L; l++) { /* experts (a dense model's sigmoid router has none; nemotron_h's has) */
        g->nex[l] = so->prune_experts && (!b->router_sigmoid || g->hyb) ? b->layers[l].n_experts : 0;
        g->ex_off[l] = n;
        n += g->nex[l];
    }
    for (int l = 0; l < L; l++) { /* expert width: about 16 groups of each expert's ranking */
        int Fe = b->layers[l].expert_ffn;
        g->xfm[l] = Fe >= 24 ? (Fe + 8) / 16 : 1;
        g->nxg[l] = so->prune_expert_ffn && (!b->router_sigmoid || g->hyb) && b->layers[l].n_experts
                        ? (Fe + g->xfm[l] - 1) / g->xfm[l]
                        : 0;
        g->xg_off[l] = n;
        n += g->nxg[l];
    }
    for (int l = 0; l < L; l++) { /* Mamba head slots: slot j is the head at rank j of every group */
        int G = b->ssm_groups > 0 ? b->ssm_groups : 1, nh = b->layers[l].ssm_heads;
        g->nsg[l] = nh && nh % G == 0 ? nh / G : 0;
        g->sg_off[l] = n;
        n += g->nsg[l];
    }
    for (int l = 0; l < L; l++) { /* Mamba head dims: one gate per dim, the same dim in every head */
        g->npd[l] = g->hyb && b->layers[l].ssm_heads && b->ssm_head_dim > 1 ? b->ssm_head_dim : 0;
        g->pd_off[l] = n;
        n += g->npd[l];
    }
    int Fs = g->hyb ? b->shared_ffn : 0; /* the shared expert's width: about 16 groups of each layer's ranking */
    g->shm = Fs >= 24 ? (Fs + 8) / 16 : 1;
    for (int l = 0; l < L; l++) {
        g->nshg[l] = so->prune_expert_ffn && Fs && b->layers[l].n_experts ? (Fs + g->shm - 1) / g->shm : 0;
        g->shg_off[l] = n;
        n += g->nshg[l];
    }
    int Lt = g->hyb ? b->moe_latent : 0; /* LatentMoE's latent width: about 16 groups, in index order */
    g->ltm = Lt >= 24 ? (Lt + 8) / 16 : 1;
    for (int l = 0; l < L; l++) {
        g->nltg[l] = so->prune_expert_ffn && Lt && b->layers[l].n_experts ? (Lt + g->ltm - 1) / g->ltm : 0;
        g->ltg_off[l] = n;
        n += g->nltg[l];
    }
    g->np = n;
    g->la = calloc(n + 1, sizeof(double));
    g->mkv = calloc(n + 1, sizeof(int));
    if (!g->la || !g->mkv) {
        ac_dnas_gates_free(g);
        return ac_errf(e, "out of memory");
    }
    for (int i = 0; i < n; i++) g->la[i] = 3.0;
    for (int l = 0; l < L; l++) { /* choice 0 keeps every KV head (the unpruned model), then fewer */
        int c = 0, nkv = b->layers[l].n_kv_heads;
        for (int d = nkv; d >= 1 && g->nmc[l]; d--)
            if (nkv % d == 0) {
                g->mkv[g->mc_off[l] + c] = d;
                g->la[g->mc_off[l] + c++] = d == nkv ? 3.0 : 0.0;
            }
    }
    return 0;
}

void ac_dnas_gates_free(ac_dnas_gates *g) {
    free(g->nkv);
    free(g->nfg);
    free(g->kv_off);
    free(g->ffn_off);
    free(g->kv_on);
    free(g->nmc);
    free(g->mc_off);
    free(g->mkv);
    free(g->nex);
    free(g->ex_off);
    free(g->nxg);
    free(g->xg_off);
    free(g->xfm);
    free(g->nsg);
    free(g->sg_off);
    free(g->npd);
    free(g->pd_off);
    free(g->nshg);
    free(g->shg_off);
    free(g->nltg);
    free(g->ltg_off);
    free(g->la);
    memset(g, 0, sizeof *g);
}

/* The shared-expert channel of MoE layer l at rank r of its ranking (identity without one). */
static int shared_at(const ac_importance *imp, int l, int r) {
    return imp->sh_order && imp->sh_order[l] ? imp->sh_order[l][r] : r;
}

/* The channel of expert x (of Fe) at rank r of its ranking (identity without one). */
static int echan_at(const ac_importance *imp, int l, int x, int Fe, int r) {
    return imp->echan_order && imp->echan_order[l] ? imp->echan_order[l][(size_t)x * Fe + r] : r;
}

void ac_dnas_set_gates(const ac_dnas_gates *g, const double *z, ac_gates *tg, const ac_arch *b,
                       const ac_importance *imp) {
    for (int l = 0; l < g->L; l++) {
        const ac_layer_arch *bl = &b->layers[l];
        if (tg->head[l])
            for (int h = 0; h < bl->n_heads; h++)
                tg->head[l][h] = g->nkv[l] ? (float)z[g->kv_off[l] + h / grp_of(bl)] : 1.0f;
        if (tg->ffn[l])
            for (int r = 0; r < bl->ffn; r++) tg->ffn[l][imp->ffn_order[l][r]] = (float)z[g->ffn_off[l] + r / g->fm];
        for (int x = 0; tg->expert && tg->expert[l] && x < bl->n_experts; x++)
            tg->expert[l][x] = g->nex[l] ? (float)z[g->ex_off[l] + x] : 1.0f;
        for (int x = 0; g->nxg[l] && tg->echan && tg->echan[l] && x < bl->n_experts; x++)
            for (int r = 0, Fe = bl->expert_ffn; r < Fe; r++)
                tg->echan[l][x * Fe + echan_at(imp, l, x, Fe, r)] = (float)z[g->xg_off[l] + r / g->xfm[l]];
        for (int gr = 0; g->nsg[l] && tg->ssm && tg->ssm[l] && gr * g->nsg[l] < bl->ssm_heads; gr++)
            for (int j = 0; j < g->nsg[l]; j++)
                tg->ssm[l][ac_dnas_ssm_head(imp, b, l, gr, j)] = (float)z[g->sg_off[l] + j];
        for (int d = 0; g->npd[l] && tg->ssm_dim && tg->ssm_dim[l] && d < g->npd[l]; d++)
            tg->ssm_dim[l][d] = (float)z[g->pd_off[l] + d];
        for (int r = 0; g->nshg[l] && tg->shared && tg->shared[l] && r < b->shared_ffn; r++)
            tg->shared[l][shared_at(imp, l, r)] = (float)z[g->shg_off[l] + r / g->shm];
        for (int c = 0; g->nltg[l] && tg->latent && tg->latent[l] && c < b->moe_latent; c++)
            tg->latent[l][c] = (float)z[g->ltg_off[l] + c / g->ltm];
        tg->attn[l] = g->gate_depth && (bl->n_heads || g->hyb) ? (float)z[g->attn_off + l] : 1.0f;
        tg->mlp[l] = g->gate_depth && (bl->ffn || g->hyb) ? (float)z[g->mlp_off + l] : 1.0f;
    }
    for (int r = 0; r < g->H; r++)
        tg->hidden[imp->hid_order[r]] = g->gate_hid ? (float)z[g->hid_off + r / g->hm] : 1.0f;
}

void ac_dnas_gate_grads_of(const ac_dnas_gates *g, const ac_arch *b, const ac_gates *dg, const ac_importance *imp,
                           double *dz) {
    memset(dz, 0, sizeof(double) * g->np);
    for (int l = 0; l < g->L; l++) {
        const ac_layer_arch *bl = &b->layers[l];
        for (int h = 0; g->nkv[l] && h < bl->n_heads; h++) /* a KV group's gate: the sum over its query heads */
            dz[g->kv_off[l] + h / grp_of(bl)] += dg->head[l][h];
        for (int r = 0; r < bl->ffn; r++) dz[g->ffn_off[l] + r / g->fm] += dg->ffn[l][imp->ffn_order[l][r]];
        for (int x = 0; x < g->nex[l]; x++) dz[g->ex_off[l] + x] = dg->expert[l][x];
        for (int x = 0; g->nxg[l] && x < bl->n_experts; x++)
            for (int r = 0, Fe = bl->expert_ffn; r < Fe; r++)
                dz[g->xg_off[l] + r / g->xfm[l]] += dg->echan[l][x * Fe + echan_at(imp, l, x, Fe, r)];
        for (int gr = 0; g->nsg[l] && gr * g->nsg[l] < bl->ssm_heads; gr++) /* a slot: the sum over the groups */
            for (int j = 0; j < g->nsg[l]; j++) dz[g->sg_off[l] + j] += dg->ssm[l][ac_dnas_ssm_head(imp, b, l, gr, j)];
        for (int d = 0; g->npd[l] && dg->ssm_dim && dg->ssm_dim[l] && d < g->npd[l]; d++)
            dz[g->pd_off[l] + d] = dg->ssm_dim[l][d];
        for (int r = 0; g->nshg[l] && dg->shared && dg->shared[l] && r < b->shared_ffn; r++)
            dz[g->shg_off[l] + r / g->shm] += dg->shared[l][shared_at(imp, l, r)];
        for (int c = 0; g->nltg[l] && dg->latent && dg->latent[l] && c < b->moe_latent; c++)
            dz[g->ltg_off[l] + c / g->ltm] += dg->latent[l][c];
        if (g->gate_depth && (bl->n_heads || g->hyb)) dz[g->attn_off + l] = dg->attn[l];
        /* tied: the layer's gate gets both (a hybrid layer's one mixer is one of the two sub-block gates) */
        if (g->gate_depth && (bl->ffn || g->hyb)) dz[g->mlp_off + l] += dg->mlp[l];
    }
    if (g->gate_hid)
        for (int r = 0; r < g->H; r++) dz[g->hid_off + r / g->hm] += dg->hidden[imp->hid_order[r]];
}

void ac_dnas_gate_grads(const ac_dnas_gates *g, const ac_trainer *t, const ac_importance *imp, double *dz) {
    ac_dnas_gate_grads_of(g, &t->m->a, &t->dgate, imp, dz);
}

/* ---- deci KV-merge choices ---- */

/* dst[nkv][per] = sum_c z_c M_c(src): each head replaced by the mean of
 * its merge group (f = nkv / d_c adjacent heads), means in double rounded
 * to float as ac_prune's. */
static void merge_rows(float *dst, const float *src, int nkv, size_t per, const int *mkv, const double *z, int nc) {
    memset(dst, 0, sizeof(float) * nkv * per);
    for (int c = 0; c < nc; c++) {
        int f = nkv / mkv[c];
        if (z[c] == 0) continue;
        for (int j = 0; j < mkv[c]; j++)
            for (size_t i = 0; i < per; i++) {
                double sum = 0;
                for (int m = 0; m < f; m++) sum += src[(size_t)(j * f + m) * per + i];
                float mean = (float)(sum / f);
                for (int m = 0; m < f; m++) dst[(size_t)(j * f + m) * per + i] += (float)z[c] * mean;
            }
    }
}

/* dz[c] += <grad, M_c(src)> (M_c symmetric: = sum over groups of the
 * group-summed gradient times the group mean). */
static void merge_grad_rows(double *dz, const float *grad, const float *src, int nkv, size_t per, const int *mkv,
                            int nc) {
    for (int c = 0; c < nc; c++) {
        int f = nkv / mkv[c];
        double acc = 0;
        for (int j = 0; j < mkv[c]; j++)
            for (size_t i = 0; i < per; i++) {
                double sw = 0, sg = 0;
                for (int m = 0; m < f; m++) {
                    sw += src[(size_t)(j * f + m) * per + i];
                    sg += grad[(size_t)(j * f + m) * per + i];
                }
                acc += sg * (float)(sw / f);
            }
        dz[c] += acc;
    }
}

/* Layer l's K/V tensors of model m: wk, wv, bk, bv (biases may be NULL) and their sizes per KV head. */
static void kv_tensors(const ac_model *m, int l, float **t, size_t *per) {
    const ac_layer_w *w = &m->L[l];
    size_t hd = m->a.head_dim, H = m->a.hidden;
    t[0] = w->wk, t[1] = w->wv, t[2] = w->bk, t[3] = w->bv;
    per[0] = per[1] = hd * H, per[2] = per[3] = hd;
}

void ac_dnas_apply_merge(const ac_dnas_gates *g, const double *z, const ac_model *src, ac_model *dst) {
    for (int l = 0; l < g->L; l++) {
        if (!g->nmc[l]) continue;
        float *s[4], *d[4];
        size_t per[4];
        kv_tensors(src, l, s, per);
        kv_tensors(dst, l, d, per);
        for (int k = 0; k < 4; k++)
            if (s[k] && d[k])
                merge_rows(d[k], s[k], src->a.layers[l].n_kv_heads, per[k], g->mkv + g->mc_off[l], z + g->mc_off[l],
                           g->nmc[l]);
    }
}

void ac_dnas_merge_grads(const ac_dnas_gates *g, const ac_model *src, const ac_model *grad, double *dz) {
    for (int l = 0; l < g->L; l++) {
        if (!g->nmc[l]) continue;
        float *s[4], *d[4];
        size_t per[4];
        kv_tensors(src, l, s, per);
        kv_tensors(grad, l, d, per);
        for (int k = 0; k < 4; k++)
            if (s[k] && d[k])
                merge_grad_rows(dz + g->mc_off[l], d[k], s[k], src->a.layers[l].n_kv_heads, per[k],
                                g->mkv + g->mc_off[l], g->nmc[l]);
    }
}

void ac_dnas_merge_sample(const ac_dnas_gates *g, int l, const double *u, double tau, int hard, double *q, double *z) {
    int o = g->mc_off[l], n = g->nmc[l], best = 0;
    double mx = -1e300;
    for (int c = 0; c < n; c++) {
        double v = u ? (g->la[o + c] - log(-log(u[c]))) / tau : g->la[o + c];
        q[o + c] = v;
        mx = fmax(mx, v);
    }
    double sum = 0;
    for (int c = 0; c < n; c++) sum += (q[o + c] = exp(q[o + c] - mx));
    for (int c = 0; c < n; c++) best = q[o + c] > q[o + best] ? c : best;
    for (int c = 0; c < n; c++) q[o + c] /= sum;
    for (int c = 0; c < n; c++) z[o + c] = hard ? c == best : q[o + c];
}

/* Expected KV count of layer l's merge choices (softmax(theta)); p[nmc] gets the probabilities. */
static double merge_expect(const ac_dnas_gates *g, int l, double *p) {
    double mx = -1e300, sum = 0, kv = 0;
    int o = g->mc_off[l], n = g->nmc[l];
    for (int c = 0; c < n; c++) mx = fmax(mx, g->la[o + c]);
    for (int c = 0; c < n; c++) sum += (p[c] = exp(g->la[o + c] - mx));
    for (int c = 0; c < n; c++) kv += (p[c] /= sum) * g->mkv[o + c];
    return kv;
}

/* ---- the expected architecture and its cost ---- */

typedef struct {
    double *kv, *ffn, *pa, *pm; /* [L] expected widths given kept; keep probabilities */
    double *ex;                 /* [L] expected experts (gated MoE layers; else the base's count) */
    double *ew;                 /* [L] expected expert width (else the base's) */
    double hidden;
} expect_t;

#define EXPECT_FLOATS 6 /* expect()'s doubles per layer */

static void expect(const ac_dnas_gates *g, const ac_arch *b, double *buf, expect_t *x) {
    int L = g->L;
    x->kv = buf;
    x->ffn = buf + L;
    x->pa = buf + 2 * L;
    x->pm = buf + 3 * L;
    x->ex = buf + 4 * L;
    x->ew = buf + 5 * L;
    for (int l = 0; l < L; l++) {
        const ac_layer_arch *bl = &b->layers[l];
        x->ex[l] = bl->n_experts;
        if (g->nex[l]) x->ex[l] = 0;
        for (int k = 0; k < g->nex[l]; k++) x->ex[l] += ac_dnas_keep_prob(g->la[g->ex_off[l] + k]);
        x->ew[l] = g->nxg[l] ? 0 : bl->expert_ffn;
        for (int j = 0; j < g->nxg[l]; j++)
            x->ew[l] += gsize(bl->expert_ffn, g->xfm[l], j) * ac_dnas_keep_prob(g->la[g->xg_off[l] + j]);
        double kv = g->kv_on[l], pc[64];
        if (g->nmc[l] && g->nmc[l] <= 64) kv = merge_expect(g, l, pc);
        if (g->nkv[l]) {
            kv = 0;
            for (int k = 0; k < g->nkv[l]; k++) kv += ac_dnas_keep_prob(g->la[g->kv_off[l] + k]);
        }
        x->kv[l] = bl->n_heads ? kv : 0;
        double f = 0;
        for (int j = 0; j < g->nfg[l]; j++) f += gsize(bl->ffn, g->fm, j) * ac_dnas_keep_prob(g->la[g->ffn_off[l] + j]);
        x->ffn[l] = f;
        x->pa[l] = !bl->n_heads ? 0 : g->gate_depth ? ac_dnas_keep_prob(g->la[g->attn_off + l]) : 1;
        x->pm[l] = !bl->ffn ? 0 : g->gate_depth ? ac_dnas_keep_prob(g->la[g->mlp_off + l]) : 1;
    }
    x->hidden = g->H;
    if (g->gate_hid) {
        x->hidden = 0;
        for (int j = 0; j < g->nhg; j++) x->hidden += gsize(g->H, g->hm, j) * ac_dnas_keep_prob(g->la[g->hid_off + j]);
    }
}

static void fill_carch(const ac_dnas_gates *g, const ac_arch *b, const expect_t *x, ac_carch *c) {
    for (int l = 0; l < g->L; l++) {
        const ac_layer_arch *bl = &b->layers[l];
        c->kv[l] = x->kv[l];
        c->heads[l] = g->gate_kv ? x->kv[l] * grp_of(bl) : bl->n_heads;
        c->ffn[l] = x->ffn[l];
        if (c->experts && g->nex[l]) c->experts[l] = x->ex[l];
        if (c->effn && g->nxg[l]) c->effn[l] = x->ew[l];
    }
    c->hidden = x->hidden;
}

double ac_dnas_metric_at(const ac_search_problem *p, const ac_carch *c, ac_metric m) {
    ac_cost k;
    ac_cost_predict(p->table, c, p->workload, p->profile, 1, &k);
    return ac_cost_metric(&k, m);
}

static double hid_slope(const ac_search_problem *p, ac_carch *c, ac_metric m) {
    double h = c->hidden;
    c->hidden = h + 4;
    double a = ac_dnas_metric_at(p, c, m);
    c->hidden = h - 4;
    double v = (a - ac_dnas_metric_at(p, c, m)) / 8;
    c->hidden = h;
    return v;
}

/* Remove sub-block s (0 attention, 1 FFN) of layer k from c, saving what
 * restore() puts back. */
static void block_off(ac_carch *c, int k, int s, double *save) {
    save[0] = s ? c->ffn[k] : c->kv[k];
    save[1] = c->heads[k];
    if (s)
        c->ffn[k] = 0;
    else
        c->kv[k] = c->heads[k] = 0;
}

static void block_on(ac_carch *c, int k, int s, const double *save) {
    if (s)
        c->ffn[k] = save[0];
    else
        c->kv[k] = save[0];
    c->heads[k] = save[1];
}

/* E[m] = m(cbar) - sum (1 - p)(m(cbar) - m(cbar - block)); D[s*L + l] gets
 * m(cbar) - m(cbar - block). */
static double expected_value(const ac_search_problem *p, ac_metric m, ac_carch *c, const expect_t *x, double *D) {
    int L = c->n_layers;
    double m0 = ac_dnas_metric_at(p, c, m), v = m0, save[2];
    for (int l = 0; l < L; l++)
        for (int s = 0; s < 2; s++) {
            D[s * L + l] = 0;
            if (s ? c->ffn[l] == 0 : c->kv[l] == 0 && c->heads[l] == 0) continue;
            block_off(c, l, s, save);
            D[s * L + l] = m0 - ac_dnas_metric_at(p, c, m);
            block_on(c, l, s, save);
            v -= (1 - (s ? x->pm[l] : x->pa[l])) * D[s * L + l];
        }
    return v;
}

/* dE[m]/d width (gh, gk, gf per layer) and d hidden (*ghid): the cost
 * model's gradient at cbar, corrected through every removed-block term
 * (the widest layer sets the activation memory, the cache share of the
 * weights is shared, throughput is a ratio). Returns -1 out of memory. */
static int width_grads(const ac_dnas_gates *g, const ac_search_problem *p, ac_metric m, ac_carch *c, const expect_t *x,
                       const double *D, double *gh, double *gk, double *gf, double *ge, double *ghid) {
    int L = g->L;
    ac_cost_grad_experts(p->table, c, p->workload, p->profile, m, gh, gk, gf, NULL, ge);
    double *xh = calloc(8 * L + 1, sizeof(double)), *xk = xh + L, *xf = xh + 2 * L, *xe = xh + 3 * L, *g0 = xh + 4 * L,
           save[2];
    if (!xh) return -1;
    memcpy(g0, gh, sizeof(double) * L);
    memcpy(g0 + L, gk, sizeof(double) * L);
    memcpy(g0 + 2 * L, gf, sizeof(double) * L);
    memcpy(g0 + 3 * L, ge, sizeof(double) * L);
    double d0 = g->gate_hid ? hid_slope(p, c, m) : 0;
    *ghid = d0;
    for (int k = 0; k < L; k++)
        for (int s = 0; s < 2; s++) {
            double pk = s ? x->pm[k] : x->pa[k];
            if (D[s * L + k] == 0 || pk >= 1) continue;
            block_off(c, k, s, save);
            ac_cost_grad_experts(p->table, c, p->workload, p->profile, m, xh, xk, xf, NULL, xe);
            if (s)
                xf[k] = 0; /* a removed block's own width no longer counts */
            else
                xh[k] = xk[k] = 0;
            for (int l = 0; l < L; l++) {
                gh[l] -= (1 - pk) * (g0[l] - xh[l]);
                gk[l] -= (1 - pk) * (g0[L + l] - xk[l]);
                gf[l] -= (1 - pk) * (g0[2 * L + l] - xf[l]);
                ge[l] -= (1 - pk) * (g0[3 * L + l] - xe[l]);
            }
            if (g->gate_hid) *ghid -= (1 - pk) * (d0 - hid_slope(p, c, m));
            block_on(c, k, s, save);
        }
    free(xh);
    for (int l = 0; l < L; l++) { /* the expert width's slope at cbar (central difference; first order) */
        ge[L + l] = 0;
        if (!g->nxg[l] || !c->effn) continue;
        double w = c->effn[l];
        c->effn[l] = w + 0.5;
        double a = ac_dnas_metric_at(p, c, m);
        c->effn[l] = w - 0.5;
        ge[L + l] = a - ac_dnas_metric_at(p, c, m);
        c->effn[l] = w;
    }
    return 0;
}

/* Chain rule to log_alpha: dP/dla = P (1 - P). */
static void chain(const ac_dnas_gates *g, const ac_arch *b, const expect_t *x, const double *D, const double *gh,
                  const double *gk, const double *gf, const double *ge, double ghid, double *grad) {
    int L = g->L;
    memset(grad, 0, sizeof(double) * g->np);
    for (int j = 0; j < g->nhg; j++) {
        double q = ac_dnas_keep_prob(g->la[g->hid_off + j]);
        grad[g->hid_off + j] = ghid * gsize(g->H, g->hm, j) * q * (1 - q);
    }
    for (int l = 0; l < L; l++) {
        const ac_layer_arch *bl = &b->layers[l];
        double dkv = gk[l] + gh[l] * grp_of(bl);
        for (int k = 0; k < g->nkv[l]; k++) {
            double q = ac_dnas_keep_prob(g->la[g->kv_off[l] + k]);
            grad[g->kv_off[l] + k] = dkv * q * (1 - q);
        }
        for (int j = 0; j < g->nfg[l]; j++) {
            double q = ac_dnas_keep_prob(g->la[g->ffn_off[l] + j]);
            grad[g->ffn_off[l] + j] = gf[l] * gsize(bl->ffn, g->fm, j) * q * (1 - q);
        }
        for (int k = 0; k < g->nex[l]; k++) {
            double q = ac_dnas_keep_prob(g->la[g->ex_off[l] + k]);
            grad[g->ex_off[l] + k] = ge[l] * q * (1 - q);
        }
        for (int j = 0; j < g->nxg[l]; j++) { /* gw: d metric / d expert width (set by width_grads) */
            double q = ac_dnas_keep_prob(g->la[g->xg_off[l] + j]);
            grad[g->xg_off[l] + j] = ge[L + l] * gsize(bl->expert_ffn, g->xfm[l], j) * q * (1 - q);
        }
        if (g->nmc[l] && g->nmc[l] <= 64) { /* d kbar / d theta_c = P(c) (d_c - kbar); heads fixed on deci */
            double pc[64], kbar = merge_expect(g, l, pc);
            for (int c = 0; c < g->nmc[l]; c++)
                grad[g->mc_off[l] + c] = gk[l] * pc[c] * (g->mkv[g->mc_off[l] + c] - kbar);
        }
        if (g->gate_depth && bl->n_heads) grad[g->attn_off + l] = D[l] * x->pa[l] * (1 - x->pa[l]);
        if (g->gate_depth && bl->ffn) grad[g->mlp_off + l] += D[L + l] * x->pm[l] * (1 - x->pm[l]);
    }
}

double ac_dnas_expected_metric(const ac_dnas_gates *g, const ac_search_problem *p, ac_metric m, double *grad) {
    if (g->hyb) return ac_dnas_hyb_expected_metric(g, p, m, grad); /* dnas_hybrid.c */
    const ac_arch *b = p->base;
    int L = g->L;
    ac_carch c;
    if (ac_carch_from_arch(b, &c, NULL)) return NAN;
    double *buf = calloc((EXPECT_FLOATS + 7) * L + 4, sizeof(double));
    if (!buf) {
        ac_carch_free(&c);
        return NAN;
    }
    expect_t x;
    expect(g, b, buf, &x);
    double *D = buf + EXPECT_FLOATS * L, *gh = D + 2 * L, *gk = gh + L, *gf = gk + L, *ge = gf + L, ghid = 0;
    fill_carch(g, b, &x, &c);
    double v = expected_value(p, m, &c, &x, D);
    if (grad && width_grads(g, p, m, &c, &x, D, gh, gk, gf, ge, &ghid))
        v = NAN;
    else if (grad)
        chain(g, b, &x, D, gh, gk, gf, ge, ghid, grad);
    free(buf);
    ac_carch_free(&c);
    return v;
}

json_t *ac_dnas_expected_arch_json(const ac_dnas_gates *g, const ac_arch *b) {
    if (g->hyb) return ac_dnas_hyb_expected_json(g, b);
    double *buf = calloc(EXPECT_FLOATS * g->L + 1, sizeof(double));
    if (!buf) return NULL;
    expect_t x;
    expect(g, b, buf, &x);
    json_t *layers = json_array();
    for (int l = 0; l < g->L; l++) {
        const ac_layer_arch *bl = &b->layers[l];
        double heads = g->gate_kv ? x.kv[l] * grp_of(bl) : bl->n_heads;
        json_t *o = json_pack("{s:f,s:f,s:f,s:f,s:f}", "kv_heads", x.pa[l] * x.kv[l], "heads", x.pa[l] * heads, "ffn",
                              x.pm[l] * x.ffn[l], "attn_keep", x.pa[l], "ffn_keep", x.pm[l]);
        if (bl->n_experts) json_object_set_new(o, "experts", json_real(x.ex[l]));
        if (bl->n_experts) json_object_set_new(o, "expert_ffn", json_real(x.ew[l]));
        json_array_append_new(layers, o);
    }
    json_t *o = json_pack("{s:f,s:o}", "hidden", x.hidden, "layers", layers);
    free(buf);
    return o;
}

/* ---- discretisation ---- */

static const double *g_key;
static int by_key_desc(const void *a, const void *b) {
    double x = g_key[*(const int *)a], y = g_key[*(const int *)b];
    if (x != y) return x > y ? -1 : 1;
    return *(const int *)a - *(const int *)b;
}

/* idx[0..n) = 0..n-1 sorted by key desc (stable on index). */
static void rank_by(const double *key, int n, int *idx) {
    for (int i = 0; i < n; i++) idx[i] = i;
    g_key = key;
    qsort(idx, n, sizeof(int), by_key_desc);
}

static int copy_ints(int **dst, const int *src, int n) {
    *dst = malloc(sizeof(int) * (n + 1));
    if (!*dst) return -1;
    memcpy(*dst, src, sizeof(int) * n);
    return 0;
}

static int copy_dbls(double **dst, const double *src, int n) {
    *dst = malloc(sizeof(double) * (n + 1));
    if (!*dst) return -1;
    memcpy(*dst, src, sizeof(double) * n);
    return 0;
}

/* Deep copy of an importance (the curves the repair scores moves by, and
 * the orders prune reads). */
/* d's Minitron head and FFN orders: copies of s's (none when s has none). */
static int mt_copy(ac_importance *d, const ac_importance *s, const ac_arch *b) {
    int L = s->n_layers;
    if (!s->head_order || !s->mt_ffn_order) return 0;
    d->head_order = calloc(L, sizeof(int *));
    d->head_score = calloc(L, sizeof(double *));
    d->mt_ffn_order = calloc(L, sizeof(int *));
    d->mt_ffn_score = calloc(L, sizeof(double *));
    int bad = !d->head_order || !d->head_score || !d->mt_ffn_order || !d->mt_ffn_score;
    for (int l = 0; l < L && !bad; l++) {
        int nh = b->layers[l].n_heads, F = b->layers[l].ffn;
        bad |= copy_ints(&d->head_order[l], s->head_order[l], nh) || copy_dbls(&d->head_score[l], s->head_score[l], nh);
        bad |= copy_ints(&d->mt_ffn_order[l], s->mt_ffn_order[l], F) ||
               copy_dbls(&d->mt_ffn_score[l], s->mt_ffn_score[l], F);
    }
    if (!bad && s->mt_hid_order)
        bad |= copy_ints(&d->mt_hid_order, s->mt_hid_order, s->hidden) ||
               copy_dbls(&d->mt_hid_score, s->mt_hid_score, s->hidden);
    return bad ? -1 : 0;
}

/* d's expert orders and scores: s's (NULL rows of dense layers stay NULL), or,
 * with s == NULL, the identity order of every MoE layer; and s's expert
 * channel orders when it has them. */
static int experts_copy(ac_importance *d, const ac_importance *s, const ac_arch *b) {
    int L = b->n_layers, bad = 0;
    d->expert_order = calloc(L, sizeof(int *));
    d->expert_score = calloc(L, sizeof(double *));
    if (!d->expert_order || !d->expert_score) return -1;
    if (s && s->echan_order && s->echan_score) {
        if (!(d->echan_order = calloc(L, sizeof(int *))) || !(d->echan_score = calloc(L, sizeof(double *)))) return -1;
        for (int l = 0; l < L && !bad; l++) {
            int n = b->layers[l].n_experts * b->layers[l].expert_ffn;
            if (n && s->echan_order[l])
                bad |= copy_ints(&d->echan_order[l], s->echan_order[l], n) ||
                       copy_dbls(&d->echan_score[l], s->echan_score[l], n);
        }
    }
    for (int l = 0; l < L && !bad; l++) {
        int E = b->layers[l].n_experts;
        if (!E || (s && !s->expert_order[l])) continue;
        if (s)
            bad |= copy_ints(&d->expert_order[l], s->expert_order[l], E) ||
                   (s->expert_score && s->expert_score[l] && copy_dbls(&d->expert_score[l], s->expert_score[l], E));
        else {
            bad |= !(d->expert_order[l] = malloc(sizeof(int) * E));
            for (int x = 0; !bad && x < E; x++) d->expert_order[l][x] = x;
        }
    }
    return bad ? -1 : 0;
}

/* d's shared-expert channel orders and scores: copies of s's (NULL rows stay NULL). */
static int shared_copy(ac_importance *d, const ac_importance *s, const ac_arch *b) {
    int L = b->n_layers, Fs = b->shared_ffn, bad = 0;
    if (!s->sh_order) return 0;
    if (!(d->sh_order = calloc(L, sizeof(int *))) || !(d->sh_score = calloc(L, sizeof(double *)))) return -1;
    for (int l = 0; l < L && !bad; l++)
        if (s->sh_order[l])
            bad |= copy_ints(&d->sh_order[l], s->sh_order[l], Fs) || copy_dbls(&d->sh_score[l], s->sh_score[l], Fs);
    return bad ? -1 : 0;
}

/* d's Mamba head orders and scores: copies of s's (NULL rows stay NULL). */
static int ssm_copy(ac_importance *d, const ac_importance *s, const ac_arch *b) {
    int L = b->n_layers, bad = 0;
    if (!s->ssm_head_order) return 0;
    d->ssm_head_order = calloc(L, sizeof(int *));
    d->ssm_head_score = calloc(L, sizeof(double *));
    d->ssm_chan_score = calloc(L, sizeof(double *));
    if (!d->ssm_head_order || !d->ssm_head_score || !d->ssm_chan_score) return -1;
    for (int l = 0; l < L && !bad; l++) {
        int nh = b->layers[l].ssm_heads;
        if (!nh || !s->ssm_head_order[l]) continue;
        bad |= copy_ints(&d->ssm_head_order[l], s->ssm_head_order[l], nh) ||
               copy_dbls(&d->ssm_head_score[l], s->ssm_head_score[l], nh) ||
               (s->ssm_chan_score && s->ssm_chan_score[l] &&
                copy_dbls(&d->ssm_chan_score[l], s->ssm_chan_score[l], nh * b->ssm_head_dim));
    }
    return bad ? -1 : 0;
}

static int imp_copy(ac_importance *d, const ac_importance *s, const ac_arch *b) {
    int L = s->n_layers;
    *d = *s;
    d->kv_order = calloc(L, sizeof(int *));
    d->kv_score = calloc(L, sizeof(double *));
    d->ffn_order = calloc(L, sizeof(int *));
    d->ffn_score = calloc(L, sizeof(double *));
    d->hid_order = NULL;
    d->hid_score = NULL;
    d->layer_bi = NULL;
    d->attn_sens = NULL;
    d->ffn_sens = NULL;
    d->merge_n = NULL;
    d->merge_r = NULL;
    d->merge_sens = NULL;
    d->ssm_sens = NULL; /* (copied below) */
    d->head_order = d->mt_ffn_order = NULL; /* Minitron's orders (when present): deep-copied below */
    d->head_score = d->mt_ffn_score = NULL;
    d->mt_hid_order = NULL;
    d->mt_hid_score = NULL;
    d->expert_order = NULL; /* (deep-copied below, with the expert channel orders) */
    d->expert_score = NULL;
    d->echan_order = NULL;
    d->echan_score = NULL;
    d->ssm_head_order = NULL; /* (deep-copied below) */
    d->ssm_head_score = d->ssm_chan_score = NULL;
    d->sh_order = NULL; /* (deep-copied below) */
    d->sh_score = NULL;
    d->ssm_dim_order = NULL; /* (ac_dnas_orders sets it and lat_order from the gates) */
    d->lat_order = NULL;
    int bad = ssm_copy(d, s, b) || shared_copy(d, s, b) ||
              !d->kv_order || !d->kv_score || !d->ffn_order || !d->ffn_score || mt_copy(d, s, b) ||
              (s->expert_order && experts_copy(d, s, b));
    for (int l = 0; l < L && !bad; l++) {
        int nkv = b->layers[l].n_kv_heads, F = b->layers[l].ffn;
        bad |= copy_ints(&d->kv_order[l], s->kv_order[l], nkv) || copy_dbls(&d->kv_score[l], s->kv_score[l], nkv);
        bad |= copy_ints(&d->ffn_order[l], s->ffn_order[l], F) || copy_dbls(&d->ffn_score[l], s->ffn_score[l], F);
    }
    if (!bad) {
        bad |= copy_ints(&d->hid_order, s->hid_order, s->hidden) || copy_dbls(&d->hid_score, s->hid_score, s->hidden);
        bad |= copy_dbls(&d->layer_bi, s->layer_bi, L);
        d->attn_sens = malloc(sizeof *d->attn_sens * L);
        d->ffn_sens = malloc(sizeof *d->ffn_sens * L);
        if (s->merge_n) { /* (none in a hybrid's: no loss curves) */
            d->merge_n = malloc(sizeof(int) * L);
            d->merge_r = malloc(sizeof *d->merge_r * L);
            d->merge_sens = malloc(sizeof *d->merge_sens * L);
            bad |= !d->merge_n || !d->merge_r || !d->merge_sens;
        }
        bad |= !d->attn_sens || !d->ffn_sens;
        if (s->ssm_sens && (d->ssm_sens = malloc(sizeof *d->ssm_sens * L)))
            memcpy(d->ssm_sens, s->ssm_sens, sizeof *d->ssm_sens * L);
        bad |= s->ssm_sens && !d->ssm_sens;
    }
    if (bad) {
        ac_importance_free(d);
        return -1;
    }
    memcpy(d->attn_sens, s->attn_sens, sizeof *d->attn_sens * L);
    memcpy(d->ffn_sens, s->ffn_sens, sizeof *d->ffn_sens * L);
    if (!s->merge_n) return 0;
    memcpy(d->merge_n, s->merge_n, sizeof(int) * L);
    memcpy(d->merge_r, s->merge_r, sizeof *d->merge_r * L);
    memcpy(d->merge_sens, s->merge_sens, sizeof *d->merge_sens * L);
    return 0;
}

/* Reorder blocks of an importance ranking by gate score: order gets the
 * blocks (of m units of rank) best gate first, each block's units in
 * their importance order. */
static int order_blocks(const int *rank_order, int n, int m, const double *la, int *order) {
    int nb = (n + m - 1) / m, *bi = malloc(sizeof(int) * (nb + 1));
    if (!bi) return -1;
    rank_by(la, nb, bi);
    int k = 0;
    for (int i = 0; i < nb; i++)
        for (int r = bi[i] * m; r < n && r < (bi[i] + 1) * m; r++) order[k++] = rank_order[r];
    free(bi);
    return 0;
}

int ac_dnas_round_grid(double v, int mult, int max) {
    if (max <= mult) return v >= 0.5 * max ? max : 0;
    int r = (int)lround(v / mult) * mult;
    return r < 0 ? 0 : r > max ? max : r;
}

static void discrete_arch(const ac_dnas_gates *g, const ac_search_problem *p, const expect_t *x, ac_arch *a) {
    const ac_arch *b = p->base;
    int L = g->L, uni = p->opts.target == AC_EXPORT_LLAMA;
    double mkv = 0, mf = 0;
    for (int l = 0; l < L; l++) {
        const ac_layer_arch *bl = &b->layers[l];
        mkv += bl->n_kv_heads ? x->kv[l] / bl->n_kv_heads : 0;
        mf += bl->ffn ? x->ffn[l] / bl->ffn : 0;
    }
    for (int l = 0; l < L; l++) {
        const ac_layer_arch *bl = &b->layers[l];
        ac_layer_arch *al = &a->layers[l];
        double kv = uni ? mkv / L * bl->n_kv_heads : x->kv[l], f = uni ? mf / L * bl->ffn : x->ffn[l];
        int k = (int)lround(kv);
        if (g->nmc[l]) { /* deci: the most likely merge choice (a divisor: a valid n_heads_in_group) */
            int o = g->mc_off[l], best = 0;
            for (int c = 1; c < g->nmc[l]; c++)
                if (g->la[o + c] > g->la[o + best]) best = c;
            k = g->mkv[o + best];
        } else if (!g->gate_kv)
            k = (int)g->kv_on[l];
        if (k > bl->n_kv_heads) k = bl->n_kv_heads;
        if (uni && k < 1) k = 1;
        if (x->pa[l] < 0.5 || !bl->n_heads) k = 0;
        al->n_kv_heads = k;
        al->n_heads = g->gate_kv ? k * grp_of(bl) : k ? bl->n_heads : 0;
        int fw = x->pm[l] < 0.5 ? 0 : ac_dnas_round_grid(f, g->fm, bl->ffn);
        if (uni && fw < 1 && x->pm[l] >= 0.5) fw = bl->ffn < g->fm ? bl->ffn : g->fm; /* llama: a kept layer's FFN */
        al->ffn = fw;
    }
    /* experts: one count for the model (every export target holds one), the mean of the expected counts */
    double ex = 0;
    int nmoe = 0;
    for (int l = 0; l < L; l++)
        if (g->nex[l]) ex += x->ex[l], nmoe++;
    for (int l = 0; nmoe && l < L; l++)
        if (g->nex[l]) {
            int k = (int)lround(ex / nmoe);
            a->layers[l].n_experts = k < b->top_k ? b->top_k : k > b->layers[l].n_experts ? b->layers[l].n_experts : k;
        }
    double ew = 0; /* one expert width: the mean kept share, on each layer's group grid */
    int nw = 0;
    for (int l = 0; l < L; l++)
        if (g->nxg[l]) ew += x->ew[l] / b->layers[l].expert_ffn, nw++;
    for (int l = 0; nw && l < L; l++)
        if (g->nxg[l]) {
            int Fe = b->layers[l].expert_ffn, m = g->xfm[l], w = (int)lround(ew / nw * Fe / m) * m;
            a->layers[l].expert_ffn = w < m ? m : w > Fe ? Fe : w;
        }
    if (g->gate_hid) {
        int h = (int)lround(x->hidden / g->hm) * g->hm;
        a->hidden = h < g->hm ? g->hm : h > b->hidden ? b->hidden : h;
    }
    int any = 0, best = 0;
    for (int l = 0; l < L; l++) {
        any |= a->layers[l].n_heads > 0;
        if (x->pa[l] > x->pa[best]) best = l;
    }
    int gguf = p->opts.target == AC_EXPORT_GGUF;
    if (gguf) best = 0; /* llama.cpp's deci runtime needs attention in layer 0 */
    if ((!any || gguf) && !a->layers[best].n_heads && b->layers[best].n_heads) {
        const ac_layer_arch *bl = &b->layers[best];
        a->layers[best].n_kv_heads = g->gate_kv ? 1 : (int)g->kv_on[best];
        a->layers[best].n_heads = g->gate_kv ? grp_of(bl) : bl->n_heads;
        if (uni && !a->layers[best].ffn) a->layers[best].ffn = bl->ffn < g->fm ? bl->ffn : g->fm; /* the whole layer */
    }
    /* llama: a layer's one gate (tie_depth) removes the whole layer, a
     * mixture-of-experts layer's experts with its attention (the expert
     * count above is set on every MoE layer) */
    for (int l = 0; uni && l < L; l++)
        if (b->layers[l].n_experts && b->layers[l].n_heads && !a->layers[l].n_heads)
            a->layers[l] = (ac_layer_arch){0, 0, 0, 0, 0, 0};
    /* and mis-runs a layer that keeps attention without its FFN, or a last layer without one (search.c) */
    for (int l = 0; gguf && l < L; l++)
        if ((a->layers[l].n_heads || l == L - 1) && !a->layers[l].ffn && b->layers[l].ffn)
            a->layers[l].ffn = b->layers[l].ffn < g->fm ? b->layers[l].ffn : g->fm;
}

int ac_dnas_orders(const ac_dnas_gates *g, const ac_importance *imp, const ac_arch *b, ac_importance *orders,
                   ac_err *e) {
    if (imp_copy(orders, imp, b)) return ac_errf(e, "out of memory");
    int rc = 0;
    for (int l = 0; l < g->L && !rc; l++) {
        if (g->nkv[l]) rank_by(g->la + g->kv_off[l], g->nkv[l], orders->kv_order[l]);
        if (b->layers[l].ffn)
            rc = order_blocks(imp->ffn_order[l], b->layers[l].ffn, g->fm, g->la + g->ffn_off[l], orders->ffn_order[l]);
    }
    if (!rc && g->gate_hid) rc = order_blocks(imp->hid_order, g->H, g->hm, g->la + g->hid_off, orders->hid_order);
    for (int l = 0; l < g->L && !rc; l++) { /* Mamba heads: in every group the slots by gate score */
        int hpg = g->nsg[l], *base = hpg ? malloc(sizeof(int) * hpg) : NULL;
        if (!hpg) continue;
        if (!orders->ssm_head_order && !(orders->ssm_head_order = calloc(g->L, sizeof(int *)))) rc = -1;
        if (!rc && !orders->ssm_head_order[l] &&
            !(orders->ssm_head_order[l] = malloc(sizeof(int) * b->layers[l].ssm_heads)))
            rc = -1;
        for (int gr = 0; !rc && base && gr * hpg < b->layers[l].ssm_heads; gr++) {
            for (int j = 0; j < hpg; j++) base[j] = ac_dnas_ssm_head(imp, b, l, gr, j);
            rc = order_blocks(base, hpg, 1, g->la + g->sg_off[l], orders->ssm_head_order[l] + gr * hpg);
        }
        rc |= !base;
        free(base);
    }
    for (int l = 0; l < g->L && !rc; l++) { /* Mamba head dims by gate score */
        if (!g->npd[l]) continue;
        if (!orders->ssm_dim_order && !(orders->ssm_dim_order = calloc(g->L, sizeof(int *)))) rc = -1;
        if (!rc && !(orders->ssm_dim_order[l] = malloc(sizeof(int) * g->npd[l]))) rc = -1;
        if (!rc) rank_by(g->la + g->pd_off[l], g->npd[l], orders->ssm_dim_order[l]);
    }
    for (int l = 0; l < g->L && !rc; l++) { /* latent channels: blocks (in index order) by gate score */
        int Lt = b->moe_latent, *base = g->nltg[l] ? malloc(sizeof(int) * Lt) : NULL;
        if (!g->nltg[l]) continue;
        if (!orders->lat_order && !(orders->lat_order = calloc(g->L, sizeof(int *)))) rc = -1;
        if (!rc && !(orders->lat_order[l] = malloc(sizeof(int) * Lt))) rc = -1;
        for (int c = 0; !rc && base && c < Lt; c++) base[c] = c;
        if (!rc && base) rc = order_blocks(base, Lt, g->ltm, g->la + g->ltg_off[l], orders->lat_order[l]);
        rc |= !base;
        free(base);
    }
    for (int l = 0; l < g->L && !rc; l++) { /* shared-expert channels: rank blocks by gate score */
        int Fs = b->shared_ffn, *base = g->nshg[l] ? malloc(sizeof(int) * Fs) : NULL;
        if (!g->nshg[l]) continue;
        if (!orders->sh_order && !(orders->sh_order = calloc(g->L, sizeof(int *)))) rc = -1;
        if (!rc && !orders->sh_order[l] && !(orders->sh_order[l] = malloc(sizeof(int) * Fs))) rc = -1;
        for (int r = 0; !rc && base && r < Fs; r++) base[r] = shared_at(imp, l, r);
        if (!rc && base) rc = order_blocks(base, Fs, g->shm, g->la + g->shg_off[l], orders->sh_order[l]);
        rc |= !base;
        free(base);
    }
    for (int l = 0; l < g->L && !rc; l++) { /* experts by gate score (every MoE layer has an order row then) */
        if (!g->nex[l] && !g->nxg[l]) continue;
        if (!orders->expert_order) rc = experts_copy(orders, NULL, b);
        if (!rc && g->nex[l] && !orders->expert_order[l])
            rc = !(orders->expert_order[l] = malloc(sizeof(int) * g->nex[l]));
        if (!rc && g->nex[l]) rank_by(g->la + g->ex_off[l], g->nex[l], orders->expert_order[l]);
        int E = b->layers[l].n_experts, Fe = b->layers[l].expert_ffn;
        if (rc || !g->nxg[l]) continue;
        /* expert width: each expert's rank blocks by gate score (every expert alike), each block in its own order */
        int *base = malloc(sizeof(int) * ((size_t)E * Fe + 1));
        if (!orders->echan_order && !(orders->echan_order = calloc(g->L, sizeof(int *)))) rc = -1;
        if (!rc && !orders->echan_order[l] && !(orders->echan_order[l] = malloc(sizeof(int) * ((size_t)E * Fe + 1))))
            rc = -1;
        for (int x = 0; !rc && base && x < E; x++)
            for (int r = 0; r < Fe; r++) base[(size_t)x * Fe + r] = echan_at(imp, l, x, Fe, r);
        for (int x = 0; !rc && base && x < E; x++)
            rc = order_blocks(base + (size_t)x * Fe, Fe, g->xfm[l], g->la + g->xg_off[l],
                              orders->echan_order[l] + (size_t)x * Fe);
        rc |= !base;
        free(base);
    }
    if (rc) {
        ac_importance_free(orders);
        return ac_errf(e, "out of memory");
    }
    return 0;
}

/* Drop the kept layer of a with the lowest depth gate (never the last one
 * kept); 0 when none can go. */
static int drop_weakest_layer(const ac_dnas_gates *g, ac_arch *a) {
    int kept = 0, worst = -1;
    for (int l = 0; l < g->L; l++) {
        const ac_layer_arch *al = &a->layers[l];
        if (!al->n_heads && !al->ffn && !al->n_experts) continue;
        kept++;
        if (worst < 0 || g->la[g->attn_off + l] < g->la[g->attn_off + worst]) worst = l;
    }
    if (kept < 2) return 0;
    a->layers[worst] = (ac_layer_arch){0, 0, 0, 0, 0, 0}; /* an MoE layer's experts too */
    return 1;
}

int ac_dnas_discretise(const ac_dnas_gates *g, const ac_search_problem *p, ac_search_result *r, ac_importance *orders,
                       ac_err *e) {
    const ac_arch *b = p->base;
    int L = g->L;
    memset(r, 0, sizeof *r);
    memset(orders, 0, sizeof *orders);
    double *buf = calloc(EXPECT_FLOATS * L + 1, sizeof(double));
    if (!buf) return ac_errf(e, "out of memory");
    expect_t x;
    expect(g, b, buf, &x);
    if (ac_arch_copy(&r->arch, b, e)) {
        free(buf);
        return -1;
    }
    if (!g->hyb) discrete_arch(g, p, &x, &r->arch);
    free(buf);
    if (ac_dnas_orders(g, p->imp, b, orders, e)) {
        ac_search_result_free(r);
        return -1;
    }
    if (g->hyb) { /* one width per layer type, its own repair (dnas_hybrid.c); no loss curves */
        ac_dnas_hyb_discretise(g, p, r);
        r->pred_loss = ac_search_pred_loss(p, &r->arch);
        return 0;
    }
    /* repair scores moves with the surrogate curves; which units a move
     * removes is the gate order above */
    r->feasible = ac_search_repair(p, &r->arch, &r->cost);
    /* llama: when no uniform width meets the limits with the layers kept,
     * whole layers go, the lowest layer gate first (repair then refills) */
    while (!r->feasible && g->tie_depth && drop_weakest_layer(g, &r->arch))
        r->feasible = ac_search_repair(p, &r->arch, &r->cost);
    r->pred_loss = ac_search_pred_loss(p, &r->arch);
    return 0;
}

/* ---- the search ---- */

/* The limits a problem sets: rows of the constraint table (constraints.h). */
typedef struct {
    const ac_constraint *c;
    double limit;
} dcons;

static int dcons_list(const ac_constraints *l, dcons *c) {
    int n = 0;
    for (const ac_constraint *t = ac_constraint_table(); t < ac_constraint_table() + AC_NCONSTRAINTS; t++) {
        double v = ac_constraint_limit(t, l);
        if (v > 0) c[n++] = (dcons){t, v};
    }
    return n;
}

static double urand(unsigned long long *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return ((*s >> 11) + 0.5) / 9007199254740992.0;
}

/* log_alpha from the surrogate search's architecture: its kept units
 * (the most important ones, as prune keeps them) on, the rest off. */
static void init_from_arch(ac_dnas_gates *g, const ac_arch *b, const ac_arch *a, const ac_importance *imp,
                           double mc_off) {
    const double on = 2.0, off = -3.0;
    for (int l = 0; l < g->L; l++) {
        const ac_layer_arch *bl = &b->layers[l], *al = &a->layers[l];
        for (int k = 0; k < g->nkv[l]; k++) g->la[g->kv_off[l] + k] = off;
        for (int k = 0; k < g->nkv[l] && k < al->n_kv_heads; k++) g->la[g->kv_off[l] + imp->kv_order[l][k]] = on;
        if (!g->gate_kv && !g->nmc[l]) g->kv_on[l] = al->n_kv_heads ? al->n_kv_heads : bl->n_kv_heads;
        for (int c = 0; c < g->nmc[l];
             c++) { /* the surrogate's merge choice (every head kept when it drops attention) */
            int want = al->n_kv_heads ? al->n_kv_heads : bl->n_kv_heads;
            g->la[g->mc_off[l] + c] = g->mkv[g->mc_off[l] + c] == want ? on : mc_off;
        }
        for (int k = 0; k < g->nex[l]; k++) /* the surrogate's experts (the most important ones) on */
            g->la[g->ex_off[l] + k] = k < al->n_experts ? on : off;
        for (int k = 0; k < g->nex[l] && imp->expert_order && imp->expert_order[l]; k++)
            g->la[g->ex_off[l] + imp->expert_order[l][k]] = k < al->n_experts ? on : off;
        for (int j = 0; j < g->nxg[l]; j++) /* the surrogate's expert width (its best channels) */
            g->la[g->xg_off[l] + j] = j * g->xfm[l] < al->expert_ffn ? on : off;
        int kf = (al->ffn + g->fm / 2) / g->fm;
        for (int j = 0; j < g->nfg[l]; j++) g->la[g->ffn_off[l] + j] = j < kf || al->ffn == bl->ffn ? on : off;
        if (g->gate_depth) {
            g->la[g->attn_off + l] = al->n_heads ? on : off;
            g->la[g->mlp_off + l] = al->ffn ? on : off;
        }
    }
    for (int j = 0; j < g->nhg; j++) g->la[g->hid_off + j] = j * g->hm < a->hidden ? on : off;
}

/* ---- the gate trainer: train.c on the CPU, or the CUDA plugin's ---- */

typedef struct {
    ac_trainer t, tt;      /* CPU: the gated model; the teacher (only online with cotrain) */
    const ac_cuda_api *cu; /* the plugin when the gates train on CUDA device 0, else NULL */
    acc_trainer *ct, *ctt; /* CUDA: the same two */
    ac_gates hg, hdg;      /* CUDA: host gates and gate gradients (train.h's layout) */
    float *hgmem;
    ac_model *src, *tm;     /* the unpruned model (only read); the one the gated trainer holds (src or the copy) */
    ac_model kvm, kvd, kvg; /* deci merge: K/V of the merge layers in fp32: originals, mixture, gradients (the
                             * CUDA trainer's, or the frozen CPU trainer's, which reads kvd instead of src's) */
    int merge;              /* any merge choice */
    double kv_bytes;        /* the three K/V shadows */
    float *teacher;         /* [nb][B*T*V] cached teacher logits, or one batch when online */
    int *tok, nb, nwin, nbatches, online;
    double *z, *u, *dzla, *dz, *gl, *cg, *m1, *m2, *q; /* q: the soft merge samples (straight-through) */
    ac_model copy;                                     /* cotrain: the trained copy */
    ac_adamw opt;                                      /* cotrain on the CPU; on CUDA its schedule */
    char er[512];
} run_t;

/* Bytes of one K/V shadow (below). */
static double kv_shadow_bytes(const ac_arch *a, const ac_dnas_gates *g) {
    double n = 0;
    for (int l = 0; l < a->n_layers; l++)
        if (g->nmc[l]) n += 2.0 * a->layers[l].n_kv_heads * a->head_dim * (a->hidden + (a->qkv_bias ? 1 : 0));
    return 4 * n;
}

/* Shadow model over arch a holding only the K/V tensors of g's merge
 * layers in fp32 (converted from m's dtype when m != NULL). */
static int kv_shadow(ac_model *sh, const ac_arch *a, const ac_dnas_gates *g, const ac_model *m) {
    memset(sh, 0, sizeof *sh);
    sh->a = *a;
    sh->L = calloc(a->n_layers, sizeof(ac_layer_w));
    if (!sh->L) return -1;
    size_t H = a->hidden, hd = a->head_dim;
    for (int l = 0; l < a->n_layers; l++) {
        if (!g->nmc[l]) continue;
        size_t KV = (size_t)a->layers[l].n_kv_heads * hd;
        float **d[4] = {&sh->L[l].wk, &sh->L[l].wv, &sh->L[l].bk, &sh->L[l].bv};
        size_t n[4] = {KV * H, KV * H, a->qkv_bias ? KV : 0, a->qkv_bias ? KV : 0};
        float *s[4] = {0};
        if (m) kv_tensors(m, l, s, (size_t[4]){0});
        for (int k = 0; k < 4; k++) {
            if (!n[k]) continue;
            if (!(*d[k] = malloc(sizeof(float) * n[k]))) return -1;
            if (m) ac_to_f32(*d[k], s[k], k < 2 ? (st_dtype)ac_model_wdt(m) : ST_F32, n[k], NULL); /* biases: fp32 */
        }
    }
    return 0;
}

static void kv_shadow_free(ac_model *sh) {
    for (int l = 0; sh->L && l < sh->a.n_layers; l++) {
        free(sh->L[l].wk);
        free(sh->L[l].wv);
        free(sh->L[l].bk);
        free(sh->L[l].bv);
    }
    free(sh->L);
    memset(sh, 0, sizeof *sh);
}

/* Layer l's gate row lengths: head, ffn, expert, echan, ssm, ssm_dim, shared, latent (train.h's ac_gates). */
static void hg_rows(const ac_arch *a, int l, size_t per[8]) {
    const ac_layer_arch *la = &a->layers[l];
    size_t moe = a->hybrid && la->n_experts;
    per[0] = la->n_heads, per[1] = la->ffn, per[2] = la->n_experts, per[3] = (size_t)la->n_experts * la->expert_ffn;
    per[4] = la->ssm_heads, per[5] = la->ssm_heads ? (size_t)a->ssm_head_dim : 0;
    per[6] = moe * a->shared_ffn, per[7] = moe * a->moe_latent;
}

/* Host gate buffers of arch a (train.h's layout; MoE layers' expert and
 * expert-channel gates too, and a hybrid's Mamba head, head-dim,
 * shared-expert and latent gates, set to 1: ac_dnas_set_gates writes only
 * the searched ones). */
static int hgates_alloc(run_t *R, const ac_arch *a) {
    int L = a->n_layers;
    size_t n = 2 * ((size_t)a->hidden + 2 * L), per[8];
    for (int l = 0; l < L; l++) {
        hg_rows(a, l, per);
        for (int k = 0; k < 8; k++) n += 2 * per[k];
    }
    ac_gates *gs[2] = {&R->hg, &R->hdg};
    float *p = R->hgmem = calloc(n + 1, sizeof(float));
    if (!p) return -1;
    for (size_t i = 0; i < n; i++) p[i] = 1;
    for (int k = 0; k < 2; k++) {
        ac_gates *q = gs[k];
        float ***rows[8] = {&q->head, &q->ffn, &q->expert, &q->echan, &q->ssm, &q->ssm_dim, &q->shared, &q->latent};
        for (int r = 0; r < 8; r++)
            if (!(*rows[r] = calloc(L + 1, sizeof(float *)))) return -1;
        q->hidden = p, p += a->hidden;
        q->attn = p, p += L;
        q->mlp = p, p += L;
        for (int l = 0; l < L; l++) {
            hg_rows(a, l, per);
            for (int r = 0; r < 8; r++) (*rows[r])[l] = per[r] ? p : NULL, p += per[r];
        }
    }
    return 0;
}

/* hgates_alloc's row arrays of q. */
static void hgates_free(ac_gates *q) {
    float **rows[8] = {q->head, q->ffn, q->expert, q->echan, q->ssm, q->ssm_dim, q->shared, q->latent};
    for (int r = 0; r < 8; r++) free(rows[r]);
}

static void run_free(run_t *R) {
    ac_trainer_free(&R->t);
    if (R->tt.m) ac_trainer_free(&R->tt);
    if (R->ct) R->cu->trainer_free(R->ct);
    if (R->ctt) R->cu->trainer_free(R->ctt);
    hgates_free(&R->hg), hgates_free(&R->hdg), free(R->hgmem);
    kv_shadow_free(&R->kvm);
    kv_shadow_free(&R->kvd);
    kv_shadow_free(&R->kvg);
    free(R->teacher);
    free(R->tok);
    double *d[] = {R->z, R->u, R->dzla, R->dz, R->gl, R->cg, R->m1, R->m2, R->q};
    for (size_t i = 0; i < sizeof d / sizeof *d; i++) free(d[i]);
    if (R->copy.L) ac_model_free(&R->copy);
    ac_adamw_free(&R->opt);
}

static int cu_fail(run_t *R, ac_err *e) { return ac_errf(e, "dnas on CUDA: %s", R->er); }

/* Gates z (one per log_alpha, merge choices as mixture weights) into the gated trainer. */
static int put_gates(run_t *R, const ac_dnas_gates *g, const ac_search_problem *p, const double *z, ac_err *e) {
    ac_dnas_set_gates(g, z, R->cu ? &R->hg : &R->t.gate, p->base, p->imp);
    if (R->cu && R->cu->trainer_gates(R->ct, &R->hg, NULL, 0, R->er, sizeof R->er)) return cu_fail(R, e);
    if (!R->merge) return 0;
    /* the mixture into the shadow the trainer reads (CUDA: uploaded below), or into the co-trained copy */
    ac_dnas_apply_merge(g, z, &R->kvm, R->cu || R->tm == R->src ? &R->kvd : R->tm);
    for (int l = 0; R->cu && l < g->L; l++) {
        float *d[4];
        size_t per[4], KV = (size_t)p->base->layers[l].n_kv_heads;
        int which[4] = {ACC_T_K, ACC_T_V, ACC_T_BK, ACC_T_BV};
        kv_tensors(&R->kvd, l, d, per);
        for (int k = 0; k < 4; k++)
            if (d[k] && R->cu->trainer_tensor(R->ct, l, which[k], d[k], NULL, KV * per[k], R->er, sizeof R->er))
                return cu_fail(R, e);
    }
    return 0;
}

/* Every gate 1 and every merge choice "keep all KV heads": the unpruned model. */
static int put_identity(run_t *R, const ac_dnas_gates *g, const ac_search_problem *p, ac_err *e) {
    for (int i = 0; i < g->np; i++) R->z[i] = g->mkv[i] ? 0 : 1;
    for (int l = 0; l < g->L; l++)
        if (g->nmc[l]) R->z[g->mc_off[l]] = 1; /* choice 0 */
    return put_gates(R, g, p, R->z, e);
}

/* Logits of a forward of tk (B x T) through the teacher's trainer (the
 * gated one unless a separate teacher exists) into out. */
static int teacher_logits(run_t *R, const int *tk, int B, int T, float *out, ac_err *e) {
    size_t per = (size_t)B * T * R->src->a.vocab;
    if (R->cu) {
        if (R->cu->trainer_forward(R->ctt ? R->ctt : R->ct, tk, B, T, out, R->er, sizeof R->er)) return cu_fail(R, e);
        return 0;
    }
    ac_trainer *t = R->tt.m ? &R->tt : &R->t;
    if (ac_train_forward(t, tk, B, T, e)) return -1;
    memcpy(out, t->logits, sizeof(float) * per);
    return 0;
}

/* Forward, KD loss to teacher, backward; d loss / d z into R->dz. */
static int gate_grad(run_t *R, const ac_dnas_gates *g, const ac_search_problem *p, const int *tk, int B, int T,
                     const float *teacher, double *task, ac_err *e) {
    const ac_cuda_api *cu = R->cu;
    if (cu) {
        if (cu->trainer_grad(R->ct, tk, NULL, teacher, B, T, 1.0f, 1.0f, 1.0f, task, R->er, sizeof R->er) ||
            cu->trainer_gates(R->ct, NULL, &R->hdg, 1, R->er, sizeof R->er))
            return cu_fail(R, e);
        ac_dnas_gate_grads_of(g, p->base, &R->hdg, p->imp, R->dz);
        for (int l = 0; R->merge && l < g->L; l++) {
            float *d[4];
            size_t per[4], KV = (size_t)p->base->layers[l].n_kv_heads;
            int which[4] = {ACC_T_K, ACC_T_V, ACC_T_BK, ACC_T_BV};
            kv_tensors(&R->kvg, l, d, per);
            for (int k = 0; k < 4; k++)
                if (d[k] && cu->trainer_tensor(R->ct, l, which[k], NULL, d[k], KV * per[k], R->er, sizeof R->er))
                    return cu_fail(R, e);
        }
        if (R->merge) ac_dnas_merge_grads(g, &R->kvm, &R->kvg, R->dz);
        return 0;
    }
    if (ac_train_forward(&R->t, tk, B, T, e)) return -1;
    *task = ac_train_loss(&R->t, NULL, teacher, 1.0f, 1.0f, 1.0f, NULL, NULL);
    ac_train_backward(&R->t);
    ac_dnas_gate_grads_of(g, p->base, &R->t.dgate, p->imp, R->dz);
    if (R->merge) ac_dnas_merge_grads(g, &R->kvm, &R->t.g, R->dz);
    return 0;
}

static int zero_grads(run_t *R, ac_err *e) {
    if (!R->cu) {
        ac_train_zero_grad(&R->t);
        return 0;
    }
    return R->cu->trainer_zero_grad(R->ct, R->er, sizeof R->er) ? cu_fail(R, e) : 0;
}

/* cotrain: one AdamW update of the copy's weights (the CPU optimizer, or
 * the device's with the same schedule). */
static int weight_step(run_t *R, long s, ac_err *e) {
    if (!R->cu) return ac_adamw_step(&R->opt, NULL, e);
    const ac_adamw_opts *o = &R->opt.o;
    if (R->cu->trainer_step(R->ct, ac_lr_at(o, s), o->beta1, o->beta2, o->eps, o->weight_decay, o->clip, s, NULL, R->er,
                            sizeof R->er))
        return cu_fail(R, e);
    return 0;
}

/* Windows of batch i (cycling through the calibration windows) into tk. */
static void batch_tokens(const run_t *R, const int *ids, int i, int B, int T, int *tk) {
    for (int j = 0; j < B; j++) memcpy(tk + j * T, ids + (size_t)((i * B + j) % R->nwin) * T, sizeof(int) * T);
}

/* Teacher logits of the unpruned model: cached for every batch the search
 * visits when they fit in teacher_cache_mib, else computed online each step (one
 * more forward per step). Checks the memory first (host; and the device's). */
static int teacher_plan(run_t *R, const ac_model *m, size_t n, const ac_dnas_opts *o, ac_err *e) {
    int B = o->batch, T = o->seq_len, V = m->a.vocab;
    R->nwin = (int)(n / T);
    if (R->nwin < 1) return ac_errf(e, "dnas: calibration text has %zu tokens; need at least search seq_len %d", n, T);
    size_t per = (size_t)B * T * V, cap = (size_t)o->teacher_cache_mib << 20;
    R->nbatches = (R->nwin + B - 1) / B;
    R->nb = R->nbatches < o->steps ? R->nbatches : o->steps;
    R->online = (size_t)R->nb * per * 4 > cap;
    if (R->online) R->nb = 1;
    /* host: the frozen trainer (activations, one layer's fp32 scratch; the weights are m's, read in their dtype),
     * or with cotrain the copy's trainer with its gradients (and a frozen teacher when online) */
    const ac_arch *a = &m->a;
    double frz = (double)ac_trainer_bytes_frozen(a, B, T);
    double tr = o->cotrain ? (double)ac_trainer_bytes(a, B, T) + (R->online ? frz : 0) : frz;
    double need = 4.0 * per * R->nb + (R->cu ? 0 : tr) + 3 * R->kv_bytes, dev = 0;
    if (o->cotrain) need += (R->cu ? 4.0 : 12.0) * ac_arch_params(a); /* the copy (and AdamW's two moments) */
    double have = ac_host_mem_available();
    if (have > 0 && need > 0.9 * have)
        return ac_errf(e,
                       "dnas: the gate search needs about %.3g GiB (training activations, teacher logits%s) "
                       "but %.3g GiB is available; lower search.dnas_batch or search.dnas_seq_len",
                       need / 1073741824.0, o->cotrain ? ", co-trained copy and its gradients" : "",
                       have / 1073741824.0);
    char name[128];
    int sms, cc;
    if (R->cu && !R->cu->device_info(0, name, sizeof name, &dev, &sms, &cc)) {
        /* each device trainer: weights, gradients, two moments, activations */
        double dneed = (double)ac_trainer_bytes(a, B, T) + 12.0 * ac_arch_params(a);
        dneed *= o->cotrain && R->online ? 2 : 1;
        if (dev > 0 && dneed > 0.9 * dev * 1073741824.0)
            return ac_errf(e,
                           "dnas: the gate search needs about %.3g GiB on %s but it has %.3g GiB; lower "
                           "search.dnas_batch or search.dnas_seq_len",
                           dneed / 1073741824.0, name, dev);
    }
    R->teacher = malloc(sizeof(float) * per * R->nb);
    R->tok = malloc(sizeof(int) * (size_t)B * T * R->nb);
    if (!R->teacher || !R->tok) return ac_errf(e, "dnas: out of memory for %d batches of teacher logits", R->nb);
    return 0;
}

/* The cached teacher logits (every gate 1, nothing merged: the trainers start so). */
static int teacher_cache(run_t *R, const int *ids, int B, int T, ac_err *e) {
    size_t per = (size_t)B * T * R->src->a.vocab;
    for (int i = 0; i < R->nb && !R->online; i++) {
        int *tk = R->tok + (size_t)i * B * T;
        batch_tokens(R, ids, i, B, T, tk);
        if (teacher_logits(R, tk, B, T, R->teacher + per * i, e)) return -1;
    }
    return 0;
}

/* Online teacher: batch s's tokens into R->tok and the unpruned model's
 * logits into R->teacher. */
static int teacher_online(run_t *R, const ac_dnas_gates *g, const ac_search_problem *p, const int *ids, int s, int B,
                          int T, ac_err *e) {
    batch_tokens(R, ids, (s - 1) % R->nbatches, B, T, R->tok);
    int own = R->cu ? !R->ctt : !R->tt.m; /* the gated trainer itself: the unpruned model first */
    if (own && put_identity(R, g, p, e)) return -1;
    return teacher_logits(R, R->tok, B, T, R->teacher, e);
}

static void emit_step(const ac_search_problem *p, const ac_dnas_gates *g, int s, int steps, double task, double lag,
                      const dcons *c, int nc, const double *val, const double *lambda, double secs) {
    json_t *met = json_object(), *mul = json_object();
    for (int j = 0; j < nc; j++) {
        json_object_set_new(met, c[j].c->metric, ac_constraint_report(c[j].c, val[j], c[j].limit));
        json_object_set_new(mul, c[j].c->metric, json_real(lambda[j]));
    }
    json_t *ev = json_pack("{s:s,s:i,s:i,s:f,s:f,s:f,s:o,s:o,s:o}", "phase", "dnas", "step", s, "steps", steps,
                           "task_loss", task, "loss", lag, "seconds", secs, "metrics", met, "multipliers", mul,
                           "architecture", ac_dnas_expected_arch_json(g, p->base));
    p->emit(p->ud, ev);
    json_decref(ev);
}

/* The merge choices' Gumbel-softmax temperature at step s of o->steps:
 * geometric from mc_tau0 to mc_tau1. */
static double merge_tau(const ac_dnas_opts *o, int s) {
    double f = o->steps > 1 ? (double)(s - 1) / (o->steps - 1) : 1;
    return o->mc_tau0 * pow(o->mc_tau1 / o->mc_tau0, f);
}

/* keep: the weights' gradients at the structure the gates round to now
 * (a unit whose keep probability is at least 0.5 whole, the rest 0; each
 * merge layer its likeliest choice) rather than at the step's sample. A
 * sampled gate between 0 and 1 scales its unit, and weights trained under
 * such scaling are off when the export keeps the unit whole (on the tiny
 * model the sampled-gate weights, kept, raised the held-out perplexity of
 * the search's structure from 58.13 to 59.09: docs/benchmarks.md). Rounding
 * the expected widths as the discretisation does instead did worse in the
 * bench (docs/benchmarks.md). One more forward and backward of the step's
 * batch. */
static int hard_grads(run_t *R, const ac_dnas_gates *g, const ac_search_problem *p, const int *tk, int B, int T,
                      const float *teacher, ac_err *e) {
    for (int i = 0; i < g->np; i++) R->z[i] = g->mkv[i] ? 0 : ac_dnas_keep_prob(g->la[i]) >= 0.5;
    for (int l = 0; l < g->L; l++)
        if (g->nmc[l]) ac_dnas_merge_sample(g, l, NULL, 1, 1, R->q, R->z);
    double task = 0;
    if (zero_grads(R, e) || put_gates(R, g, p, R->z, e)) return -1;
    return gate_grad(R, g, p, tk, B, T, teacher, &task, e);
}

/* One gate step: sample, forward, KD loss, backward; d loss/d log_alpha into R->gl. */
static int task_step(run_t *R, const ac_dnas_gates *g, const ac_search_problem *p, const ac_dnas_opts *o,
                     const int *ids, int s, unsigned long long *rng, double *task, ac_err *e) {
    int B = o->batch, T = o->seq_len, bi = (s - 1) % R->nb;
    size_t per = (size_t)B * T * p->base->vocab;
    if (R->online && teacher_online(R, g, p, ids, s, B, T, e)) return -1;
    if (zero_grads(R, e)) return -1;
    for (int i = 0; i < g->np; i++) {
        R->u[i] = urand(rng);
        R->z[i] = g->mkv[i] ? 0 : ac_dnas_sample(g->la[i], R->u[i], &R->dzla[i]);
    }
    double tau = merge_tau(o, s);
    int hard = o->mc_hard_from < 1 && s - 1 >= o->mc_hard_from * o->steps;
    for (int l = 0; l < g->L; l++)
        if (g->nmc[l]) ac_dnas_merge_sample(g, l, R->u + g->mc_off[l], tau, hard, R->q, R->z);
    if (put_gates(R, g, p, R->z, e)) return -1;
    if (gate_grad(R, g, p, R->tok + (size_t)bi * B * T, B, T, R->teacher + per * bi, task, e)) return -1;
    for (int i = 0; i < g->np; i++) R->gl[i] = g->mkv[i] ? 0 : R->dz[i] * R->dzla[i];
    /* Gumbel-softmax: d q_c / d theta_d = q_c (delta_cd - q_d) / tau; straight-through (mc_hard_from): dz taken at
     * the one-hot sample the network saw, passed on as if it were the soft sample q */
    for (int l = 0; l < g->L; l++) {
        int o0 = g->mc_off[l];
        double zdz = 0;
        for (int c = 0; c < g->nmc[l]; c++) zdz += R->q[o0 + c] * R->dz[o0 + c];
        for (int c = 0; c < g->nmc[l]; c++) R->gl[o0 + c] = R->q[o0 + c] * (R->dz[o0 + c] - zdz) / tau;
    }
    if (o->zero_task_grad) memset(R->gl, 0, sizeof(double) * g->np);
    if (o->cotrain && o->keep && hard_grads(R, g, p, R->tok + (size_t)bi * B * T, B, T, R->teacher + per * bi, e))
        return -1;
    if (o->cotrain && weight_step(R, s - 1, e)) return -1;
    return 0;
}

/* The trainers: the gated one on tm, a teacher on m when online with
 * cotrain; on the CPU (train.c) or the CUDA plugin's (o->cuda). */
static int trainers(run_t *R, ac_model *m, const ac_dnas_opts *o, ac_err *e) {
    int B = o->batch, T = o->seq_len, two = o->cotrain && R->online;
    if (!R->cu) { /* m frozen: read in its dtype, never written; the co-trained copy is fp32 */
        if (!o->cotrain ? ac_trainer_init_frozen(&R->t, R->tm, B, T, e) : ac_trainer_init(&R->t, R->tm, B, T, e))
            return -1;
        if (two && ac_trainer_init_frozen(&R->tt, m, B, T, e)) return -1;
        if (R->tm == m && R->merge) { /* the merge layers' K/V from the mixture, their gradients into kvg */
            R->t.ovr = R->kvd.L;
            for (int l = 0; l < m->a.n_layers; l++) {
                ac_layer_w *gw = &R->t.g.L[l], *s = &R->kvg.L[l];
                gw->wk = s->wk, gw->wv = s->wv, gw->bk = s->bk, gw->bv = s->bv;
            }
        }
    } else {
        size_t nr = (size_t)T * (m->a.head_dim / 2);
        float *cs = malloc(nr * sizeof *cs), *sn = malloc(nr * sizeof *sn);
        int rc = !cs || !sn ? ac_errf(e, "out of memory") : ac_rope_tables(&m->a, T, cs, sn, e);
        if (!rc && R->cu->trainer_create(0, R->tm, B, T, cs, sn, &R->ct, R->er, sizeof R->er)) rc = cu_fail(R, e);
        if (!rc && two && R->cu->trainer_create(0, m, B, T, cs, sn, &R->ctt, R->er, sizeof R->er)) rc = cu_fail(R, e);
        free(cs);
        free(sn);
        if (rc || hgates_alloc(R, &m->a)) return rc ? rc : ac_errf(e, "out of memory");
    }
    if (o->cotrain) {
        ac_adamw_opts ao;
        ac_adamw_defaults(&ao);
        ao.lr = ao.min_lr = (float)o->w_lr;
        ao.weight_decay = 0;
        ao.total_steps = o->steps;
        ac_adamw_init(&R->opt, &ao);
        if (!R->cu && ac_adamw_add_model(&R->opt, R->tm, &R->t.g, e)) return -1;
    }
    return 0;
}

static int setup(run_t *R, ac_dnas_gates *g, const ac_search_problem *p, ac_model *m, const int *ids, size_t n,
                 const ac_dnas_opts *o, ac_err *e) {
    R->src = R->tm = m;
    if (o->cuda) {
        const char *why;
        if (!(R->cu = ac_cuda(&why))) return ac_errf(e, "dnas: no CUDA device for the gate search: %s", why);
        if (!R->cu->trainer_create || !R->cu->trainer_forward || !R->cu->trainer_tensor || !R->cu->trainer_zero_grad)
            return ac_errf(e, "dnas: the CUDA plugin has no gate trainer (rebuild it)");
    }
    if (ac_dnas_gates_init(g, p->base, &p->opts, e)) return -1;
    if (o->init_surrogate && !g->hyb) {
        ac_search_problem q = *p;
        ac_search_result sr;
        q.emit = NULL;
        if (ac_search_autocompress(&q, &sr, e)) return -1;
        init_from_arch(g, p->base, &sr.arch, p->imp, o->mc_init_off);
        ac_search_result_free(&sr);
    }
    if (g->hyb && o->init_surrogate) { /* a hybrid: from the surrogate's structure where the curves were measured (its
                                        * calibration exact), else from Minitron's */
        ac_search_problem q = *p;
        ac_search_result sr;
        q.emit = NULL;
        if (ac_search_has_curves(p) ? ac_search_autocompress(&q, &sr, e) : ac_search_minitron(&q, &sr, e)) return -1;
        ac_dnas_hyb_init(g, p->base, &sr.arch, p->imp);
        ac_search_result_free(&sr);
    } else if (g->hyb)
        ac_dnas_hyb_init(g, p->base, NULL, p->imp);
    int np = g->np + 1;
    double **bufs[] = {&R->z, &R->u, &R->dzla, &R->dz, &R->gl, &R->cg, &R->m1, &R->m2, &R->q};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (!(*bufs[i] = calloc(np, sizeof(double)))) return ac_errf(e, "out of memory");
    for (int l = 0; l < g->L; l++) R->merge |= g->nmc[l] > 0;
    /* the mixture and gradient shadows serve the CUDA trainer and the frozen CPU trainer (which starts unmerged:
     * kvd a copy of m's); a co-trained CPU copy takes the mixture into its own K/V */
    int shadows = R->cu || !o->cotrain;
    int bad = R->merge && kv_shadow(&R->kvm, &m->a, g, m);
    bad = bad || (R->merge && shadows &&
                  (kv_shadow(&R->kvd, &m->a, g, R->cu ? NULL : m) || kv_shadow(&R->kvg, &m->a, g, NULL)));
    if (bad) return ac_errf(e, "out of memory");
    R->kv_bytes = R->merge ? kv_shadow_bytes(&m->a, g) : 0;
    if (o->cotrain) { /* train a copy (prune to the same architecture copies every weight, fp32 from any dtype) */
        if (ac_prune(m, &m->a, p->imp, &R->copy, e)) return -1;
        R->tm = &R->copy;
    } /* (a 16-bit hybrid too: the frozen trainer converts its layers and experts one at a time, train.h) */
    if (teacher_plan(R, m, n, o, e) || trainers(R, m, o, e)) return -1;
    return teacher_cache(R, ids, o->batch, o->seq_len, e);
}

/* The training loop (setup done): o->steps steps of task gradient plus
 * the augmented Lagrangian, Adam on log_alpha. tg (may be NULL) gets the
 * last step's task gradient. */
static int train_loop(run_t *R, ac_dnas_gates *g, const ac_search_problem *p, const int *ids, const ac_dnas_opts *o,
                      double *tg, ac_err *e) {
    dcons c[AC_NCONSTRAINTS];
    int nc = dcons_list(&p->limits, c), rc = 0, every = (o->steps + 199) / 200; /* at most 200 events */
    double lambda[AC_NCONSTRAINTS] = {0}, val[AC_NCONSTRAINTS] = {0}, t0 = ac_now(), last = -1e9;
    unsigned long long rng = 0x9E3779B97F4A7C15ULL ^ ((unsigned long long)p->opts.seed * 0x100000001B3ULL);
    for (int s = 1; s <= o->steps && !rc; s++) {
        double task = 0;
        if ((rc = task_step(R, g, p, o, ids, s, &rng, &task, e))) break;
        if (tg) memcpy(tg, R->gl, sizeof(double) * g->np);
        double lag = task;
        for (int j = 0; j < nc; j++) { /* augmented Lagrangian on the expected cost, dual ascent */
            val[j] = ac_dnas_expected_metric(g, p, c[j].c->m, R->cg);
            double gj = ac_constraint_g(c[j].c, val[j], c[j].limit), sgn = ac_constraint_dg(c[j].c, c[j].limit);
            double w = lambda[j] + o->mu * fmax(0, gj);
            lag += lambda[j] * gj + 0.5 * o->mu * fmax(0, gj) * fmax(0, gj);
            for (int i = 0; i < g->np; i++) R->gl[i] += w * sgn * R->cg[i];
            lambda[j] = fmax(0, lambda[j] + o->rho * gj);
        }
        for (int i = 0; i < g->np; i++) { /* Adam on log_alpha */
            R->m1[i] = 0.9 * R->m1[i] + 0.1 * R->gl[i];
            R->m2[i] = 0.999 * R->m2[i] + 0.001 * R->gl[i] * R->gl[i];
            double mh = R->m1[i] / (1 - pow(0.9, s)), vh = R->m2[i] / (1 - pow(0.999, s));
            g->la[i] = fmin(8, fmax(-8, g->la[i] - o->lr * mh / (sqrt(vh) + 1e-8)));
        }
        double now = ac_now() - t0;
        if (p->emit && (s % every == 0 || s == o->steps || now - last > 2.0)) {
            last = now;
            emit_step(p, g, s, o->steps, task, lag, c, nc, val, lambda, now);
        }
    }
    return rc;
}

/* cotrain with keep: the trained copy into r->trained (from the device
 * when it trained there), the deci merge layers' K/V back to the original
 * ones (the copy held the last step's mixture of them). */
static int keep_copy(run_t *R, const ac_dnas_gates *g, ac_search_result *r, ac_err *e) {
    if (R->cu && R->cu->trainer_download(R->ct, &R->copy, NULL, R->er, sizeof R->er)) return cu_fail(R, e);
    for (int l = 0; R->merge && l < g->L; l++) {
        if (!g->nmc[l]) continue;
        float *s[4], *d[4];
        size_t per[4], KV = (size_t)R->copy.a.layers[l].n_kv_heads;
        kv_tensors(&R->kvm, l, s, per);
        kv_tensors(&R->copy, l, d, per);
        for (int k = 0; k < 4; k++)
            if (s[k] && d[k]) memcpy(d[k], s[k], sizeof(float) * KV * per[k]);
    }
    if (!(r->trained = malloc(sizeof *r->trained))) return ac_errf(e, "out of memory");
    *r->trained = R->copy;
    memset(&R->copy, 0, sizeof R->copy);
    return 0;
}

static int check_args(const ac_search_problem *p, const ac_dnas_opts *o, ac_err *e) {
    dcons c[AC_NCONSTRAINTS];
    if (dcons_list(&p->limits, c) == 0) return ac_errf(e, "search: no constraints given");
    if (o->steps < 1 || o->batch < 1 || o->seq_len < 2)
        return ac_errf(e, "dnas: steps, batch and seq_len must be positive");
    return 0;
}

int ac_dnas_train_gates(const ac_search_problem *p, ac_model *m, const int *ids, size_t n, const ac_dnas_opts *o,
                        ac_dnas_gates *g, double *task_grad, ac_err *e) {
    memset(g, 0, sizeof *g);
    if (check_args(p, o, e)) return -1;
    run_t R = {0};
    int rc = setup(&R, g, p, m, ids, n, o, e);
    if (!rc) rc = train_loop(&R, g, p, ids, o, task_grad, e);
    run_free(&R);
    if (rc) ac_dnas_gates_free(g);
    return rc;
}

int ac_search_dnas(const ac_search_problem *p, ac_model *m, const int *ids, size_t n, const ac_dnas_opts *o,
                   ac_search_result *r, ac_importance *orders, ac_err *e) {
    memset(r, 0, sizeof *r);
    memset(orders, 0, sizeof *orders);
    if (check_args(p, o, e) || ac_search_check_tp(p, 1, e)) return -1;
    run_t R = {0};
    ac_dnas_gates g = {0};
    int rc = setup(&R, &g, p, m, ids, n, o, e);
    if (!rc) rc = train_loop(&R, &g, p, ids, o, NULL, e);
    if (!rc) rc = ac_dnas_discretise(&g, p, r, orders, e);
    if (!rc) {
        r->steps_run = o->steps;
        r->detail = json_pack("{s:s}", "gate_trainer", R.cu ? "cuda" : "cpu");
    }
    if (!rc && o->cotrain && o->keep && (rc = keep_copy(&R, &g, r, e))) {
        ac_search_result_free(r);
        ac_importance_free(orders);
    }
    run_free(&R);
    ac_dnas_gates_free(&g);
    return rc;
}

const char *ac_dnas_method(ac_search_method m) { return m == AC_SEARCH_SURROGATE ? "surrogate" : "dnas"; }

int ac_dnas_gates_ok(const ac_search_problem *p, const ac_model *m) {
    (void)p; /* the CUDA trainer has the softmax routers' MoE ops and every hybrid layer kind with its gates; the
              * frozen CPU trainer converts a resident model's experts to fp32 one at a time (train.h) */
    if (!ac_arch_has_moe(&m->a) || ac_arch_is_hybrid(&m->a)) return 1;
    return !m->a.router_sigmoid;
}

typedef struct {
    const ac_search_opts *so;
    const int *ids;
    size_t n;
} job_args;

static int job_search_one(const ac_search_problem *p, ac_model *m, void *ud, ac_search_result *r, ac_importance *orders,
                          ac_err *e) {
    const job_args *ja = ud;
    const ac_search_opts *so = ja->so;
    const int *ids = ja->ids;
    size_t n = ja->n;
    memset(orders, 0, sizeof *orders);
    /* a model the gate trainer cannot train here: the surrogate search
     * (measured curves) runs (job.c says so) */
    if (so->method != AC_SEARCH_DNAS || !ac_dnas_gates_ok(p, m)) return ac_search_autocompress(p, r, e);
    ac_dnas_opts o;
    ac_dnas_defaults(&o);
    if (so->dnas_steps > 0) o.steps = so->dnas_steps;
    if (so->dnas_lr > 0) o.lr = so->dnas_lr;
    if (so->dnas_seq_len > 0) o.seq_len = so->dnas_seq_len;
    if (so->dnas_batch > 0) o.batch = so->dnas_batch;
    o.cotrain = so->cotrain;
    o.keep = so->cotrain && so->keep_weights;
    o.cuda = p->cuda; /* a local cuda target: the gates train on its GPU (a hybrid's too) */
    return ac_search_dnas(p, m, ids, n, &o, r, orders, e);
}

int ac_dnas_job_search(const ac_search_problem *p, ac_model *m, const ac_search_opts *so, const int *ids, size_t n,
                       ac_search_result *r, ac_importance *orders, ac_err *e) {
    job_args ja = {so, ids, n};
    ac_search_problem q = *p; /* the top-k choices' loss passes read the calibration text */
    if (!q.calib_ids) q.calib_ids = ids, q.n_calib = n;
    return ac_search_top_k(&q, m, so->min_top_k, job_search_one, &ja, r, orders, e);
}
