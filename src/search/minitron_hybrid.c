/*
 * minitron_hybrid.c - the Minitron arm on a hybrid Mamba-Transformer
 * (nemotron_h): Model-Optimizer's uniform grid over the axes its Mamba
 * plugin searches, plus per-layer-type depth (see minitron.h for the
 * dense grid it follows and ssm_prune.h for the slicing):
 * - hidden_size, ffn_hidden_size (the MLP layers), num_moe_experts (the MoE
 *   layers, with search.prune_experts), moe_ffn_hidden_size (every routed
 *   expert's width, with search.prune_expert_ffn; each expert keeps its own
 *   best channels by Model-Optimizer's expert-width score, moe_importance),
 *   moe_shared_expert_intermediate_size (the shared expert's width, with
 *   search.prune_expert_ffn too; its channels ranked by the MLP statistic at
 *   its down_proj input, ssm_prune.h's ac_rank_shared):
 *   divisor grids capped at the top 40 % of their choices, as the dense arm;
 * - mamba_num_heads: multiples of n_groups (MambaNumHeadsHp's choices, the
 *   same number kept in every group), divisor n_groups x the dense rule's
 *   divisor of heads per group, top 40 %; mamba_head_dim (the same head
 *   dims kept in every head of a layer, ranked by the L2 over the heads),
 *   top 40 %;
 * - attention: Model-Optimizer's num_attention_heads (heads trimmed within
 *   every KV group) and num_query_groups (whole KV groups kept with their
 *   heads) as one axis of the pairs slice.c can cut (one of the two moves at
 *   a time), ordered by query heads, top 40 %;
 * - depth per layer type: of each type's layers (Mamba, attention, MLP,
 *   MoE) the lowest-scored by 1 - cos(input, output) removed, up to 20 % of
 *   that type's layers and at least one when it has two or more, never its
 *   last one. Model-Optimizer's num_layers is type-blind; per type the cost
 *   model sees what each removal buys (attention layers hold the KV cache,
 *   Mamba layers a fixed state).
 * The grid is filtered by the cost model and the limits, the
 * minitron.top_k (AC_MINITRON_TOP_K) feasible points closest to the binding limit are each
 * pruned for real (ac_prune; ac_prune_bf16 for a 16-bit base) and scored by
 * calibration perplexity.
 */
#include "search/minitron.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "cost/engines.h"
#include "runtime/eval.h"
#include "search/slice.h"
#include "minitron_int.h"

enum { T_MAMBA, T_ATTN, T_MLP, T_MOE, N_TYPES };
static const char *TYPE_NAME[N_TYPES] = {"mamba", "attention", "mlp", "moe"};

static int type_of(const ac_layer_arch *L) {
    return L->ssm_heads ? T_MAMBA : L->n_heads ? T_ATTN : L->n_experts ? T_MOE : T_MLP;
}

/* axes: 0 hidden, 1 ffn, 2 attention pair, 3 mamba heads, 4 experts, 5 mamba head dim, 6 expert width, 7 shared
 * expert width (the NW width axes), then the layers kept per type */
#define NW 8
#define AX_D NW
#define NHX (NW + N_TYPES)
typedef struct {
    const char *name;
    int n, start, *v; /* choices ascending; the grid takes v[start..n) */
} hax;

typedef struct {
    int v[NHX];
    ac_cost cost;
    double viol, nll;
    int scored, index;
} hcand;

typedef struct {
    const ac_layer_arch *first[N_TYPES]; /* each type's shape (uniform), NULL when absent */
    int count[N_TYPES];
    int *pairs_kv, *pairs_q; /* attention axis: value i is (pairs_kv[i], pairs_q[i]) */
    int *order;              /* layers by block influence, best first */
} hbase;

static int check_base(const ac_arch *b, hbase *hb, ac_err *e) {
    for (int l = 0; l < b->n_layers; l++) {
        const ac_layer_arch *L = &b->layers[l];
        int t = type_of(L);
        if (!L->n_heads + !L->ffn + !L->ssm_heads + !L->n_experts != 3)
            return ac_errf(e, "minitron: nemotron_h layer %d must hold exactly one mixer", l);
        if (hb->first[t] && memcmp(hb->first[t], L, sizeof *L))
            return ac_errf(e, "minitron: the base model's %s layers must be uniform (layer %d differs)", TYPE_NAME[t],
                           l);
        if (!hb->first[t]) hb->first[t] = L;
        hb->count[t]++;
    }
    return 0;
}

