/* slice.c - see slice.h. */
#include "search/slice.h"
#include "slice_int.h"

#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "runtime/kernels_cpu.h"
#include "core/tensor.h"
#include "search/ssm_prune.h"

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

int *ac_prune_kept(const int *order, int k) {
    int *v = malloc(sizeof(int) * (k + 1));
    if (!v) return NULL;
    memcpy(v, order, sizeof(int) * k);
    qsort(v, k, sizeof(int), cmp_int);
    return v;
}

/* dst[r][c] = src[rows[r]][cols[c]]; rows/cols NULL = identity. src is
 * stored in wdt (a resident model's BF16/F16 mapping, or fp32): each source
 * row is converted into row (src_cols floats of scratch) first, so the
 * student gets exactly the fp32 values an fp32 load would have. */
static void gather(float *dst, const void *src, int wdt, int src_cols, const int *rows, int nr, const int *cols, int nc,
                   float *row) {
    for (int r = 0; r < nr; r++) {
        size_t sr = (size_t)(rows ? rows[r] : r);
        const float *s = row;
        if (wdt == ST_F32)
            s = (const float *)src + sr * src_cols;
        else
            ac_row_f32(row, src, wdt, sr, src_cols);
        float *d = dst + (size_t)r * nc;
        for (int c = 0; c < nc; c++) d[c] = s[cols ? cols[c] : c];
    }
}

/* Element i of a matrix stored in dt (fp32 or 16-bit). */
static void *elem(void *m, int dt, size_t i) { return (char *)m + i * (dt == ST_F32 ? 4 : 2); }

/* Row r (nc floats, vals) of a destination matrix in b->ddt: copied, or
 * rounded to nearest even (the elementwise rounding ac_model_to_bf16 does). */
static void store_row(void *dst, const ac_slice_buf *b, size_t r, int nc, const float *vals) {
    ac_from_f32(elem(dst, b->ddt, r * (size_t)nc), vals, (st_dtype)b->ddt, (size_t)nc, NULL);
}

/* gather into a destination matrix in b->ddt: an fp32 one directly, a
 * 16-bit one a row at a time through b->out (so no fp32 copy of the matrix
 * exists at any time, and each value is the one gather gives, rounded). */
static void put(void *dst, const ac_slice_buf *b, const void *src, int wdt, int src_cols, const int *rows, int nr,
                const int *cols, int nc) {
    if (b->ddt == ST_F32) {
        gather(dst, src, wdt, src_cols, rows, nr, cols, nc, b->row);
        return;
    }
    for (int r = 0; r < nr; r++) {
        int sr = rows ? rows[r] : r;
        gather(b->out, src, wdt, src_cols, &sr, 1, cols, nc, b->row);
        store_row(dst, b, (size_t)r, nc, b->out);
    }
}

/* Whether layer l of t can be cut from the source's layer. */
static int check_layer(const ac_arch *a, const ac_arch *t, int l, ac_err *e) {
    const ac_layer_arch *s = &a->layers[l], *d = &t->layers[l];
    if (s->n_experts || d->n_experts) { /* MoE: experts removed, each one's channels cut; the attention as below */
        if (d->n_experts > s->n_experts ||
            (d->n_experts && (d->expert_ffn < 1 || d->expert_ffn > s->expert_ffn || d->n_experts < t->top_k)) ||
            t->top_k > a->top_k || d->ffn)
            return ac_errf(e,
                           "prune: layer %d target (%d experts of width %d, top_k %d, dense ffn %d) does not fit "
                           "source (%d experts of width %d, top_k %d): keep at least top_k experts, each at most as "
                           "wide as the source's",
                           l, d->n_experts, d->expert_ffn, t->top_k, d->ffn, s->n_experts, s->expert_ffn, a->top_k);
    }
    int grp = s->n_heads ? s->n_heads / s->n_kv_heads : 0;
    int merge = d->n_heads && d->n_heads == s->n_heads && d->n_kv_heads < s->n_kv_heads && d->n_kv_heads > 0 &&
                s->n_kv_heads % d->n_kv_heads == 0;
    /* Minitron: all KV groups kept, heads trimmed within each group */
    int trim =
        d->n_heads && d->n_kv_heads == s->n_kv_heads && d->n_heads < s->n_heads && d->n_heads % d->n_kv_heads == 0;
    if ((d->ffn && !s->ffn) || d->n_kv_heads > s->n_kv_heads ||
        (d->n_heads && d->n_heads != d->n_kv_heads * grp && !merge && !trim))
        return ac_errf(e,
                       "prune: layer %d target (%d heads, %d KV, ffn %d) does not fit source (%d, %d, %d): keep the "
                       "query heads of a KV group together, keep every query head and merge KV heads by a divisor, "
                       "or keep every KV group and trim the same number of heads in each",
                       l, d->n_heads, d->n_kv_heads, d->ffn, s->n_heads, s->n_kv_heads, s->ffn);
    return 0;
}

