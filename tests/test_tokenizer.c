/* test_tokenizer.c - encode against the Python reference BPE
 * (tests/gen_fixtures.py) for a Llama-3-style and a GPT-2-style
 * tokenizer.json; decode round trip; malformed tokenizer files. */
#include <jansson.h>

#include "check.h"
#include "tokenizer.h"

static char fx[1024];

static void check_tok(const char *name) {
    char p[1200], rel[256];
    snprintf(rel, sizeof rel, "fixtures/tok/%s", name);
    ck_build_path(fx, sizeof fx, rel);
    snprintf(p, sizeof p, "%s/tokenizer.json", fx);
    ac_tokenizer *t;
    ac_err e = {{0}};
    if (!ck_exists(p)) SKIP("no fixture %s (make fixtures)", p);
    CHECK(ac_tok_load(p, &t, &e) == 0, "%s", e.msg);
    if (!t) return;
    /* the fixtures append <|endoftext|> as the last id */
    CHECK(ac_tok_id(t, "<|endoftext|>") == ac_tok_vocab_size(t) - 1 && ac_tok_id(t, "no such token") == -1, "special token id");
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
        CHECK(bl == strlen(text) && memcmp(back, text, bl) == 0, "%s case %zu: decode round trip", name, i);
        free(back);
        free(ids);
    }
    json_decref(cases);
    ac_tok_free(t);
}

static void test_llama3_style(void) { check_tok("tiny"); }
static void test_gpt2_style_pair_merges(void) { check_tok("gpt2style"); }

static void test_malformed(void) {
    const char *bad[] = {
        "{",
        "{\"model\":{\"type\":\"WordPiece\"}}",
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}",
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[\"x\"]},\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}",
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]},\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"}}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ac_tokenizer *t;
        ac_err e = {{0}};
        CHECK(ac_tok_parse(bad[i], strlen(bad[i]), &t, &e) != 0 && e.msg[0], "tokenizer %zu accepted", i);
    }
}

int main(void) {
    RUN(test_llama3_style);
    RUN(test_gpt2_style_pair_merges);
    RUN(test_malformed);
    return DONE();
}
