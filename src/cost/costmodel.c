/*
 * costmodel.c - the serving-workload model: an architecture (continuous
 * widths, ac_carch) walked layer by layer through a cost table gives TTFT,
 * TPOT, throughput, peak memory and the largest batch that fits; and the
 * gradient of any of those with respect to every width. See costmodel.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cost_internal.h"
#include "costmodel.h"

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
    if (!c->heads || !c->kv || !c->ffn) {
        ac_carch_free(c);
        return ac_errf(e, "out of memory");
    }
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

/* ---------------------------------------------------------------- engine profile */

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

/* ---------------------------------------------------------------- prediction */

/* One forward call of B sequences, nq new tokens each at position pos0. */
static double forward_us(const ac_cost_table *t, const ac_carch *c, const ac_engine_profile *p, double B, double nq,
                         double pos0, int last_only, int warm) {
    double M = B * nq, S = pos0 + nq, H = c->hidden, hd = c->head_dim, us = 0;
    int launches = 2;
    for (int l = 0; l < c->n_layers; l++) {
        double h = c->heads[l], kv = c->kv[l], F = c->ffn[l];
        if (h > 0) {
            us += ac_cost_gemm_lookup(t, M, h * hd, H, warm) + 2 * ac_cost_gemm_lookup(t, M, kv * hd, H, warm) +
                  ac_cost_gemm_lookup(t, M, H, h * hd, warm);
            us += ac_cost_attn_us(t, h, kv, B, nq, S, c->head_dim);
            us += ac_cost_elem_us(t, M * (H + (h + kv) * hd), p->act_bytes);
            launches += 3;
        }
        if (F > 0) {
            us += 2 * ac_cost_gemm_lookup(t, M, F, H, warm) + ac_cost_gemm_lookup(t, M, H, F, warm);
            us += ac_cost_elem_us(t, M * (H + 2 * F), p->act_bytes);
            launches += 2;
        }
    }
    us += ac_cost_gemm_lookup(t, last_only ? B : M, c->vocab, H, warm) + ac_cost_elem_us(t, M * H, p->act_bytes);
    us += launches * t->launch_us; /* 0 for CPU tables */
    return us + p->overhead_ms * 1e3;
}

double ac_cost_decode_bytes(const ac_carch *c, const ac_engine_profile *p, double B, double S) {
    double H = c->hidden, hd = c->head_dim, wb = (double)c->vocab * H, kvb = 0;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->heads[l] > 0) {
            wb += 2 * H * (c->heads[l] + c->kv[l]) * hd;
            kvb += 2 * c->kv[l] * hd * S;
        }
        if (c->ffn[l] > 0) wb += 3 * H * c->ffn[l];
    }
    return wb * p->w_bytes + B * kvb * p->kv_bytes;
}

/* Log-linear interpolation of v over the table's working-set bands,
 * constant beyond them. */
static double band_interp(const ac_cost_table *t, const double *v, double ws) {
    int n = t->ndec;
    if (ws <= t->dec_ws[0]) return v[0];
    if (ws >= t->dec_ws[n - 1]) return v[n - 1];
    int k = 0;
    while (k < n - 2 && ws > t->dec_ws[k + 1]) k++;
    double u = (log(ws) - log(t->dec_ws[k])) / (log(t->dec_ws[k + 1]) - log(t->dec_ws[k]));
    return v[k] + (v[k + 1] - v[k]) * u;
}

/* Microseconds per MiB a CPU decode step of B sequences streams beyond the
 * warm tables at working set ws: the batch-1 bands, the batch-4 ones when
 * measured (linear in log B between, constant beyond 4), those read at ws4:
 * the working set of a model with the probes' 4 layers of this one's mean
 * bytes per layer (see probe_ws4). */
static double decode_us_mib(const ac_cost_table *t, double ws, double B, double ws4) {
    double r1 = band_interp(t, t->dec_us_mib, ws);
    if (!t->dec_b4 || B <= 1) return r1;
    double r4 = band_interp(t, t->dec_us_mib4, ws4), u = B >= 4 ? 1 : log(B) / log(4.0);
    return r1 + (r4 - r1) * u;
}

/* The batch-4 bands' lookup point: ws scaled to the probes' PROBE_LAYERS
 * layers. At batch 4 most of the excess of a small model is a per-layer
 * cost, not its bytes, so the matching probe is the one with as many bytes
 * per layer (a 6-layer 5 MiB model reads the 4-layer 3.5 MiB probe's rate). */
#define PROBE_LAYERS 4.0
static double probe_ws4(const ac_carch *c, double ws) {
    int n = 0;
    for (int l = 0; l < c->n_layers; l++) n += c->heads[l] > 0 || c->ffn[l] > 0;
    return n > 0 ? ws * PROBE_LAYERS / n : ws;
}

/* One forward call. A measured CPU table with decode bands models a decode
 * step by what bounds it there: the warm tables (per-call fixed costs,
 * compute, attention over hot keys, elementwise) plus the weights streamed
 * at the rate measured for that working set, plus the KV cache the
 * attention reads at its own measured rate (the keys and values of B
 * sequences at context pos0 + 1: ~ ctx x kv_dim per layer; tables without
 * that rate charge it like the weights). Otherwise the share of the weights
 * that fits in the table's effective cache is read warm: the warm and cold
 * GEMM tables blended by it. */