/* KV merging (what DeciLM's per-layer n_heads_in_group expresses): every
 * query head stays; merged KV head j is the mean of the f adjacent source
 * heads j*f..j*f+f-1, so query head h still reads the merge of the head it
 * read. hk: the kept hidden channels (Ht of H). Source matrices in wdt. */
static void prune_attn_merge(const ac_arch *a, const ac_layer_arch *s, const ac_layer_arch *d, const ac_layer_w *sw,
                             int wdt, ac_layer_w *dw, const int *hk, int Ht, const ac_slice_buf *b) {
    int H = a->hidden, hd = a->head_dim, G = d->n_kv_heads, f = s->n_kv_heads / G, Q = s->n_heads * hd;
    float *row = b->row, *out = b->out;
    double *acc = b->acc;
    gather(dw->in_norm, sw->in_norm, ST_F32, H, NULL, 1, hk, Ht, row);
    put(dw->wq, b, sw->wq, wdt, H, NULL, Q, hk, Ht);
    put(dw->wo, b, sw->wo, wdt, Q, hk, Ht, NULL, Q);
    if (a->qkv_bias) memcpy(dw->bq, sw->bq, sizeof(float) * Q);
    double *ak = acc, *av = acc + H;
    for (int j = 0; j < G; j++)
        for (int i = 0; i < hd; i++) {
            size_t dr = (size_t)j * hd + i;
            memset(acc, 0, sizeof(double) * 2 * H);
            for (int m = 0; m < f; m++) { /* sums in double, over the source heads in order */
                size_t r = (size_t)(j * f + m) * hd + i;
                ac_row_f32(row, sw->wk, wdt, r, H);
                for (int c = 0; c < H; c++) ak[c] += row[c];
                ac_row_f32(row, sw->wv, wdt, r, H);
                for (int c = 0; c < H; c++) av[c] += row[c];
            }
            for (int c = 0; c < Ht; c++) out[c] = (float)(ak[hk[c]] / f);
            store_row(dw->wk, b, dr, Ht, out);
            for (int c = 0; c < Ht; c++) out[c] = (float)(av[hk[c]] / f);
            store_row(dw->wv, b, dr, Ht, out);
            if (a->qkv_bias) {
                double bk = 0, bv = 0;
                for (int m = 0; m < f; m++) {
                    bk += sw->bk[(j * f + m) * hd + i];
                    bv += sw->bv[(j * f + m) * hd + i];
                }
                dw->bk[j * hd + i] = (float)(bk / f);
                dw->bv[j * hd + i] = (float)(bv / f);
            }
        }
}

/* Source KV group g's query heads in the order they are kept: when hg of
 * its grp heads stay (Minitron's trimming) and there is a head ranking, the
 * ranking's entries for that group, best first (the first hg are kept);
 * NULL: its heads in index order (g * grp + j). ac_prune and
 * ac_prune_layer_masks both keep heads by this. */
static const int *group_head_order(const ac_importance *imp, int l, int g, int grp, int hg) {
    return hg < grp && imp->head_order ? imp->head_order[l] + (size_t)g * grp : NULL;
}

/* The kept KV groups with their query heads; when every group is kept with
 * fewer heads each (Minitron), a group's best heads (group_head_order), in
 * their original order. */
