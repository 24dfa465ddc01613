/* minitron.c - see minitron.h. */
#include "search/minitron.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "minitron_int.h"
#include "runtime/eval.h"
#include "runtime/tasks.h"
#include "search/slice.h"
#include "search/stream.h"

int ac_minitron_divisor(int max) {
    int d = (int)lround(max / 16.0);
    return d < 1 ? 1 : d;
}

int ac_minitron_choices(int max, int divisor, int *out) {
    int n = 0;
    for (int v = divisor; v <= max; v += divisor) out[n++] = v;
    if (n == 0 || out[n - 1] != max) out[n++] = max;
    return n;
}

int ac_minitron_default_divisor(int mo, int max) {
    int d = ac_minitron_divisor(max);
    return d < mo ? d : mo;
}

int ac_minitron_cap_start(int n, double max_pruning) {
    int k = (int)((1.0 - max_pruning) * n);
    return k < n - 1 ? k : n - 1;
}

static const double *g_bi;
static int by_bi_desc(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    if (g_bi[x] != g_bi[y]) return g_bi[x] > g_bi[y] ? -1 : 1;
    return x - y;
}

void ac_minitron_layer_order(const ac_importance *imp, int *order) {
    for (int l = 0; l < imp->n_layers; l++) order[l] = l;
    g_bi = imp->layer_bi;
    qsort(order, imp->n_layers, sizeof(int), by_bi_desc);
}

void ac_minitron_importance_view(const ac_importance *imp, ac_importance *view) {
    *view = *imp;
    if (imp->mt_ffn_order) {
        view->ffn_order = imp->mt_ffn_order;
        view->ffn_score = imp->mt_ffn_score;
    }
    if (imp->mt_hid_order) {
        view->hid_order = imp->mt_hid_order;
        view->hid_score = imp->mt_hid_score;
    }
}

void ac_minitron_compact(ac_model *m) {
    int k = 0, L = m->a.n_layers;
    for (int l = 0; l < L; l++) {
        const ac_layer_arch *la = &m->a.layers[l];
        if ((la->n_heads || la->ffn || la->n_experts || la->ssm_heads) || (k == 0 && l == L - 1)) {
            m->a.layers[k] = m->a.layers[l];
            m->L[k++] = m->L[l];
        }
    }
    m->a.n_layers = k;
}

/* One searched axis: Model-Optimizer's hparam, its choices and the capped
 * values the grid takes. */
typedef struct {
    const char *name;
    int max, divisor, n_all, start, *all;
} axis_t;

#define NAX 6 /* hidden, ffn, heads, layers, experts, expert width */
typedef struct {
    int v[NAX]; /* hidden, ffn, heads, layers, experts, expert width (the last two 0 in a dense model) */
    ac_cost cost;
    double viol, nll;
    ac_mc_result task; /* with a score task */
    int scored, index;
} cand_t;

static int axis_init(axis_t *x, const char *name, int max, int divisor, double max_pruning, int searched) {
    x->name = name;
    x->max = max;
    x->divisor = divisor;
    x->all = malloc(sizeof(int) * (max + 2));
    if (!x->all) return -1;
    x->n_all = ac_minitron_choices(max, divisor, x->all);
    x->start = searched ? ac_minitron_cap_start(x->n_all, max_pruning) : x->n_all - 1;
    return 0;
}

/* The uniform architecture of a grid point (a mixture-of-experts layer
 * keeps v[4] experts of width v[5], a dense one an FFN of v[1]); the
 * lowest-ranked layers beyond v[3] become identity layers. */
static int cand_arch(const ac_arch *base, const int *layer_order, const int *v, ac_arch *a, ac_err *e) {
    if (ac_arch_copy(a, base, e)) return -1;
    int G = base->layers[0].n_kv_heads;
    a->hidden = v[0];
    for (int l = 0; l < base->n_layers; l++) {
        const ac_layer_arch *b = &base->layers[l];
        a->layers[l] =
            b->n_experts ? (ac_layer_arch){v[2], G, 0, v[4], v[5], 0} : (ac_layer_arch){v[2], G, v[1], 0, 0, 0};
    }
    for (int r = v[3]; r < base->n_layers; r++) a->layers[layer_order[r]] = (ac_layer_arch){0, 0, 0, 0, 0, 0};
    return 0;
}

