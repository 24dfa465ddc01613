/* costmodel.c - see costmodel.h. */
#include "costmodel.h"

#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_plugin.h"
#include "engine.h"
#include "kernels_cpu.h"

void ac_cost_table_free(ac_cost_table *t) {
    free(t->gemm_us);
    free(t->gemm_warm_us);
    free(t->attn_us);
    t->gemm_us = t->gemm_warm_us = t->attn_us = NULL;
}

/* ---------------------------------------------------------------- lookup */

/* Position of x on a log grid: cell index and fraction; *scale handles
 * points outside the grid (linear in x beyond either end). */
static void locate(const double *g, int n, double x, int *i, double *u, double *scale) {
    *scale = 1;
    if (n == 1) { *i = 0; *u = 0; *scale = x / g[0]; return; }
    if (x <= g[0]) { *i = 0; *u = 0; *scale = x / g[0]; return; }
    if (x >= g[n - 1]) { *i = n - 2; *u = 1; *scale = x / g[n - 1]; return; }
    int k = 0;
    while (k < n - 2 && x > g[k + 1]) k++;
    *i = k;
    *u = (log(x) - log(g[k])) / (log(g[k + 1]) - log(g[k]));
}

static double lerp(double a, double b, double u) { return a + (b - a) * u; }

static double gemm_lookup(const ac_cost_table *t, double m, double n, double k, int warm);

double ac_cost_gemm_us(const ac_cost_table *t, double m, double n, double k) { return gemm_lookup(t, m, n, k, 0); }

static double gemm_lookup(const ac_cost_table *t, double m, double n, double k, int warm) {
    if (m <= 0 || n <= 0 || k <= 0) return 0;
    if (t->roofline) {
        double w = 2; /* bytes per element of weights and activations */
        if (!strcmp(t->dtype, "fp32")) w = 4;
        else if (!strcmp(t->dtype, "fp8")) w = 1;
        double flops = 2 * m * n * k, bytes = w * (m * k + n * k) + 2 * m * n;
        double tc = flops / (t->eta_c * t->peak_tflops * 1e12), tm = bytes / (t->eta_m * t->bw_gbs * 1e9);
        return (tc > tm ? tc : tm) * 1e6 + t->launch_us;
    }
    int im, in, ik;
    double um, un, uk, sm, sn, sk;
    locate(t->gm, t->nm, m, &im, &um, &sm);
    locate(t->gn, t->nn, n, &in, &un, &sn);
    locate(t->gk, t->nk, k, &ik, &uk, &sk);
    const double *grid = warm && t->gemm_warm_us ? t->gemm_warm_us : t->gemm_us;
#define G(a, b, c) log(grid[((size_t)(a) * t->nn + (b)) * t->nk + (c)])
    double c00 = lerp(G(im, in, ik), G(im, in, ik + 1), uk), c01 = lerp(G(im, in + 1, ik), G(im, in + 1, ik + 1), uk);
    double c10 = lerp(G(im + 1, in, ik), G(im + 1, in, ik + 1), uk), c11 = lerp(G(im + 1, in + 1, ik), G(im + 1, in + 1, ik + 1), uk);
#undef G
    double v = exp(lerp(lerp(c00, c01, un), lerp(c10, c11, un), um));
    return v * sm * sn * sk;
}

double ac_cost_attn_us(const ac_cost_table *t, double heads, double kv_heads, double batch, double nq, double s, int head_dim) {
    if (heads <= 0 || batch <= 0 || nq <= 0) return 0;
    if (s < nq) s = nq;
    if (t->roofline) {
        double kvb = !strcmp(t->dtype, "fp32") ? 4 : !strcmp(t->dtype, "fp8") ? 1 : 2;
        double flops = batch * heads * 4.0 * head_dim * (nq * s - nq * (nq - 1) / 2);
        double bytes = batch * (kv_heads * 2 * s * head_dim * kvb + 2 * heads * nq * head_dim * 2);
        double tc = flops / (t->eta_c * t->peak_tflops * 1e12), tm = bytes / (t->eta_m * t->bw_gbs * 1e9);
        return (tc > tm ? tc : tm) * 1e6 + t->launch_us;
    }
    int iq, is, ih;
    double uq, us, sq, ss, uh, sh;
    locate(t->aq, t->naq, nq, &iq, &uq, &sq);
    locate(t->as, t->nas, s - nq + 1, &is, &us, &ss);
    /* head_dim: linear (not log) between measured head dims; softmax work
     * does not shrink with head_dim, so scaling by hd alone is wrong */
    if (t->nhd == 1) { ih = 0; uh = 0; sh = (double)head_dim / t->ahd[0]; }
    else {
        ih = 0;
        while (ih < t->nhd - 2 && head_dim > t->ahd[ih + 1]) ih++;
        uh = (head_dim - t->ahd[ih]) / (t->ahd[ih + 1] - t->ahd[ih]);
        sh = 1;
        if (uh < 0) { sh = (double)head_dim / t->ahd[0]; uh = 0; }
    }
#define A(h, a, b) log(t->attn_us[((size_t)(h) * t->naq + (a)) * t->nas + (b)])
#define AT(h) exp(lerp(lerp(A(h, iq, is), A(h, iq, is + 1), us), lerp(A(h, iq + 1, is), A(h, iq + 1, is + 1), us), uq))
    double v = t->nhd == 1 ? AT(0) : AT(ih) + (AT(ih + 1) - AT(ih)) * uh;
#undef AT
#undef A
    v *= sh;
    if (sq > 1) v *= sq; /* more queries than the grid: linear */
    if (ss > 1) v *= ss;
    if (sq < 1) v *= sq;
    return v * heads * batch;
}

static double elem_us(const ac_cost_table *t, double elements, int act_bytes) {
    if (t->roofline) return elements * 2 * act_bytes / (t->eta_m * t->bw_gbs * 1e9) * 1e6;
    return elements * t->elem_ns * 1e-3;
}

