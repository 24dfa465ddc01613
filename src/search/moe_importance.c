/* moe_importance.c - see moe_importance_int.h. */
#include "moe_importance_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine.h"
#include "runtime/eval.h"

typedef struct {
    const ac_arch *a;
    double **sum; /* [l][E]: sum over tokens of ||r * y|| */
    double **ch;  /* [l][E*Fe]: sum over forward calls of (mean over the expert's tokens of |act|)^2 */
    long tokens;
} moe_acc;

static void on_act(void *ud, int l, int e, const float *act, int n, int Fe) {
    moe_acc *m = ud;
    double *s = m->ch[l] + (size_t)e * Fe;
    for (int c = 0; c < Fe && n > 0; c++) {
        double a = 0;
        for (int j = 0; j < n; j++) a += fabs((double)act[(size_t)j * Fe + c]);
        s[c] += (a / n) * (a / n);
    }
}

static void on_expert(void *ud, int l, int e, const int *rows, int n, const float *r, int E, const float *y, int H) {
    moe_acc *m = ud;
    for (int j = 0; j < n; j++) {
        double ss = 0;
        for (int c = 0; c < H; c++) ss += (double)y[(size_t)j * H + c] * y[(size_t)j * H + c];
        m->sum[l][e] += fabs((double)r[(size_t)rows[j] * E + e]) * sqrt(ss);
    }
}

static void on_rows(void *ud, int N) { ((moe_acc *)ud)->tokens += N; }

static int by_score_desc(const void *x, const void *y, void *key) {
    double a = ((const double *)key)[*(const int *)x], b = ((const double *)key)[*(const int *)y];
    return a < b ? 1 : a > b ? -1 : *(const int *)x - *(const int *)y; /* equal scores: the lower index first */
}

int ac_expert_importance(const ac_model *m, const int *ids, size_t n, int ctx, int windows, ac_importance *imp,
                         ac_err *e) {
    const ac_arch *a = &m->a;
    int L = a->n_layers;
    moe_acc acc = {a, calloc(L, sizeof(double *)), calloc(L, sizeof(double *)), 0};
    int rc = acc.sum && acc.ch && (imp->expert_order = calloc(L, sizeof(int *))) &&
                     (imp->expert_score = calloc(L, sizeof(double *))) &&
                     (imp->echan_order = calloc(L, sizeof(int *))) && (imp->echan_score = calloc(L, sizeof(double *)))
                 ? 0
                 : ac_errf(e, "out of memory");
    for (int l = 0; !rc && l < L; l++)
        if (a->layers[l].n_experts &&
            (!(acc.sum[l] = calloc(a->layers[l].n_experts, sizeof(double))) ||
             !(acc.ch[l] = calloc((size_t)a->layers[l].n_experts * a->layers[l].expert_ffn, sizeof(double)))))
            rc = ac_errf(e, "out of memory");
    if (!rc) {
        ac_engine_hooks hk = {.ud = &acc, .expert_out = on_expert, .expert_act = on_act, .rows = on_rows};
        ac_ppl_opts o = {.ctx = ctx, .stride = 0, .max_windows = windows, .batch = 4};
        ac_ppl_result pr;
        rc = ac_perplexity(m, ids, n, &o, &hk, NULL, NULL, &pr, e);
    }
    for (int l = 0; !rc && l < L; l++) {
        int E = a->layers[l].n_experts;
        if (!E) continue;
        int *ord = malloc(sizeof(int) * E);
        double *sc = malloc(sizeof(double) * E);
        if (!ord || !sc) {
            free(ord), free(sc);
            rc = ac_errf(e, "out of memory");
            break;
        }
        for (int x = 0; x < E; x++) ord[x] = x, sc[x] = acc.tokens ? acc.sum[l][x] / acc.tokens : 0;
        qsort_r(ord, E, sizeof *ord, by_score_desc, sc);
        imp->expert_order[l] = ord;
        imp->expert_score[l] = sc; /* per expert index (unsorted) */
        int Fe = a->layers[l].expert_ffn, *co = malloc(sizeof(int) * (size_t)E * Fe);
        if (!co) {
            rc = ac_errf(e, "out of memory");
            break;
        }
        for (size_t i = 0; i < (size_t)E * Fe; i++) acc.ch[l][i] = sqrt(acc.ch[l][i]);
        for (int x = 0; x < E; x++) { /* each expert's channels ranked on their own */
            int *o = co + (size_t)x * Fe;
            for (int c = 0; c < Fe; c++) o[c] = c;
            qsort_r(o, Fe, sizeof *o, by_score_desc, acc.ch[l] + (size_t)x * Fe);
        }
        imp->echan_order[l] = co;
        imp->echan_score[l] = acc.ch[l]; /* per channel (unsorted); imp's now */
        acc.ch[l] = NULL;
    }
    for (int l = 0; acc.sum && l < L; l++) free(acc.sum[l]);
    for (int l = 0; acc.ch && l < L; l++) free(acc.ch[l]);
    free(acc.sum);
    free(acc.ch);
    return rc;
}
