/* measure.c - see measure_int.h. */
#include "measure_int.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "runtime/eval.h"

#define RUNS 5
/* Re-measurement of runs a neighbour slowed (quiet.h): up to 4 rounds,
 * 20 s in all per model. */
#define QUIET_ROUNDS 4
#define QUIET_BUDGET_S 20

/* One model's latency runs (a unit of quiet.h each): the prefill and every
 * decode step keep their fastest time over the runs. */
typedef struct {
    ac_scorer *sc;
    const int *ids;
    size_t n;
    int B, P, G;
    int *tok, *nxt;
    double *best, tt, run_best;
    ac_err *e;
} lat_runs;

static int lat_run(void *p, int i) {
    (void)i;
    lat_runs *x = p;
    double t0 = ac_now();
    if (ac_scorer_step(x->sc, x->tok, x->B, x->P, 0, x->e)) return -1;
    double t1 = ac_now();
    x->tt = fmin(x->tt, (t1 - t0) * 1e3);
    for (int g = 1; g < x->G; g++) {
        for (int b = 0; b < x->B; b++) x->nxt[b] = x->ids[(b + g) % x->n];
        double s0 = ac_now();
        if (ac_scorer_step(x->sc, x->nxt, x->B, 1, x->P + g - 1, x->e)) return -1;
        x->best[g] = fmin(x->best[g], (ac_now() - s0) * 1e3);
    }
    if (x->G > 1) x->run_best = fmin(x->run_best, (ac_now() - t1) * 1e3 / (x->G - 1));
    return 0;
}

/* TTFT: the fastest of RUNS prefills. TPOT: on the CPU each decode step's
 * fastest of RUNS runs, averaged over the steps (neighbours on a shared
 * machine only add time, and rarely leave a whole run undisturbed); on a GPU,
 * whose steps may run asynchronously, the fastest run's mean step. On the
 * CPU the runs are quiet measurements (quiet.h) against quiet_ref_us. */
int ac_measure_latency(const ac_model *m, const int *ids, size_t n, const ac_workload *w, int cuda, double quiet_ref_us,
                       double *ttft_ms, double *tpot_ms, ac_quiet_result *qr, ac_err *e) {
    int B = w->batch, P = w->prompt_len, G = w->gen_len;
    assert(n > 0 && B > 0 && P > 0);
    ac_quiet_result qr0 = {0};
    if (!qr) qr = &qr0;
    *qr = qr0;
    lat_runs x = {.ids = ids, .n = n, .B = B, .P = P, .G = G, .tt = 1e30, .run_best = 1e30, .e = e};
    if (ac_scorer_open(m, B, P + G, cuda, NULL, &x.sc, e)) return -1;
    x.tok = malloc(sizeof(int) * B * P);
    x.nxt = malloc(sizeof(int) * B);
    x.best = malloc(sizeof(double) * (G > 1 ? G : 1));
    int rc = x.tok && x.nxt && x.best ? 0 : ac_errf(e, "out of memory");
    for (int i = 0; !rc && i < B * P; i++) x.tok[i] = ids[i % n];
    for (int g = 0; !rc && g < G; g++) x.best[g] = 1e30;
    if (!rc && cuda)
        for (int r = 0; r < RUNS && !rc; r++) rc = lat_run(&x, r);
    else if (!rc) {
        ac_quiet q = {lat_run,      ac_cost_ref_probe_cb, &x,           RUNS,
                      AC_QUIET_TOL, quiet_ref_us,         QUIET_ROUNDS, QUIET_BUDGET_S};
        rc = ac_quiet_run(&q, qr);
    }
    double sum = 0;
    for (int g = 1; !rc && g < G; g++) sum += x.best[g];
    *ttft_ms = x.tt;
    *tpot_ms = G < 2 ? 0 : cuda ? x.run_best : sum / (G - 1);
    free(x.tok);
    free(x.nxt);
    free(x.best);
    ac_scorer_close(x.sc);
    return rc;
}

/* k: m's prediction on t; *experts (when not NULL): what priced its
 * experts (ac_cost_expert_source; NULL for a dense model). */
