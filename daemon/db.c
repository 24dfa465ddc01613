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

/* ------------------------------------------------------------- states */

static const char *const state_names[JOB_NSTATES] = {"queued", "running", "succeeded", "failed", "cancelled"};

const char *job_state_name(job_state s) { return s >= 0 && s < JOB_NSTATES ? state_names[s] : "unknown"; }

int job_state_parse(const char *name, job_state *out) {
    for (int i = 0; name && i < JOB_NSTATES; i++)
        if (!strcmp(name, state_names[i])) {
            *out = (job_state)i;
            return 0;
        }
    return -1;
}

int job_state_terminal(job_state s) { return s == JOB_SUCCEEDED || s == JOB_FAILED || s == JOB_CANCELLED; }

/* ------------------------------------------------------------- rows */

/* A text column, copied (NULL for NULL); *oom set when the copy fails. */
static char *col_text(sqlite3_stmt *st, int i, int *oom) {
    const char *t = (const char *)sqlite3_column_text(st, i);
    if (!t) return NULL;
    char *c = strdup(t);
    if (!c) *oom = 1;
    return c;
}

static double col_time(sqlite3_stmt *st, int i, int *has) {
    *has = sqlite3_column_type(st, i) != SQLITE_NULL;
    return *has ? sqlite3_column_double(st, i) : 0;
}

void db_job_clear(db_job *j) {
    free(j->name);
    free(j->device);
    free(j->reason);
    free(j->spec);
    for (int i = 0; i < j->ntransitions; i++) free(j->transitions[i].reason);
    free(j->transitions);
    memset(j, 0, sizeof *j);
}

void db_jobs_free(db_job *jobs, int n) {
    for (int i = 0; i < n; i++) db_job_clear(&jobs[i]);
    free(jobs);
}

#define JOB_COLS                                                                                                     \
    "id, name, state, priority, device, reason, attempts, cancel_requested, created_at, updated_at, started_at, "   \
    "finished_at, result IS NOT NULL"

/* One row of JOB_COLS: 0, or -1 out of memory / a state the schema forbids. */
static int job_row(sqlite3_stmt *st, db_job *j) {
    int oom = 0, has;
    memset(j, 0, sizeof *j);
    j->id = (long)sqlite3_column_int64(st, 0);
    j->name = col_text(st, 1, &oom);
    if (job_state_parse((const char *)sqlite3_column_text(st, 2), &j->state)) oom = 1;
    j->priority = sqlite3_column_int(st, 3);
    j->device = col_text(st, 4, &oom);
    j->reason = col_text(st, 5, &oom);
    j->attempts = (long)sqlite3_column_int64(st, 6);
    j->cancel_requested = sqlite3_column_int(st, 7) != 0;
    j->created_at = col_time(st, 8, &has);
    j->updated_at = col_time(st, 9, &has);
    j->started_at = col_time(st, 10, &j->has_started);
    j->finished_at = col_time(st, 11, &j->has_finished);
    j->has_result = sqlite3_column_int(st, 12) != 0;
    if (oom) db_job_clear(j);
    return oom ? -1 : 0;
}

static int job_transitions(db *d, db_job *j, ac_err *e) {
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(d->rd, "SELECT from_state, to_state, at, reason FROM job_transitions WHERE job_id = ? ORDER BY id",
                           -1, &st, NULL) != SQLITE_OK)
        return sqerr(d->rd, e, "get job transitions");
    sqlite3_bind_int64(st, 1, j->id);
    int sr, cap = 0, rc = 0;
    while (rc == 0 && (sr = sqlite3_step(st)) == SQLITE_ROW) {
        if (j->ntransitions == cap) {
            cap = cap ? cap * 2 : 8;
            db_transition *nt = realloc(j->transitions, (size_t)cap * sizeof *nt);
            if (!nt) { rc = ac_errf(e, "out of memory"); break; }
            j->transitions = nt;
        }
        db_transition *t = &j->transitions[j->ntransitions];
        int oom = 0;
        memset(t, 0, sizeof *t);
        t->has_from = job_state_parse((const char *)sqlite3_column_text(st, 0), &t->from) == 0;
        if (job_state_parse((const char *)sqlite3_column_text(st, 1), &t->to)) oom = 1;
        t->at = sqlite3_column_double(st, 2);
        t->reason = col_text(st, 3, &oom);
        j->ntransitions++;
        if (oom) rc = ac_errf(e, "out of memory reading job transitions");
    }
    if (rc == 0 && sr != SQLITE_DONE) rc = sqerr(d->rd, e, "get job transitions");
    sqlite3_finalize(st);
    return rc;
}

