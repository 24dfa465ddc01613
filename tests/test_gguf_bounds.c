/*
 * test_gguf_bounds.c - the GGUF reader against crafted headers: every count
 * and length an attacker controls (tensor count, metadata count, key and
 * string lengths, array counts, n_dims, dimensions, offsets) is refused
 * with a message saying which, before anything of that size is allocated,
 * and the parse budget refuses a valid file whose tables or tokenizer would
 * need more. The files are built here byte by byte (GGUF v3 as llama.cpp's
 * gguf.cpp reads it), independent of the writer.
 *
 * The largest single allocation is measured by wrapping malloc, calloc and
 * realloc (glibc's __libc_* entries); under AddressSanitizer, which owns the
 * allocator, that measure is skipped and the messages alone are checked.
 */
#include <jansson.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "format/gguf.h"
#include "format/tokenizer.h"

/* ---- the largest allocation made while `tracking` ---- */

#if defined(__SANITIZE_ADDRESS__)
#define ALLOC_PROBE 0
#else
#define ALLOC_PROBE 1
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
static atomic_int tracking;
static atomic_size_t biggest;
static void note(size_t n) {
    if (tracking && n > biggest) biggest = n;
}
void *malloc(size_t n) {
    note(n);
    return __libc_malloc(n);
}
void *calloc(size_t k, size_t n) {
    note(n && k > SIZE_MAX / n ? SIZE_MAX : k * n);
    return __libc_calloc(k, n);
}
void *realloc(void *p, size_t n) {
    note(n);
    return __libc_realloc(p, n);
}
#endif

/* ---- a GGUF v3 file built by hand ---- */

enum { U32 = 4, I32 = 5, F32T = 6, STR = 8, ARR = 9 };

typedef struct {
    unsigned char *p;
    size_t n, cap;
} gb;

static void put(gb *b, const void *x, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, x, n);
    b->n += n;
}
static void p32(gb *b, uint32_t v) { put(b, &v, 4); }
static void p64(gb *b, uint64_t v) { put(b, &v, 8); }
static void pstr(gb *b, const char *s) {
    p64(b, strlen(s));
    put(b, s, strlen(s));
}
static gb header(uint64_t nt, uint64_t nkv) {
    gb b = {0};
    put(&b, "GGUF", 4);
    p32(&b, 3);
    p64(&b, nt);
    p64(&b, nkv);
    return b;
}
static void kv_str(gb *b, const char *k, const char *v) {
    pstr(b, k);
    p32(b, STR);
    pstr(b, v);
}
static void kv_u32(gb *b, const char *k, uint32_t v) {
    pstr(b, k);
    p32(b, U32);
    p32(b, v);
}
static void kv_arr(gb *b, const char *k, uint32_t et, uint64_t n) {
    pstr(b, k);
    p32(b, ARR);
    p32(b, et);
    p64(b, n);
}
static void tinfo(gb *b, const char *name, uint32_t nd, const uint64_t *dims, uint64_t off) {
    pstr(b, name);
    p32(b, nd);
    for (uint32_t d = 0; d < nd; d++) p64(b, dims[d]);
    p32(b, 0); /* F32 */
    p64(b, off);
}
static void pad(gb *b, size_t n) {
    for (size_t i = 0; i < n; i++) put(b, "", 1);
}

/* The reader on b (model and tokenizer) must fail with `want` in its
 * message, allocating less than `most` bytes at once; it also fails the
 * same way from a file. */
static char tmpdir[64];
static void refused(gb *b, const char *what, const char *want, size_t most) {
    ac_err e = {0};
    ac_model m;
    ac_tokenizer *t = NULL;
#if ALLOC_PROBE
    biggest = 0;
    tracking = 1;
#endif
    double t0 = ck_now();
    int rc = ac_gguf_load_buf(b->p, b->n, &m, &t, &e);
    double dt = ck_now() - t0;
#if ALLOC_PROBE
    tracking = 0;
    CHECK(biggest < most, "%s: an allocation of %zu bytes from a %zu-byte file", what, (size_t)biggest, b->n);
#else
    (void)most;
#endif
    CHECK(rc != 0, "%s: loaded", what);
    if (rc == 0) {
        ac_model_free(&m);
        ac_tok_free(t);
        return;
    }
    CHECK(strstr(e.msg, want) != NULL, "%s: message \"%s\" does not say \"%s\"", what, e.msg, want);
    CHECK(dt < 1.0, "%s: %.2f s to refuse", what, dt);
    char path[128];
    snprintf(path, sizeof path, "%s/crafted.gguf", tmpdir);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(b->p, 1, b->n, f) == b->n && !fclose(f), "cannot write %s", path);
    ac_arch a;
    rc = ac_gguf_arch(path, &a, &e);
    CHECK(rc != 0 && strstr(e.msg, want) && strstr(e.msg, "crafted.gguf"), "%s from a file: %s", what,
          rc ? e.msg : "loaded");
    if (!rc) ac_arch_free(&a);
}

