/*
 * gguf_read.c - reading GGUF files (llama, deci, qwen3, qwen3moe and the
 * hybrid nemotron_h / nemotron_h_moe architectures) into an ac_model and
 * an ac_tokenizer. See gguf.h.
 *
 * The file is mapped read-only and parsed with every length and offset
 * checked against its size. Metadata values are found by key on demand;
 * tensors are converted to fp32 (F32, F16, BF16) and Q/K rows are put back
 * into Hugging Face's rotate-half order. nemotron_h files are read as
 * gguf.c writes them (per-layer KV heads and FFN widths say each layer's
 * mixer; ssm_a = -exp(A_log) turned back into A_log). The tokenizer is rebuilt as the
 * tokenizer.json it stands for and parsed by the tokenizer module:
 * `gpt2` -> byte-level BPE with the pre type's split regex (ignore_merges
 * for llama-bpe, as llama.cpp does); `llama` -> SentencePiece-style BPE
 * whose merges are every split of a token into two tokens, ranked by the
 * token's score (the bigram rule of llama.cpp's SPM tokenizer).
 */
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fsafe.h"
#include "format/gguf.h"
#include "gguf_int.h"
#include "format/safetensors.h"
#include "core/tensor.h"

typedef struct {
    const char *k;
    size_t kl;
    uint32_t type;
    const unsigned char *v;
} rkv;
typedef struct {
    const char *name;
    size_t nl;
    uint32_t nd;
    uint64_t dims[4];
    uint32_t type;
    uint64_t off;
} rti;
typedef struct {
    unsigned char *map; /* the file (mapped) or the caller's buffer */
    size_t size;
    int mapped;
    rkv *kv;
    uint64_t nkv;
    rti *t;
    uint64_t nt;
    const unsigned char *data;
} gfile;

/* The least bytes a metadata entry (key length, type, a 1-byte value) and a
 * tensor info (name length, n_dims, one dimension, type, offset) take. */
#define GG_MIN_KV 13
#define GG_MIN_TI 32
#define GG_MAX_KEY 65535

static const size_t TSIZE[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8}; /* scalar sizes by GGUF value type */

typedef struct {
    const unsigned char *p, *end;
    int bad;
} cur;

static const unsigned char *take(cur *c, uint64_t n) {
    if (c->bad || n > (uint64_t)(c->end - c->p)) {
        c->bad = 1;
        return NULL;
    }
    const unsigned char *r = c->p;
    c->p += n;
    return r;
}
static uint64_t u64(cur *c) {
    const unsigned char *p = take(c, 8);
    uint64_t v = 0;
    if (p) memcpy(&v, p, 8);
    return v;
}
static uint32_t u32(cur *c) {
    const unsigned char *p = take(c, 4);
    uint32_t v = 0;
    if (p) memcpy(&v, p, 4);
    return v;
}

/* Skip one value of `type`; arrays of strings or arrays are first checked
 * to fit their count in what is left (8 and 12 bytes at least each), so no
 * loop runs longer than the file is. */
static void skip_value(cur *c, uint32_t type, int depth) {
    if (type == GG_STR) {
        uint64_t n = u64(c);
        take(c, n);
        return;
    }
    if (type == GG_ARR && depth < 2) {
        uint32_t et = u32(c);
        uint64_t n = u64(c);
        uint64_t left = c->bad ? 0 : (uint64_t)(c->end - c->p);
        if (et == GG_STR || et == GG_ARR) {
            if (n > left / (et == GG_STR ? 8 : 12)) c->bad = 1;
            for (uint64_t i = 0; i < n && !c->bad; i++) skip_value(c, et, depth + 1);
        } else if (et < 13) {
            if (n > left / TSIZE[et])
                c->bad = 1;
            else
                take(c, n * TSIZE[et]);
        } else
            c->bad = 1;
        return;
    }
    if (type >= 13 || type == GG_ARR) {
        c->bad = 1;
        return;
    }
    take(c, TSIZE[type]);
}

static void gclose(gfile *g) {
    if (g->map && g->mapped) munmap(g->map, g->size);
    free(g->kv);
    free(g->t);
    memset(g, 0, sizeof *g);
}

static int by_key(const void *x, const void *y) {
    const rkv *a = x, *b = y;
    size_t n = a->kl < b->kl ? a->kl : b->kl;
    int c = memcmp(a->k, b->k, n);
    return c ? c : (a->kl > b->kl) - (a->kl < b->kl);
}
static int by_tname(const void *x, const void *y) {
    const rti *a = x, *b = y;
    size_t n = a->nl < b->nl ? a->nl : b->nl;
    int c = memcmp(a->name, b->name, n);
    return c ? c : (a->nl > b->nl) - (a->nl < b->nl);
}

static const rkv *find_kv(const gfile *g, const char *k) {
    rkv key = {.k = k, .kl = strlen(k)};
    return g->nkv ? bsearch(&key, g->kv, g->nkv, sizeof *g->kv, by_key) : NULL;
}

static _Atomic size_t parse_budget = AC_GGUF_PARSE_BUDGET;

size_t ac_gguf_parse_budget(size_t bytes) {
    size_t old = parse_budget;
    if (bytes) parse_budget = bytes;
    return old;
}

/* The counts in the header's first 24 bytes, checked against the file's
 * size (every entry takes GG_MIN_KV or GG_MIN_TI bytes at least) and the
 * parse budget before the tables are allocated. */
static int check_counts(const gfile *g, const char *path, ac_err *e) {
    uint64_t room = g->size - 24;
    size_t budget = parse_budget;
    if (g->nkv > room / GG_MIN_KV || g->nt > room / GG_MIN_TI || g->nkv * GG_MIN_KV + g->nt * GG_MIN_TI > room)
        return ac_errf(e,
                       "%s: the header claims %llu metadata entries and %llu tensors, more than its %zu bytes can "
                       "hold (at least %d bytes an entry, %d a tensor)",
                       path, (unsigned long long)g->nkv, (unsigned long long)g->nt, g->size, GG_MIN_KV, GG_MIN_TI);
    uint64_t need = (g->nkv + 1) * sizeof(rkv) + (g->nt + 1) * sizeof(rti);
    if (need > budget)
        return ac_errf(e, "%s: the header's %llu metadata entries and %llu tensors need %llu bytes to parse, over the "
                          "parse budget of %zu bytes",
                       path, (unsigned long long)g->nkv, (unsigned long long)g->nt, (unsigned long long)need, budget);
    return 0;
}