/* ---------------------------------------------------------------- arch */

int ac_carch_from_arch(const ac_arch *a, ac_carch *c, ac_err *e) {
    memset(c, 0, sizeof *c);
    c->n_layers = a->n_layers;
    c->head_dim = a->head_dim;
    c->vocab = a->vocab;
    c->tie = a->tie_embeddings;
    c->hidden = a->hidden;
    c->heads = calloc(a->n_layers, sizeof(double));
    c->kv = calloc(a->n_layers, sizeof(double));
    c->ffn = calloc(a->n_layers, sizeof(double));
    if (!c->heads || !c->kv || !c->ffn) { ac_carch_free(c); return ac_errf(e, "out of memory"); }
    for (int l = 0; l < a->n_layers; l++) {
        c->heads[l] = a->layers[l].n_heads;
        c->kv[l] = a->layers[l].n_kv_heads;
        c->ffn[l] = a->layers[l].ffn;
    }
    return 0;
}

void ac_carch_free(ac_carch *c) {
    free(c->heads);
    free(c->kv);
    free(c->ffn);
    c->heads = c->kv = c->ffn = NULL;
}

double ac_carch_params(const ac_carch *c) {
    double H = c->hidden, hd = c->head_dim, p = (double)c->vocab * H * (c->tie ? 1 : 2) + H;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->heads[l] > 0) p += H + 2 * H * c->heads[l] * hd + 2 * H * c->kv[l] * hd;
        if (c->ffn[l] > 0) p += H + 3 * H * c->ffn[l];
    }
    return p;
}

/* ---------------------------------------------------------------- engine profile, workload */

void ac_engine_profile_default(ac_engine_profile *p, int is_cpu) {
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", is_cpu ? "autocompress-cpu" : "vllm");
    p->w_bytes = is_cpu ? 4 : 2;
    p->kv_bytes = is_cpu ? 4 : 2;
    p->act_bytes = is_cpu ? 4 : 2;
    p->block_size = is_cpu ? 1 : 16;
    p->mem_util = is_cpu ? 0.8 : 0.9;
    p->overhead_ms = is_cpu ? 0.0 : 0.3;
    p->overhead_gib = is_cpu ? 0.0 : 1.5;
}

static int dtype_bytes(const char *s) {
    return !strcmp(s, "fp32") ? 4 : !strcmp(s, "fp8") ? 1 : 2;
}

int ac_engine_profile_from_json(const json_t *j, ac_engine_profile *p, ac_err *e) {
    if (!j) return 0;
    if (!json_is_object(j)) return ac_errf(e, "engine must be an object");
    json_t *v;
    if ((v = json_object_get(j, "name")) && json_is_string(v)) snprintf(p->name, sizeof p->name, "%s", json_string_value(v));
    if ((v = json_object_get(j, "weights_dtype")) && json_is_string(v)) p->w_bytes = dtype_bytes(json_string_value(v)), p->act_bytes = p->w_bytes < 2 ? 2 : p->w_bytes;
    if ((v = json_object_get(j, "kv_dtype")) && json_is_string(v)) p->kv_bytes = dtype_bytes(json_string_value(v));
    if ((v = json_object_get(j, "block_size")) && json_is_integer(v)) p->block_size = (int)json_integer_value(v);
    if ((v = json_object_get(j, "gpu_memory_utilization")) && json_is_number(v)) p->mem_util = json_number_value(v);
    if ((v = json_object_get(j, "overhead_ms")) && json_is_number(v)) p->overhead_ms = json_number_value(v);
    if ((v = json_object_get(j, "overhead_gib")) && json_is_number(v)) p->overhead_gib = json_number_value(v);
    if (p->block_size < 1 || p->mem_util <= 0 || p->mem_util > 1) return ac_errf(e, "engine: block_size >= 1 and gpu_memory_utilization in (0,1]");
    return 0;
}

int ac_workload_from_json(const json_t *j, ac_workload *w, ac_err *e) {
    w->batch = 1;
    w->prompt_len = 512;
    w->gen_len = 128;
    if (!j) return 0;
    if (!json_is_object(j)) return ac_errf(e, "workload must be an object");
    json_t *v;
    if ((v = json_object_get(j, "batch"))) w->batch = (int)json_integer_value(v);
    if ((v = json_object_get(j, "prompt_len"))) w->prompt_len = (int)json_integer_value(v);
    if ((v = json_object_get(j, "gen_len"))) w->gen_len = (int)json_integer_value(v);
    if (w->batch < 1 || w->prompt_len < 1 || w->gen_len < 1) return ac_errf(e, "workload: batch, prompt_len and gen_len must be >= 1");
    return 0;
}

/* ---------------------------------------------------------------- prediction */

/* One forward call of B sequences, nq new tokens each at position pos0. */
static double forward_us(const ac_cost_table *t, const ac_carch *c, const ac_engine_profile *p, double B, double nq, double pos0,
                         int last_only, int warm) {
    double M = B * nq, S = pos0 + nq, H = c->hidden, hd = c->head_dim, us = 0;
    int launches = 2;
    for (int l = 0; l < c->n_layers; l++) {
        double h = c->heads[l], kv = c->kv[l], F = c->ffn[l];
        if (h > 0) {
            us += gemm_lookup(t, M, h * hd, H, warm) + 2 * gemm_lookup(t, M, kv * hd, H, warm) + gemm_lookup(t, M, H, h * hd, warm);
            us += ac_cost_attn_us(t, h, kv, B, nq, S, c->head_dim);
            us += elem_us(t, M * (H + (h + kv) * hd), p->act_bytes);
            launches += 3;
        }
        if (F > 0) {
            us += 2 * gemm_lookup(t, M, F, H, warm) + gemm_lookup(t, M, H, F, warm);
            us += elem_us(t, M * (H + 2 * F), p->act_bytes);
            launches += 2;
        }
    }
    us += gemm_lookup(t, last_only ? B : M, c->vocab, H, warm) + elem_us(t, M * H, p->act_bytes);
    us += launches * t->launch_us; /* 0 for CPU tables */
    return us + p->overhead_ms * 1e3;
}

