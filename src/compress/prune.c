/* prune.c - see prune.h. */
#include "compress/prune.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "runtime/engine.h"
#include "runtime/eval.h"
#include "runtime/kernels_cpu.h"
#include "search/stream.h"
#include "core/tensor.h"
#include <cblas.h>

/* LAPACK's Cholesky factorisation (OpenBLAS exports it; Debian ships no
 * LAPACKE header for it). The trailing size_t is gfortran's hidden length of
 * the character argument, ignored by OpenBLAS's own C implementation. */
extern void dpotrf_(const char *uplo, const int *n, double *a, const int *lda, int *info, size_t uplo_len);

int ac_repair_stats(const ac_model *src, const int *ids, size_t n, int ctx, int windows, ac_stats *st, ac_err *e) {
    memset(st, 0, sizeof *st);
    for (int l = 0; l < src->a.n_layers; l++)
        if (src->a.layers[l].ffn > AC_REPAIR_MAX_FFN) return 0; /* Gram too large; no repair */
    if (ac_stats_init(st, &src->a, e)) return -1;
    if (ac_stats_want_gram(st, &src->a, e)) {
        ac_stats_free(st);
        return -1;
    }
    ac_ppl_opts o = {.ctx = ctx, .stride = 0, .max_windows = windows, .batch = 4};
    ac_ppl_result pr;
    ac_engine_hooks hk;
    ac_stats_hooks(st, &hk);
    if (ac_perplexity(src, ids, n, &o, &hk, NULL, NULL, &pr, e)) {
        ac_stats_free(st);
        return -1;
    }
    return 0;
}

/* One layer: down_proj's kept columns X (Fk x Ht, column-major in B) solve
 * (G_kk + lambda I) X = G_k: Wd[hk, :]^T, G the FFN activations' Gram.
 * B = W G_k:^T is one sgemm (fp32 Gram and weights, as stored), the solve
 * is in double: dpotrf then two triangular solves. Returns 1 repaired, 0
 * not positive definite (left as pruned), -1 out of memory. */
static int repair_layer(const ac_model *src, ac_model *dst, int l, const int *fk, int Fk, const int *hk, int Ht,
                        const float *G) {
    int F = src->a.layers[l].ffn;
    double *A = malloc(sizeof(double) * Fk * Fk), *B = malloc(sizeof(double) * Fk * Ht);
    float *Gk = malloc(sizeof(float) * Fk * F), *W = malloc(sizeof(float) * Ht * F),
          *Bt = malloc(sizeof(float) * Fk * Ht);
    int rc = -1;
    if (!A || !B || !Gk || !W || !Bt) goto out;
    double tr = 0;
    for (int i = 0; i < Fk; i++) tr += G[(size_t)fk[i] * F + fk[i]];
    double lambda = 1e-2 * tr / Fk + 1e-8;
    for (int i = 0; i < Fk; i++) {
        const float *gr = G + (size_t)fk[i] * F;
        memcpy(Gk + (size_t)i * F, gr, sizeof(float) * F);
        for (int j = 0; j < Fk; j++) A[(size_t)i * Fk + j] = gr[fk[j]] + (i == j ? lambda : 0);
    }
    for (int r = 0; r < Ht; r++) ac_row_f32(W + (size_t)r * F, src->L[l].wd, ac_model_wdt(src), (size_t)hk[r], F);
    /* Bt[r][i] = sum_c W[r][c] Gk[i][c]: row-major Ht x Fk = column-major Fk x Ht */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Ht, Fk, F, 1.0f, W, F, Gk, F, 0.0f, Bt, Fk);
    for (size_t i = 0; i < (size_t)Fk * Ht; i++) B[i] = Bt[i];
    int info = 0;
    dpotrf_("L", &Fk, A, &Fk, &info, 1); /* A symmetric: row- and column-major alike */
    rc = 0;
    if (info != 0) goto out;
    cblas_dtrsm(CblasColMajor, CblasLeft, CblasLower, CblasNoTrans, CblasNonUnit, Fk, Ht, 1.0, A, Fk, B, Fk);
    cblas_dtrsm(CblasColMajor, CblasLeft, CblasLower, CblasTrans, CblasNonUnit, Fk, Ht, 1.0, A, Fk, B, Fk);
    /* [Ht, Fk] row-major = X column-major; a BF16 student's rounded to
     * nearest even (as the export rounds an fp32 one's) */
    float *Wn = ac_model_wdt(dst) == ST_BF16 ? Bt : dst->L[l].wd;
    for (size_t i = 0; i < (size_t)Fk * Ht; i++) Wn[i] = (float)B[i];
    if (Wn == Bt) ac_from_f32(dst->L[l].wd, Bt, ST_BF16, (size_t)Fk * Ht, NULL);
    rc = 1;
