/*
 * costmeasure.c - the local CPU's cost table, measured with the engine's
 * own kernels: GEMMs over an (M, N, K) grid with weights cold (rotating
 * through a pool larger than the cache) and warm, one attention head over
 * a (queries, keys, head_dim) grid, elementwise passes, one expert of a
 * mixture of experts as the engine runs it (ac_block_cpu_expert) over a
 * (rows routed to it, expert width, hidden) grid, cold and warm; then, end to end
 * against decode steps of the engine, the decode streaming cost per
 * working-set band (per MiB of weights, batch 1 and 4), the KV cache's own
 * cost per MiB (steps after a long prompt against a short one) and the
 * effective cache size. Each part (a GEMM row, a head size, the elementwise
 * pass, a decode probe) is a unit of a quiet measurement (quiet.h): parts
 * a neighbour slowed are measured again.
 * A table is measured for the engine's fp32 weights or for BF16 ones (a
 * resident BF16 checkpoint, a BF16 export): the GEMMs then run on the BF16
 * weights as the engine does (the CPU's BF16 kernel from 32 rows, OpenBLAS
 * on one thread around it; the decode GEMV up to 8 rows; converted per tile
 * between, or where the CPU has neither), and the decode probes are BF16
 * models (ac_model_to_bf16).
 * Also the CUDA plugin's raw timings into a table (ac_cost_table_from_timings).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cost/costmodel.h"
#include "costtimings_int.h"
#include "core/dtype.h"
#include "runtime/block_cpu.h"
#include "runtime/engine.h"
#include "runtime/kernels_cpu.h"
#include "cost/quiet.h"
#include "core/tensor.h"

/* ---------------------------------------------------------------- measurement */

/* The clock of every timing below: the wall clock, or the calling thread's
 * CPU time (ac_cost_measure_thread_clock). */
static int thread_clock;
void ac_cost_measure_thread_clock(int on) { thread_clock = on; }
static double clk(void) {
    struct timespec ts;
    if (!thread_clock || clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)) return ac_now();
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Weights rotate through a pool larger than the last-level cache, so each
 * call reads them from memory as a forward pass over many layers does
 * (docs/costmodel.md: measure cold weights). */
#define POOL_FLOATS (24u << 20) /* 96 MiB */
typedef struct {
    float *a, *pool, *c;
    int m, n, k;
    size_t off, span;
    uint16_t *pool16;  /* BF16 tables: the pool's BF16 weights (2 x POOL_FLOATS), else NULL */
    ac_wscratch *ws;   /* BF16 tables: ac_linear_w's scratch */
} gemm_arg;
static void run_gemm(void *p) {
    gemm_arg *g = p;
    size_t nw = (size_t)g->n * g->k, span = g->span ? g->span : g->pool16 ? 2 * (size_t)POOL_FLOATS : POOL_FLOATS;
    if (g->off + nw > span) g->off = 0;
    if (g->pool16)
        ac_linear_w(g->c, g->a, g->pool16 + g->off, ST_BF16, NULL, g->m, g->k, g->n, 0, g->ws);
    else
        ac_linear(g->c, g->a, g->pool + g->off, NULL, g->m, g->k, g->n);
    g->off += (nw + 1023) & ~(size_t)1023;
}

typedef struct {
    float *out, *q, *k, *v, *sc;
    int n, s, hd;
} attn_arg;
static void run_attn(void *p) {
    attn_arg *a = p;
    ac_attention_head(a->out, a->q, a->k, a->v, a->n, a->s - a->n, a->hd, a->hd, a->hd, 0, a->sc);
}

/* One expert of a mixture, the engine's own path (ac_block_cpu_expert):
 * 2m rows of which the m even ones are routed to it (gathered as the
 * engine gathers a decode step's or a prompt's rows), its three matrices
 * (gate, up, down) rotating through the pool like run_gemm's weights
 * (span 0) or held in cache (span: one expert's). */
#define EXPERT_MAX_ROWS 64
typedef struct {
    float *x, *in, *r; /* x, in [2m][h]; r [2m][2] routing weights */
    const float *pool;
    const uint16_t *pool16; /* BF16 tables */
    int m, fe, h;
    size_t off, span;
    int rows[2 * EXPERT_MAX_ROWS];
    ac_expert_scratch s;
} expert_arg;
static void run_expert(void *p) {
    expert_arg *a = p;
    size_t one = (size_t)a->fe * a->h, nw = 3 * one,
           span = a->span ? a->span : a->pool16 ? 2 * (size_t)POOL_FLOATS : POOL_FLOATS;
    if (a->off + nw > span) a->off = 0;
    int wdt = a->pool16 ? ST_BF16 : ST_F32;
    const void *wg = a->pool16 ? (const void *)(a->pool16 + a->off) : (const void *)(a->pool + a->off),
               *wu = a->pool16 ? (const void *)(a->pool16 + a->off + one) : (const void *)(a->pool + a->off + one),
               *wd = a->pool16 ? (const void *)(a->pool16 + a->off + 2 * one)
                               : (const void *)(a->pool + a->off + 2 * one);
    ac_block_cpu_expert(a->x, a->in, a->r, 2 * a->m, a->h, 2, 0, wg, wu, wd, wdt, a->fe, &a->s, NULL, 0);
    a->off += (nw + 1023) & ~(size_t)1023;
}

