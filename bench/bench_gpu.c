/*
 * bench_gpu - the GPU figures to record when a GPU is at hand, in one run:
 * GEMM TFLOP/s and GB/s at decode and prefill shapes against the device's
 * datasheet peak, forward tokens/s of the CUDA engine, and the cost model's
 * prediction error on that GPU (measured table vs measured engine latency).
 * Prints "no GPU" and exits 0 where the plugin or a device is missing.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "costcache.h"
#include "cost/costmodel.h"
#include "runtime/cuda_plugin.h"
#include "cost/device.h"
#include "runtime/rope.h"

static void fill(float *p, size_t n, unsigned *s) {
    for (size_t i = 0; i < n; i++) {
        *s = *s * 1664525u + 1013904223u;
        p[i] = ((*s >> 9) / 4194304.0f - 1.0f) * 0.02f;
    }
}

static int mk_model(ac_model *m, int H, int L, int heads, int kv, int F, int V) {
    ac_arch a = {0};
    snprintf(a.model_type, sizeof a.model_type, "llama");
    a.vocab = V;
    a.hidden = H;
    a.head_dim = 128;
    a.n_layers = L;
    a.max_pos = 8192;
    a.eps = 1e-5f;
    a.rope_theta = 10000;
    a.bos_id = a.eos_id = -1;
    a.layers = calloc(L, sizeof *a.layers);
    for (int l = 0; l < L; l++) a.layers[l] = (ac_layer_arch){heads, kv, F, 0, 0, 0};
    if (L > 3) a.layers[1] = (ac_layer_arch){heads / 2, kv / 2, F / 2, 0, 0, 0}; /* one heterogeneous layer */
    ac_err e;
    int rc = ac_model_alloc(m, &a, &e);
    free(a.layers);
    if (rc) return -1;
    unsigned s = 3;
    fill(m->embed, (size_t)V * H, &s);
    fill(m->lm_head, (size_t)V * H, &s);
    for (int i = 0; i < H; i++) m->final_norm[i] = 1;
    for (int l = 0; l < L; l++) {
        ac_layer_arch *la = &m->a.layers[l];
        ac_layer_w *w = &m->L[l];
        size_t Q = (size_t)la->n_heads * 128, KV = (size_t)la->n_kv_heads * 128;
        for (int i = 0; i < H; i++) w->in_norm[i] = w->post_norm[i] = 1;
        fill(w->wq, Q * H, &s);
        fill(w->wk, KV * H, &s);
        fill(w->wv, KV * H, &s);
        fill(w->wo, Q * H, &s);
        fill(w->wg, (size_t)la->ffn * H, &s);
        fill(w->wu, (size_t)la->ffn * H, &s);
        fill(w->wd, (size_t)la->ffn * H, &s);
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *db = argc > 1 ? argv[1] : NULL;
    const char *why;
    const ac_cuda_api *cu = ac_cuda(&why);
    if (!cu) {
        printf("no GPU: %s\n", why);
        return 0;
    }
    char name[128], err[512];
    double mem;
    int sms, cc;
    cu->device_info(0, name, sizeof name, &mem, &sms, &cc);
    const ac_device_spec *spec = ac_device_spec_for_gpu(name);
    if (!spec) spec = ac_device_spec_find("H100"); /* unknown GPU: compare against an H100 */
    printf("device: %s, sm_%d, %d SMs, %.0f GiB; datasheet %s: %.0f TFLOP/s BF16, %.0f GB/s\n", name, cc, sms, mem,
           spec->name, spec->bf16_tflops, spec->bw_gbs);
    printf("%6s %6s %6s %10s %9s %8s %9s %8s\n", "M", "N", "K", "us", "TFLOP/s", "% peak", "GB/s", "% peak");
    int shapes[][3] = {{1, 8192, 8192},    {16, 8192, 8192},   {128, 8192, 8192}, {1024, 8192, 8192},
                       {4096, 8192, 8192}, {8192, 8192, 8192}, {1, 28672, 8192},  {4096, 28672, 8192}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        double us;
        int m = shapes[i][0], n = shapes[i][1], k = shapes[i][2];
        if (cu->time_gemm(0, m, n, k, &us, err, sizeof err)) {
            printf("gemm: %s\n", err);
            return 1;
        }
        double tf = 2.0 * m * n * k / (us * 1e-6) / 1e12,
               gb = 2.0 * ((double)n * k + (double)m * k + 2.0 * m * n) / (us * 1e-6) / 1e9;
        printf("%6d %6d %6d %10.1f %9.1f %7.1f%% %9.0f %7.1f%%\n", m, n, k, us, tf, 100 * tf / spec->bf16_tflops, gb,
               100 * gb / spec->bw_gbs);
    }
    /* the cost table (cached when a database is given) */
    ac_cost_table t;
    int hit = 0;
    ac_err e;
    double t0 = ac_now();
    ac_cost_cache cache;
    ac_target tg;
    costcache_file(&cache, db, 1);
    ac_target_resolve("cuda:0", &tg, &e);
    if (ac_cost_table_for(&tg, "bf16", &cache, 2, 1, NULL, NULL, &t, &hit, &e)) {
        printf("cost table: %s\n", e.msg);
        return 1;
    }
    if (!hit && db) cache.put(cache.ud, &t, &e);
    printf("cost table %s: %s in %.1f s\n", t.key, hit ? "cached" : "measured", ac_now() - t0);
    /* engine speed and prediction error, 1B-ish and 3B-ish shapes */
    struct {
        int H, L, heads, kv, F, V;
    } ms[] = {{2048, 16, 16, 8, 8192, 32000}, {3072, 12, 24, 8, 8192, 32000}};
    int work[][3] = {{1, 1024, 64}, {8, 512, 64}, {32, 256, 32}};
    double errs[32];
    int ne = 0;
    printf("%-10s %-14s %10s %10s %7s %10s %10s %7s %12s\n", "model", "workload", "ttft_meas", "ttft_pred", "err",
           "tpot_meas", "tpot_pred", "err", "prefill tok/s");
    for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++) {
        ac_model m;
        if (mk_model(&m, ms[mi].H, ms[mi].L, ms[mi].heads, ms[mi].kv, ms[mi].F, ms[mi].V)) return 1;
        acc_engine *g;
        static float rcos[1100 * 256], rsin[1100 * 256]; /* head_dim <= 512 */
        if (m.a.head_dim > 512 || ac_rope_tables(&m.a, 1100, rcos, rsin, &e)) {
            printf("rope tables\n");
            return 1;
        }
        if (cu->engine_create(0, &m, 32, 1100, rcos, rsin, &g, err, sizeof err)) {
            printf("engine: %s\n", err);
            return 1;
        }
        ac_carch ca;
        ac_carch_from_arch(&m.a, &ca, &e);
        for (size_t w = 0; w < sizeof work / sizeof *work; w++) {
            int B = work[w][0], P = work[w][1], G = work[w][2];
            int *tok = malloc(sizeof(int) * B * P), nxt[64];
            for (int i = 0; i < B * P; i++) tok[i] = (i * 13) % m.a.vocab;
            float *lg = malloc(sizeof(float) * (size_t)B * m.a.vocab);
            cu->engine_forward(g, tok, B, P, 0, 1, lg, err, sizeof err); /* warm-up */
            double a = ac_now();
            cu->engine_forward(g, tok, B, P, 0, 1, lg, err, sizeof err);
            double ttft = (ac_now() - a) * 1e3;
            a = ac_now();
            for (int s = 1; s < G; s++) {
                for (int b = 0; b < B; b++) nxt[b] = (s + b) % m.a.vocab;
                cu->engine_forward(g, nxt, B, 1, P + s - 1, 1, lg, err, sizeof err);
            }
            double tpot = (ac_now() - a) * 1e3 / (G - 1);
            ac_engine_profile p;
            ac_engine_profile_default(&p, 0);
            p.overhead_ms = 0;
            ac_workload wl = {.batch = B, .prompt_len = P, .gen_len = G};
            ac_cost k;
            ac_cost_predict(&t, &ca, &wl, &p, 0, &k);
            errs[ne++] = fabs(k.ttft_ms / ttft - 1);
            errs[ne++] = fabs(k.tpot_ms / tpot - 1);
            char wn[32];
            snprintf(wn, sizeof wn, "b%d p%d g%d", B, P, G);
            printf("%-10s %-14s %10.3f %10.3f %+6.1f%% %10.4f %10.4f %+6.1f%% %12.0f\n", mi ? "3B-shape" : "1B-shape",
                   wn, ttft, k.ttft_ms, 100 * (k.ttft_ms / ttft - 1), tpot, k.tpot_ms, 100 * (k.tpot_ms / tpot - 1),
                   B * P / (ttft / 1e3));
            free(tok);
            free(lg);
        }
        ac_carch_free(&ca);
        cu->engine_free(g);
        ac_model_free(&m);
    }
    for (int i = 0; i < ne; i++)
        for (int j = i + 1; j < ne; j++)
            if (errs[j] < errs[i]) {
                double x = errs[i];
                errs[i] = errs[j];
                errs[j] = x;
            }
    printf("GPU cost model |error|: median %.1f%%, worst %.1f%% over %d predictions\n", 100 * errs[ne / 2],
           100 * errs[ne - 1], ne);
    ac_cost_table_free(&t);
    return 0;
}
