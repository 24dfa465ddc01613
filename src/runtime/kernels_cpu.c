/* kernels_cpu.c - see kernels_cpu.h. */
#include "runtime/kernels_cpu.h"

#include <cblas.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_amx_int.h"
#include "runtime/kernels_avx512bf16.h"
#include "kthreads_int.h"
#include "core/tensor.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define AC_HAVE_GEMV_AVX2 1
#endif

void openblas_set_num_threads(int);

static int n_threads = 1, bf16_rows = 32;

void ac_set_threads(int n) {
    n_threads = n > 0 ? n : 1;
    openblas_set_num_threads(n_threads);
}

int ac_kernels_threads(void) { return n_threads; }

void ac_blas_threads(int n) { openblas_set_num_threads(n > 0 ? n : 1); }

int ac_blas_one_for_bf16(int wdt, int N) {
    int one = wdt == ST_BF16 && n_threads > 1 && ac_bf16_fast_rows(N);
    if (one) ac_blas_threads(1);
    return one;
}

void ac_blas_restore(int one) {
    if (one) ac_blas_threads(n_threads);
}

/* AC_BF16_AUTO until ac_set_bf16_kernel names one */
static int bf16_kernel = AC_BF16_AUTO;

int ac_bf16_kernel_available(int k) {
    switch (k) {
    case AC_BF16_AMX: return ac_amx_available();
    case AC_BF16_AVX512: return ac_avx512bf16_available();
    case AC_BF16_NONE: return 1;
    default: return 0;
    }
}

int ac_bf16_kernel(void) {
    if (bf16_kernel != AC_BF16_AUTO) return bf16_kernel;
    return ac_amx_available() ? AC_BF16_AMX : ac_avx512bf16_available() ? AC_BF16_AVX512 : AC_BF16_NONE;
}

int ac_set_bf16_kernel(int k) {
    if (k != AC_BF16_AUTO && !ac_bf16_kernel_available(k)) return -1;
    bf16_kernel = k;
    return 0;
}

const char *ac_bf16_kernel_name(int k) {
    return k == AC_BF16_AMX ? "amx" : k == AC_BF16_AVX512 ? "avx512bf16" : k == AC_BF16_NONE ? "none" : "auto";
}

int ac_bf16_fast_rows(int N) { return bf16_rows > 0 && N >= bf16_rows && ac_bf16_kernel() != AC_BF16_NONE; }

void ac_set_bf16_gemm_rows(int rows) { bf16_rows = rows < 0 ? 0 : rows; }

int ac_bf16_gemm_rows(void) { return bf16_rows; }

#define WTILE_FLOATS (64 * 1024) /* 256 KB of converted weight rows: stays in L2 */

/* ---------------------------------------------------------------- BF16 decode GEMV
 *
 * Decode steps (N < 32 rows) over BF16 weights, read in place: each weight
 * widened to fp32 exactly (a 16-bit shift) and multiplied with the fp32
 * activations by FMA, 8 lanes of partial sums per output added at the end:
 * fp32 arithmetic on the exact weights (no activation rounding), summed in
 * another order than sgemm. The per-tile path it replaces converted every
 * weight into a scratch on one thread and called sgemm per 256-KB tile
 * (about 1 ns a weight on the AMD EPYC machine: decode ran 4-6x slower
 * than on fp32 weights); this reads 2 bytes a weight once. Output rows are
 * split over the threads when a call has at least GEMV_THREAD_WEIGHTS
 * weights (kthreads starts threads per call: tens of microseconds). */
#define GEMV_MAX_ROWS 8
#define GEMV_THREAD_WEIGHTS (1 << 19)

