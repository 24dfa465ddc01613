/*
 * tokenizer.c - see tokenizer.h.
 *
 * Data: a string->id hash table over the vocabulary, id->string array, and a
 * (left id, right id) -> (rank, merged id) hash table for merges. A word is
 * BPE-encoded by repeatedly merging its adjacent pair of lowest rank
 * (leftmost on ties); words are short, so the quadratic scan is simpler than
 * a heap and fast enough. The regex pre-tokenizer is PCRE2 with UTF and UCP
 * (\p{L}, \s follow Unicode), JIT-compiled when available.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"

#include <jansson.h>
#include <pcre2.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GPT2_PATTERN "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

typedef struct { char *key; int val; } sent;
typedef struct { uint64_t key; int rank, id; } ment;

typedef struct {
    pcre2_code *re;   /* NULL = ByteLevel without regex */
    int byte_level;   /* map bytes to unicode after this split */
    int prefix_space;
} pretok_step;

struct ac_tokenizer {
    sent *vmap; size_t vcap;        /* token string -> id */
    char **id2s; int nvocab;        /* id -> token string (NULL for holes) */
    ment *mmap; size_t mcap;        /* merge pair -> rank, id */
    int nadded; char **added; int *added_id; int *added_special;
    pretok_step steps[4]; int nsteps;
    int ignore_merges;
    int byte_dec[0x200];            /* unicode code point -> byte, -1 */
    char b2u[256][4];               /* byte -> UTF-8 of its unicode char */
};

static uint64_t fnv(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) { h ^= (unsigned char)s[i]; h *= 1099511628211ULL; }
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
    size_t n = strlen(key);
    for (size_t i = fnv(key, n) & (t->vcap - 1);; i = (i + 1) & (t->vcap - 1))
        if (!t->vmap[i].key) { t->vmap[i].key = key; t->vmap[i].val = val; return; }
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
        if (t->mmap[i].rank < 0) { t->mmap[i] = (ment){k, rank, id}; return; }
        if (t->mmap[i].key == k) return; /* first (lowest) rank wins */
    }
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n * 2) c <<= 1;
    return c;
}

static int utf8_put(char *o, unsigned cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
}