static int prune_attn_groups(const ac_arch *a, int l, const ac_layer_arch *s, const ac_layer_arch *d,
                             const ac_importance *imp, const ac_layer_w *sw, int wdt, ac_layer_w *dw, const int *hk,
                             int Ht, const ac_slice_buf *b, ac_err *e) {
    int H = a->hidden, hd = a->head_dim, rc = 0;
    int grp = s->n_heads / s->n_kv_heads, G = d->n_kv_heads, Qs = s->n_heads * hd, hg = d->n_heads / G;
    int *gk = ac_prune_kept(imp->kv_order[l], G);
    int *qrows = malloc(sizeof(int) * G * grp * hd), *kvrows = malloc(sizeof(int) * G * hd);
    if (!gk || !qrows || !kvrows) rc = ac_errf(e, "out of memory");
    for (int g = 0; !rc && g < G; g++) {
        for (int i = 0; i < hd; i++) kvrows[g * hd + i] = gk[g] * hd + i;
        const int *go = group_head_order(imp, l, gk[g], grp, hg);
        int *qk = go ? ac_prune_kept(go, hg) : NULL;
        if (go && !qk) {
            rc = ac_errf(e, "out of memory");
            break;
        }
        for (int j = 0; j < hg; j++)
            for (int i = 0; i < hd; i++) qrows[(g * hg + j) * hd + i] = (qk ? qk[j] : gk[g] * grp + j) * hd + i;
        free(qk);
    }
    if (!rc) {
        int nq = G * hg * hd, nkv = G * hd;
        float *row = b->row;
        gather(dw->in_norm, sw->in_norm, ST_F32, H, NULL, 1, hk, Ht, row);
        put(dw->wq, b, sw->wq, wdt, H, qrows, nq, hk, Ht);
        put(dw->wk, b, sw->wk, wdt, H, kvrows, nkv, hk, Ht);
        put(dw->wv, b, sw->wv, wdt, H, kvrows, nkv, hk, Ht);
        put(dw->wo, b, sw->wo, wdt, Qs, hk, Ht, qrows, nq);
        if (a->qkv_bias) {
            gather(dw->bq, sw->bq, ST_F32, Qs, NULL, 1, qrows, nq, row);
            gather(dw->bk, sw->bk, ST_F32, s->n_kv_heads * hd, NULL, 1, kvrows, nkv, row);
            gather(dw->bv, sw->bv, ST_F32, s->n_kv_heads * hd, NULL, 1, kvrows, nkv, row);
        }
    }
    free(gk);
    free(qrows);
    free(kvrows);
    return rc;
}

int ac_prune_expert_mask(const ac_arch *a, const ac_arch *t, const ac_importance *imp, int l, float *mask) {
    const ac_layer_arch *s = &a->layers[l], *d = &t->layers[l];
    if (!d->n_experts || d->n_experts > s->n_experts || d->expert_ffn != s->expert_ffn) return 1;
    const int *order = imp->expert_order ? imp->expert_order[l] : NULL;
    for (int x = 0; x < s->n_experts; x++) mask[x] = 0;
    for (int r = 0; r < d->n_experts; r++) mask[order ? order[r] : r] = 1;
    return 0;
}

int ac_prune_layer_masks(const ac_arch *a, const ac_arch *t, const ac_importance *imp, int l, float *head_mask,
                         float *ffn_mask) {
    const ac_layer_arch *s = &a->layers[l], *d = &t->layers[l];
    /* what ac_prune does otherwise (merge or drop KV groups), or refuses */
    if (d->n_heads && (d->n_kv_heads != s->n_kv_heads || d->n_heads > s->n_heads || d->n_heads % s->n_kv_heads))
        return 1;
    if (d->ffn && !s->ffn) return 1;
    int grp = s->n_heads ? s->n_heads / s->n_kv_heads : 0, G = s->n_kv_heads, hg = d->n_heads ? d->n_heads / G : 0;
    for (int h = 0; h < s->n_heads; h++) head_mask[h] = 0;
    for (int g = 0; g < G && hg > 0; g++) { /* as prune_attn_groups: every group, its first hg heads */
        const int *go = group_head_order(imp, l, g, grp, hg);
        for (int j = 0; j < hg; j++) head_mask[go ? go[j] : g * grp + j] = 1;
    }
    int keep = d->ffn < s->ffn ? d->ffn : s->ffn;
    for (int c = 0; c < s->ffn; c++) ffn_mask[c] = 0;
    for (int r = 0; r < keep; r++) ffn_mask[imp->ffn_order[l][r]] = 1;
    return 0;
}

void ac_prune_hidden_mask(const ac_arch *a, const ac_arch *t, const ac_importance *imp, float *hid_mask) {
    for (int c = 0; c < a->hidden; c++) hid_mask[c] = 0;
    for (int r = 0; r < t->hidden; r++) hid_mask[imp->hid_order[r]] = 1;
}

/* The FFN's best channels. A target wider than the source (the deci grid)
 * keeps every channel; the extra gate/up rows and down columns stay zero,
 * which adds exactly nothing (silu(0) * 0 = 0). */
