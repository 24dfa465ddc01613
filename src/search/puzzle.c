/*
 * puzzle.c - Puzzle's library of block variants and their block-local
 * distillation scores (see puzzle.h). The program and the search are in
 * puzzlemip.c.
 *
 * Shapes: W calibration windows of n tokens, H hidden; the parent's layer
 * inputs X[W*n][H] and outputs Y (computed by the stream, stream.h) are
 * the only whole-calibration buffers. A variant is a one-layer fp32 model
 * (vocab 1: its embedding and head rows are never read) sliced from the
 * parent's layer (slice.h) and trained through the CPU block backward
 * (block_grad.h).
 */
#include "search/puzzle.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/block_grad.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "runtime/optim.h"
#include "search/slice.h"
#include "search/stream.h"

void ac_puzzle_opts_default(ac_puzzle_opts *o) {
    memset(o, 0, sizeof *o);
    o->steps = 40;
    o->batch = 4;
    o->windows = 32;
    o->lr = 1e-3;
    o->keep_weights = 1;
    o->n_ffn_fracs = 4;
    o->ffn_fracs[0] = 0.75, o->ffn_fracs[1] = 0.5, o->ffn_fracs[2] = 0.25, o->ffn_fracs[3] = 0.1;
    o->ffn_multiple = 1;
}

static int has_int(const int *v, int n, int x) {
    for (int i = 0; i < n; i++)
        if (v[i] == x) return 1;
    return 0;
}

void ac_puzzle_variants(const ac_arch *base, int l, const ac_puzzle_opts *o, int *kv, int *na, int *ffn, int *nf) {
    const ac_layer_arch *s = &base->layers[l];
    int G = s->n_kv_heads, F = s->ffn, m = o->ffn_multiple > 0 ? o->ffn_multiple : 1;
    *na = 0;
    kv[(*na)++] = G; /* the parent's, then each smaller divisor down to G / 8 (all query heads kept) */
    for (int d = G - 1; d >= 1 && *na < AC_PUZZLE_MAX_V - 1; d--)
        if (G % d == 0 && s->n_heads % d == 0 && d * 8 >= G) kv[(*na)++] = d;
    kv[(*na)++] = 0;
    *nf = 0;
    ffn[(*nf)++] = F;
    for (int i = 0; i < o->n_ffn_fracs && *nf < AC_PUZZLE_MAX_V - 1; i++) {
        int w = (int)lround(F * o->ffn_fracs[i] / m) * m;
        if (w < m) w = m;
        if (w < F && !has_int(ffn, *nf, w)) ffn[(*nf)++] = w;
    }
    ffn[(*nf)++] = 0;
}

void ac_puzzle_library_free(ac_puzzle_library *lib) {
    for (int l = 0; l < lib->n_layers; l++)
        for (int v = 0; v < AC_PUZZLE_MAX_V; v++) {
            if (lib->attn_w) ac_model_free(&lib->attn_w[l][v]);
            if (lib->ffn_w) ac_model_free(&lib->ffn_w[l][v]);
        }
    for (int l = 0; lib->attn_w && l < lib->n_layers; l++) free(lib->attn_w[l]);
    for (int l = 0; lib->ffn_w && l < lib->n_layers; l++) free(lib->ffn_w[l]);
    free(lib->attn_w);
    free(lib->ffn_w);
    free(lib->kv);
    free(lib->ffn);
    free(lib->na);
    free(lib->nf);
    free(lib->score);
    free(lib->attn_loss);
    free(lib->ffn_loss);
    memset(lib, 0, sizeof *lib);
}