int db_job_get(db *d, long id, db_job *job, int *found, ac_err *e) {
    sqlite3_stmt *st;
    int rc = 0;
    *found = 0;
    memset(job, 0, sizeof *job);
    pthread_mutex_lock(&d->rmu);
    if (sqlite3_prepare_v2(d->rd, "SELECT " JOB_COLS ", spec FROM jobs WHERE id = ?", -1, &st, NULL) != SQLITE_OK) {
        rc = sqerr(d->rd, e, "get job");
        goto out;
    }
    sqlite3_bind_int64(st, 1, id);
    int sr = sqlite3_step(st);
    if (sr == SQLITE_ROW) {
        int oom = job_row(st, job);
        if (!oom) job->spec = col_text(st, 13, &oom);
        if (oom) rc = ac_errf(e, "out of memory reading job %ld", id);
        else *found = 1;
    } else if (sr != SQLITE_DONE) rc = sqerr(d->rd, e, "get job");
    sqlite3_finalize(st);
    if (*found) rc = job_transitions(d, job, e);
out:
    if (rc) {
        db_job_clear(job);
        *found = 0;
    }
    pthread_mutex_unlock(&d->rmu);
    return rc;
}

int db_job_list(db *d, const job_state *state, long after, int limit, db_job **jobs, int *n, ac_err *e) {
    sqlite3_stmt *st;
    *jobs = NULL;
    *n = 0;
    pthread_mutex_lock(&d->rmu);
    const char *sql = state ? "SELECT " JOB_COLS " FROM jobs WHERE id > ? AND state = ? ORDER BY id LIMIT ?"
                            : "SELECT " JOB_COLS " FROM jobs WHERE id > ? ORDER BY id LIMIT ?";
    if (sqlite3_prepare_v2(d->rd, sql, -1, &st, NULL) != SQLITE_OK) {
        int rc = sqerr(d->rd, e, "list jobs");
        pthread_mutex_unlock(&d->rmu);
        return rc;
    }
    int i = 1, sr, cap = 0, rc = 0;
    sqlite3_bind_int64(st, i++, after);
    if (state) sqlite3_bind_text(st, i++, job_state_name(*state), -1, SQLITE_STATIC);
    sqlite3_bind_int(st, i, limit);
    while ((sr = sqlite3_step(st)) == SQLITE_ROW) {
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            db_job *nj = realloc(*jobs, (size_t)cap * sizeof *nj);
            if (!nj) { rc = ac_errf(e, "out of memory"); break; }
            *jobs = nj;
        }
        if (job_row(st, &(*jobs)[*n])) { rc = ac_errf(e, "out of memory listing jobs"); break; }
        (*n)++;
    }
    if (rc == 0 && sr != SQLITE_DONE) rc = sqerr(d->rd, e, "list jobs");
    sqlite3_finalize(st);
    pthread_mutex_unlock(&d->rmu);
    if (rc) {
        db_jobs_free(*jobs, *n);
        *jobs = NULL;
        *n = 0;
    }
    return rc;
}

/* A job's spec text. */
int db_job_spec(db *d, long id, char **spec, ac_err *e) {
    sqlite3_stmt *st;
    int rc = 0, oom = 0;
    *spec = NULL;
    pthread_mutex_lock(&d->rmu);
    if (sqlite3_prepare_v2(d->rd, "SELECT spec FROM jobs WHERE id = ?", -1, &st, NULL) != SQLITE_OK)
        rc = sqerr(d->rd, e, "job spec");
    else {
        sqlite3_bind_int64(st, 1, id);
        int sr = sqlite3_step(st);
        if (sr == SQLITE_ROW) *spec = col_text(st, 0, &oom);
        else if (sr != SQLITE_DONE) rc = sqerr(d->rd, e, "job spec");
        if (oom) rc = ac_errf(e, "out of memory");
        sqlite3_finalize(st);
    }
    pthread_mutex_unlock(&d->rmu);
    return rc;
}