/* The metadata entries; a message naming the first one that does not fit. */
static int parse_kvs(gfile *g, cur *c, const char *path, ac_err *e) {
    for (uint64_t i = 0; i < g->nkv; i++) {
        rkv *k = &g->kv[i];
        uint64_t kl = u64(c);
        if (c->bad || kl > (uint64_t)(c->end - c->p) || kl > GG_MAX_KEY)
            return ac_errf(e, "%s: metadata entry %llu: key length %llu is over %d or past the end of the file", path,
                           (unsigned long long)i, (unsigned long long)kl, GG_MAX_KEY);
        k->kl = (size_t)kl;
        k->k = (const char *)take(c, kl);
        k->type = u32(c);
        k->v = c->p;
        skip_value(c, k->type, 0);
        if (c->bad)
            return ac_errf(e,
                           "%s: metadata %.*s: value of type %u is malformed or runs past the end of the file (a "
                           "string length or array count larger than the bytes left)",
                           path, (int)k->kl, k->k, k->type);
    }
    return 0;
}

/* The tensor infos: names under 64 bytes, 1-4 dimensions whose product
 * cannot overflow or exceed 8 elements a byte of the file. */
static int parse_tensor_infos(gfile *g, cur *c, const char *path, ac_err *e) {
    for (uint64_t i = 0; i < g->nt; i++) {
        rti *t = &g->t[i];
        uint64_t nl = u64(c);
        if (c->bad || nl > (uint64_t)(c->end - c->p) || nl >= 64)
            return ac_errf(e, "%s: tensor info %llu: name length %llu is 64 or more, or past the end of the file", path,
                           (unsigned long long)i, (unsigned long long)nl);
        t->nl = (size_t)nl;
        t->name = (const char *)take(c, nl);
        t->nd = u32(c);
        if (c->bad || t->nd < 1 || t->nd > 4)
            return ac_errf(e, "%s: tensor %.*s: %u dimensions (1 to 4)", path, (int)t->nl, t->name, t->nd);
        uint64_t elems = 1, most = (uint64_t)g->size * 8;
        for (uint32_t d = 0; d < t->nd; d++) {
            t->dims[d] = u64(c);
            if (t->dims[d] && elems > most / t->dims[d])
                return ac_errf(e, "%s: tensor %.*s: dimension %u of %llu makes it larger than the file", path,
                               (int)t->nl, t->name, d, (unsigned long long)t->dims[d]);
            elems *= t->dims[d];
        }
        t->type = u32(c);
        t->off = u64(c);
        if (c->bad || t->off > g->size)
            return ac_errf(e, "%s: tensor %.*s: offset %llu is past the end of the file", path, (int)t->nl, t->name,
                           (unsigned long long)t->off);
    }
    return 0;
}

/* Sorted by key and by name for bsearch; a key or name given twice is refused. */
static int sort_unique(gfile *g, const char *path, ac_err *e) {
    qsort(g->kv, g->nkv, sizeof *g->kv, by_key);
    qsort(g->t, g->nt, sizeof *g->t, by_tname);
    for (uint64_t i = 1; i < g->nkv; i++)
        if (!by_key(&g->kv[i - 1], &g->kv[i]))
            return ac_errf(e, "%s: metadata key %.*s is given twice", path, (int)g->kv[i].kl, g->kv[i].k);
    for (uint64_t i = 1; i < g->nt; i++)
        if (!by_tname(&g->t[i - 1], &g->t[i]))
            return ac_errf(e, "%s: tensor %.*s is given twice", path, (int)g->t[i].nl, g->t[i].name);
    return 0;
}

/* Parse the header, metadata and tensor infos of g->map[0..g->size). */
static int gparse(gfile *g, const char *path, ac_err *e) {
    cur c = {g->map, g->map + g->size, 0};
    if (g->size < 24) {
        gclose(g);
        return ac_errf(e, "%s: not a GGUF file (too short)", path);
    }
    uint32_t ver;
    if (memcmp(take(&c, 4), "GGUF", 4) || ((ver = u32(&c)) != 3 && ver != 2)) {
        gclose(g);
        return ac_errf(e, "%s: not a GGUF v2/v3 file", path);
    }
    g->nt = u64(&c);
    g->nkv = u64(&c);
    if (check_counts(g, path, e)) {
        gclose(g);
        return -1;
    }
    g->kv = calloc(g->nkv + 1, sizeof *g->kv);
    g->t = calloc(g->nt + 1, sizeof *g->t);
    if (!g->kv || !g->t) {
        gclose(g);
        return ac_errf(e, "out of memory");
    }
    if (parse_kvs(g, &c, path, e) || parse_tensor_infos(g, &c, path, e) || sort_unique(g, path, e)) {
        gclose(g);
        return -1;
    }
    const rkv *al = find_kv(g, "general.alignment");
    uint32_t align = GG_ALIGN;
    if (al && al->type == GG_U32) memcpy(&align, al->v, 4);
    if (align == 0) {
        gclose(g);
        return ac_errf(e, "%s: general.alignment is 0", path);
    }
    uint64_t pos = (uint64_t)(c.p - g->map);
    pos = (pos + align - 1) / align * align;
    if (pos > g->size) {
        gclose(g);
        return ac_errf(e, "%s: truncated GGUF file", path);
    }
    g->data = g->map + pos;
    return 0;
}

static int gopen(const char *path, gfile *g, ac_err *e) {
    memset(g, 0, sizeof *g);
    size_t size;
    int fd = ac_fsafe_open(path, AC_FK_WEIGHTS, &size, e); /* confined, a regular file */
    if (fd < 0) return -1;
    if (size < 24) {
        close(fd);
        return ac_errf(e, "%s: not a GGUF file (too short)", path);
    }
    g->size = size;
    g->map = mmap(NULL, g->size, PROT_READ, MAP_PRIVATE, fd, 0);
    g->mapped = 1;
    close(fd);
    if (g->map == MAP_FAILED) {
        g->map = NULL;
        return ac_errf(e, "%s: cannot map", path);
    }
    return gparse(g, path, e);
}

/* Integer metadata (any integer type); def when absent. */
static int kv_int(const gfile *g, const char *k, long long def, long long *out, ac_err *e) {
    const rkv *x = find_kv(g, k);
    *out = def;
    if (!x) return 0;
    const unsigned char *v = x->v;
    switch (x->type) {
    case GG_U8: *out = *v; break;
    case GG_I8: *out = (int8_t)*v; break;
    case GG_U16: {
        uint16_t t;
        memcpy(&t, v, 2);
        *out = t;
        break;
    }
    case GG_I16: {
        int16_t t;
        memcpy(&t, v, 2);
        *out = t;
        break;
    }
    case GG_U32: {
        uint32_t t;
        memcpy(&t, v, 4);
        *out = t;
        break;
    }
    case GG_I32: {
        int32_t t;
        memcpy(&t, v, 4);
        *out = t;
        break;
    }
    case GG_U64:
    case GG_I64: {
        int64_t t;
        memcpy(&t, v, 8);
        *out = t;
        break;
    }
    default: return ac_errf(e, "gguf: %s is not an integer", k);
    }
    return 0;
}

static int kv_float(const gfile *g, const char *k, double def, double *out, ac_err *e) {
    const rkv *x = find_kv(g, k);
    *out = def;
    if (!x) return 0;
    if (x->type == GG_F32) {
        float f;
        memcpy(&f, x->v, 4);
        *out = f;
    } else if (x->type == GG_F64)
        memcpy(out, x->v, 8);
    else
        return ac_errf(e, "gguf: %s is not a float", k);
    return 0;
}