static int lib_alloc(ac_puzzle_library *lib, int L, int keep) {
    memset(lib, 0, sizeof *lib);
    lib->n_layers = L;
    lib->kv = calloc(L, sizeof *lib->kv);
    lib->ffn = calloc(L, sizeof *lib->ffn);
    lib->na = calloc(L, sizeof(int));
    lib->nf = calloc(L, sizeof(int));
    lib->score = calloc(L, sizeof *lib->score);
    lib->attn_loss = calloc(L, sizeof *lib->attn_loss);
    lib->ffn_loss = calloc(L, sizeof *lib->ffn_loss);
    int ok = lib->kv && lib->ffn && lib->na && lib->nf && lib->score && lib->attn_loss && lib->ffn_loss;
    if (ok && keep) {
        lib->attn_w = calloc(L, sizeof(ac_model *));
        lib->ffn_w = calloc(L, sizeof(ac_model *));
        ok = lib->attn_w && lib->ffn_w;
        for (int l = 0; ok && l < L; l++)
            ok = (lib->attn_w[l] = calloc(AC_PUZZLE_MAX_V, sizeof(ac_model))) &&
                 (lib->ffn_w[l] = calloc(AC_PUZZLE_MAX_V, sizeof(ac_model)));
    }
    return ok ? 0 : -1;
}

/* ---- one layer of the parent as a one-layer model, and its variants ---- */

typedef struct {
    const ac_model *m;
    int l;
    ac_arch a1;          /* the parent's layer l alone (layers points into m's arch) */
    ac_model src1;       /* a view of m with that layer (nothing owned) */
    ac_importance imp1;  /* imp's orders of layer l (nothing owned) */
} layer_view;

static void view_init(layer_view *v, const ac_model *m, const ac_importance *imp, int l) {
    memset(v, 0, sizeof *v);
    v->m = m;
    v->l = l;
    v->a1 = m->a;
    v->a1.n_layers = 1;
    v->a1.vocab = 1;
    v->a1.layers = &m->a.layers[l];
    v->src1 = *m;
    v->src1.a = v->a1;
    v->src1.L = &m->L[l];
    v->src1.wmap = NULL;
    v->src1.wown = 0;
    v->imp1 = *imp;
    v->imp1.n_layers = 1;
#define OFF(f) v->imp1.f = imp->f ? &imp->f[l] : NULL
    OFF(kv_order), OFF(kv_score), OFF(ffn_order), OFF(ffn_score), OFF(head_order), OFF(head_score);
    OFF(mt_ffn_order), OFF(mt_ffn_score), OFF(expert_order), OFF(expert_score);
#undef OFF
}

/* A one-layer fp32 model of the parent's layer with layer arch d (sliced). */
static int variant_model(const layer_view *v, const ac_layer_arch *d, ac_model *out, ac_err *e) {
    ac_layer_arch lay = *d;
    ac_arch t = v->a1;
    t.layers = &lay;
    return ac_prune(&v->src1, &t, &v->imp1, out, e);
}

/* The tensors of one sub-block of w (attention: sub 0, FFN: sub 1) and
 * their sizes; returns how many. */
static int sub_tensors(const ac_arch *a, ac_layer_w *w, int sub, float **p, size_t *n, int *decay) {
    const ac_layer_arch *s = &a->layers[0];
    size_t H = a->hidden, hd = a->head_dim, Q = (size_t)s->n_heads * hd, KV = (size_t)s->n_kv_heads * hd,
           F = s->ffn;
    int k = 0;
#define T(ptr, cnt, dec) (p[k] = (ptr), n[k] = (cnt), decay[k] = (dec), k++)
    if (sub == 0 && s->n_heads) {
        T(w->in_norm, H, 0), T(w->wq, Q * H, 1), T(w->wk, KV * H, 1), T(w->wv, KV * H, 1), T(w->wo, H * Q, 1);
        if (a->qkv_bias) T(w->bq, Q, 0), T(w->bk, KV, 0), T(w->bv, KV, 0);
        if (a->qk_norm) T(w->q_norm, hd, 0), T(w->k_norm, hd, 0);
    }
    if (sub == 1 && F) T(w->post_norm, H, 0), T(w->wg, F * H, 1), T(w->wu, F * H, 1), T(w->wd, H * F, 1);
#undef T
    return k;
}