/* Per-call microseconds: warm up, size a batch, then 7 batches of >= 1 ms
 * each; the fastest batch. On a shared machine the minimum is the stable estimate of
 * what the hardware costs (neighbours only ever add time). A call of 10 ms
 * or more (the largest GEMMs, a third of a table's time) is timed 3 times,
 * the sizing call among them: a neighbour's slice of such a call is a small
 * share of it, and the quiet re-measurement (quiet.h) catches a slowed row. */
#define LONG_CALL_S 10e-3
/* Calls of fn per batch so that a batch lasts at least secs: one call to
 * warm up, one timed (its seconds in *one when one is not NULL). */
static int calls_per_batch(void (*fn)(void *), void *arg, double secs, double *one) {
    fn(arg);
    double t0 = clk();
    fn(arg);
    double s = clk() - t0;
    if (one) *one = s;
    return s > secs ? 1 : (int)(secs / (s > 1e-7 ? s : 1e-7)) + 1;
}
static double time_us(void (*fn)(void *), void *arg) {
    double one;
    int reps = calls_per_batch(fn, arg, 1e-3, &one), is_long = one >= LONG_CALL_S;
    double best = is_long ? one * 1e6 : 1e30;
    for (int b = 0; b < (is_long ? 2 : 7); b++) {
        double t0 = clk();
        for (int r = 0; r < reps; r++) fn(arg);
        double us = (clk() - t0) / reps * 1e6;
        if (us < best) best = us;
    }
    return best;
}

int ac_cost_cpu_dtype_ok(const char *dtype) { return dtype && (!strcmp(dtype, "fp32") || !strcmp(dtype, "bf16")); }

void ac_cost_cpu_key(int threads, const char *dtype, char *key, size_t n, char *device, size_t dn) {
    ac_local_device d[1];
    ac_devices_local(d, 1);
    char dev[200], isa[96], kind[320];
    snprintf(dev, sizeof dev, "%s (%d threads)", d[0].name, threads);
    if (device) snprintf(device, dn, "%s", dev);
    /* The node kind (docs/operations.md, "Cost tables per node kind"): the
     * model name and the instruction sets the kernels choose between, so
     * hosts that share a model name but not those (a VM hiding AVX-512 or
     * AMX) keep tables of their own. */
    ac_cpu_isa(isa, sizeof isa);
    snprintf(kind, sizeof kind, "%s [%s] (%d threads)", d[0].name, isa, threads);
    /* "-kv": tables with the decode bands per MiB of weights and the KV
     * cache's own rate; "q2": measured quiet, with the 128 x 256 x 256
     * reference probe (quiet.h; "q" had a 128 x 512 x 512 one, whose
     * microseconds cannot be compared with it). Cached ones without them are
     * measured again rather than used with the older decode model or another
     * probe's reference. BF16 tables add "-t24": measured since the BF16
     * GEMM kernels start a thread per 2^24 multiply-adds at most
     * (ac_kthreads_gemm), which made small prefill GEMMs about twice as
     * quick; older BF16 tables are measured again. "-ex": tables with the
     * expert grid (the engine's per-expert path timed); older ones are
     * measured again once, so a cached table prices mixtures of experts
     * from it. */
    int bf16 = dtype && !strcmp(dtype, "bf16");
    snprintf(key, n, "%s|%s|autocompress-cpu|v%d-kvq2-ex%s", kind, bf16 ? "bf16" : "fp32", AC_CT_VERSION,
             bf16 ? "-t24" : "");
}

void ac_cost_cuda_key(const char *gpu_name, int cc, char *key, size_t n) {
    snprintf(key, n, "cuda:%s [sm_%d, driver %d]|bf16|cublas|v%d", gpu_name, cc, ac_cuda_driver_version(),
             AC_CT_VERSION);
}

/* The probes' 4-layer architecture of hidden width H (head_dim 64, FFN
 * 3H, vocab 1024); la holds its 4 layers. */
static void probe_arch(int H, ac_arch *a, ac_layer_arch la[4]) {
    *a = (ac_arch){0};
    snprintf(a->model_type, sizeof a->model_type, "llama");
    a->vocab = 1024;
    a->hidden = H;
    a->head_dim = 64;
    a->n_layers = 4;
    a->max_pos = 48;
    a->eps = 1e-5f;
    a->rope_theta = 10000;
    a->bos_id = a->eos_id = -1;
    for (int l = 0; l < 4; l++) la[l] = (ac_layer_arch){H / 64, H / 128 > 0 ? H / 128 : 1, 3 * H, 0, 0, 0};
    a->layers = la;
}

/* The probe model of width H with arbitrary finite weights (norms 1), its
 * matrices turned to BF16 when bf16 (ac_model_make_bf16). */