static int predict_src(const ac_cost_table *t, const ac_model *m, const ac_workload *w, const ac_engine_profile *p,
                       ac_cost *k, const char **experts, ac_err *e) {
    ac_carch c;
    if (ac_carch_from_arch(&m->a, &c, e)) return -1;
    ac_cost_predict(t, &c, w, p, 0, k);
    if (experts) *experts = ac_cost_expert_source(t, &c);
    ac_carch_free(&c);
    return 0;
}

static int predict(const ac_cost_table *t, const ac_model *m, const ac_workload *w, const ac_engine_profile *p,
                   ac_cost *k, ac_err *e) {
    return predict_src(t, m, w, p, k, NULL, e);
}

/* How quiet the machine was (quiet.h): the reference probe when the table
 * was measured and the quiet level during these runs, runs measured again,
 * runs still disturbed; table_measured_slow when the table's reference ran
 * more than the tolerance slower than now (its figures are then high);
 * speed_ratio: each model's probe level over the table's (above 1: the
 * machine ran slower while that model was timed than when the table was). */
static json_t *quiet_json(double table_ref, const ac_quiet_result *a, const ac_quiet_result *b, const char *arm) {
    double now = fmin(a->ref_us, b->ref_us);
    json_t *q =
        json_pack("{s:f,s:i,s:i,s:f}", "reference_probe_us", now, "remeasured_runs", a->remeasured + b->remeasured,
                  "disturbed_runs", a->disturbed + b->disturbed, "worst_ratio", fmax(a->worst_ratio, b->worst_ratio));
    if (q && table_ref > 0) {
        json_object_set_new(q, "table_reference_probe_us", json_real(table_ref));
        json_object_set_new(q, "table_measured_slow", json_boolean(table_ref > AC_QUIET_TOL * now));
        json_object_set_new(q, "speed_ratio",
                            json_pack("{s:f,s:f}", "baseline", a->ref_us / table_ref, arm, b->ref_us / table_ref));
    }
    return q;
}

/* {ttft, tpot} relative errors of predicted k against measured tt, tp, the
 * prediction first scaled by speed (1: as predicted). */
static json_t *errors(const ac_cost *k, double tt, double tp, double speed) {
    return json_pack("{s:f,s:f}", "ttft", k->ttft_ms * speed / tt - 1, "tpot",
                     tp > 0 ? k->tpot_ms * speed / tp - 1 : 0);
}

static int cap(int v, int hi) { return v < hi ? v : hi; }

ac_workload ac_measure_local_workload(const ac_workload *wl) {
    return (ac_workload){
        .batch = cap(wl->batch, 4), .prompt_len = cap(wl->prompt_len, 128), .gen_len = cap(wl->gen_len, 32)};
}

int ac_measure_latency_in(const ac_model *m, const char *dtype, const int *ids, size_t n, const ac_workload *w,
                          double quiet_ref_us, double *ttft_ms, double *tpot_ms, ac_quiet_result *qr, ac_err *e) {
    int want = dtype && !strcmp(dtype, "bf16") ? ST_BF16 : ST_F32, wdt = ac_model_wdt(m);
    if (wdt == want) return ac_measure_latency(m, ids, n, w, 0, quiet_ref_us, ttft_ms, tpot_ms, qr, e);
    ac_model c;
    if (want == ST_BF16 ? ac_model_to_bf16(m, &c, e) : ac_model_to_f32(m, &c, e)) return -1;
    if (m->wmap) ac_model_drop_pages(m); /* timed on the copy; pages read back on demand */
    int rc = ac_measure_latency(&c, ids, n, w, 0, quiet_ref_us, ttft_ms, tpot_ms, qr, e);
    ac_model_free(&c);
    return rc;
}