/* A width axis on a divisor grid, capped as the dense arm caps it; max 0: one choice, 0. */
static int width_axis(hax *x, const char *name, int max, int divisor, int searched) {
    x->name = name;
    x->v = malloc(sizeof(int) * (max + 2));
    if (!x->v) return -1;
    if (!max) {
        x->v[0] = 0, x->n = 1, x->start = 0;
        return 0;
    }
    x->n = ac_minitron_choices(max, divisor, x->v);
    x->start = searched ? ac_minitron_cap_start(x->n, AC_MINITRON_MAX_WIDTH_PRUNING) : x->n - 1;
    return 0;
}

/* Layers kept of a type with n layers: n - r for r up to 20 % of n (at least 1 when n >= 2). */
static int depth_axis(hax *x, const char *name, int n) {
    int rmax = n >= 2 ? (int)(AC_MINITRON_MAX_DEPTH_PRUNING * n) : 0;
    if (n >= 2 && rmax < 1) rmax = 1;
    x->name = name;
    x->v = malloc(sizeof(int) * (rmax + 2));
    if (!x->v) return -1;
    x->n = rmax + 1;
    for (int i = 0; i < x->n; i++) x->v[i] = n - rmax + i;
    x->start = 0;
    return 0;
}

/* The attention pairs (kv, query heads): every group with h heads each, or
 * g < G whole groups; ascending by query heads; the top 40 %. */
static int attn_axis(hax *x, hbase *hb) {
    const ac_layer_arch *A = hb->first[T_ATTN];
    int G = A ? A->n_kv_heads : 0, grp = A ? A->n_heads / G : 0, n = 0;
    x->name = "attention_heads_kv_groups";
    x->v = malloc(sizeof(int) * (G + grp + 2));
    hb->pairs_kv = malloc(sizeof(int) * (G + grp + 2));
    hb->pairs_q = malloc(sizeof(int) * (G + grp + 2));
    if (!x->v || !hb->pairs_kv || !hb->pairs_q) return -1;
    if (!A) {
        hb->pairs_kv[0] = hb->pairs_q[0] = x->v[0] = 0;
        x->n = 1, x->start = 0;
        return 0;
    }
    /* merge two ascending lists by query heads: (g, g*grp) for g < G and (G, h*G) for every h */
    int g = 1, h = 1;
    while (g < G || h <= grp) {
        int qg = g < G ? g * grp : 1 << 30, qh = h <= grp ? h * G : 1 << 30;
        if (qg < qh)
            hb->pairs_kv[n] = g, hb->pairs_q[n] = qg, g++;
        else
            hb->pairs_kv[n] = G, hb->pairs_q[n] = qh, h++;
        x->v[n] = n;
        n++;
    }
    x->n = n;
    x->start = ac_minitron_cap_start(n, AC_MINITRON_MAX_WIDTH_PRUNING);
    return 0;
}

/* The architecture of a grid point. */
static int cand_arch(const ac_arch *base, const hbase *hb, const int *v, ac_arch *a, ac_err *e) {
    if (ac_arch_copy(a, base, e)) return -1;
    a->hidden = v[0];
    if (v[5] > 0) a->ssm_head_dim = v[5]; /* model-wide, as nemotron_h's config holds it */
    int kept[N_TYPES] = {0};
    for (int r = 0; r < base->n_layers; r++) { /* by block influence: each type keeps its best v[AX_D + t] */
        int l = hb->order[r], t = type_of(&base->layers[l]);
        ac_layer_arch *L = &a->layers[l];
        if (kept[t]++ >= v[AX_D + t]) {
            *L = (ac_layer_arch){0};
            continue;
        }
        if (t == T_MAMBA) L->ssm_heads = v[3];
        if (t == T_ATTN) L->n_kv_heads = hb->pairs_kv[v[2]], L->n_heads = hb->pairs_q[v[2]];
        if (t == T_MLP) L->ffn = v[1];
        if (t == T_MOE) L->n_experts = v[4];
        if (t == T_MOE && v[6] > 0) L->expert_ffn = v[6]; /* one width for every expert, as the config holds it */
    }
    if (v[7] > 0) a->shared_ffn = v[7]; /* model-wide, as the config holds it */
    return 0;
}

