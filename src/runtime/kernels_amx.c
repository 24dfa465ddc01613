/*
 * kernels_amx.c - see kernels_amx.h.
 *
 * Layout: C[m][n] = sum_k X[m][k] W[n][k] in 16x16 fp32 tiles. A operand:
 * 16 rows of X converted to BF16 (row-major copy, zero rows past N). B
 * operand: the "VNNI" layout TDPBF16PS wants, for 16 k-pairs x 16 columns n
 * the pair W[n][2p], W[n][2p+1]: each thread packs the 32 weight rows of
 * its current strip once (a 32-bit transpose of 16x16 blocks) and reuses it
 * for every block of 32 rows m; four C tiles (2 x 2) accumulate over k and
 * are stored straight into rows of Y.
 */
#include "kernels_amx.h"

#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__) && defined(__GNUC__) && __GNUC__ >= 11
#include <cpuid.h>
#include <immintrin.h>
#define AC_HAVE_AMX 1
#endif

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static int amx_ok;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void amx_probe(void) {
#ifdef AC_HAVE_AMX
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    if (!((d >> 22) & 1) || !((d >> 24) & 1)) return; /* AMX-BF16, AMX-TILE */
    amx_ok = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#endif
}

int ac_amx_available(void) {
    pthread_once(&amx_once, amx_probe);
    return amx_ok;
}

static int pad(int x, int to) { return (x + to - 1) / to * to; }

size_t ac_amx_pack_size(int N, int in, int threads) {
    return (size_t)pad(N > 0 ? N : 1, 32) * (size_t)pad(in, 32) + (size_t)(threads < 1 ? 1 : threads) * 32 * pad(in, 32);
}

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* xb[m][k] = bf16(X[m][k]) for m < N, zero up to a multiple of 32 rows. */
static void pack_x(uint16_t *xb, const float *X, int N, int K) {
    size_t n = (size_t)N * K, all = (size_t)pad(N, 32) * K;
    for (size_t i = 0; i < n; i++) xb[i] = to_bf16(X[i]);
    memset(xb + n, 0, (all - n) * 2);
}

#ifdef AC_HAVE_AMX
/* dst[i][j] = src[j][i] for 16 x 16 32-bit values; src rows lds bytes apart
 * (any alignment), dst 16 x 16 contiguous. */
__attribute__((target("avx512f"))) static void tr16(uint32_t *dst, const void *src, size_t lds) {
    __m512i r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512((const char *)src + i * lds);
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 4; i++) {
            t[8 * h + i] = _mm512_shuffle_i32x4(r[8 * h + i], r[8 * h + 4 + i], 0x88);
            t[8 * h + 4 + i] = _mm512_shuffle_i32x4(r[8 * h + i], r[8 * h + 4 + i], 0xdd);
        }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0x88);
        r[8 + i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0xdd);
    }
    for (int i = 0; i < 16; i++) _mm512_storeu_si512((void *)(dst + i * 16), r[i]);
}
#endif

/* wp[(kb*2 + t)*512 + p*32 + c*2 + j] = W[n0 + t*16 + c][kb*32 + 2p + j] for
 * the nt (1 or 2) tiles of 16 rows of the strip at n0: per 16 x 16 block of
 * bf16 pairs, a 32-bit transpose. */
static void pack_w(uint32_t *wp, const uint16_t *W, int n0, int nt, int K) {
#ifdef AC_HAVE_AMX
    for (int t = 0; t < nt; t++)
        for (int kb = 0; kb < K / 32; kb++)
            tr16(wp + (size_t)(kb * 2 + t) * 256, W + (size_t)(n0 + t * 16) * K + kb * 32, (size_t)K * 2);
#else
    (void)wp, (void)W, (void)n0, (void)nt, (void)K;
#endif
}

typedef struct {
    float *Y;
    const uint16_t *W, *xb;
    uint32_t *wp; /* this thread's strip buffer */
    const float *b;
    int N, K, out, acc, s0, s1; /* strips [s0, s1) of 32 output columns (the last may be 16) */
} amx_job;

#ifdef AC_HAVE_AMX
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;