static int probe_model(int H, int bf16, ac_model *m, ac_err *e) {
    ac_layer_arch la[4];
    ac_arch a;
    probe_arch(H, &a, la);
    int L = a.n_layers, V = a.vocab;
    if (ac_model_alloc(m, &a, e)) return -1;
    unsigned s = 1;
    float *bufs[] = {m->embed, m->lm_head};
    for (int b = 0; b < 2; b++)
        for (size_t k = 0; k < (size_t)V * H; k++) {
            s = s * 1664525u + 1013904223u;
            bufs[b][k] = (float)(s >> 9) * 1e-9f;
        }
    for (int l = 0; l < L; l++) {
        ac_layer_w *w = &m->L[l];
        size_t Q = (size_t)la[l].n_heads * 64, KV = (size_t)la[l].n_kv_heads * 64, F = la[l].ffn;
        float *ws[] = {w->wq, w->wk, w->wv, w->wo, w->wg, w->wu, w->wd};
        size_t ns[] = {Q * H, KV * H, KV * H, Q * H, F * H, F * H, F * H};
        for (int b = 0; b < 7; b++)
            for (size_t k = 0; k < ns[b]; k++) {
                s = s * 1664525u + 1013904223u;
                ws[b][k] = (float)(s >> 9) * 1e-9f;
            }
        for (int k = 0; k < H; k++) w->in_norm[k] = w->post_norm[k] = 1;
    }
    for (int k = 0; k < H; k++) m->final_norm[k] = 1;
    return bf16 ? ac_model_make_bf16(m, e) : 0; /* freed on failure */
}

/* Mean decode step (ms) of B sequences of m over PROBE_STEPS steps after a
 * P-token prompt each, prefilled before every run as TPOT is measured
 * (bench_costmodel, measure.c): the steps right after a long prompt pay for
 * what its prefill evicted. Each step's fastest of PROBE_RUNS runs
 * (neighbours on a shared machine only ever add time, so the per-step
 * minimum is the stable estimate). */
#define PROBE_RUNS 4
#define PROBE_RUNS4 8 /* batch 4: its rate varied most from run to run */
#define PROBE_STEPS 12
#define PROBE_SHORT 16
#define PROBE_LONG 512
static int decode_step_ms(const ac_model *m, int B, int P, int runs, double *ms, ac_err *e) {
    ac_engine en;
    double best[PROBE_STEPS];
    if (ac_engine_init(&en, m, B, P + PROBE_STEPS, e)) return -1;
    int *tok = malloc(sizeof(int) * ((size_t)B * P + 16)), rc = 0;
    if (!tok) {
        ac_engine_free(&en);
        return ac_errf(e, "out of memory for the decode probe");
    }
    for (int k = 0; k < B * P + 16; k++) tok[k] = (k * 7) % m->a.vocab;
    for (int g = 0; g < PROBE_STEPS; g++) best[g] = 1e30;
    for (int r = 0; r < runs && !rc; r++) {
        rc = ac_engine_forward(&en, tok, B, P, 0, 1, e);
        for (int g = 0; g < PROBE_STEPS && !rc; g++) {
            double t0 = clk();
            rc = ac_engine_forward(&en, tok + (g % 16), B, 1, P + g, 1, e);
            double dt = clk() - t0;
            if (dt < best[g]) best[g] = dt;
        }
    }
    free(tok);
    ac_engine_free(&en);
    double sum = 0;
    for (int g = 0; g < PROBE_STEPS; g++) sum += best[g];
    *ms = sum / PROBE_STEPS * 1e3;
    return rc;
}

/* The warm-table and cold-table TPOT (ms) of the probe's decode steps of B
 * sequences after a P-token prompt. */
static void probe_predict(ac_cost_table *t, const ac_carch *c, int B, int P, double *warm_ms, double *cold_ms) {
    ac_engine_profile p;
    ac_engine_profile_cpu(&p, t->dtype);
    ac_workload w = {.batch = B, .prompt_len = P, .gen_len = PROBE_STEPS + 1};
    ac_cost warm, cold;
    int nd = t->ndec;
    double cb = t->cache_bytes;
    t->ndec = 0;
    t->cache_bytes = 1e30;
    ac_cost_predict(t, c, &w, &p, 0, &warm);
    t->cache_bytes = 0;
    ac_cost_predict(t, c, &w, &p, 0, &cold);
    t->ndec = nd;
    t->cache_bytes = cb;
    *warm_ms = warm.tpot_ms;
    if (cold_ms) *cold_ms = cold.tpot_ms;
}

/* MiB of the probe's KV cache read per step (B sequences, mean context of the steps after a P-token prompt). */
static double probe_kv_mib(const ac_cost_table *t, const ac_carch *c, int B, int P) {
    ac_engine_profile p;
    ac_engine_profile_cpu(&p, t->dtype);
    double S = P + PROBE_STEPS / 2.0;
    return (ac_cost_decode_bytes(c, &p, B, S) - ac_cost_decode_bytes(c, &p, B, 0)) / 1048576.0;
}

/* End-to-end calibration (docs/costmodel.md: validate end to end) on decode
 * steps of the engine itself, over random 4-layer models of growing weight
 * size (3.6 to 111 MiB of fp32 weights), at batch 1 and 4:
 * - decode bands: what a step costs beyond the warm-weight tables, per MiB
 *   of weights streamed, at each model's working set. The rate at which the
 *   engine streams weights is not one bandwidth: it falls as the working
 *   set outgrows the caches (L2, the VM's share of L3, DRAM), so it is
 *   measured per working-set size rather than fitted as one number; and a
 *   batch of 4 rows takes OpenBLAS's packed GEMM rather than its
 *   matrix-vector path, so batch 4 has its own bands;
 * - the KV cache's cost: the same model's steps after a PROBE_LONG-token
 *   prompt against those after a PROBE_SHORT-token one, beyond what the
 *   warm attention table adds between the two, per MiB of KV cache more
 *   (the engine's keys and values are strided per head and evicted by the
 *   weights between steps, the table's attention reads them hot; and the
 *   steps right after a long prompt also refill what its prefill evicted,
 *   which grows with the prompt like the KV cache);
 * - the effective cache for prefill's warm/cold blend: the largest size
 *   whose batch-1 step is closer to the warm-weights prediction than to the
 *   cold one. Micro-probes of the cache alone mislead here: under a VM the
 *   L3 is shared and sysfs reports the host's. */