static int predict(const ac_search_problem *p, const hbase *hb, hcand *c, ac_err *e) {
    ac_arch a;
    ac_carch ca;
    if (cand_arch(p->base, hb, c->v, &a, e)) return -1;
    int rc = ac_carch_from_arch(&a, &ca, e);
    if (!rc) {
        ac_cost_predict(p->table, &ca, p->workload, p->profile, 0, &c->cost);
        ac_carch_free(&ca);
        c->viol = ac_constraints_violation(&p->limits, &c->cost);
    }
    ac_arch_free(&a);
    return rc;
}

static int cmp_cand(const void *x, const void *y) {
    const hcand *a = x, *b = y;
    int fa = a->viol <= 1e-12, fb = b->viol <= 1e-12;
    if (fa != fb) return fa ? -1 : 1; /* feasible first */
    if (fa && a->viol != b->viol) return a->viol > b->viol ? -1 : 1; /* closest to the binding limit */
    if (!fa && a->viol != b->viol) return a->viol < b->viol ? -1 : 1; /* least violation */
    if (a->cost.params != b->cost.params) return a->cost.params > b->cost.params ? -1 : 1;
    return a->index - b->index;
}

/* Mean NLL of candidate a pruned for real, on the tail of the calibration tokens (up to 16 windows of ctx); a 16-bit
 * base's candidate as a BF16 student (ac_prune_bf16: the job's students, half an fp32 one's memory beside the
 * mapping), an fp32 base's as an fp32 one; on the GPU with a local CUDA target (p->cuda), as the job evaluates. */
static int score(const ac_search_problem *p, const ac_importance *view, const ac_arch *a, double *nll, ac_err *e) {
    int ctx = p->ctx > 1 ? p->ctx : 128;
    size_t nw = p->n_calib / ctx < 16 ? p->n_calib / ctx : 16;
    if (nw < 1)
        return ac_errf(e, "minitron: calibration text has %zu tokens, fewer than one window of %d", p->n_calib, ctx);
    ac_model pm;
    int bf = ac_model_wdt(p->model) != ST_F32;
    if (bf ? ac_prune_bf16(p->model, a, view, &pm, e) : ac_prune(p->model, a, view, &pm, e)) return -1;
    ac_ppl_opts o = {.ctx = ctx, .stride = 0, .max_windows = (int)nw, .batch = 4, .cuda = p->cuda};
    ac_ppl_result r;
    int rc = ac_perplexity(&pm, p->calib_ids + p->n_calib - nw * ctx, nw * ctx, &o, NULL, NULL, NULL, &r, e);
    ac_model_free(&pm);
    if (!rc) *nll = r.nll;
    return rc;
}

