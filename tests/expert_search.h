/*
 * expert_search.h - helpers shared by the expert-gate search tests
 * (test_dnas_moe.c, test_dnas_hybrid.c, test_dnas_gain.c): fixture
 * loading, random token ids, logits under expert gates, held-out KL, and
 * the rank of a search's expert choice among every choice of its count.
 * Header-only (static inline), after check.h.
 */
#ifndef AC_TEST_EXPERT_SEARCH_H
#define AC_TEST_EXPERT_SEARCH_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cost/device.h"
#include "runtime/train.h"
#include "search/dnas.h"
#include "search/importance.h"
#include "search/search.h"
#include "search/slice.h"

/* A search problem with the tables it points at. */
typedef struct {
    ac_cost_table t;
    ac_engine_profile pr;
    ac_workload w;
    ac_search_problem p;
} problem_t;

/* An importance whose only content ac_prune reads in these tests: identity orders for KV groups, FFN and hidden
 * channels and each expert's channels, and the expert orders (identity until a test sets them). */
typedef struct {
    ac_importance imp;
    int *kv[16], *ffn[16], *hid, *ex[16], *ch[16];
} orders_t;

static inline void es_orders_init(orders_t *o, const ac_arch *a) {
    memset(o, 0, sizeof *o);
    o->imp.n_layers = a->n_layers;
    o->imp.hidden = a->hidden;
    o->imp.kv_order = o->kv;
    o->imp.ffn_order = o->ffn;
    o->imp.expert_order = o->ex;
    o->imp.echan_order = o->ch;
    o->hid = malloc(sizeof(int) * a->hidden);
    for (int c = 0; c < a->hidden; c++) o->hid[c] = c;
    o->imp.hid_order = o->hid;
    for (int l = 0; l < a->n_layers && l < 16; l++) {
        const ac_layer_arch *L = &a->layers[l];
        o->kv[l] = malloc(sizeof(int) * (L->n_kv_heads + 1));
        o->ffn[l] = malloc(sizeof(int) * (L->ffn + 1));
        o->ex[l] = malloc(sizeof(int) * (L->n_experts + 1));
        o->ch[l] = malloc(sizeof(int) * ((size_t)L->n_experts * L->expert_ffn + 1));
        for (int i = 0; i < L->n_experts * L->expert_ffn; i++) o->ch[l][i] = i % L->expert_ffn;
        for (int i = 0; i < L->n_kv_heads; i++) o->kv[l][i] = i;
        for (int i = 0; i < L->ffn; i++) o->ffn[l][i] = i;
        for (int i = 0; i < L->n_experts; i++) o->ex[l][i] = i;
    }
}

static inline void es_orders_free(orders_t *o) {
    free(o->hid);
    for (int l = 0; l < o->imp.n_layers && l < 16; l++) free(o->kv[l]), free(o->ffn[l]), free(o->ex[l]), free(o->ch[l]);
}

/* Fixture model `name` (build/fixtures/models) loaded as fp32 into m; -1 when absent (or failing: a CHECK). */
static inline int es_load(const char *name, ac_model *m) {
    char fx[1024], dir[1200], cfg[1300];
    ac_err e;
    ck_build_path(fx, sizeof fx, "fixtures");
    snprintf(dir, sizeof dir, "%s/models/%s", fx, name);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    if (!ck_exists(cfg)) return -1;
    if (ac_model_load(dir, m, &e)) {
        CHECK(0, "%s: %s", name, e.msg);
        return -1;
    }
    return 0;
}

/* n random token ids of vocabulary V (an LCG from seed). */
static inline int *es_rand_ids(size_t n, int V, unsigned long long s) {
    int *ids = malloc(sizeof(int) * n);
    for (size_t i = 0; ids && i < n; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        ids[i] = (int)((s >> 33) % (unsigned long long)V);
    }
    return ids;
}

/* Logits [B*T][V] of m on tok (the frozen trainer's forward) with expert gates eg[l] and expert channel gates
 * cg[l] (NULL, or NULL rows: 1). */