#ifdef AC_HAVE_GEMV_AVX2
static int gemv_ok;
static pthread_once_t gemv_once = PTHREAD_ONCE_INIT;
static void gemv_probe(void) {
    __builtin_cpu_init();
    gemv_ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
static int gemv_available(void) {
    pthread_once(&gemv_once, gemv_probe);
    return gemv_ok;
}

typedef struct {
    float *Y;
    const float *X;
    const uint16_t *W;
    int N, in, out, acc, j0, j1;
} gemv_job;

__attribute__((target("avx2,fma"))) static inline __m256 widen8(const uint16_t *w) {
    __m128i h = _mm_loadu_si128((const __m128i *)w);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx2,fma"))) static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* Output j of all N rows with CH independent FMA chains per row (a
 * single chain waits on the FMA's latency: 1-2 rows need 4 chains to keep
 * the loads busy, 3-4 rows 2; 5-8 rows are independent enough). The
 * weight row is read once, each 8-wide piece widened once. */
__attribute__((target("avx2,fma"), always_inline)) static inline void gemv_out(const gemv_job *g, int j, int CH) {
    int K = g->in, N = g->N, KS = K / (8 * CH) * (8 * CH), K8 = K & ~7;
    const uint16_t *w = g->W + (size_t)j * K;
    __m256 acc[GEMV_MAX_ROWS * 4];
    for (int i = 0; i < N * CH; i++) acc[i] = _mm256_setzero_ps();
    for (int k = 0; k < KS; k += 8 * CH)
        for (int c = 0; c < CH; c++) {
            __m256 wv = widen8(w + k + 8 * c);
            for (int r = 0; r < N; r++)
                acc[r * CH + c] = _mm256_fmadd_ps(_mm256_loadu_ps(g->X + (size_t)r * K + k + 8 * c), wv, acc[r * CH + c]);
        }
    for (int k = KS; k < K8; k += 8) {
        __m256 wv = widen8(w + k);
        for (int r = 0; r < N; r++) acc[r * CH] = _mm256_fmadd_ps(_mm256_loadu_ps(g->X + (size_t)r * K + k), wv, acc[r * CH]);
    }
    for (int r = 0; r < N; r++) {
        __m256 v = acc[r * CH];
        for (int c = 1; c < CH; c++) v = _mm256_add_ps(v, acc[r * CH + c]);
        float sum = hsum8(v);
        for (int k = K8; k < K; k++) sum += g->X[(size_t)r * K + k] * ac_bf16_to_f32(w[k]);
        float *y = g->Y + (size_t)r * g->out + j;
        *y = g->acc ? *y + sum : sum;
    }
}

/* Outputs j0..j1 of all N rows. */
__attribute__((target("avx2,fma"))) static void *gemv_run(void *arg) {
    const gemv_job *g = arg;
    for (int j = g->j0; j < g->j1; j++) {
        if (g->N <= 2)
            gemv_out(g, j, 4);
        else if (g->N <= 4)
            gemv_out(g, j, 2);
        else
            gemv_out(g, j, 1);
    }
    return NULL;
}

/* Y[N,out] (+)= X W^T for N <= GEMV_MAX_ROWS; -1 when this CPU lacks AVX2/FMA. */
static int bf16_gemv(float *Y, const float *X, const uint16_t *W, int N, int in, int out, int acc) {
    if (N > GEMV_MAX_ROWS || !gemv_available()) return -1;
    int T = (size_t)in * out >= GEMV_THREAD_WEIGHTS ? ac_kthreads_count(n_threads, out) : 1;
    gemv_job jobs[AC_KTHREADS_MAX];
    for (int t = 0; t < T; t++)
        jobs[t] = (gemv_job){Y, X, W, N, in, out, acc, (int)((long)out * t / T), (int)((long)out * (t + 1) / T)};
    if (T == 1)
        gemv_run(&jobs[0]);
    else
        ac_kthreads_run(gemv_run, jobs, sizeof *jobs, T);
    return 0;
}
#else
static int bf16_gemv(float *Y, const float *X, const uint16_t *W, int N, int in, int out, int acc) {
    (void)Y, (void)X, (void)W, (void)N, (void)in, (void)out, (void)acc;
    return -1;
}
#endif

int ac_bf16_gemv_rows(int N) { return bf16_rows > 0 && N <= GEMV_MAX_ROWS && !ac_bf16_fast_rows(N); }

int ac_wscratch_alloc(ac_wscratch *s, int N, int in) {
    memset(s, 0, sizeof *s);
    s->wtile_n = WTILE_FLOATS > (size_t)in ? WTILE_FLOATS : (size_t)in;
    s->wtile = malloc(s->wtile_n * 4);
    /* either BF16 kernel may be chosen later (ac_set_bf16_kernel): room for the larger packing */
    if (ac_amx_available()) s->xpack_n = ac_amx_pack_size(N, in, n_threads);
    if (ac_avx512bf16_available() && ac_avx512bf16_pack_size(N, in) > s->xpack_n)
        s->xpack_n = ac_avx512bf16_pack_size(N, in);
    if (s->xpack_n) s->xpack = malloc(s->xpack_n * 2);
    if (!s->wtile || (s->xpack_n && !s->xpack)) {
        ac_wscratch_free(s);
        return -1;
    }
    return 0;
}

void ac_wscratch_free(ac_wscratch *s) {
    free(s->wtile);
    free(s->xpack);
    memset(s, 0, sizeof *s);
}

void ac_row_f32(float *dst, const void *W, int wdt, size_t r, int n) {
    if (wdt == ST_BF16 || wdt == ST_F16)
        ac_to_f32(dst, (const uint16_t *)W + r * n, (st_dtype)wdt, n, NULL);
    else
        memcpy(dst, (const float *)W + r * n, (size_t)n * 4);
}

void ac_linear_w(float *Y, const float *X, const void *W, int wdt, const float *b, int N, int in, int out, int acc,
                 ac_wscratch *s) {
    if (wdt != ST_BF16 && wdt != ST_F16) {
        if (acc && !b)
            ac_linear_acc(Y, X, W, N, in, out);
        else if (!acc)
            ac_linear(Y, X, W, b, N, in, out);
        else {
            for (int r = 0; r < N; r++)
                for (int j = 0; j < out; j++) Y[(long)r * out + j] += b[j];
            ac_linear_acc(Y, X, W, N, in, out);
        }
        return;
    }
    if (wdt == ST_BF16 && s->xpack && ac_bf16_fast_rows(N)) {
        int k = ac_bf16_kernel();
        if (k == AC_BF16_AMX && ac_amx_pack_size(N, in, n_threads) <= s->xpack_n &&
            ac_amx_linear(Y, X, W, b, N, in, out, acc, s->xpack, n_threads) == 0)
            return;
        /* shapes AMX leaves (in % 32, out % 16) go to AVX512-BF16 where the CPU has it */
        if ((k == AC_BF16_AVX512 || ac_avx512bf16_available()) && ac_avx512bf16_pack_size(N, in) <= s->xpack_n &&
            ac_avx512bf16_linear(Y, X, W, b, N, in, out, acc, s->xpack, n_threads) == 0)
            return;
    }
    /* per tile of T weight rows: convert, then Y[:, j0:j0+T] (+)= X W_tile^T */
    int T = (int)(s->wtile_n / (size_t)in);
    if (T > out) T = out;
    if (b) {
        for (int r = 0; r < N; r++)
            for (int j = 0; j < out; j++) Y[(long)r * out + j] = (acc ? Y[(long)r * out + j] : 0) + b[j];
        acc = 1;
    }
    /* decode steps: the GEMV reading the BF16 weights in place (above) */
    if (wdt == ST_BF16 && ac_bf16_gemv_rows(N) && bf16_gemv(Y, X, W, N, in, out, acc) == 0) return;
    for (int j0 = 0; j0 < out; j0 += T) {
        int t = out - j0 < T ? out - j0 : T;
        ac_to_f32(s->wtile, (const uint16_t *)W + (size_t)j0 * in, (st_dtype)wdt, (size_t)t * in, NULL);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, t, in, 1.0f, X, in, s->wtile, in, acc ? 1.0f : 0.0f,
                    Y + j0, out);
    }
}

