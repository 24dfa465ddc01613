/*
 * tokenizer.c - see tokenizer.h.
 *
 * Data: a string->id hash table over the vocabulary, id->string array, and a
 * (left id, right id) -> (rank, merged id) hash table for merges. A word is
 * BPE-encoded by repeatedly merging its adjacent pair of lowest rank
 * (leftmost on ties) with a min-heap of candidate pairs over a linked list of
 * symbols, stale entries skipped: SentencePiece-style text is one "word" per
 * segment, thousands of characters long. The regex pre-tokenizer is PCRE2
 * with UTF and UCP (\p{L}, \s follow Unicode), JIT-compiled when available.
 *
 * Two families: byte-level (bytes mapped to printable characters, every
 * byte in the vocabulary) and SentencePiece-style (characters are symbols,
 * spaces become U+2581 through Replace/Prepend normalizers or a Metaspace
 * pre-tokenizer, characters outside the vocabulary fall back to <0xNN> byte
 * tokens or to the unknown token).
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "format/tokenizer.h"
#include "core/fsafe.h"

#include <assert.h>
#include <jansson.h>
#include <pcre2.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define GPT2_PATTERN "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

typedef struct {
    char *key;
    int val;
} sent;
typedef struct {
    uint64_t key;
    int rank, id;
} ment;

typedef struct {
    pcre2_code *re; /* NULL = ByteLevel without regex */
    int byte_level; /* map bytes to unicode after this split */
    int prefix_space;
} pretok_step;

/* A normalizer: Replace (from -> to), Prepend (to), or a Unicode normal
 * form (uni: utf8proc options for NFC, NFD, NFKC, NFKD). */
typedef struct {
    char *from, *to;
    int prepend, uni;
} norm_op;

struct ac_tokenizer {
    sent *vmap;
    size_t vcap; /* token string -> id */
    char **id2s;
    int nvocab; /* id -> token string (NULL for holes) */
    ment *mmap;
    size_t mcap; /* merge pair -> rank, id */
    int nadded;
    char **added;
    int *added_id;
    int *added_special;
    pretok_step steps[4];
    int nsteps;
    int ignore_merges;
    int byte_dec[0x200]; /* unicode code point -> byte, -1 */
    char b2u[256][4];    /* byte -> UTF-8 of its unicode char */
    /* SentencePiece-style */
    int sp; /* 1: characters are symbols, no byte-level map */
    int byte_fallback, fuse_unk, unk_id;
    int byte_tok[256]; /* id of "<0xNN>", -1 */
    norm_op norm[8];
    int nnorm;                    /* normalizers, in order */
    char meta[8];                 /* Metaspace replacement ("" = no Metaspace) */
    int meta_prepend, meta_split; /* prepend: 0 never, 1 first segment, 2 always */
    int strip_lead;               /* decode drops one leading space */
    char space_mark[8];           /* what spaces became (decode turns it back) */
};

static uint64_t fnv(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ULL;
    }
    return h;
}

static int vget(const ac_tokenizer *t, const char *s, size_t n) {
    if (!t->vcap) return -1;
    for (size_t i = fnv(s, n) & (t->vcap - 1);; i = (i + 1) & (t->vcap - 1)) {
        if (!t->vmap[i].key) return -1;
        if (strlen(t->vmap[i].key) == n && memcmp(t->vmap[i].key, s, n) == 0) return t->vmap[i].val;
    }
}

static void vput(ac_tokenizer *t, char *key, int val) {
    assert(key && t->vcap > 0 && (t->vcap & (t->vcap - 1)) == 0); /* a power of two with room (sized at load) */
    size_t n = strlen(key);
    for (size_t i = fnv(key, n) & (t->vcap - 1);; i = (i + 1) & (t->vcap - 1))
        if (!t->vmap[i].key) {
            t->vmap[i].key = key;
            t->vmap[i].val = val;
            return;
        }
}

static const ment *mget(const ac_tokenizer *t, int a, int b) {
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (size_t i = (k * 0x9E3779B97F4A7C15ULL >> 20) & (t->mcap - 1);; i = (i + 1) & (t->mcap - 1)) {
        if (t->mmap[i].rank < 0) return NULL;
        if (t->mmap[i].key == k) return &t->mmap[i];
    }
}

static void mput(ac_tokenizer *t, int a, int b, int rank, int id) {
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (size_t i = (k * 0x9E3779B97F4A7C15ULL >> 20) & (t->mcap - 1);; i = (i + 1) & (t->mcap - 1)) {
        if (t->mmap[i].rank < 0) {
            t->mmap[i] = (ment){k, rank, id};
            return;
        }
        if (t->mmap[i].key == k) return; /* first (lowest) rank wins */
    }
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n * 2) c <<= 1;
    return c;
}

static int utf8_put(char *o, unsigned cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    o[0] = (char)(0xE0 | (cp >> 12));
    o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
}

