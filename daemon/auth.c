/*
 * auth.c - users, roles and API tokens (see auth.h): hashing and making
 * tokens (SHA-256 from digest.h; getrandom for the bytes), identifying a request's bearer token, and the
 * `autocompressd token` commands.
 */
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "auth.h"
#include "digest.h"

static const char *const role_names[ROLE_N] = {"read", "submit", "admin"};

const char *auth_role_name(auth_role r) { return r >= 0 && r < ROLE_N ? role_names[r] : "?"; }

int auth_role_parse(const char *s, auth_role *r) {
    for (int i = 0; s && i < ROLE_N; i++)
        if (!strcmp(s, role_names[i])) {
            *r = (auth_role)i;
            return 0;
        }
    return -1;
}

int auth_user_ok(const char *user) {
    size_t n = strlen(user);
    if (n < 1 || n > 63) return 0;
    for (size_t i = 0; i < n; i++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._@-", user[i])) return 0;
    return 1;
}

int auth_new_token(char out[64], ac_err *e) {
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    unsigned char r[33] = {0};
    if (getrandom(r, 32, 0) != 32) return ac_errf(e, "getrandom failed");
    char *p = out + sprintf(out, "act_");
    for (int i = 0; i < 33; i += 3) { /* 32 bytes: 43 characters (the last group has 2 bytes) */
        unsigned v = (unsigned)r[i] << 16 | (unsigned)r[i + 1] << 8 | r[i + 2];
        *p++ = b64[v >> 18 & 63];
        *p++ = b64[v >> 12 & 63];
        *p++ = b64[v >> 6 & 63];
        if (i + 3 < 33) *p++ = b64[v & 63];
    }
    *p = 0;
    return 0;
}

/* tok against the config's tokens, in time that depends on neither's text. */
static int config_token(const ac_daemon *d, const char *tok) {
    size_t tl = strlen(tok);
    int ok = 0;
    for (int i = 0; i < d->cfg.ntokens; i++) {
        const char *t = d->cfg.tokens[i];
        size_t n = strlen(t);
        unsigned char diff = (unsigned char)(n != tl);
        for (size_t k = 0; k < n; k++) diff |= (unsigned char)(t[k] ^ (k < tl ? tok[k] : 0));
        ok |= diff == 0;
    }
    return ok;
}

int auth_identify(ac_daemon *d, const char *tok, auth_ident *id, ac_err *e) {
    memset(id, 0, sizeof *id);
    if (tok && config_token(d, tok)) {
        snprintf(id->user, sizeof id->user, "admin");
        id->role = ROLE_ADMIN;
        return 0;
    }
    if (tok) {
        char hex[65];
        db_token t;
        int found = digest_sha256_hex(tok, strlen(tok), hex, e) ? -1 : db_token_find(d->db, hex, &t, e);
        if (found < 0) return -1;
        if (!found || auth_role_parse(t.role, &id->role)) return 1;
        snprintf(id->user, sizeof id->user, "%s", t.user);
        return 0;
    }
    if (d->cfg.ntokens > 0 || !config_is_loopback(d->cfg.listen_host)) return 1;
    int live = db_tokens_live(d->db, e);
    if (live) return live < 0 ? -1 : 1;
    id->anonymous = 1;
    id->role = ROLE_ADMIN;
    return 0;
}

/* ------------------------------------------------------------- the token commands */

static int token_usage(void) {
    fprintf(stderr, "usage: autocompressd token add USER --role read|submit|admin [--config FILE] [--db PATH]\n"
                    "       autocompressd token list [--config FILE] [--db PATH]\n"
                    "       autocompressd token revoke ID [--config FILE] [--db PATH]\n");
    return 2;
}

/* Who runs the command, for the audit log: "cli:" and the Unix user. */
static void cli_user(char *out, size_t n) {
    struct passwd *pw = getpwuid(getuid());
    if (pw)
        snprintf(out, n, "cli:%.50s", pw->pw_name);
    else
        snprintf(out, n, "cli:uid%ld", (long)getuid());
}

static int token_add(db *s, const char *user, const char *role, ac_err *e) {
    auth_role r;
    if (!auth_user_ok(user)) return ac_errf(e, "user names are 1 to 63 of A-Z a-z 0-9 . _ @ -");
    if (auth_role_parse(role, &r)) return ac_errf(e, "--role must be read, submit or admin");
    char tok[64], hex[65], prefix[16], who[64], target[128];
    long id;
    if (auth_new_token(tok, e) || digest_sha256_hex(tok, strlen(tok), hex, e)) return -1;
    snprintf(prefix, sizeof prefix, "%.12s", tok);
    if (db_token_add(s, user, role, hex, prefix, &id, e)) return -1;
    cli_user(who, sizeof who);
    snprintf(target, sizeof target, "token %ld of %s (%s)", id, user, role);
    db_audit(s, who, NULL, "token add", target, 0, e);
    printf("%s\n", tok);
    fprintf(stderr, "autocompressd: token %ld for %s (role %s); it is shown only this once\n", id, user, role);
    return 0;
}

static int token_list(db *s, ac_err *e) {
    db_token *t;
    int n;
    if (db_token_list(s, &t, &n, e)) return -1;
    printf("%-5s %-24s %-7s %-10s %-20s %s\n", "ID", "USER", "ROLE", "PREFIX", "CREATED", "REVOKED");
    for (int i = 0; i < n; i++) {
        char c[32], r[32] = "-";
        time_t ct = (time_t)t[i].created_at, rt = (time_t)t[i].revoked_at;
        strftime(c, sizeof c, "%Y-%m-%dT%H:%M:%SZ", gmtime(&ct));
        if (t[i].revoked) strftime(r, sizeof r, "%Y-%m-%dT%H:%M:%SZ", gmtime(&rt));
        printf("%-5ld %-24s %-7s %-10s %-20s %s\n", t[i].id, t[i].user, t[i].role, t[i].prefix, c, r);
    }
    free(t);
    return 0;
}

static int token_revoke(db *s, const char *ids, ac_err *e) {
    char *end, who[64], target[64];
    long id = strtol(ids, &end, 10);
    if (*end || id <= 0) return ac_errf(e, "revoke takes a token id (see autocompressd token list)");
    int rc = db_token_revoke(s, id, e);
    if (rc < 0) return -1;
    if (rc) return ac_errf(e, "no live token has id %ld", id);
    cli_user(who, sizeof who);
    snprintf(target, sizeof target, "token %ld", id);
    db_audit(s, who, NULL, "token revoke", target, 0, e);
    fprintf(stderr, "autocompressd: token %ld revoked\n", id);
    return 0;
}

int token_main(int argc, char **argv) {
    ac_config cfg;
    ac_err e = {{0}};
    const char *pos[2] = {NULL, NULL}, *role = NULL, *cfgfile = NULL, *dbpath = NULL;
    int np = 0;
    for (int i = 2; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--role") && v)
            role = argv[++i];
        else if (!strcmp(argv[i], "--config") && v)
            cfgfile = argv[++i];
        else if (!strcmp(argv[i], "--db") && v)
            dbpath = argv[++i];
        else if (argv[i][0] != '-' && np < 2)
            pos[np++] = argv[i];
        else
            return token_usage();
    }
    if (!pos[0]) return token_usage();
    config_defaults(&cfg);
    if (cfgfile && config_load(&cfg, cfgfile, &e)) {
        fprintf(stderr, "autocompressd: %s\n", e.msg);
        return 1;
    }
    if (dbpath) snprintf(cfg.db_path, sizeof cfg.db_path, "%s", dbpath);
    db *s;
    int rc;
    if (db_open(cfg.db_path, &s, &e))
        rc = -1;
    else {
        if (!strcmp(pos[0], "add") && pos[1] && role)
            rc = token_add(s, pos[1], role, &e);
        else if (!strcmp(pos[0], "list") && !pos[1])
            rc = token_list(s, &e);
        else if (!strcmp(pos[0], "revoke") && pos[1])
            rc = token_revoke(s, pos[1], &e);
        else
            rc = -2;
        db_close(s);
    }
    config_free(&cfg);
    if (rc == -2) return token_usage();
    if (rc) fprintf(stderr, "autocompressd: %s\n", e.msg);
    return rc ? 1 : 0;
}