void ac_cost_predict(const ac_cost_table *t, const ac_carch *c, const ac_workload *w, const ac_engine_profile *p, int smooth,
                     ac_cost *o) {
    memset(o, 0, sizeof *o);
    double B = w->batch, P = w->prompt_len, G = w->gen_len;
    /* The share of the weights that fits in the table's effective cache is
     * read warm: blend the warm and cold GEMM tables by it. */
    double wbytes = ac_carch_params(c) * p->w_bytes, fw = t->cache_bytes > 0 && wbytes > 0 ? fmin(1, t->cache_bytes / wbytes) : 0;
#define FWD(B_, n_, pos_) (fw * forward_us(t, c, p, B_, n_, pos_, 1, 1) + (1 - fw) * forward_us(t, c, p, B_, n_, pos_, 1, 0))
    o->ttft_ms = FWD(B, P, 0) / 1e3;
    /* Decode steps at context P..P+G-1: the cost is close to linear in the
     * context, so Simpson's rule over three points is near exact. */
    double d0 = FWD(B, 1, P), d1 = FWD(B, 1, P + (G - 1) / 2), d2 = FWD(B, 1, P + G - 1);
#undef FWD
    o->tpot_ms = G > 1 ? (d0 + 4 * d1 + d2) / 6 / 1e3 : 0;
    o->e2e_ms = o->ttft_ms + (G - 1) * o->tpot_ms;
    o->tok_per_s = B * G / (o->e2e_ms / 1e3);
    o->params = ac_carch_params(c);
    double gib = 1073741824.0, kv_tok = 0, widest = 0;
    for (int l = 0; l < c->n_layers; l++) {
        kv_tok += 2 * c->kv[l] * c->head_dim * p->kv_bytes;
        double a = (c->heads[l] + 2 * c->kv[l]) * c->head_dim, f = 2 * c->ffn[l];
        if (a > widest) widest = a;
        if (f > widest) widest = f;
    }
    double seq_tokens = P + G;
    if (!smooth && p->block_size > 1) seq_tokens = ceil(seq_tokens / p->block_size) * p->block_size;
    double act_seq = P * (c->hidden + widest) * p->act_bytes + (double)c->vocab * 4;
    o->weights_gib = o->params * p->w_bytes / gib;
    o->kv_gib = B * seq_tokens * kv_tok / gib;
    o->act_gib = B * act_seq / gib;
    o->mem_gib = o->weights_gib + o->kv_gib + o->act_gib + p->overhead_gib;
    o->device_mem_gib = t->mem_gib;
    double avail = t->mem_gib * p->mem_util - o->weights_gib - p->overhead_gib, per_seq = (seq_tokens * kv_tok + act_seq) / gib;
    o->max_batch = avail > 0 && per_seq > 0 ? (int)fmin(floor(avail / per_seq), 1e9) : 0;
}

double ac_cost_metric(const ac_cost *c, ac_metric m) {
    switch (m) {
    case AC_M_TTFT: return c->ttft_ms;
    case AC_M_TPOT: return c->tpot_ms;
    case AC_M_TPS: return c->tok_per_s;
    case AC_M_MEM: return c->mem_gib;
    case AC_M_PARAMS: return c->params;
    default: return 0;
    }
}

void ac_cost_grad(const ac_cost_table *t, const ac_carch *c, const ac_workload *w, const ac_engine_profile *p, ac_metric m,
                  double *gh, double *gkv, double *gf, double *ghid) {
    ac_cost a, b;
    ac_carch x = *c;
    double *vars[3] = {c->heads, c->kv, c->ffn}, *outs[3] = {gh, gkv, gf};
    for (int v = 0; v < 3; v++) {
        if (!outs[v]) continue;
        for (int l = 0; l < c->n_layers; l++) {
            double orig = vars[v][l], step = v == 2 ? 2.0 : 0.25;
            double lo = orig - step < 0 ? 0 : orig - step, hi = orig + step;
            vars[v][l] = hi;
            ac_cost_predict(t, &x, w, p, 1, &a);
            vars[v][l] = lo;
            ac_cost_predict(t, &x, w, p, 1, &b);
            vars[v][l] = orig;
            outs[v][l] = (ac_cost_metric(&a, m) - ac_cost_metric(&b, m)) / (hi - lo);
        }
    }
    if (ghid) {
        double orig = c->hidden;
        x.hidden = orig + 4;
        ac_cost_predict(t, &x, w, p, 1, &a);
        x.hidden = orig - 4;
        ac_cost_predict(t, &x, w, p, 1, &b);
        *ghid = (ac_cost_metric(&a, m) - ac_cost_metric(&b, m)) / 8;
    }
}

json_t *ac_cost_to_json(const ac_cost *c) {
    return json_pack("{s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:i,s:f}", "ttft_ms", c->ttft_ms, "tpot_ms", c->tpot_ms, "tokens_per_s",
                     c->tok_per_s, "e2e_ms", c->e2e_ms, "memory_gib", c->mem_gib, "weights_gib", c->weights_gib, "kv_cache_gib",
                     c->kv_gib, "activations_gib", c->act_gib, "params", c->params, "max_batch", c->max_batch, "device_memory_gib",
                     c->device_mem_gib);
}

/* ---------------------------------------------------------------- measurement */

/* Weights rotate through a pool larger than the last-level cache, so each
 * call reads them from memory as a forward pass over many layers does
 * (COSTMODEL.md: measure cold weights). */
#define POOL_FLOATS (24u << 20) /* 96 MiB */
typedef struct { float *a, *pool, *c; int m, n, k; size_t off, span; } gemm_arg;
static void run_gemm(void *p) {
    gemm_arg *g = p;
    size_t nw = (size_t)g->n * g->k, span = g->span ? g->span : POOL_FLOATS;
    if (g->off + nw > span) g->off = 0;
    ac_linear(g->c, g->a, g->pool + g->off, NULL, g->m, g->k, g->n);
    g->off += (nw + 1023) & ~(size_t)1023;
}