/* Decode one UTF-8 code point; returns its length (1 on invalid bytes). */
static int utf8_get(const unsigned char *s, size_t n, unsigned *cp) {
    if (s[0] < 0x80 || n < 2) {
        *cp = s[0];
        return 1;
    }
    if ((s[0] & 0xE0) == 0xC0) {
        *cp = ((s[0] & 0x1Fu) << 6) | (s[1] & 0x3Fu);
        return 2;
    }
    if ((s[0] & 0xF0) == 0xE0 && n >= 3) {
        *cp = ((s[0] & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
        return 3;
    }
    if ((s[0] & 0xF8) == 0xF0 && n >= 4) {
        *cp = ((s[0] & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3Fu);
        return 4;
    }
    *cp = s[0];
    return 1;
}

static void init_bytes(ac_tokenizer *t) {
    for (int i = 0; i < 0x200; i++) t->byte_dec[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int self = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        unsigned cp = self ? (unsigned)b : 256u + n++;
        memset(t->b2u[b], 0, 4);
        utf8_put(t->b2u[b], cp);
        t->byte_dec[cp] = b;
    }
}

void ac_tok_free(ac_tokenizer *t) {
    if (!t) return;
    for (size_t i = 0; t->vmap && i < t->vcap; i++) free(t->vmap[i].key); /* keys are shared with id2s */
    free(t->vmap);
    free(t->id2s);
    free(t->mmap);
    for (int i = 0; i < t->nadded; i++) free(t->added[i]);
    free(t->added);
    free(t->added_id);
    free(t->added_special);
    for (int i = 0; i < t->nsteps; i++) pcre2_code_free(t->steps[i].re);
    for (int i = 0; i < t->nnorm; i++) {
        free(t->norm[i].from);
        free(t->norm[i].to);
    }
    free(t);
}

static int compile_re(const char *pat, pcre2_code **out, ac_err *e) {
    int ec;
    PCRE2_SIZE off;
    *out = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &off, NULL);
    if (!*out) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return ac_errf(e, "tokenizer.json: regex error at %zu: %s", (size_t)off, (char *)msg);
    }
    pcre2_jit_compile(*out, PCRE2_JIT_COMPLETE);
    return 0;
}

static int add_pretok(ac_tokenizer *t, const json_t *p, ac_err *e) {
    const char *ty = json_string_value(json_object_get(p, "type"));
    if (!ty) return ac_errf(e, "tokenizer.json: pre_tokenizer without type");
    if (strcmp(ty, "Sequence") == 0) {
        json_t *arr = json_object_get(p, "pretokenizers");
        if (!json_is_array(arr)) return ac_errf(e, "tokenizer.json: Sequence without pretokenizers");
        for (size_t i = 0; i < json_array_size(arr); i++)
            if (add_pretok(t, json_array_get(arr, i), e)) return -1;
        return 0;
    }
    if (t->nsteps >= 4) return ac_errf(e, "tokenizer.json: too many pre-tokenizers");
    pretok_step *s = &t->steps[t->nsteps];
    memset(s, 0, sizeof *s);
    if (strcmp(ty, "ByteLevel") == 0) {
        json_t *ur = json_object_get(p, "use_regex");
        s->byte_level = 1;
        s->prefix_space = json_is_true(json_object_get(p, "add_prefix_space"));
        if ((!ur || json_is_true(ur)) && compile_re(GPT2_PATTERN, &s->re, e)) return -1;
    } else if (strcmp(ty, "Split") == 0) {
        json_t *pat = json_object_get(p, "pattern");
        const char *re = json_string_value(json_object_get(pat, "Regex"));
        const char *beh = json_string_value(json_object_get(p, "behavior"));
        if (!re) return ac_errf(e, "tokenizer.json: Split needs a Regex pattern");
        if (beh && strcmp(beh, "Isolated") != 0)
            return ac_errf(e, "tokenizer.json: Split behavior %s is not supported (Isolated)", beh);
        if (json_is_true(json_object_get(p, "invert")))
            return ac_errf(e, "tokenizer.json: inverted Split is not supported");
        if (compile_re(re, &s->re, e)) return -1;
    } else if (strcmp(ty, "Metaspace") == 0) {
        const char *rep = json_string_value(json_object_get(p, "replacement"));
        const char *scheme = json_string_value(json_object_get(p, "prepend_scheme"));
        json_t *aps = json_object_get(p, "add_prefix_space"), *split = json_object_get(p, "split");
        if (!rep || !*rep || strlen(rep) >= sizeof t->meta)
            return ac_errf(e, "tokenizer.json: Metaspace needs a one-character replacement");
        snprintf(t->meta, sizeof t->meta, "%s", rep);
        if (scheme) {
            if (!strcmp(scheme, "always"))
                t->meta_prepend = 2;
            else if (!strcmp(scheme, "first"))
                t->meta_prepend = 1;
            else if (!strcmp(scheme, "never"))
                t->meta_prepend = 0;
            else
                return ac_errf(e, "tokenizer.json: Metaspace prepend_scheme %s is not supported", scheme);
        } else
            t->meta_prepend = !aps || json_is_true(aps) ? 2 : 0; /* older files: add_prefix_space */
        t->meta_split = !split || json_is_true(split);
        return 0; /* not a regex step */
    } else
        return ac_errf(e, "tokenizer.json: pre_tokenizer %s is not supported (Sequence, Split, ByteLevel, Metaspace)",
                       ty);
    t->nsteps++;
    return 0;
}

static int add_normalizer(ac_tokenizer *t, const json_t *n, ac_err *e) {
    const char *ty = json_string_value(json_object_get(n, "type"));
    if (!ty) return ac_errf(e, "tokenizer.json: normalizer without type");
    if (!strcmp(ty, "Sequence")) {
        json_t *arr = json_object_get(n, "normalizers");
        if (!json_is_array(arr)) return ac_errf(e, "tokenizer.json: Sequence without normalizers");
        for (size_t i = 0; i < json_array_size(arr); i++)
            if (add_normalizer(t, json_array_get(arr, i), e)) return -1;
        return 0;
    }
    if (t->nnorm >= 8) return ac_errf(e, "tokenizer.json: too many normalizers");
    norm_op *o = &t->norm[t->nnorm];
    if (!strcmp(ty, "Prepend")) {
        const char *p = json_string_value(json_object_get(n, "prepend"));
        if (!p) return ac_errf(e, "tokenizer.json: Prepend needs a string");
        o->prepend = 1;
        if (!(o->to = strdup(p))) return ac_errf(e, "out of memory");
    } else if (!strcmp(ty, "Replace")) {
        const char *from = json_string_value(json_object_get(json_object_get(n, "pattern"), "String"));
        const char *to = json_string_value(json_object_get(n, "content"));
        if (!from || !*from || !to)
            return ac_errf(e, "tokenizer.json: Replace normalizer needs a String pattern and content (regex patterns "
                              "are not supported)");
        o->from = strdup(from);
        o->to = strdup(to);
        if (!o->from || !o->to) {
            free(o->from);
            free(o->to);
            o->from = o->to = NULL;
            return ac_errf(e, "out of memory");
        }
    } else if (!strcmp(ty, "NFC"))
        o->uni = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    else if (!strcmp(ty, "NFD"))
        o->uni = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
    else if (!strcmp(ty, "NFKC"))
        o->uni = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    else if (!strcmp(ty, "NFKD"))
        o->uni = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    else
        return ac_errf(
            e, "tokenizer.json: normalizer %s is not supported (Sequence, Prepend, Replace, NFC, NFD, NFKC, NFKD)", ty);
    t->nnorm++;
    return 0;
}

/* The vocabulary (and added tokens' ids): the id -> string table and the
 * string -> id hash, sized for both. */
static int load_vocab(ac_tokenizer *t, json_t *vocab, json_t *added, ac_err *e) {
    size_t nv = json_object_size(vocab) + (json_is_array(added) ? json_array_size(added) : 0);
    t->vcap = pow2_at_least(nv);
    t->vmap = calloc(t->vcap, sizeof *t->vmap);
    int maxid = -1;
    const char *k;
    json_t *v;
    json_object_foreach(vocab, k, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 10000000)
            return ac_errf(e, "tokenizer.json: vocab id of %s is not a valid integer", k);
        if (json_integer_value(v) > maxid) maxid = (int)json_integer_value(v);
    }
    if (json_is_array(added))
        for (size_t i = 0; i < json_array_size(added); i++) {
            json_t *id = json_object_get(json_array_get(added, i), "id");
            const char *c = json_string_value(json_object_get(json_array_get(added, i), "content"));
            if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > 10000000 || !c || !*c)
                return ac_errf(e, "tokenizer.json: added_tokens[%zu] needs id and content", i);
            if (json_integer_value(id) > maxid) maxid = (int)json_integer_value(id);
        }
    t->nvocab = maxid + 1;
    t->id2s = calloc(t->nvocab + 1, sizeof *t->id2s);
    if (!t->vmap || !t->id2s) return ac_errf(e, "out of memory");
    json_object_foreach(vocab, k, v) {
        int id = (int)json_integer_value(v);
        if (t->id2s[id]) return ac_errf(e, "tokenizer.json: id %d used twice", id);
        char *s = strdup(k);
        if (!s) return ac_errf(e, "out of memory");
        vput(t, s, id);
        t->id2s[id] = s;
    }
    return 0;
}