void ac_linear(float *Y, const float *X, const float *W, const float *b, int N, int in, int out) {
    if (b) {
        for (int r = 0; r < N; r++)
            for (int j = 0; j < out; j++) Y[(long)r * out + j] = b[j];
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, out, in, 1.0f, X, in, W, in, b ? 1.0f : 0.0f, Y, out);
}

void ac_linear_acc(float *Y, const float *X, const float *W, int N, int in, int out) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, out, in, 1.0f, X, in, W, in, 1.0f, Y, out);
}

void ac_rmsnorm(float *out, const float *x, const float *w, int N, int H, float eps) {
    for (int r = 0; r < N; r++) {
        const float *xr = x + (long)r * H;
        float *o = out + (long)r * H;
        double ss = 0;
        for (int i = 0; i < H; i++) ss += (double)xr[i] * xr[i];
        float s = (float)(1.0 / sqrt(ss / H + eps));
        for (int i = 0; i < H; i++) o[i] = xr[i] * s * w[i];
    }
}

void ac_rope(float *x, int N, int nh, int hd, const int *pos, const float *cos_t, const float *sin_t) {
    int half = hd / 2;
    for (int r = 0; r < N; r++) {
        const float *c = cos_t + (long)pos[r] * half, *s = sin_t + (long)pos[r] * half;
        for (int h = 0; h < nh; h++) {
            float *v = x + (long)r * nh * hd + (long)h * hd;
            for (int i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * c[i] - b * s[i];
                v[i + half] = b * c[i] + a * s[i];
            }
        }
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define AC_HAVE_AVX512 1

/* e^x for 16 floats: Cephes' expf (n = round(x log2 e), r = x - n ln 2 in two
 * parts, degree-6 polynomial, times 2^n); relative error ~1e-7. */
__attribute__((target("avx512f"))) static inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.33654f)), _mm512_set1_ps(88.72283f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500E-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

__attribute__((target("avx512f"))) static long silu_mul16(float *g, const float *u, long n) {
    long i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(g + i);
        __m512 d = _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), x)));
        _mm512_storeu_ps(g + i, _mm512_mul_ps(_mm512_div_ps(x, d), _mm512_loadu_ps(u + i)));
    }
    return i;
}