typedef struct { float *out, *q, *k, *v, *sc; int n, s, hd; } attn_arg;
static void run_attn(void *p) {
    attn_arg *a = p;
    ac_attention_head(a->out, a->q, a->k, a->v, a->n, a->s - a->n, a->hd, a->hd, a->hd, 0, a->sc);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Per-call microseconds: warm up, then 7 batches of >= 1 ms each; the
 * fastest batch. On a shared machine the minimum is the stable estimate of
 * what the hardware costs (neighbours only ever add time). */
static double time_us(void (*fn)(void *), void *arg) {
    fn(arg);
    double t0 = ac_now();
    fn(arg);
    double one = ac_now() - t0;
    int reps = one > 1e-3 ? 1 : (int)(1e-3 / (one > 1e-7 ? one : 1e-7)) + 1;
    double best = 1e30;
    for (int b = 0; b < 7; b++) {
        t0 = ac_now();
        for (int r = 0; r < reps; r++) fn(arg);
        double us = (ac_now() - t0) / reps * 1e6;
        if (us < best) best = us;
    }
    return best;
}

void ac_cost_cpu_key(int threads, char *key, size_t n, char *device, size_t dn) {
    ac_local_device d[1];
    ac_devices_local(d, 1);
    char dev[200];
    snprintf(dev, sizeof dev, "%s (%d threads)", d[0].name, threads);
    if (device) snprintf(device, dn, "%s", dev);
    snprintf(key, n, "%s|fp32|autocompress-cpu|v%d", dev, AC_CT_VERSION);
}

/* End-to-end calibration of the warm/cold choice (COSTMODEL.md: validate
 * end to end). Decode steps of the engine itself on random models of
 * growing weight size; the effective cache is the largest size whose
 * measured step is closer to the warm-weights prediction than to the cold
 * one. Micro-probes of the cache alone mislead here: under a VM the L3 is
 * shared and sysconf reports the host's. */
static double calibrate_cache(ac_cost_table *t) {
    static const int HS[] = {128, 192, 256, 384, 512};
    double best = 0;
    for (size_t i = 0; i < sizeof HS / sizeof *HS; i++) {
        int H = HS[i], L = 4, V = 1024, T = 48;
        ac_arch a = {0};
        snprintf(a.model_type, sizeof a.model_type, "llama");
        a.vocab = V; a.hidden = H; a.head_dim = 64; a.n_layers = L; a.max_pos = T; a.eps = 1e-5f; a.rope_theta = 10000;
        a.bos_id = a.eos_id = -1;
        ac_layer_arch la[4];
        for (int l = 0; l < L; l++) la[l] = (ac_layer_arch){H / 64, H / 128 > 0 ? H / 128 : 1, 3 * H};
        a.layers = la;
        ac_model m;
        ac_err e;
        if (ac_model_alloc(&m, &a, &e)) break;
        /* weights: any finite values; norms 1 */
        unsigned s = 1;
        float *bufs[] = {m.embed, m.lm_head};
        for (int b = 0; b < 2; b++) for (size_t k = 0; k < (size_t)V * H; k++) { s = s * 1664525u + 1013904223u; bufs[b][k] = (float)(s >> 9) * 1e-9f; }
        for (int l = 0; l < L; l++) {
            ac_layer_w *w = &m.L[l];
            size_t Q = (size_t)la[l].n_heads * 64, KV = (size_t)la[l].n_kv_heads * 64, F = la[l].ffn;
            float *ws[] = {w->wq, w->wk, w->wv, w->wo, w->wg, w->wu, w->wd};
            size_t ns[] = {Q * H, KV * H, KV * H, Q * H, F * H, F * H, F * H};
            for (int b = 0; b < 7; b++) for (size_t k = 0; k < ns[b]; k++) { s = s * 1664525u + 1013904223u; ws[b][k] = (float)(s >> 9) * 1e-9f; }
            for (int k = 0; k < H; k++) w->in_norm[k] = w->post_norm[k] = 1;
        }
        for (int k = 0; k < H; k++) m.final_norm[k] = 1;
        ac_engine en;
        double meas[3]; /* best of 3, as time_us */
        if (ac_engine_init(&en, &m, 1, T, &e)) { ac_model_free(&m); break; }
        int tok[16];
        for (int k = 0; k < 16; k++) tok[k] = k * 7;
        for (int r = 0; r < 3; r++) {
            ac_engine_forward(&en, tok, 1, 16, 0, 1, &e);
            double t0 = ac_now();
            for (int g = 0; g < 24; g++) ac_engine_forward(&en, tok + (g % 16), 1, 1, 16 + g, 1, &e);
            meas[r] = (ac_now() - t0) / 24 * 1e3;
        }
        ac_engine_free(&en);
        qsort(meas, 3, sizeof *meas, cmp_d);
        meas[1] = meas[0];
        ac_carch c;
        if (ac_carch_from_arch(&m.a, &c, &e)) { ac_model_free(&m); break; }
        ac_engine_profile p;
        ac_engine_profile_default(&p, 1);
        ac_workload w = {1, 16, 25};
        ac_cost warm, cold;
        double bytes = ac_carch_params(&c) * p.w_bytes;
        t->cache_bytes = 1e30;
        ac_cost_predict(t, &c, &w, &p, 0, &warm);
        t->cache_bytes = 0;
        ac_cost_predict(t, &c, &w, &p, 0, &cold);
        ac_carch_free(&c);
        a.layers = NULL;
        ac_model_free(&m);
        if (fabs(meas[1] - warm.tpot_ms) < fabs(meas[1] - cold.tpot_ms)) best = bytes;
        else break;
    }
    return best;
}

int ac_cost_measure_cpu(int threads, void (*progress)(void *, double), void *ud, ac_cost_table *t, ac_err *e) {
    memset(t, 0, sizeof *t);
    ac_set_threads(threads);
    double t_start = ac_now();
    static const double GM[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}, GNK[] = {16, 32, 64, 128, 256, 512, 1024, 2048};
    static const double AQ[] = {1, 4, 16, 64, 256, 1024}, AS[] = {1, 16, 64, 256, 1024, 2048}, AHD[] = {16, 64, 128};
    t->nm = 11; t->nn = t->nk = 8; t->naq = 6; t->nas = 6; t->nhd = 3;
    memcpy(t->gm, GM, sizeof GM); memcpy(t->gn, GNK, sizeof GNK); memcpy(t->gk, GNK, sizeof GNK);
    memcpy(t->aq, AQ, sizeof AQ); memcpy(t->as, AS, sizeof AS); memcpy(t->ahd, AHD, sizeof AHD);
    ac_cost_cpu_key(threads, t->key, sizeof t->key, t->device, sizeof t->device);
    snprintf(t->dtype, sizeof t->dtype, "fp32");
    snprintf(t->engine, sizeof t->engine, "autocompress-cpu");
    snprintf(t->source, sizeof t->source, "measured");
    t->version = AC_CT_VERSION;
    ac_local_device d[1];
    ac_devices_local(d, 1);
    t->mem_gib = d[0].mem_gib;
    t->gemm_us = malloc(sizeof(double) * t->nm * t->nn * t->nk);
    t->gemm_warm_us = malloc(sizeof(double) * t->nm * t->nn * t->nk);

    t->attn_us = malloc(sizeof(double) * t->nhd * t->naq * t->nas);
    size_t maxe = 1024 * 2048;
    float *a = malloc(maxe * 4), *w = malloc((size_t)POOL_FLOATS * 4), *c = malloc(maxe * 4), *sc = malloc((size_t)1024 * 3072 * 4);
    if (!t->gemm_us || !t->gemm_warm_us || !t->attn_us || !a || !w || !c || !sc) {
        free(a); free(w); free(c); free(sc);
        ac_cost_table_free(t);
        return ac_errf(e, "out of memory for cost measurement");
    }
    for (size_t i = 0; i < maxe; i++) a[i] = c[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
    for (size_t i = 0; i < POOL_FLOATS; i++) w[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
    int total = t->nm * t->nn * t->nk + t->nhd * t->naq * t->nas + 1, done = 0;
    for (int im = 0; im < t->nm; im++)
        for (int in = 0; in < t->nn; in++) {
            for (int ik = 0; ik < t->nk; ik++) {
                gemm_arg g = {a, w, c, (int)GM[im], (int)GNK[in], (int)GNK[ik], 0, 0};
                size_t at = ((size_t)im * t->nn + in) * t->nk + ik;
                t->gemm_us[at] = time_us(run_gemm, &g);
                /* warm weights matter where the GEMM is memory-bound (few rows) */
                g.span = (size_t)GNK[in] * (size_t)GNK[ik];
                t->gemm_warm_us[at] = GM[im] <= 16 ? time_us(run_gemm, &g) : t->gemm_us[at];
                done++;
            }
            if (progress) progress(ud, (double)done / total);
        }
    for (int ih = 0; ih < t->nhd; ih++)
        for (int iq = 0; iq < t->naq; iq++)
            for (int is = 0; is < t->nas; is++) {
                int n = (int)AQ[iq], s = n + (int)AS[is] - 1;
                attn_arg at = {c, a, w, w + (size_t)2048 * 128, sc, n, s, (int)AHD[ih]};
                t->attn_us[((size_t)ih * t->naq + iq) * t->nas + is] = time_us(run_attn, &at);
                done++;
            }
    /* elementwise: norm + rope + silu over a 256 x 1024 block */
    {
        float *nw = w;
        int pos[256];
        for (int i = 0; i < 256; i++) pos[i] = i;
        double t0 = ac_now();
        for (int r = 0; r < 20; r++) {
            ac_rmsnorm(c, a, nw, 256, 1024, 1e-5f);
            ac_rope(c, 256, 16, 64, pos, w, w + 256 * 32);
            ac_silu_mul(c, a, 256 * 1024);
        }
        t->elem_ns = (ac_now() - t0) / 20 / (3.0 * 256 * 1024) * 1e9;
    }
    free(a); free(w); free(c); free(sc);
    t->cache_bytes = calibrate_cache(t);
    if (progress) progress(ud, 1.0);
    t->measure_s = ac_now() - t_start;
    return 0;
}

int ac_cost_roofline(const ac_device_spec *s, const char *dtype, ac_cost_table *t, ac_err *e) {
    memset(t, 0, sizeof *t);
    if (!s) return ac_errf(e, "unknown device profile");
    t->roofline = 1;
    t->peak_tflops = s->bf16_tflops * (!strcmp(dtype, "fp32") ? 0.5 : !strcmp(dtype, "fp8") ? 2.0 : 1.0);
    t->bw_gbs = s->bw_gbs;
    t->eta_c = 0.7;
    t->eta_m = 0.85;
    t->launch_us = s->launch_us;
    t->mem_gib = s->mem_gib * 1e9 / 1073741824.0;
    snprintf(t->device, sizeof t->device, "%s", s->full_name);
    snprintf(t->dtype, sizeof t->dtype, "%s", dtype);
    snprintf(t->engine, sizeof t->engine, "roofline");
    snprintf(t->source, sizeof t->source, "roofline");
    t->version = AC_CT_VERSION;
    snprintf(t->key, sizeof t->key, "roofline:%s|%s|v%d", s->name, dtype, AC_CT_VERSION);
    return 0;
}

/* ---------------------------------------------------------------- JSON */

static json_t *darr(const double *v, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_real(v[i]));
    return a;
}

json_t *ac_cost_table_to_json(const ac_cost_table *t) {
    json_t *j = json_pack("{s:s,s:s,s:s,s:s,s:i,s:s,s:f,s:f}", "key", t->key, "device", t->device, "dtype", t->dtype, "engine",
                          t->engine, "version", t->version, "source", t->source, "memory_gib", t->mem_gib, "measure_seconds", t->measure_s);
    if (t->roofline) {
        json_object_set_new(j, "roofline", json_pack("{s:f,s:f,s:f,s:f,s:f}", "peak_tflops", t->peak_tflops, "bandwidth_gbs", t->bw_gbs,
                                                     "eta_compute", t->eta_c, "eta_memory", t->eta_m, "launch_us", t->launch_us));
        return j;
    }
    json_object_set_new(j, "gemm", json_pack("{s:o,s:o,s:o,s:o}", "m", darr(t->gm, t->nm), "n", darr(t->gn, t->nn), "k", darr(t->gk, t->nk),
                                             "us", darr(t->gemm_us, t->nm * t->nn * t->nk)));
    if (t->gemm_warm_us) json_object_set_new(json_object_get(j, "gemm"), "warm_us", darr(t->gemm_warm_us, t->nm * t->nn * t->nk));
    json_object_set_new(j, "cache_bytes", json_real(t->cache_bytes));

    json_object_set_new(j, "attention", json_pack("{s:o,s:o,s:o,s:o}", "head_dims", darr(t->ahd, t->nhd), "queries", darr(t->aq, t->naq),
                                                  "extra_keys", darr(t->as, t->nas), "us", darr(t->attn_us, t->nhd * t->naq * t->nas)));
    json_object_set_new(j, "elementwise_ns", json_real(t->elem_ns));
    json_object_set_new(j, "launch_us", json_real(t->launch_us));
    return j;
}

static int get_grid(const json_t *a, double *out, int *n, const char **field, const char *name, ac_err *e) {
    *field = name;
    if (!json_is_array(a) || json_array_size(a) < 1 || json_array_size(a) > AC_CT_MAXG) return ac_errf(e, "%s must be an array of 1..%d numbers", name, AC_CT_MAXG);
    *n = (int)json_array_size(a);
    for (int i = 0; i < *n; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_number(v) || json_number_value(v) <= 0 || (i && json_number_value(v) <= out[i - 1]))
            return ac_errf(e, "%s must hold positive, increasing numbers", name);
        out[i] = json_number_value(v);
    }
    return 0;
}

static int get_vals(const json_t *a, double **out, int n, const char **field, const char *name, ac_err *e) {
    *field = name;
    if (!json_is_array(a) || (int)json_array_size(a) != n) return ac_errf(e, "%s must hold %d numbers", name, n);
    *out = malloc(sizeof(double) * n);
    for (int i = 0; i < n; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_number(v) || !(json_number_value(v) > 0) || !isfinite(json_number_value(v))) { free(*out); *out = NULL; return ac_errf(e, "%s must hold positive numbers", name); }
        (*out)[i] = json_number_value(v);
    }
    return 0;
}