/* ---- the counts in the first 24 bytes ---- */

static void test_header_counts(void) {
    /* 2^20 was the old cap: 64 MiB of tensor infos from a 64-byte file */
    gb b = header(1u << 20, 0);
    pad(&b, 40);
    refused(&b, "2^20 tensors", "more than its 64 bytes can hold", 4096);
    free(b.p);
    b = header(0, 1u << 20);
    pad(&b, 40);
    refused(&b, "2^20 metadata entries", "1048576 metadata entries", 4096);
    free(b.p);
    b = header(UINT64_MAX, UINT64_MAX / 2);
    pad(&b, 40);
    refused(&b, "2^64 tensors", "more than its", 4096);
    free(b.p);
    /* each count alone fits, both together do not: 3 entries + 2 tensors need 103 bytes */
    b = header(2, 3);
    pad(&b, 100 - 24);
    refused(&b, "counts that fit apart", "more than its 100 bytes", 4096);
    free(b.p);
}

/* ---- lengths and counts inside the metadata ---- */

static void test_metadata_lengths(void) {
    gb b = header(0, 2);
    kv_str(&b, "general.architecture", "llama");
    pstr(&b, "general.name");
    p32(&b, STR);
    p64(&b, 1ull << 40); /* a 1 TiB string */
    pad(&b, 32);
    refused(&b, "a 2^40-byte string", "metadata general.name", 4096);
    free(b.p);

    b = header(0, 1);
    p64(&b, 1ull << 63); /* key length */
    pad(&b, 32);
    refused(&b, "a 2^63-byte key", "key length 9223372036854775808", 4096);
    free(b.p);

    /* 2^22 token strings (the tokenizer's cap) announced in 200 bytes */
    b = header(0, 2);
    kv_str(&b, "tokenizer.ggml.model", "gpt2");
    kv_arr(&b, "tokenizer.ggml.tokens", STR, 1u << 22);
    for (int i = 0; i < 8; i++) pstr(&b, "ab");
    refused(&b, "2^22 tokens in 200 bytes", "metadata tokenizer.ggml.tokens", 4096);
    free(b.p);

    /* arrays of arrays: 2^50 inner arrays would loop for ever */
    b = header(0, 1);
    kv_arr(&b, "x.nested", ARR, 1ull << 50);
    for (int i = 0; i < 4; i++) p32(&b, U32), p64(&b, 0);
    refused(&b, "2^50 nested arrays", "metadata x.nested", 4096);
    free(b.p);

    /* 2^61 32-bit integers: the count times the size overflows 64 bits */
    b = header(0, 1);
    kv_arr(&b, "x.ints", U32, 1ull << 62);
    pad(&b, 64);
    refused(&b, "2^62 integers", "metadata x.ints", 4096);
    free(b.p);

    b = header(0, 2);
    kv_u32(&b, "a.b", 1);
    kv_u32(&b, "a.b", 2);
    pad(&b, 16);
    refused(&b, "a key given twice", "metadata key a.b is given twice", 4096);
    free(b.p);
}

/* ---- tensor infos ---- */

static void test_tensor_infos(void) {
    uint64_t d2[2] = {8, 8}, big[4] = {1ull << 40, 1ull << 40, 1, 1};
    gb b = header(1, 1);
    kv_str(&b, "general.architecture", "llama");
    pstr(&b, "token_embd.weight");
    p32(&b, 7); /* n_dims */
    pad(&b, 64);
    refused(&b, "7 dimensions", "7 dimensions (1 to 4)", 4096);
    free(b.p);

    b = header(1, 1);
    kv_str(&b, "general.architecture", "llama");
    tinfo(&b, "token_embd.weight", 4, big, 0);
    pad(&b, 64);
    refused(&b, "2^80 elements", "dimension 0 of 1099511627776", 4096);
    free(b.p);

    b = header(1, 1);
    kv_str(&b, "general.architecture", "llama");
    tinfo(&b, "token_embd.weight", 2, d2, 1ull << 50);
    pad(&b, 64);
    refused(&b, "an offset of 2^50", "offset 1125899906842624", 4096);
    free(b.p);

    b = header(1, 1);
    kv_str(&b, "general.architecture", "llama");
    p64(&b, 100); /* name length: llama.cpp's names are under 64 bytes */
    pad(&b, 200);
    refused(&b, "a 100-byte name", "name length 100", 4096);
    free(b.p);

    b = header(2, 1);
    kv_str(&b, "general.architecture", "llama");
    tinfo(&b, "output_norm.weight", 1, d2, 0);
    tinfo(&b, "output_norm.weight", 1, d2, 0);
    pad(&b, 64);
    refused(&b, "a tensor given twice", "tensor output_norm.weight is given twice", 4096);
    free(b.p);
}

