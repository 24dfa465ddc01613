/*
 * bench_gemm_bf16.c - the AVX512-BF16 prefill GEMM (kernels_avx512bf16.c)
 * with wide inputs in k chunks (the default) against whole rows, side by
 * side in one run: GFLOP/s of each on 512-row prefill shapes, their ratio,
 * and whether the two gave the same bits (they must).
 *
 * build/bench/bench_gemm_bf16 [threads] [rounds] [chunk]   (defaults 1, 5 and 1024)
 * Each round times both variants back to back, alternating which goes first;
 * a variant's figure is its best round (neighbours on a shared machine only
 * add time).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/kernels_avx512bf16.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Seconds of one call, the best of enough calls to fill 0.2 s. */
static double time_call(float *Y, const float *X, const uint16_t *W, int N, int in, int out, uint16_t *xp, int th,
                        int chunk) {
    ac_avx512bf16_set_kchunk(chunk);
    double best = 1e30, t0 = now();
    do {
        double s = now();
        ac_avx512bf16_linear(Y, X, W, NULL, N, in, out, 0, xp, th);
        best = fmin(best, now() - s);
    } while (now() - t0 < 0.2);
    return best;
}

int main(int argc, char **argv) {
    int th = argc > 1 ? atoi(argv[1]) : 1, rounds = argc > 2 ? atoi(argv[2]) : 5, kc = argc > 3 ? atoi(argv[3]) : 1024;
    if (!ac_avx512bf16_available()) {
        printf("bench_gemm_bf16: this CPU has no AVX512-BF16; nothing to measure\n");
        return 0;
    }
    static const int shapes[][2] = {{2048, 2048}, {2048, 8192}, {8192, 2048}, {4096, 4096}, {14336, 4096}};
    const int N = 512, ns = sizeof shapes / sizeof *shapes;
    printf(
        "AVX512-BF16 GEMM, %d rows, %d thread(s), best of %d rounds: k chunks of %d (inputs above %d) vs whole rows\n",
        N, th, rounds, kc, 2 * kc);
    printf("%6s %6s  %10s %10s  %6s  %s\n", "in", "out", "chunked", "whole", "ratio", "same bits");
    for (int s = 0; s < ns; s++) {
        int in = shapes[s][0], out = shapes[s][1];
        float *X = malloc(sizeof(float) * N * in), *Y0 = malloc(sizeof(float) * N * out),
              *Y1 = malloc(sizeof(float) * N * out);
        uint16_t *W = malloc(2 * (size_t)in * out), *xp = malloc(2 * ac_avx512bf16_pack_size(N, in));
        if (!X || !Y0 || !Y1 || !W || !xp) {
            fprintf(stderr, "out of memory\n");
            return 1;
        }
        unsigned r = 12345;
        for (size_t i = 0; i < (size_t)N * in; i++)
            X[i] = (float)((r = r * 1103515245u + 12345u) >> 8) / 16777216.0f - 0.5f;
        for (size_t i = 0; i < (size_t)in * out; i++) {
            float f = (float)((r = r * 1103515245u + 12345u) >> 8) / 16777216.0f - 0.5f;
            uint32_t u;
            memcpy(&u, &f, 4);
            W[i] = (uint16_t)(u >> 16);
        }
        double tc = 1e30, tw = 1e30;
        for (int k = 0; k < rounds; k++) {
            if (k & 1) {
                tw = fmin(tw, time_call(Y1, X, W, N, in, out, xp, th, 0));
                tc = fmin(tc, time_call(Y0, X, W, N, in, out, xp, th, kc));
            } else {
                tc = fmin(tc, time_call(Y0, X, W, N, in, out, xp, th, kc));
                tw = fmin(tw, time_call(Y1, X, W, N, in, out, xp, th, 0));
            }
        }
        double fl = 2.0 * N * in * out;
        printf("%6d %6d  %10.1f %10.1f  %6.2f  %s\n", in, out, fl / tc * 1e-9, fl / tw * 1e-9, tw / tc,
               memcmp(Y0, Y1, sizeof(float) * N * out) ? "NO" : "yes");
        free(X), free(Y0), free(Y1), free(W), free(xp);
    }
    ac_avx512bf16_set_kchunk(1024);
    printf("(GFLOP/s; ratio = whole-row time / chunked time)\n");
    return 0;
}