static int table_parse(const json_t *j, ac_cost_table *t, const char **field, ac_err *e) {
    memset(t, 0, sizeof *t);
    const char *f2;
    if (!field) field = &f2;
    if (!json_is_object(j)) { *field = "table"; return ac_errf(e, "table must be an object"); }
    static const char *strs[] = {"key", "device", "dtype", "engine"};
    char *dst[] = {t->key, t->device, t->dtype, t->engine};
    size_t sz[] = {sizeof t->key, sizeof t->device, sizeof t->dtype, sizeof t->engine};
    for (int i = 0; i < 4; i++) {
        json_t *v = json_object_get(j, strs[i]);
        *field = strs[i];
        if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) >= sz[i]) return ac_errf(e, "table.%s must be a non-empty string", strs[i]);
        snprintf(dst[i], sz[i], "%s", json_string_value(v));
    }
    json_t *ver = json_object_get(j, "version");
    *field = "version";
    if (!json_is_integer(ver) || json_integer_value(ver) != AC_CT_VERSION) return ac_errf(e, "table.version must be %d", AC_CT_VERSION);
    t->version = AC_CT_VERSION;
    snprintf(t->source, sizeof t->source, "%s", json_string_value(json_object_get(j, "source")) ? json_string_value(json_object_get(j, "source")) : "imported");
    json_t *mem = json_object_get(j, "memory_gib");
    *field = "memory_gib";
    if (!json_is_number(mem) || json_number_value(mem) <= 0) return ac_errf(e, "table.memory_gib must be a positive number");
    t->mem_gib = json_number_value(mem);
    json_t *rl = json_object_get(j, "roofline");
    if (rl) {
        t->roofline = 1;
        static const char *rk[] = {"peak_tflops", "bandwidth_gbs", "eta_compute", "eta_memory", "launch_us"};
        double *rd[] = {&t->peak_tflops, &t->bw_gbs, &t->eta_c, &t->eta_m, &t->launch_us};
        for (int i = 0; i < 5; i++) {
            json_t *v = json_object_get(rl, rk[i]);
            *field = rk[i];
            if (!json_is_number(v) || json_number_value(v) < 0 || (i < 4 && json_number_value(v) <= 0)) return ac_errf(e, "table.roofline.%s must be a positive number", rk[i]);
            *rd[i] = json_number_value(v);
        }
        return 0;
    }
    json_t *g = json_object_get(j, "gemm"), *a = json_object_get(j, "attention");
    if (get_grid(json_object_get(g, "m"), t->gm, &t->nm, field, "gemm.m", e) || get_grid(json_object_get(g, "n"), t->gn, &t->nn, field, "gemm.n", e) ||
        get_grid(json_object_get(g, "k"), t->gk, &t->nk, field, "gemm.k", e) ||
        get_vals(json_object_get(g, "us"), &t->gemm_us, t->nm * t->nn * t->nk, field, "gemm.us", e) ||
        get_grid(json_object_get(a, "queries"), t->aq, &t->naq, field, "attention.queries", e) ||
        get_grid(json_object_get(a, "extra_keys"), t->as, &t->nas, field, "attention.extra_keys", e) ||
        get_grid(json_object_get(a, "head_dims"), t->ahd, &t->nhd, field, "attention.head_dims", e) ||
        get_vals(json_object_get(a, "us"), &t->attn_us, t->nhd * t->naq * t->nas, field, "attention.us", e)) {
        ac_cost_table_free(t);
        return -1;
    }
    json_t *el = json_object_get(j, "elementwise_ns"), *lu = json_object_get(j, "launch_us");
    *field = "elementwise_ns";
    if (!json_is_number(el) || json_number_value(el) < 0) { ac_cost_table_free(t); return ac_errf(e, "elementwise_ns must be a number >= 0"); }
    t->elem_ns = json_number_value(el);
    t->launch_us = json_is_number(lu) ? json_number_value(lu) : 0;
    json_t *cb = json_object_get(j, "cache_bytes");
    t->cache_bytes = json_is_number(cb) && json_number_value(cb) > 0 ? json_number_value(cb) : 0;
    if (json_object_get(g, "warm_us") && get_vals(json_object_get(g, "warm_us"), &t->gemm_warm_us, t->nm * t->nn * t->nk, field, "gemm.warm_us", e)) {
        ac_cost_table_free(t);
        return -1;
    }

    t->measure_s = json_number_value(json_object_get(j, "measure_seconds"));
    return 0;
}