/* v[0..n) made such that v[i] x scale[i] (scale NULL: 1) is non-decreasing
 * (pool adjacent violators on the products, equal weights), and >= 0
 * unless signed_ok: a step cannot stream a larger working set faster (nor
 * in less total time); single probes that a neighbour slowed (or that
 * caught the warm table slowed) would otherwise bend the bands. The
 * weights' rates are signed (costmodel.h), the KV rates not. */
void ac_cost_bands_monotone(double *v, const double *scale, int n, int signed_ok) {
    double val[AC_CT_MAXG];
    int cnt[AC_CT_MAXG], k = 0;
    if (n > AC_CT_MAXG) n = AC_CT_MAXG;
    for (int i = 0; i < n; i++) {
        val[k] = v[i] * (scale ? scale[i] : 1);
        cnt[k] = 1;
        while (k > 0 && val[k - 1] > val[k]) {
            val[k - 1] = (val[k - 1] * cnt[k - 1] + val[k] * cnt[k]) / (cnt[k - 1] + cnt[k]);
            cnt[k - 1] += cnt[k];
            k--;
        }
        k++;
    }
    for (int b = 0, i = 0; b < k; b++)
        for (int j = 0; j < cnt[b]; j++, i++) v[i] = val[b] > 0 || signed_ok ? val[b] / (scale ? scale[i] : 1) : 0;
}

/* The KV cache's rate is measured on the probes up to KV_PROBE_MAX_H wide
 * (working sets up to ~30 MiB): on the larger ones the long prompt's KV is a
 * few % of the bytes a step streams, and a difference of two steps that
 * size is noise (a run at load 21 gave 7,764 us/MiB at 111 MiB). Beyond,
 * the last measured rate, at least the weights' own rate there (both then
 * stream from memory). */
#define KV_PROBE_MAX_H 384
/* The decode probes' widths; those up to KV_PROBE_MAX_H also time steps
 * after a long prompt for the KV cache's rate. */
static const int HS[] = {128, 192, 256, 384, 512, 768};
enum { NBANDS = sizeof HS / sizeof *HS };

/* A band's raw timings (ms per decode step): batch 1 and 4 after a short
 * prompt, batch 1 after a long one (0 where not measured). NAN: the probe
 * could not run (out of memory), and neither can the wider ones. */
typedef struct {
    double m1, m4, ml;
} band_raw;

/* One probe model of hidden width H timed, each figure the minimum of what
 * r held and this run (a band may be measured again, quiet.h). */
static void band_measure(int H, int bf16, band_raw *r) {
    ac_model m;
    ac_err e;
    double m1, m4, ml = 0;
    int kv_long = H <= KV_PROBE_MAX_H;
    if (probe_model(H, bf16, &m, &e)) {
        r->m1 = NAN;
        return;
    }
    int rc = decode_step_ms(&m, 1, PROBE_SHORT, PROBE_RUNS, &m1, &e) ||
             decode_step_ms(&m, 4, PROBE_SHORT, PROBE_RUNS4, &m4, &e) ||
             (kv_long && decode_step_ms(&m, 1, PROBE_LONG, PROBE_RUNS, &ml, &e));
    ac_model_free(&m);
    if (rc) {
        r->m1 = NAN;
        return;
    }
    r->m1 = fmin(r->m1, m1);
    r->m4 = fmin(r->m4, m4);
    r->ml = kv_long ? fmin(r->ml, ml) : 0;
}

/* Band point n from the raw timings of the probe of width H (working set,
 * batch-1 and batch-4 cost per MiB of weights, KV cost per MiB: from the
 * long prompt where measured, else kv_prev); *wbytes its weights;
 * *cold_closer: its batch-1 step is closer to the cold-weights prediction
 * than to the warm one. */
static int band_derive(ac_cost_table *t, int H, const band_raw *r, int n, double kv_prev, double *wbytes,
                       double *wmib_out, int *cold_closer) {
    ac_layer_arch la[4];
    ac_arch a;
    ac_err e;
    ac_carch c;
    probe_arch(H, &a, la);
    if (isnan(r->m1) || ac_carch_from_arch(&a, &c, &e)) return -1;
    int kv_long = H <= KV_PROBE_MAX_H;
    double m1 = r->m1, m4 = r->m4, ml = r->ml, w1, c1, w4, wl;
    ac_engine_profile p;
    ac_engine_profile_cpu(&p, t->dtype);
    probe_predict(t, &c, 1, PROBE_SHORT, &w1, &c1);
    probe_predict(t, &c, 4, PROBE_SHORT, &w4, NULL);
    probe_predict(t, &c, 1, PROBE_LONG, &wl, NULL);
    *cold_closer = fabs(m1 - w1) >= fabs(m1 - c1);
    double wmib = ac_cost_decode_bytes(&c, &p, 1, 0) / 1048576.0, k1 = probe_kv_mib(t, &c, 1, PROBE_SHORT),
           k4 = probe_kv_mib(t, &c, 4, PROBE_SHORT), kl = probe_kv_mib(t, &c, 1, PROBE_LONG);
    double kv = kv_long ? ((ml - wl) - (m1 - w1)) * 1e3 / (kl - k1) : kv_prev;
    if (kv < 0) kv = 0;
    t->dec_kv_us_mib[n] = kv;
    /* signed (the warm tables may read the step's small GEMMs slower than
     * it runs them), but a probe a neighbour disturbed must not take more
     * than half the warm prediction off: a load-17 run (before quiet
     * measurements) once gave -3,222 us/MiB */
    t->dec_us_mib[n] = fmax(((m1 - w1) * 1e3 - k1 * kv) / wmib, -0.5 * w1 * 1e3 / wmib);
    t->dec_us_mib4[n] = fmax(((m4 - w4) * 1e3 - k4 * kv) / wmib, -0.5 * w4 * 1e3 / wmib);
    t->dec_ws[n] = ac_cost_decode_bytes(&c, &p, 1, PROBE_SHORT + PROBE_STEPS / 2.0);
    *wmib_out = wmib;
    *wbytes = ac_carch_params(&c) * p.w_bytes;
    ac_carch_free(&c);
    return 0;
}

