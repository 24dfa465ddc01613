/*
 * jobsecret.c - per-job secrets: made, hashed, checked (jobsecret.h).
 */
#include "jobsecret.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "digest.h"

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
    return digest_sha256_hex(secret, strlen(secret), hash, e);
}

int jobsecret_matches(const char *secret, const char *hash) {
    char h[JOBSECRET_HASH_LEN + 1];
    ac_err e;
    if (!secret || !secret[0] || !hash || strlen(hash) != JOBSECRET_HASH_LEN || jobsecret_hash(secret, h, &e))
        return 0;
    return digest_equal(h, hash, JOBSECRET_HASH_LEN);
}