static inline float *es_logits_gated(ac_model *m, const int *tok, int B, int T, const float *const *eg,
                                     const float *const *cg) {
    ac_trainer t;
    ac_err e;
    if (ac_trainer_init_frozen(&t, m, B, T, &e)) {
        CHECK(0, "%s", e.msg);
        return NULL;
    }
    for (int l = 0; l < m->a.n_layers; l++) {
        const ac_layer_arch *L = &m->a.layers[l];
        if (eg && eg[l]) memcpy(t.gate.expert[l], eg[l], sizeof(float) * L->n_experts);
        if (cg && cg[l]) memcpy(t.gate.echan[l], cg[l], sizeof(float) * L->n_experts * L->expert_ffn);
    }
    float *out = NULL;
    if (ac_train_forward(&t, tok, B, T, &e) == 0 && (out = malloc(sizeof(float) * B * T * m->a.vocab)))
        memcpy(out, t.logits, sizeof(float) * B * T * m->a.vocab);
    CHECK(out, "forward: %s", e.msg);
    ac_trainer_free(&t);
    return out;
}

static inline float *es_logits(ac_model *m, const int *tok, int B, int T, const float *const *eg) {
    return es_logits_gated(m, tok, B, T, eg, NULL);
}

/* The search tests' fixture: model `name` in fp32, nids random calibration ids (64 windows of 32), nh held-out
 * ids, and its importance (32-token windows); 1 when ready, 0 when the fixture is absent or failed. */
static inline int es_setup(const char *name, ac_model *m, ac_importance *imp, int **ids, size_t *nids, int **hids,
                           size_t nh) {
    ac_err e;
    if (es_load(name, m)) return 0;
    *nids = 64 * 32;
    *ids = es_rand_ids(*nids, m->a.vocab, 5);
    *hids = es_rand_ids(nh, m->a.vocab, 99);
    if (ac_importance_compute(m, *ids, *nids, 32, 64, 0, NULL, NULL, imp, &e)) {
        CHECK(0, "importance: %s", e.msg);
        return 0;
    }
    return 1;
}

/* On H100's roofline (bf16, batch 1, 64 + 16 tokens), experts pruned, llama target, grids fm / hm: a parameter
 * limit that every MoE layer of m down to `keep` experts meets, with a margin under one expert more. */
static inline void es_make_problem(problem_t *P, const ac_model *m, const ac_importance *imp, const int *ids,
                                   size_t nids, int keep, int fm, int hm) {
    ac_err e;
    ac_cost_roofline(ac_device_spec_find("H100"), "bf16", &P->t, &e);
    P->w = (ac_workload){.batch = 1, .prompt_len = 64, .gen_len = 16};
    ac_engine_profile_default(&P->pr, 0);
    P->p = (ac_search_problem){.table = &P->t,
                               .workload = &P->w,
                               .profile = &P->pr,
                               .imp = imp,
                               .base = &m->a,
                               .opts = {.steps = 200,
                                        .seed = 1,
                                        .lr = 0.03,
                                        .ffn_multiple = fm,
                                        .hidden_multiple = hm,
                                        .prune_experts = 1,
                                        .target = AC_EXPORT_LLAMA},
                               .calib_ids = ids, /* (Minitron's scoring and the top-k loss passes) */
                               .n_calib = nids,
                               .ctx = 32};
    ac_arch a;
    ac_arch_copy(&a, &m->a, &e);
    for (int l = 0; l < a.n_layers; l++)
        if (a.layers[l].n_experts) a.layers[l].n_experts = keep;
    double pk = ac_arch_params(&a);
    for (int l = 0; l < a.n_layers; l++)
        if (a.layers[l].n_experts) a.layers[l].n_experts = keep + 1;
    P->p.limits.max_params = pk + 0.25 * (ac_arch_params(&a) - pk);
    ac_arch_free(&a);
}

/* Mean KL(p || q) per row of two logit sets [N][V]. */
static inline double es_mean_kl(const float *p, const float *q, int N, int V) {
    double kl = 0;
    for (int i = 0; i < N; i++) {
        const float *a = p + (size_t)i * V, *b = q + (size_t)i * V;
        double ma = a[0], mb = b[0], sa = 0, sb = 0, k = 0;
        for (int v = 1; v < V; v++) ma = fmax(ma, a[v]), mb = fmax(mb, b[v]);
        for (int v = 0; v < V; v++) sa += exp(a[v] - ma), sb += exp(b[v] - mb);
        for (int v = 0; v < V; v++) {
            double la = a[v] - ma - log(sa), lb = b[v] - mb - log(sb);
            k += exp(la) * (la - lb);
        }
        kl += k;
    }
    return kl / N;
}

