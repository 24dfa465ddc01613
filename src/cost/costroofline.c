/*
 * costroofline.c - cost tables of GPUs that need not be present, from
 * their datasheet figures (device.c's spec profiles): each operator costs
 * the larger of its FLOPs at an efficiency of the peak and its bytes at an
 * efficiency of the bandwidth, plus a launch overhead.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cost_int.h"
#include "cost/costmodel.h"

/* Compute efficiency of a GEMM's tiles on the SMs that run them (the wave
 * model below counts the SMs a partial wave leaves idle): 0.75 of the
 * peak, chosen with the wave model on TensorRT-LLM v0.17's nine
 * Llama-3.1-8B FP16 rows on the A100 (mean |error| 4.4 % at 0.7, 2.8 % at
 * 0.75, 3.5 % at 0.8; it was 0.7 of the whole GPU before the wave model).
 * FP8 GEMMs on FP8 tensor cores reach 0.6 of their (doubled) peak: fitted
 * on TensorRT-LLM 1.0's Llama-3.1-8B FP8 rows on the H100 before the wave
 * model (mean |error| 4.7 % at 0.7, 2.3 % at 0.6) and checked on every
 * other FP8 row; kept with the input quantisation (costmodel.c) and with
 * the wave model, under which those ten rows prefer 0.7 but the other
 * rows 0.6 (docs/costmodel.md, "Validation"). */
#define AC_ETA_COMPUTE 0.75
#define AC_ETA_FP8 0.6

static double bytes_of(const char *dtype) { return !strcmp(dtype, "fp32") ? 4 : !strcmp(dtype, "fp8") ? 1 : 2; }

static double roof_peak_us(const ac_cost_table *t, double flops, double bytes, double peak) {
    double tc = flops / (t->eta_c * peak * 1e12), tm = bytes / (t->eta_m * t->bw_gbs * 1e9);
    return (tc > tm ? tc : tm) * 1e6 + t->launch_us;
}

/* The CTA tiles (rows x columns of the output) a GEMM library chooses
 * among: CUTLASS's Ampere-style tiles as TensorRT-LLM's kernel heuristic
 * lists them (cutlass_heuristic.cpp); each CTA runs on one SM, one at a
 * time (their multi-stage shared-memory pipelines fill it). */
static const double cta_tiles[][2] = {{64, 64}, {64, 128}, {128, 64}, {128, 128}, {128, 256}, {256, 128}};
/* The K slice of every tile (the same heuristic's k_tile): a split-K slice
 * is at least this deep. */
#define AC_K_TILE 64.0

/* A GEMM of m x n x k on t->sms SMs, wave-quantised (docs/costmodel.md,
 * "Small-M GEMMs"): for each tile and split-K factor s (s > 1 only where
 * the output tiles are fewer than the SMs, each slice at least a k tile
 * deep) the CTAs run in ceil(tiles x s / SMs) waves, a wave taking one
 * tile's FLOPs (k / s deep) at 1/SMs of the efficient peak; split-K adds
 * its FP32 partial sums, written and read once per slice, to the bytes.
 * The time is the least over the choices, as a library that picks the
 * fastest kernel would (its compute part never below the whole GPU's at
 * the efficient peak: the wave model only adds idle SMs). Without an SM
 * count (a table read from JSON), or for one row (a matrix-vector
 * product, bound by the weights), the plain roofline. */
static double wave_gemm_us(const ac_cost_table *t, double m, double n, double k, double flops, double bytes,
                           double peak) {
    double S = t->sms, full = flops / (t->eta_c * peak * 1e12), bw = t->eta_m * t->bw_gbs * 1e9;
    double best = INFINITY;
    for (size_t i = 0; i < sizeof cta_tiles / sizeof cta_tiles[0]; i++) {
        double tm = cta_tiles[i][0], tn = cta_tiles[i][1], tiles = ceil(m / tm) * ceil(n / tn);
        double smax = tiles < S ? fmax(1, fmin(floor(S / tiles), floor(k / AC_K_TILE))) : 1;
        for (double s = 1; s <= smax; s++) {
            double tc = full * ceil(tiles * s / S) * tm * tn * S / (s * m * n);
            double tb = (bytes + (s > 1 ? 8 * s * m * n : 0)) / bw;
            double us = fmax(tc, tb);
            if (us < best) best = us;
            if (tb >= tc) break; /* more slices (all in one wave) only add bytes */
        }
    }
    return best * 1e6 + t->launch_us;
}