/* Y[m0 + r][n0 + i] (+)= c[r][i] (+ b[n0 + i]) for the rows below N. */
static void store_c(const amx_job *j, const float c[16][16], int m0, int n0) {
    const float *b = j->b ? j->b + n0 : NULL;
    for (int r = 0; r < 16 && m0 + r < j->N; r++) {
        float *y = j->Y + (size_t)(m0 + r) * j->out + n0;
        if (j->acc) for (int i = 0; i < 16; i++) y[i] += c[r][i];
        else for (int i = 0; i < 16; i++) y[i] = c[r][i];
        if (b) for (int i = 0; i < 16; i++) y[i] += b[i];
    }
}

__attribute__((target("amx-tile,amx-bf16"))) static void *amx_run(void *arg) {
    const amx_job *j = arg;
    tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    _tile_loadconfig(&cfg);
    int KB = j->K / 32, M32 = pad(j->N, 32);
    size_t lda = (size_t)j->K * 2, ldy = (size_t)j->out * 4;
    float c[4][16][16] __attribute__((aligned(64)));
    for (int s = j->s0; s < j->s1; s++) {
        int n0 = s * 32, two = n0 + 32 <= j->out;
        pack_w(j->wp, j->W, n0, two ? 2 : 1, j->K);
        const uint16_t *wp = (const uint16_t *)j->wp;
        for (int m0 = 0; m0 < M32; m0 += 32) {
            const uint16_t *a0 = j->xb + (size_t)m0 * j->K, *a1 = a0 + (size_t)16 * j->K;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int kb = 0; kb < KB; kb++) {
                _tile_loadd(4, a0 + kb * 32, lda);
                _tile_loadd(5, a1 + kb * 32, lda);
                _tile_loadd(6, wp + (size_t)kb * 1024, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(2, 5, 6);
                if (two) {
                    _tile_loadd(7, wp + (size_t)kb * 1024 + 512, 64);
                    _tile_dpbf16ps(1, 4, 7);
                    _tile_dpbf16ps(3, 5, 7);
                }
            }
            float *y = j->Y + (size_t)m0 * j->out + n0;
            if (!j->acc && !j->b && m0 + 32 <= j->N) { /* straight into Y */
                _tile_stored(0, y, ldy);
                _tile_stored(2, y + (size_t)16 * j->out, ldy);
                if (two) {
                    _tile_stored(1, y + 16, ldy);
                    _tile_stored(3, y + (size_t)16 * j->out + 16, ldy);
                }
                continue;
            }
            _tile_stored(0, c[0], 64);
            _tile_stored(2, c[2], 64);
            store_c(j, c[0], m0, n0);
            store_c(j, c[2], m0 + 16, n0);
            if (two) {
                _tile_stored(1, c[1], 64);
                _tile_stored(3, c[3], 64);
                store_c(j, c[1], m0, n0 + 16);
                store_c(j, c[3], m0 + 16, n0 + 16);
            }
        }
    }
    _tile_release();
    return NULL;
}
#endif

int ac_amx_linear(float *Y, const float *X, const uint16_t *W, const float *b, int N, int in, int out, int acc,
                  uint16_t *xpack, int threads) {
#ifdef AC_HAVE_AMX
    if (!ac_amx_available() || in % 32 || out % 16 || N <= 0) return -1;
    pack_x(xpack, X, N, in);
    uint32_t *wp = (uint32_t *)(void *)(xpack + (size_t)pad(N, 32) * in);
    int S = (out + 31) / 32, T = threads < 1 ? 1 : threads > 16 ? 16 : threads;
    if (T > S) T = S;
    amx_job jobs[16];
    pthread_t th[16];
    int started[16] = {0};
    for (int t = 0; t < T; t++) {
        jobs[t] = (amx_job){Y, W, xpack, wp + (size_t)t * 16 * in, b, N, in, out, acc, (int)((long)S * t / T),
                            (int)((long)S * (t + 1) / T)};
        if (t > 0) started[t] = pthread_create(&th[t], NULL, amx_run, &jobs[t]) == 0;
    }
    amx_run(&jobs[0]);
    for (int t = 1; t < T; t++) {
        if (started[t]) pthread_join(th[t], NULL);
        else amx_run(&jobs[t]); /* no thread: do its share here */
    }
    return 0;
#else
    (void)Y, (void)X, (void)W, (void)b, (void)N, (void)in, (void)out, (void)acc, (void)xpack, (void)threads;
    return -1;
#endif
}