/* ---- values that size or feed the model ---- */

static void kv_f32(gb *b, const char *k, float v) {
    pstr(b, k);
    p32(b, F32T);
    put(b, &v, 4);
}

/* A llama header of nt tensor infos (written by the caller after it),
 * `layers` layers, hidden 64, `heads` heads and KV heads 4, vocab 64, and
 * one more entry written by fn (none when NULL). */
static gb llama_header(uint64_t nt, int layers, int heads, void (*fn)(gb *b)) {
    gb b = header(nt, fn ? 8 : 7);
    kv_str(&b, "general.architecture", "llama");
    kv_u32(&b, "llama.embedding_length", 64);
    kv_u32(&b, "llama.block_count", (uint32_t)layers);
    kv_u32(&b, "llama.vocab_size", 64);
    kv_u32(&b, "llama.attention.head_count", (uint32_t)heads);
    kv_u32(&b, "llama.attention.head_count_kv", 4);
    kv_u32(&b, "llama.feed_forward_length", 128);
    if (fn) fn(&b);
    return b;
}
static void key_length(gb *b) { kv_u32(b, "llama.attention.key_length", 1u << 31); }
static void theta_neg(gb *b) { kv_f32(b, "llama.rope.freq_base", -1); }
static void theta_nan(gb *b) { kv_f32(b, "llama.rope.freq_base", NAN); }
static void eps_big(gb *b) { kv_f32(b, "llama.attention.layer_norm_rms_epsilon", 1e30f); }
static void bos_far(gb *b) { kv_u32(b, "tokenizer.ggml.bos_token_id", 1u << 30); }
static void rope_orig(gb *b) { kv_u32(b, "autocompress.rope_llama3.original_context_length", 1u << 31); }
static void ctx_big(gb *b) { kv_u32(b, "llama.context_length", 1u << 30); }
static void ffn_twice(gb *b) { kv_u32(b, "llama.feed_forward_length", 128); }

static void test_value_bounds(void) {
    struct {
        void (*fn)(gb *);
        const char *what, *want;
    } c[] = {
        {key_length, "key_length 2^31", "key_length 2147483648"},
        {theta_neg, "rope_theta -1", "rope.freq_base -1"},
        {theta_nan, "rope_theta NaN", "rope.freq_base nan"},
        {eps_big, "eps 1e30", "layer_norm_rms_epsilon 1e+30"},
        {bos_far, "bos 2^30", "bos_token_id 1073741824"},
        {rope_orig, "llama3 context 2^31", "context length in [1, 2^24]"},
        {ctx_big, "context 2^30", "context_length 1073741824"},
        {ffn_twice, "feed_forward_length given twice", "feed_forward_length is given twice"},
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        gb b = llama_header(0, 1, 4, c[i].fn);
        pad(&b, 64 - b.n % 32);
        refused(&b, c[i].what, c[i].want, 4096);
        free(b.p);
    }
    /* 5000 heads: over config.json's 4096 */
    gb b = llama_header(0, 1, 5000, NULL);
    pad(&b, 64);
    refused(&b, "5000 heads", "head_count is missing or out of range [0, 4096]", 4096);
    free(b.p);
}

/* ---- the parse budget on valid files ---- */

/* GPT-2's byte-level alphabet: byte b as a code point, UTF-8 in s. */
static void byte_char(int b, char *s) {
    int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174, n = 0;
    for (int x = 0; x < b && !keep; x++) n += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174);
    int cp = keep ? b : 256 + n;
    if (cp < 0x80)
        s[0] = (char)cp, s[1] = 0;
    else
        s[0] = (char)(0xC0 | cp >> 6), s[1] = (char)(0x80 | (cp & 0x3F)), s[2] = 0;
}

/* A gpt2 tokenizer of V tokens: the 256 bytes (token = byte value), "ab"
 * (token 256, the one merge "a b"), then words no merge makes. */
static gb tokenizer_file(int V) {
    gb b = header(0, 5);
    kv_str(&b, "tokenizer.ggml.model", "gpt2");
    kv_str(&b, "tokenizer.ggml.pre", "default");
    char s[64];
    kv_arr(&b, "tokenizer.ggml.tokens", STR, V);
    for (int i = 0; i < V; i++) {
        if (i < 256)
            byte_char(i, s);
        else
            snprintf(s, sizeof s, i == 256 ? "ab" : "w%d", i);
        pstr(&b, s);
    }
    kv_arr(&b, "tokenizer.ggml.token_type", I32, V);
    for (int i = 0; i < V; i++) p32(&b, 1);
    kv_arr(&b, "tokenizer.ggml.merges", STR, 1);
    pstr(&b, "a b");
    pad(&b, 32 - b.n % 32); /* the (empty) data section starts aligned */
    return b;
}

