/* db.c - see db.h. */
#include "db.h"

#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

struct db {
    sqlite3 *wr, *rd;
    pthread_mutex_t wmu, rmu, hmu;
    int degraded;           /* the last write failed (hmu) */
    long write_failures;
    char last_error[256];
};

/* Record the outcome of a write for db_health. */
static void wr_result(db *d, int ok, const char *msg) {
    pthread_mutex_lock(&d->hmu);
    if (ok) d->degraded = 0;
    else {
        d->degraded = 1;
        d->write_failures++;
        snprintf(d->last_error, sizeof d->last_error, "%.250s", msg ? msg : "write failed");
    }
    pthread_mutex_unlock(&d->hmu);
}

int db_health(db *d, char *msg, size_t n, long *write_failures) {
    pthread_mutex_lock(&d->hmu);
    int deg = d->degraded;
    if (msg && n) snprintf(msg, n, "%s", deg ? d->last_error : "");
    if (write_failures) *write_failures = d->write_failures;
    pthread_mutex_unlock(&d->hmu);
    return deg;
}

/* Writer transactions. durable: synchronous=FULL for this commit. */
static int wbegin(db *d, int durable, ac_err *e) {
    if (durable && sqlite3_exec(d->wr, "PRAGMA synchronous=FULL", NULL, NULL, NULL) != SQLITE_OK)
        return ac_errf(e, "sqlite: %s", sqlite3_errmsg(d->wr));
    if (sqlite3_exec(d->wr, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK) {
        ac_errf(e, "sqlite begin: %s", sqlite3_errmsg(d->wr));
        if (durable) sqlite3_exec(d->wr, "PRAGMA synchronous=NORMAL", NULL, NULL, NULL);
        return -1;
    }
    return 0;
}

/* Commit when ok, else roll back; returns 0 only when the commit held. */
static int wend(db *d, int ok, int durable, ac_err *e) {
    int rc = ok ? 0 : -1;
    if (ok && sqlite3_exec(d->wr, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
        rc = ac_errf(e, "sqlite commit: %s", sqlite3_errmsg(d->wr));
        ok = 0;
    }
    if (!ok && sqlite3_get_autocommit(d->wr) == 0) sqlite3_exec(d->wr, "ROLLBACK", NULL, NULL, NULL);
    if (durable) sqlite3_exec(d->wr, "PRAGMA synchronous=NORMAL", NULL, NULL, NULL);
    return rc;
}

static double now_s(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return tv.tv_sec + tv.tv_usec * 1e-6;
}

static int sqerr(sqlite3 *c, ac_err *e, const char *what) {
    return ac_errf(e, "sqlite %s: %s", what, sqlite3_errmsg(c));
}

static int open_conn(const char *path, int flags, sqlite3 **c, ac_err *e) {
    if (sqlite3_open_v2(path, c, flags | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK) {
        int rc = ac_errf(e, "cannot open database %s: %s", path, *c ? sqlite3_errmsg(*c) : "out of memory");
        sqlite3_close(*c);
        *c = NULL;
        return rc;
    }
    sqlite3_busy_timeout(*c, 5000);
    return 0;
}

int db_schema_version(db *d) {
    sqlite3_stmt *st;
    int v = -1;
    pthread_mutex_lock(&d->wmu);
    if (sqlite3_prepare_v2(d->wr, "PRAGMA user_version", -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    pthread_mutex_unlock(&d->wmu);
    return v;
}

static int migrate(db *d, ac_err *e) {
    int cur = db_schema_version(d);
    char *err = NULL;
    if (sqlite3_exec(d->wr, "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)",
                     NULL, NULL, &err) != SQLITE_OK) {
        ac_errf(e, "migrations table: %s", err);
        sqlite3_free(err);
        return -1;
    }
    for (const db_migration *m = db_migrations; m->sql; m++) {
        if (m->version <= cur) continue;
        char sql[256];
        if (sqlite3_exec(d->wr, "BEGIN IMMEDIATE", NULL, NULL, &err) != SQLITE_OK ||
            sqlite3_exec(d->wr, m->sql, NULL, NULL, &err) != SQLITE_OK) {
            ac_errf(e, "migration %s: %s", m->name, err ? err : "?");
            sqlite3_free(err);
            sqlite3_exec(d->wr, "ROLLBACK", NULL, NULL, NULL);
            return -1;
        }
        snprintf(sql, sizeof sql, "INSERT INTO schema_migrations VALUES (%d, '%s', %.3f); PRAGMA user_version = %d;", m->version, m->name,
                 now_s(), m->version);
        if (sqlite3_exec(d->wr, sql, NULL, NULL, &err) != SQLITE_OK || sqlite3_exec(d->wr, "COMMIT", NULL, NULL, &err) != SQLITE_OK) {
            ac_errf(e, "migration %s: %s", m->name, err ? err : "?");
            sqlite3_free(err);
            sqlite3_exec(d->wr, "ROLLBACK", NULL, NULL, NULL);
            return -1;
        }
    }
    return 0;
}

int db_open(const char *path, db **out, ac_err *e) {
    db *d = calloc(1, sizeof *d);
    if (!d) return ac_errf(e, "out of memory");
    pthread_mutex_init(&d->wmu, NULL);
    pthread_mutex_init(&d->rmu, NULL);
    pthread_mutex_init(&d->hmu, NULL);
    if (open_conn(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, &d->wr, e)) { free(d); return -1; }
    char *err = NULL;
    if (sqlite3_exec(d->wr, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;", NULL, NULL, &err) != SQLITE_OK) {
        ac_errf(e, "database %s: %s", path, err);
        sqlite3_free(err);
        db_close(d);
        return -1;
    }
    if (migrate(d, e) || open_conn(path, SQLITE_OPEN_READONLY, &d->rd, e)) { db_close(d); return -1; }
    *out = d;
    return 0;
}

void db_close(db *d) {
    if (!d) return;
    sqlite3_close(d->rd);
    sqlite3_close(d->wr);
    pthread_mutex_destroy(&d->wmu);
    pthread_mutex_destroy(&d->rmu);
    pthread_mutex_destroy(&d->hmu);
    free(d);
}

/* The spec of the job holding idempotency key k (caller frees), or NULL. Writer lock held. */
static char *idem_lookup(db *d, const char *k, long *id) {
    sqlite3_stmt *st;
    char *spec = NULL;
    if (sqlite3_prepare_v2(d->wr, "SELECT id, spec FROM jobs WHERE idempotency_key = ?", -1, &st, NULL) != SQLITE_OK) return NULL;
    sqlite3_bind_text(st, 1, k, -1, SQLITE_TRANSIENT);
    if (sqlite3_step(st) == SQLITE_ROW) {
        *id = (long)sqlite3_column_int64(st, 0);
        spec = strdup((const char *)sqlite3_column_text(st, 1));
    }
    sqlite3_finalize(st);
    return spec;
}

long db_job_insert(db *d, const char *spec, const char *name, int priority, const char *idem_key, char **existing_spec, ac_err *e) {
    sqlite3_stmt *st = NULL;
    long id = -1;
    double t = now_s();
    if (existing_spec) *existing_spec = NULL;
    pthread_mutex_lock(&d->wmu);
    if (wbegin(d, 1, e)) {
        wr_result(d, 0, e->msg);
        pthread_mutex_unlock(&d->wmu);
        return -1;
    }
    if (idem_key && existing_spec && (*existing_spec = idem_lookup(d, idem_key, &id))) goto out; /* a retry: no new job */
    id = -1;
    if (sqlite3_prepare_v2(d->wr, "INSERT INTO jobs (name, state, priority, spec, reason, created_at, updated_at, idempotency_key)"
                                  " VALUES (?, 'queued', ?, ?, 'waiting for the scheduler', ?, ?, ?)", -1, &st, NULL) != SQLITE_OK) {
        sqerr(d->wr, e, "insert job");
        goto out;
    }
    if (name) sqlite3_bind_text(st, 1, name, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(st, 2, priority);
    sqlite3_bind_text(st, 3, spec, -1, SQLITE_TRANSIENT);
    sqlite3_bind_double(st, 4, t);
    sqlite3_bind_double(st, 5, t);
    if (idem_key) sqlite3_bind_text(st, 6, idem_key, -1, SQLITE_TRANSIENT);
    if (sqlite3_step(st) != SQLITE_DONE) { sqerr(d->wr, e, "insert job"); goto out; }
    id = (long)sqlite3_last_insert_rowid(d->wr);
    sqlite3_finalize(st);
    st = NULL;
    if (sqlite3_prepare_v2(d->wr, "INSERT INTO job_transitions (job_id, from_state, to_state, at, reason) VALUES (?, NULL, 'queued', ?, 'submitted')", -1, &st, NULL) != SQLITE_OK ||
        (sqlite3_bind_int64(st, 1, id), sqlite3_bind_double(st, 2, t), sqlite3_step(st) != SQLITE_DONE)) {
        sqerr(d->wr, e, "insert transition");
        id = -1;
    }
out:
    sqlite3_finalize(st);
    if (wend(d, id > 0, 1, e)) {
        id = -1;
        if (existing_spec) { free(*existing_spec); *existing_spec = NULL; }
    }
    wr_result(d, id > 0, e->msg);
    pthread_mutex_unlock(&d->wmu);
    return id;
}

static json_t *col_json(sqlite3_stmt *st, int i) {
    switch (sqlite3_column_type(st, i)) {
    case SQLITE_NULL: return json_null();
    case SQLITE_INTEGER: return json_integer(sqlite3_column_int64(st, i));
    case SQLITE_FLOAT: return json_real(sqlite3_column_double(st, i));
    default: return json_string((const char *)sqlite3_column_text(st, i));
    }
}

#define JOB_COLS "id, name, state, priority, device, reason, attempts, cancel_requested, created_at, updated_at, started_at, finished_at, spec"

static json_t *job_row(sqlite3_stmt *st, int with_spec) {
    static const char *names[] = {"id", "name", "state", "priority", "device", "reason", "attempts", "cancel_requested",
                                  "created_at", "updated_at", "started_at", "finished_at"};
    json_t *j = json_object();
    for (int i = 0; i < 12; i++) json_object_set_new(j, names[i], col_json(st, i));
    json_object_set_new(j, "cancel_requested", json_boolean(sqlite3_column_int(st, 7)));
    if (with_spec) {
        json_t *spec = json_loads((const char *)sqlite3_column_text(st, 12), 0, NULL);
        json_object_set_new(j, "spec", spec ? spec : json_null());
    }
    return j;
}

int db_job_get(db *d, long id, json_t **job, ac_err *e) {
    sqlite3_stmt *st;
    int rc = 0;
    *job = NULL;
    pthread_mutex_lock(&d->rmu);
    if (sqlite3_prepare_v2(d->rd, "SELECT " JOB_COLS ", result FROM jobs WHERE id = ?", -1, &st, NULL) != SQLITE_OK) {
        rc = sqerr(d->rd, e, "get job");
        goto out;
    }
    sqlite3_bind_int64(st, 1, id);
    int sr = sqlite3_step(st);
    if (sr == SQLITE_ROW) {
        *job = job_row(st, 1);
        json_object_set_new(*job, "has_result", json_boolean(sqlite3_column_type(st, 13) != SQLITE_NULL));
    } else if (sr != SQLITE_DONE) rc = sqerr(d->rd, e, "get job");
    sqlite3_finalize(st);
    if (*job) {
        if (sqlite3_prepare_v2(d->rd, "SELECT from_state, to_state, at, reason FROM job_transitions WHERE job_id = ? ORDER BY id", -1, &st, NULL) != SQLITE_OK) {
            rc = sqerr(d->rd, e, "get job transitions");
            goto out;
        }
        json_t *tr = json_array();
        sqlite3_bind_int64(st, 1, id);
        while ((sr = sqlite3_step(st)) == SQLITE_ROW)
            json_array_append_new(tr, json_pack("{s:o,s:o,s:o,s:o}", "from", col_json(st, 0), "to", col_json(st, 1), "at", col_json(st, 2), "reason", col_json(st, 3)));
        if (sr != SQLITE_DONE) rc = sqerr(d->rd, e, "get job transitions");
        sqlite3_finalize(st);
        json_object_set_new(*job, "transitions", tr);
    }
out:
    if (rc && *job) { json_decref(*job); *job = NULL; }
    pthread_mutex_unlock(&d->rmu);
    return rc;
}

int db_job_list(db *d, const char *state, long after, int limit, json_t **jobs, ac_err *e) {
    sqlite3_stmt *st;
    pthread_mutex_lock(&d->rmu);
    const char *sql = state ? "SELECT " JOB_COLS " FROM jobs WHERE id > ? AND state = ? ORDER BY id LIMIT ?"
                            : "SELECT " JOB_COLS " FROM jobs WHERE id > ? ORDER BY id LIMIT ?";
    if (sqlite3_prepare_v2(d->rd, sql, -1, &st, NULL) != SQLITE_OK) {
        int rc = sqerr(d->rd, e, "list jobs");
        pthread_mutex_unlock(&d->rmu);
        return rc;
    }
    int i = 1;
    sqlite3_bind_int64(st, i++, after);
    if (state) sqlite3_bind_text(st, i++, state, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(st, i, limit);
    *jobs = json_array();
    int sr;
    while ((sr = sqlite3_step(st)) == SQLITE_ROW) json_array_append_new(*jobs, job_row(st, 0));
    int rc = sr == SQLITE_DONE ? 0 : sqerr(d->rd, e, "list jobs");
    sqlite3_finalize(st);
    pthread_mutex_unlock(&d->rmu);
    if (rc) { json_decref(*jobs); *jobs = NULL; }
    return rc;
}

int db_job_transition(db *d, long id, const char *from, const char *to, const char *reason, const char *device,
                      const char *result, ac_err *e) {
    sqlite3_stmt *st = NULL;
    int rc = -1;
    double t = now_s();
    pthread_mutex_lock(&d->wmu);
    if (wbegin(d, 1, e)) {
        wr_result(d, 0, e->msg);
        pthread_mutex_unlock(&d->wmu);
        return -1;
    }
    char cur[16] = "";
    if (sqlite3_prepare_v2(d->wr, "SELECT state FROM jobs WHERE id = ?", -1, &st, NULL) != SQLITE_OK) { sqerr(d->wr, e, "transition"); goto out; }
    sqlite3_bind_int64(st, 1, id);
    int step = sqlite3_step(st);
    if (step != SQLITE_ROW) {
        if (step == SQLITE_DONE) rc = 1;
        else sqerr(d->wr, e, "transition");
        goto out;
    }
    snprintf(cur, sizeof cur, "%s", sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    st = NULL;
    int terminal = !strcmp(cur, "succeeded") || !strcmp(cur, "failed") || !strcmp(cur, "cancelled");
    if (from ? strcmp(cur, from) != 0 : terminal) { rc = 1; goto out; }
    const char *sql =
        "UPDATE jobs SET state = ?1, updated_at = ?2, reason = COALESCE(?3, reason), device = COALESCE(?4, device),"
        " result = COALESCE(?5, result),"
        " started_at = CASE WHEN ?1 = 'running' THEN ?2 ELSE started_at END,"
        " finished_at = CASE WHEN ?1 IN ('succeeded','failed','cancelled') THEN ?2 ELSE finished_at END,"
        " attempts = attempts + (?1 = 'running'),"
        " worker_pid = CASE WHEN ?1 = 'running' THEN worker_pid ELSE NULL END WHERE id = ?6";
    if (sqlite3_prepare_v2(d->wr, sql, -1, &st, NULL) != SQLITE_OK) { sqerr(d->wr, e, "transition"); goto out; }
    sqlite3_bind_text(st, 1, to, -1, SQLITE_TRANSIENT);
    sqlite3_bind_double(st, 2, t);
    if (reason) sqlite3_bind_text(st, 3, reason, -1, SQLITE_TRANSIENT);
    if (device) sqlite3_bind_text(st, 4, device, -1, SQLITE_TRANSIENT);
    if (result) sqlite3_bind_text(st, 5, result, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 6, id);
    if (sqlite3_step(st) != SQLITE_DONE) { sqerr(d->wr, e, "transition"); goto out; }
    sqlite3_finalize(st);
    st = NULL;
    if (sqlite3_prepare_v2(d->wr, "INSERT INTO job_transitions (job_id, from_state, to_state, at, reason) VALUES (?, ?, ?, ?, ?)", -1, &st, NULL) != SQLITE_OK) { sqerr(d->wr, e, "transition"); goto out; }
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_text(st, 2, cur, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 3, to, -1, SQLITE_TRANSIENT);
    sqlite3_bind_double(st, 4, t);
    if (reason) sqlite3_bind_text(st, 5, reason, -1, SQLITE_TRANSIENT);
    if (sqlite3_step(st) != SQLITE_DONE) { sqerr(d->wr, e, "transition"); goto out; }
    rc = 0;
out:
    sqlite3_finalize(st);
    /* rc 1 (not in that state) changed nothing: roll back, not a failure */
    if (wend(d, rc == 0, 1, e) && rc == 0) rc = -1;
    if (rc != 1) wr_result(d, rc == 0, e->msg);
    pthread_mutex_unlock(&d->wmu);
    return rc;
}

int db_queue(db *d, json_t **queue, ac_err *e) {
    sqlite3_stmt *st;
    pthread_mutex_lock(&d->rmu);
    if (sqlite3_prepare_v2(d->rd, "SELECT id, reason, json_extract(spec, '$.target.device') FROM jobs WHERE state = 'queued' ORDER BY priority DESC, id", -1, &st, NULL) != SQLITE_OK) {
        int rc = sqerr(d->rd, e, "queue");
        pthread_mutex_unlock(&d->rmu);
        return rc;
    }
    *queue = json_array();
    int sr;
    while ((sr = sqlite3_step(st)) == SQLITE_ROW)
        json_array_append_new(*queue, json_pack("{s:o,s:o,s:o}", "id", col_json(st, 0), "reason", col_json(st, 1), "device", col_json(st, 2)));
    int rc = sr == SQLITE_DONE ? 0 : sqerr(d->rd, e, "queue");
    sqlite3_finalize(st);
    pthread_mutex_unlock(&d->rmu);
    if (rc) { json_decref(*queue); *queue = NULL; }
    return rc;
}

int db_job_set(db *d, long id, const char *column, const char *text, long num, ac_err *e) {
    static const char *allowed[] = {"reason", "worker_pid", "cancel_requested", "device", NULL};
    int ok = 0;
    for (int i = 0; allowed[i]; i++) ok |= !strcmp(allowed[i], column);
    if (!ok) return ac_errf(e, "db_job_set: column %s not settable", column);
    char sql[128];
    snprintf(sql, sizeof sql, "UPDATE jobs SET %s = ?, updated_at = ? WHERE id = ?", column);
    sqlite3_stmt *st;
    int rc = 0;
    pthread_mutex_lock(&d->wmu);
    if (sqlite3_prepare_v2(d->wr, sql, -1, &st, NULL) != SQLITE_OK) rc = sqerr(d->wr, e, "set");
    else {
        if (text) sqlite3_bind_text(st, 1, text, -1, SQLITE_TRANSIENT);
        else sqlite3_bind_int64(st, 1, num);
        sqlite3_bind_double(st, 2, now_s());
        sqlite3_bind_int64(st, 3, id);
        if (sqlite3_step(st) != SQLITE_DONE) rc = sqerr(d->wr, e, "set");
        sqlite3_finalize(st);
    }
    wr_result(d, rc == 0, e->msg);
    pthread_mutex_unlock(&d->wmu);
    return rc;
}

int db_recover(db *d, const char *policy, int max_attempts, ac_err *e) {
    json_t *running;
    if (db_job_list(d, "running", 0, 1000000, &running, e)) return -1;
    size_t i;
    json_t *j;
    int n = 0;
    json_array_foreach(running, i, j) {
        long id = (long)json_integer_value(json_object_get(j, "id"));
        long attempts = (long)json_integer_value(json_object_get(j, "attempts"));
        int cancel = json_is_true(json_object_get(j, "cancel_requested"));
        int requeue = !strcmp(policy, "requeue") && attempts < max_attempts && !cancel;
        const char *to = cancel ? "cancelled" : requeue ? "queued" : "failed";
        const char *why = cancel ? "cancelled (daemon stopped while cancelling)"
                          : requeue ? "interrupted: the daemon stopped while the job ran; re-queued"
                                    : "interrupted: the daemon stopped while the job ran";
        if (db_job_transition(d, id, "running", to, why, NULL, NULL, e) < 0) { json_decref(running); return -1; }
        n++;
    }
    json_decref(running);
    return n;
}

int db_job_counts(db *d, json_t **counts, ac_err *e) {
    sqlite3_stmt *st;
    pthread_mutex_lock(&d->rmu);
    if (sqlite3_prepare_v2(d->rd, "SELECT state, COUNT(*) FROM jobs GROUP BY state", -1, &st, NULL) != SQLITE_OK) {
        int rc = sqerr(d->rd, e, "counts");
        pthread_mutex_unlock(&d->rmu);
        return rc;
    }
    *counts = json_pack("{s:i,s:i,s:i,s:i,s:i}", "queued", 0, "running", 0, "succeeded", 0, "failed", 0, "cancelled", 0);
    int sr;
    while ((sr = sqlite3_step(st)) == SQLITE_ROW)
        json_object_set_new(*counts, (const char *)sqlite3_column_text(st, 0), json_integer(sqlite3_column_int64(st, 1)));
    int rc = sr == SQLITE_DONE ? 0 : sqerr(d->rd, e, "counts");
    sqlite3_finalize(st);
    pthread_mutex_unlock(&d->rmu);
    if (rc) { json_decref(*counts); *counts = NULL; }
    return rc;
}

long db_event_insert(db *d, long job, const char *kind, const char *data, ac_err *e) {
    sqlite3_stmt *st;
    long id = -1;
    pthread_mutex_lock(&d->wmu);
    if (sqlite3_prepare_v2(d->wr, "INSERT INTO events (job_id, kind, data, at) VALUES (?, ?, ?, ?)", -1, &st, NULL) != SQLITE_OK) {
        sqerr(d->wr, e, "insert event");
    } else {
        sqlite3_bind_int64(st, 1, job);
        sqlite3_bind_text(st, 2, kind, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(st, 3, data, -1, SQLITE_TRANSIENT);
        sqlite3_bind_double(st, 4, now_s());
        if (sqlite3_step(st) == SQLITE_DONE) id = (long)sqlite3_last_insert_rowid(d->wr);
        else sqerr(d->wr, e, "insert event");
        sqlite3_finalize(st);
    }
    wr_result(d, id > 0, e->msg);
    pthread_mutex_unlock(&d->wmu);
    return id;
}

int db_events(db *d, long job, long after, int limit, json_t **events, ac_err *e) {
    sqlite3_stmt *st;
    pthread_mutex_lock(&d->rmu);
    if (sqlite3_prepare_v2(d->rd, "SELECT id, kind, data, at FROM events WHERE job_id = ? AND id > ? ORDER BY id LIMIT ?", -1, &st, NULL) != SQLITE_OK) {
        int rc = sqerr(d->rd, e, "events");
        pthread_mutex_unlock(&d->rmu);
        return rc;
    }
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int64(st, 2, after);
    sqlite3_bind_int(st, 3, limit);
    *events = json_array();
    int sr;
    while ((sr = sqlite3_step(st)) == SQLITE_ROW) {
        json_t *data = json_loads((const char *)sqlite3_column_text(st, 2), JSON_DECODE_ANY, NULL);
        json_array_append_new(*events, json_pack("{s:I,s:s,s:o,s:f}", "id", (json_int_t)sqlite3_column_int64(st, 0), "kind",
                                                 (const char *)sqlite3_column_text(st, 1), "data", data ? data : json_null(),
                                                 "at", sqlite3_column_double(st, 3)));
    }
    int rc = sr == SQLITE_DONE ? 0 : sqerr(d->rd, e, "events");
    sqlite3_finalize(st);
    pthread_mutex_unlock(&d->rmu);
    if (rc) { json_decref(*events); *events = NULL; }
    return rc;
}

int db_cost_put(db *d, const char *key, const char *device, const char *dtype, const char *engine, int version,
                const char *source, const char *data, ac_err *e) {
    sqlite3_stmt *st;
    int rc = 0;
    pthread_mutex_lock(&d->wmu);
    if (sqlite3_prepare_v2(d->wr, "INSERT INTO cost_tables (key, device, dtype, engine, version, source, created_at, data) VALUES (?,?,?,?,?,?,?,?)"
                                  " ON CONFLICT(key) DO UPDATE SET data = excluded.data, source = excluded.source, created_at = excluded.created_at",
                           -1, &st, NULL) != SQLITE_OK) {
        rc = sqerr(d->wr, e, "put cost table");
    } else {
        const char *txt[] = {key, device, dtype, engine};
        for (int i = 0; i < 4; i++) sqlite3_bind_text(st, i + 1, txt[i], -1, SQLITE_TRANSIENT);
        sqlite3_bind_int(st, 5, version);
        sqlite3_bind_text(st, 6, source, -1, SQLITE_TRANSIENT);
        sqlite3_bind_double(st, 7, now_s());
        sqlite3_bind_text(st, 8, data, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(st) != SQLITE_DONE) rc = sqerr(d->wr, e, "put cost table");
        sqlite3_finalize(st);
    }
    wr_result(d, rc == 0, e->msg);
    pthread_mutex_unlock(&d->wmu);
    return rc;
}

int db_cost_get(db *d, const char *key, char **data, ac_err *e) {
    sqlite3_stmt *st;
    int rc = 0;
    *data = NULL;
    pthread_mutex_lock(&d->rmu);
    if (sqlite3_prepare_v2(d->rd, "SELECT data FROM cost_tables WHERE key = ?", -1, &st, NULL) != SQLITE_OK) rc = sqerr(d->rd, e, "get cost table");
    else {
        sqlite3_bind_text(st, 1, key, -1, SQLITE_TRANSIENT);
        int sr = sqlite3_step(st);
        if (sr == SQLITE_ROW && !(*data = strdup((const char *)sqlite3_column_text(st, 0)))) rc = ac_errf(e, "out of memory");
        else if (sr != SQLITE_ROW && sr != SQLITE_DONE) rc = sqerr(d->rd, e, "get cost table");
        sqlite3_finalize(st);
    }
    pthread_mutex_unlock(&d->rmu);
    return rc;
}

int db_cost_list(db *d, json_t **list, ac_err *e) {
    sqlite3_stmt *st;
    pthread_mutex_lock(&d->rmu);
    if (sqlite3_prepare_v2(d->rd, "SELECT key, device, dtype, engine, version, source, created_at, hits FROM cost_tables ORDER BY created_at", -1, &st, NULL) != SQLITE_OK) {
        int rc = sqerr(d->rd, e, "list cost tables");
        pthread_mutex_unlock(&d->rmu);
        return rc;
    }
    static const char *names[] = {"key", "device", "dtype", "engine", "version", "source", "created_at", "hits"};
    *list = json_array();
    int sr;
    while ((sr = sqlite3_step(st)) == SQLITE_ROW) {
        json_t *o = json_object();
        for (int i = 0; i < 8; i++) json_object_set_new(o, names[i], col_json(st, i));
        json_array_append_new(*list, o);
    }
    int rc = sr == SQLITE_DONE ? 0 : sqerr(d->rd, e, "list cost tables");
    sqlite3_finalize(st);
    pthread_mutex_unlock(&d->rmu);
    if (rc) { json_decref(*list); *list = NULL; }
    return rc;
}

int db_job_result(db *d, long id, char **result, ac_err *e) {
    sqlite3_stmt *st;
    int rc = 0;
    *result = NULL;
    pthread_mutex_lock(&d->rmu);
    if (sqlite3_prepare_v2(d->rd, "SELECT result FROM jobs WHERE id = ?", -1, &st, NULL) != SQLITE_OK) rc = sqerr(d->rd, e, "job result");
    else {
        sqlite3_bind_int64(st, 1, id);
        int sr = sqlite3_step(st);
        if (sr == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL) {
            if (!(*result = strdup((const char *)sqlite3_column_text(st, 0)))) rc = ac_errf(e, "out of memory");
        } else if (sr != SQLITE_ROW && sr != SQLITE_DONE) rc = sqerr(d->rd, e, "job result");
        sqlite3_finalize(st);
    }
    pthread_mutex_unlock(&d->rmu);
    return rc;
}

int db_cost_hit(db *d, const char *key, ac_err *e) {
    sqlite3_stmt *st;
    int rc = 0;
    pthread_mutex_lock(&d->wmu);
    if (sqlite3_prepare_v2(d->wr, "UPDATE cost_tables SET hits = hits + 1 WHERE key = ?", -1, &st, NULL) != SQLITE_OK) rc = sqerr(d->wr, e, "cost hit");
    else {
        sqlite3_bind_text(st, 1, key, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(st) != SQLITE_DONE) rc = sqerr(d->wr, e, "cost hit");
        sqlite3_finalize(st);
    }
    wr_result(d, rc == 0, e->msg);
    pthread_mutex_unlock(&d->wmu);
    return rc;
}

int db_cost_source(db *d, const char *key, char *src, size_t n, ac_err *e) {
    sqlite3_stmt *st;
    int rc = 0;
    src[0] = 0;
    pthread_mutex_lock(&d->rmu);
    if (sqlite3_prepare_v2(d->rd, "SELECT source FROM cost_tables WHERE key = ?", -1, &st, NULL) != SQLITE_OK) rc = sqerr(d->rd, e, "cost source");
    else {
        sqlite3_bind_text(st, 1, key, -1, SQLITE_TRANSIENT);
        int sr = sqlite3_step(st);
        if (sr == SQLITE_ROW) snprintf(src, n, "%s", (const char *)sqlite3_column_text(st, 0));
        else if (sr != SQLITE_DONE) rc = sqerr(d->rd, e, "cost source");
        sqlite3_finalize(st);
    }
    pthread_mutex_unlock(&d->rmu);
    return rc;
}