/* The decode bands from the bands' raw timings (the grids final). */
static void calibrate(ac_cost_table *t, const band_raw *raw) {
    int n = 0, cache_done = 0, nkv = 0;
    double wmib[AC_CT_MAXG];
    t->ndec = t->dec_b4 = t->dec_kv = 0;
    t->cache_bytes = 0;
    for (int i = 0; i < NBANDS; i++) {
        int cold_closer, kv_long = HS[i] <= KV_PROBE_MAX_H;
        double wbytes;
        if (band_derive(t, HS[i], &raw[i], n, n ? t->dec_kv_us_mib[n - 1] : 0, &wbytes, &wmib[n], &cold_closer)) break;
        if (!cache_done && !cold_closer)
            t->cache_bytes = wbytes;
        else
            cache_done = 1;
        nkv += kv_long;
        n++;
    }
    ac_cost_bands_monotone(t->dec_kv_us_mib, NULL, nkv < n ? nkv : n, 0);
    for (int i = nkv; i < n; i++)
        t->dec_kv_us_mib[i] = fmax(nkv ? t->dec_kv_us_mib[nkv - 1] : 0, fmax(t->dec_us_mib[i], 0));
    ac_cost_bands_monotone(t->dec_us_mib, NULL, n, 1);
    /* batch 4: a per-step cost the warm M=4 tables miss makes its rate per
     * MiB high on the smallest probes (44 us/MiB at 3.5 MiB, 16-20 from 13
     * MiB), so the total excess (us), not the rate, is made non-decreasing:
     * pooling the rates lifted 13 MiB models ~20% and lowered 4-5 MiB ones */
    ac_cost_bands_monotone(t->dec_us_mib4, wmib, n, 1);
    ac_cost_bands_monotone(t->dec_kv_us_mib, NULL, n, 0);
    /* four rows stream the weights once; at worst like four one-row steps */
    for (int i = 0; i < n; i++)
        if (t->dec_us_mib[i] > 0) t->dec_us_mib4[i] = fmin(t->dec_us_mib4[i], 4 * t->dec_us_mib[i]);
    t->ndec = n >= 2 ? n : 0;
    t->dec_b4 = t->dec_kv = t->ndec > 0;
}

static const double GM[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024},
                    GNK[] = {16, 32, 64, 128, 256, 512, 1024, 2048};
static const double AQ[] = {1, 4, 16, 64, 256, 1024}, AS[] = {1, 16, 64, 256, 1024, 2048}, AHD[] = {16, 64, 128};
/* The expert grid: rows routed to one expert (a decode step gives each
 * reached expert B k / d of its B rows: 1-3 up to batch 16 at top-4 of 32;
 * a prompt tens), expert width, hidden width. 45 points, cold and warm:
 * about a second on 2 cores. */
static const double XR[] = {1, 2, 4, 16, EXPERT_MAX_ROWS}, XF[] = {32, 128, 512}, XH[] = {64, 256, 1024};

/* The table's identity and grids, its arrays allocated. */
static int table_init(ac_cost_table *t, int threads, const char *dtype, ac_err *e) {
    t->nm = 11;
    t->nn = t->nk = 8;
    t->naq = 6;
    t->nas = 6;
    t->nhd = 3;
    t->nre = 5;
    t->nfe = t->nhe = 3;
    memcpy(t->erows, XR, sizeof XR);
    memcpy(t->effn, XF, sizeof XF);
    memcpy(t->ehid, XH, sizeof XH);
    memcpy(t->gm, GM, sizeof GM);
    memcpy(t->gn, GNK, sizeof GNK);
    memcpy(t->gk, GNK, sizeof GNK);
    memcpy(t->aq, AQ, sizeof AQ);
    memcpy(t->as, AS, sizeof AS);
    memcpy(t->ahd, AHD, sizeof AHD);
    ac_cost_cpu_key(threads, dtype, t->key, sizeof t->key, t->device, sizeof t->device);
    snprintf(t->dtype, sizeof t->dtype, "%s", dtype);
    snprintf(t->engine, sizeof t->engine, "autocompress-cpu");
    snprintf(t->source, sizeof t->source, "measured");
    t->version = AC_CT_VERSION;
    ac_local_device d[1];
    ac_devices_local(d, 1);
    t->mem_gib = d[0].mem_gib;
    t->gemm_us = malloc(sizeof(double) * t->nm * t->nn * t->nk);
    t->gemm_warm_us = malloc(sizeof(double) * t->nm * t->nn * t->nk);
    t->attn_us = malloc(sizeof(double) * t->nhd * t->naq * t->nas);
    t->expert_us = malloc(sizeof(double) * t->nre * t->nfe * t->nhe);
    t->expert_warm_us = malloc(sizeof(double) * t->nre * t->nfe * t->nhe);
    return t->gemm_us && t->gemm_warm_us && t->attn_us && t->expert_us && t->expert_warm_us
               ? 0
               : ac_errf(e, "out of memory for cost measurement");
}