static int cmp_cand(const void *a, const void *b) {
    const cand_t *x = a, *y = b;
    if (x->viol != y->viol) return x->viol > y->viol ? -1 : 1; /* closest to the binding limit first */
    if (x->cost.params != y->cost.params) return x->cost.params > y->cost.params ? -1 : 1;
    return x->index - y->index;
}

static json_t *cand_json(const cand_t *c, const ac_search_problem *p, const int *layer_order) {
    json_t *kept = json_array();
    int *keep = calloc(p->base->n_layers, sizeof(int));
    for (int r = 0; keep && r < c->v[3]; r++) keep[layer_order[r]] = 1;
    for (int l = 0; keep && l < p->base->n_layers; l++)
        if (keep[l]) json_array_append_new(kept, json_integer(l));
    free(keep);
    json_t *o = json_pack("{s:i,s:i,s:i,s:i,s:o,s:o,s:o,s:f,s:f}", "hidden_size", c->v[0], "ffn_hidden_size", c->v[1],
                          "num_attention_heads", c->v[2], "num_layers", c->v[3], "layers_kept", kept, "predicted",
                          ac_cost_to_json(&c->cost), "constraints", ac_constraints_report(&p->limits, &c->cost),
                          "violation", c->viol, "params", c->cost.params);
    if (c->v[4]) json_object_set_new(o, "num_moe_experts", json_integer(c->v[4]));
    if (c->v[5]) json_object_set_new(o, "moe_ffn_hidden_size", json_integer(c->v[5]));
    if (c->scored && p->score_task) {
        json_object_set_new(o, "task_acc", json_real(c->task.acc));
        json_object_set_new(o, "task_acc_norm", json_real(c->task.acc_norm));
        json_object_set_new(o, "task_n", json_integer(c->task.n));
    } else if (c->scored) {
        json_object_set_new(o, "calib_nll", json_real(c->nll));
        json_object_set_new(o, "calib_ppl", json_real(exp(c->nll)));
    }
    return o;
}

/* Mean NLL over nw windows of ctx tokens (ids) of m pruned to a by view,
 * computed on m's own weights, one layer at a time (stream.h): kept units
 * by ac_prune's rules as masks (exactly their removal), dropped layers
 * skipped, hidden channels masked. Holds B windows' activations and the
 * masks, no pruned copy. *done = 0 (nothing computed) when a layer of a
 * cannot be expressed by masks (KV groups merged or removed). */
static int score_view(const ac_model *m, const ac_importance *view, const ac_arch *a, const int *ids, long nw, int ctx,
                      double *nll, int *done, ac_err *e) {
    const ac_arch *b = &m->a;
    int L = b->n_layers, H = b->hidden, B = 4, rc = 0, mh = 1, mf = 1;
    *done = 0;
    for (int l = 0; l < L; l++) {
        if (b->layers[l].n_heads > mh) mh = b->layers[l].n_heads;
        if (b->layers[l].ffn > mf) mf = b->layers[l].ffn;
        if (b->layers[l].n_experts > mf) mf = b->layers[l].n_experts; /* an MoE layer's expert mask */
    }
    ac_stream_mod *mod = calloc(L, sizeof *mod);
    float *hm = malloc(sizeof(float) * H), *masks = malloc(sizeof(float) * (size_t)L * (mh + mf)),
          *x = malloc(sizeof(float) * (size_t)B * ctx * H);
    ac_stream s = {0};
    if (a->n_layers != L || a->head_dim != b->head_dim || a->vocab != b->vocab || a->hidden > H || a->hidden < 1)
        goto out; /* not a view of m (ac_prune says why) */
    if (!mod || !hm || !masks || !x) rc = ac_errf(e, "minitron: out of memory for a candidate's masks");
    int hidden = a->hidden < H;
    if (!rc && hidden) ac_prune_hidden_mask(b, a, view, hm);
    for (int l = 0; l < L && !rc; l++) {
        float *hmask = masks + (size_t)l * (mh + mf), *fmask = hmask + mh;
        if (ac_prune_layer_masks(b, a, view, l, hmask, fmask)) goto out; /* not expressible: *done stays 0 */
        mod[l] = (ac_stream_mod){
            .head_mask = hmask, .ffn_mask = fmask, .hid_mask = hidden ? hm : NULL, .hid_kept = a->hidden};
        if (b->layers[l].n_experts && a->layers[l].n_experts) { /* experts removed from the routing */
            if (ac_prune_expert_mask(b, a, view, l, fmask)) goto out;
            mod[l].ffn_mask = NULL;
            mod[l].expert_mask = fmask;
        }
    }
    if (!rc) rc = ac_stream_init(&s, m, B, ctx, e);
    double sum = 0;
    long count = 0;
    for (long w = 0; w < nw && !rc; w += B) {
        int nb = (int)(nw - w < B ? nw - w : B);
        const int *tok = ids + w * ctx;
        if ((rc = ac_stream_embed(m, tok, (long)nb * ctx, x, e))) break;
        if (hidden)
            for (size_t i = 0; i < (size_t)nb * ctx * H; i++) x[i] *= hm[i % H];
        for (int l = 0; l < L; l++)
            if (a->layers[l].n_heads || a->layers[l].ffn || a->layers[l].n_experts)
                ac_stream_layer(&s, l, x, nb, &mod[l], NULL);
        long c = 0;
        sum += ac_stream_nll(&s, x, tok, nb, hidden ? &mod[0] : NULL, &c);
        count += c;
    }
    if (!rc) {
        *nll = count ? sum / count : 0;
        *done = 1;
    }
out:
    ac_stream_free(&s);
    free(mod);
    free(hm);
    free(masks);
    free(x);
    return rc;
}

