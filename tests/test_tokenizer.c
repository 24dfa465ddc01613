/* test_tokenizer.c - encode against the Python reference BPE
 * (tests/gen_fixtures.py) for a Llama-3-style and a GPT-2-style
 * tokenizer.json; decode round trip; malformed tokenizer files. */
#include <jansson.h>

#include "check.h"
#include "format/tokenizer.h"

static char fx[1024];

/* special: the added token the fixture puts at the last id (NULL: none). */
static void check_tok(const char *name, const char *special) {
    char p[1200], rel[256];
    snprintf(rel, sizeof rel, "fixtures/tok/%s", name);
    ck_build_path(fx, sizeof fx, rel);
    snprintf(p, sizeof p, "%s/tokenizer.json", fx);
    ac_tokenizer *t;
    ac_err e = {{0}};
    if (!ck_exists(p)) SKIP("no fixture %s (make fixtures)", p);
    CHECK(ac_tok_load(p, &t, &e) == 0, "%s", e.msg);
    if (!t) return;
    CHECK(!special || ac_tok_id(t, special) == ac_tok_vocab_size(t) - 1, "special token id");
    CHECK(ac_tok_id(t, "no such token") == -1, "unknown token string has an id");
    snprintf(p, sizeof p, "%s/cases.json", fx);
    json_t *cases = json_load_file(p, 0, NULL);
    CHECK(json_array_size(cases) > 5, "cases");
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *text = json_string_value(json_object_get(c, "text"));
        json_t *want = json_object_get(c, "ids");
        int *ids;
        size_t n;
        CHECK(ac_tok_encode(t, text, strlen(text), &ids, &n, &e) == 0, "%s", e.msg);
        int same = n == json_array_size(want);
        for (size_t k = 0; same && k < n; k++) same = ids[k] == json_integer_value(json_array_get(want, k));
        CHECK(same, "%s case %zu: %zu ids vs %zu expected", name, i, n, json_array_size(want));
        char *back;
        size_t bl;
        CHECK(ac_tok_decode(t, ids, n, &back, &bl, &e) == 0, "%s", e.msg);
        /* decoded: the reference decoder's text where it is not the input
         * (SentencePiece drops one leading space it did not add) */
        const char *dec = json_string_value(json_object_get(c, "decoded"));
        if (!dec) dec = text;
        CHECK(bl == strlen(dec) && memcmp(back, dec, bl) == 0, "%s case %zu: decoded '%s', want '%s'", name, i, back,
              dec);
        free(back);
        free(ids);
    }
    json_decref(cases);
    ac_tok_free(t);
}

static void test_llama3_style(void) { check_tok("tiny", "<|endoftext|>"); }
static void test_gpt2_style_pair_merges(void) { check_tok("gpt2style", "<|endoftext|>"); }
/* Qwen2-style NFC normalizer before the byte-level split (reference: Python's unicodedata) */
static void test_nfc_normalizer(void) { check_tok("nfc", "<|endoftext|>"); }
/* Llama-2 / Mistral style against the sentencepiece library */
static void test_sentencepiece_legacy_normalizers(void) { check_tok("sp_legacy", NULL); }
static void test_sentencepiece_metaspace(void) { check_tok("sp_metaspace", NULL); }

/* Metaspace with split, unknown characters fused into one <unk>: worked by hand. */
static void test_metaspace_split_fuse_unk(void) {
    const char *js =
        "{\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"vocab\":{\"<unk>\":0,\"\\u2581\":1,"
        "\"o\":2,"
        "\"\\u2581o\":3},\"merges\":[[\"\\u2581\",\"o\"]]},\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":"
        "\"\\u2581\",\"prepend_scheme\":\"always\",\"split\":true}}";
    ac_tokenizer *t;
    ac_err e = {{0}};
    CHECK(ac_tok_parse(js, strlen(js), &t, &e) == 0, "%s", e.msg);
    if (!t) return;
    int *ids;
    size_t n;
    /* "oo o" -> "_oo" "_o" -> [_o][o] [_o];  "xx o" -> "_xx" "_o" -> [_][unk] [_o] */
    CHECK(ac_tok_encode(t, "oo o", 4, &ids, &n, &e) == 0 && n == 3 && ids[0] == 3 && ids[1] == 2 && ids[2] == 3,
          "oo o: %zu ids", n);
    free(ids);
    CHECK(ac_tok_encode(t, "xx o", 4, &ids, &n, &e) == 0 && n == 3 && ids[0] == 1 && ids[1] == 0 && ids[2] == 3,
          "xx o: %zu ids", n);
    char *back;
    size_t bl;
    CHECK(ac_tok_decode(t, ids, n, &back, &bl, &e) == 0 && !strcmp(back, "<unk> o"), "decode: '%s'", back);
    free(back);
    free(ids);
    ac_tok_free(t);
}

