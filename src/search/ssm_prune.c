/* ssm_prune.c - see ssm_prune.h. */
#include "search/ssm_prune.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/tensor.h"
#include "search/slice.h"
#include "slice_int.h"

int ac_ssm_rank_alloc(const ac_arch *a, ac_importance *imp, ac_err *e) {
    int L = a->n_layers;
    imp->ssm_head_order = calloc(L, sizeof(int *));
    imp->ssm_head_score = calloc(L, sizeof(double *));
    imp->ssm_chan_score = calloc(L, sizeof(double *));
    if (!imp->ssm_head_order || !imp->ssm_head_score || !imp->ssm_chan_score) return ac_errf(e, "out of memory");
    return 0;
}

int ac_ssm_rank_layer(const double *mt_ssm_l, const ac_arch *a, int l, ac_importance *imp, ac_err *e) {
    int P = a->ssm_head_dim, G = a->ssm_groups > 0 ? a->ssm_groups : 1;
    int nh = a->layers[l].ssm_heads, hpg = nh / G;
    if (!nh || !mt_ssm_l) return 0;
    int *o = imp->ssm_head_order[l] = malloc(sizeof(int) * nh);
    double *s = imp->ssm_head_score[l] = malloc(sizeof(double) * nh);
    double *cs = imp->ssm_chan_score[l] = malloc(sizeof(double) * nh * P);
    if (!o || !s || !cs) return ac_errf(e, "out of memory");
    for (int c = 0; c < nh * P; c++) cs[c] = sqrt(mt_ssm_l[c]);
    for (int h = 0; h < nh; h++) { /* L2 over the head's channels of each channel's sqrt(sum) */
        double q = 0;
        for (int i = 0; i < P; i++) q += mt_ssm_l[(size_t)h * P + i];
        s[h] = sqrt(q);
    }
    for (int g = 0; g < G; g++) { /* within the group: best first, ties by index (insertion sort) */
        int *og = o + g * hpg;
        for (int j = 0; j < hpg; j++) {
            int h = g * hpg + j, k = j;
            while (k > 0 && s[og[k - 1]] < s[h]) {
                og[k] = og[k - 1];
                k--;
            }
            og[k] = h;
        }
    }
    return 0;
}

int ac_ssm_rank_heads(const double *const *mt_ssm, const ac_arch *a, ac_importance *imp, ac_err *e) {
    if (ac_ssm_rank_alloc(a, imp, e)) return -1;
    for (int l = 0; l < a->n_layers; l++)
        if (ac_ssm_rank_layer(mt_ssm[l], a, l, imp, e)) return -1;
    return 0;
}

static int cmp_int(const void *x, const void *y) { return *(const int *)x - *(const int *)y; }

/* Indices 0..n-1 of score, best first (ties: the lower index), into idx. */
static void rank_desc(const double *score, int n, int *idx) {
    for (int j = 0; j < n; j++) {
        int k = j;
        while (k > 0 && score[idx[k - 1]] < score[j]) {
            idx[k] = idx[k - 1];
            k--;
        }
        idx[k] = j;
    }
}

int ac_rank_shared(const double *const *mt_shared, const ac_arch *a, ac_importance *imp, ac_err *e) {
    int L = a->n_layers, Fs = a->shared_ffn;
    if (!(imp->sh_order = calloc(L, sizeof(int *))) || !(imp->sh_score = calloc(L, sizeof(double *))))
        return ac_errf(e, "out of memory");
    for (int l = 0; l < L; l++) {
        if (!Fs || !mt_shared[l]) continue;
        int *o = imp->sh_order[l] = malloc(sizeof(int) * Fs);
        double *sc = imp->sh_score[l] = malloc(sizeof(double) * Fs);
        if (!o || !sc) return ac_errf(e, "out of memory");
        for (int c = 0; c < Fs; c++) sc[c] = sqrt(mt_shared[l][c]);
        rank_desc(sc, Fs, o);
    }
    return 0;
}