/* A string value: *s (not NUL-terminated) and *n, or NULL when absent. */
static const char *kv_str(const gfile *g, const char *k, size_t *n) {
    const rkv *x = find_kv(g, k);
    if (!x || x->type != GG_STR) return NULL;
    cur c = {x->v, g->map + g->size, 0};
    *n = (size_t)u64(&c);
    return (const char *)take(&c, *n);
}

/* An array value: element type and count, cursor at the first element. */
static int kv_array(const gfile *g, const char *k, uint32_t *et, uint64_t *n, cur *c) {
    const rkv *x = find_kv(g, k);
    if (!x || x->type != GG_ARR) return 0;
    *c = (cur){x->v, g->map + g->size, 0};
    *et = u32(c);
    *n = u64(c);
    return !c->bad;
}

/* Per-layer integers: an array of n integers, or one integer for every layer. */
static int kv_layers(const gfile *g, const char *k, int n, uint32_t max, int *out, ac_err *e) {
    uint32_t et;
    uint64_t cnt;
    cur c;
    if (kv_array(g, k, &et, &cnt, &c)) {
        if (cnt != (uint64_t)n || (et != GG_I32 && et != GG_U32))
            return ac_errf(e, "gguf: %s must hold %d 32-bit integers", k, n);
        for (int i = 0; i < n; i++) {
            uint32_t v = u32(&c);
            if (v > max) return ac_errf(e, "gguf: %s[%d] = %u is over %u", k, i, v, max);
            out[i] = (int)v;
        }
        return 0;
    }
    long long v;
    if (kv_int(g, k, -1, &v, e)) return -1;
    if (v < 0 || v > max) return ac_errf(e, "gguf: %s is missing or out of range [0, %u]", k, max);
    for (int i = 0; i < n; i++) out[i] = (int)v;
    return 0;
}

static const rti *find_t(const gfile *g, const char *name) {
    rti key = {.name = name, .nl = strlen(name)};
    return g->nt ? bsearch(&key, g->t, g->nt, sizeof *g->t, by_tname) : NULL;
}

/* The per-layer head, KV-head and FFN counts (arrays or one value each). */
static int read_arch_layers(const gfile *g, const char *arch, ac_arch *a, ac_err *e) {
    char k[128];
    a->layers = calloc(a->n_layers, sizeof *a->layers);
    int *tmp = calloc(3 * (size_t)a->n_layers, sizeof *tmp);
    if (!a->layers || !tmp) {
        free(tmp);
        return ac_errf(e, "out of memory");
    }
    const char *lk[3] = {"attention.head_count", "attention.head_count_kv", "feed_forward_length"};
    const uint32_t most[3] = {4096, 4096, 1u << 20}; /* config.json's limits (model.c) */
    int rc = 0;
    for (int i = 0; i < 3 && !rc; i++) {
        snprintf(k, sizeof k, "%s.%s", arch, lk[i]);
        rc = kv_layers(g, k, a->n_layers, most[i], tmp + i * a->n_layers, e);
    }
    for (int l = 0; l < a->n_layers && !rc; l++) {
        ac_layer_arch *L = &a->layers[l];
        *L = (ac_layer_arch){tmp[l], tmp[a->n_layers + l], tmp[2 * a->n_layers + l], 0, 0, 0};
        if (L->n_heads && (L->n_kv_heads <= 0 || L->n_heads % L->n_kv_heads))
            rc = ac_errf(e,
                         "gguf: layer %d has %d heads and %d KV heads (llama.cpp's linear attention is not supported)",
                         l, L->n_heads, L->n_kv_heads);
    }
    free(tmp);
    return rc;
}

/* A boolean key (def when absent). */
static int kv_flag(const gfile *g, const char *k, int def, int *out, ac_err *e) {
    const rkv *x = find_kv(g, k);
    *out = def;
    if (!x) return 0;
    if (x->type != GG_BOOL) return ac_errf(e, "gguf: %s is not a bool", k);
    *out = *x->v != 0;
    return 0;
}

/* "<arch>.<rest>" as an integer in [lo, hi] (def when absent; def < lo: required). */
static int hkey(const gfile *g, const char *arch, const char *rest, long long def, long long lo, long long hi,
                long long *out, ac_err *e) {
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, rest);
    if (kv_int(g, k, def, out, e)) return -1;
    if (*out < lo || *out > hi)
        return ac_errf(e, "gguf: %s = %lld is missing or out of range [%lld, %lld]", k, *out, lo, hi);
    return 0;
}

/* nemotron_h_moe's MoE keys (gguf.c's write_hparams): one expert count and
 * width, the sigmoid router, one shared expert, no expert groups. */
static int read_arch_hybrid_moe(const gfile *g, const char *arch, ac_arch *a, int *ne, int *fe, ac_err *e) {
    long long E, k, F, Fs, ns, ng, lt;
    double scale;
    char key[128];
    if (hkey(g, arch, "expert_count", -1, 1, 1 << 16, &E, e) || hkey(g, arch, "expert_used_count", -1, 1, E, &k, e) ||
        hkey(g, arch, "expert_feed_forward_length", -1, 1, 1 << 20, &F, e) ||
        hkey(g, arch, "expert_shared_feed_forward_length", -1, 1, 1 << 20, &Fs, e) ||
        hkey(g, arch, "expert_shared_count", 1, 1, 1, &ns, e) || hkey(g, arch, "expert_group_count", 1, 1, 1, &ng, e) ||
        hkey(g, arch, "moe_latent_size", 0, 0, a->hidden, &lt, e))
        return -1;
    snprintf(key, sizeof key, "%s.expert_weights_norm", arch);
    if (kv_flag(g, key, 0, &a->norm_topk, e)) return -1;
    snprintf(key, sizeof key, "%s.expert_weights_scale", arch);
    if (kv_float(g, key, 1, &scale, e)) return -1;
    if (!(scale > 0 && scale <= 1e6)) return ac_errf(e, "gguf: %s = %g must lie in (0, 1e6]", key, scale);
    a->top_k = (int)k, a->router_sigmoid = 1, a->routed_scale = (float)scale;
    a->shared_ffn = (int)Fs, a->moe_latent = (int)lt;
    *ne = (int)E, *fe = (int)F;
    return 0;
}

/* nemotron_h / nemotron_h_moe, gguf.c's write_hparams inverted: a layer
 * with KV heads is attention (head_count query heads), one with an FFN
 * width an MLP (nemotron_h) or a MoE layer (nemotron_h_moe, the width its
 * experts'), one with neither Mamba-2 (ssm.time_step_rank heads of
 * ssm.inner_size / heads channels). The conv bias is there when the first
 * Mamba layer's ssm_conv1d.bias is (read_weights holds every layer to it). */