static int prune_ffn(const ac_arch *a, const ac_layer_arch *s, const ac_layer_arch *d, const int *order,
                     const ac_layer_w *sw, int wdt, ac_layer_w *dw, const int *hk, int Ht, const ac_slice_buf *b,
                     ac_err *e) {
    int H = a->hidden, keep = d->ffn < s->ffn ? d->ffn : s->ffn;
    int *fk = ac_prune_kept(order, keep);
    if (!fk) return ac_errf(e, "out of memory");
    gather(dw->post_norm, sw->post_norm, ST_F32, H, NULL, 1, hk, Ht, b->row);
    put(dw->wg, b, sw->wg, wdt, H, fk, keep, hk, Ht);
    put(dw->wu, b, sw->wu, wdt, H, fk, keep, hk, Ht);
    /* down_proj [Ht, d->ffn]: the first keep columns */
    for (int r = 0; r < Ht; r++)
        put(elem(dw->wd, b->ddt, (size_t)r * d->ffn), b, sw->wd, wdt, s->ffn, hk + r, 1, fk, keep);
    free(fk);
    return 0;
}

/* The widest row ac_prune converts: hidden, query, KV or FFN width. */
static size_t widest(const ac_arch *a) {
    size_t w = (size_t)a->hidden;
    for (int l = 0; l < a->n_layers; l++) {
        size_t q = (size_t)a->layers[l].n_heads * a->head_dim, f = (size_t)a->layers[l].ffn,
               fe = (size_t)a->layers[l].expert_ffn;
        if (q > w) w = q;
        if (f > w) w = f;
        if (fe > w) w = fe;
    }
    return w;
}

/* A mixture-of-experts FFN: the best d->n_experts experts (order: most
 * important first; NULL: the first ones) kept in their original order,
 * with their router rows, so the router's softmax and top-k run over the
 * kept experts alone (its renormalisation over what remains); each kept
 * expert's best d->expert_ffn channels (chan: imp->echan_order[l], expert
 * x's ranking at x*Fe; NULL: the first ones) in their original order;
 * hidden channels hk as everywhere. One expert's matrices at a time, each
 * straight into the student's (put: no fp32 copy of the layer's experts). */
static int prune_experts(const ac_arch *a, const ac_layer_arch *s, const ac_layer_arch *d, const int *order,
                         const int *chan, const ac_layer_w *sw, int wdt, ac_layer_w *dw, const int *hk, int Ht,
                         const ac_slice_buf *b, ac_err *e) {
    int H = a->hidden, Fe = s->expert_ffn, Fd = d->expert_ffn, *ident = NULL;
    if (!order) {
        if (!(ident = malloc(sizeof(int) * s->n_experts))) return ac_errf(e, "out of memory");
        for (int x = 0; x < s->n_experts; x++) ident[x] = x;
    }
    int *ek = ac_prune_kept(order ? order : ident, d->n_experts);
    free(ident);
    if (!ek) return ac_errf(e, "out of memory");
    gather(dw->post_norm, sw->post_norm, ST_F32, H, NULL, 1, hk, Ht, b->row);
    put(dw->router, b, sw->router, wdt, H, ek, d->n_experts, hk, Ht);
    int rc = 0;
    for (int x = 0; x < d->n_experts && !rc; x++) {
        int *ck = Fd < Fe && chan ? ac_prune_kept(chan + (size_t)ek[x] * Fe, Fd) : NULL; /* NULL: the first Fd */
        if (Fd < Fe && chan && !ck) {
            rc = ac_errf(e, "out of memory");
            break;
        }
        put(dw->eg[x], b, sw->eg[ek[x]], wdt, H, ck, Fd, hk, Ht);
        put(dw->eu[x], b, sw->eu[ek[x]], wdt, H, ck, Fd, hk, Ht);
        put(dw->ed[x], b, sw->ed[ek[x]], wdt, Fe, hk, Ht, ck, Fd);
        free(ck);
    }
    free(ek);
    return rc;
}

/* Layer l of t into dw (matrices in b->ddt): its attention (merged or cut
 * KV groups) and FFN. */
static int prune_layer(const ac_model *src, const ac_arch *t, const ac_importance *imp, int l, ac_layer_w *dw,
                       const int *hk, const ac_slice_buf *b, ac_err *e) {
    const ac_arch *a = &src->a;
    const ac_layer_arch *s = &a->layers[l], *d = &t->layers[l];
    int Ht = t->hidden, lw = ac_model_wdt(src), rc = 0;
    if (d->n_heads && d->n_heads == s->n_heads && d->n_kv_heads < s->n_kv_heads)
        prune_attn_merge(a, s, d, &src->L[l], lw, dw, hk, Ht, b);
    else if (d->n_heads)
        rc = prune_attn_groups(a, l, s, d, imp, &src->L[l], lw, dw, hk, Ht, b, e);
    if (d->n_heads && a->qk_norm) { /* one weight per head_dim channel, shared by the heads: kept whole */
        memcpy(dw->q_norm, src->L[l].q_norm, sizeof(float) * a->head_dim);
        memcpy(dw->k_norm, src->L[l].k_norm, sizeof(float) * a->head_dim);
    }
    if (d->ffn && !rc) rc = prune_ffn(a, s, d, imp->ffn_order[l], &src->L[l], lw, dw, hk, Ht, b, e);
    if (d->n_experts && !rc)
        rc = prune_experts(a, s, d, imp->expert_order ? imp->expert_order[l] : NULL,
                           imp->echan_order ? imp->echan_order[l] : NULL, &src->L[l], lw, dw, hk, Ht, b, e);
    return rc;
}