static json_t *cand_json(const ac_search_problem *p, const hbase *hb, const hcand *c) {
    json_t *o = json_pack("{s:i,s:o,s:o,s:f,s:f}", "hidden_size", c->v[0], "predicted", ac_cost_to_json(&c->cost),
                          "constraints", ac_constraints_report(&p->limits, &c->cost), "violation", c->viol, "params",
                          c->cost.params);
    if (hb->first[T_MLP]) json_object_set_new(o, "ffn_hidden_size", json_integer(c->v[1]));
    if (hb->first[T_ATTN]) {
        json_object_set_new(o, "num_attention_heads", json_integer(hb->pairs_q[c->v[2]]));
        json_object_set_new(o, "num_query_groups", json_integer(hb->pairs_kv[c->v[2]]));
    }
    if (hb->first[T_MAMBA]) json_object_set_new(o, "mamba_num_heads", json_integer(c->v[3]));
    if (hb->first[T_MAMBA]) json_object_set_new(o, "mamba_head_dim", json_integer(c->v[5]));
    if (hb->first[T_MOE]) json_object_set_new(o, "num_moe_experts", json_integer(c->v[4]));
    if (hb->first[T_MOE]) json_object_set_new(o, "moe_ffn_hidden_size", json_integer(c->v[6]));
    if (hb->first[T_MOE] && p->base->shared_ffn)
        json_object_set_new(o, "moe_shared_expert_intermediate_size", json_integer(c->v[7]));
    json_t *layers = json_object();
    for (int t = 0; t < N_TYPES; t++)
        if (hb->count[t]) json_object_set_new(layers, TYPE_NAME[t], json_integer(c->v[AX_D + t]));
    json_object_set_new(o, "layers_kept_per_type", layers);
    /* how far each axis is cut: the removed fraction of the base's value (layers: of that type's count) */
    const ac_arch *b = p->base;
    json_t *cut = json_object();
    double base_v[NW] = {b->hidden, hb->first[T_MLP] ? hb->first[T_MLP]->ffn : 0,
                         hb->first[T_ATTN] ? hb->first[T_ATTN]->n_heads : 0,
                         hb->first[T_MAMBA] ? hb->first[T_MAMBA]->ssm_heads : 0,
                         hb->first[T_MOE] ? hb->first[T_MOE]->n_experts : 0,
                         hb->first[T_MAMBA] ? b->ssm_head_dim : 0,
                         hb->first[T_MOE] ? hb->first[T_MOE]->expert_ffn : 0,
                         hb->first[T_MOE] ? b->shared_ffn : 0};
    double kept_v[NW] = {c->v[0], c->v[1], hb->pairs_q[c->v[2]], c->v[3], c->v[4], c->v[5], c->v[6], c->v[7]};
    static const char *CUT[NW] = {"hidden_size",     "ffn_hidden_size", "num_attention_heads", "mamba_num_heads",
                                  "num_moe_experts", "mamba_head_dim",  "moe_ffn_hidden_size",
                                  "moe_shared_expert_intermediate_size"};
    for (int k = 0; k < NW; k++)
        if (base_v[k] > 0) json_object_set_new(cut, CUT[k], json_real(1 - kept_v[k] / base_v[k]));
    for (int t = 0; t < N_TYPES; t++)
        if (hb->count[t]) {
            char name[32];
            snprintf(name, sizeof name, "%s_layers", TYPE_NAME[t]);
            json_object_set_new(cut, name, json_real(1 - (double)c->v[AX_D + t] / hb->count[t]));
        }
    json_object_set_new(o, "removed_fraction", cut);
    if (c->scored) {
        json_object_set_new(o, "calib_nll", json_real(c->nll));
        json_object_set_new(o, "calib_ppl", json_real(exp(c->nll)));
    }
    return o;
}

static json_t *axes_json(const hax *ax, const hbase *hb) {
    json_t *o = json_object();
    for (int k = 0; k < NHX; k++) {
        if (ax[k].n == 1 && ax[k].v[0] == 0) continue; /* a layer type the model lacks */
        json_t *all = json_array(), *sv = json_array();
        for (int i = 0; i < ax[k].n; i++) {
            json_t *val = k == 2 ? json_pack("{s:i,s:i}", "num_query_groups", hb->pairs_kv[ax[k].v[i]],
                                             "num_attention_heads", hb->pairs_q[ax[k].v[i]])
                                 : json_integer(ax[k].v[i]);
            if (i >= ax[k].start) json_array_append(sv, val);
            json_array_append_new(all, val);
        }
        json_object_set_new(o, ax[k].name, json_pack("{s:o,s:o}", "choices", all, "searched", sv));
    }
    return o;
}

/* The grid's size; above AC_MINITRON_HYBRID_MAX_GRID points the width axis
 * with the most searched choices loses every other interior one (its
 * smallest and its base value stay) until the grid fits. */
static int thin(hax *ax) {
    for (;;) {
        long total = 1;
        int widest = -1;
        for (int k = 0; k < NHX; k++) {
            total *= ax[k].n - ax[k].start;
            if (k < NW && ax[k].n - ax[k].start > 2 && (widest < 0 || ax[k].n - ax[k].start > ax[widest].n - ax[widest].start))
                widest = k;
        }
        if (total <= AC_MINITRON_HYBRID_MAX_GRID || widest < 0) return (int)total;
        hax *x = &ax[widest];
        int n = x->start, last = x->n - 1;
        for (int i = x->start; i <= last; i++)
            if (i == x->start || i == last || (i - x->start) % 2 == 0) x->v[n++] = x->v[i];
        x->n = n;
    }
}