static int read_arch_hybrid(const gfile *g, const char *arch, ac_arch *a, ac_err *e) {
    char k[128];
    int n = a->n_layers, moe = !strcmp(arch, "nemotron_h_moe"), ne = 0, fe = 0, rc = 0;
    long long nh, K, N, G, di, mh;
    a->layers = calloc(n, sizeof *a->layers);
    int *tmp = calloc(2 * (size_t)n, sizeof *tmp);
    if (!a->layers || !tmp) {
        free(tmp);
        return ac_errf(e, "out of memory");
    }
    snprintf(k, sizeof k, "%s.feed_forward_length", arch);
    rc = kv_layers(g, k, n, 1u << 20, tmp, e);
    snprintf(k, sizeof k, "%s.attention.head_count_kv", arch);
    if (!rc) rc = kv_layers(g, k, n, 4096, tmp + n, e);
    if (!rc)
        rc = hkey(g, arch, "attention.head_count", 0, 0, 4096, &nh, e) ||
             hkey(g, arch, "ssm.conv_kernel", 0, 0, 1024, &K, e) ||
             hkey(g, arch, "ssm.state_size", 0, 0, 4096, &N, e) ||
             hkey(g, arch, "ssm.group_count", 0, 0, 1 << 16, &G, e) ||
             hkey(g, arch, "ssm.inner_size", 0, 0, 1 << 24, &di, e) ||
             hkey(g, arch, "ssm.time_step_rank", 0, 0, 1 << 16, &mh, e) ||
             (moe && read_arch_hybrid_moe(g, arch, a, &ne, &fe, e));
    int mamba = 0;
    for (int l = 0; l < n && !rc; l++) {
        ac_layer_arch *L = &a->layers[l];
        int ffn = tmp[l], kv = tmp[n + l];
        if (ffn && kv)
            rc = ac_errf(e, "gguf: layer %d has KV heads and an FFN width (nemotron_h holds one mixer a layer)", l);
        else if (kv && (nh <= 0 || nh % kv))
            rc = ac_errf(e, "gguf: layer %d has %lld heads and %d KV heads", l, nh, kv);
        else if (moe && ffn && ffn != fe)
            rc = ac_errf(e, "gguf: layer %d's FFN width %d is not expert_feed_forward_length %d", l, ffn, fe);
        else if (kv)
            L->n_heads = (int)nh, L->n_kv_heads = kv;
        else if (ffn && moe)
            L->n_experts = ne, L->expert_ffn = ffn;
        else if (ffn)
            L->ffn = ffn;
        else
            L->ssm_heads = (int)mh, mamba = 1;
    }
    if (!rc && mamba && (mh <= 0 || K <= 0 || N <= 0 || G <= 0 || mh % G || di % mh))
        rc = ac_errf(e, "gguf: Mamba layers need ssm.time_step_rank (heads), conv_kernel, state_size and group_count "
                        "> 0, the heads divisible by the groups and ssm.inner_size by the heads");
    free(tmp);
    if (rc) return -1;
    a->hybrid = 1;
    a->ssm_head_dim = mh > 0 ? (int)(di / mh) : 0, a->ssm_state = (int)N, a->ssm_groups = (int)G, a->ssm_conv = (int)K;
    for (int l = 0; l < n && mamba; l++)
        if (a->layers[l].ssm_heads) {
            snprintf(k, sizeof k, "blk.%d.ssm_conv1d.bias", l);
            a->ssm_conv_bias = find_t(g, k) != NULL;
            break;
        }
    return 0;
}

/* llama3 RoPE scaling (AutoCompress's own keys) and the BOS/EOS ids. */
static int read_arch_rope_tokens(const gfile *g, ac_arch *a, ac_err *e) {
    double rf, rl, rh;
    long long ro, bos, eos;
    if (kv_float(g, "autocompress.rope_llama3.factor", 0, &rf, e) ||
        kv_float(g, "autocompress.rope_llama3.low_freq_factor", 1, &rl, e) ||
        kv_float(g, "autocompress.rope_llama3.high_freq_factor", 4, &rh, e) ||
        kv_int(g, "autocompress.rope_llama3.original_context_length", 8192, &ro, e))
        return -1;
    if (!(rf <= 1e4 && rl > 0 && rl <= 1e4 && rh > 0 && rh <= 1e4 && ro > 0 && ro <= 1 << 24)) /* NaN too */
        return ac_errf(e, "gguf: autocompress.rope_llama3 factors must lie in (0, 1e4] and its context length in "
                          "[1, 2^24]");
    if (rf > 0) {
        a->rope_llama3 = 1;
        a->rs_factor = (float)rf;
        a->rs_low = (float)rl;
        a->rs_high = (float)rh;
        a->rs_orig = (int)ro;
    } else if (find_t(g, "rope_freqs.weight")) {
        return ac_errf(e, "gguf: rope_freqs without AutoCompress's llama3 keys is not supported");
    }
    if (kv_int(g, "tokenizer.ggml.bos_token_id", -1, &bos, e) || kv_int(g, "tokenizer.ggml.eos_token_id", -1, &eos, e))
        return -1;
    if (bos < -1 || bos >= a->vocab || eos < -1 || eos >= a->vocab)
        return ac_errf(e, "gguf: bos_token_id %lld or eos_token_id %lld is not a token of the %d", bos, eos, a->vocab);
    a->bos_id = (int)bos;
    a->eos_id = (int)eos;
    return 0;
}

/* The model-wide sizes: v[] = embedding_length, block_count, context_length,
 * vocab_size, attention.key_length, rope.dimension_count (-1 when absent). */
static int read_arch_globals(const gfile *g, const char *arch, ac_arch *a, long long v[6], ac_err *e) {
    char k[128];
    double eps, theta;
    const char *ik[6] = {"embedding_length", "block_count",          "context_length",
                         "vocab_size",       "attention.key_length", "rope.dimension_count"};
    for (int i = 0; i < 6; i++) {
        snprintf(k, sizeof k, "%s.%s", arch, ik[i]);
        if (kv_int(g, k, -1, &v[i], e)) return -1;
    }
    snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", arch);
    if (kv_float(g, k, 1e-5, &eps, e)) return -1;
    snprintf(k, sizeof k, "%s.rope.freq_base", arch);
    if (kv_float(g, k, 10000, &theta, e)) return -1;
    const rti *emb = find_t(g, "token_embd.weight");
    if (v[3] < 0 && emb && emb->nd == 2) v[3] = (long long)emb->dims[1];
    if (v[0] <= 0 || v[1] <= 0 || v[3] <= 0 || v[0] > 1 << 20 || v[1] > 4096 || v[3] > 1 << 22)
        return ac_errf(e, "gguf: embedding_length, block_count and vocab_size must be present and plausible");
    if (v[2] > 1 << 24 || v[4] > 4096 || v[5] > 4096)
        return ac_errf(e, "gguf: context_length %lld over 2^24, or key_length %lld or rope.dimension_count %lld over "
                          "4096",
                       v[2], v[4], v[5]);
    if (!(theta > 0 && theta <= 1e12) || !(eps > 0 && eps <= 1)) /* NaN too */
        return ac_errf(e, "gguf: rope.freq_base %g must lie in (0, 1e12] and layer_norm_rms_epsilon %g in (0, 1]",
                       theta, eps);
    a->hidden = (int)v[0];
    a->n_layers = (int)v[1];
    a->max_pos = v[2] > 0 ? (int)v[2] : 2048;
    a->vocab = (int)v[3];
    a->eps = (float)eps;
    a->rope_theta = (float)theta;
    return 0;
}