/* The buffers one layer's training and scoring share. */
typedef struct {
    ac_stream *s;
    const float *X, *Y; /* [W*n][H] parent's input and output of the layer */
    int W, Wt, n, H, Bt;
    float *xc, *tape, *scr;
} bld_ctx;

static ac_block_grad executor(bld_ctx *c, const ac_model *cm, const ac_layer_w *w, ac_layer_w *gw, int B) {
    ac_block_grad g = {.m = cm,
                       .w = w,
                       .wdt = ST_F32,
                       .gw = gw,
                       .B = B,
                       .T = c->n,
                       .pos = c->s->pos,
                       .cos_t = c->s->cos_t,
                       .sin_t = c->s->sin_t,
                       .tape = c->tape,
                       .scratch = c->scr};
    return g;
}

/* Held-out normalised MSE of the block (cm's layer 0 with weights w) over
 * windows Wt .. W-1. */
static double heldout_loss(bld_ctx *c, const ac_model *cm, const ac_layer_w *w) {
    double num = 0, den = 0;
    size_t row = (size_t)c->n * c->H;
    for (int b = c->Wt; b < c->W; b += c->Bt) {
        int nb = c->W - b < c->Bt ? c->W - b : c->Bt;
        memcpy(c->xc, c->X + b * row, nb * row * 4);
        ac_block_grad g = executor(c, cm, w, NULL, nb);
        ac_block_grad_forward(&g, 0, c->xc);
        const float *y = c->Y + b * row;
        for (size_t i = 0; i < nb * row; i++) {
            double d = (double)c->xc[i] - y[i];
            num += d * d;
            den += (double)y[i] * y[i];
        }
    }
    return den > 0 ? num / den : 0;
}

/* Train sub-block sub of the one-layer model cm for o->steps steps on the
 * training windows: the parent's input in, its output as the target. */
static int train_variant(bld_ctx *c, ac_model *cm, int sub, const ac_puzzle_opts *o, long *tokens, ac_err *e) {
    ac_model g;
    if (ac_model_alloc(&g, &cm->a, e)) return -1;
    float *p[12], *gp[12];
    size_t n[12];
    int decay[12], np = sub_tensors(&cm->a, &cm->L[0], sub, p, n, decay);
    sub_tensors(&cm->a, &g.L[0], sub, gp, n, decay);
    ac_layer_w gw = {0};
    if (sub == 0) gw.in_norm = g.L[0].in_norm, gw.wq = g.L[0].wq, gw.wk = g.L[0].wk, gw.wv = g.L[0].wv,
                  gw.wo = g.L[0].wo, gw.bq = g.L[0].bq, gw.bk = g.L[0].bk, gw.bv = g.L[0].bv,
                  gw.q_norm = g.L[0].q_norm, gw.k_norm = g.L[0].k_norm;
    else gw.post_norm = g.L[0].post_norm, gw.wg = g.L[0].wg, gw.wu = g.L[0].wu, gw.wd = g.L[0].wd;
    ac_adamw_opts ao;
    ac_adamw_defaults(&ao);
    ao.lr = (float)o->lr, ao.min_lr = (float)o->lr / 10, ao.weight_decay = 0, ao.clip = 1, ao.warmup = 0;
    ao.total_steps = o->steps;
    ac_adamw opt;
    ac_adamw_init(&opt, &ao);
    int rc = 0;
    for (int i = 0; i < np && !rc; i++) rc = ac_adamw_add(&opt, p[i], gp[i], n[i], decay[i], e);
    size_t row = (size_t)c->n * c->H;
    int nb = c->Bt < c->Wt ? c->Bt : c->Wt, at = 0;
    for (int step = 0; step < o->steps && !rc; step++) {
        double den = 0;
        for (int b = 0; b < nb; b++) { /* windows at, at+1, .. of the training ones, cycling */
            int w = (at + b) % c->Wt;
            memcpy(c->xc + b * row, c->X + w * row, row * 4);
            const float *y = c->Y + w * row;
            for (size_t i = 0; i < row; i++) den += (double)y[i] * y[i];
        }
        ac_block_grad ex = executor(c, cm, &cm->L[0], &gw, nb);
        ac_block_grad_forward(&ex, 0, c->xc);
        float sc = den > 0 ? (float)(2.0 / den) : 0;
        for (int b = 0; b < nb; b++) { /* the loss's gradient at the output, in place */
            const float *y = c->Y + ((at + b) % c->Wt) * row;
            float *d = c->xc + b * row;
            for (size_t i = 0; i < row; i++) d[i] = sc * (d[i] - y[i]);
        }
        ac_block_grad_backward(&ex, 0, c->xc);
        rc = ac_adamw_step(&opt, NULL, e);
        for (int i = 0; i < np; i++) memset(gp[i], 0, n[i] * 4);
        at = (at + nb) % c->Wt;
        *tokens += (long)nb * c->n;
    }
    ac_adamw_free(&opt);
    ac_model_free(&g);
    return rc;
}