/* Keep only the choices divisible by tp (widths split by the serving engine). */
static void keep_multiples(hax *x, int tp) {
    if (tp <= 1 || x->v[x->n - 1] == 0) return;
    int lo = x->v[x->start], n = 0;
    for (int i = 0; i < x->n; i++)
        if (x->v[i] % tp == 0) x->v[n++] = x->v[i];
    x->n = n ? n : 1;
    for (x->start = 0; x->start < x->n - 1 && x->v[x->start] < lo;) x->start++;
}

int ac_minitron_hybrid(const ac_search_problem *p, ac_search_result *r, ac_err *e) {
    memset(r, 0, sizeof *r);
    const ac_arch *b = p->base;
    hbase hb;
    memset(&hb, 0, sizeof hb);
    hax ax[NHX] = {{0}};
    hcand *c = NULL;
    int rc = check_base(b, &hb, e), L = b->n_layers, total = 1, nf = 0;
    if (rc) return -1;
    const ac_layer_arch *M = hb.first[T_MAMBA], *F = hb.first[T_MLP], *X = hb.first[T_MOE];
    int G = b->ssm_groups > 0 ? b->ssm_groups : 1, hpg = M ? M->ssm_heads / G : 0;
    if (!(hb.order = malloc(sizeof(int) * L)) ||
        width_axis(&ax[0], "hidden_size", b->hidden, ac_minitron_divisor(b->hidden), p->opts.prune_hidden) ||
        width_axis(&ax[1], "ffn_hidden_size", F ? F->ffn : 0, F ? ac_minitron_divisor(F->ffn) : 1, 1) ||
        attn_axis(&ax[2], &hb) ||
        width_axis(&ax[3], "mamba_num_heads", M ? M->ssm_heads : 0, G * ac_minitron_divisor(hpg ? hpg : 1), 1) ||
        width_axis(&ax[4], "num_moe_experts", X ? X->n_experts : 0, X ? ac_minitron_divisor(X->n_experts) : 1,
                   p->opts.prune_experts) ||
        /* Model-Optimizer's mamba_head_dim: the same head dims kept in every head (ssm_prune.h) */
        width_axis(&ax[5], "mamba_head_dim", M ? b->ssm_head_dim : 0, ac_minitron_divisor(b->ssm_head_dim), 1) ||
        /* Model-Optimizer's moe_ffn_hidden_size: one width for every expert, each on its own best channels */
        width_axis(&ax[6], "moe_ffn_hidden_size", X ? X->expert_ffn : 0, X ? ac_minitron_divisor(X->expert_ffn) : 1,
                   p->opts.prune_expert_ffn) ||
        /* Model-Optimizer's moe_shared_expert_intermediate_size: the shared expert's channels, scored as an MLP's */
        width_axis(&ax[7], "moe_shared_expert_intermediate_size", X ? b->shared_ffn : 0,
                   ac_minitron_divisor(b->shared_ffn > 0 ? b->shared_ffn : 1), p->opts.prune_expert_ffn)) {
        rc = ac_errf(e, "out of memory");
        goto out;
    }
    static const char *DEPTH[N_TYPES] = {"num_mamba_layers", "num_attention_layers", "num_mlp_layers",
                                         "num_moe_layers"};
    for (int t = 0; t < N_TYPES; t++)
        if (depth_axis(&ax[AX_D + t], DEPTH[t], hb.count[t])) {
            rc = ac_errf(e, "out of memory");
            goto out;
        }
    if (X) /* never below top_k experts */
        while (ax[4].start < ax[4].n - 1 && ax[4].v[ax[4].start] < b->top_k) ax[4].start++;
    if ((rc = ac_search_check_tp(p, 0, e))) goto out;
    int tp = p->profile && p->profile->tp > 1 ? p->profile->tp : 1;
    keep_multiples(&ax[1], tp);
    keep_multiples(&ax[3], tp);
    keep_multiples(&ax[6], tp);
    keep_multiples(&ax[7], tp);
    if (tp > 1 && hb.first[T_ATTN]) { /* attention pairs the serving engine splits tp ways (engines.h) */
        int n = 0, lo = ax[2].v[ax[2].start];
        for (int i = 0; i < ax[2].n; i++)
            if (ac_tp_attn_splits(tp, hb.pairs_q[ax[2].v[i]], hb.pairs_kv[ax[2].v[i]])) ax[2].v[n++] = ax[2].v[i];
        ax[2].n = n ? n : 1; /* the base's pair splits (ac_search_check_tp) */
        for (ax[2].start = 0; ax[2].start < ax[2].n - 1 && ax[2].v[ax[2].start] < lo;) ax[2].start++;
    }
    if (p->imp)
        ac_minitron_layer_order(p->imp, hb.order);
    else /* config only: no scores; the cost model prices any layer of a type alike */
        for (int l = 0; l < L; l++) hb.order[l] = l;
    total = thin(ax);
    if (!(c = calloc(total, sizeof *c))) {
        rc = ac_errf(e, "out of memory");
        goto out;
    }
    for (int i = 0; i < total && !rc; i++) {
        int rem = i;
        for (int k = NHX - 1; k >= 0; k--) {
            int w = ax[k].n - ax[k].start;
            c[i].v[k] = ax[k].v[ax[k].start + rem % w];
            rem /= w;
        }
        c[i].index = i;
        rc = predict(p, &hb, &c[i], e);
        nf += c[i].viol <= 1e-12;
    }
    if (rc) goto out;
    qsort(c, total, sizeof *c, cmp_cand);
    int top_k = p->minitron.top_k > 0 ? p->minitron.top_k : AC_MINITRON_TOP_K; /* minitron.top_k */
    int k = nf < top_k ? nf : top_k, best = 0;
    ac_importance view;
    int scoring = p->imp && p->model && p->calib_ids && k > 0;
    if (scoring) ac_minitron_importance_view(p->imp, &view);
    for (int i = 0; scoring && i < k && !rc; i++) {
        ac_arch a;
        if ((rc = cand_arch(b, &hb, c[i].v, &a, e))) break;
        rc = score(p, &view, &a, &c[i].nll, e);
        ac_arch_free(&a);
        if (rc) break;
        c[i].scored = 1;
        if (c[i].nll < c[best].nll) best = i;
        if (p->emit) ac_minitron_emit_candidate(p, i, k, cand_json(p, &hb, &c[i]));
    }
    if (rc || (rc = cand_arch(b, &hb, c[best].v, &r->arch, e))) goto out;
    r->cost = c[best].cost;
    r->feasible = nf > 0;
    r->steps_run = total;
    json_t *cands = json_array(), *ls = json_array(), *dropped = json_array();
    for (int i = 0; i < (nf ? k : 1); i++) json_array_append_new(cands, cand_json(p, &hb, &c[i]));
    for (int l = 0; l < L; l++) {
        if (p->imp) json_array_append_new(ls, json_real(p->imp->layer_bi[l]));
        const ac_layer_arch *x = &r->arch.layers[l];
        if (!x->n_heads && !x->ffn && !x->ssm_heads && !x->n_experts) json_array_append_new(dropped, json_integer(l));
    }
    r->detail = json_pack(
        "{s:s,s:o,s:i,s:i,s:i,s:o,s:o,s:i,s:b,s:s,s:o}", "algorithm",
        "NVIDIA Model-Optimizer mcore_minitron on a hybrid (nemotron_h): uniform grid on divisor choices (width top "
        "40%; Mamba heads the same number in every group; depth per layer type, up to 20% of each), filtered by the "
        "cost model's limits, top-k closest to the binding limit pruned and scored",
        "axes", axes_json(ax, &hb), "grid_size", total, "grid_feasible", nf, "top_k", top_k,
        "layer_scores_1_minus_cos", ls, "layers_dropped", dropped, "best_candidate", nf ? best : -1, "scored",
        scoring, "scored_on", p->cuda ? "cuda" : "cpu", "candidates", cands);
    ac_minitron_emit_result(p, r, total, nf);
out:
    for (int i = 0; i < NHX; i++) free(ax[i].v);
    free(hb.pairs_kv), free(hb.pairs_q), free(hb.order);
    free(c);
    if (rc) ac_search_result_free(r);
    return rc;
}