int ac_ssm_dim_order(const ac_arch *src, const ac_importance *imp, int l, int *order) {
    int P = src->ssm_head_dim, nh = src->layers[l].ssm_heads;
    const double *cs = imp && imp->ssm_chan_score ? imp->ssm_chan_score[l] : NULL;
    if (!cs) {
        for (int d = 0; d < P; d++) order[d] = d;
        return 0;
    }
    double *ds = calloc(P, sizeof(double));
    if (!ds) return -1;
    for (int h = 0; h < nh; h++) /* a dim's score: the L2 over the heads of its channels' scores */
        for (int d = 0; d < P; d++) ds[d] += cs[(size_t)h * P + d] * cs[(size_t)h * P + d];
    rank_desc(ds, P, order);
    free(ds);
    return 0;
}

int ac_ssm_kept_dims(const ac_arch *src, const ac_arch *t, const ac_importance *imp, int l, int *dims) {
    int P = src->ssm_head_dim, Pt = t->ssm_head_dim;
    if (Pt > P || Pt < 1) return -1;
    const int *go = imp && imp->ssm_dim_order ? imp->ssm_dim_order[l] : NULL;
    if (go) /* the gate search's order */
        memcpy(dims, go, sizeof(int) * Pt);
    else if (Pt == P)
        for (int d = 0; d < Pt; d++) dims[d] = d;
    else if (ac_ssm_dim_order(src, imp, l, dims))
        return -1;
    qsort(dims, Pt, sizeof(int), cmp_int);
    return Pt;
}

int ac_ssm_kept_heads(const ac_arch *src, const ac_arch *t, const ac_importance *imp, int l, int *kept) {
    int nh = src->layers[l].ssm_heads, d = t->layers[l].ssm_heads, G = src->ssm_groups > 0 ? src->ssm_groups : 1;
    int P = src->ssm_head_dim, Pt = t->ssm_head_dim;
    if (d > nh || d < 0 || d % G || nh % G || Pt > P || Pt < 1) return -1;
    int hpg = nh / G, ht = d / G, n = 0;
    /* (with the gate search's dim order the heads stay in its order) */
    const double *cs = imp && imp->ssm_chan_score && !imp->ssm_dim_order ? imp->ssm_chan_score[l] : NULL;
    int *dims = Pt < P && cs ? malloc(sizeof(int) * P) : NULL, *o2 = dims ? malloc(sizeof(int) * hpg) : NULL;
    double *hs = o2 ? malloc(sizeof(double) * hpg) : NULL;
    if (Pt < P && cs && (!hs || ac_ssm_kept_dims(src, t, imp, l, dims) < 0)) {
        free(dims), free(o2), free(hs);
        return -1;
    }
    for (int g = 0; g < G; g++) {
        const int *o = imp && imp->ssm_head_order && imp->ssm_head_order[l] ? imp->ssm_head_order[l] + g * hpg : NULL;
        if (hs) { /* a narrower head: the heads ranked on the kept dims' channels alone (Model-Optimizer's order) */
            for (int j = 0; j < hpg; j++) {
                double q = 0;
                for (int k = 0; k < Pt; k++) {
                    double c = cs[(size_t)(g * hpg + j) * P + dims[k]];
                    q += c * c;
                }
                hs[j] = sqrt(q);
            }
            rank_desc(hs, hpg, o2);
            for (int j = 0; j < hpg; j++) o2[j] += g * hpg;
            o = o2;
        }
        for (int j = 0; j < ht; j++) kept[n + j] = o ? o[j] : g * hpg + j;
        qsort(kept + n, ht, sizeof(int), cmp_int);
        n += ht;
    }
    free(dims), free(o2), free(hs);
    return n;
}