/* x[i] = e^(x[i] - mx) for the first multiple of 16; returns how many and their sum in *sum. */
__attribute__((target("avx512f"))) static int exp_sub16(float *x, int n, float mx, float *sum) {
    __m512 acc = _mm512_setzero_ps(), m = _mm512_set1_ps(mx);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), m));
        _mm512_storeu_ps(x + i, v);
        acc = _mm512_add_ps(acc, v);
    }
    *sum = _mm512_reduce_add_ps(acc);
    return i;
}

/* sum of e^(x[i] - mx) in double over 16-lane fp32 partial sums (x untouched). */
__attribute__((target("avx512f"))) static int sum_exp16(const float *x, int n, float mx, double *sum) {
    __m512 m = _mm512_set1_ps(mx);
    double s = 0;
    int i = 0;
    for (; i + 16 <= n; i += 16) s += _mm512_reduce_add_ps(exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), m)));
    *sum = s;
    return i;
}
#endif

static int have_avx512(void) {
#ifdef AC_HAVE_AVX512
    static int v = -1;
    if (v < 0) v = __builtin_cpu_supports("avx512f") ? 1 : 0;
    return v;
#else
    return 0;
#endif
}

void ac_silu_mul(float *g, const float *u, long n) {
    long i = 0;
#ifdef AC_HAVE_AVX512
    if (have_avx512()) i = silu_mul16(g, u, n);
#endif
    for (; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void ac_softmax(float *x, int n) {
    float mx = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > mx) mx = x[i];
    float s = 0;
    int i = 0;
#ifdef AC_HAVE_AVX512
    if (have_avx512()) i = exp_sub16(x, n, mx, &s);
#endif
    for (; i < n; i++) {
        x[i] = expf(x[i] - mx);
        s += x[i];
    }
    /* Weights under 2 FLT_MIN become 0, not subnormals (nor the ~FLT_MIN
     * that exp16 clamps to): a subnormal costs a microcode assist in every
     * later multiply (the P.V GEMM ran 10-20x slower on peaked rows). */
    float inv = 1.0f / s, tiny = 2 * FLT_MIN * s;
    for (i = 0; i < n; i++) x[i] = x[i] < tiny ? 0.0f : x[i] * inv;
}

double ac_logsumexp(const float *x, int n) {
    float mx = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > mx) mx = x[i];
    double s = 0;
    int i = 0;
#ifdef AC_HAVE_AVX512
    if (have_avx512()) i = sum_exp16(x, n, mx, &s);
#endif
    for (; i < n; i++) s += exp((double)x[i] - mx);
    return log(s) + mx;
}

void ac_rope_inv_freq(float *inv, int hd, float theta, int llama3, float factor, float lo, float hi, int orig) {
    for (int i = 0; i < hd / 2; i++) {
        float f = 1.0f / powf(theta, (float)(2 * i) / (float)hd);
        if (llama3) {
            float lo_wl = orig / lo, hi_wl = orig / hi, wl = 2.0f * (float)M_PI / f;
            if (wl > lo_wl)
                f = f / factor;
            else if (wl >= hi_wl) {
                float s = ((float)orig / wl - lo) / (hi - lo);
                f = (1 - s) * f / factor + s * f;
            }
        }
        inv[i] = f;
    }
}

void ac_attention_head(float *out, const float *q, const float *k, const float *v, int n, int pos0, int hd,
                       int q_stride, int kv_stride, int window, float *scores) {
    int S = pos0 + n;
    float scale = 1.0f / sqrtf((float)hd);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, S, hd, scale, q, q_stride, k, kv_stride, 0.0f, scores, S);
    for (int t = 0; t < n; t++) {
        float *row = scores + (size_t)t * S;
        int vis = pos0 + t + 1, first = window > 0 && vis > window ? vis - window : 0;
        for (int j = 0; j < first; j++) row[j] = 0;
        ac_softmax(row + first, vis - first);
        for (int j = vis; j < S; j++) row[j] = 0;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hd, S, 1.0f, scores, S, v, kv_stride, 0.0f, out,
                q_stride);
}