/* Expert order of a layer: the experts of mask (bit x set: kept) first, ascending, then the others. */
static inline void es_order_from_mask(int *order, int E, unsigned mask) {
    int k = 0;
    for (int x = 0; x < E; x++)
        if (mask >> x & 1) order[k++] = x;
    for (int x = 0; x < E; x++)
        if (!(mask >> x & 1)) order[k++] = x;
}

/* Held-out KL to teacher [B*T][V] of m pruned to a with imp's orders, on hids (B x T). */
static inline double es_heldout_kl(ac_model *m, const ac_arch *a, const ac_importance *imp, const float *teacher,
                                   const int *hids, int B, int T) {
    ac_model pm;
    ac_err e;
    if (ac_prune(m, a, imp, &pm, &e)) {
        CHECK(0, "prune: %s", e.msg);
        return NAN;
    }
    float *lg = es_logits(&pm, hids, B, T, NULL);
    double kl = lg ? es_mean_kl(teacher, lg, B * T, m->a.vocab) : NAN;
    free(lg);
    ac_model_free(&pm);
    return kl;
}

/* The search's expert choice (arch r, orders ord) ranked among every choice of the same count in each kept MoE
 * layer (same structure, same other orders), on held-out KL: returns the fraction of choices strictly better;
 * *kl_self, *kl_best the choice's and the best one's. ord's expert orders are put back. */
static inline double es_rank_experts(ac_model *m, const ac_arch *r, ac_importance *ord, const float *teacher,
                                     const int *hids, int B, int T, double *kl_self, double *kl_best) {
    int moe[16], nm = 0, E = 0, k = 0;
    for (int l = 0; l < m->a.n_layers && nm < 16; l++)
        if (m->a.layers[l].n_experts && r->layers[l].n_experts)
            moe[nm++] = l, E = m->a.layers[l].n_experts, k = r->layers[l].n_experts;
    int *keep[16];
    for (int i = 0; i < nm; i++) {
        keep[i] = malloc(sizeof(int) * E);
        memcpy(keep[i], ord->expert_order[moe[i]], sizeof(int) * E);
    }
    *kl_self = es_heldout_kl(m, r, ord, teacher, hids, B, T);
    unsigned subs[64]; /* every k-subset per layer: masks of popcount k */
    int ns = 0;
    for (unsigned s = 0; s < (1u << E) && ns < 64; s++)
        if (__builtin_popcount(s) == k) subs[ns++] = s;
    long total = 1, better = 0;
    for (int i = 0; i < nm; i++) total *= ns;
    *kl_best = INFINITY;
    for (long c = 0; c < total; c++) {
        long q = c;
        for (int i = 0; i < nm; i++, q /= ns) es_order_from_mask(ord->expert_order[moe[i]], E, subs[q % ns]);
        double kl = es_heldout_kl(m, r, ord, teacher, hids, B, T);
        better += kl < *kl_self - 1e-12;
        *kl_best = fmin(*kl_best, kl);
    }
    for (int i = 0; i < nm; i++) {
        memcpy(ord->expert_order[moe[i]], keep[i], sizeof(int) * E);
        free(keep[i]);
    }
    return (double)better / total;
}

/* Whether student pm (m pruned to arch a with imp's expert orders) holds, in every kept expert of every MoE layer
 * (without a hidden cut), the source expert's w best channels by imp->echan_score (lower index first on equal
 * scores), ascending: its gate and up rows and its down columns equal the source's there. *checked gets the count
 * of experts compared. Returns 1 when every one matches. */
