/* candidates.c - see candidates_int.h. */
#include "candidates_int.h"
#include "checkpoint_int.h"
#include "students_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/prune.h"
#include "core/dtype.h"
#include "format/deci.h"
#include "search/dnas.h"
#include "search/minitron.h"

int ac_kd_rank_after = 1;

void ac_job_distill_opts(const job_state *s, long tokens, ac_distill_opts *o) {
    const ac_distill_spec *ds = &s->spec->distill;
    ac_distill_defaults(o);
    o->tokens = tokens;
    o->seq_len = ds->seq_len, o->batch = ds->batch;
    o->lr = (float)ds->lr, o->min_lr = o->lr / 10;
    o->temperature = (float)ds->temperature, o->ce_weight = (float)ds->ce_weight;
    o->seed = (unsigned long long)ds->seed;
    /* a local CUDA target distils on its GPU, as it evaluates there (the CUDA
     * trainer has the softmax routers' MoE ops and every nemotron_h layer
     * kind: Mamba-2, the sigmoid router, shared expert and LatentMoE;
     * test_train's test_cuda_distill_hybrid* hold its distillation to the
     * CPU's) */
    o->cuda = s->on_gpu;
}

const char *ac_job_distill_text(const job_state *s) {
    const ac_job_spec *sp = s->spec;
    return sp->distill.text[0] ? sp->distill.text : sp->calibration[0] ? sp->calibration : NULL;
}

int ac_kd_pick(const double *before, const double *after, const int *ranked, int n, int by_after) {
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (!ranked[i]) continue;
        double k = by_after ? after[i] : before[i];
        if (best < 0 || k < (by_after ? after[best] : before[best])) best = i;
    }
    return best;
}

enum { MAX_CAND = 8 };

typedef struct {
    const char *source; /* "dnas", "surrogate", "uniform", "dnas_seed" */
    unsigned seed;
    ac_search_result r;     /* owned */
    ac_importance orders;   /* owned when own_orders */
    const ac_importance *imp; /* the unit orders it is pruned in */
    const ac_model *src;      /* the weights it is pruned from: search.keep_weights' co-trained ones, or NULL: the
                               * base model's */
    int own_orders;
    double before, after; /* ranking loss (nll) before and after the short distillation */
    long tokens;
    int steps, ranked;
} cand;

static void log_msg(job_state *s, json_t *ev) {
    if (ev && s->ctx->emit) s->ctx->emit(s->ctx->ud, "log", ev);
    json_decref(ev);
}

/* Tokens of a gate search whose weights trained (search.cotrain) and ran steps steps. */
static long gate_tokens(const job_state *s, int steps) {
    const ac_search_opts *so = &s->spec->search;
    if (!s->two_arms || !so->cotrain || so->method != AC_SEARCH_DNAS || ac_arch_has_moe(&s->m.a)) return 0;
    return (long)steps * so->dnas_batch * so->dnas_seq_len;
}

static int same_arch(const ac_arch *a, const ac_arch *b) {
    if (a->hidden != b->hidden || a->n_layers != b->n_layers) return 0;
    for (int l = 0; l < a->n_layers; l++)
        if (a->layers[l].n_heads != b->layers[l].n_heads || a->layers[l].n_kv_heads != b->layers[l].n_kv_heads ||
            a->layers[l].ffn != b->layers[l].ffn)
            return 0;
    return 1;
}

static int dense(const ac_arch *a) {
    if (ac_arch_has_moe(a)) return 0;
    for (int l = 0; l < a->n_layers; l++)
        if (a->layers[l].ssm_heads > 0) return 0;
    return 1;
}

static void cand_free(cand *c) {
    ac_search_result_free(&c->r);
    if (c->own_orders) ac_importance_free(&c->orders);
}

/* Appends x to the list unless infeasible-and-unwanted or a duplicate
 * (same structure, same unit orders); frees it otherwise. */