static int read_arch(const gfile *g, ac_arch *a, ac_err *e) {
    memset(a, 0, sizeof *a);
    size_t n;
    const char *an = kv_str(g, "general.architecture", &n);
    char arch[32], k[128];
    if (!an || n >= sizeof arch) return ac_errf(e, "gguf: general.architecture is missing");
    memcpy(arch, an, n);
    arch[n] = 0;
    int hyb = !strcmp(arch, "nemotron_h") || !strcmp(arch, "nemotron_h_moe");
    if (strcmp(arch, "llama") && strcmp(arch, "deci") && strcmp(arch, "qwen3") && strcmp(arch, "qwen3moe") && !hyb)
        return ac_errf(e,
                       "gguf: architecture %s is not supported (llama, deci, qwen3, qwen3moe, nemotron_h, "
                       "nemotron_h_moe)",
                       arch);
    snprintf(a->model_type, sizeof a->model_type, "%s",
             !strcmp(arch, "deci")       ? "nemotron-nas"
             : !strcmp(arch, "qwen3moe") ? "qwen3_moe"
             : hyb                       ? "nemotron_h"
                                         : arch);
    a->qk_norm = !strcmp(arch, "qwen3") || !strcmp(arch, "qwen3moe");
    long long v[6], ne = 0, nk, fe;
    if (read_arch_globals(g, arch, a, v, e)) return -1;
    if (hyb ? read_arch_hybrid(g, arch, a, e) : read_arch_layers(g, arch, a, e)) goto fail;
    snprintf(k, sizeof k, "%s.expert_count", arch);
    if (!hyb && kv_int(g, k, 0, &ne, e)) goto fail;
    if (ne > 0) { /* every layer MoE, renormalised top-k (llama.cpp's llama and qwen3moe) */
        snprintf(k, sizeof k, "%s.expert_used_count", arch);
        if (kv_int(g, k, 0, &nk, e)) goto fail;
        snprintf(k, sizeof k, "%s.expert_feed_forward_length", arch);
        if (kv_int(g, k, a->layers[0].ffn, &fe, e)) goto fail; /* Mixtral as llama: feed_forward_length */
        if (ne > 1 << 16 || nk <= 0 || nk > ne || fe <= 0 || fe > 1 << 20) {
            ac_errf(e, "gguf: expert_count %lld, expert_used_count %lld or expert width %lld out of range", ne, nk, fe);
            goto fail;
        }
        if (!strcmp(arch, "llama")) snprintf(a->model_type, sizeof a->model_type, "mixtral");
        a->top_k = (int)nk;
        a->norm_topk = 1;
        for (int l = 0; l < a->n_layers; l++)
            a->layers[l].ffn = 0, a->layers[l].n_experts = (int)ne, a->layers[l].expert_ffn = (int)fe;
    }
    int nh0 = 0;
    for (int l = 0; l < a->n_layers && !nh0; l++) nh0 = a->layers[l].n_heads;
    a->head_dim = v[4] > 0 ? (int)v[4] : nh0 ? a->hidden / nh0 : 0;
    if (a->head_dim <= 0 || (!hyb && a->head_dim % 2) || (v[5] > 0 && v[5] != a->head_dim)) {
        ac_errf(e, "gguf: head size %d must be even and equal to rope.dimension_count (partial RoPE is not supported)",
                a->head_dim);
        goto fail;
    }
    a->tie_embeddings = !find_t(g, "output.weight");
    a->qkv_bias = 0;
    for (int l = 0; l < a->n_layers; l++) {
        snprintf(k, sizeof k, "blk.%d.attn_q.bias", l);
        a->qkv_bias |= find_t(g, k) != NULL;
    }
    if (read_arch_rope_tokens(g, a, e)) goto fail;
    return 0;
fail:
    ac_arch_free(a);
    return -1;
}

/* *dt: tensor t's dtype (F32, F16 or BF16), its n elements checked to lie
 * inside the file. */
static int tensor_dtype_in_file(const gfile *g, const rti *t, const char *name, size_t n, st_dtype *dt, ac_err *e) {
    *dt = t->type == GGML_F32 ? ST_F32 : t->type == GGML_F16 ? ST_F16 : t->type == GGML_BF16 ? ST_BF16 : ST_NDTYPES;
    if (*dt == ST_NDTYPES)
        return ac_errf(e, "gguf: tensor %s has ggml type %u (F32, F16 and BF16 are supported)", name, t->type);
    size_t avail = g->size - (size_t)(g->data - g->map);
    if (t->off > avail || n > (avail - t->off) / st_dtype_size(*dt))
        return ac_errf(e, "gguf: tensor %s lies outside the file", name);
    return 0;
}

/* Tensor `name` of shape [rows, cols] (cols 0: 1-D) into dst as fp32;
 * perm > 0 puts Q/K rows of perm heads back in rotate-half order. */
static int read_t(const gfile *g, const char *name, int64_t rows, int64_t cols, int perm, float *dst, ac_err *e) {
    const rti *t = find_t(g, name);
    if (!t) return ac_errf(e, "gguf: missing tensor %s", name);
    int ok = cols ? t->nd == 2 && t->dims[0] == (uint64_t)cols && t->dims[1] == (uint64_t)rows
                  : t->nd == 1 && t->dims[0] == (uint64_t)rows;
    if (!ok)
        return ac_errf(e, "gguf: tensor %s has the wrong shape (expected [%lld, %lld])", name, (long long)rows,
                       (long long)cols);
    st_dtype dt;
    size_t n = (size_t)rows * (size_t)(cols ? cols : 1);
    if (tensor_dtype_in_file(g, t, name, n, &dt, e)) return -1;
    if (!dst) return 0; /* the check before allocation */
    float *tmp = perm ? malloc(n * sizeof *tmp) : dst;
    if (!tmp) return ac_errf(e, "out of memory");
    int rc = ac_to_f32(tmp, g->data + t->off, dt, n, e);
    if (perm) {
        if (!rc) gg_permute_rows(dst, tmp, perm, rows, cols ? cols : 1, 1);
        free(tmp);
    }
    return rc ? ac_errctx(e, "%s", name) : 0;
}

/* A 3-D tensor of np matrices rows x cols (ggml {cols, rows, np}) into the
 * np fp32 matrices parts[] (NULL: only checked). */