/* Whether layer l of t can be cut from the source's: the same mixer, or removed. */
static int check_layer(const ac_arch *a, const ac_arch *t, int l, ac_err *e) {
    const ac_layer_arch *s = &a->layers[l], *d = &t->layers[l];
    int mixers = !!d->n_heads + !!d->ffn + !!d->ssm_heads + !!d->n_experts;
    if (mixers == 0) return 0; /* removed: the identity */
    int same = mixers == 1 && !!d->n_heads == !!s->n_heads && !!d->ffn == !!s->ffn &&
               !!d->ssm_heads == !!s->ssm_heads && !!d->n_experts == !!s->n_experts;
    if (!same)
        return ac_errf(e, "prune: nemotron_h layer %d keeps its one mixer (%s) or is removed", l,
                       s->ssm_heads ? "Mamba" : s->n_heads ? "attention" : s->n_experts ? "MoE" : "MLP");
    if (s->ssm_heads && (t->ssm_head_dim > a->ssm_head_dim || t->ssm_head_dim < 1))
        return ac_errf(e, "prune: mamba_head_dim %d: at most the source's %d", t->ssm_head_dim, a->ssm_head_dim);
    if (s->ssm_heads && (d->ssm_heads > s->ssm_heads || d->ssm_heads % (a->ssm_groups > 0 ? a->ssm_groups : 1)))
        return ac_errf(e,
                       "prune: layer %d keeps %d of %d Mamba heads: keep the same number in each of the %d groups "
                       "(a multiple of n_groups, at most the source's)",
                       l, d->ssm_heads, s->ssm_heads, a->ssm_groups);
    if (s->ffn && d->ffn > s->ffn)
        return ac_errf(e, "prune: layer %d MLP width %d is wider than the source's %d", l, d->ffn, s->ffn);
    if (s->n_experts && (t->shared_ffn > a->shared_ffn || (a->shared_ffn && t->shared_ffn < 1)))
        return ac_errf(e, "prune: moe_shared_expert_intermediate_size %d: between 1 and the source's %d",
                       t->shared_ffn, a->shared_ffn);
    if (s->n_experts && (d->n_experts > s->n_experts || d->n_experts < a->top_k || d->expert_ffn > s->expert_ffn ||
                         d->expert_ffn < 1))
        return ac_errf(e,
                       "prune: layer %d keeps %d experts of width %d from %d of width %d: at least top_k %d experts, "
                       "each at most the source's width",
                       l, d->n_experts, d->expert_ffn, s->n_experts, s->expert_ffn, a->top_k);
    return s->n_heads ? ac_slice_check_layer(a, t, l, e) : 0;
}