out:
    free(A);
    free(B);
    free(Gk);
    free(W);
    free(Bt);
    return rc;
}

/* The ffn_act hook of the streamed pass: layer l's Gram, G += g^T g. */
typedef struct {
    int l;
    float *G;
} gram_acc;

static void gram_ffn_act(void *ud, int l, const float *g, int N, int F) {
    gram_acc *a = ud;
    if (l == a->l && a->G)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, F, F, N, 1.0f, g, F, g, F, 1.0f, a->G, F);
}

/* Does dst prune layer l's FFN to a width the repair takes? */
static int prunes_ffn(const ac_model *src, const ac_model *dst, int l) {
    int F = src->a.layers[l].ffn, Fk = dst->a.layers[l].ffn;
    return Fk > 0 && Fk < F && F <= AC_REPAIR_MAX_FFN;
}

/* Repair layer l of every dst that prunes it, from the Gram G. */
static int repair_layer_all(const ac_model *src, ac_model *const *dst, const ac_importance *const *imp, int ndst, int l,
                            const float *G, int *repaired, ac_err *e) {
    for (int i = 0; i < ndst; i++) {
        if (!prunes_ffn(src, dst[i], l)) continue;
        int Ht = dst[i]->a.hidden, Fk = dst[i]->a.layers[l].ffn;
        int *hk = ac_prune_kept(imp[i]->hid_order, Ht), *fk = ac_prune_kept(imp[i]->ffn_order[l], Fk);
        int r = hk && fk ? repair_layer(src, dst[i], l, fk, Fk, hk, Ht, G) : -1;
        free(hk);
        free(fk);
        if (r < 0) return ac_errf(e, "out of memory repairing layer %d (FFN %d of %d)", l, Fk, src->a.layers[l].ffn);
        repaired[i] += r;
    }
    return 0;
}

int ac_repair_ffn_many(const ac_model *src, ac_model *const *dst, const ac_importance *const *imp, int ndst,
                       const int *ids, size_t n, int ctx, int windows, int *repaired, ac_err *e) {
    const ac_arch *a = &src->a;
    int last = -1; /* the last layer some dst repairs: the pass stops there */
    for (int i = 0; i < ndst; i++) repaired[i] = 0;
    for (int l = 0; l < a->n_layers; l++)
        for (int i = 0; i < ndst; i++)
            if (prunes_ffn(src, dst[i], l)) last = l;
    if (last < 0) return 0;
    if (ctx < 2 || n < (size_t)ctx)
        return ac_errf(e, "repair: %zu calibration tokens, fewer than one window of %d", n, ctx);
    long nwin = (long)(n / ctx);
    if (windows > 0 && nwin > windows) nwin = windows;
    int B = nwin < 4 ? (int)nwin : 4, H = a->hidden;
    float *x = malloc(sizeof(float) * nwin * ctx * H);
    ac_stream st;
    if (!x) return ac_errf(e, "out of memory for the repair's residual stream (%ld x %d x %d floats)", nwin, ctx, H);
    if (ac_stream_init(&st, src, B, ctx, e)) {
        free(x);
        return -1;
    }
    int rc = ac_stream_embed(src, ids, nwin * ctx, x, e);
    for (int l = 0; l <= last && !rc; l++) {
        int F = a->layers[l].ffn, need = 0;
        for (int i = 0; i < ndst; i++) need |= prunes_ffn(src, dst[i], l);
        gram_acc acc = {l, need ? calloc((size_t)F * F, sizeof(float)) : NULL};
        if (need && !acc.G) {
            rc = ac_errf(e, "out of memory for layer %d's FFN Gram (%d x %d floats)", l, F, F);
            break;
        }
        ac_engine_hooks hk = {.ud = &acc, .ffn_act = gram_ffn_act};
        for (long w = 0; w < nwin; w += B) {
            int nb = (int)(nwin - w < B ? nwin - w : B);
            ac_stream_layer(&st, l, x + (size_t)w * ctx * H, nb, NULL, need ? &hk : NULL);
        }
        if (need) rc = repair_layer_all(src, dst, imp, ndst, l, acc.G, repaired, e);
        free(acc.G);
    }
    ac_stream_free(&st);
    free(x);
    return rc;
}

int ac_repair_ffn(const ac_model *src, ac_model *dst, const ac_importance *imp, const int *ids, size_t n, int ctx,
                  int windows, ac_err *e) {
    int repaired;
    return ac_repair_ffn_many(src, &dst, &imp, 1, ids, n, ctx, windows, &repaired, e) ? -1 : repaired;
}