static int read_parts(const gfile *g, const char *name, int64_t np, int64_t rows, int64_t cols, float **parts,
                      ac_err *e) {
    const rti *t = find_t(g, name);
    if (!t) return ac_errf(e, "gguf: missing tensor %s", name);
    if (t->nd != 3 || t->dims[0] != (uint64_t)cols || t->dims[1] != (uint64_t)rows || t->dims[2] != (uint64_t)np)
        return ac_errf(e, "gguf: tensor %s has the wrong shape (expected {%lld, %lld, %lld})", name, (long long)cols,
                       (long long)rows, (long long)np);
    st_dtype dt;
    size_t n = (size_t)rows * (size_t)cols;
    if (tensor_dtype_in_file(g, t, name, n * (size_t)np, &dt, e)) return -1;
    for (int64_t p = 0; parts && p < np; p++)
        if (ac_to_f32(parts[p], g->data + t->off + (size_t)p * n * st_dtype_size(dt), dt, n, e))
            return ac_errctx(e, "%s", name);
    return 0;
}

/* A_log from llama.cpp's ssm_a (x[], A = -exp(A_log), gguf.c): the value
 * AutoCompress wrote in autocompress.ssm_a_log (key: this layer's nh
 * floats, or NULL) where it gives this A as the writer computed it, else
 * log(-A) rounded once, or a float next to it when that one gives A
 * under expf (within an ulp or so of the A_log written: expf maps
 * neighbouring floats to one). */
static int a_log_from_a(float *x, int nh, const unsigned char *key, int l, ac_err *e) {
    for (int h = 0; h < nh; h++) {
        float A = x[h], k = 0;
        if (!(A < 0) || !isfinite(A))
            return ac_errf(e, "gguf: blk.%d.ssm_a[%d] = %g is not negative and finite (A = -exp(A_log))", l, h, A);
        if (key) memcpy(&k, key + 4 * (size_t)h, 4);
        if (key && -expf(k) == A) {
            x[h] = k;
            continue;
        }
        float y = (float)log(-(double)A), lo = y, hi = y; /* else the nearest float within 2 that gives A */
        for (int s = 0; s < 2 && -expf(y) != A; s++) {
            lo = nextafterf(lo, -INFINITY), hi = nextafterf(hi, INFINITY);
            y = -expf(lo) == A ? lo : -expf(hi) == A ? hi : y;
        }
        x[h] = y;
    }
    return 0;
}

/* One nemotron_h layer's tensors, gguf.c's list_tensors inverted (w's
 * pointers NULL: only checked); a Mamba layer's ssm_a becomes A_log
 * (a_log_from_a, key as there). */
static int read_hybrid_layer(const gfile *g, const ac_arch *a, int l, ac_layer_w *w, int chk, const unsigned char *key,
                             ac_err *e) {
    const ac_layer_arch *L = &a->layers[l];
    int64_t H = a->hidden, hd = a->head_dim;
    char nm[64];
#define RT(sfx, dst, r, c) (snprintf(nm, sizeof nm, "blk.%d.%s", l, sfx), read_t(g, nm, r, c, 0, dst, e))
    if (RT("attn_norm.weight", L->ffn || L->n_experts ? w->post_norm : w->in_norm, H, 0)) return -1;
    if (L->n_experts) { /* router, correction bias, latent projections, experts (up, down), shared expert */
        int64_t E = L->n_experts, Fe = L->expert_ffn, Fs = a->shared_ffn, Hin = a->moe_latent ? a->moe_latent : H;
        if (RT("ffn_gate_inp.weight", w->router, E, H) || RT("exp_probs_b.bias", w->router_bias, E, 0) ||
            (a->moe_latent &&
             (RT("ffn_latent_down.weight", w->lat_down, Hin, H) || RT("ffn_latent_up.weight", w->lat_up, H, Hin))) ||
            RT("ffn_up_shexp.weight", w->sh_u, Fs, H) || RT("ffn_down_shexp.weight", w->sh_d, H, Fs))
            return -1;
        snprintf(nm, sizeof nm, "blk.%d.%s", l, gg_moe_names[1]);
        if (read_parts(g, nm, E, Fe, Hin, chk ? NULL : w->eu, e)) return -1;
        snprintf(nm, sizeof nm, "blk.%d.%s", l, gg_moe_names[2]);
        return read_parts(g, nm, E, Hin, Fe, chk ? NULL : w->ed, e);
    }
    if (L->ffn) return RT("ffn_up.weight", w->wu, L->ffn, H) || RT("ffn_down.weight", w->wd, H, L->ffn) ? -1 : 0;
    if (L->n_heads) { /* no RoPE: no permutation */
        int64_t q = L->n_heads * hd, kv = L->n_kv_heads * hd;
        return RT("attn_q.weight", w->wq, q, H) || RT("attn_k.weight", w->wk, kv, H) ||
                       RT("attn_v.weight", w->wv, kv, H) || RT("attn_output.weight", w->wo, H, q)
                   ? -1
                   : 0;
    }
    int64_t nh = L->ssm_heads, di = nh * a->ssm_head_dim, C = di + 2 * (int64_t)a->ssm_groups * a->ssm_state;
    snprintf(nm, sizeof nm, "blk.%d.ssm_conv1d.bias", l);
    if ((find_t(g, nm) != NULL) != (a->ssm_conv_bias != 0))
        return ac_errf(e, "gguf: layer %d %s a conv bias, the first Mamba layer %s", l,
                       a->ssm_conv_bias ? "lacks" : "has", a->ssm_conv_bias ? "has" : "does not");
    if (RT("ssm_in.weight", w->ssm_in, di + C + nh, H) || RT("ssm_conv1d.weight", w->conv_w, C, a->ssm_conv) ||
        (a->ssm_conv_bias && RT("ssm_conv1d.bias", w->conv_b, C, 0)) || RT("ssm_dt.bias", w->dt_bias, nh, 0) ||
        RT("ssm_a", w->a_log, nh, 1) || RT("ssm_d", w->ssm_d, nh, 1) ||
        RT("ssm_norm.weight", w->ssm_norm, a->ssm_groups, di / a->ssm_groups) ||
        RT("ssm_out.weight", w->ssm_out, H, di))
        return -1;
#undef RT
    return chk ? 0 : a_log_from_a(w->a_log, (int)nh, key, l, e);
}

/* m->L NULL: only check that every tensor is there with its shape and
 * inside the file (before the model is allocated). */