static double roof_us(const ac_cost_table *t, double flops, double bytes) {
    return roof_peak_us(t, flops, bytes, t->peak_tflops);
}

double ac_roofline_gemm_peak_us(const ac_cost_table *t, double m, double n, double k, double peak_tflops) {
    double w = bytes_of(t->dtype); /* bytes per element of weights and activations */
    double flops = 2 * m * n * k, bytes = w * (m * k + n * k) + 2 * m * n;
    if (t->sms > 0 && m > 1 && n > 0 && k > 0) return wave_gemm_us(t, m, n, k, flops, bytes, peak_tflops);
    return roof_peak_us(t, flops, bytes, peak_tflops);
}

double ac_roofline_gemm_us(const ac_cost_table *t, double m, double n, double k) {
    return ac_roofline_gemm_peak_us(t, m, n, k, t->peak_tflops);
}

double ac_roofline_attn_us(const ac_cost_table *t, double heads, double kv_heads, double batch, double nq, double s,
                           int head_dim) {
    return ac_roofline_attn_kv_us(t, heads, kv_heads, batch, nq, s, head_dim, bytes_of(t->dtype));
}

double ac_roofline_attn_kv_us(const ac_cost_table *t, double heads, double kv_heads, double batch, double nq, double s,
                              int head_dim, double kvb) {
    double flops = batch * heads * 4.0 * head_dim * (nq * s - nq * (nq - 1) / 2);
    double bytes = batch * (kv_heads * 2 * s * head_dim * kvb + 2 * heads * nq * head_dim * 2);
    return roof_us(t, flops, bytes);
}

double ac_roofline_elem_us(const ac_cost_table *t, double elements, int act_bytes) {
    return elements * 2 * act_bytes / (t->eta_m * t->bw_gbs * 1e9) * 1e6;
}

int ac_cost_roofline(const ac_device_spec *s, const char *dtype, ac_cost_table *t, ac_err *e) {
    memset(t, 0, sizeof *t);
    if (!s) return ac_errf(e, "unknown device profile");
    t->roofline = 1;
    /* FP8 at twice the BF16 rate on FP8 tensor cores; without them (A100)
     * FP8 weights are dequantised in the GEMM (weight-only): BF16 compute,
     * one byte per weight */
    t->peak_tflops = s->bf16_tflops * (!strcmp(dtype, "fp32") ? 0.5 : !strcmp(dtype, "fp8") && s->fp8 ? 2.0 : 1.0);
    t->bw_gbs = s->bw_gbs;
    t->eta_c = !strcmp(dtype, "fp8") && s->fp8 ? AC_ETA_FP8 : AC_ETA_COMPUTE;
    t->fp8_act = !strcmp(dtype, "fp8") && s->fp8;
    /* FP16 accumulate: the 16-bit tables only (an FP8 or FP32 GEMM has its own rate) */
    t->peak_acc16_tflops =
        strcmp(dtype, "fp8") && strcmp(dtype, "fp32") && s->fp16acc_tflops > 0 ? s->fp16acc_tflops : t->peak_tflops;
    t->eta_m = 0.85;
    t->launch_us = s->launch_us;
    t->sms = s->sms;
    t->mem_gib = s->mem_gib * 1e9 / 1073741824.0;
    snprintf(t->device, sizeof t->device, "%s", s->full_name);
    snprintf(t->dtype, sizeof t->dtype, "%s", dtype);
    snprintf(t->engine, sizeof t->engine, "roofline");
    snprintf(t->source, sizeof t->source, "roofline");
    t->version = AC_CT_VERSION;
    snprintf(t->key, sizeof t->key, "roofline:%s|%s|v%d", s->name, dtype, AC_CT_VERSION);
    return 0;
}