/* A Mamba layer: the kept heads' channels of z, x and dt (B and C whole). */
static int cut_mamba(const ac_model *src, const ac_arch *t, const ac_importance *imp, int l, ac_layer_w *dw,
                     const int *hk, const ac_slice_buf *b, ac_err *e) {
    const ac_arch *a = &src->a;
    const ac_layer_w *sw = &src->L[l];
    int wdt = ac_model_wdt(src), H = a->hidden, Ht = t->hidden, P = a->ssm_head_dim, K = a->ssm_conv;
    int nh = a->layers[l].ssm_heads, di = nh * P, GN = 2 * a->ssm_groups * a->ssm_state, Pt = t->ssm_head_dim;
    int *kh = malloc(sizeof(int) * nh), *ch = malloc(sizeof(int) * di), *rin = malloc(sizeof(int) * (2 * di + GN + nh));
    int *dims = malloc(sizeof(int) * P);
    int k = kh && dims && ac_ssm_kept_dims(a, t, imp, l, dims) == Pt ? ac_ssm_kept_heads(a, t, imp, l, kh) : -1;
    if (!kh || !ch || !rin || !dims || k < 0) {
        free(kh), free(ch), free(rin), free(dims);
        return ac_errf(e, k < 0 && kh && dims ? "prune: layer %d: Mamba heads do not split into the groups"
                                              : "out of memory",
                       l);
    }
    int dt = k * Pt;
    for (int j = 0; j < k; j++) /* the kept heads' kept dims: the same dims in every head */
        for (int i = 0; i < Pt; i++) ch[j * Pt + i] = kh[j] * P + dims[i];
    free(dims);
    /* in_proj rows: z, x (the kept channels), B and C (whole), dt (the kept heads); the conv's: x, B, C */
    for (int c = 0; c < dt; c++) rin[c] = ch[c], rin[dt + c] = di + ch[c];
    for (int c = 0; c < GN; c++) rin[2 * dt + c] = 2 * di + c;
    for (int j = 0; j < k; j++) rin[2 * dt + GN + j] = 2 * di + GN + kh[j];
    const int *crow = rin + dt; /* x's kept channels then B, C: di + ch, 2 di + c; as conv rows minus di */
    int *cr = malloc(sizeof(int) * (dt + GN + 1));
    if (!cr) {
        free(kh), free(ch), free(rin);
        return ac_errf(e, "out of memory");
    }
    for (int c = 0; c < dt + GN; c++) cr[c] = crow[c] - di;
    float *row = b->row;
    ac_slice_gather(dw->in_norm, sw->in_norm, ST_F32, H, NULL, 1, hk, Ht, row);
    ac_slice_put(dw->ssm_in, b, sw->ssm_in, wdt, H, rin, 2 * dt + GN + k, hk, Ht);
    ac_slice_put(dw->ssm_out, b, sw->ssm_out, wdt, di, hk, Ht, ch, dt);
    ac_slice_gather(dw->conv_w, sw->conv_w, ST_F32, K, cr, dt + GN, NULL, K, row);
    if (sw->conv_b && dw->conv_b) ac_slice_gather(dw->conv_b, sw->conv_b, ST_F32, di + GN, NULL, 1, cr, dt + GN, row);
    ac_slice_gather(dw->dt_bias, sw->dt_bias, ST_F32, nh, NULL, 1, kh, k, row);
    ac_slice_gather(dw->a_log, sw->a_log, ST_F32, nh, NULL, 1, kh, k, row);
    ac_slice_gather(dw->ssm_d, sw->ssm_d, ST_F32, nh, NULL, 1, kh, k, row);
    ac_slice_gather(dw->ssm_norm, sw->ssm_norm, ST_F32, di, NULL, 1, ch, dt, row);
    free(kh), free(ch), free(rin), free(cr);
    return 0;
}

/* An MLP layer (up, relu^2, down): its best channels. */
static int cut_mlp(const ac_model *src, const ac_arch *t, const ac_importance *imp, int l, ac_layer_w *dw,
                   const int *hk, const ac_slice_buf *b, ac_err *e) {
    const ac_arch *a = &src->a;
    const ac_layer_w *sw = &src->L[l];
    int wdt = ac_model_wdt(src), H = a->hidden, Ht = t->hidden, F = a->layers[l].ffn, Ft = t->layers[l].ffn;
    int *fk = ac_prune_kept(imp->ffn_order[l], Ft);
    if (!fk) return ac_errf(e, "out of memory");
    ac_slice_gather(dw->post_norm, sw->post_norm, ST_F32, H, NULL, 1, hk, Ht, b->row);
    ac_slice_put(dw->wu, b, sw->wu, wdt, H, fk, Ft, hk, Ht);
    ac_slice_put(dw->wd, b, sw->wd, wdt, F, hk, Ht, fk, Ft);
    free(fk);
    return 0;
}

/* An MoE layer: the kept experts with their router rows and correction
 * bias, each on its best t->expert_ffn channels (imp->echan_order, its own
 * ranking; NULL: the first); the shared expert on its best
 * t->shared_ffn channels (imp->sh_order), it and the latent projections on
 * the kept hidden channels. One expert at a time, straight into the
 * student's matrices (ac_slice_put). */