/* The state of job id into *cur: 0, 1 unknown job, -1 error. Writer lock held. */
static int current_state(db *d, long id, job_state *cur, ac_err *e) {
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(d->wr, "SELECT state FROM jobs WHERE id = ?", -1, &st, NULL) != SQLITE_OK)
        return sqerr(d->wr, e, "transition");
    sqlite3_bind_int64(st, 1, id);
    int step = sqlite3_step(st), rc = 0;
    if (step == SQLITE_DONE) rc = 1;
    else if (step != SQLITE_ROW) rc = sqerr(d->wr, e, "transition");
    else if (job_state_parse((const char *)sqlite3_column_text(st, 0), cur)) rc = ac_errf(e, "job %ld: bad state", id);
    sqlite3_finalize(st);
    return rc;
}

/* The UPDATE and the transition row of db_job_transition. Writer lock held. */
static int write_transition(db *d, long id, job_state cur, job_state to, const char *reason, const char *device,
                            const char *result, double t, ac_err *e) {
    sqlite3_stmt *st = NULL;
    const char *sql =
        "UPDATE jobs SET state = ?1, updated_at = ?2, reason = COALESCE(?3, reason), device = COALESCE(?4, device),"
        " result = COALESCE(?5, result),"
        " started_at = CASE WHEN ?1 = 'running' THEN ?2 ELSE started_at END,"
        " finished_at = CASE WHEN ?1 IN ('succeeded','failed','cancelled') THEN ?2 ELSE finished_at END,"
        " attempts = attempts + (?1 = 'running'),"
        " worker_pid = CASE WHEN ?1 = 'running' THEN worker_pid ELSE NULL END WHERE id = ?6";
    if (sqlite3_prepare_v2(d->wr, sql, -1, &st, NULL) != SQLITE_OK) return sqerr(d->wr, e, "transition");
    sqlite3_bind_text(st, 1, job_state_name(to), -1, SQLITE_STATIC);
    sqlite3_bind_double(st, 2, t);
    if (reason) sqlite3_bind_text(st, 3, reason, -1, SQLITE_TRANSIENT);
    if (device) sqlite3_bind_text(st, 4, device, -1, SQLITE_TRANSIENT);
    if (result) sqlite3_bind_text(st, 5, result, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 6, id);
    int ok = sqlite3_step(st) == SQLITE_DONE;
    sqlite3_finalize(st);
    if (!ok) return sqerr(d->wr, e, "transition");
    if (sqlite3_prepare_v2(d->wr, "INSERT INTO job_transitions (job_id, from_state, to_state, at, reason) VALUES (?, ?, ?, ?, ?)",
                           -1, &st, NULL) != SQLITE_OK)
        return sqerr(d->wr, e, "transition");
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_text(st, 2, job_state_name(cur), -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, job_state_name(to), -1, SQLITE_STATIC);
    sqlite3_bind_double(st, 4, t);
    if (reason) sqlite3_bind_text(st, 5, reason, -1, SQLITE_TRANSIENT);
    ok = sqlite3_step(st) == SQLITE_DONE;
    sqlite3_finalize(st);
    return ok ? 0 : sqerr(d->wr, e, "transition");
}

int db_job_transition(db *d, long id, job_state from, job_state to, const char *reason, const char *device,
                      const char *result, ac_err *e) {
    pthread_mutex_lock(&d->wmu);
    if (wbegin(d, 1, e)) {
        wr_result(d, 0, e->msg);
        pthread_mutex_unlock(&d->wmu);
        return -1;
    }
    job_state cur;
    int rc = current_state(d, id, &cur, e);
    if (rc == 0 && (from == JOB_ANY_LIVE ? job_state_terminal(cur) : cur != from)) rc = 1;
    if (rc == 0) rc = write_transition(d, id, cur, to, reason, device, result, now_s(), e);
    /* rc 1 (not in that state) changed nothing: roll back, not a failure */
    if (wend(d, rc == 0, 1, e) && rc == 0) rc = -1;
    if (rc != 1) wr_result(d, rc == 0, e->msg);
    pthread_mutex_unlock(&d->wmu);
    return rc;
}

