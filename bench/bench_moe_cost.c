/*
 * bench_moe_cost - the cost model of mixture-of-experts layers against the
 * CPU engine (issue #30, item 4): a random MoE model (4 layers, E experts,
 * top-k routing, 55 MiB in fp32) decoded at batch 1, 2, 4, ... 64,
 * each batch's measured TTFT and TPOT beside the prediction from the CPU
 * cost table measured in the same run, and the expected experts a decode
 * step reaches, d(B) = E (1 - (1 - k/E)^B). To show the step time following
 * d(B), each batch also prints the predictions of the two models that ignore
 * it: every step reading k experts (a dense FFN of k x Fe, the active width)
 * or all E (a dense FFN of E x Fe); and the MoE model's prediction from
 * the table's GEMM grid alone (its expert grid left out, as in tables
 * measured before it), column "(gemm)".
 *   bench_moe_cost [COST_DB]
 * Options: AC_BENCH_RUNS (runs per measurement, default 5), AC_BENCH_THREADS
 * (default 2), AC_BENCH_CASES (only the cases whose name contains it),
 * AC_BENCH_PROMPT / AC_BENCH_GEN (prompt and generated tokens, 32 / 12),
 * AC_BENCH_BATCHES (the batches timed, e.g. "1,4,16"; default 1,2,4,...,64),
 * AC_BENCH_CLOCK=thread (1 thread; the table and the runs timed by the
 * thread's CPU time, as bench_costmodel's option: on a loaded machine the
 * wall clock measures the neighbours; such a table is not stored).
 * TTFT is the fastest of the runs' prefills, TPOT the mean over the decode
 * steps of each step's fastest run (neighbours on a shared machine only ever
 * add time). The table is measured fresh (this machine's speed drifts over
 * minutes); COST_DB, when given, receives it. Prints the 1-minute load
 * average before, after the table, after each batch and at the end.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "costcache.h"
#include "cost/costmodel.h"
#include "runtime/engine.h"
#include "runtime/kernels_cpu.h"

static void fill(float *p, size_t n, unsigned *s) {
    for (size_t i = 0; i < n; i++) {
        *s = *s * 1664525u + 1013904223u;
        p[i] = ((*s >> 9) / 4194304.0f - 1.0f) * 0.05f; /* [-0.05, 0.05): no subnormal softmax weights */
    }
}

static void ones(float *p, size_t n) {
    for (size_t i = 0; p && i < n; i++) p[i] = 1;
}