int ac_measure_local_time(const ac_model *base, const ac_model *res, const char *dtype, const int *ids, size_t n,
                          const ac_workload *wl, double quiet_ref_us, ac_local_timing *t, ac_err *e) {
    *t = (ac_local_timing){.w = ac_measure_local_workload(wl)};
    snprintf(t->dtype, sizeof t->dtype, "%s", dtype && !strcmp(dtype, "bf16") ? "bf16" : "fp32");
    return ac_measure_latency_in(base, t->dtype, ids, n, &t->w, quiet_ref_us, &t->base_ttft, &t->base_tpot, &t->qb,
                                 e) ||
                   ac_measure_latency_in(res, t->dtype, ids, n, &t->w, quiet_ref_us, &t->res_ttft, &t->res_tpot,
                                         &t->qres, e)
               ? -1
               : 0;
}

double ac_local_timing_off_table(const ac_local_timing *t, const ac_cost_table *tb) {
    double r = tb ? tb->ref_us : 0;
    if (!(r > 0) || !(t->qb.ref_us > 0) || !(t->qres.ref_us > 0)) return 0;
    double lo = fmin(t->qb.ref_us, t->qres.ref_us), hi = fmax(t->qb.ref_us, t->qres.ref_us);
    return hi > AC_QUIET_TOL * r ? hi : lo * AC_QUIET_TOL < r ? lo : 0;
}

/* A mixture-of-experts model's routing at the timed batch: its top-k, the
 * experts per MoE layer (the most of any layer) and the distinct experts a
 * decode step reads, d = E (1 - (1 - k/E)^B) averaged over its MoE layers
 * (the cost model's figure, docs/costmodel.md); NULL for a dense model. */
static json_t *moe_routing(const ac_arch *a, int B) {
    double d = 0, emax = 0;
    int n = 0;
    for (int l = 0; l < a->n_layers; l++) {
        double E = a->layers[l].n_experts;
        if (E <= 0 || a->layers[l].expert_ffn <= 0) continue;
        d += ac_moe_active_experts(E, fmin(a->top_k, E), B), emax = fmax(emax, E), n++;
    }
    return n ? json_pack("{s:i,s:f,s:f}", "top_k", a->top_k, "experts", emax, "distinct_experts_per_step", d / n)
             : NULL;
}

/* The MoE block's pricing: what priced the experts of the predictions
 * beside the timings (src: ac_cost_expert_source), and, where the table's
 * measured expert grid did, what its GEMM grid alone predicts (the table
 * without its expert grid): both beside the measured times. */
static void moe_sources(json_t *moe, const ac_cost_table *t, const ac_model *base, const ac_model *res,
                        const char *arm, const ac_workload *w, const ac_engine_profile *p, const char *src) {
    if (!src) return;
    json_object_set_new(moe, "experts_priced_by", json_string(src));
    if (strcmp(src, "expert_grid")) return;
    ac_cost_table g = *t; /* shares the grids; not freed */
    g.nre = 0;
    ac_cost k0, k1;
    ac_err e;
    if (predict(&g, base, w, p, &k0, &e) || predict(&g, res, w, p, &k1, &e)) return;
    json_object_set_new(moe, "predicted_gemm_grid",
                        json_pack("{s:{s:f,s:f},s:{s:f,s:f}}", "baseline", "ttft_ms", k0.ttft_ms, "tpot_ms",
                                  k0.tpot_ms, arm, "ttft_ms", k1.ttft_ms, "tpot_ms", k1.tpot_ms));
}