static int read_weights(const gfile *g, ac_model *m, ac_err *e) {
    const ac_arch *a = &m->a;
    int chk = m->L == NULL;
    int64_t H = a->hidden;
    if (read_t(g, "token_embd.weight", a->vocab, H, 0, m->embed, e) ||
        read_t(g, "output_norm.weight", H, 0, 0, m->final_norm, e))
        return -1;
    if (!a->tie_embeddings && read_t(g, "output.weight", a->vocab, H, 0, m->lm_head, e)) return -1;
    static ac_layer_w none;
    const unsigned char *key = NULL; /* nemotron_h: autocompress.ssm_a_log, when it holds every Mamba head */
    if (a->hybrid) {
        uint32_t et;
        uint64_t cnt, heads = 0;
        cur c;
        for (int l = 0; l < a->n_layers; l++) heads += (uint64_t)a->layers[l].ssm_heads;
        if (kv_array(g, "autocompress.ssm_a_log", &et, &cnt, &c) && et == GG_F32 && cnt == heads &&
            (uint64_t)(c.end - c.p) / 4 >= cnt)
            key = c.p;
    }
    for (int l = 0; l < a->n_layers; l++) {
        ac_layer_w *w = chk ? &none : &m->L[l];
        if (a->hybrid) {
            if (read_hybrid_layer(g, a, l, w, chk, key, e)) return -1;
            if (key) key += 4 * (size_t)a->layers[l].ssm_heads;
            continue;
        }
        gg_layer_tensor lt[GG_LAYER_TENSORS];
        int k = gg_layer_tensors(a, l, w, lt);
        for (int i = 0; i < k; i++)
            if (read_t(g, lt[i].name, lt[i].rows, lt[i].cols, lt[i].perm, *lt[i].w, e)) return -1;
        const ac_layer_arch *L = &a->layers[l];
        for (int x = 0; L->n_experts && x < 3; x++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s", l, gg_moe_names[x]);
            float **parts = chk ? NULL : x == 0 ? w->eg : x == 1 ? w->eu : w->ed;
            if (read_parts(g, name, L->n_experts, x == 2 ? H : L->expert_ffn, x == 2 ? L->expert_ffn : H, parts, e))
                return -1;
        }
    }
    return 0;
}

int ac_gguf_arch(const char *path, ac_arch *a, ac_err *e) {
    gfile g;
    if (gopen(path, &g, e)) return -1;
    int rc = read_arch(&g, a, e);
    gclose(&g);
    return rc ? ac_errctx(e, "%s", path) : 0;
}

static int load_model(const gfile *g, ac_model *m, ac_err *e) {
    ac_model chk = {0};
    memset(m, 0, sizeof *m);
    if (read_arch(g, &chk.a, e)) return -1;
    int rc = read_weights(g, &chk, e);
    if (!rc) rc = ac_model_alloc(m, &chk.a, e);
    ac_arch_free(&chk.a);
    if (!rc && (rc = read_weights(g, m, e))) ac_model_free(m);
    return rc;
}

int ac_gguf_load(const char *path, ac_model *m, ac_err *e) {
    gfile g;
    memset(m, 0, sizeof *m);
    if (gopen(path, &g, e)) return -1;
    int rc = load_model(&g, m, e);
    gclose(&g);
    return rc ? ac_errctx(e, "%s", path) : 0;
}

/* ---- tokenizer ---- */

typedef struct {
    int id;
    float score;
} scored;
static int by_score(const void *x, const void *y) {
    const scored *a = x, *b = y;
    return a->score > b->score ? -1 : a->score < b->score ? 1 : a->id - b->id;
}

/* SentencePiece-style merges: every split of a NORMAL token into two
 * tokens, tokens ranked by score (highest first), as llama.cpp's SPM
 * tokenizer merges the adjacent pair whose concatenation scores highest. */
static int spm_merges(json_t *merges, json_t *vocab, char **tok, const int *type, const float *score, int V,
                      ac_err *e) {
    scored *s = malloc(sizeof *s * (size_t)V);
    if (!s) return ac_errf(e, "out of memory");
    int ns = 0;
    for (int i = 0; i < V; i++)
        if (type[i] == TT_NORMAL && tok[i] && strlen(tok[i]) > 1) s[ns++] = (scored){i, score[i]};
    qsort(s, ns, sizeof *s, by_score);
    char buf[2048];
    for (int k = 0; k < ns; k++) {
        const char *t = tok[s[k].id];
        size_t n = strlen(t);
        if (n * 2 + 2 > sizeof buf) continue;
        for (size_t i = 1; i < n; i++) {
            if (((unsigned char)t[i] & 0xC0) == 0x80) continue; /* split at character boundaries */
            memcpy(buf, t, i);
            buf[i] = 0;
            json_t *l = json_object_get(vocab, buf), *r = json_object_get(vocab, t + i);
            if (!l || !r) continue;
            if (json_array_append_new(merges, json_pack("[s%,s]", t, i, t + i))) {
                free(s);
                return ac_errf(e, "out of memory");
            }
        }
    }
    free(s);
    return 0;
}

static json_t *pre_tokenizer(const char *pre, size_t n) {
    const char *re = n == 9 && !memcmp(pre, "llama-bpe", 9) ? GG_RE_LLAMA3
                     : n == 5 && !memcmp(pre, "qwen2", 5)   ? GG_RE_QWEN2
                                                            : NULL;
    if (!re) return json_pack("{s:s,s:b,s:b}", "type", "ByteLevel", "add_prefix_space", 0, "use_regex", 1);
    return json_pack("{s:s,s:[{s:s,s:{s:s},s:s,s:b},{s:s,s:b,s:b}]}", "type", "Sequence", "pretokenizers", "type",
                     "Split", "pattern", "Regex", re, "behavior", "Isolated", "invert", 0, "type", "ByteLevel",
                     "add_prefix_space", 0, "use_regex", 0);
}

/* The tokenizer.json equivalent of the file's tokenizer metadata. */
/* The SentencePiece half of tokenizer_json: merges rebuilt from the scores,
 * the unknown token, the space-prefix normalizer. */
static int spm_finish(const gfile *g, json_t *root, json_t *merges, json_t *vocab, char **tok, int *type, float *score,
                      uint64_t V, ac_err *e) {
    const rkv *asp = find_kv(g, "tokenizer.ggml.add_space_prefix");
    int prefix = !asp || (asp->type == GG_BOOL && *asp->v);
    long long unk;
    if (spm_merges(merges, vocab, tok, type, score, (int)V, e) ||
        kv_int(g, "tokenizer.ggml.unknown_token_id", -1, &unk, e))
        return -1;
    if (unk >= 0 && (uint64_t)unk < V)
        json_object_set_new(json_object_get(root, "model"), "unk_token", json_string(tok[unk]));
    json_t *rep =
        json_pack("{s:s,s:{s:s},s:s}", "type", "Replace", "pattern", "String", " ", "content", "\xe2\x96\x81");
    json_object_set_new(root, "normalizer",
                        prefix ? json_pack("{s:s,s:[{s:s,s:s},o]}", "type", "Sequence", "normalizers", "type",
                                           "Prepend", "prepend", "\xe2\x96\x81", rep)
                               : rep);
    return 0;
}

/* The byte-level (gpt2) half of tokenizer_json: merges as stored, the
 * pre-tokenizer named by tokenizer.ggml.pre. */