static void add(cand *list, int *n, cand *x) {
    for (int i = 0; i < *n; i++)
        if (same_arch(&list[i].r.arch, &x->r.arch) && list[i].imp == x->imp) {
            cand_free(x);
            return;
        }
    list[(*n)++] = *x;
}

/* The best uniform structure: Minitron's pick with every FFN rounded down
 * to the export grid, repaired and refilled to the limits (search.c). */
static int uniform_candidate(job_state *s, cand *c, ac_err *e) {
    const ac_search_problem *P = &s->P;
    if (ac_arch_copy(&c->r.arch, &s->rm.arch, e)) return -1;
    int g = P->opts.ffn_multiple > 0 ? P->opts.ffn_multiple : 1;
    if (P->opts.target == AC_EXPORT_DECI && g % AC_DECI_GRID) g = AC_DECI_GRID;
    for (int l = 0; l < c->r.arch.n_layers; l++) {
        ac_layer_arch *la = &c->r.arch.layers[l];
        if (la->ffn > g) la->ffn = la->ffn / g * g;
    }
    c->r.feasible = ac_search_repair(P, &c->r.arch, &c->r.cost);
    c->r.pred_loss = ac_search_pred_loss(P, &c->r.arch);
    ac_err e2;
    if (P->opts.target == AC_EXPORT_DECI && !ac_arch_is_uniform(&c->r.arch) && ac_deci_check_arch(&c->r.arch, &e2))
        c->r.feasible = 0; /* not expressible: left out */
    return 0;
}

/* The candidates in their order of preference, at most want of them. */
static int build(job_state *s, int want, cand *list, int *n, ac_err *e) {
    *n = 0;
    cand c = {.source = "dnas", .seed = s->P.opts.seed, .imp = s->imp_d.n_layers ? &s->imp_d : &s->imp,
              .src = s->ra.trained};
    if (ac_arch_copy(&c.r.arch, &s->ra.arch, e)) return -1;
    c.r.cost = s->ra.cost;
    c.r.feasible = s->ra.feasible;
    c.r.pred_loss = s->ra.pred_loss;
    add(list, n, &c);
    ac_search_problem P = s->P;
    P.emit = NULL;
    if (*n < want && s->spec->search.method == AC_SEARCH_DNAS && ac_search_has_curves(&P)) { /* (a hybrid: with curves) */
        c = (cand){.source = "surrogate", .seed = P.opts.seed, .imp = &s->imp};
        if (ac_search_autocompress(&P, &c.r, e)) return -1;
        add(list, n, &c);
    }
    if (*n < want && s->rm.arch.n_layers && P.opts.target != AC_EXPORT_GGUF) {
        c = (cand){.source = "uniform", .imp = &s->imp};
        if (uniform_candidate(s, &c, e)) {
            cand_free(&c);
            return -1;
        }
        add(list, n, &c);
    }
    for (unsigned k = 1; *n < want && k <= (unsigned)want && s->spec->search.method == AC_SEARCH_DNAS; k++) {
        ac_search_opts so = s->spec->search;
        so.seed = P.opts.seed + k;
        P.opts.seed = so.seed;
        c = (cand){.source = "dnas_seed", .seed = so.seed, .own_orders = 1};
        if (ac_dnas_job_search(&P, &s->m, &so, s->cids, s->nc, &c.r, &c.orders, e)) {
            cand_free(&c);
            return -1;
        }
        c.imp = c.orders.n_layers ? &c.orders : &s->imp;
        c.src = c.r.trained;
        add(list, n, &c);
    }
    return 0;
}

/* c pruned from its weights (repaired as the prune stage repairs: to the
 * outputs of the model it is pruned from) into *out (BF16). */
static int prune(job_state *s, const cand *c, ac_model *out, int *rep, ac_err *e) {
    return ac_job_prune_arm(s, c->src ? c->src : &s->m, &c->r.arch, c->imp, 0, out, rep, e);
}

