/*
 * jobsecret.c - per-job secrets: made, hashed, checked (jobsecret.h).
 */
#include "jobsecret.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

static void to_hex(const unsigned char *b, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[2 * n] = 0;
}

int jobsecret_new(char *out, size_t n, ac_err *e) {
    unsigned char r[JOBSECRET_BYTES];
    if (n < JOBSECRET_LEN + 1) return ac_errf(e, "job secret: buffer too small");
    size_t got = 0;
    while (got < sizeof r) {
        ssize_t k = getrandom(r + got, sizeof r - got, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return ac_errf(e, "job secret: getrandom: %s", strerror(errno));
        got += (size_t)k;
    }
    to_hex(r, sizeof r, out);
    return 0;
}

int jobsecret_hash(const char *secret, char hash[JOBSECRET_HASH_LEN + 1], ac_err *e) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (!EVP_Digest(secret, strlen(secret), md, &len, EVP_sha256(), NULL) || len != JOBSECRET_HASH_LEN / 2)
        return ac_errf(e, "job secret: SHA-256 failed");
    to_hex(md, len, hash);
    return 0;
}

int jobsecret_matches(const char *secret, const char *hash) {
    char h[JOBSECRET_HASH_LEN + 1];
    ac_err e;
    if (!secret || !secret[0] || !hash || strlen(hash) != JOBSECRET_HASH_LEN || jobsecret_hash(secret, h, &e))
        return 0;
    return CRYPTO_memcmp(h, hash, JOBSECRET_HASH_LEN) == 0;
}