/* Candidate a pruned for real (ac_prune with Minitron's importance) and
 * scored on p->score_task on the CPU engine, as lm-evaluation-harness
 * scores multiple choice (tasks.h). */
static int score_task(const ac_search_problem *p, const ac_importance *view, const ac_arch *a, ac_mc_result *r,
                      ac_err *e) {
    ac_model pm;
    if (ac_prune(p->model, a, view, &pm, e)) return -1;
    int rc = ac_mc_score(&pm, p->score_task, 8, 0, NULL, r, e);
    ac_model_free(&pm);
    return rc ? ac_errctx(e, "minitron: scoring a candidate on task %s", p->score_name ? p->score_name : "?") : 0;
}

/* Score candidate a on the tail of the calibration tokens (up to 16
 * windows of p->ctx): mean NLL. On the CPU the pruned model is a view of
 * the source's weights (score_view); on the GPU, or where masks cannot
 * express it, it is pruned for real (ac_prune) and its perplexity taken. */
static int score(const ac_search_problem *p, const ac_importance *view, const ac_arch *a, double *nll, ac_err *e) {
    int ctx = p->ctx > 1 ? p->ctx : 128;
    size_t nw = p->n_calib / ctx < 16 ? p->n_calib / ctx : 16;
    if (nw < 1)
        return ac_errf(e, "minitron: calibration text has %zu tokens, fewer than one window of %d", p->n_calib, ctx);
    const int *ids = p->calib_ids + p->n_calib - nw * ctx;
    int done = 0;
    if (!p->cuda && score_view(p->model, view, a, ids, (long)nw, ctx, nll, &done, e)) return -1;
    if (done) return 0;
    ac_model pm;
    if (ac_prune(p->model, a, view, &pm, e)) return -1;
    ac_ppl_opts o = {.ctx = ctx, .stride = 0, .max_windows = (int)nw, .batch = 4, .cuda = p->cuda};
    ac_ppl_result r;
    int rc = ac_perplexity(&pm, ids, nw * ctx, &o, NULL, NULL, NULL, &r, e);
    ac_model_free(&pm);
    if (!rc) *nll = r.nll;
    return rc;
}

static json_t *axes_json(const axis_t *ax) {
    json_t *o = json_object();
    for (int k = 0; k < NAX; k++) {
        if (!ax[k].max) continue; /* no experts in a dense model */
        json_t *all = json_array(), *sv = json_array();
        for (int i = 0; i < ax[k].n_all; i++) {
            json_array_append_new(all, json_integer(ax[k].all[i]));
            if (i >= ax[k].start) json_array_append_new(sv, json_integer(ax[k].all[i]));
        }
        json_object_set_new(o, ax[k].name,
                            json_pack("{s:i,s:o,s:o}", "divisor", ax[k].divisor, "choices", all, "searched", sv));
    }
    return o;
}

