/*
 * kernels_amx.c - see kernels_amx_int.h.
 *
 * Layout: we compute Y^T tile by tile, C[n][m] = sum_k W[n][k] X[m][k], so
 * that the weight tile (16 rows of W, 32 k) is loaded straight from the
 * mapped row-major matrix as the A operand, and only X is repacked: B tiles
 * hold, for 16 k-pairs x 16 rows m, the pair X[m][2p], X[m][2p+1] (the
 * "VNNI" layout TDPBF16PS wants). Each thread owns strips of 32 output
 * columns (two A tiles) and walks all rows m in blocks of 32 (two B tiles),
 * four C tiles accumulating over k; each C tile (16 n x 16 m) is transposed
 * in AVX-512 registers on its way into rows of Y.
 */
#include "kernels_amx_int.h"

#include "kthreads_int.h"

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
    (void)threads; /* the packing of X is shared by the threads */
    return (size_t)pad(N > 0 ? N : 1, 32) * (size_t)pad(in, 32);
}

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* xp[(mb*KB + kb)*512 + p*32 + r*2 + j] = bf16(X[mb*16 + r][kb*32 + 2p + j]), zero past N. */
static void pack_x(uint16_t *xp, const float *X, int N, int K) {
    int KB = K / 32, MB = pad(N, 32) / 16;
    for (int mb = 0; mb < MB; mb++)
        for (int r = 0; r < 16; r++) {
            int m = mb * 16 + r;
            const float *xr = X + (size_t)m * K;
            for (int kb = 0; kb < KB; kb++) {
                uint16_t *t = xp + ((size_t)mb * KB + kb) * 512 + r * 2;
                for (int p = 0; p < 16; p++) {
                    t[p * 32] = m < N ? to_bf16(xr[kb * 32 + 2 * p]) : 0;
                    t[p * 32 + 1] = m < N ? to_bf16(xr[kb * 32 + 2 * p + 1]) : 0;
                }
            }
        }
}

typedef struct {
    float *Y;
    const uint16_t *W, *xp;
    const float *b;
    int N, K, out, acc, s0, s1; /* strips [s0, s1) of 32 output columns (the last may be 16) */
} amx_job;

#ifdef AC_HAVE_AMX
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;

/* Y[m0 + r][n0 + i] (+)= c[i][r] (+ b[n0 + i]) for the rows m0 + r < N:
 * the C tile transposed in registers. */
__attribute__((target("avx512f"))) static void store_c(const amx_job *j, const float c[16][16], int n0, int m0) {
    __m512i r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_load_si512((const void *)c[i]);
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
    __m512 bias = j->b ? _mm512_loadu_ps(j->b + n0) : _mm512_setzero_ps();
    for (int i = 0; i < 16 && m0 + i < j->N; i++) {
        float *y = j->Y + (size_t)(m0 + i) * j->out + n0;
        __m512 v = _mm512_add_ps(_mm512_castsi512_ps(r[i]), bias);
        if (j->acc) v = _mm512_add_ps(v, _mm512_loadu_ps(y));
        _mm512_storeu_ps(y, v);
    }
}

__attribute__((target("amx-tile,amx-bf16"))) static void *amx_run(void *arg) {
    const amx_job *j = arg;
    tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    _tile_loadconfig(&cfg);
    int KB = j->K / 32, MB2 = pad(j->N, 32) / 32;
    size_t ldw = (size_t)j->K * 2;
    float c[4][16][16] __attribute__((aligned(64)));
    for (int s = j->s0; s < j->s1; s++) {
        int n0 = s * 32, two = n0 + 32 <= j->out;
        const uint16_t *w0 = j->W + (size_t)n0 * j->K, *w1 = two ? w0 + (size_t)16 * j->K : w0;
        for (int mb = 0; mb < MB2; mb++) {
            const uint16_t *b0 = j->xp + (size_t)(2 * mb) * KB * 512, *b1 = b0 + (size_t)KB * 512;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int kb = 0; kb < KB; kb++) {
                _tile_loadd(4, w0 + kb * 32, ldw);
                _tile_loadd(5, w1 + kb * 32, ldw);
                _tile_loadd(6, b0 + (size_t)kb * 512, 64);
                _tile_loadd(7, b1 + (size_t)kb * 512, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            _tile_stored(0, c[0], 64);
            _tile_stored(1, c[1], 64);
            _tile_stored(2, c[2], 64);
            _tile_stored(3, c[3], 64);
            store_c(j, c[0], n0, mb * 32);
            store_c(j, c[1], n0, mb * 32 + 16);
            if (two) store_c(j, c[2], n0 + 16, mb * 32), store_c(j, c[3], n0 + 16, mb * 32 + 16);
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
    int S = (out + 31) / 32, T = ac_kthreads_gemm(threads, S, (double)N * in * out);
    amx_job jobs[AC_KTHREADS_MAX];
    for (int t = 0; t < T; t++)
        jobs[t] = (amx_job){Y, W, xpack, b, N, in, out, acc, (int)((long)S * t / T), (int)((long)S * (t + 1) / T)};
    ac_kthreads_run(amx_run, jobs, sizeof *jobs, T);
    return 0;
#else
    (void)Y, (void)X, (void)W, (void)b, (void)N, (void)in, (void)out, (void)acc, (void)xpack, (void)threads;
    return -1;
#endif
}