static int cut_moe(const ac_model *src, const ac_arch *t, const ac_importance *imp, int l, ac_layer_w *dw,
                   const int *hk, const ac_slice_buf *b, ac_err *e) {
    const ac_arch *a = &src->a;
    const ac_layer_w *sw = &src->L[l];
    int wdt = ac_model_wdt(src), H = a->hidden, Ht = t->hidden, E = a->layers[l].n_experts,
        Et = t->layers[l].n_experts, Fe = a->layers[l].expert_ffn, Lt = a->moe_latent, Fs = a->shared_ffn;
    int Ft = t->layers[l].expert_ffn, *ek = malloc(sizeof(int) * (E + 1)), *fk = NULL, Ltt = t->moe_latent;
    int *lk = Lt ? malloc(sizeof(int) * Lt) : NULL; /* the kept latent channels (imp->lat_order; NULL: the first) */
    if (!ek || (Lt && !lk)) {
        free(ek), free(lk);
        return ac_errf(e, "out of memory");
    }
    for (int r = 0; r < Ltt; r++) lk[r] = imp->lat_order && imp->lat_order[l] ? imp->lat_order[l][r] : r;
    if (Lt) qsort(lk, Ltt, sizeof(int), cmp_int);
    for (int x = 0; x < Et; x++) ek[x] = imp->expert_order && imp->expert_order[l] ? imp->expert_order[l][x] : x;
    qsort(ek, Et, sizeof(int), cmp_int);
    float *row = b->row;
    ac_slice_gather(dw->post_norm, sw->post_norm, ST_F32, H, NULL, 1, hk, Ht, row);
    ac_slice_put(dw->router, b, sw->router, wdt, H, ek, Et, hk, Ht);
    if (sw->router_bias) ac_slice_gather(dw->router_bias, sw->router_bias, ST_F32, E, NULL, 1, ek, Et, row);
    for (int x = 0; x < Et; x++) { /* expert ek[x]'s channels: its best Ft by its own ranking, ascending */
        const int *co = imp->echan_order && imp->echan_order[l] ? imp->echan_order[l] + (size_t)ek[x] * Fe : NULL;
        free(fk);
        if (!(fk = malloc(sizeof(int) * (Fe + 1)))) break;
        for (int r = 0; r < Ft; r++) fk[r] = co ? co[r] : r;
        qsort(fk, Ft, sizeof(int), cmp_int);
        if (Lt) { /* the experts live on the latent width: its kept channels */
            ac_slice_put(dw->eu[x], b, sw->eu[ek[x]], wdt, Lt, fk, Ft, lk, Ltt);
            ac_slice_put(dw->ed[x], b, sw->ed[ek[x]], wdt, Fe, lk, Ltt, fk, Ft);
        } else {
            ac_slice_put(dw->eu[x], b, sw->eu[ek[x]], wdt, H, fk, Ft, hk, Ht);
            ac_slice_put(dw->ed[x], b, sw->ed[ek[x]], wdt, Fe, hk, Ht, fk, Ft);
        }
    }
    if (Et && !fk) {
        free(ek), free(lk);
        return ac_errf(e, "out of memory");
    }
    free(fk);
    if (Lt) {
        ac_slice_put(dw->lat_down, b, sw->lat_down, wdt, H, lk, Ltt, hk, Ht);
        ac_slice_put(dw->lat_up, b, sw->lat_up, wdt, Lt, hk, Ht, lk, Ltt);
    }
    free(ek), free(lk);
    int Fst = t->shared_ffn, *sk = Fs && sw->sh_u ? malloc(sizeof(int) * Fs) : NULL;
    if (Fs && sw->sh_u && !sk) return ac_errf(e, "out of memory");
    if (sk) { /* the shared expert: its best t->shared_ffn channels (imp->sh_order; NULL: the first), ascending */
        const int *so = imp->sh_order ? imp->sh_order[l] : NULL;
        for (int r = 0; r < Fst; r++) sk[r] = so ? so[r] : r;
        qsort(sk, Fst, sizeof(int), cmp_int);
        ac_slice_put(dw->sh_u, b, sw->sh_u, wdt, H, sk, Fst, hk, Ht);
        ac_slice_put(dw->sh_d, b, sw->sh_d, wdt, Fs, hk, Ht, sk, Fst);
    }
    free(sk);
    return 0;
}