static inline int es_experts_hold_best_channels(const ac_model *m, const ac_model *pm, const ac_arch *a,
                                                const ac_importance *imp, int w, int *checked) {
    int bad = 0, H = m->a.hidden;
    *checked = 0;
    for (int l = 0; l < m->a.n_layers && w > 0 && pm->L; l++) {
        int E = m->a.layers[l].n_experts, Fe = m->a.layers[l].expert_ffn, Et = a->layers[l].n_experts;
        if (!E || !Et) continue;
        int *ek = ac_prune_kept(imp->expert_order[l], Et);
        for (int x = 0; ek && x < Et; x++) {
            const double *sc = imp->echan_score[l] + (size_t)ek[x] * Fe;
            const ac_layer_w *d = &pm->L[l], *s = &m->L[l];
            int k = 0;
            for (int c = 0; c < Fe; c++) {
                int better = 0;
                for (int o = 0; o < Fe; o++) better += sc[o] > sc[c] || (sc[o] == sc[c] && o < c);
                if (better >= w) continue;
                if (s->eg && s->eg[ek[x]])
                    bad |= memcmp(d->eg[x] + (size_t)k * H, s->eg[ek[x]] + (size_t)c * H, sizeof(float) * H);
                bad |= memcmp(d->eu[x] + (size_t)k * H, s->eu[ek[x]] + (size_t)c * H, sizeof(float) * H);
                for (int h = 0; h < H; h++) bad |= d->ed[x][(size_t)h * w + k] != s->ed[ek[x]][(size_t)h * Fe + c];
                k++;
            }
            bad |= k != w;
            ++*checked;
        }
        free(ek);
    }
    return !bad;
}

/* Two gate trainings of `steps` steps (g[2], their last task gradients tg[2]; ok 0 when one failed), the resident
 * checkpoint's first: a CHECK that their log_alphas and task gradients are the same bit for bit (and move). */
static inline void es_check_same_training(const ac_dnas_gates *g, double *const *tg, int ok, int steps) {
    int np = ok ? g[0].np : 0, same = ok && np == g[1].np && !memcmp(g[0].la, g[1].la, sizeof(double) * np) &&
                                      !memcmp(tg[0], tg[1], sizeof(double) * np);
    double gn = 0;
    for (int i = 0; i < np; i++) gn += tg[0][i] * tg[0][i];
    printf("   %d gates, %d steps: resident BF16 vs fp32 log_alphas and task gradient (|g| %.3g) %s\n", np, steps,
           sqrt(gn), same ? "identical" : "DIFFER");
    CHECK(same && gn > 0, "resident and fp32 gate training differ");
}

/* A gate training as a test runs it: `steps` steps on the CPU (cuda 0) or on the CUDA plugin's trainer (1), g
 * and tg (the last step's task gradient, NULL: not wanted) as ac_dnas_train_gates'; 0 on success. */
typedef int (*es_train_fn)(void *ud, int steps, int cuda, ac_dnas_gates *g, double *tg);

/* The same gate training on CUDA and on the CPU: *rel the first step's task gradients' relative difference
 * (|cpu - cuda| / |cpu|, *gn |cpu|), *dla the log_alphas' largest difference after `steps` steps, *np the gates
 * (at most 4096). 0 when every run succeeded. */
static inline int es_cuda_vs_cpu(es_train_fn f, void *ud, int steps, double *rel, double *gn, double *dla, int *np) {
    ac_dnas_gates g[2];
    double *tg[2] = {calloc(4096, sizeof(double)), calloc(4096, sizeof(double))}, num = 0, den = 0;
    int ok = tg[0] && tg[1] && !f(ud, 1, 0, &g[0], tg[0]) && !f(ud, 1, 1, &g[1], tg[1]);
    *np = ok ? g[0].np : 0, *dla = 0;
    for (int i = 0; i < *np; i++) num += (tg[0][i] - tg[1][i]) * (tg[0][i] - tg[1][i]), den += tg[0][i] * tg[0][i];
    for (int c = 0; ok && c < 2; c++) ac_dnas_gates_free(&g[c]);
    ok = ok && !f(ud, steps, 0, &g[0], NULL) && !f(ud, steps, 1, &g[1], NULL);
    for (int i = 0; ok && i < *np; i++) *dla = fmax(*dla, fabs(g[0].la[i] - g[1].la[i]));
    for (int c = 0; ok && c < 2; c++) ac_dnas_gates_free(&g[c]);
    *rel = sqrt(num / (den + 1e-300)), *gn = sqrt(den);
    free(tg[0]), free(tg[1]);
    return ok && den > 0 ? 0 : -1;
}

#endif