static int cancelled_cb(void *ud, int step, int steps, double loss, double lr) {
    (void)step, (void)steps, (void)loss, (void)lr;
    volatile int *c = ud;
    return c && *c;
}

/* Ranking windows: the calibration file past calibration_tokens (at least
 * 2 windows of ctx), else the calibration tokens the job uses. */
static int ranking_ids(job_state *s, int **ids, size_t *n, const char **what, ac_err *e) {
    int *all = NULL;
    size_t na = 0;
    if (ac_load_text_ids(s->spec->model, s->spec->calibration, &all, &na, s->m.a.vocab, e)) return -1;
    if (na >= s->nc + 2 * (size_t)s->spec->eval.ctx) {
        memmove(all, all + s->nc, (na - s->nc) * sizeof *all);
        *ids = all, *n = na - s->nc;
        *what = "the calibration file past calibration_tokens";
        return 0;
    }
    free(all);
    if (!(*ids = malloc(s->nc * sizeof **ids))) return ac_errf(e, "out of memory");
    memcpy(*ids, s->cids, s->nc * sizeof **ids);
    *n = s->nc;
    *what = "the calibration tokens (the file has too few past calibration_tokens)";
    return 0;
}

static json_t *cand_json(const job_state *s, const cand *c, int chosen) {
    json_t *j = json_pack("{s:s,s:o,s:o,s:o,s:b,s:f,s:b}", "source", c->source, "architecture",
                          ac_arch_to_json(&c->r.arch), "predicted", ac_cost_to_json(&c->r.cost), "constraints",
                          ac_constraints_report(&s->P.limits, &c->r.cost), "feasible", c->r.feasible,
                          "predicted_loss_increase", c->r.pred_loss, "chosen", chosen);
    if (j && !strcmp(c->source, "dnas_seed")) json_object_set_new(j, "seed", json_integer(c->seed));
    if (j && c->ranked)
        json_object_update_new(j, json_pack("{s:f,s:f,s:I,s:i}", "loss_before", c->before, "loss_after", c->after,
                                            "tokens", (json_int_t)c->tokens, "steps", c->steps));
    return j;
}

/* Rank list[n] (feasible ones): *best the winner's index, c->won its weights. */
static int rank(job_state *s, const ac_distill_opts *o, const int *tids, size_t tn, cand *list, int n, long per,
                ac_kd_choice *kc, int *best, ac_err *e) {
    int *rids = NULL;
    size_t rn = 0;
    const char *what = "";
    if (ranking_ids(s, &rids, &rn, &what, e)) return -1;
    ac_ppl_opts po = {.ctx = s->spec->eval.ctx, .max_windows = s->spec->eval.windows, .batch = 4, .cuda = s->on_gpu};
    ac_distill_opts co = *o;
    co.tokens = per;
    int rc = 0;
    *best = -1;
    for (int i = 0; i < n && !rc; i++) {
        cand *c = &list[i];
        if (!c->r.feasible) continue;
        ac_model bf = {0}, w = {0};
        ac_ppl_result pr;
        ac_distill_result dr;
        int rep;
        rc = prune(s, c, &bf, &rep, e) || ac_perplexity(&bf, rids, rn, &po, NULL, NULL, NULL, &pr, e) ||
             ac_model_to_f32(&bf, &w, e);
        ac_model_free(&bf);
        if (!rc) {
            c->before = pr.nll;
            rc = ac_distill(&s->m, &w, tids, tn, &co, cancelled_cb, (void *)s->ctx->cancelled, &dr, e) ||
                 ac_model_make_bf16(&w, e);
            if (!rc) ac_model_round_vectors(&w, ST_BF16); /* as the job's students (students_int.h): it may go on */
            rc = rc || ac_perplexity(&w, rids, rn, &po, NULL, NULL, NULL, &pr, e);
        }
        if (rc) {
            ac_model_free(&w);
            rc = ac_errctx(e, "candidate %d (%s)", i, c->source);
            break;
        }
        c->after = pr.nll;
        c->tokens = dr.tokens;
        c->steps = dr.steps;
        c->ranked = 1;
        kc->ranking += dr.tokens;
        log_msg(s, json_pack("{s:s,s:i,s:s,s:f,s:f}", "message", "candidate ranked", "candidate", i, "source",
                             c->source, "loss_before", c->before, "loss_after", c->after));
        double bl[MAX_CAND], al[MAX_CAND];
        int ok[MAX_CAND];
        for (int k = 0; k < n; k++) bl[k] = list[k].before, al[k] = list[k].after, ok[k] = list[k].ranked;
        if (ac_kd_pick(bl, al, ok, n, ac_kd_rank_after) == i) {
            *best = i;
            ac_model_free(&kc->won);
            kc->won = w;
        } else
            ac_model_free(&w);
    }
    if (!rc)
        kc->protocol = json_pack("{s:s,s:i,s:i,s:I,s:i,s:s}", "text", what, "windows", po.max_windows, "ctx",
                                 po.ctx, "tokens_per_candidate", (json_int_t)per, "candidates", n, "ranked_by",
                                 ac_kd_rank_after ? "loss after the short distillation" : "loss before it (zero-shot)");
    free(rids);
    return rc;
}