/* The widest source row a gather converts. */
static size_t widest(const ac_arch *a) {
    size_t w = (size_t)a->hidden;
    size_t fixed[3] = {(size_t)a->moe_latent, (size_t)a->shared_ffn, (size_t)a->ssm_conv};
    for (int i = 0; i < 3; i++) w = fixed[i] > w ? fixed[i] : w;
    for (int l = 0; l < a->n_layers; l++) {
        const ac_layer_arch *L = &a->layers[l];
        size_t v[5] = {(size_t)L->n_heads * a->head_dim, (size_t)L->ffn, (size_t)L->expert_ffn, (size_t)L->n_experts,
                       (size_t)ac_ssm_conv_dim(a, l)};
        for (int i = 0; i < 5; i++) w = v[i] > w ? v[i] : w;
    }
    return w;
}

/* Layer l of t into dw (matrices in b->ddt, norms and vectors fp32). */
static int cut_layer(const ac_model *src, const ac_arch *t, const ac_importance *imp, int l, ac_layer_w *dw,
                     const int *hk, const ac_slice_buf *b, ac_err *e) {
    const ac_layer_arch *d = &t->layers[l];
    return d->ssm_heads   ? cut_mamba(src, t, imp, l, dw, hk, b, e)
           : d->n_heads   ? ac_slice_layer(src, t, imp, l, dw, hk, b, e)
           : d->ffn       ? cut_mlp(src, t, imp, l, dw, hk, b, e)
           : d->n_experts ? cut_moe(src, t, imp, l, dw, hk, b, e)
                          : 0;
}

/* The embedding and (untied) LM head of dst, and its final norm. */
static void cut_ends(const ac_model *src, const ac_arch *t, ac_model *dst, const int *hk, const ac_slice_buf *b) {
    const ac_arch *a = &src->a;
    int H = a->hidden, Ht = t->hidden, V = a->vocab, wdt = ac_model_wdt(src);
    float *mats[2] = {dst->embed, t->tie_embeddings ? NULL : dst->lm_head};
    const float *srcs[2] = {src->embed, src->lm_head};
    for (int i = 0; i < 2; i++)
        if (mats[i]) ac_slice_put(mats[i], b, srcs[i], wdt, H, NULL, V, hk, Ht);
    ac_slice_gather(dst->final_norm, src->final_norm, ST_F32, H, NULL, 1, hk, Ht, b->row);
}

int ac_prune_hybrid(const ac_model *src, const ac_arch *t, const ac_importance *imp, ac_model *dst, int bf16,
                    ac_err *e) {
    const ac_arch *a = &src->a;
    if (!t->hybrid || t->ssm_head_dim > a->ssm_head_dim || t->ssm_head_dim < 1 || t->ssm_state != a->ssm_state ||
        t->ssm_groups != a->ssm_groups || t->ssm_conv != a->ssm_conv || t->moe_latent > a->moe_latent ||
        (a->moe_latent && t->moe_latent < 1))
        return ac_errf(e, "prune: the target changes nemotron_h's model-wide Mamba or MoE shapes (only mamba_head_dim, "
                          "the shared expert's width and the latent width may narrow)");
    for (int l = 0; l < a->n_layers; l++)
        if (check_layer(a, t, l, e)) return -1;
    if (bf16 ? ac_model_alloc_bf16(dst, t, e) : ac_model_alloc(dst, t, e)) return -1;
    int *hk = ac_prune_kept(imp->hid_order, t->hidden);
    size_t w = widest(a);
    ac_slice_buf b = {.ddt = ac_model_wdt(dst), .row = malloc(sizeof(float) * w), .out = malloc(sizeof(float) * w),
                      .acc = malloc(sizeof(double) * 2 * a->hidden)};
    int rc = hk && b.row && b.out && b.acc ? 0 : ac_errf(e, "out of memory");
    if (!rc) cut_ends(src, t, dst, hk, &b);
    for (int l = 0; !rc && l < a->n_layers; l++) rc = cut_layer(src, t, imp, l, &dst->L[l], hk, &b, e);
    free(hk), free(b.row), free(b.out), free(b.acc);
    if (rc) ac_model_free(dst);
    return rc;
}