int db_queue(db *d, db_queued **queue, int *n, ac_err *e) {
    sqlite3_stmt *st;
    *queue = NULL;
    *n = 0;
    pthread_mutex_lock(&d->rmu);
    if (sqlite3_prepare_v2(d->rd, "SELECT id, reason, json_extract(spec, '$.target.device') FROM jobs WHERE state = 'queued'"
                                  " ORDER BY priority DESC, id", -1, &st, NULL) != SQLITE_OK) {
        int rc = sqerr(d->rd, e, "queue");
        pthread_mutex_unlock(&d->rmu);
        return rc;
    }
    int sr, cap = 0, rc = 0;
    while ((sr = sqlite3_step(st)) == SQLITE_ROW) {
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            db_queued *nq = realloc(*queue, (size_t)cap * sizeof *nq);
            if (!nq) { rc = ac_errf(e, "out of memory"); break; }
            *queue = nq;
        }
        db_queued *q = &(*queue)[(*n)++];
        const char *reason = (const char *)sqlite3_column_text(st, 1), *dev = (const char *)sqlite3_column_text(st, 2);
        q->id = (long)sqlite3_column_int64(st, 0);
        snprintf(q->reason, sizeof q->reason, "%s", reason ? reason : "");
        snprintf(q->device, sizeof q->device, "%s", dev ? dev : "cpu");
    }
    if (rc == 0 && sr != SQLITE_DONE) rc = sqerr(d->rd, e, "queue");
    sqlite3_finalize(st);
    pthread_mutex_unlock(&d->rmu);
    if (rc) {
        free(*queue);
        *queue = NULL;
        *n = 0;
    }
    return rc;
}