static void test_parse_budget(void) {
    gb b = tokenizer_file(2000);
    ac_err e = {0};
    ac_tokenizer *t = NULL;
    CHECK(ac_gguf_parse_budget(0) == AC_GGUF_PARSE_BUDGET, "the default budget is %zu", ac_gguf_parse_budget(0));
    int rc = ac_gguf_load_buf(b.p, b.n, NULL, &t, &e);
    CHECK(rc == 0, "a 2000-token tokenizer within the default budget: %s", e.msg);
    if (!rc) {
        /* "ab" is token 256 by the merge; "b" and "a" are 98 and 97, and no merge joins "b a" */
        int *ids = NULL;
        size_t n = 0;
        CHECK(ac_tok_encode(t, "ab", 2, &ids, &n, &e) == 0 && n == 1 && ids[0] == 256, "\"ab\" encodes to %zu ids", n);
        free(ids);
        ids = NULL;
        CHECK(ac_tok_encode(t, "ba", 2, &ids, &n, &e) == 0 && n == 2 && ids[0] == 98 && ids[1] == 97,
              "\"ba\" encodes to %zu ids", n);
        free(ids);
        ac_tok_free(t);
    }
    /* the same file with a budget of 100 KiB: 2000 tokens need about 600 KiB */
    size_t old = ac_gguf_parse_budget(100 << 10);
    rc = ac_gguf_load_buf(b.p, b.n, NULL, &t, &e);
    CHECK(rc != 0 && strstr(e.msg, "the tokenizer's 2000 tokens need about") && strstr(e.msg, "parse budget of 102400"),
          "%s", rc ? e.msg : "loaded");
    free(b.p);
    /* header tables: 3000 tensor infos need about 3000 x 64 bytes */
    b = header(3000, 0);
    uint64_t d1[1] = {1};
    char name[32];
    for (int i = 0; i < 3000; i++) {
        snprintf(name, sizeof name, "t%d", i);
        tinfo(&b, name, 1, d1, 0);
    }
    pad(&b, 64);
    ac_model m;
    rc = ac_gguf_load_buf(b.p, b.n, &m, NULL, &e);
    CHECK(rc != 0 && strstr(e.msg, "3000 tensors need") && strstr(e.msg, "over the parse budget"), "%s",
          rc ? e.msg : "loaded");
    ac_gguf_parse_budget(old);
    rc = ac_gguf_load_buf(b.p, b.n, &m, NULL, &e);
    CHECK(rc != 0 && strstr(e.msg, "general.architecture is missing"), "within the budget it parses: %s",
          rc ? e.msg : "loaded");
    free(b.p);
}

/* Many tensor infos are looked up by name in a sorted table: 200000 infos
 * and 4096 layers (a lookup of each layer's bias) are refused for the
 * missing embedding at once. */
static void test_many_tensors_fast(void) {
    int nt = 200000;
    gb b = llama_header((uint64_t)nt, 4096, 4, NULL);
    uint64_t d1[1] = {1};
    char name[32];
    for (int i = 0; i < nt; i++) {
        snprintf(name, sizeof name, "blk.%d.attn_q.bias", 100000 + i);
        tinfo(&b, name, 1, d1, 0);
    }
    pad(&b, 64);
    ac_err e = {0};
    ac_model m;
    double t0 = ck_now();
    int rc = ac_gguf_load_buf(b.p, b.n, &m, NULL, &e);
    double dt = ck_now() - t0;
    CHECK(rc != 0 && strstr(e.msg, "token_embd.weight"), "%s", rc ? e.msg : "loaded");
    CHECK(dt < 2.0, "%.2f s for %d tensor infos", dt, nt);
    printf("  %d tensor infos, 4096 layers: refused in %.3f s\n", nt, dt);
    free(b.p);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ac_ggufb_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    if (!ALLOC_PROBE) printf("  (AddressSanitizer: the largest-allocation measure is skipped)\n");
    RUN(test_header_counts);
    RUN(test_metadata_lengths);
    RUN(test_tensor_infos);
    RUN(test_value_bounds);
    RUN(test_parse_budget);
    RUN(test_many_tensors_fast);
    ck_rmtree(tmpdir);
    printf("RESULT %d %d %d\n", ck_pass, ck_fail, ck_skip);
    return ck_fail ? 1 : 0;
}