/* Tensor parallelism: the axis keeps only the choices divisible by tp (FFN
 * widths, query heads: search.h, ac_search_check_tp), its search still
 * starting at the smallest value it searched before. */
static void axis_keep_multiples(axis_t *x, int tp) {
    if (tp <= 1 || !x->max) return;
    int lo = x->all[x->start], n = 0;
    for (int i = 0; i < x->n_all; i++)
        if (x->all[i] % tp == 0) x->all[n++] = x->all[i];
    x->n_all = n; /* the base's width is one (ac_search_check_tp) */
    for (x->start = 0; x->start < n - 1 && x->all[x->start] < lo;) x->start++;
}

/* Checks that Minitron's uniform axes apply to the base model: the same
 * attention in every layer; the same FFN in every dense layer and the
 * same experts in every mixture-of-experts layer (Qwen3-MoE's
 * mlp_only_layers mix the two). *ffn, *experts: their widths (0: none). */
static int check_base(const ac_arch *b, int *ffn, int *experts, int *effn, ac_err *e) {
    const ac_layer_arch *f = &b->layers[0];
    *ffn = *experts = *effn = 0;
    if (!f->n_heads || f->n_heads % f->n_kv_heads) return ac_errf(e, "minitron: layer 0 has no attention");
    const ac_layer_arch *dense = NULL, *moe = NULL;
    for (int l = 0; l < b->n_layers; l++) {
        const ac_layer_arch *x = &b->layers[l];
        const ac_layer_arch **same = x->n_experts ? &moe : &dense;
        if (x->n_heads != f->n_heads || x->n_kv_heads != f->n_kv_heads || (!x->ffn && !x->n_experts) ||
            (*same && memcmp(x, *same, sizeof *x)))
            return ac_errf(e, "minitron: the base model must be uniform (layer %d differs)", l);
        *same = x;
    }
    *ffn = dense ? dense->ffn : 0;
    *experts = moe ? moe->n_experts : 0;
    *effn = moe ? moe->expert_ffn : 0;
    return 0;
}

/* Grid enumeration, feasibility and ordering: cands (malloc'd) sorted with
 * the feasible ones first, closest to the binding limit first; *nf feasible. */
static int grid(const ac_search_problem *p, const axis_t *ax, const int *order, cand_t **out, int *n, int *nf,
                ac_err *e) {
    int total = 1;
    for (int k = 0; k < NAX; k++) total *= ax[k].n_all - ax[k].start;
    cand_t *c = calloc(total, sizeof *c);
    if (!c) return ac_errf(e, "out of memory");
    int idx[NAX] = {0}, f = 0;
    for (int i = 0; i < total; i++) {
        int rem = i;
        for (int k = NAX - 1; k >= 0; k--) {
            int w = ax[k].n_all - ax[k].start;
            idx[k] = rem % w;
            rem /= w;
        }
        for (int k = 0; k < NAX; k++) c[i].v[k] = ax[k].all[ax[k].start + idx[k]];
        c[i].index = i;
        ac_arch a;
        ac_carch ca;
        if (cand_arch(p->base, order, c[i].v, &a, e)) {
            free(c);
            return -1;
        }
        if (ac_carch_from_arch(&a, &ca, e)) {
            ac_arch_free(&a);
            free(c);
            return -1;
        }
        ac_cost_predict(p->table, &ca, p->workload, p->profile, 0, &c[i].cost);
        ac_carch_free(&ca);
        ac_arch_free(&a);
        c[i].viol = ac_constraints_violation(&p->limits, &c[i].cost);
        if (c[i].viol <= 1e-12) f++;
    }
    /* feasible ones first (by closeness), then the infeasible by least violation */
    cand_t *s = malloc(sizeof *s * total);
    if (!s) {
        free(c);
        return ac_errf(e, "out of memory");
    }
    int a = 0, b = f;
    for (int i = 0; i < total; i++) s[c[i].viol <= 1e-12 ? a++ : b++] = c[i];
    qsort(s, f, sizeof *s, cmp_cand);
    for (int i = f; i < total; i++) s[i].viol = -s[i].viol; /* least violation first */
    qsort(s + f, total - f, sizeof *s, cmp_cand);
    for (int i = f; i < total; i++) s[i].viol = -s[i].viol;
    free(c);
    *out = s;
    *n = total;
    *nf = f;
    return 0;
}