json_t *ac_measure_local_report(const ac_local_timing *t, const ac_model *base, const ac_model *res, const char *arm,
                                const ac_cost_table *cpu_table) {
    const ac_workload lw = t->w;
    double bt = t->base_ttft, bp = t->base_tpot, rt = t->res_ttft, rp = t->res_tpot;
    json_t *o = json_pack("{s:s,s:s,s:{s:i,s:i,s:i},s:{s:f,s:f},s:{s:f,s:f}}", "device", "cpu", "weights_dtype",
                          t->dtype, "workload", "batch", lw.batch, "prompt_len", lw.prompt_len, "gen_len", lw.gen_len,
                          "baseline", "ttft_ms", bt, "tpot_ms", bp, arm, "ttft_ms", rt, "tpot_ms", rp);
    if (!o) return NULL;
    /* the 1-minute load average when measured: on a shared host the errors
     * below say as much about the neighbours as about the model */
    double load[1];
    if (getloadavg(load, 1) == 1) json_object_set_new(o, "load_average", json_real(load[0]));
    json_t *mb = moe_routing(&base->a, lw.batch), *mr = moe_routing(&res->a, lw.batch), *moe = NULL;
    if (mb || mr) { /* the experts each timed decode step reads, beside the times predicted and measured */
        moe = json_pack("{s:i,s:o,s:o}", "batch", lw.batch, "baseline", mb ? mb : json_null(), arm,
                        mr ? mr : json_null());
        json_object_set_new(o, "moe", moe);
    }
    double ref = cpu_table ? cpu_table->ref_us : 0;
    json_object_set_new(o, "quiet", quiet_json(ref, &t->qb, &t->qres, arm));
    ac_engine_profile cp;
    ac_engine_profile_cpu(&cp, t->dtype);
    ac_cost k0, k1;
    ac_err e2;
    const char *src0 = NULL, *src1 = NULL;
    if (cpu_table && predict_src(cpu_table, res, &lw, &cp, &k1, &src1, &e2) == 0 &&
        predict_src(cpu_table, base, &lw, &cp, &k0, &src0, &e2) == 0) {
        if (moe) moe_sources(moe, cpu_table, base, res, arm, &lw, &cp, src0 ? src0 : src1);
        json_object_set_new(o, "predicted",
                            json_pack("{s:{s:f,s:f},s:{s:f,s:f}}", "baseline", "ttft_ms", k0.ttft_ms, "tpot_ms",
                                      k0.tpot_ms, arm, "ttft_ms", k1.ttft_ms, "tpot_ms", k1.tpot_ms));
        json_object_set_new(o, "prediction_error", errors(&k1, rt, rp, 1));
        json_object_set_new(o, "prediction_error_baseline", errors(&k0, bt, bp, 1));
        /* the same with each prediction scaled by how much slower (or
         * quicker) the reference probe ran while that model was timed than
         * when the table was measured: the machine's drift taken out, the
         * cost model's own error left (the probe, quiet.h, follows the
         * engine's prefill between this VM's two speeds) */
        if (ref > 0) {
            json_object_set_new(o, "prediction_error_speed_adjusted", errors(&k1, rt, rp, t->qres.ref_us / ref));
            json_object_set_new(o, "prediction_error_baseline_speed_adjusted", errors(&k0, bt, bp, t->qb.ref_us / ref));
        }
    }
    return o;
}

int ac_measure_on_gpu(const ac_model *base, const ac_model *res, const char *arm, const int *ids, size_t n,
                      const ac_workload *wl, const ac_cost_table *table, const ac_engine_profile *p, json_t **out, ac_err *e) {
    ac_workload gw = {
        .batch = cap(wl->batch, 32), .prompt_len = cap(wl->prompt_len, 2048), .gen_len = cap(wl->gen_len, 64)};
    double bt, bp, rt, rp;
    *out = NULL;
    if (ac_measure_latency(base, ids, n, &gw, 1, 0, &bt, &bp, NULL, e) ||
        ac_measure_latency(res, ids, n, &gw, 1, 0, &rt, &rp, NULL, e))
        return -1;
    ac_engine_profile gp = *p;
    gp.overhead_ms = gp.seq_overhead_us = 0; /* our engine, not a serving framework */
    ac_cost k;
    if (predict(table, res, &gw, &gp, &k, e)) return -1;
    *out = json_pack("{s:s,s:{s:i,s:i,s:i},s:{s:f,s:f},s:{s:f,s:f},s:{s:{s:f,s:f}},s:{s:f,s:f}}", "device",
                     table->device, "workload", "batch", gw.batch, "prompt_len", gw.prompt_len, "gen_len", gw.gen_len,
                     "baseline", "ttft_ms", bt, "tpot_ms", bp, arm, "ttft_ms", rt, "tpot_ms", rp, "predicted", arm,
                     "ttft_ms", k.ttft_ms, "tpot_ms", k.tpot_ms, "prediction_error", "ttft", k.ttft_ms / rt - 1, "tpot",
                     rp > 0 ? k.tpot_ms / rp - 1 : 0);
    return *out ? 0 : ac_errf(e, "out of memory");
}
