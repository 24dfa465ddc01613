/*
 * kernels_avx512bf16.c - see kernels_avx512bf16.h.
 *
 * Layout: Y[m][n] is the dot product of row m of X with row n of W, both
 * contiguous along k, so no weight is repacked: X is converted once into
 * BF16 rows padded to Kp (a multiple of 32, zeros past `in`), and a micro-
 * kernel keeps RM x RN accumulators of 16 fp32 lanes, each VDPBF16PS adding
 * 32 products (a pair per lane) of one X row and one W row, over the whole
 * k range; the 16 lanes are summed when the tile is stored. Cache blocking:
 * rows of X in blocks that fit the L2 (`row_block`), and for each block
 * every RN-row group of W the thread owns, which stays in L1 while the
 * block's rows pass over it. RM = 4, RN = 6: 24 accumulators, 6 weight
 * vectors and one X vector fill 31 of the 32 ZMM registers.
 *
 * Wide inputs (K above 2 * KCHUNK, such as down_proj's 8192) go in k
 * chunks of KCHUNK, and the row block is sized by the chunk: with whole
 * rows a block of X in L2 held few rows (24 at K = 8192), so the weights,
 * too large for any cache, were read from memory once per 24 rows, and a
 * group's 6 weight rows (96 KiB) did not stay in L1 across the block's
 * tiles either (216 GFLOP/s against 333 at K = 2048 on one Zen 4 thread).
 * Between chunks a tile's 24 accumulator vectors wait in a scratch buffer,
 * lane for lane, so every lane adds its products in the same order as
 * without chunks: the results are the same bits.
 */
#include "runtime/kernels_avx512bf16.h"

#include "kthreads_int.h"

#include <pthread.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && __GNUC__ >= 11
#include <cpuid.h>
#include <immintrin.h>
#define AC_HAVE_AVX512BF16 1
#endif

#define RM 4
#define RN 6
#define KCHUNK 1024 /* multiple of 32 */

static int kchunk = KCHUNK; /* 0: whole rows (ac_avx512bf16_set_kchunk, for bench_gemm_bf16) */

static int dp_ok;
static pthread_once_t dp_once = PTHREAD_ONCE_INIT;

#ifdef AC_HAVE_AVX512BF16
static unsigned long long xcr0(void) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
#endif

static void dp_probe(void) {
#ifdef AC_HAVE_AVX512BF16
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return; /* OSXSAVE */
    if ((xcr0() & 0xe6) != 0xe6) return;                             /* SSE, AVX, opmask, ZMM state saved */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((b >> 16) & 1) || !((b >> 30) & 1))
        return; /* AVX512F, AVX512BW (the masked 16-bit loads) */
    if (a < 1 || !__get_cpuid_count(7, 1, &a, &b, &c, &d)) return;
    dp_ok = (a >> 5) & 1; /* AVX512_BF16 */
#endif
}

int ac_avx512bf16_available(void) {
    pthread_once(&dp_once, dp_probe);
    return dp_ok;
}

static int pad32(int x) { return (x + 31) / 32 * 32; }

size_t ac_avx512bf16_pack_size(int N, int in) { return (size_t)(N > 0 ? N : 1) * (size_t)pad32(in > 0 ? in : 1); }

typedef struct {
    float *Y;
    const uint16_t *W, *xp;
    const float *b;
    int N, K, Kp, out, acc, g0, g1; /* groups [g0, g1) of RN output columns */
} dp_job;

#ifdef AC_HAVE_AVX512BF16
#define DP_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))