static int gpt2_finish(const gfile *g, json_t *root, json_t *merges, const char *pre, size_t pn, ac_err *e) {
    cur cm;
    uint64_t nm;
    uint32_t et;
    if (!kv_array(g, "tokenizer.ggml.merges", &et, &nm, &cm) || et != GG_STR)
        return ac_errf(e, "gguf: gpt2 tokenizer without merges");
    for (uint64_t i = 0; i < nm && !cm.bad; i++) {
        uint64_t n = u64(&cm);
        const char *s = (const char *)take(&cm, n);
        if (s) json_array_append_new(merges, json_stringn(s, n));
    }
    json_object_set_new(root, "pre_tokenizer", pre_tokenizer(pre ? pre : "", pre ? pn : 0));
    if (cm.bad) return ac_errf(e, "gguf: tokenizer merges are truncated");
    return 0;
}

/* Bytes of metadata value k in the file (0 when absent). */
static uint64_t value_bytes(const gfile *g, const char *k) {
    const rkv *x = find_kv(g, k);
    if (!x) return 0;
    cur c = {x->v, g->map + g->size, 0};
    skip_value(&c, x->type, 0);
    return (uint64_t)(c.p - x->v);
}

/* What rebuilding the tokenizer of V tokens takes, about: the arrays, a
 * JSON entry a token and a merge (SentencePiece merges: at most one a byte
 * of the tokens), the strings; twice (the JSON text and the tokenizer made
 * from it). Over the parse budget: refused before anything is allocated. */
#define GG_JSON_ENTRY 128
static int tokenizer_budget(const gfile *g, uint64_t V, int sp, ac_err *e) {
    uint64_t tb = value_bytes(g, "tokenizer.ggml.tokens"), mb = value_bytes(g, "tokenizer.ggml.merges");
    uint64_t nm = sp ? tb : mb / 8;
    uint64_t need = 2 * (V * (sizeof(char *) + 8 + GG_JSON_ENTRY) + nm * GG_JSON_ENTRY + tb + mb);
    size_t budget = parse_budget;
    if (need > budget)
        return ac_errf(e, "gguf: the tokenizer's %llu tokens need about %llu bytes to parse, over the parse budget of "
                          "%zu bytes",
                       (unsigned long long)V, (unsigned long long)need, budget);
    return 0;
}

static json_t *tokenizer_json(const gfile *g, ac_err *e) {
    size_t mn = 0, pn = 0;
    const char *model = kv_str(g, "tokenizer.ggml.model", &mn), *pre = kv_str(g, "tokenizer.ggml.pre", &pn);
    int sp = model && mn == 5 && !memcmp(model, "llama", 5);
    if (!model || (!sp && !(mn == 4 && !memcmp(model, "gpt2", 4)))) {
        ac_errf(e, "gguf: tokenizer.ggml.model must be gpt2 or llama");
        return NULL;
    }
    uint32_t et, tt, st = 0;
    uint64_t V, nt, nsc = 0;
    cur ct, cty, csc;
    if (!kv_array(g, "tokenizer.ggml.tokens", &et, &V, &ct) || et != GG_STR || V == 0 || V > 1u << 22 ||
        !kv_array(g, "tokenizer.ggml.token_type", &tt, &nt, &cty) || (tt != GG_I32 && tt != GG_U32) || nt != V ||
        (sp && (!kv_array(g, "tokenizer.ggml.scores", &st, &nsc, &csc) || st != GG_F32 || nsc != V))) {
        ac_errf(e, "gguf: tokenizer tokens, token_type%s arrays are missing or inconsistent", sp ? " and scores" : "");
        return NULL;
    }
    if (tokenizer_budget(g, V, sp, e)) return NULL;
    char **tok = calloc(V, sizeof *tok);
    int *type = calloc(V, sizeof *type);
    float *score = calloc(V, sizeof *score);
    json_t *vocab = json_object(), *added = json_array(), *merges = json_array(), *root = NULL;
    if (!tok || !type || !score || !vocab || !added || !merges) {
        ac_errf(e, "out of memory");
        goto out;
    }
    for (uint64_t i = 0; i < V; i++) {
        uint64_t n = u64(&ct);
        const char *s = (const char *)take(&ct, n);
        type[i] = (int)u32(&cty);
        if (sp) {
            uint32_t f = u32(&csc);
            memcpy(&score[i], &f, 4);
        }
        if (ct.bad || !(tok[i] = strndup(s, n))) {
            ac_errf(e, "gguf: tokenizer tokens are truncated");
            goto out;
        }
        if (type[i] == TT_UNUSED || !n) continue;
        if (type[i] == TT_CONTROL || type[i] == TT_USER)
            json_array_append_new(added, json_pack("{s:I,s:s,s:b,s:b,s:b,s:b,s:b}", "id", (json_int_t)i, "content",
                                                   tok[i], "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
                                                   "special", type[i] == TT_CONTROL));
        else
            json_object_set_new(vocab, tok[i], json_integer((json_int_t)i));
    }
    root = json_pack("{s:s,s:o,s:{s:s,s:O,s:O,s:b,s:b,s:b}}", "version", "1.0", "added_tokens", json_incref(added),
                     "model", "type", "BPE", "vocab", vocab, "merges", merges, "byte_fallback", sp, "fuse_unk", sp,
                     "ignore_merges", pre && pn == 9 && !memcmp(pre, "llama-bpe", 9));
    if (!root) {
        ac_errf(e, "out of memory");
        goto out;
    }
    if (sp ? spm_finish(g, root, merges, vocab, tok, type, score, V, e) : gpt2_finish(g, root, merges, pre, pn, e)) {
        json_decref(root);
        root = NULL;
    }
out:
    for (uint64_t i = 0; tok && i < V; i++) free(tok[i]);
    free(tok);
    free(type);
    free(score);
    json_decref(vocab);
    json_decref(added);
    json_decref(merges);
    return root;
}

int ac_gguf_tokenizer(const char *path, ac_tokenizer **t, ac_err *e) {
    gfile g;
    *t = NULL;
    if (gopen(path, &g, e)) return -1;
    json_t *root = tokenizer_json(&g, e);
    gclose(&g);
    if (!root) return ac_errctx(e, "%s", path);
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!s) return ac_errf(e, "out of memory");
    int rc = ac_tok_parse(s, strlen(s), t, e);
    free(s);
    return rc ? ac_errctx(e, "%s: tokenizer", path) : 0;
}

int ac_gguf_load_buf(const void *data, size_t n, ac_model *m, ac_tokenizer **t, ac_err *e) {
    gfile g = {0};
    if (t) *t = NULL;
    g.map = (unsigned char *)data;
    g.size = n;
    if (gparse(&g, "buffer", e)) return -1;
    int rc = m ? load_model(&g, m, e) : 0;
    if (!rc && t) {
        json_t *root = tokenizer_json(&g, e);
        char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
        json_decref(root);
        rc = !s || ac_tok_parse(s, strlen(s), t, e);
        free(s);
        if (rc && m) ac_model_free(m);
    }
    gclose(&g);
    return rc ? -1 : 0;
}