/* Embeddings, final norm and (untied) LM head, then every layer, into
 * dst's matrices (b->ddt: fp32, or BF16 gathered a row at a time and
 * rounded). */
static int prune_layers(const ac_model *src, const ac_arch *t, const ac_importance *imp, ac_model *dst, const int *hk,
                        const ac_slice_buf *b, ac_err *e) {
    const ac_arch *a = &src->a;
    int H = a->hidden, Ht = t->hidden, V = a->vocab, wdt = ac_model_wdt(src);
    float *heads[2] = {dst->embed, t->tie_embeddings ? NULL : dst->lm_head};
    const float *srcs[2] = {src->embed, src->lm_head};
    for (int i = 0; i < 2; i++)
        if (heads[i]) put(heads[i], b, srcs[i], wdt, H, NULL, V, hk, Ht);
    gather(dst->final_norm, src->final_norm, ST_F32, H, NULL, 1, hk, Ht, b->row);
    int rc = 0;
    for (int l = 0; l < a->n_layers && !rc; l++) rc = prune_layer(src, t, imp, l, &dst->L[l], hk, b, e);
    return rc;
}

static int prune_to(const ac_model *src, const ac_arch *t, const ac_importance *imp, ac_model *dst, int bf16,
                    ac_err *e) {
    const ac_arch *a = &src->a;
    if (t->n_layers != a->n_layers || t->head_dim != a->head_dim || t->vocab != a->vocab || t->hidden > a->hidden ||
        t->hidden < 1)
        return ac_errf(e, "prune: target architecture does not fit the source model");
    if (a->hybrid) return ac_prune_hybrid(src, t, imp, dst, bf16, e); /* ssm_prune.c */
    for (int l = 0; l < a->n_layers; l++)
        if (check_layer(a, t, l, e)) return -1;
    if (bf16 ? ac_model_alloc_bf16(dst, t, e) : ac_model_alloc(dst, t, e)) return -1;
    size_t wmax = widest(a);
    int *hk = ac_prune_kept(imp->hid_order, t->hidden);
    ac_slice_buf b = {.ddt = ac_model_wdt(dst), .row = malloc(sizeof(float) * wmax), .out = malloc(sizeof(float) * wmax),
                      .acc = malloc(sizeof(double) * 2 * a->hidden)};
    int rc = hk && b.row && b.out && b.acc ? prune_layers(src, t, imp, dst, hk, &b, e) : ac_errf(e, "out of memory");
    free(hk);
    free(b.row), free(b.out), free(b.acc);
    if (rc) ac_model_free(dst);
    return rc;
}

int ac_prune(const ac_model *src, const ac_arch *t, const ac_importance *imp, ac_model *dst, ac_err *e) {
    return prune_to(src, t, imp, dst, 0, e);
}

int ac_prune_bf16(const ac_model *src, const ac_arch *t, const ac_importance *imp, ac_model *dst, ac_err *e) {
    return prune_to(src, t, imp, dst, 1, e);
}

/* ---- for ssm_prune.c (slice_int.h) ---- */

void ac_slice_gather(float *dst, const void *src, int wdt, int src_cols, const int *rows, int nr, const int *cols,
                     int nc, float *row) {
    gather(dst, src, wdt, src_cols, rows, nr, cols, nc, row);
}

void ac_slice_put(void *dst, const ac_slice_buf *b, const void *src, int wdt, int src_cols, const int *rows, int nr,
                  const int *cols, int nc) {
    put(dst, b, src, wdt, src_cols, rows, nr, cols, nc);
}

int ac_slice_check_layer(const ac_arch *src, const ac_arch *t, int l, ac_err *e) { return check_layer(src, t, l, e); }

int ac_slice_layer(const ac_model *src, const ac_arch *t, const ac_importance *imp, int l, ac_layer_w *dw,
                   const int *hk, const ac_slice_buf *b, ac_err *e) {
    return prune_layer(src, t, imp, l, dw, hk, b, e);
}