int ac_cost_table_from_json(const json_t *j, ac_cost_table *t, ac_err *e) { return table_parse(j, t, NULL, e); }

int ac_cost_table_validate(const json_t *j, const char **field, ac_err *e) {
    ac_cost_table t;
    if (table_parse(j, &t, field, e)) return -1;
    ac_cost_table_free(&t);
    return 0;
}

/* ---------------------------------------------------------------- cache (SQLite, read side) */

int ac_cost_cache_get(const char *db_path, const char *key, ac_cost_table *t, int *found, ac_err *e) {
    *found = 0;
    if (!db_path || access(db_path, R_OK) != 0) return 0;
    sqlite3 *c;
    if (sqlite3_open_v2(db_path, &c, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) { sqlite3_close(c); return 0; }
    sqlite3_busy_timeout(c, 5000);
    sqlite3_stmt *st;
    int rc = 0;
    if (sqlite3_prepare_v2(c, "SELECT data FROM cost_tables WHERE key = ?", -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_text(st, 1, key, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(st) == SQLITE_ROW) {
            json_t *j = json_loads((const char *)sqlite3_column_text(st, 0), 0, NULL);
            if (j && ac_cost_table_from_json(j, t, e) == 0) *found = 1;
            else rc = ac_errf(e, "cached cost table %s is corrupt", key);
            json_decref(j);
        }
        sqlite3_finalize(st);
    }
    sqlite3_close(c);
    return rc;
}

int ac_cost_cache_put(const char *db_path, const ac_cost_table *t, ac_err *e) {
    sqlite3 *c;
    if (sqlite3_open(db_path, &c) != SQLITE_OK) { sqlite3_close(c); return ac_errf(e, "cannot open %s", db_path); }
    sqlite3_busy_timeout(c, 5000);
    sqlite3_exec(c, "CREATE TABLE IF NOT EXISTS cost_tables (key TEXT PRIMARY KEY, device TEXT NOT NULL, dtype TEXT NOT NULL, engine TEXT NOT NULL,"
                    " version INTEGER NOT NULL, source TEXT NOT NULL, created_at REAL NOT NULL, hits INTEGER NOT NULL DEFAULT 0, data TEXT NOT NULL)",
                 NULL, NULL, NULL);
    sqlite3_stmt *st;
    int rc = 0;
    json_t *j = ac_cost_table_to_json(t);
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (sqlite3_prepare_v2(c, "INSERT OR REPLACE INTO cost_tables (key, device, dtype, engine, version, source, created_at, data) VALUES (?,?,?,?,?,?,strftime('%s','now'),?)", -1, &st, NULL) != SQLITE_OK)
        rc = ac_errf(e, "cost cache: %s", sqlite3_errmsg(c));
    else {
        const char *v[] = {t->key, t->device, t->dtype, t->engine};
        for (int i = 0; i < 4; i++) sqlite3_bind_text(st, i + 1, v[i], -1, SQLITE_TRANSIENT);
        sqlite3_bind_int(st, 5, t->version);
        sqlite3_bind_text(st, 6, t->source, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(st, 7, s, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(st) != SQLITE_DONE) rc = ac_errf(e, "cost cache: %s", sqlite3_errmsg(c));
        sqlite3_finalize(st);
    }
    free(s);
    sqlite3_close(c);
    return rc;
}

int ac_cost_table_for(const char *device, const char *dtype, const char *cost_db, int threads, int allow_measure,
                      void (*progress)(void *, double), void *ud, ac_cost_table *t, int *cache_hit, ac_err *e) {
    *cache_hit = 0;
    if (!strcmp(device, "cpu")) {
        char key[384];
        ac_cost_cpu_key(threads, key, sizeof key, NULL, 0);
        int found;
        if (ac_cost_cache_get(cost_db, key, t, &found, e)) return -1;
        if (found) { *cache_hit = 1; return 0; }
        if (!allow_measure) return ac_errf(e, "no measured cost table for this CPU yet (key %s); measure one with POST /v1/cost-tables {\"measure\":{\"device\":\"cpu\"}} or run a job on it", key);
        return ac_cost_measure_cpu(threads, progress, ud, t, e);
    }
    if (!strncmp(device, "cuda", 4)) {
        const char *why;
        const ac_cuda_api *cu = ac_cuda(&why);
        int dev = device[4] == ':' ? atoi(device + 5) : 0;
        if (!cu) return ac_errf(e, "target %s: %s; target a spec profile such as H100 instead", device, why);
        char name[128], key[384];
        double mem;
        int sms, cc;
        if (cu->device_info(dev, name, sizeof name, &mem, &sms, &cc)) return ac_errf(e, "target %s: no such CUDA device", device);
        snprintf(key, sizeof key, "cuda:%s|bf16|cublas|v%d", name, AC_CT_VERSION);
        int found;
        if (ac_cost_cache_get(cost_db, key, t, &found, e)) return -1;
        if (found) { *cache_hit = 1; return 0; }
        if (!allow_measure) return ac_errf(e, "no measured cost table for %s yet (key %s)", device, key);
        char err[512] = "";
        double t0 = ac_now();
        if (progress) progress(ud, 0);
        if (cu->measure_table(dev, t, err, sizeof err)) return ac_errf(e, "measuring %s: %s", device, err);
        t->measure_s = ac_now() - t0;
        if (progress) progress(ud, 1);
        return 0;
    }
    const ac_device_spec *s = ac_device_spec_find(device);
    if (!s) return ac_errf(e, "unknown device %s (cpu, cuda:N, or a profile: H100, H200, B200, A100, L4, RTX4090, RTX5080, RTX5070)", device);
    return ac_cost_roofline(s, dtype, t, e);
}

/* ---------------------------------------------------------------- HTTP helpers */

int ac_cost_measure_validate(const json_t *req, const char **field, ac_err *e) {
    *field = "measure";
    if (!json_is_object(req)) return ac_errf(e, "measure must be an object");
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)req, k, v) {
        if (strcmp(k, "device") && strcmp(k, "threads")) { *field = "measure"; return ac_errf(e, "measure: unknown field %s", k); }
    }
    json_t *d = json_object_get(req, "device"), *th = json_object_get(req, "threads");
    *field = "measure.device";
    if (!json_is_string(d) || strcmp(json_string_value(d), "cpu")) return ac_errf(e, "measure.device must be \"cpu\" (CUDA tables are measured by the CUDA backend)");
    *field = "measure.threads";
    if (th && (!json_is_integer(th) || json_integer_value(th) < 1 || json_integer_value(th) > 256)) return ac_errf(e, "measure.threads must be an integer in [1, 256]");
    return 0;
}

void ac_cost_measure_key(const json_t *req, char *key, size_t n) {
    json_t *th = json_object_get(req, "threads");
    ac_cost_cpu_key(th ? (int)json_integer_value(th) : 2, key, n, NULL, 0);
}

int ac_cost_measure_json(const json_t *req, json_t **table, ac_err *e) {
    json_t *th = json_object_get(req, "threads");
    ac_cost_table t;
    if (ac_cost_measure_cpu(th ? (int)json_integer_value(th) : 2, NULL, NULL, &t, e)) return -1;
    *table = ac_cost_table_to_json(&t);
    ac_cost_table_free(&t);
    return 0;
}

int ac_estimate_json(const json_t *req, const char *cost_db, json_t **out, const char **field, ac_err *e) {
    *field = NULL;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)req, k, v) {
        if (strcmp(k, "model") && strcmp(k, "architecture") && strcmp(k, "target")) { *field = k; return ac_errf(e, "unknown field %s", k); }
    }
    ac_arch base, arch;
    memset(&base, 0, sizeof base);
    json_t *model = json_object_get(req, "model"), *aj = json_object_get(req, "architecture"), *target = json_object_get(req, "target");
    if (model) {
        *field = "model";
        if (!json_is_string(model)) return ac_errf(e, "model must be a path string");
        if (ac_arch_load(json_string_value(model), &base, e)) return -1;
    } else {
        *field = "architecture";
        if (!aj) return ac_errf(e, "need model (a model directory) or architecture");
        base.vocab = 32000;
        base.hidden = 4096;
        base.head_dim = 128;
        base.n_layers = 0;
    }
    if (aj) {
        *field = "architecture";
        int rc = ac_arch_from_json(aj, &base, &arch, e);
        ac_arch_free(&base);
        if (rc) return -1;
    } else arch = base;
    *field = "target";
    if (!json_is_object(target) || !json_is_string(json_object_get(target, "device"))) { ac_arch_free(&arch); return ac_errf(e, "target.device is required"); }
    const char *dev = json_string_value(json_object_get(target, "device"));
    int is_cpu = !strcmp(dev, "cpu");
    ac_engine_profile p;
    ac_workload w;
    ac_engine_profile_default(&p, is_cpu);
    *field = "target.engine";
    if (ac_engine_profile_from_json(json_object_get(target, "engine"), &p, e)) { ac_arch_free(&arch); return -1; }
    *field = "target.workload";
    if (ac_workload_from_json(json_object_get(target, "workload"), &w, e)) { ac_arch_free(&arch); return -1; }
    const char *dtype = p.w_bytes == 4 ? "fp32" : p.w_bytes == 1 ? "fp8" : "bf16";
    ac_cost_table t;
    int hit;
    *field = "target.device";
    if (ac_cost_table_for(dev, dtype, cost_db, 2, 0, NULL, NULL, &t, &hit, e)) { ac_arch_free(&arch); return -1; }
    ac_carch c;
    if (ac_carch_from_arch(&arch, &c, e)) { ac_cost_table_free(&t); ac_arch_free(&arch); return -1; }
    ac_cost r;
    ac_cost_predict(&t, &c, &w, &p, 0, &r);
    *out = json_pack("{s:s,s:s,s:s,s:o,s:o,s:{s:i,s:i,s:i}}", "device", t.device, "cost_table", t.key, "source", t.source, "figures",
                     ac_cost_to_json(&r), "architecture", ac_arch_to_json(&arch), "workload", "batch", w.batch, "prompt_len", w.prompt_len,
                     "gen_len", w.gen_len);
    ac_carch_free(&c);
    ac_cost_table_free(&t);
    ac_arch_free(&arch);
    *field = NULL;
    return 0;
}