/* Decode one UTF-8 code point; returns its length (1 on invalid bytes). */
static int utf8_get(const unsigned char *s, size_t n, unsigned *cp) {
    if (s[0] < 0x80 || n < 2) { *cp = s[0]; return 1; }
    if ((s[0] & 0xE0) == 0xC0) { *cp = ((s[0] & 0x1Fu) << 6) | (s[1] & 0x3Fu); return 2; }
    if ((s[0] & 0xF0) == 0xE0 && n >= 3) { *cp = ((s[0] & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu); return 3; }
    if ((s[0] & 0xF8) == 0xF0 && n >= 4) { *cp = ((s[0] & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3Fu); return 4; }
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
    for (size_t i = 0; i < t->vcap; i++) free(t->vmap[i].key); /* keys are shared with id2s */
    free(t->vmap);
    free(t->id2s);
    free(t->mmap);
    for (int i = 0; i < t->nadded; i++) free(t->added[i]);
    free(t->added);
    free(t->added_id);
    free(t->added_special);
    for (int i = 0; i < t->nsteps; i++) pcre2_code_free(t->steps[i].re);
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
        if (beh && strcmp(beh, "Isolated") != 0) return ac_errf(e, "tokenizer.json: Split behavior %s is not supported (Isolated)", beh);
        if (json_is_true(json_object_get(p, "invert"))) return ac_errf(e, "tokenizer.json: inverted Split is not supported");
        if (compile_re(re, &s->re, e)) return -1;
    } else return ac_errf(e, "tokenizer.json: pre_tokenizer %s is not supported (Sequence, Split, ByteLevel)", ty);
    t->nsteps++;
    return 0;
}

int ac_tok_parse(const char *js, size_t len, ac_tokenizer **out, ac_err *e) {
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(js, len, 0, &je);
    if (!root) return ac_errf(e, "tokenizer.json: %s (line %d)", je.text, je.line);
    ac_tokenizer *t = calloc(1, sizeof *t);
    int rc = 0;
    if (!t) { json_decref(root); return ac_errf(e, "out of memory"); }
    init_bytes(t);
    json_t *model = json_object_get(root, "model");
    const char *mty = json_string_value(json_object_get(model, "type"));
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    json_t *added = json_object_get(root, "added_tokens");
    if (!mty || strcmp(mty, "BPE") || !json_is_object(vocab) || !json_is_array(merges)) {
        rc = ac_errf(e, "tokenizer.json: model must be BPE with vocab object and merges array");
        goto out;
    }
    if (json_is_true(json_object_get(model, "byte_fallback"))) { rc = ac_errf(e, "tokenizer.json: byte_fallback (SentencePiece-style BPE) is not supported"); goto out; }
    t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    size_t nv = json_object_size(vocab) + (json_is_array(added) ? json_array_size(added) : 0);
    t->vcap = pow2_at_least(nv);
    t->vmap = calloc(t->vcap, sizeof *t->vmap);
    int maxid = -1;
    const char *k;
    json_t *v;
    json_object_foreach(vocab, k, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 10000000) { rc = ac_errf(e, "tokenizer.json: vocab id of %s is not a valid integer", k); goto out; }
        if (json_integer_value(v) > maxid) maxid = (int)json_integer_value(v);
    }
    if (json_is_array(added))
        for (size_t i = 0; i < json_array_size(added); i++) {
            json_t *id = json_object_get(json_array_get(added, i), "id");
            const char *c = json_string_value(json_object_get(json_array_get(added, i), "content"));
            if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > 10000000 || !c || !*c) { rc = ac_errf(e, "tokenizer.json: added_tokens[%zu] needs id and content", i); goto out; }
            if (json_integer_value(id) > maxid) maxid = (int)json_integer_value(id);
        }
    t->nvocab = maxid + 1;
    t->id2s = calloc(t->nvocab + 1, sizeof *t->id2s);
    if (!t->vmap || !t->id2s) { rc = ac_errf(e, "out of memory"); goto out; }
    json_object_foreach(vocab, k, v) {
        int id = (int)json_integer_value(v);
        if (t->id2s[id]) { rc = ac_errf(e, "tokenizer.json: id %d used twice", id); goto out; }
        char *s = strdup(k);
        vput(t, s, id);
        t->id2s[id] = s;
    }
    if (json_is_array(added)) {
        size_t na = json_array_size(added);
        t->added = calloc(na + 1, sizeof *t->added);
        t->added_id = calloc(na + 1, sizeof *t->added_id);
        t->added_special = calloc(na + 1, sizeof *t->added_special);
        for (size_t i = 0; i < na; i++) {
            json_t *a = json_array_get(added, i);
            int id = (int)json_integer_value(json_object_get(a, "id"));
            t->added[t->nadded] = strdup(json_string_value(json_object_get(a, "content")));
            t->added_id[t->nadded] = id;
            t->added_special[t->nadded] = json_is_true(json_object_get(a, "special"));
            t->nadded++;
            if (!t->id2s[id]) {
                char *s = strdup(t->added[t->nadded - 1]);
                vput(t, s, id);
                t->id2s[id] = s;
            }
        }
    }
    /* every byte must have a base token for byte-level BPE */
    for (int b = 0; b < 256; b++)
        if (vget(t, t->b2u[b], strlen(t->b2u[b])) < 0) { rc = ac_errf(e, "tokenizer.json: vocab lacks the byte-level token for byte 0x%02x", b); goto out; }
    size_t nm = json_array_size(merges);
    t->mcap = pow2_at_least(nm);
    t->mmap = malloc(t->mcap * sizeof *t->mmap);
    if (!t->mmap) { rc = ac_errf(e, "out of memory"); goto out; }
    for (size_t i = 0; i < t->mcap; i++) t->mmap[i].rank = -1;
    for (size_t i = 0; i < nm; i++) {
        json_t *m = json_array_get(merges, i);
        const char *a = NULL, *b = NULL;
        char buf[1024];
        if (json_is_string(m)) {
            const char *s = json_string_value(m), *sp = strchr(s, ' ');
            if (!sp || strlen(s) >= sizeof buf) { rc = ac_errf(e, "tokenizer.json: merge %zu is not \"a b\"", i); goto out; }
            memcpy(buf, s, strlen(s) + 1);
            buf[sp - s] = 0;
            a = buf;
            b = buf + (sp - s) + 1;
        } else if (json_is_array(m) && json_array_size(m) == 2) {
            a = json_string_value(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
        }
        if (!a || !b) { rc = ac_errf(e, "tokenizer.json: merge %zu is malformed", i); goto out; }
        int ia = vget(t, a, strlen(a)), ib = vget(t, b, strlen(b));
        size_t la = strlen(a), lb = strlen(b);
        char *ab = malloc(la + lb + 1);
        memcpy(ab, a, la);
        memcpy(ab + la, b, lb + 1);
        int iab = vget(t, ab, la + lb);
        free(ab);
        if (ia < 0 || ib < 0 || iab < 0) { rc = ac_errf(e, "tokenizer.json: merge %zu (%s %s) uses tokens missing from vocab", i, a, b); goto out; }
        mput(t, ia, ib, (int)i, iab);
    }
    json_t *pt = json_object_get(root, "pre_tokenizer");
    if (json_is_object(pt) && add_pretok(t, pt, e)) { rc = -1; goto out; }
    int has_bl = 0;
    for (int i = 0; i < t->nsteps; i++) has_bl |= t->steps[i].byte_level;
    if (!has_bl) { rc = ac_errf(e, "tokenizer.json: only byte-level BPE is supported (no ByteLevel pre-tokenizer found)"); goto out; }
    json_t *norm = json_object_get(root, "normalizer");
    if (norm && !json_is_null(norm)) { rc = ac_errf(e, "tokenizer.json: normalizers are not supported"); goto out; }
out:
    json_decref(root);
    if (rc) { ac_tok_free(t); return rc; }
    *out = t;
    return 0;
}