int ac_kd_choose(job_state *s, const ac_distill_opts *o, const char *text, ac_kd_choice *kc, ac_err *e) {
    memset(kc, 0, sizeof *kc);
    const ac_distill_spec *ds = &s->spec->distill;
    kc->total = o->tokens;
    kc->gates = gate_tokens(s, s->ra.steps_run);
    long step = (long)o->batch * o->seq_len;
    if (kc->gates + step > kc->total && s->two_arms)
        return ac_errf(e,
                       "distill.tokens %ld is below the co-trained gate search's %ld tokens (search.cotrain) plus one "
                       "distillation step of %ld",
                       kc->total, kc->gates, step);
    int rc = 0;
    long cap = ds->ranking_tokens > 0 ? ds->ranking_tokens : kc->total / 4;
    if (cap > kc->total - kc->gates - step) cap = kc->total - kc->gates - step;
    int min_steps = ds->candidate_steps < AC_KD_MIN_STEPS ? ds->candidate_steps : AC_KD_MIN_STEPS;
    if (s->two_arms && ds->candidates > 1 && cap < (long)ds->candidates * min_steps * step)
        log_msg(s, json_pack("{s:s,s:I}", "message",
                             "no candidate ranking: the ranking's share of distill.tokens is under 4 steps a candidate; "
                             "the whole budget distils the search's structure",
                             "ranking_tokens", (json_int_t)cap));
    else if (s->two_arms && ds->candidates > 1 && dense(&s->m.a)) {
        cand list[MAX_CAND];
        int n = 0, nf = 0, best = -1;
        rc = build(s, ds->candidates, list, &n, e);
        for (int i = 0; i < n; i++) { /* the further seeds' gate searches train weights too with search.cotrain */
            nf += list[i].r.feasible;
            if (!strcmp(list[i].source, "dnas_seed")) kc->gates += gate_tokens(s, list[i].r.steps_run);
        }
        if (!rc && kc->gates + step > kc->total)
            rc = ac_errf(e,
                         "distill.tokens %ld is below the co-trained gate searches' %ld tokens (search.cotrain, the "
                         "further seeds' searches of distill.candidates too) plus one distillation step of %ld",
                         kc->total, kc->gates, step);
        if (cap > kc->total - kc->gates - step) cap = kc->total - kc->gates - step;
        long steps = nf > 0 ? cap / ((long)nf * step) : 0;
        if (steps > ds->candidate_steps) steps = ds->candidate_steps;
        if (!rc && nf >= 2 && steps >= min_steps) {
            int *ids = NULL;
            size_t nt = s->nc;
            if (text && ac_load_text_ids(s->spec->model, text, &ids, &nt, s->m.a.vocab, e))
                rc = ac_errctx(e, "distill.text");
            if (!rc) rc = rank(s, o, ids ? ids : s->cids, nt, list, n, steps * step, kc, &best, e);
            free(ids);
            if (!rc && kc->won.a.n_layers) ac_job_park(s, &kc->won, "ranked");
        } else if (!rc)
            log_msg(s, json_pack("{s:s,s:i,s:I}", "message",
                                 "no candidate ranking: fewer than two feasible distinct candidates",
                                 "feasible_candidates", nf, "ranking_tokens", (json_int_t)cap));
        if (!rc && best > 0) { /* another structure than the search's won: it becomes the arm */
            cand *w = &list[best];
            ac_arch_free(&s->ra.arch); /* steps_run and detail stay the search's */
            s->ra.arch = w->r.arch;
            w->r.arch = (ac_arch){0};
            s->ra.cost = w->r.cost;
            s->ra.feasible = w->r.feasible;
            s->ra.pred_loss = w->r.pred_loss;
            ac_model_free(&s->pa);
            rc = prune(s, &(cand){.r = {.arch = s->ra.arch}, .imp = w->imp, .src = w->src}, &s->pa, &s->rep_a, e);
            if (!rc) ac_job_park(s, &s->pa, "autocompress");
            s->pa_cotrained = w->src != NULL;
            if (s->result != &s->pm) s->result = &s->pa;
        }
        if (!rc && (kc->candidates = json_array()))
            for (int i = 0; i < n; i++) {
                int moved = i == best && best > 0; /* its structure went to s->ra: borrowed for the report */
                if (moved) list[i].r.arch = s->ra.arch;
                json_array_append_new(kc->candidates, cand_json(s, &list[i], i == best || (best < 0 && i == 0)));
                if (moved) list[i].r.arch = (ac_arch){0};
            }
        for (int i = 0; i < n; i++) cand_free(&list[i]);
    }
    kc->final = kc->total - kc->ranking - (s->two_arms ? kc->gates : 0);
    return rc;
}