/* xp[m * Kp + k] = bf16(X[m][k]) (round to nearest even), 0 for k >= K. */
DP_TARGET static void pack_x(uint16_t *xp, const float *X, int N, int K, int Kp) {
    for (int m = 0; m < N; m++) {
        const float *x = X + (size_t)m * K;
        uint16_t *o = xp + (size_t)m * Kp;
        for (int k = 0; k < Kp; k += 32) {
            int r = K - k;
            __mmask16 lo = r >= 16 ? 0xffff : r > 0 ? (__mmask16)((1u << r) - 1) : 0;
            __mmask16 hi = r >= 32 ? 0xffff : r > 16 ? (__mmask16)((1u << (r - 16)) - 1) : 0;
            __m512 a = _mm512_maskz_loadu_ps(lo, x + k), c = _mm512_maskz_loadu_ps(hi, x + k + 16);
            _mm512_storeu_si512((void *)(o + k), (__m512i)_mm512_cvtne2ps_pbh(c, a));
        }
    }
}

/* The rm x rn tile at rows m0.., columns n0.., over k in [k0, k1) (k0 a
 * multiple of 32; k1 = K on the last chunk): rm, rn are constants where
 * this is inlined (dispatch), so the accumulators stay in registers. acc:
 * the tile's accumulators between chunks (read unless k0 = 0, written
 * unless k1 = K, where the tile is summed and stored instead). */