/* Scratch of the micro-benchmarks: activations a, c; the weight pool w;
 * attention scores sc. */
typedef struct {
    float *a, *w, *c, *sc;
    uint16_t *w16;  /* BF16 tables: the weight pool in BF16, else NULL */
    ac_wscratch ws; /* BF16 tables: ac_linear_w's scratch */
} bench_bufs;

/* One GEMM row of the grid (M = gm[im]), every point the minimum of what
 * it held and this run. */
static void measure_gemm_row(ac_cost_table *t, const bench_bufs *bb, int im) {
    for (int in = 0; in < t->nn; in++)
        for (int ik = 0; ik < t->nk; ik++) {
            gemm_arg g = {bb->a, bb->w, bb->c, (int)GM[im], (int)GNK[in], (int)GNK[ik], 0, 0, bb->w16,
                          (ac_wscratch *)&bb->ws};
            size_t at = ((size_t)im * t->nn + in) * t->nk + ik;
            /* as the engine's forward around BF16-kernel rows */
            int one = ac_blas_one_for_bf16(bb->w16 ? ST_BF16 : ST_F32, g.m);
            t->gemm_us[at] = fmin(t->gemm_us[at], time_us(run_gemm, &g));
            /* weights in cache: at every M, since reading them cold costs
             * 15-25 % of a 128-row GEMM over a 512 x 512 weight, which a
             * model inside the effective cache does not pay (the tiny
             * model's prefill was predicted 5-28 % slow with cold rows) */
            g.span = (size_t)GNK[in] * (size_t)GNK[ik];
            t->gemm_warm_us[at] = fmin(t->gemm_warm_us[at], time_us(run_gemm, &g));
            ac_blas_restore(one);
        }
}

/* One head dimension's attention grid, as measure_gemm_row. */
static void measure_attn(ac_cost_table *t, const bench_bufs *bb, int ih) {
    for (int iq = 0; iq < t->naq; iq++)
        for (int is = 0; is < t->nas; is++) {
            int n = (int)AQ[iq], s = n + (int)AS[is] - 1;
            attn_arg at = {bb->c, bb->a, bb->w, bb->w + (size_t)2048 * 128, bb->sc, n, s, (int)AHD[ih]};
            size_t k = ((size_t)ih * t->naq + iq) * t->nas + is;
            int one = ac_blas_one_for_bf16(bb->w16 ? ST_BF16 : ST_F32, n);
            t->attn_us[k] = fmin(t->attn_us[k], time_us(run_attn, &at));
            ac_blas_restore(one);
        }
}

/* One row of the expert grid (erows[ir] rows routed), as measure_gemm_row:
 * every point's minimum, cold and warm. Its activations in a and c, its
 * scratch in sc (bench_bufs). */
static void measure_expert_row(ac_cost_table *t, const bench_bufs *bb, int ir) {
    int m = (int)XR[ir], wdt = bb->w16 ? ST_BF16 : ST_F32;
    size_t big = 2 * EXPERT_MAX_ROWS * (size_t)XH[2]; /* floats of [2m][h] at most */
    expert_arg a = {.x = bb->c, .in = bb->a, .r = bb->sc, .pool = bb->w, .pool16 = bb->w16, .m = m};
    a.s = (ac_expert_scratch){bb->sc + 4 * EXPERT_MAX_ROWS, bb->sc + 4 * EXPERT_MAX_ROWS + big,
                              bb->sc + 4 * EXPERT_MAX_ROWS + 2 * big, a.rows, (ac_wscratch *)&bb->ws};
    for (int i = 0; i < 2 * m; i++) a.r[2 * i] = (i % 2 == 0) * 0.5f, a.r[2 * i + 1] = (i % 2 == 1) * 0.5f;
    for (int jf = 0; jf < t->nfe; jf++)
        for (int jh = 0; jh < t->nhe; jh++) {
            a.fe = (int)XF[jf], a.h = (int)XH[jh], a.span = 0;
            size_t at = ((size_t)ir * t->nfe + jf) * t->nhe + jh;
            int one = ac_blas_one_for_bf16(wdt, m);
            t->expert_us[at] = fmin(t->expert_us[at], time_us(run_expert, &a));
            a.span = 3 * (size_t)a.fe * a.h;
            t->expert_warm_us[at] = fmin(t->expert_warm_us[at], time_us(run_expert, &a));
            ac_blas_restore(one);
        }
}