static double step_us(const ac_cost_table *t, const ac_carch *c, const ac_engine_profile *p, double B, double nq,
                      double pos0, double fw) {
    if (nq == 1 && t->ndec > 0 && !t->roofline) {
        double bytes = ac_cost_decode_bytes(c, p, B, pos0 + 1), wbytes = ac_cost_decode_bytes(c, p, B, 0),
               rate = decode_us_mib(t, bytes, B, probe_ws4(c, bytes)),
               kv_rate = t->dec_kv ? band_interp(t, t->dec_kv_us_mib, bytes) : rate;
        double warm = forward_us(t, c, p, B, 1, pos0, 1, 1),
               us = warm + wbytes / 1048576.0 * rate + (bytes - wbytes) / 1048576.0 * kv_rate;
        /* a band's rate may be negative down to half its probe's warm
         * prediction (costmeasure.c); applied to more bytes than the
         * probe's, it could take more: a step is at least half its warm
         * part (a BF16 table whose batch-4 band sat at that floor once
         * predicted a 6-layer model's step at 0.11 ms where it took 0.67) */
        return us > 0.5 * warm ? us : 0.5 * warm;
    }
    return fw * forward_us(t, c, p, B, nq, pos0, 1, 1) + (1 - fw) * forward_us(t, c, p, B, nq, pos0, 1, 0);
}

double ac_cost_decode_step_us(const ac_cost_table *t, const ac_carch *c, const ac_engine_profile *p, double B,
                              double S) {
    double wbytes = ac_carch_params(c) * p->w_bytes,
           fw = t->cache_bytes > 0 && wbytes > 0 ? fmin(1, t->cache_bytes / wbytes) : 0;
    return step_us(t, c, p, B, 1, S - 1, fw);
}

void ac_cost_predict(const ac_cost_table *t, const ac_carch *c, const ac_workload *w, const ac_engine_profile *p,
                     int smooth, ac_cost *o) {
    memset(o, 0, sizeof *o);
    double B = w->batch, P = w->prompt_len, G = w->gen_len;
    double wbytes = ac_carch_params(c) * p->w_bytes,
           fw = t->cache_bytes > 0 && wbytes > 0 ? fmin(1, t->cache_bytes / wbytes) : 0;
    o->ttft_ms = step_us(t, c, p, B, P, 0, fw) / 1e3;
    /* Decode steps at context P..P+G-1: the cost is close to linear in the
     * context, so Simpson's rule over three points is near exact. */
    double d0 = step_us(t, c, p, B, 1, P, fw), d1 = step_us(t, c, p, B, 1, P + (G - 1) / 2, fw),
           d2 = step_us(t, c, p, B, 1, P + G - 1, fw);
    o->tpot_ms = G > 1 ? (d0 + 4 * d1 + d2) / 6 / 1e3 : 0;
    o->e2e_ms = o->ttft_ms + (G - 1) * o->tpot_ms;
    o->tokens_per_s = B * G / (o->e2e_ms / 1e3);
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
    double avail = t->mem_gib * p->mem_util - o->weights_gib - p->overhead_gib,
           per_seq = (seq_tokens * kv_tok + act_seq) / gib;
    o->max_batch = avail > 0 && per_seq > 0 ? (int)fmin(floor(avail / per_seq), 1e9) : 0;
}

double ac_cost_metric(const ac_cost *c, ac_metric m) {
    switch (m) {
    case AC_M_TTFT: return c->ttft_ms;
    case AC_M_TPOT: return c->tpot_ms;
    case AC_M_TOKENS_PER_S: return c->tokens_per_s;
    case AC_M_MEM: return c->mem_gib;
    case AC_M_PARAMS: return c->params;
    default: return 0;
    }
}

void ac_cost_grad(const ac_cost_table *t, const ac_carch *c, const ac_workload *w, const ac_engine_profile *p,
                  ac_metric m, double *gh, double *gkv, double *gf, double *ghid) {
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
    return json_pack("{s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:i,s:f}", "ttft_ms", c->ttft_ms, "tpot_ms", c->tpot_ms,
                     "tokens_per_s", c->tokens_per_s, "e2e_ms", c->e2e_ms, "memory_gib", c->mem_gib, "weights_gib",
                     c->weights_gib, "kv_cache_gib", c->kv_gib, "activations_gib", c->act_gib, "params", c->params,
                     "max_batch", c->max_batch, "device_memory_gib", c->device_mem_gib);
}

void ac_engine_profile_cpu(ac_engine_profile *p, const char *dtype) {
    ac_engine_profile_default(p, 1);
    if (dtype && !strcmp(dtype, "bf16")) p->w_bytes = 2;
}

const char *ac_engine_profile_dtype(const ac_engine_profile *p) {
    return p->w_bytes == 4 ? "fp32" : p->w_bytes == 1 ? "fp8" : "bf16";
}
