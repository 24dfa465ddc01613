/*
 * test_digest.c - the daemon's one SHA-256 (daemon/digest.c, GnuTLS) against
 * the FIPS 180-2 example digests, and the per-job secrets (jobsecret.c) and
 * their constant-time check built on it.
 */
#include <stdlib.h>

#include "check.h"
#include "digest.h"
#include "jobsecret.h"

static void test_fips_vectors(void) {
    static const struct {
        const char *text, *hex;
    } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    };
    char hex[DIGEST_HEX_LEN + 1];
    ac_err e = {{0}};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        CHECK(digest_sha256_hex(v[i].text, strlen(v[i].text), hex, &e) == 0, "%s", e.msg);
        CHECK(!strcmp(hex, v[i].hex), "SHA-256(\"%s\") = %s", v[i].text, hex);
    }
    char *million = malloc(1000000);
    CHECK(million != NULL, "out of memory");
    if (!million) return;
    memset(million, 'a', 1000000);
    CHECK(digest_sha256_hex(million, 1000000, hex, &e) == 0, "%s", e.msg);
    CHECK(!strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"), "a million a: %s", hex);
    free(million);
}

static void test_equal(void) {
    CHECK(digest_equal("abcdef", "abcdef", 6) && digest_equal("", "", 0), "equal bytes differ");
    CHECK(!digest_equal("abcdef", "abcdeg", 6) && !digest_equal("xbcdef", "abcdef", 6), "unequal bytes equal");
}

static void test_job_secrets(void) {
    char s[JOBSECRET_LEN + 1], t[JOBSECRET_LEN + 1], h[JOBSECRET_HASH_LEN + 1], d[DIGEST_HEX_LEN + 1];
    ac_err e = {{0}};
    CHECK(jobsecret_new(s, sizeof s, &e) == 0 && jobsecret_new(t, sizeof t, &e) == 0, "%s", e.msg);
    CHECK(strlen(s) == JOBSECRET_LEN && strspn(s, "0123456789abcdef") == JOBSECRET_LEN && strcmp(s, t), "%s %s", s, t);
    CHECK(jobsecret_hash(s, h, &e) == 0 && digest_sha256_hex(s, strlen(s), d, &e) == 0 && !strcmp(h, d),
          "the secret's hash is not its SHA-256");
    CHECK(jobsecret_matches(s, h), "a secret does not match its own hash");
    CHECK(!jobsecret_matches(t, h) && !jobsecret_matches(NULL, h) && !jobsecret_matches("", h), "another secret matched");
    char shorter[JOBSECRET_HASH_LEN];
    memcpy(shorter, h, JOBSECRET_HASH_LEN - 1);
    shorter[JOBSECRET_HASH_LEN - 1] = 0;
    CHECK(!jobsecret_matches(s, shorter) && !jobsecret_matches(s, ""), "a cut hash matched");
    s[0] = s[0] == '0' ? '1' : '0';
    CHECK(!jobsecret_matches(s, h), "a changed secret matched");
}

int main(void) {
    RUN(test_fips_vectors);
    RUN(test_equal);
    RUN(test_job_secrets);
    return DONE();
}