int ac_tok_load(const char *path, ac_tokenizer **out, ac_err *e) {
    *out = NULL;
    size_t len;
    char *s = ac_read_file(path, 512u << 20, &len, e);
    if (!s) return -1;
    int rc = ac_tok_parse(s, len, out, e);
    free(s);
    return rc;
}

int ac_tok_vocab_size(const ac_tokenizer *t) { return t->nvocab; }
int ac_tok_id(const ac_tokenizer *t, const char *s) { return vget(t, s, strlen(s)); }

typedef struct { int *v; size_t n, cap; } ivec;
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
    if (direct >= 0) rc = ipush(out, direct);
    else {
        int *sym = malloc(n * sizeof *sym);
        if (!sym) rc = -1;
        size_t ns = 0;
        for (size_t i = 0; sym && i < n; i++) {
            const char *u = t->b2u[(unsigned char)w[i]];
            sym[ns++] = vget(t, u, strlen(u));
        }
        while (sym && ns > 1) {
            int best = -1, bi = -1, bid = -1;
            for (size_t i = 0; i + 1 < ns; i++) {
                const ment *m = mget(t, sym[i], sym[i + 1]);
                if (m && (best < 0 || m->rank < best)) { best = m->rank; bi = (int)i; bid = m->id; }
            }
            if (best < 0) break;
            sym[bi] = bid;
            memmove(sym + bi + 1, sym + bi + 2, (ns - bi - 2) * sizeof *sym);
            ns--;
        }
        for (size_t i = 0; sym && i < ns && !rc; i++) rc = ipush(out, sym[i]);
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
        int r = pcre2_match(st->re, (PCRE2_SPTR)s, n, pos, 0, md, NULL);
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

int ac_tok_encode(const ac_tokenizer *t, const char *text, size_t len, int **ids, size_t *n, ac_err *e) {
    ivec out = {0};
    size_t seg = 0, i = 0;
    int rc = 0;
    /* Added tokens split the raw text first (longest match at each position). */
    while (i < len && !rc) {
        int best = -1;
        size_t blen = 0;
        for (int a = 0; a < t->nadded; a++) {
            size_t al = strlen(t->added[a]);
            if (al > blen && al <= len - i && memcmp(text + i, t->added[a], al) == 0) { best = a; blen = al; }
        }
        if (best < 0) { i++; continue; }
        rc = run_steps(t, 0, text + seg, i - seg, &out, e);
        if (!rc && ipush(&out, t->added_id[best])) rc = ac_errf(e, "out of memory");
        i += blen;
        seg = i;
    }
    if (!rc) rc = run_steps(t, 0, text + seg, len - seg, &out, e);
    if (rc) { free(out.v); return -1; }
    *ids = out.v ? out.v : malloc(sizeof(int));
    *n = out.n;
    return 0;
}

int ac_tok_decode(const ac_tokenizer *t, const int *ids, size_t n, char **text, size_t *len, ac_err *e) {
    size_t cap = n * 8 + 16, o = 0;
    char *buf = malloc(cap);
    if (!buf) return ac_errf(e, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->nvocab || !t->id2s[ids[i]]) { free(buf); return ac_errf(e, "decode: unknown token id %d", ids[i]); }
        const char *s = t->id2s[ids[i]];
        size_t sl = strlen(s);
        int is_added = 0;
        for (int a = 0; a < t->nadded; a++) if (t->added_id[a] == ids[i]) is_added = 1;
        if (o + sl * 2 + 8 > cap) {
            cap = (o + sl * 2 + 8) * 2;
            char *nb = realloc(buf, cap);
            if (!nb) { free(buf); return ac_errf(e, "out of memory"); }
            buf = nb;
        }
        if (is_added) { memcpy(buf + o, s, sl); o += sl; continue; }
        for (size_t j = 0; j < sl;) {
            unsigned cp;
            j += utf8_get((const unsigned char *)s + j, sl - j, &cp);
            if (cp < 0x200 && t->byte_dec[cp] >= 0) buf[o++] = (char)t->byte_dec[cp];
            else o += utf8_put(buf + o, cp); /* not a byte-level char: keep it */
        }
    }
    buf[o] = 0;
    *text = buf;
    if (len) *len = o;
    return 0;
}