static json_t *budget_json(long ranking, long gates, long final, long total) {
    return json_pack("{s:I,s:I,s:I,s:I}", "ranking", (json_int_t)ranking, "gates", (json_int_t)gates, "final",
                     (json_int_t)final, "total", (json_int_t)total);
}

typedef void (*emit_fn)(void *ud, const char *kind, json_t *data);

/* An arm distilled in an earlier run of this job (checkpoint_int.h), used
 * only when this run restored the search (everything the student was
 * pruned from came from the same checkpoints): 1 restored into *m, its
 * report fields into all[name]. */
static int arm_restore(job_state *s, const char *name, ac_model *m, json_t *all, emit_fn emit) {
    const ac_job_ctx *c = s->ctx;
    int searched = 0;
    size_t i;
    json_t *v;
    json_array_foreach(s->resumed, i, v) searched |= !strcmp(json_string_value(v), "search");
    if (!c->checkpoint_dir || !c->checkpoint_dir[0] || !searched) return 0;
    json_t *fields = NULL, *ev;
    char why[600];
    if (!ac_ckpt_load_arm(s, c->checkpoint_dir, c->checkpoint_key ? c->checkpoint_key : "", name, m, &fields, why,
                          sizeof why)) {
        if (why[0] && (ev = json_pack("{s:s,s:s,s:s}", "message", "checkpoint not used", "arm", name, "why", why))) {
            emit(s, "log", ev);
            json_decref(ev);
        }
        return 0;
    }
    json_object_set_new(all, name, fields);
    char tag[64];
    snprintf(tag, sizeof tag, "distill.%s", name);
    json_array_append_new(s->resumed, json_string(tag));
    if ((ev = json_pack("{s:s,s:s,s:O}", "message", "distilled arm restored from its checkpoint", "arm", name,
                        "first_run_seconds", json_object_get(json_object_get(fields, "distill"), "seconds")))) {
        emit(s, "log", ev);
        json_decref(ev);
    }
    return 1;
}