/* added_tokens, matched in raw text before pre-tokenization. */
static int load_added(ac_tokenizer *t, json_t *added, ac_err *e) {
    if (json_is_array(added)) {
        size_t na = json_array_size(added);
        t->added = calloc(na + 1, sizeof *t->added);
        t->added_id = calloc(na + 1, sizeof *t->added_id);
        t->added_special = calloc(na + 1, sizeof *t->added_special);
        if (!t->added || !t->added_id || !t->added_special) return ac_errf(e, "out of memory");
        for (size_t i = 0; i < na; i++) {
            json_t *a = json_array_get(added, i);
            int id = (int)json_integer_value(json_object_get(a, "id"));
            t->added[t->nadded] = strdup(json_string_value(json_object_get(a, "content")));
            if (!t->added[t->nadded]) return ac_errf(e, "out of memory");
            t->added_id[t->nadded] = id;
            t->added_special[t->nadded] = json_is_true(json_object_get(a, "special"));
            t->nadded++;
            if (!t->id2s[id]) {
                char *s = strdup(t->added[t->nadded - 1]);
                if (!s) return ac_errf(e, "out of memory");
                vput(t, s, id);
                t->id2s[id] = s;
            }
        }
    }
    return 0;
}

/* merges: "a b" strings or [a, b] pairs, rank = index. */
static int load_merges(ac_tokenizer *t, json_t *merges, ac_err *e) {
    size_t nm = json_array_size(merges);
    t->mcap = pow2_at_least(nm);
    t->mmap = malloc(t->mcap * sizeof *t->mmap);
    if (!t->mmap) return ac_errf(e, "out of memory");
    for (size_t i = 0; i < t->mcap; i++) t->mmap[i].rank = -1;
    for (size_t i = 0; i < nm; i++) {
        json_t *m = json_array_get(merges, i);
        const char *a = NULL, *b = NULL;
        char buf[1024];
        if (json_is_string(m)) {
            const char *s = json_string_value(m), *sp = strchr(s, ' ');
            if (!sp || strlen(s) >= sizeof buf) return ac_errf(e, "tokenizer.json: merge %zu is not \"a b\"", i);
            memcpy(buf, s, strlen(s) + 1);
            buf[sp - s] = 0;
            a = buf;
            b = buf + (sp - s) + 1;
        } else if (json_is_array(m) && json_array_size(m) == 2) {
            a = json_string_value(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
        }
        if (!a || !b) return ac_errf(e, "tokenizer.json: merge %zu is malformed", i);
        int ia = vget(t, a, strlen(a)), ib = vget(t, b, strlen(b));
        size_t la = strlen(a), lb = strlen(b);
        char *ab = malloc(la + lb + 1);
        if (!ab) return ac_errf(e, "out of memory");
        memcpy(ab, a, la);
        memcpy(ab + la, b, lb + 1);
        int iab = vget(t, ab, la + lb);
        free(ab);
        if (ia < 0 || ib < 0 || iab < 0)
            return ac_errf(e, "tokenizer.json: merge %zu (%s %s) uses tokens missing from vocab", i, a, b);
        mput(t, ia, ib, (int)i, iab);
    }
    return 0;
}

/* Byte-level (GPT-2 / Llama-3) or SentencePiece-style, from the
 * pre-tokenizer and normalizers: what each needs from the vocabulary. */
static int finish_kind(ac_tokenizer *t, json_t *model, ac_err *e) {
    int has_bl = 0, has_prepend = 0; /* has_prepend: Prepend, or Replace of spaces (SentencePiece markers) */
    for (int i = 0; i < t->nsteps; i++) has_bl |= t->steps[i].byte_level;
    for (int i = 0; i < t->nnorm; i++)
        has_prepend |= t->norm[i].prepend || (t->norm[i].from && !strcmp(t->norm[i].from, " "));
    t->sp = !has_bl;
    if (has_bl) {
        if (t->meta[0]) return ac_errf(e, "tokenizer.json: Metaspace with a ByteLevel pre-tokenizer is not supported");
        /* every byte must have a base token for byte-level BPE */
        for (int b = 0; b < 256; b++)
            if (vget(t, t->b2u[b], strlen(t->b2u[b])) < 0)
                return ac_errf(e, "tokenizer.json: vocab lacks the byte-level token for byte 0x%02x", b);
    } else {
        if (!t->byte_fallback && !has_prepend && !t->meta[0])
            return ac_errf(e, "tokenizer.json: neither byte-level (ByteLevel pre-tokenizer) nor SentencePiece-style "
                              "(byte_fallback, Metaspace, Replace/Prepend normalizers) BPE");
        for (int b = 0; b < 256; b++) {
            char bt[8];
            snprintf(bt, sizeof bt, "<0x%02X>", b);
            t->byte_tok[b] = vget(t, bt, strlen(bt));
        }
        const char *unk = json_string_value(json_object_get(model, "unk_token"));
        t->unk_id = unk ? vget(t, unk, strlen(unk)) : -1;
        for (int i = 0; i < t->nnorm; i++) t->strip_lead |= t->norm[i].prepend;
        t->strip_lead |= t->meta[0] && t->meta_prepend;
        /* the Metaspace replacement, else a Replace of spaces, else U+2581 */
        snprintf(t->space_mark, sizeof t->space_mark, "%s", t->meta[0] ? t->meta : "\xe2\x96\x81");
        for (int i = 0; i < t->nnorm && !t->meta[0]; i++)
            if (t->norm[i].from && !strcmp(t->norm[i].from, " ") && *t->norm[i].to &&
                strlen(t->norm[i].to) < sizeof t->space_mark)
                snprintf(t->space_mark, sizeof t->space_mark, "%s", t->norm[i].to);
    }
    return 0;
}

int ac_tok_parse(const char *js, size_t len, ac_tokenizer **out, ac_err *e) {
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(js, len, 0, &je);
    char why[160];
    if (!root) return ac_errf(e, "tokenizer.json: %s (line %d)", ac_fsafe_json_why(je.text, why, sizeof why), je.line);
    ac_tokenizer *t = calloc(1, sizeof *t);
    int rc = 0;
    if (!t) {
        json_decref(root);
        return ac_errf(e, "out of memory");
    }
    init_bytes(t);
    json_t *model = json_object_get(root, "model");
    const char *mty = json_string_value(json_object_get(model, "type"));
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    json_t *added = json_object_get(root, "added_tokens");
    if (!mty || strcmp(mty, "BPE") || !json_is_object(vocab) || !json_is_array(merges)) {
        rc = ac_errf(e, "tokenizer.json: model must be BPE with vocab object and merges array");
        goto out;
    }
    t->byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
    t->fuse_unk = json_is_true(json_object_get(model, "fuse_unk"));
    if (json_object_get(model, "continuing_subword_prefix") &&
        !json_is_null(json_object_get(model, "continuing_subword_prefix"))) {
        rc = ac_errf(e, "tokenizer.json: continuing_subword_prefix is not supported");
        goto out;
    }
    t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    if (load_vocab(t, vocab, added, e) || load_added(t, added, e) || load_merges(t, merges, e)) {
        rc = -1;
        goto out;
    }
    json_t *pt = json_object_get(root, "pre_tokenizer");
    if (json_is_object(pt) && add_pretok(t, pt, e)) {
        rc = -1;
        goto out;
    }
    json_t *norm = json_object_get(root, "normalizer");
    if (json_is_object(norm) && add_normalizer(t, norm, e)) {
        rc = -1;
        goto out;
    }
    rc = finish_kind(t, model, e);
out:
    json_decref(root);
    if (rc) {
        ac_tok_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int ac_tok_load(const char *path, ac_tokenizer **out, ac_err *e) {
    *out = NULL;
    size_t len;
    char *s = ac_fsafe_read(path, AC_FK_TOKENIZER, &len, e); /* confined, size-capped */
    if (!s) return -1;
    int rc = ac_tok_parse(s, len, out, e);
    free(s);
    return rc;
}

int ac_tok_vocab_size(const ac_tokenizer *t) { return t->nvocab; }
int ac_tok_id(const ac_tokenizer *t, const char *s) { return vget(t, s, strlen(s)); }

typedef struct {
    int *v;
    size_t n, cap;
} ivec;
static int ipush(ivec *a, int x) {
    if (a->n == a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 256;
        int *nv = realloc(a->v, nc * sizeof *nv);
        if (!nv) return -1;
        a->v = nv;
        a->cap = nc;
    }
    a->v[a->n++] = x;
    return 0;
}

/* Min-heap entry: the pair starting at symbol `pos`, valid while both its
 * symbols still have the ids it was made from. */
typedef struct {
    int rank, pos, left, right, id;
} cand;

static int cand_less(const cand *a, const cand *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(cand *h, size_t *n, cand c) {
    size_t i = (*n)++;
    while (i > 0 && cand_less(&c, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = c;
}

static cand heap_pop(cand *h, size_t *n) {
    cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_less(&h[c + 1], &h[c])) c++;
        if (!cand_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

/* Merge the symbol ids sym[0..ns) by rank (leftmost first on ties) and
 * append the result to out. Returns 0 or -1 (out of memory). */
static int bpe_merge(const ac_tokenizer *t, int *sym, size_t ns, ivec *out) {
    if (ns == 0) return 0;
    int *next = malloc(ns * sizeof *next), *prev = malloc(ns * sizeof *prev);
    size_t cap = ns * 2 + 1, nh = 0;
    cand *h = malloc(cap * sizeof *h);
    int rc = 0;
    if (!next || !prev || !h) {
        rc = -1;
        goto out;
    }
    for (size_t i = 0; i < ns; i++) {
        next[i] = i + 1 < ns ? (int)i + 1 : -1;
        prev[i] = (int)i - 1;
    }
    for (size_t i = 0; i + 1 < ns; i++) {
        const ment *m = mget(t, sym[i], sym[i + 1]);
        if (m) heap_push(h, &nh, (cand){m->rank, (int)i, sym[i], sym[i + 1], m->id});
    }
    while (nh) {
        cand c = heap_pop(h, &nh);
        int r = next[c.pos];
        if (sym[c.pos] != c.left || r < 0 || sym[r] != c.right) continue; /* stale */
        sym[c.pos] = c.id;
        sym[r] = -1;
        next[c.pos] = next[r];
        if (next[r] >= 0) prev[next[r]] = c.pos;
        if (nh + 2 > cap) {
            cand *nh2 = realloc(h, (cap *= 2) * sizeof *h);
            if (!nh2) {
                rc = -1;
                goto out;
            }
            h = nh2;
        }
        const ment *m;
        if (prev[c.pos] >= 0 && (m = mget(t, sym[prev[c.pos]], c.id)))
            heap_push(h, &nh, (cand){m->rank, prev[c.pos], sym[prev[c.pos]], c.id, m->id});
        if (next[c.pos] >= 0 && (m = mget(t, c.id, sym[next[c.pos]])))
            heap_push(h, &nh, (cand){m->rank, c.pos, c.id, sym[next[c.pos]], m->id});
    }
    for (int i = 0; i >= 0 && !rc; i = next[i]) rc = ipush(out, sym[i]);
out:
    free(next);
    free(prev);
    free(h);
    return rc;
}

/* BPE-encode one pre-token given as raw bytes. */
static int bpe_word(const ac_tokenizer *t, const char *w, size_t n, ivec *out) {
    char stack_buf[1024];
    char *mapped = n * 2 + 1 <= sizeof stack_buf ? stack_buf : malloc(n * 2 + 1);
    if (!mapped) return -1;
    size_t mlen = 0;
    for (size_t i = 0; i < n; i++) {
        const char *u = t->b2u[(unsigned char)w[i]];
        size_t ul = strlen(u);
        memcpy(mapped + mlen, u, ul);
        mlen += ul;
    }
    int rc = 0;
    int direct = t->ignore_merges ? vget(t, mapped, mlen) : -1;
    if (direct >= 0)
        rc = ipush(out, direct);
    else {
        int *sym = malloc(n * sizeof *sym);
        size_t ns = 0;
        for (size_t i = 0; sym && i < n; i++) {
            const char *u = t->b2u[(unsigned char)w[i]];
            sym[ns++] = vget(t, u, strlen(u));
        }
        rc = !sym || bpe_merge(t, sym, ns, out);
        free(sym);
    }
    if (mapped != stack_buf) free(mapped);
    return rc;
}

/* Split [s, s+n) by the regex of step k (Isolated: matches and the gaps
 * between them are both pieces) and hand each piece to the next step. */
static int run_steps(const ac_tokenizer *t, int k, const char *s, size_t n, ivec *out, ac_err *e) {
    if (n == 0) return 0;
    if (k == t->nsteps) return bpe_word(t, s, n, out) ? ac_errf(e, "out of memory") : 0;
    const pretok_step *st = &t->steps[k];
    if (!st->re) return run_steps(t, k + 1, s, n, out, e);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(st->re, NULL);
    if (!md) return ac_errf(e, "out of memory");
    size_t pos = 0;
    int rc = 0;
    while (pos < n && !rc) {
        /* the text was validated once in ac_tok_encode: without
         * NO_UTF_CHECK PCRE2 re-validates the whole subject on every call,
         * which makes encoding quadratic in the text length */
        int r = pcre2_match(st->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (r == PCRE2_ERROR_NOMATCH) break;
        if (r < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(r, msg, sizeof msg);
            rc = ac_errf(e, "tokenizer regex: %s", (char *)msg);
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms > pos) rc = run_steps(t, k + 1, s + pos, ms - pos, out, e);
        if (!rc && me > ms) rc = run_steps(t, k + 1, s + ms, me - ms, out, e);
        if (me == ms) { /* empty match: step over one code point */
            unsigned cp;
            me = ms + utf8_get((const unsigned char *)s + ms, n - ms, &cp);
            if (!rc) rc = run_steps(t, k + 1, s + ms, me - ms, out, e);
        }
        pos = me;
    }
    if (!rc && pos < n) rc = run_steps(t, k + 1, s + pos, n - pos, out, e);
    pcre2_match_data_free(md);
    return rc;
}

/* SentencePiece-style BPE of one pre-token: a symbol per UTF-8 character;
 * a character outside the vocabulary becomes its <0xNN> byte tokens
 * (byte_fallback) or the unknown token (consecutive ones fused). */
static int sp_word(const ac_tokenizer *t, const char *w, size_t n, ivec *out, ac_err *e) {
    int *sym = malloc((n + 1) * sizeof *sym);
    if (!sym) return ac_errf(e, "out of memory");
    size_t ns = 0;
    int prev_unk = 0;
    for (size_t i = 0; i < n;) {
        unsigned cp;
        size_t cl = (size_t)utf8_get((const unsigned char *)w + i, n - i, &cp);
        int id = vget(t, w + i, cl), fb = t->byte_fallback;
        for (size_t k = 0; id < 0 && fb && k < cl; k++) fb = t->byte_tok[(unsigned char)w[i + k]] >= 0;
        if (id >= 0) {
            sym[ns++] = id;
            prev_unk = 0;
        } else if (fb) {
            /* a symbol per byte: more symbols than characters, so grow */
            int *g = realloc(sym, (ns + cl + (n - i)) * sizeof *sym);
            if (!g) {
                free(sym);
                return ac_errf(e, "out of memory");
            }
            sym = g;
            for (size_t k = 0; k < cl; k++) sym[ns++] = t->byte_tok[(unsigned char)w[i + k]];
            prev_unk = 0;
        } else {
            if (t->unk_id < 0) {
                free(sym);
                return ac_errf(e, "tokenizer: character at byte %zu is not in the vocabulary and there is no unk_token",
                               i);
            }
            if (!(t->fuse_unk && prev_unk)) sym[ns++] = t->unk_id;
            prev_unk = 1;
        }
        i += cl;
    }
    int rc = bpe_merge(t, sym, ns, out);
    free(sym);
    return rc ? ac_errf(e, "out of memory") : 0;
}

/* Normalized text may grow to this many times its input (plus 4 KiB): a
 * chain of Replace normalizers whose content holds the pattern grows it
 * geometrically (a 900-byte tokenizer.json asked for 6.7 GB). */
#define AC_NORM_GROWTH 32

/* Replace every occurrence of `from` in s[0..*n) by `to`; returns a new
 * string (the old one freed) or NULL; NULL with *n = SIZE_MAX when the
 * result would exceed cap bytes. */
static char *replace_all(char *s, size_t *n, const char *from, const char *to, size_t cap) {
    size_t fl = strlen(from), tl = strlen(to), cnt = 0;
    for (size_t i = 0; i + fl <= *n; i++)
        if (!memcmp(s + i, from, fl)) {
            cnt++;
            i += fl - 1;
        }
    size_t need = *n + cnt * (tl > fl ? tl - fl : 0);
    if (need > cap) {
        free(s);
        *n = SIZE_MAX;
        return NULL;
    }
    char *o = malloc(need + 1);
    if (!o) {
        free(s);
        return NULL;
    }
    size_t k = 0;
    for (size_t i = 0; i < *n;) {
        if (i + fl <= *n && !memcmp(s + i, from, fl)) {
            memcpy(o + k, to, tl);
            k += tl;
            i += fl;
        } else
            o[k++] = s[i++];
    }
    o[k] = 0;
    free(s);
    *n = k;
    return o;
}

static char *prepend(char *s, size_t *n, const char *p) {
    size_t pl = strlen(p);
    char *o = malloc(*n + pl + 1);
    if (o) {
        memcpy(o, p, pl);
        memcpy(o + pl, s, *n + 1);
        *n += pl;
    }
    free(s);
    return o;
}

/* The normalizers in order over text[0..len): a new string (*n bytes), or
 * NULL with e set. Prepend leaves empty text empty, as Hugging Face does. */
static char *normalize(const ac_tokenizer *t, const char *text, size_t len, size_t *n, ac_err *e) {
    char *s = malloc(len + 1);
    if (!s) {
        ac_errf(e, "out of memory");
        return NULL;
    }
    memcpy(s, text, len);
    s[len] = 0;
    *n = len;
    size_t cap = AC_NORM_GROWTH * len + 4096;
    for (int i = 0; i < t->nnorm && s; i++) {
        const norm_op *o = &t->norm[i];
        if (o->uni) {
            utf8proc_uint8_t *u = NULL;
            utf8proc_ssize_t r =
                utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)*n, &u, (utf8proc_option_t)o->uni);
            free(s);
            if (r < 0) {
                ac_errf(e, "tokenizer: Unicode normalization: %s", utf8proc_errmsg(r));
                return NULL;
            }
            s = (char *)u;
            *n = (size_t)r;
        } else if (o->prepend) {
            if (*n) s = prepend(s, n, o->to);
        } else
            s = replace_all(s, n, o->from, o->to, cap);
        if (s && *n > cap) {
            free(s);
            s = NULL;
            *n = SIZE_MAX;
        }
        if (!s) {
            if (*n == SIZE_MAX)
                ac_errf(e, "tokenizer: the normalizers grow the text more than %dx (tokenizer.json)", AC_NORM_GROWTH);
            else
                ac_errf(e, "out of memory");
            return NULL;
        }
    }
    return s;
}

/* A segment of text between added tokens, SentencePiece-style: normalizers,
 * Metaspace (spaces -> replacement, prefix, split before each replacement),
 * then BPE. first: the segment starts the text (prepend_scheme "first"). */
static int sp_segment(const ac_tokenizer *t, const char *text, size_t len, int first, ivec *out, ac_err *e) {
    size_t n;
    char *s = normalize(t, text, len, &n, e);
    if (!s) return -1;
    if (t->meta[0] && n) {
        s = replace_all(s, &n, " ", t->meta, AC_NORM_GROWTH * len + 4096);
        size_t ml = strlen(t->meta);
        if (s && (t->meta_prepend == 2 || (t->meta_prepend == 1 && first)) && (n < ml || memcmp(s, t->meta, ml)))
            s = prepend(s, &n, t->meta);
    }
    if (!s)
        return n == SIZE_MAX
                   ? ac_errf(e, "tokenizer: the Metaspace replacement grows the text more than %dx", AC_NORM_GROWTH)
                   : ac_errf(e, "out of memory");
    int rc = 0;
    if (t->meta[0] && t->meta_split) {
        size_t ml = strlen(t->meta), st = 0;
        for (size_t i = ml; i <= n && !rc; i++)
            if (i == n || (i + ml <= n && !memcmp(s + i, t->meta, ml))) {
                rc = sp_word(t, s + st, i - st, out, e);
                st = i;
            }
    } else {
        rc = sp_word(t, s, n, out, e);
    }
    free(s);
    return rc;
}

/* Offset of the first byte that is not well-formed UTF-8 (overlong forms,
 * surrogates and code points above U+10FFFF included), or n. */
static size_t utf8_invalid_at(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t len = c < 0x80                   ? 1
                     : (c >= 0xC2 && c <= 0xDF) ? 2
                     : (c >= 0xE0 && c <= 0xEF) ? 3
                     : (c >= 0xF0 && c <= 0xF4) ? 4
                                                : 0;
        if (!len || i + len > n) return i;
        for (size_t k = 1; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80) return i;
        if ((c == 0xE0 && s[i + 1] < 0xA0) || (c == 0xED && s[i + 1] > 0x9F) || (c == 0xF0 && s[i + 1] < 0x90) ||
            (c == 0xF4 && s[i + 1] > 0x8F))
            return i;
        i += len;
    }
    return n;
}

static int encode_segment(const ac_tokenizer *t, const char *s, size_t n, int first, ivec *out, ac_err *e) {
    if (t->sp) return n ? sp_segment(t, s, n, first, out, e) : 0;
    if (!t->nnorm) return run_steps(t, 0, s, n, out, e);
    size_t nn;
    char *ns = normalize(t, s, n, &nn, e);
    if (!ns) return -1;
    int rc = run_steps(t, 0, ns, nn, out, e);
    free(ns);
    return rc;
}

int ac_tok_encode(const ac_tokenizer *t, const char *text, size_t len, int **ids, size_t *n, ac_err *e) {
    size_t bad = t->sp ? len : utf8_invalid_at((const unsigned char *)text, len);
    if (bad < len) return ac_errf(e, "tokenizer: text is not valid UTF-8 at byte %zu", bad);
    ivec out = {0};
    size_t seg = 0, i = 0;
    int rc = 0;
    /* Added tokens split the raw text first (longest match at each position). */
    while (i < len && !rc) {
        int best = -1;
        size_t blen = 0;
        for (int a = 0; a < t->nadded; a++) {
            size_t al = strlen(t->added[a]);
            if (al > blen && al <= len - i && memcmp(text + i, t->added[a], al) == 0) {
                best = a;
                blen = al;
            }
        }
        if (best < 0) {
            i++;
            continue;
        }
        rc = encode_segment(t, text + seg, i - seg, seg == 0, &out, e);
        if (!rc && ipush(&out, t->added_id[best])) rc = ac_errf(e, "out of memory");
        i += blen;
        seg = i;
    }
    if (!rc) rc = encode_segment(t, text + seg, len - seg, seg == 0, &out, e);
    if (rc) {
        free(out.v);
        return -1;
    }
    *ids = out.v ? out.v : malloc(sizeof(int));
    if (!*ids) return ac_errf(e, "out of memory");
    *n = out.n;
    return 0;
}

int ac_tok_decode(const ac_tokenizer *t, const int *ids, size_t n, char **text, size_t *len, ac_err *e) {
    size_t cap = n * 8 + 16, o = 0;
    char *buf = malloc(cap);
    if (!buf) return ac_errf(e, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->nvocab || !t->id2s[ids[i]]) {
            free(buf);
            return ac_errf(e, "decode: unknown token id %d", ids[i]);
        }
        const char *s = t->id2s[ids[i]];
        size_t sl = strlen(s);
        int is_added = 0;
        for (int a = 0; a < t->nadded; a++)
            if (t->added_id[a] == ids[i]) is_added = 1;
        if (o + sl * 2 + 8 > cap) {
            cap = (o + sl * 2 + 8) * 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                return ac_errf(e, "out of memory");
            }
            buf = nb;
        }
        if (is_added) {
            memcpy(buf + o, s, sl);
            o += sl;
            continue;
        }
        if (t->sp) {
            if (sl == 6 && !strncmp(s, "<0x", 3) && s[5] == '>') {
                long b = strtol(s + 3, NULL, 16);
                if (b >= 0 && b < 256 && t->byte_tok[b] == ids[i]) {
                    buf[o++] = (char)b;
                    continue;
                }
            }
            const char *sep = t->space_mark;
            size_t ml = strlen(sep);
            for (size_t j = 0; j < sl;) {
                if (j + ml <= sl && !memcmp(s + j, sep, ml)) {
                    buf[o++] = ' ';
                    j += ml;
                } else
                    buf[o++] = s[j++];
            }
            continue;
        }
        for (size_t j = 0; j < sl;) {
            unsigned cp;
            j += utf8_get((const unsigned char *)s + j, sl - j, &cp);
            if (cp < 0x200 && t->byte_dec[cp] >= 0)
                buf[o++] = (char)t->byte_dec[cp];
            else
                o += utf8_put(buf + o, cp); /* not a byte-level char: keep it */
        }
    }
    buf[o] = 0;
    if (t->sp && t->strip_lead && o && buf[0] == ' ') memmove(buf, buf + 1, o--); /* the prefix space added at encode */
    *text = buf;
    if (len) *len = o;
    return 0;
}