void ac_minitron_emit_candidate(const ac_search_problem *p, int i, int k, json_t *cand) {
    json_t *ev = json_pack("{s:s,s:i,s:i,s:o}", "phase", "minitron", "candidate", i + 1, "of", k, "scored", cand);
    p->emit(p->ud, ev);
    json_decref(ev);
}

void ac_minitron_emit_result(const ac_search_problem *p, const ac_search_result *r, int grid, int feasible) {
    if (!p->emit) return;
    json_t *ev = json_pack("{s:s,s:b,s:i,s:i,s:o,s:o}", "phase", "minitron", "feasible", r->feasible, "grid_size", grid,
                           "grid_feasible", feasible, "metrics", ac_constraints_report(&p->limits, &r->cost),
                           "predicted", ac_cost_to_json(&r->cost));
    p->emit(p->ud, ev);
    json_decref(ev);
}

int ac_search_minitron(const ac_search_problem *p, ac_search_result *r, ac_err *e) {
    if (ac_arch_is_hybrid(p->base)) return ac_minitron_hybrid(p, r, e); /* minitron_hybrid.c */
    memset(r, 0, sizeof *r);
    const ac_arch *b = p->base;
    int ffn, experts, effn;
    if (check_base(b, &ffn, &experts, &effn, e)) return -1;
    int L = b->n_layers, G = b->layers[0].n_kv_heads, grp = b->layers[0].n_heads / G;
    int *order = malloc(sizeof(int) * L);
    axis_t ax[NAX] = {{0}};
    cand_t *c = NULL;
    int n = 0, nf = 0, rc = 0;
    if (!order) return ac_errf(e, "out of memory");
    ac_minitron_layer_order(p->imp, order);
    const ac_minitron_opts *mo = &p->minitron;
    double wcap = mo->max_width_pruning > 0 ? mo->max_width_pruning : AC_MINITRON_MAX_WIDTH_PRUNING,
           dcap = mo->max_depth_pruning > 0 ? mo->max_depth_pruning : AC_MINITRON_MAX_DEPTH_PRUNING;
    int top_k = mo->top_k > 0 ? mo->top_k : AC_MINITRON_TOP_K;
    int dh = mo->hidden_divisor > 0 ? mo->hidden_divisor
                                    : ac_minitron_default_divisor(AC_MINITRON_HIDDEN_DIVISOR, b->hidden),
        df = mo->ffn_divisor > 0 ? mo->ffn_divisor : ac_minitron_default_divisor(AC_MINITRON_FFN_DIVISOR, ffn),
        dl = mo->layers_divisor > 0 ? mo->layers_divisor : ac_minitron_default_divisor(AC_MINITRON_LAYERS_DIVISOR, L),
        de = mo->experts_divisor > 0 ? mo->experts_divisor
                                     : ac_minitron_default_divisor(AC_MINITRON_EXPERTS_DIVISOR, experts);
    /* heads: choices h x G (NumAttentionHeadsHp), i.e. a divisor grid of step G */
    if (axis_init(&ax[0], "hidden_size", b->hidden, dh, wcap, p->opts.prune_hidden) ||
        axis_init(&ax[1], "ffn_hidden_size", ffn, ffn ? df : 1, wcap, 1) ||
        axis_init(&ax[2], "num_attention_heads", grp * G, G, wcap, 1) ||
        axis_init(&ax[3], "num_layers", L, dl, dcap, 1) ||
        /* Model-Optimizer's num_moe_experts: a width axis; never below top_k */
        axis_init(&ax[4], "num_moe_experts", experts, experts ? de : 1, wcap, p->opts.prune_experts) ||
        /* its moe_ffn_hidden_size: every expert's width, on the FFN's divisor rule (ffn_hidden_size_divisor),
         * each expert's channels ranked on their own (imp->echan_order); searched with search.prune_expert_ffn */
        axis_init(&ax[5], "moe_ffn_hidden_size", effn,
                  effn ? (mo->ffn_divisor > 0 ? mo->ffn_divisor : ac_minitron_default_divisor(AC_MINITRON_FFN_DIVISOR, effn)) : 1,
                  wcap, p->opts.prune_expert_ffn)) {
        rc = ac_errf(e, "out of memory");
        goto out;
    }
    if (ac_search_check_tp(p, 0, e)) {
        rc = -1;
        goto out;
    }
    int tp = p->profile && p->profile->tp > 1 ? p->profile->tp : 1;
    axis_keep_multiples(&ax[1], tp); /* KV groups stay whole in Minitron (G, the base's: it splits) */
    axis_keep_multiples(&ax[2], tp);
    axis_keep_multiples(&ax[5], tp); /* each expert's width is split under TP */
    if (experts) { /* the searched choices start at top_k at least */
        while (ax[4].start < ax[4].n_all - 1 && ax[4].all[ax[4].start] < b->top_k) ax[4].start++;
    }
    if ((rc = grid(p, ax, order, &c, &n, &nf, e))) goto out;
    int k = nf < top_k ? nf : top_k, best = 0;
    ac_importance view;
    ac_minitron_importance_view(p->imp, &view);
    int scoring = p->model && (p->calib_ids || p->score_task) && k > 0;
    for (int i = 0; scoring && i < k && !rc; i++) {
        ac_arch a;
        if ((rc = cand_arch(b, order, c[i].v, &a, e))) break;
        rc = p->score_task ? score_task(p, &view, &a, &c[i].task, e) : score(p, &view, &a, &c[i].nll, e);
        ac_arch_free(&a);
        if (rc) break;
        c[i].scored = 1;
        if (p->score_task) { /* the highest accuracy, the first of equals (Python's max) */
            double s = mo->score_norm ? c[i].task.acc_norm : c[i].task.acc,
                   sb = mo->score_norm ? c[best].task.acc_norm : c[best].task.acc;
            if (s > sb) best = i;
        } else if (c[i].nll < c[best].nll)
            best = i;
        if (p->emit) ac_minitron_emit_candidate(p, i, k, cand_json(&c[i], p, order));
    }
    if (rc) goto out;
    /* the result: the best scored candidate, or the closest infeasible point */
    if ((rc = cand_arch(b, order, c[best].v, &r->arch, e))) goto out;
    r->cost = c[best].cost;
    r->feasible = nf > 0;
    r->pred_loss =
        p->imp->attn_sens ? ac_search_pred_loss(p, &r->arch) : 0; /* AutoCompress's measured curves, for the report */
    r->steps_run = n;
    json_t *cands = json_array(), *ls = json_array(), *dropped = json_array();
    for (int i = 0; i < (nf ? k : 1); i++) json_array_append_new(cands, cand_json(&c[i], p, order));
    for (int l = 0; l < L; l++) json_array_append_new(ls, json_real(p->imp->layer_bi[l]));
    for (int ri = c[best].v[3]; ri < L; ri++) json_array_append_new(dropped, json_integer(order[ri]));
    json_t *sc = p->score_task ? json_pack("{s:s,s:s}", "task", p->score_name ? p->score_name : "",
                                           "metric", mo->score_norm ? "acc_norm" : "acc")
                               : json_string("loss");
    r->detail = json_pack(
        "{s:s,s:o,s:i,s:i,s:i,s:f,s:f,s:o,s:o,s:o,s:i,s:b,s:o}", "algorithm",
        "NVIDIA Model-Optimizer mcore_minitron: uniform grid on divisor choices (width and depth capped), "
        "filtered by the cost model's limits, top-k closest to the binding limit scored as pruned (calibration loss on "
        "masked views of the base on the CPU, or a task's accuracy)",
        "axes", axes_json(ax), "grid_size", n, "grid_feasible", nf, "top_k", top_k, "max_width_pruning", wcap,
        "max_depth_pruning", dcap, "score", sc, "layer_scores_1_minus_cos", ls, "layers_dropped", dropped,
        "best_candidate", nf ? best : -1, "scored", scoring, "candidates", cands);
    ac_minitron_emit_result(p, r, n, nf);
out:
    for (int i = 0; i < NAX; i++) free(ax[i].all);
    free(c);
    free(order);
    if (rc) ac_search_result_free(r);
    return rc;
}
