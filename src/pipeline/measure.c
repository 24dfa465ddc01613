/* measure.c - see measure.h. */
#include "measure.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>

#include "eval.h"
#include "safetensors.h"

#define RUNS 5

/* TTFT: the fastest of RUNS prefills. TPOT: on the CPU each decode step's
 * fastest of RUNS runs, averaged over the steps (neighbours on a shared
 * machine only add time, and rarely leave a whole run undisturbed); on a GPU,
 * whose steps may run asynchronously, the fastest run's mean step. */
int ac_measure_latency(const ac_model *m, const int *ids, size_t n, const ac_workload *w, int cuda, double *ttft_ms,
                       double *tpot_ms, ac_err *e) {
    int B = w->batch, P = w->prompt_len, G = w->gen_len;
    assert(n > 0 && B > 0 && P > 0);
    ac_scorer *sc;
    if (ac_scorer_open(m, B, P + G, cuda, NULL, &sc, e)) return -1;
    int *tok = malloc(sizeof(int) * B * P), *nxt = malloc(sizeof(int) * B);
    double *best = malloc(sizeof(double) * (G > 1 ? G : 1)), tt = 1e30, run_best = 1e30;
    int rc = tok && nxt && best ? 0 : ac_errf(e, "out of memory");
    for (int i = 0; !rc && i < B * P; i++) tok[i] = ids[i % n];
    for (int g = 0; !rc && g < G; g++) best[g] = 1e30;
    for (int rep = 0; rep < RUNS && !rc; rep++) {
        double t0 = ac_now();
        rc = ac_scorer_step(sc, tok, B, P, 0, e);
        double t1 = ac_now();
        tt = fmin(tt, (t1 - t0) * 1e3);
        for (int g = 1; g < G && !rc; g++) {
            for (int b = 0; b < B; b++) nxt[b] = ids[(b + g) % n];
            double s0 = ac_now();
            rc = ac_scorer_step(sc, nxt, B, 1, P + g - 1, e);
            best[g] = fmin(best[g], (ac_now() - s0) * 1e3);
        }
        if (G > 1) run_best = fmin(run_best, (ac_now() - t1) * 1e3 / (G - 1));
    }
    double sum = 0;
    for (int g = 1; !rc && g < G; g++) sum += best[g];
    *ttft_ms = tt;
    *tpot_ms = G < 2 ? 0 : cuda ? run_best : sum / (G - 1);
    free(tok);
    free(nxt);
    free(best);
    ac_scorer_close(sc);
    return rc;
}

static int predict(const ac_cost_table *t, const ac_model *m, const ac_workload *w, const ac_engine_profile *p,
                   ac_cost *k, ac_err *e) {
    ac_carch c;
    if (ac_carch_from_arch(&m->a, &c, e)) return -1;
    ac_cost_predict(t, &c, w, p, 0, k);
    ac_carch_free(&c);
    return 0;
}

static int cap(int v, int hi) { return v < hi ? v : hi; }

int ac_measure_local(const ac_model *base, const ac_model *res, const int *ids, size_t n, const ac_workload *wl,
                     const ac_cost_table *cpu_table, json_t **out, ac_err *e) {
    ac_workload lw = {cap(wl->batch, 4), cap(wl->prompt_len, 128), cap(wl->gen_len, 32)};
    double bt, bp, rt, rp;
    *out = NULL;
    /* Base and result are timed in the same weight dtype: a resident (BF16)
     * base against an fp32 student would compare two engines' GEMM paths, not
     * two architectures, and the CPU table is measured in fp32. */
    ac_model f32;
    int conv = ac_model_wdt(base) != ac_model_wdt(res) && ac_model_wdt(res) == ST_F32;
    if (conv && ac_model_to_f32(base, &f32, e)) return -1;
    if (conv) ac_model_drop_pages(base); /* timed on the copy; pages read back on demand */
    int rc = ac_measure_latency(conv ? &f32 : base, ids, n, &lw, 0, &bt, &bp, e) ||
             ac_measure_latency(res, ids, n, &lw, 0, &rt, &rp, e);
    if (conv) ac_model_free(&f32);
    if (rc) return -1;
    json_t *o = json_pack("{s:s,s:{s:i,s:i,s:i},s:{s:f,s:f},s:{s:f,s:f}}", "device", "cpu", "workload", "batch",
                          lw.batch, "prompt_len", lw.prompt_len, "gen_len", lw.gen_len, "base", "ttft_ms", bt,
                          "tpot_ms", bp, "result", "ttft_ms", rt, "tpot_ms", rp);
    if (!o) return ac_errf(e, "out of memory");
    /* the 1-minute load average when measured: on a shared host the errors
     * below say as much about the neighbours as about the model */
    double load[1];
    if (getloadavg(load, 1) == 1) json_object_set_new(o, "load_average", json_real(load[0]));
    ac_engine_profile cp;
    ac_engine_profile_default(&cp, 1);
    ac_cost k0, k1;
    ac_err e2;
    if (cpu_table && predict(cpu_table, res, &lw, &cp, &k1, &e2) == 0 &&
        predict(cpu_table, base, &lw, &cp, &k0, &e2) == 0) {
        json_object_set_new(o, "predicted",
                            json_pack("{s:{s:f,s:f},s:{s:f,s:f}}", "base", "ttft_ms", k0.ttft_ms, "tpot_ms", k0.tpot_ms,
                                      "result", "ttft_ms", k1.ttft_ms, "tpot_ms", k1.tpot_ms));
        json_object_set_new(
            o, "prediction_error",
            json_pack("{s:f,s:f}", "ttft", k1.ttft_ms / rt - 1, "tpot", rp > 0 ? k1.tpot_ms / rp - 1 : 0));
        json_object_set_new(
            o, "prediction_error_base",
            json_pack("{s:f,s:f}", "ttft", k0.ttft_ms / bt - 1, "tpot", bp > 0 ? k0.tpot_ms / bp - 1 : 0));
    }
    *out = o;
    return 0;
}

int ac_measure_on_gpu(const ac_model *base, const ac_model *res, const int *ids, size_t n, const ac_workload *wl,
                      const ac_cost_table *table, const ac_engine_profile *p, json_t **out, ac_err *e) {
    ac_workload gw = {cap(wl->batch, 32), cap(wl->prompt_len, 2048), cap(wl->gen_len, 64)};
    double bt, bp, rt, rp;
    *out = NULL;
    if (ac_measure_latency(base, ids, n, &gw, 1, &bt, &bp, e) || ac_measure_latency(res, ids, n, &gw, 1, &rt, &rp, e))
        return -1;
    ac_engine_profile gp = *p;
    gp.overhead_ms = 0; /* our engine, not a serving framework */
    ac_cost k;
    if (predict(table, res, &gw, &gp, &k, e)) return -1;
    *out = json_pack("{s:s,s:{s:i,s:i,s:i},s:{s:f,s:f},s:{s:f,s:f},s:{s:f,s:f},s:{s:f,s:f}}", "device", table->device,
                     "workload", "batch", gw.batch, "prompt_len", gw.prompt_len, "gen_len", gw.gen_len, "base",
                     "ttft_ms", bt, "tpot_ms", bp, "result", "ttft_ms", rt, "tpot_ms", rp, "predicted_result",
                     "ttft_ms", k.ttft_ms, "tpot_ms", k.tpot_ms, "prediction_error", "ttft", k.ttft_ms / rt - 1, "tpot",
                     rp > 0 ? k.tpot_ms / rp - 1 : 0);
    return *out ? 0 : ac_errf(e, "out of memory");
}