/* Byte-level: text that is not UTF-8 is an error naming the offset; the
 * SentencePiece family falls back to byte tokens for it. */
static void test_invalid_utf8(void) {
    char p[1200], rel[256];
    const char *names[] = {"gpt2style", "sp_legacy"};
    for (int k = 0; k < 2; k++) {
        snprintf(rel, sizeof rel, "fixtures/tok/%s/tokenizer.json", names[k]);
        ck_build_path(p, sizeof p, rel);
        if (!ck_exists(p)) SKIP("no fixture %s (make fixtures)", p);
        ac_tokenizer *t;
        ac_err e = {{0}};
        CHECK(ac_tok_load(p, &t, &e) == 0, "%s", e.msg);
        if (!t) return;
        int *ids = NULL;
        size_t n = 0;
        int rc = ac_tok_encode(t, "ok \xff\xfe", 5, &ids, &n, &e);
        if (k == 0)
            CHECK(rc != 0 && strstr(e.msg, "UTF-8 at byte 3"), "byte-level accepted invalid UTF-8: %s", e.msg);
        else {
            CHECK(rc == 0 && n >= 2 && ids[n - 1] == ac_tok_id(t, "<0xFE>") && ids[n - 2] == ac_tok_id(t, "<0xFF>"),
                  "byte fallback: %s", e.msg);
            free(ids);
        }
        ac_tok_free(t);
    }
}

static void test_malformed(void) {
    const char *bad[] = {
        "{",
        "{\"model\":{\"type\":\"WordPiece\"}}",
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}",
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[\"x\"]},\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}",
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]},\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{"
        "\"Regex\":\"(\"}}}",
        /* SentencePiece-style: an unsupported normalizer; neither family recognisable */
        "{\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"vocab\":{\"a\":0},\"merges\":[]},\"normalizer\":{"
        "\"type\":\"BertNormalizer\"}}",
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ac_tokenizer *t;
        ac_err e = {{0}};
        CHECK(ac_tok_parse(bad[i], strlen(bad[i]), &t, &e) != 0 && e.msg[0], "tokenizer %zu accepted", i);
    }
}

/* Chained Replace normalizers may grow the text to 32x its length (plus
 * 4 KiB, docs/formats.md): five doublings of 4096 bytes (32x) encode, six
 * (64x) are refused with the reason. */
static void test_normalizer_growth_cap(void) {
    for (int k = 5; k <= 6; k++) {
        json_t *norms = json_array();
        for (int i = 0; i < k; i++)
            json_array_append_new(norms, json_pack("{s:s,s:{s:s},s:s}", "type", "Replace", "pattern", "String", "o",
                                                   "content", "oo"));
        json_t *tj = json_pack("{s:{s:s,s:b,s:s,s:{s:i,s:i},s:[]},s:{s:s,s:o}}", "model", "type", "BPE",
                               "byte_fallback", 1, "unk_token", "<unk>", "vocab", "<unk>", 0, "o", 1, "merges",
                               "normalizer", "type", "Sequence", "normalizers", norms);
        char *js = json_dumps(tj, JSON_COMPACT);
        json_decref(tj);
        ac_tokenizer *t = NULL;
        ac_err e = {{0}};
        CHECK(js && ac_tok_parse(js, strlen(js), &t, &e) == 0, "%d Replace normalizers: %s", k, e.msg);
        free(js);
        if (!t) continue;
        char text[4096];
        memset(text, 'o', sizeof text);
        int *ids = NULL;
        size_t n = 0;
        int rc = ac_tok_encode(t, text, sizeof text, &ids, &n, &e);
        if (k == 5)
            CHECK(rc == 0 && n == 32 * sizeof text, "32x: rc %d, %zu ids: %s", rc, n, e.msg);
        else
            CHECK(rc != 0 && strstr(e.msg, "more than 32x"), "64x not refused: rc %d (%s)", rc, e.msg);
        free(ids);
        ac_tok_free(t);
    }
}

int main(void) {
    RUN(test_llama3_style);
    RUN(test_gpt2_style_pair_merges);
    RUN(test_nfc_normalizer);
    RUN(test_sentencepiece_legacy_normalizers);
    RUN(test_sentencepiece_metaspace);
    RUN(test_metaspace_split_fuse_unk);
    RUN(test_invalid_utf8);
    RUN(test_malformed);
    RUN(test_normalizer_growth_cap);
    return DONE();
}