/* The block of attention variant ma and FFN variant mf (one-layer models)
 * as one layer: arch d, weights put together in *w. */
static void compose(const ac_model *ma, const ac_model *mf, int heads, int kv, int ffn, ac_layer_arch *d,
                    ac_layer_w *w) {
    memset(d, 0, sizeof *d);
    memset(w, 0, sizeof *w);
    d->n_heads = kv ? heads : 0, d->n_kv_heads = kv, d->ffn = ffn;
    if (kv) {
        const ac_layer_w *a = &ma->L[0];
        w->in_norm = a->in_norm, w->wq = a->wq, w->wk = a->wk, w->wv = a->wv, w->wo = a->wo;
        w->bq = a->bq, w->bk = a->bk, w->bv = a->bv, w->q_norm = a->q_norm, w->k_norm = a->k_norm;
    }
    if (ffn) {
        const ac_layer_w *f = &mf->L[0];
        w->post_norm = f->post_norm, w->wg = f->wg, w->wu = f->wu, w->wd = f->wd;
    }
}

/* Layer l: every variant sliced and trained, every block scored; the
 * variants' models kept in lib (keep_weights) or freed. */
static int build_layer(bld_ctx *c, const layer_view *v, const ac_puzzle_opts *o, ac_puzzle_library *lib, ac_err *e) {
    int l = v->l, na, nf;
    const ac_layer_arch *s = &v->m->a.layers[l];
    ac_puzzle_variants(&v->m->a, l, o, lib->kv[l], &na, lib->ffn[l], &nf);
    lib->na[l] = na, lib->nf[l] = nf;
    ac_model am[AC_PUZZLE_MAX_V], fm[AC_PUZZLE_MAX_V];
    memset(am, 0, sizeof am);
    memset(fm, 0, sizeof fm);
    int rc = 0;
    for (int a = 0; a < na && !rc; a++) { /* attention variants with the parent's FFN; a no-op has no model */
        if (!lib->kv[l][a]) continue;
        ac_layer_arch d = {.n_heads = s->n_heads, .n_kv_heads = lib->kv[l][a], .ffn = s->ffn};
        rc = variant_model(v, &d, &am[a], e);
        if (!rc && a) rc = train_variant(c, &am[a], 0, o, &lib->train_tokens, e);
        if (!rc) lib->attn_loss[l][a] = heldout_loss(c, &am[a], &am[a].L[0]);
    }
    for (int f = 0; f < nf && !rc; f++) { /* FFN variants with the parent's attention */
        if (!lib->ffn[l][f]) continue;
        ac_layer_arch d = {.n_heads = s->n_heads, .n_kv_heads = s->n_kv_heads, .ffn = lib->ffn[l][f]};
        rc = variant_model(v, &d, &fm[f], e);
        if (!rc && f) rc = train_variant(c, &fm[f], 1, o, &lib->train_tokens, e);
        if (!rc) lib->ffn_loss[l][f] = heldout_loss(c, &fm[f], &fm[f].L[0]);
    }
    if (!rc) { /* the no-op sub-blocks' own losses: the other sub-block alone */
        for (int a = 0; a < na; a++)
            if (!lib->kv[l][a]) lib->attn_loss[l][a] = -1;
        for (int f = 0; f < nf; f++)
            if (!lib->ffn[l][f]) lib->ffn_loss[l][f] = -1;
    }
    for (int a = 0; a < na && !rc; a++)
        for (int f = 0; f < nf; f++) {
            ac_layer_arch d;
            ac_layer_w w;
            compose(&am[a], &fm[f], s->n_heads, lib->kv[l][a], lib->ffn[l][f], &d, &w);
            ac_model cm = {0};
            cm.a = v->a1;
            cm.a.layers = &d;
            cm.wdt = ST_F32;
            double sc = heldout_loss(c, &cm, &w);
            lib->score[l][a * nf + f] = sc;
            if (a == 0 && f == 0) lib->score[l][0] = 0; /* the parent's block itself (fp32 copy: rounding only) */
        }
    for (int a = 0; a < na; a++) {
        if (!rc && lib->attn_w) lib->attn_w[l][a] = am[a];
        else ac_model_free(&am[a]);
    }
    for (int f = 0; f < nf; f++) {
        if (!rc && lib->ffn_w) lib->ffn_w[l][f] = fm[f];
        else ac_model_free(&fm[f]);
    }
    return rc;
}