/* A random fp32 model of a's shape: attention, router and every expert. */
static void random_model(ac_model *m, const ac_arch *a) {
    ac_err e;
    if (ac_model_alloc(m, a, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        exit(1);
    }
    unsigned s = 11;
    size_t H = a->hidden, hd = a->head_dim;
    fill(m->embed, (size_t)a->vocab * H, &s);
    if (m->lm_head != m->embed) fill(m->lm_head, (size_t)a->vocab * H, &s);
    ones(m->final_norm, H);
    for (int l = 0; l < a->n_layers; l++) {
        const ac_layer_arch *L = &a->layers[l];
        ac_layer_w *w = &m->L[l];
        ones(w->in_norm, H);
        ones(w->post_norm, H);
        fill(w->wq, L->n_heads * hd * H, &s);
        fill(w->wk, L->n_kv_heads * hd * H, &s);
        fill(w->wv, L->n_kv_heads * hd * H, &s);
        fill(w->wo, L->n_heads * hd * H, &s);
        fill(w->router, (size_t)L->n_experts * H, &s);
        for (int x = 0; x < L->n_experts; x++) {
            fill(w->eg[x], (size_t)L->expert_ffn * H, &s);
            fill(w->eu[x], (size_t)L->expert_ffn * H, &s);
            fill(w->ed[x], (size_t)L->expert_ffn * H, &s);
        }
    }
}

static int RUNS = 5;
static int TCLOCK; /* AC_BENCH_CLOCK=thread */
static double clk(void) {
    struct timespec ts;
    if (!TCLOCK || clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)) return ac_now();
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Fastest prefill of B prompts of P tokens, and the mean over G-1 decode
 * steps of each step's fastest run. Every sequence gets its own tokens, so
 * each routes independently. */
static void measure(const ac_model *m, int B, int P, int G, double *ttft, double *tpot) {
    ac_engine en;
    ac_err e;
    if (ac_engine_init(&en, m, B, P + G, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        exit(1);
    }
    int *tok = malloc(sizeof(int) * B * P), *nxt = malloc(sizeof(int) * B);
    double *best = malloc(sizeof(double) * G);
    if (!tok || !nxt || !best) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (int i = 0; i < B * P; i++) tok[i] = (i * 131 + 17) % m->a.vocab;
    for (int g = 0; g < G; g++) best[g] = 1e30;
    double tt = 1e30;
    for (int r = 0; r < RUNS; r++) {
        double t0 = clk();
        if (ac_engine_forward(&en, tok, B, P, 0, 1, &e)) {
            fprintf(stderr, "%s\n", e.msg);
            exit(1);
        }
        tt = fmin(tt, (clk() - t0) * 1e3);
        for (int g = 1; g < G; g++) {
            for (int b = 0; b < B; b++) nxt[b] = (g * 977 + b * 389 + r) % m->a.vocab;
            t0 = clk();
            ac_engine_forward(&en, nxt, B, 1, P + g - 1, 1, &e);
            best[g] = fmin(best[g], (clk() - t0) * 1e3);
        }
    }
    double sum = 0;
    for (int g = 1; g < G; g++) sum += best[g];
    *ttft = tt;
    *tpot = sum / (G - 1);
    free(best);
    free(nxt);
    free(tok);
    ac_engine_free(&en);
}

static double load1(void) {
    double l[1] = {0};
    return getloadavg(l, 1) == 1 ? l[0] : -1;
}

/* The same model with a dense FFN of width F in every layer instead of the
 * experts (the counterfactuals a prediction without d(B) would make). */
static int dense_carch(const ac_arch *a, int F, ac_carch *c, ac_err *e) {
    ac_arch b;
    if (ac_arch_copy(&b, a, e)) return -1;
    for (int l = 0; l < b.n_layers; l++) b.layers[l].ffn = F, b.layers[l].n_experts = b.layers[l].expert_ffn = 0;
    b.top_k = 0;
    int rc = ac_carch_from_arch(&b, c, e);
    ac_arch_free(&b);
    return rc;
}

typedef struct {
    const char *name;
    int hidden, heads, kv, hd, vocab, L, E, Fe, k;
} moe_case;

int main(int argc, char **argv) {
    const char *db = argc > 1 ? argv[1] : NULL, *th = getenv("AC_BENCH_THREADS"), *only = getenv("AC_BENCH_CASES"),
               *ck = getenv("AC_BENCH_CLOCK");
    int threads = th && atoi(th) > 0 ? atoi(th) : 2;
    TCLOCK = ck && !strcmp(ck, "thread");
    if (TCLOCK) threads = 1; /* the thread's CPU time sees one thread's work only */
    ac_cost_measure_thread_clock(TCLOCK);
    if (getenv("AC_BENCH_RUNS") && atoi(getenv("AC_BENCH_RUNS")) > 0) RUNS = atoi(getenv("AC_BENCH_RUNS"));
    int P = getenv("AC_BENCH_PROMPT") && atoi(getenv("AC_BENCH_PROMPT")) > 0 ? atoi(getenv("AC_BENCH_PROMPT")) : 32;
    int G = getenv("AC_BENCH_GEN") && atoi(getenv("AC_BENCH_GEN")) > 1 ? atoi(getenv("AC_BENCH_GEN")) : 12;
    ac_set_threads(threads);
    setvbuf(stdout, NULL, _IOLBF, 0);
    double load_start = load1(), t_start = ac_now();
    ac_err e;
    ac_cost_table t;
    if (ac_cost_measure_cpu(threads, "fp32", NULL, NULL, &t, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    ac_cost_cache cache;
    costcache_file(&cache, db, 1);
    if (db && TCLOCK)
        fprintf(stderr, "warning: a table timed by CPU time is not stored in %s\n", db);
    else if (db && cache.put(cache.ud, &t, &e))
        fprintf(stderr, "warning: %s\n", e.msg);
    printf("load average (1 min) before the table: %.2f; after it: %.2f\n", load_start, load1());
    printf("cost table: %s (measured now in %.1f s; effective cache %.1f MiB)\n", t.key, t.measure_s,
           t.cache_bytes / 1048576.0);
    /* the same table without its expert grid: the experts on the GEMM grid (tables measured before it) */
    ac_cost_table tg = t; /* shares the grids; not freed */
    tg.nre = 0;
    printf("expert grid: %d x %d x %d points (rows %g-%g, expert width %g-%g, hidden %g-%g)\n", t.nre, t.nfe, t.nhe,
           t.nre ? t.erows[0] : 0, t.nre ? t.erows[t.nre - 1] : 0, t.nfe ? t.effn[0] : 0,
           t.nfe ? t.effn[t.nfe - 1] : 0, t.nhe ? t.ehid[0] : 0, t.nhe ? t.ehid[t.nhe - 1] : 0);
    moe_case cases[] = {
        {"moe-e32-k4", 256, 4, 2, 64, 2048, 4, 32, 128, 4},
        {"moe-e16-k2", 256, 4, 2, 64, 2048, 4, 16, 256, 2},
    };
    int batches[16] = {1, 2, 4, 8, 16, 32, 64}, nb = 7;
    const char *bl = getenv("AC_BENCH_BATCHES"); /* e.g. "1,4,16": the batches to time (up to 16, each 1..256) */
    if (bl && *bl) {
        nb = 0;
        for (const char *q = bl; *q && nb < 16;) {
            char *end;
            long b = strtol(q, &end, 10);
            if (end == q || b < 1 || b > 256) {
                fprintf(stderr, "AC_BENCH_BATCHES: \"%s\" is not a list of batches 1..256\n", bl);
                return 2;
            }
            batches[nb++] = (int)b;
            q = *end == ',' ? end + 1 : end;
        }
    }
    double all_t[32], all_p[32];
    int n = 0;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        moe_case *mc = &cases[c];
        if (only && !strstr(mc->name, only)) continue;
        ac_arch a = {0};
        snprintf(a.model_type, sizeof a.model_type, "mixtral");
        a.vocab = mc->vocab;
        a.hidden = mc->hidden;
        a.head_dim = mc->hd;
        a.n_layers = mc->L;
        a.max_pos = 4096;
        a.eps = 1e-5f;
        a.rope_theta = 10000;
        a.bos_id = a.eos_id = -1;
        a.top_k = mc->k;
        a.norm_topk = 1;
        a.layers = calloc(mc->L, sizeof *a.layers);
        if (!a.layers) return 1;
        for (int l = 0; l < mc->L; l++) a.layers[l] = (ac_layer_arch){mc->heads, mc->kv, 0, mc->E, mc->Fe, 0};
        ac_model m;
        random_model(&m, &a);
        ac_carch ca;
        if (ac_carch_from_arch(&a, &ca, &e)) {
            fprintf(stderr, "%s\n", e.msg);
            return 1;
        }
        ac_engine_profile p;
        ac_engine_profile_cpu(&p, t.dtype);
        double mib = ac_arch_params(&a) * 4 / 1048576.0,
               emib = 3.0 * mc->hidden * mc->Fe * 4 * mc->L / 1048576.0; /* one expert in every layer */
        printf("\n%s: hidden %d, %d layers, %d heads / %d KV of %d, %d experts of %d, top-%d, vocab %d: %.1f MiB "
               "fp32 (%.2f MiB per expert across the layers); prompt %d, %d tokens, %d runs\n",
               mc->name, mc->hidden, mc->L, mc->heads, mc->kv, mc->hd, mc->E, mc->Fe, mc->k, mc->vocab, mib, emib, P, G,
               RUNS);
        /* counterfactuals: every step reads k experts (a dense FFN of the
         * active width), or every step reads all E (a dense FFN of E x Fe) */
        ac_carch ck, cE;
        if (dense_carch(&a, mc->k * mc->Fe, &ck, &e) || dense_carch(&a, mc->E * mc->Fe, &cE, &e)) {
            fprintf(stderr, "%s\n", e.msg);
            return 1;
        }
        printf("%5s %6s %8s %9s %9s %6s %9s %9s %6s %8s %6s %9s %6s %5s %9s\n", "batch", "d(B)", "expMiB", "ttft_meas",
               "ttft_pred", "ratio", "tpot_meas", "tpot_pred", "ratio", "(kFe)", "ratio", "(E Fe)", "ratio", "load",
               "(gemm)");
        double d[16], tm[16], tp[16], ek = 0, eE = 0, eM = 0;
        for (int i = 0; i < nb; i++) {
            int B = batches[i];
            ac_workload wl = {.batch = B, .prompt_len = P, .gen_len = G};
            double mt, mp;
            measure(&m, B, P, G, &mt, &mp);
            ac_cost k, kk, kE, kg;
            ac_cost_predict(&t, &ca, &wl, &p, 0, &k);
            ac_cost_predict(&tg, &ca, &wl, &p, 0, &kg);
            ac_cost_predict(&t, &ck, &wl, &p, 0, &kk);
            ac_cost_predict(&t, &cE, &wl, &p, 0, &kE);
            d[i] = ac_moe_active_experts(mc->E, mc->k, B);
            tm[i] = mp;
            tp[i] = k.tpot_ms;
            all_t[n] = k.ttft_ms / mt - 1;
            all_p[n] = k.tpot_ms / mp - 1;
            eM += fabs(all_p[n]) / nb, ek += fabs(kk.tpot_ms / mp - 1) / nb, eE += fabs(kE.tpot_ms / mp - 1) / nb;
            n++;
            printf("%5d %6.2f %8.1f %9.3f %9.3f %6.3f %9.4f %9.4f %6.3f %8.4f %6.3f %9.4f %6.3f %5.2f %9.4f\n", B, d[i],
                   d[i] * emib, mt, k.ttft_ms, k.ttft_ms / mt, mp, k.tpot_ms, k.tpot_ms / mp, kk.tpot_ms,
                   kk.tpot_ms / mp, kE.tpot_ms, kE.tpot_ms / mp, load1(), kg.tpot_ms);
        }
        printf("%s: TPOT(%d) / TPOT(1) measured %.2f, predicted %.2f (d(%d) / d(1) = %.2f); mean |TPOT error| of the "
               "MoE model %.1f%%, of a dense FFN of k x Fe %.1f%%, of one of E x Fe %.1f%%\n",
               mc->name, batches[nb - 1], tm[nb - 1] / tm[0], tp[nb - 1] / tp[0], batches[nb - 1], d[nb - 1] / d[0],
               100 * eM, 100 * ek, 100 * eE);
        ac_carch_free(&ck);
        ac_carch_free(&cE);
        ac_carch_free(&ca);
        ac_model_free(&m);
        ac_arch_free(&a);
    }
    double st = 0, sp = 0, wt = 0, wp = 0;
    for (int i = 0; i < n; i++) {
        st += fabs(all_t[i]) / n, sp += fabs(all_p[i]) / n;
        wt = fmax(wt, fabs(all_t[i])), wp = fmax(wp, fabs(all_p[i]));
    }
    printf("\nmean |error| TTFT %.1f%% (worst %.1f%%), TPOT %.1f%% (worst %.1f%%) over %d batches\n", 100 * st,
           100 * wt, 100 * sp, 100 * wp, n);
    printf("load average (1 min) at the end: %.2f on %ld cores; %d threads; %s clock; %.0f s in all\n", load1(),
           sysconf(_SC_NPROCESSORS_ONLN), threads, TCLOCK ? "thread CPU-time" : "wall", ac_now() - t_start);
    ac_cost_table_free(&t);
    return 0;
}
