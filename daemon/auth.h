/*
 * auth.h - who a request is and what it may do: users, roles and API
 * tokens. Private to daemon/.
 *
 * A bearer token names a user and a role. The tokens of the config
 * ("tokens") and AUTOCOMPRESS_TOKEN are the user "admin" with role admin
 * (the single shared token of a daemon without users). The others live in
 * the store (migration 004's api_tokens), created and revoked with
 * `autocompressd token add|list|revoke`; only their SHA-256 is stored.
 *
 * Roles, each with what the one before it may do: read (GET routes: jobs,
 * events, results, files, devices, cost tables, config), submit (submit,
 * validate, estimate, cancel), admin (import cost tables, measurements, and
 * every user's jobs). A job belongs to the user who submitted it; another
 * user's job answers 404 unless the caller is an admin.
 *
 * Tokens are needed when the config has any, the store has a live one, or
 * the daemon listens on an address other than loopback; otherwise (a
 * loopback daemon without tokens) every request is an anonymous admin.
 */
#ifndef AC_AUTH_H
#define AC_AUTH_H

#include "daemon.h"

typedef enum { ROLE_READ, ROLE_SUBMIT, ROLE_ADMIN, ROLE_N } auth_role;

typedef struct {
    char user[64]; /* "" when anonymous */
    auth_role role;
    int anonymous; /* no tokens needed: the caller is an admin without a name */
} auth_ident;

const char *auth_role_name(auth_role r);
/* 0 and *r, or -1 when s is not read, submit or admin. */
int auth_role_parse(const char *s, auth_role *r);
/* A user name: 1 to 63 of [A-Za-z0-9._@-]. */
int auth_user_ok(const char *user);
/* A new token: "act_" and 43 base64url characters of 32 random bytes. */
int auth_new_token(char out[64], ac_err *e);

/* Identify the bearer token tok (NULL: the request has none): 0 with *id,
 * 1 when refused (none where one is needed, unknown, revoked: a 401), -1
 * when the store cannot be read (e). */
int auth_identify(ac_daemon *d, const char *tok, auth_ident *id, ac_err *e);

/* `autocompressd token add USER --role ROLE | list | revoke ID` [--config FILE] [--db PATH]. */
int token_main(int argc, char **argv);

#endif