static int check_model(const ac_arch *a, ac_err *e) {
    if (ac_arch_has_moe(a) || ac_arch_is_hybrid(a))
        return ac_errf(e, "puzzle: mixture-of-experts and hybrid models have no block library yet");
    for (int l = 0; l < a->n_layers; l++)
        if (!a->layers[l].n_heads || !a->layers[l].ffn)
            return ac_errf(e, "puzzle: layer %d of the parent has no attention or no FFN", l);
    return 0;
}

int ac_puzzle_library_build(const ac_model *m, const ac_importance *imp, const int *ids, size_t n, int ctx,
                            const ac_puzzle_opts *o, void (*progress)(void *ud, double frac), void *ud,
                            ac_puzzle_library *lib, ac_err *e) {
    const ac_arch *a = &m->a;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (check_model(a, e)) return -1;
    int W = (int)(n / (size_t)ctx);
    if (W > o->windows) W = o->windows;
    if (W < 2 || o->steps < 0 || o->batch < 1)
        return ac_errf(e, "puzzle: BLD needs at least 2 calibration windows of %d tokens (has %d)", ctx, W);
    int Wh = W / 4 > 0 ? W / 4 : 1, Bt = o->batch < W - Wh ? o->batch : W - Wh;
    if (lib_alloc(lib, a->n_layers, o->keep_weights)) {
        ac_puzzle_library_free(lib);
        return ac_errf(e, "out of memory");
    }
    size_t H = a->hidden, rows = (size_t)W * ctx;
    ac_stream s;
    if (ac_stream_init(&s, m, Bt, ctx, e)) {
        ac_puzzle_library_free(lib);
        return -1;
    }
    layer_view v0;
    view_init(&v0, m, imp, 0);
    size_t tape = 0, scr = ac_block_grad_scratch_floats(&v0.a1, Bt, ctx);
    for (int l = 0; l < a->n_layers; l++) {
        ac_arch one = v0.a1;
        one.layers = &a->layers[l];
        size_t t = ac_block_tape_floats(&one, 0, (size_t)Bt * ctx, 0), sc = ac_block_grad_scratch_floats(&one, Bt, ctx);
        if (t > tape) tape = t;
        if (sc > scr) scr = sc;
    }
    float *X = malloc(rows * H * 4), *Y = malloc(rows * H * 4), *xc = malloc((size_t)Bt * ctx * H * 4),
          *tp = malloc((tape + 1) * 4), *sp = malloc((scr + 1) * 4);
    int rc = X && Y && xc && tp && sp ? 0 : ac_errf(e, "puzzle: out of memory for %d windows of %d tokens", W, ctx);
    if (!rc) rc = ac_stream_embed(m, ids, (long)rows, X, e);
    bld_ctx c = {.s = &s, .X = X, .Y = Y, .W = W, .Wt = W - Wh, .n = ctx, .H = (int)H, .Bt = Bt, .xc = xc, .tape = tp,
                 .scr = sp};
    for (int l = 0; l < a->n_layers && !rc; l++) {
        memcpy(Y, X, rows * H * 4); /* the parent's layer: its output is the target and the next input */
        for (int b = 0; b < W; b += Bt) ac_stream_layer(&s, l, Y + (size_t)b * ctx * H, W - b < Bt ? W - b : Bt, NULL, NULL);
        layer_view v;
        view_init(&v, m, imp, l);
        rc = build_layer(&c, &v, o, lib, e);
        if (rc) ac_errctx(e, "puzzle: layer %d", l);
        float *t = X;
        X = Y, Y = t;
        c.X = X, c.Y = Y;
        if (progress) progress(ud, (l + 1.0) / a->n_layers);
    }
    lib->tokens = (long)rows;
    free(X), free(Y), free(xc), free(tp), free(sp);
    ac_stream_free(&s);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    lib->seconds = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    if (rc) ac_puzzle_library_free(lib);
    return rc;
}