/* UPDATE jobs SET <column> = value (text, or num when text is NULL). */
static int job_set(db *d, long id, const char *sql, const char *text, long num, ac_err *e) {
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

int db_job_set_reason(db *d, long id, const char *reason, ac_err *e) {
    return job_set(d, id, "UPDATE jobs SET reason = ?, updated_at = ? WHERE id = ?", reason, 0, e);
}

int db_job_set_pid(db *d, long id, long pid, ac_err *e) {
    return job_set(d, id, "UPDATE jobs SET worker_pid = ?, updated_at = ? WHERE id = ?", NULL, pid, e);
}

int db_job_set_cancel(db *d, long id, ac_err *e) {
    return job_set(d, id, "UPDATE jobs SET cancel_requested = ?, updated_at = ? WHERE id = ?", NULL, 1, e);
}

int db_recover(db *d, const char *policy, int max_attempts, ac_err *e) {
    db_job *running;
    int nrun;
    job_state st = JOB_RUNNING;
    if (db_job_list(d, &st, 0, 1000000, &running, &nrun, e)) return -1;
    int n = 0;
    for (int i = 0; i < nrun; i++) {
        const db_job *j = &running[i];
        int cancel = j->cancel_requested;
        int requeue = !strcmp(policy, "requeue") && j->attempts < max_attempts && !cancel;
        job_state to = cancel ? JOB_CANCELLED : requeue ? JOB_QUEUED : JOB_FAILED;
        const char *why = cancel ? "cancelled (daemon stopped while cancelling)"
                          : requeue ? "interrupted: the daemon stopped while the job ran; re-queued"
                                    : "interrupted: the daemon stopped while the job ran";
        if (db_job_transition(d, j->id, JOB_RUNNING, to, why, NULL, NULL, e) < 0) {
            db_jobs_free(running, nrun);
            return -1;
        }
        n++;
    }
    db_jobs_free(running, nrun);
    return n;
}

int db_job_counts(db *d, long counts[JOB_NSTATES], ac_err *e) {
    sqlite3_stmt *st;
    memset(counts, 0, sizeof(long) * JOB_NSTATES);
    pthread_mutex_lock(&d->rmu);
    if (sqlite3_prepare_v2(d->rd, "SELECT state, COUNT(*) FROM jobs GROUP BY state", -1, &st, NULL) != SQLITE_OK) {
        int rc = sqerr(d->rd, e, "counts");
        pthread_mutex_unlock(&d->rmu);
        return rc;
    }
    int sr;
    while ((sr = sqlite3_step(st)) == SQLITE_ROW) {
        job_state s;
        if (!job_state_parse((const char *)sqlite3_column_text(st, 0), &s)) counts[s] = (long)sqlite3_column_int64(st, 1);
    }
    int rc = sr == SQLITE_DONE ? 0 : sqerr(d->rd, e, "counts");
    sqlite3_finalize(st);
    pthread_mutex_unlock(&d->rmu);
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

void db_events_free(db_event *evs, int n) {
    for (int i = 0; i < n; i++) free(evs[i].data);
    free(evs);
}

int db_events(db *d, long job, long after, int limit, db_event **events, int *n, ac_err *e) {
    sqlite3_stmt *st;
    *events = NULL;
    *n = 0;
    pthread_mutex_lock(&d->rmu);
    if (sqlite3_prepare_v2(d->rd, "SELECT id, kind, data, at FROM events WHERE job_id = ? AND id > ? ORDER BY id LIMIT ?",
                           -1, &st, NULL) != SQLITE_OK) {
        int rc = sqerr(d->rd, e, "events");
        pthread_mutex_unlock(&d->rmu);
        return rc;
    }
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int64(st, 2, after);
    sqlite3_bind_int(st, 3, limit);
    int sr, cap = 0, rc = 0;
    while ((sr = sqlite3_step(st)) == SQLITE_ROW) {
        if (*n == cap) {
            cap = cap ? cap * 2 : 64;
            db_event *ne = realloc(*events, (size_t)cap * sizeof *ne);
            if (!ne) { rc = ac_errf(e, "out of memory"); break; }
            *events = ne;
        }
        db_event *ev = &(*events)[*n];
        int oom = 0;
        ev->id = (long)sqlite3_column_int64(st, 0);
        snprintf(ev->kind, sizeof ev->kind, "%s", (const char *)sqlite3_column_text(st, 1));
        ev->data = col_text(st, 2, &oom);
        ev->at = sqlite3_column_double(st, 3);
        if (oom || !ev->data) { rc = ac_errf(e, "out of memory reading events"); free(ev->data); break; }
        (*n)++;
    }
    if (rc == 0 && sr != SQLITE_DONE) rc = sqerr(d->rd, e, "events");
    sqlite3_finalize(st);
    pthread_mutex_unlock(&d->rmu);
    if (rc) {
        db_events_free(*events, *n);
        *events = NULL;
        *n = 0;
    }
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

int db_cost_list(db *d, db_cost_row **rows, int *n, ac_err *e) {
    sqlite3_stmt *st;
    *rows = NULL;
    *n = 0;
    pthread_mutex_lock(&d->rmu);
    if (sqlite3_prepare_v2(d->rd, "SELECT key, device, dtype, engine, version, source, created_at, hits FROM cost_tables"
                                  " ORDER BY created_at", -1, &st, NULL) != SQLITE_OK) {
        int rc = sqerr(d->rd, e, "list cost tables");
        pthread_mutex_unlock(&d->rmu);
        return rc;
    }
    int sr, cap = 0, rc = 0;
    while ((sr = sqlite3_step(st)) == SQLITE_ROW) {
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            db_cost_row *nr = realloc(*rows, (size_t)cap * sizeof *nr);
            if (!nr) { rc = ac_errf(e, "out of memory"); break; }
            *rows = nr;
        }
        db_cost_row *r = &(*rows)[(*n)++];
        snprintf(r->key, sizeof r->key, "%s", (const char *)sqlite3_column_text(st, 0));
        snprintf(r->device, sizeof r->device, "%s", (const char *)sqlite3_column_text(st, 1));
        snprintf(r->dtype, sizeof r->dtype, "%s", (const char *)sqlite3_column_text(st, 2));
        snprintf(r->engine, sizeof r->engine, "%s", (const char *)sqlite3_column_text(st, 3));
        r->version = sqlite3_column_int(st, 4);
        snprintf(r->source, sizeof r->source, "%s", (const char *)sqlite3_column_text(st, 5));
        r->created_at = sqlite3_column_double(st, 6);
        r->hits = (long)sqlite3_column_int64(st, 7);
    }
    if (rc == 0 && sr != SQLITE_DONE) rc = sqerr(d->rd, e, "list cost tables");
    sqlite3_finalize(st);
    pthread_mutex_unlock(&d->rmu);
    if (rc) {
        free(*rows);
        *rows = NULL;
        *n = 0;
    }
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