/* ns per element of norm + rope + silu over a 256 x 1024 block. */
static double measure_elementwise(const bench_bufs *bb) {
    int pos[256];
    for (int i = 0; i < 256; i++) pos[i] = i;
    double t0 = clk();
    for (int r = 0; r < 20; r++) {
        ac_rmsnorm(bb->c, bb->a, bb->w, 256, 1024, 1e-5f);
        ac_rope(bb->c, 256, 16, 64, pos, bb->w, bb->w + 256 * 32);
        ac_silu_mul(bb->c, bb->a, 256 * 1024);
    }
    return (clk() - t0) / 20 / (3.0 * 256 * 1024) * 1e9;
}

/* The reference probe (quiet.h): a 128 x 256 x 256 GEMM with its weights
 * in cache, on the table's threads. Microseconds per call: the median of 3
 * batches of calls lasting >= 5 ms each. Not a minimum: a probe must see
 * what the units around it see, and a busy scheduler leaves short calls
 * whole (a 10-ms minimum-based probe read quiet while a loaded machine's
 * table came out 4x slow), while a 5-ms batch spans its time slices.
 *
 * Its size: the 2-core AMD VM switches, for tens of seconds at a time,
 * between two speeds of its two threads working together (one thread alone
 * runs the same in both). 150 s of probes side by side (2026-12-04): the
 * tiny model's 128-token prefill 3.5-3.9 ms against 4.5-5.3 ms; a 128 x
 * 128 x 128 GEMM 1.5-1.8x slower in the slow state, 128 x 256 x 256
 * 1.2-1.35x, 128 x 512 x 512 (this probe before) 1.15-1.24x. The last sat
 * at the 10 % tolerance, so a table measured in the slow state passed as
 * quiet and predicted the prefill 30 % slow (the demo, TTFT +15 %, probe
 * ratio 0.92). 128 x 256 x 256 follows the prefill most closely (its
 * excess over its quick level times 1.04 gave the prefill's) and leaves
 * the slow state well outside the tolerance. */