/* ---- the chosen blocks' trained sub-blocks into a student ---- */

static int copy_sub(const ac_model *from, ac_model *to, int l, int sub, ac_err *e) {
    ac_arch ta = to->a;
    ta.n_layers = 1;
    ta.layers = &to->a.layers[l];
    ac_layer_w fw = from->L[0];
    float *sp[12], *dp[12];
    size_t sn[12], dn[12];
    int sd[12], dd[12], ns = sub_tensors(&from->a, &fw, sub, sp, sn, sd), nd = sub_tensors(&ta, &to->L[l], sub, dp, dn, dd);
    if (ns != nd) return ac_errf(e, "puzzle: layer %d of the student does not have the chosen block's shape", l);
    int bf16 = ac_model_wdt(to) == ST_BF16;
    for (int i = 0; i < ns; i++) {
        if (sn[i] != dn[i] || !sp[i] || !dp[i])
            return ac_errf(e, "puzzle: layer %d of the student does not have the chosen block's shape", l);
        if (bf16 && dd[i]) ac_from_f32(dp[i], sp[i], ST_BF16, sn[i], NULL); /* a matrix; norms and biases stay fp32 */
        else memcpy(dp[i], sp[i], sn[i] * 4);
    }
    return 0;
}

int ac_puzzle_realize(const ac_puzzle_library *lib, const int *choice, ac_model *student, ac_err *e) {
    if (!lib->attn_w || !lib->ffn_w) return ac_errf(e, "puzzle: the library kept no trained weights");
    if (student->a.n_layers != lib->n_layers || (student->wdt != ST_F32 && !student->wown && student->wdt))
        return ac_errf(e, "puzzle: the student must have every layer and weights of its own");
    for (int l = 0; l < lib->n_layers; l++) {
        int nf = lib->nf[l], a = choice[l] / nf, f = choice[l] % nf;
        if (a && lib->kv[l][a] && copy_sub(&lib->attn_w[l][a], student, l, 0, e)) return -1;
        if (f && lib->ffn[l][f] && copy_sub(&lib->ffn_w[l][f], student, l, 1, e)) return -1;
    }
    return 0;
}