/* Keep a distilled arm for a run of this job again (a requeued batch job);
 * a failure is said and the job goes on. */
static void arm_save(job_state *s, const char *name, const ac_model *m, const json_t *fields, emit_fn emit) {
    const ac_job_ctx *c = s->ctx;
    if (!c->checkpoint_dir || !c->checkpoint_dir[0] || !fields) return;
    ac_err e2 = {{0}};
    json_t *ev;
    if (ac_ckpt_save_arm(s, c->checkpoint_dir, c->checkpoint_key ? c->checkpoint_key : "", name, m, fields, &e2) &&
        (ev = json_pack("{s:s,s:s,s:s}", "message", "cannot write the stage checkpoint", "arm", name, "error",
                        e2.msg))) {
        emit(s, "log", ev);
        json_decref(ev);
    }
}

int ac_kd_distill_arms(job_state *s, const ac_distill_opts *o, const char *text, const ac_ppl_opts *po,
                       ac_kd_choice *kc, void (*emit)(void *ud, const char *kind, json_t *data), ac_err *e) {
    json_t *all = json_object(), *one = NULL;
    if (!all) return ac_errf(e, "out of memory");
    ac_model *pm = &s->pm, *pa = &s->pa;
    const char *nm = "minitron", *na = "autocompress";
    int rc = 0;
    if (!arm_restore(s, nm, pm, all, emit)) {
        rc = ac_distill_job(o, s->spec->model, text, &s->m, s->cids, s->nc, &pm, &nm, 1, s->hids, s->nh, po, emit, s,
                            s->ctx->cancelled, &one, e);
        if (!rc) {
            json_object_update(all, one);
            json_object_set_new(json_object_get(all, nm), "budget", budget_json(0, 0, o->tokens, o->tokens));
            arm_save(s, nm, pm, json_object_get(all, nm), emit);
        }
        json_decref(one);
        one = NULL;
    }
    if (!rc) ac_job_park(s, pm, nm); /* distilled or restored: final; out of memory while the other trains */
    if (!rc && s->two_arms && !arm_restore(s, na, pa, all, emit)) {
        ac_ppl_result pp = {0};
        int won = kc->won.a.n_layers > 0;
        /* the winner's perplexity before any distillation; its short-distilled weights go on */
        if (won && !(rc = ac_perplexity(pa, s->hids, s->nh, po, NULL, NULL, NULL, &pp, e))) {
            ac_model_free(pa);
            *pa = kc->won;
            kc->won = (ac_model){0};
        }
        ac_distill_opts fo = *o;
        fo.tokens = kc->final;
        if (!rc)
            rc = ac_distill_job(&fo, s->spec->model, text, &s->m, s->cids, s->nc, &pa, &na, 1, s->hids, s->nh, po,
                                emit, s, s->ctx->cancelled, &one, e);
        json_t *a = one ? json_object_get(one, na) : NULL;
        if (!rc && a) {
            if (won) {
                json_object_set(a, "perplexity_ranked", json_object_get(a, "perplexity_pruned"));
                json_object_set_new(a, "perplexity_pruned", json_real(pp.ppl));
            }
            json_object_set_new(a, "budget", budget_json(kc->ranking, kc->gates, kc->final, kc->total));
            if (kc->candidates) json_object_set(a, "candidates", kc->candidates);
            if (kc->protocol) json_object_set(a, "ranking", kc->protocol);
            json_object_update(all, one);
            arm_save(s, na, pa, a, emit);
        }
        json_decref(one);
    }
    if (!rc && s->two_arms) ac_job_park(s, pa, na);
    if (rc) {
        json_decref(all);
        return -1;
    }
    json_decref(s->distill);
    s->distill = all;
    return 0;
}

void ac_kd_choice_free(ac_kd_choice *c) {
    json_decref(c->candidates);
    json_decref(c->protocol);
    ac_model_free(&c->won);
    memset(c, 0, sizeof *c);
}
