/* tensor.c - see tensor.h. */
#include "core/tensor.h"

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include <math.h>
#include <string.h>

float ac_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t ac_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

float ac_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0)
            u = sign;
        else { /* subnormal: renormalise */
            int sh = 0;
            while (!(man & 0x400)) {
                man <<= 1;
                sh++;
            }
            man &= 0x3ff;
            u = sign | ((uint32_t)(127 - 15 - sh + 1) << 23) | (man << 13);
        }
    } else if (exp == 31)
        u = sign | 0x7f800000 | (man << 13);
    else
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t ac_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffff;
    if (a > 0x7f800000) return sign | 0x7e00;
    if (a >= 0x477ff000) return sign | 0x7c00; /* overflow to inf (after rounding) */
    if (a < 0x38800000) {                      /* subnormal or zero */
        if (a < 0x33000000) return sign;
        uint32_t man = (a & 0x7fffff) | 0x800000;
        int shift = 113 - (int)(a >> 23) + 13;
        uint32_t r = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return sign | (uint16_t)r;
    }
    uint32_t r = a - 0x38000000; /* rebias exponent */
    r += 0xfff + ((r >> 13) & 1);
    return sign | (uint16_t)(r >> 13);
}

/* The i-th 16-bit value at src, which need not be 2-byte aligned (a GGUF
 * tensor's offset is the file's word; a load through uint16_t * would be
 * undefined there). Compiles to one load on x86. */
static inline uint16_t u16_at(const void *src, size_t i) {
    uint16_t v;
    memcpy(&v, (const unsigned char *)src + 2 * i, 2);
    return v;
}

int ac_to_f32(float *dst, const void *src, st_dtype dt, size_t n, ac_err *e) {
    switch (dt) {
    case ST_F32: memcpy(dst, src, n * 4); return 0;
    case ST_BF16: {
        size_t i = 0;
#ifdef __SSE2__
        /* 8 at a time: each value's 16 bits above 16 zero bits (SSE2, baseline on x86-64) */
        for (__m128i z = _mm_setzero_si128(); i + 8 <= n; i += 8) {
            __m128i v = _mm_loadu_si128((const __m128i *)((const unsigned char *)src + 2 * i));
            _mm_storeu_si128((__m128i *)(dst + i), _mm_unpacklo_epi16(z, v));
            _mm_storeu_si128((__m128i *)(dst + i + 4), _mm_unpackhi_epi16(z, v));
        }
#endif
        for (; i < n; i++) dst[i] = ac_bf16_to_f32(u16_at(src, i));
        return 0;
    }
    case ST_F16:
        for (size_t i = 0; i < n; i++) dst[i] = ac_f16_to_f32(u16_at(src, i));
        return 0;
    default: return ac_errf(e, "unsupported weight dtype %s (need F32, F16 or BF16)", st_dtype_name(dt));
    }
}

int ac_from_f32(void *dst, const float *src, st_dtype dt, size_t n, ac_err *e) {
    uint16_t *h = dst;
    switch (dt) {
    case ST_F32: memcpy(dst, src, n * 4); return 0;
    case ST_BF16:
        for (size_t i = 0; i < n; i++) h[i] = ac_f32_to_bf16(src[i]);
        return 0;
    case ST_F16:
        for (size_t i = 0; i < n; i++) h[i] = ac_f32_to_f16(src[i]);
        return 0;
    default: return ac_errf(e, "cannot write dtype %s", st_dtype_name(dt));
    }
}

int ac_convert(void *dst, st_dtype dd, const void *src, st_dtype sd, size_t n, ac_err *e) {
    if (sd == ST_F32) return ac_from_f32(dst, src, dd, n, e);
    if (dd == ST_F32) return ac_to_f32(dst, src, sd, n, e);
    if (sd == dd && (sd == ST_BF16 || sd == ST_F16)) {
        memcpy(dst, src, n * 2);
        return 0;
    }
    float buf[1024];
    for (size_t i = 0; i < n; i += 1024) {
        size_t c = n - i < 1024 ? n - i : 1024;
        if (ac_to_f32(buf, (const uint16_t *)src + i, sd, c, e) || ac_from_f32((uint16_t *)dst + i, buf, dd, c, e))
            return -1;
    }
    return 0;
}