DP_TARGET static inline __attribute__((always_inline)) void tile(const dp_job *j, int m0, int n0, const int rm,
                                                                 const int rn, int k0, int k1, __m512 *acc) {
    __m512 c[RM][RN];
    const uint16_t *w[RN], *x[RM];
#pragma GCC unroll 8
    for (int i = 0; i < rm; i++) {
        x[i] = j->xp + (size_t)(m0 + i) * j->Kp;
#pragma GCC unroll 8
        for (int q = 0; q < rn; q++) c[i][q] = k0 ? _mm512_load_ps(&acc[i * RN + q]) : _mm512_setzero_ps();
    }
#pragma GCC unroll 8
    for (int q = 0; q < rn; q++) w[q] = j->W + (size_t)(n0 + q) * j->K;
    int K = j->K, kf = k1 < K ? k1 : K & ~31;
    for (int k = k0; k < kf; k += 32) {
        __m512i wv[RN];
#pragma GCC unroll 8
        for (int q = 0; q < rn; q++) wv[q] = _mm512_loadu_si512((const void *)(w[q] + k));
#pragma GCC unroll 8
        for (int i = 0; i < rm; i++) {
            __m512i xv = _mm512_loadu_si512((const void *)(x[i] + k));
#pragma GCC unroll 8
            for (int q = 0; q < rn; q++) c[i][q] = _mm512_dpbf16_ps(c[i][q], (__m512bh)xv, (__m512bh)wv[q]);
        }
    }
    if (k1 < K) {
#pragma GCC unroll 8
        for (int i = 0; i < rm; i++)
#pragma GCC unroll 8
            for (int q = 0; q < rn; q++) _mm512_store_ps(&acc[i * RN + q], c[i][q]);
        return;
    }
    if (kf < K) { /* the last k < 32: W masked (never read past a row), X is zero-padded */
        __mmask32 mk = (__mmask32)((1u << (K - kf)) - 1);
        __m512i wv[RN];
#pragma GCC unroll 8
        for (int q = 0; q < rn; q++) wv[q] = _mm512_maskz_loadu_epi16(mk, w[q] + kf);
#pragma GCC unroll 8
        for (int i = 0; i < rm; i++) {
            __m512i xv = _mm512_loadu_si512((const void *)(x[i] + kf));
#pragma GCC unroll 8
            for (int q = 0; q < rn; q++) c[i][q] = _mm512_dpbf16_ps(c[i][q], (__m512bh)xv, (__m512bh)wv[q]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < rm; i++) {
        float *y = j->Y + (size_t)(m0 + i) * j->out + n0;
#pragma GCC unroll 8
        for (int q = 0; q < rn; q++) {
            float s = _mm512_reduce_add_ps(c[i][q]);
            if (j->b) s += j->b[n0 + q];
            y[q] = j->acc ? y[q] + s : s;
        }
    }
}

#define TILE_CASE(r, n)                                                                                                \
    case (r)*8 + (n):                                                                                                  \
        tile(j, m0, n0, r, n, k0, k1, acc);                                                                            \
        break
#define TILE_ROW(r)                                                                                                    \
    TILE_CASE(r, 1);                                                                                                   \
    TILE_CASE(r, 2);                                                                                                   \
    TILE_CASE(r, 3);                                                                                                   \
    TILE_CASE(r, 4);                                                                                                   \
    TILE_CASE(r, 5);                                                                                                   \
    TILE_CASE(r, 6)

DP_TARGET static void dispatch(const dp_job *j, int m0, int n0, int rm, int rn, int k0, int k1, __m512 *acc) {
    switch (rm * 8 + rn) {
        TILE_ROW(1);
        TILE_ROW(2);
        TILE_ROW(3);
        TILE_ROW(4);
    default: break;
    }
}

/* Rows of X per cache block: about 384 KiB of BF16, at least RM. */
static int row_block(int Kp) {
    int mb = 393216 / (2 * Kp) / RM * RM;
    return mb < RM ? RM : mb;
}

/* The most row tiles of a block when K is chunked (the block is capped to
 * them for chunks below KCHUNK): their accumulators wait between chunks,
 * 72 KiB on the thread's stack. */
#define MAX_CHUNKED_TILES (393216 / (2 * KCHUNK) / RM)

static void *dp_run(void *arg) {
    const dp_job *j = arg;
    int K = j->K, KC = kchunk > 0 && K > 2 * kchunk ? kchunk : K;
    /* the block of X rows fits the L2 by its chunk when chunked, so W,
     * which fits no cache at these widths, is read once per block: whole
     * rows of 14336 made blocks of 12 rows, and W was read 43 times for
     * 512 rows */
    int MB = row_block(KC < K ? KC : j->Kp);
    if (KC < K && MB > MAX_CHUNKED_TILES * RM) MB = MAX_CHUNKED_TILES * RM;
    __m512 acc[MAX_CHUNKED_TILES * RM * RN];
    for (int mb = 0; mb < j->N; mb += MB) {
        int me = mb + MB < j->N ? mb + MB : j->N;
        for (int g = j->g0; g < j->g1; g++) {
            int n0 = g * RN, rn = j->out - n0 < RN ? j->out - n0 : RN;
            for (int k0 = 0; k0 < K; k0 += KC) {
                int k1 = K - k0 > KC ? k0 + KC : K;
                for (int m0 = mb; m0 < me; m0 += RM) /* acc is used when K is chunked only (its block is capped) */
                    dispatch(j, m0, n0, me - m0 < RM ? me - m0 : RM, rn, k0, k1,
                             KC < K ? &acc[(m0 - mb) / RM * RM * RN] : acc);
            }
        }
    }
    return NULL;
}
#endif

void ac_avx512bf16_set_kchunk(int k) { kchunk = k > 0 ? (k + 31) / 32 * 32 : 0; }

int ac_avx512bf16_linear(float *Y, const float *X, const uint16_t *W, const float *b, int N, int in, int out, int acc,
                         uint16_t *xpack, int threads) {
#ifdef AC_HAVE_AVX512BF16
    if (!ac_avx512bf16_available() || N <= 0 || in <= 0 || out <= 0) return -1;
    int Kp = pad32(in);
    pack_x(xpack, X, N, in, Kp);
    int G = (out + RN - 1) / RN, T = ac_kthreads_gemm(threads, G, (double)N * in * out);
    dp_job jobs[AC_KTHREADS_MAX];
    for (int t = 0; t < T; t++)
        jobs[t] = (dp_job){Y, W, xpack, b, N, in, Kp, out, acc, (int)((long)G * t / T), (int)((long)G * (t + 1) / T)};
    ac_kthreads_run(dp_run, jobs, sizeof *jobs, T);
    return 0;
#else
    (void)Y, (void)X, (void)W, (void)b, (void)N, (void)in, (void)out, (void)acc, (void)xpack, (void)threads;
    return -1;
#endif
}