double ac_cost_ref_probe_us(void) {
    enum { M = 128, N = 256, K = 256 };
    float *a = malloc(sizeof(float) * M * K), *w = malloc(sizeof(float) * N * K), *c = malloc(sizeof(float) * M * N);
    double us = 0;
    if (a && w && c) {
        for (size_t i = 0; i < (size_t)M * K; i++) a[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
        for (size_t i = 0; i < (size_t)N * K; i++) w[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
        gemm_arg g = {a, w, c, M, N, K, 0, (size_t)N * K, NULL, NULL};
        int reps = calls_per_batch(run_gemm, &g, 5e-3, NULL);
        double b[3];
        for (int k = 0; k < 3; k++) {
            double t0 = clk();
            for (int r = 0; r < reps; r++) run_gemm(&g);
            b[k] = (clk() - t0) / reps * 1e6;
        }
        us = fmax(fmin(b[0], b[1]), fmin(fmax(b[0], b[1]), b[2])); /* the median */
    }
    free(a);
    free(w);
    free(c);
    return us;
}

double ac_cost_ref_probe_cb(void *ud) {
    (void)ud;
    return ac_cost_ref_probe_us();
}

/* The measurement as units for quiet.h: the GEMM rows, the attention head
 * dimensions, the expert rows, the elementwise pass, the decode probes. */
typedef struct {
    ac_cost_table *t;
    const bench_bufs *bb;
    band_raw raw[NBANDS];
    void (*progress)(void *, double);
    void *ud;
    int done, total;
} measure_ctx;

static int measure_unit(void *p, int u) {
    measure_ctx *x = p;
    ac_cost_table *t = x->t;
    int attn = u - t->nm, ex = attn - t->nhd, band = ex - t->nre - 1;
    if (u < t->nm)
        measure_gemm_row(t, x->bb, u);
    else if (attn < t->nhd)
        measure_attn(t, x->bb, attn);
    else if (ex < t->nre)
        measure_expert_row(t, x->bb, ex);
    else if (band < 0)
        t->elem_ns = fmin(t->elem_ns, measure_elementwise(x->bb));
    else
        band_measure(HS[band], x->bb->w16 != NULL, &x->raw[band]);
    /* progress counts the first pass; re-measurement stays below 1 */
    if (x->progress && x->done < x->total) x->progress(x->ud, 0.99 * ++x->done / x->total);
    return 0;
}

int ac_cost_measure_cpu(int threads, const char *dtype, void (*progress)(void *, double), void *ud, ac_cost_table *t,
                        ac_err *e) {
    memset(t, 0, sizeof *t);
    if (!ac_cost_cpu_dtype_ok(dtype))
        return ac_errf(e, "the CPU engine's cost tables are fp32 or bf16, not %s", dtype ? dtype : "(none)");
    int bf16 = !strcmp(dtype, "bf16");
    ac_set_threads(threads);
    double t_start = ac_now();
    size_t maxe = 1024 * 2048;
    bench_bufs bb = {malloc(maxe * 4), malloc((size_t)POOL_FLOATS * 4), malloc(maxe * 4),
                     malloc((size_t)1024 * 3072 * 4), bf16 ? malloc((size_t)POOL_FLOATS * 4) : NULL, {0}};
    int rc = table_init(t, threads, dtype, e);
    if (!rc && (!bb.a || !bb.w || !bb.c || !bb.sc || (bf16 && (!bb.w16 || ac_wscratch_alloc(&bb.ws, 1024, 2048)))))
        rc = ac_errf(e, "out of memory for cost measurement");
    if (!rc) {
        for (size_t i = 0; i < maxe; i++) bb.a[i] = bb.c[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
        for (size_t i = 0; i < POOL_FLOATS; i++) bb.w[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
        for (size_t i = 0; bb.w16 && i < 2 * (size_t)POOL_FLOATS; i++)
            bb.w16[i] = ac_f32_to_bf16((float)((i * 104729) % 1000) * 1e-3f - 0.5f);
        int ng = t->nm * t->nn * t->nk, na = t->nhd * t->naq * t->nas, nx = t->nre * t->nfe * t->nhe;
        for (int i = 0; i < ng; i++) t->gemm_us[i] = t->gemm_warm_us[i] = INFINITY;
        for (int i = 0; i < na; i++) t->attn_us[i] = INFINITY;
        for (int i = 0; i < nx; i++) t->expert_us[i] = t->expert_warm_us[i] = INFINITY;
        t->elem_ns = INFINITY;
        measure_ctx x = {
            .t = t, .bb = &bb, .progress = progress, .ud = ud, .total = t->nm + t->nhd + t->nre + 1 + NBANDS};
        for (int i = 0; i < NBANDS; i++) x.raw[i] = (band_raw){INFINITY, INFINITY, INFINITY};
        /* the first pass takes ~16 s on 2 cores; disturbed units may take
         * as long again, in up to 3 rounds */
        ac_quiet q = {measure_unit, ac_cost_ref_probe_cb, &x, x.total, AC_QUIET_TOL, 0, 3, 20};
        ac_quiet_result qr;
        ac_quiet_run(&q, &qr);
        t->ref_us = qr.quiet_us;
        t->quiet_remeasured = qr.remeasured;
        t->quiet_disturbed = qr.disturbed;
        calibrate(t, x.raw);
    }
    free(bb.a);
    free(bb.w);
    free(bb.c);
    free(bb.sc);
    free(bb.w16);
    ac_wscratch_free(&bb.ws);
    if (rc) {
        ac_cost_table_free(t);
        return -1;
    }
    if (progress) progress(ud, 1.0);
    t->measure_s = ac_now() - t_start;
    return 0;
}

/* The CUDA plugin's raw timings into a measured table (the plugin ABI
 * carries no ac_cost_table; see cuda_plugin.h). */
int ac_cost_table_from_timings(const acc_timings *tm, ac_cost_table *t, ac_err *e) {
    memset(t, 0, sizeof *t);
    int ng = tm->nm * tm->nn * tm->nk, na = tm->nhd * tm->naq * tm->nas;
    if (tm->nm < 2 || tm->nn < 2 || tm->nk < 2 || tm->nhd < 1 || tm->naq < 2 || tm->nas < 2 || tm->nm > ACC_TM_MAXG ||
        tm->nn > ACC_TM_MAXG || tm->nk > ACC_TM_MAXG || tm->nhd > ACC_TM_MAXG || tm->naq > ACC_TM_MAXG ||
        tm->nas > ACC_TM_MAXG)
        return ac_errf(e, "CUDA timings: grid %dx%dx%d / %dx%dx%d outside 2..%d", tm->nm, tm->nn, tm->nk, tm->nhd,
                       tm->naq, tm->nas, ACC_TM_MAXG);
    for (int i = 0; i < ng + na; i++) {
        double v = i < ng ? tm->gemm_us[i] : tm->attn_us[i - ng];
        if (!(v > 0) || !isfinite(v)) return ac_errf(e, "CUDA timings: point %d is %g us", i, v);
    }
    char name[sizeof tm->name + 1];
    memcpy(name, tm->name, sizeof tm->name);
    name[sizeof tm->name] = 0;
    snprintf(t->device, sizeof t->device, "%s (sm_%d, %d SMs)", name, tm->cc, tm->sms);
    snprintf(t->dtype, sizeof t->dtype, "bf16");
    snprintf(t->engine, sizeof t->engine, "cublas");
    snprintf(t->source, sizeof t->source, "measured");
    t->version = AC_CT_VERSION;
    ac_cost_cuda_key(name, tm->cc, t->key, sizeof t->key);
    t->mem_gib = tm->mem_gib;
    t->launch_us = tm->launch_us;
    t->elem_ns = tm->elem_ns;
    t->nm = tm->nm, t->nn = tm->nn, t->nk = tm->nk, t->nhd = tm->nhd, t->naq = tm->naq, t->nas = tm->nas;
    memcpy(t->gm, tm->gm, sizeof(double) * tm->nm);
    memcpy(t->gn, tm->gn, sizeof(double) * tm->nn);
    memcpy(t->gk, tm->gk, sizeof(double) * tm->nk);
    memcpy(t->ahd, tm->ahd, sizeof(double) * tm->nhd);
    memcpy(t->aq, tm->aq, sizeof(double) * tm->naq);
    memcpy(t->as, tm->as, sizeof(double) * tm->nas);
    t->gemm_us = malloc(sizeof(double) * ng);
    t->attn_us = malloc(sizeof(double) * na);
    if (!t->gemm_us || !t->attn_us) {
        ac_cost_table_free(t);
        return ac_errf(e, "out of memory");
    }
    memcpy(t->gemm_us, tm->gemm_us, sizeof(double) * ng);
    memcpy(t->attn_us, tm->attn_us, sizeof(double) * na);
    return 0;
}
