/* db.c - see db.h. */
#include "db.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "jobsecret.h"

struct db {
    sqlite3 *wr, *rd;
    char path[4096];
    int fd; /* the database file as opened, for file_check (-1: none) */
    pthread_mutex_t wmu, rmu, hmu;
    int degraded; /* the last write failed (hmu) */
    long write_failures;
    char last_error[256];
};

static int open_conn(const char *path, int flags, sqlite3 **c, ac_err *e);
static int open_files(db *d, const char *path, ac_err *e);
static void close_files(db *d);

/* The open database written back to its path after the file was deleted
 * there (the jobs it holds would be lost at the next start): an online
 * backup of the open connection into PATH.restore, the old connections
 * closed (SQLite removes their WAL and shared-memory files by name), the
 * copy linked into place (never over a file that appeared meanwhile) and
 * the connections opened on it. Writer lock held. 0, or -1 (the path
 * cannot take a file now: retried at the next write or health check). */
static int rewrite_deleted(db *d, ac_err *e) {
    char tmp[sizeof d->path + 16];
    snprintf(tmp, sizeof tmp, "%s.restore", d->path);
    unlink(tmp);
    sqlite3 *dst = NULL;
    int rc = open_conn(tmp, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, &dst, e);
    if (rc == 0) {
        sqlite3_backup *b = sqlite3_backup_init(dst, "main", d->wr, "main");
        int st = b ? sqlite3_backup_step(b, -1) : SQLITE_ERROR;
        if (sqlite3_backup_finish(b) != SQLITE_OK || st != SQLITE_DONE ||
            sqlite3_exec(dst, "PRAGMA journal_mode=WAL", NULL, NULL, NULL) != SQLITE_OK)
            rc = ac_errf(e, "database %s was deleted while open and cannot be written back: %s", d->path,
                         sqlite3_errmsg(dst));
    }
    if (dst && sqlite3_close(dst) != SQLITE_OK && rc == 0)
        rc = ac_errf(e, "database %s was deleted while open and cannot be written back", d->path);
    struct stat sb;
    if (rc == 0 && stat(d->path, &sb) == 0)
        rc = ac_errf(e, "database %s was replaced by another file while open; restart the daemon", d->path);
    if (rc) {
        unlink(tmp);
        if (!strstr(e->msg, "deleted") && !strstr(e->msg, "replaced"))
            ac_errctx(e, "database %s was deleted while open and cannot be written back yet", d->path);
        return -1;
    }
    pthread_mutex_lock(&d->rmu);
    close_files(d);
    int linked = link(tmp, d->path) == 0, why = errno;
    if (linked) unlink(tmp);
    /* a file put at the path in between is left alone: the jobs stay in PATH.restore, and the check says "replaced" */
    rc = open_files(d, linked ? d->path : tmp, e);
    pthread_mutex_unlock(&d->rmu);
    if (rc == 0 && !linked)
        rc = ac_errf(e, "database %s: a file appeared at its path (%s); the daemon's jobs are in %s", d->path,
                     strerror(why), tmp);
    if (rc == 0)
        fprintf(stderr, "autocompressd: database %s was deleted while open; written back from the open copy\n",
                d->path);
    return rc;
}

/* Is the open database still the file at its path, and writable? A
 * database deleted while open is written back from the open copy (held:
 * the writer lock); one replaced or not writable is refused as a failed
 * write (0 or -1 with a message). */
static int file_check(db *d, ac_err *e) {
    if (d->fd < 0) return 0;
    struct stat open_sb, path_sb;
    if (fstat(d->fd, &open_sb) != 0) return ac_errf(e, "database %s: %s", d->path, strerror(errno));
    int at_path = stat(d->path, &path_sb) == 0, err = errno;
    if (at_path && (path_sb.st_dev != open_sb.st_dev || path_sb.st_ino != open_sb.st_ino))
        return ac_errf(e, "database %s was replaced by another file while open; restart the daemon", d->path);
    if (open_sb.st_nlink == 0 || (!at_path && err == ENOENT)) return rewrite_deleted(d, e);
    if (!at_path) return ac_errf(e, "database %s: %s", d->path, strerror(err));
    if (access(d->path, W_OK) != 0)
        return ac_errf(e, "database %s is not writable (%s)", d->path,
                       errno == EPERM ? "immutable" : strerror(errno));
    return 0;
}

/* Record the outcome of a write for db_health. */
static void wr_result(db *d, int ok, const char *msg) {
    pthread_mutex_lock(&d->hmu);
    if (ok)
        d->degraded = 0;
    else {
        d->degraded = 1;
        d->write_failures++;
        snprintf(d->last_error, sizeof d->last_error, "%.250s", msg ? msg : "write failed");
    }
    pthread_mutex_unlock(&d->hmu);
}

int db_health(db *d, char *msg, size_t n, long *write_failures) {
    ac_err fe;
    pthread_mutex_lock(&d->wmu);
    int file_bad = file_check(d, &fe);
    pthread_mutex_unlock(&d->wmu);
    pthread_mutex_lock(&d->hmu);
    int deg = d->degraded || file_bad;
    if (msg && n) snprintf(msg, n, "%s", file_bad ? fe.msg : deg ? d->last_error : "");
    if (write_failures) *write_failures = d->write_failures;
    pthread_mutex_unlock(&d->hmu);
    return deg;
}

/* Writer transactions. durable: synchronous=FULL for this commit. */
static int wbegin(db *d, int durable, ac_err *e) {
    if (file_check(d, e)) return -1;
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

/* PRAGMA user_version of the writer connection (the caller holds it alone). */
static int user_version(db *d) {
    sqlite3_stmt *st;
    int v = -1;
    if (sqlite3_prepare_v2(d->wr, "PRAGMA user_version", -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return v;
}

int db_schema_version(db *d) {
    pthread_mutex_lock(&d->wmu);
    int v = user_version(d);
    pthread_mutex_unlock(&d->wmu);
    return v;
}

/* Writer connection held alone (at open, or under the writer lock). */
static int migrate(db *d, ac_err *e) {
    int cur = user_version(d);
    char *err = NULL;
    if (sqlite3_exec(d->wr,
                     "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
                     "applied_at REAL NOT NULL)",
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
        snprintf(sql, sizeof sql, "INSERT INTO schema_migrations VALUES (%d, '%s', %.3f); PRAGMA user_version = %d;",
                 m->version, m->name, now_s(), m->version);
        if (sqlite3_exec(d->wr, sql, NULL, NULL, &err) != SQLITE_OK ||
            sqlite3_exec(d->wr, "COMMIT", NULL, NULL, &err) != SQLITE_OK) {
            ac_errf(e, "migration %s: %s", m->name, err ? err : "?");
            sqlite3_free(err);
            sqlite3_exec(d->wr, "ROLLBACK", NULL, NULL, NULL);
            return -1;
        }
    }
    return 0;
}

static int hash_legacy_secrets(db *d, ac_err *e);

/* The writer connection (WAL, migrations run), the reader and the file
 * descriptor of file_check, on path. */
static int open_files(db *d, const char *path, ac_err *e) {
    if (open_conn(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, &d->wr, e)) return -1;
    char *err = NULL;
    if (sqlite3_exec(d->wr, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;", NULL, NULL,
                     &err) != SQLITE_OK) {
        ac_errf(e, "database %s: %s", path, err);
        sqlite3_free(err);
        return -1;
    }
    if (migrate(d, e) || hash_legacy_secrets(d, e) || open_conn(path, SQLITE_OPEN_READONLY, &d->rd, e)) return -1;
    if (strcmp(path, ":memory:") && (d->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return ac_errf(e, "database %s: %s", path, strerror(errno));
    return 0;
}

static void close_files(db *d) {
    sqlite3_close(d->rd);
    sqlite3_close(d->wr);
    if (d->fd >= 0) close(d->fd);
    d->rd = d->wr = NULL;
    d->fd = -1;
}

int db_open(const char *path, db **out, ac_err *e) {
    db *d = calloc(1, sizeof *d);
    if (!d) return ac_errf(e, "out of memory");
    pthread_mutex_init(&d->wmu, NULL);
    pthread_mutex_init(&d->rmu, NULL);
    pthread_mutex_init(&d->hmu, NULL);
    d->fd = -1;
    snprintf(d->path, sizeof d->path, "%s", path);
    if (open_files(d, path, e)) {
        db_close(d);
        return -1;
    }
    *out = d;
    return 0;
}

void db_close(db *d) {
    if (!d) return;
    close_files(d);
    pthread_mutex_destroy(&d->wmu);
    pthread_mutex_destroy(&d->rmu);
    pthread_mutex_destroy(&d->hmu);
    free(d);
}

/* ------------------------------------------------------------- statements */

/* A statement parameter: text (NULL text binds NULL), integer or real. */
typedef struct {
    int kind;
    const char *s;
    sqlite3_int64 i;
    double f;
} arg;
#define A_TEXT(x) ((arg){1, (x), 0, 0})
#define A_INT(x) ((arg){2, NULL, (sqlite3_int64)(x), 0})
#define A_REAL(x) ((arg){3, NULL, 0, (x)})
#define ARGS(...) (const arg[]){__VA_ARGS__}, (int)(sizeof((const arg[]){__VA_ARGS__}) / sizeof(arg))

static int prepare(sqlite3 *c, const char *sql, const arg *a, int n, sqlite3_stmt **st) {
    if (sqlite3_prepare_v2(c, sql, -1, st, NULL) != SQLITE_OK) return -1;
    for (int i = 0; i < n; i++) {
        if (a[i].kind == 1 && a[i].s)
            sqlite3_bind_text(*st, i + 1, a[i].s, -1, SQLITE_TRANSIENT);
        else if (a[i].kind == 2)
            sqlite3_bind_int64(*st, i + 1, a[i].i);
        else if (a[i].kind == 3)
            sqlite3_bind_double(*st, i + 1, a[i].f);
    }
    return 0;
}

/* One statement on the writer connection, its lock held. *rowid (optional): the new row's id. */
static int exec_w(db *d, const char *sql, const arg *a, int n, const char *what, long *rowid, ac_err *e) {
    sqlite3_stmt *st;
    if (prepare(d->wr, sql, a, n, &st)) return sqerr(d->wr, e, what);
    int ok = sqlite3_step(st) == SQLITE_DONE;
    sqlite3_finalize(st);
    if (!ok) return sqerr(d->wr, e, what);
    if (rowid) *rowid = (long)sqlite3_last_insert_rowid(d->wr);
    return 0;
}

/* One statement in autocommit, with the writer lock and the health record. */
static int write1(db *d, const char *sql, const arg *a, int n, const char *what, long *rowid, ac_err *e) {
    pthread_mutex_lock(&d->wmu);
    int rc = file_check(d, e) ? -1 : exec_w(d, sql, a, n, what, rowid, e);
    wr_result(d, rc == 0, e->msg);
    pthread_mutex_unlock(&d->wmu);
    return rc;
}

/* Fill one array element from a row: 0, or -1 (out of memory or a bad row; the element is left clear). */
typedef int (*row_fn)(sqlite3_stmt *st, void *elem);

/* The rows of a read statement, one element of `size` bytes each, into *out (*n of them; caller frees). */
static int read_rows(db *d, const char *sql, const arg *a, int na, row_fn row, size_t size, void (*clear)(void *),
                     void **out, int *n, const char *what, ac_err *e) {
    sqlite3_stmt *st = NULL;
    char *arr = NULL;
    int rc = 0, sr = SQLITE_DONE, cap = 0;
    *n = 0;
    pthread_mutex_lock(&d->rmu);
    if (prepare(d->rd, sql, a, na, &st)) rc = sqerr(d->rd, e, what);
    while (rc == 0 && (sr = sqlite3_step(st)) == SQLITE_ROW) {
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            char *na2 = realloc(arr, (size_t)cap * size);
            if (!na2) {
                rc = ac_errf(e, "out of memory (%s)", what);
                break;
            }
            arr = na2;
        }
        memset(arr + (size_t)*n * size, 0, size);
        if (row(st, arr + (size_t)*n * size))
            rc = ac_errf(e, "out of memory or a bad row (%s)", what);
        else
            (*n)++;
    }
    if (rc == 0 && sr != SQLITE_DONE) rc = sqerr(d->rd, e, what);
    if (st) sqlite3_finalize(st);
    pthread_mutex_unlock(&d->rmu);
    if (rc) {
        for (int i = 0; clear && i < *n; i++) clear(arr + (size_t)i * size);
        free(arr);
        arr = NULL;
        *n = 0;
    }
    *out = arr;
    return rc;
}

static int text_row(sqlite3_stmt *st, void *elem) {
    const char *t = (const char *)sqlite3_column_text(st, 0);
    return t && !(*(char **)elem = strdup(t)) ? -1 : 0;
}

static void text_clear(void *elem) { free(*(char **)elem); }

/* The first column of the first row (caller frees), NULL when there is no row or it is NULL. */
static int read_text(db *d, const char *sql, const arg *a, int na, char **out, const char *what, ac_err *e) {
    char **v;
    int n;
    *out = NULL;
    if (read_rows(d, sql, a, na, text_row, sizeof *v, text_clear, (void **)&v, &n, what, e)) return -1;
    if (n > 0) *out = v[0];
    for (int i = 1; i < n; i++) free(v[i]);
    free(v);
    return 0;
}

/* ------------------------------------------------------------- jobs */

/* The id and spec of the job holding idempotency key k: 0 (spec NULL when none), -1. Writer lock held. */
static int idem_lookup(db *d, const char *k, long *id, char **spec, ac_err *e) {
    sqlite3_stmt *st;
    *spec = NULL;
    if (prepare(d->wr, "SELECT id, spec FROM jobs WHERE idempotency_key = ?", ARGS(A_TEXT(k)), &st))
        return sqerr(d->wr, e, "idempotency key");
    int sr = sqlite3_step(st), rc = 0;
    if (sr == SQLITE_ROW) {
        *id = (long)sqlite3_column_int64(st, 0);
        if (!(*spec = strdup((const char *)sqlite3_column_text(st, 1)))) rc = ac_errf(e, "out of memory");
    } else if (sr != SQLITE_DONE)
        rc = sqerr(d->wr, e, "idempotency key");
    sqlite3_finalize(st);
    return rc;
}

long db_job_insert(db *d, const char *spec, const char *name, int priority, const char *owner, const char *idem_key,
                   char **existing_spec, ac_err *e) {
    long id = -1;
    double t = now_s();
    char *existing = NULL;
    pthread_mutex_lock(&d->wmu);
    int rc = wbegin(d, 1, e);
    if (rc == 0 && idem_key) rc = idem_lookup(d, idem_key, &id, &existing, e);
    if (rc == 0 && !existing) /* else a retry: no new job */
        rc = exec_w(d,
                    "INSERT INTO jobs (name, state, priority, spec, reason, created_at, updated_at, idempotency_key,"
                    " owner) VALUES (?, 'queued', ?, ?, 'waiting for the scheduler', ?, ?, ?, ?)",
                    ARGS(A_TEXT(name), A_INT(priority), A_TEXT(spec), A_REAL(t), A_REAL(t), A_TEXT(idem_key),
                         A_TEXT(owner)),
                    "insert job", &id, e);
    if (rc == 0 && !existing)
        rc = exec_w(d,
                    "INSERT INTO job_transitions (job_id, from_state, to_state, at, reason)"
                    " VALUES (?, NULL, 'queued', ?, 'submitted')",
                    ARGS(A_INT(id), A_REAL(t)), "insert transition", NULL, e);
    if (rc == 0 || sqlite3_get_autocommit(d->wr) == 0) rc = wend(d, rc == 0, 1, e) ? -1 : rc;
    wr_result(d, rc == 0, e->msg);
    pthread_mutex_unlock(&d->wmu);
    if (rc) {
        free(existing);
        return -1;
    }
    if (existing_spec)
        *existing_spec = existing;
    else
        free(existing);
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
    free(j->owner);
    for (int i = 0; i < j->ntransitions; i++) free(j->transitions[i].reason);
    free(j->transitions);
    memset(j, 0, sizeof *j);
}

static void job_clear(void *j) { db_job_clear(j); }

void db_jobs_free(db_job *jobs, int n) {
    for (int i = 0; i < n; i++) db_job_clear(&jobs[i]);
    free(jobs);
}

#define JOB_COLS                                                                                                       \
    "id, name, state, priority, device, reason, attempts, cancel_requested, created_at, updated_at, started_at, "      \
    "finished_at, result IS NOT NULL, owner"

/* One row of JOB_COLS (and the spec, when selected as column 14). */
static int job_row(sqlite3_stmt *st, void *elem) {
    db_job *j = elem;
    int bad = 0, has;
    j->id = (long)sqlite3_column_int64(st, 0);
    j->name = col_text(st, 1, &bad);
    if (job_state_parse((const char *)sqlite3_column_text(st, 2), &j->state)) bad = 1;
    j->priority = sqlite3_column_int(st, 3);
    j->device = col_text(st, 4, &bad);
    j->reason = col_text(st, 5, &bad);
    j->attempts = (long)sqlite3_column_int64(st, 6);
    j->cancel_requested = sqlite3_column_int(st, 7) != 0;
    j->created_at = col_time(st, 8, &has);
    j->updated_at = col_time(st, 9, &has);
    j->started_at = col_time(st, 10, &j->has_started);
    j->finished_at = col_time(st, 11, &j->has_finished);
    j->has_result = sqlite3_column_int(st, 12) != 0;
    j->owner = col_text(st, 13, &bad);
    if (sqlite3_column_count(st) > 14) j->spec = col_text(st, 14, &bad);
    if (bad) db_job_clear(j);
    return bad ? -1 : 0;
}

static int transition_row(sqlite3_stmt *st, void *elem) {
    db_transition *t = elem;
    int bad = 0;
    t->has_from = job_state_parse((const char *)sqlite3_column_text(st, 0), &t->from) == 0;
    if (job_state_parse((const char *)sqlite3_column_text(st, 1), &t->to)) bad = 1;
    t->at = sqlite3_column_double(st, 2);
    t->reason = col_text(st, 3, &bad);
    if (bad) free(t->reason);
    return bad ? -1 : 0;
}

static void transition_clear(void *elem) { free(((db_transition *)elem)->reason); }

int db_job_get(db *d, long id, db_job *job, int *found, ac_err *e) {
    db_job *rows;
    int n;
    *found = 0;
    memset(job, 0, sizeof *job);
    if (read_rows(d, "SELECT " JOB_COLS ", spec FROM jobs WHERE id = ?", ARGS(A_INT(id)), job_row, sizeof *rows,
                  job_clear, (void **)&rows, &n, "get job", e))
        return -1;
    if (n == 0) {
        free(rows);
        return 0;
    }
    *job = rows[0];
    free(rows);
    if (read_rows(d, "SELECT from_state, to_state, at, reason FROM job_transitions WHERE job_id = ? ORDER BY id",
                  ARGS(A_INT(id)), transition_row, sizeof(db_transition), transition_clear, (void **)&job->transitions,
                  &job->ntransitions, "get job transitions", e)) {
        db_job_clear(job);
        return -1;
    }
    *found = 1;
    return 0;
}

int db_job_list(db *d, const job_state *state, const char *owner, long after, int limit, db_job **jobs, int *n,
                ac_err *e) {
    /* a NULL parameter matches every row: ? IS NULL */
    const char *sn = state ? job_state_name(*state) : NULL;
    return read_rows(d,
                     "SELECT " JOB_COLS " FROM jobs WHERE id > ? AND (?2 IS NULL OR state = ?2)"
                     " AND (?3 IS NULL OR owner = ?3) ORDER BY id LIMIT ?4",
                     ARGS(A_INT(after), A_TEXT(sn), A_TEXT(owner), A_INT(limit)), job_row, sizeof **jobs, job_clear,
                     (void **)jobs, n, "list jobs", e);
}

int db_job_owner(db *d, long id, char *owner, size_t n, int *found, ac_err *e) {
    sqlite3_stmt *st = NULL;
    int rc = 0, sr;
    *found = 0;
    owner[0] = 0;
    pthread_mutex_lock(&d->rmu);
    if (prepare(d->rd, "SELECT owner FROM jobs WHERE id = ?", ARGS(A_INT(id)), &st))
        rc = sqerr(d->rd, e, "job owner");
    else if ((sr = sqlite3_step(st)) == SQLITE_ROW) {
        const char *o = (const char *)sqlite3_column_text(st, 0);
        snprintf(owner, n, "%s", o ? o : "");
        *found = 1;
    } else if (sr != SQLITE_DONE)
        rc = sqerr(d->rd, e, "job owner");
    if (st) sqlite3_finalize(st);
    pthread_mutex_unlock(&d->rmu);
    return rc;
}

int db_job_spec(db *d, long id, char **spec, ac_err *e) {
    return read_text(d, "SELECT spec FROM jobs WHERE id = ?", ARGS(A_INT(id)), spec, "job spec", e);
}

int db_job_result(db *d, long id, char **result, ac_err *e) {
    return read_text(d, "SELECT result FROM jobs WHERE id = ?", ARGS(A_INT(id)), result, "job result", e);
}

/* The state of job id into *cur: 0, 1 unknown job, -1 error. Writer lock held. */
static int current_state(db *d, long id, job_state *cur, ac_err *e) {
    sqlite3_stmt *st;
    if (prepare(d->wr, "SELECT state FROM jobs WHERE id = ?", ARGS(A_INT(id)), &st))
        return sqerr(d->wr, e, "transition");
    int step = sqlite3_step(st), rc = 0;
    if (step == SQLITE_DONE)
        rc = 1;
    else if (step != SQLITE_ROW)
        rc = sqerr(d->wr, e, "transition");
    else if (job_state_parse((const char *)sqlite3_column_text(st, 0), cur))
        rc = ac_errf(e, "job %ld: bad state", id);
    sqlite3_finalize(st);
    return rc;
}

int db_job_transition(db *d, long id, job_state from, job_state to, const char *reason, const char *device,
                      const char *result, ac_err *e) {
    static const char upd[] =
        "UPDATE jobs SET state = ?1, updated_at = ?2, reason = COALESCE(?3, reason), device = COALESCE(?4, device),"
        " result = COALESCE(?5, result),"
        " started_at = CASE WHEN ?1 = 'running' THEN ?2 ELSE started_at END,"
        " finished_at = CASE WHEN ?1 IN ('succeeded','failed','cancelled') THEN ?2 ELSE finished_at END,"
        " attempts = attempts + (?1 = 'running'),"
        " worker_pid = CASE WHEN ?1 = 'running' THEN worker_pid ELSE NULL END WHERE id = ?6";
    double t = now_s();
    job_state cur;
    pthread_mutex_lock(&d->wmu);
    int rc = wbegin(d, 1, e);
    if (rc == 0) rc = current_state(d, id, &cur, e);
    if (rc == 0 && (from == JOB_ANY_LIVE ? job_state_terminal(cur) : cur != from)) rc = 1;
    if (rc == 0)
        rc = exec_w(
            d, upd,
            ARGS(A_TEXT(job_state_name(to)), A_REAL(t), A_TEXT(reason), A_TEXT(device), A_TEXT(result), A_INT(id)),
            "transition", NULL, e);
    if (rc == 0)
        rc = exec_w(d, "INSERT INTO job_transitions (job_id, from_state, to_state, at, reason) VALUES (?, ?, ?, ?, ?)",
                    ARGS(A_INT(id), A_TEXT(job_state_name(cur)), A_TEXT(job_state_name(to)), A_REAL(t), A_TEXT(reason)),
                    "transition", NULL, e);
    /* rc 1 (not in that state) changed nothing: roll back, not a failure */
    if ((rc >= 0 || sqlite3_get_autocommit(d->wr) == 0) && wend(d, rc == 0, 1, e) && rc == 0) rc = -1;
    if (rc != 1) wr_result(d, rc == 0, e->msg);
    pthread_mutex_unlock(&d->wmu);
    return rc;
}

static int queued_row(sqlite3_stmt *st, void *elem) {
    db_queued *q = elem;
    const char *reason = (const char *)sqlite3_column_text(st, 1), *dev = (const char *)sqlite3_column_text(st, 2);
    q->id = (long)sqlite3_column_int64(st, 0);
    snprintf(q->reason, sizeof q->reason, "%s", reason ? reason : "");
    snprintf(q->device, sizeof q->device, "%s", dev ? dev : "cpu");
    return 0;
}

int db_queue(db *d, db_queued **queue, int *n, ac_err *e) {
    return read_rows(d,
                     "SELECT id, reason, json_extract(spec, '$.target.device') FROM jobs WHERE state = 'queued'"
                     " ORDER BY priority DESC, id",
                     NULL, 0, queued_row, sizeof **queue, NULL, (void **)queue, n, "queue", e);
}

int db_job_set_reason(db *d, long id, const char *reason, ac_err *e) {
    return write1(d, "UPDATE jobs SET reason = ?, updated_at = ? WHERE id = ?",
                  ARGS(A_TEXT(reason), A_REAL(now_s()), A_INT(id)), "set reason", NULL, e);
}

int db_job_set_pid(db *d, long id, long pid, ac_err *e) {
    return write1(d, "UPDATE jobs SET worker_pid = ?, updated_at = ? WHERE id = ?",
                  ARGS(A_INT(pid), A_REAL(now_s()), A_INT(id)), "set worker pid", NULL, e);
}

int db_job_set_cancel(db *d, long id, ac_err *e) {
    return write1(d, "UPDATE jobs SET cancel_requested = 1, updated_at = ? WHERE id = ?",
                  ARGS(A_REAL(now_s()), A_INT(id)), "request cancel", NULL, e);
}

/* ------------------------------------------------------------- executor columns (003) */

static int exec_row(sqlite3_stmt *st, void *elem) {
    db_exec_job *j = elem;
    const char *name = (const char *)sqlite3_column_text(st, 2), *state = (const char *)sqlite3_column_text(st, 3),
               *secret = (const char *)sqlite3_column_text(st, 4), *js = (const char *)sqlite3_column_text(st, 7);
    j->id = (long)sqlite3_column_int64(st, 0);
    j->slurm_job_id = (long)sqlite3_column_int64(st, 1);
    snprintf(j->name, sizeof j->name, "%s", name ? name : "");
    snprintf(j->slurm_state, sizeof j->slurm_state, "%s", state ? state : "");
    snprintf(j->secret_sha256, sizeof j->secret_sha256, "%s", secret ? secret : "");
    j->seq = (long)sqlite3_column_int64(st, 5);
    j->cancel_requested = sqlite3_column_int(st, 6) != 0;
    return js == NULL || job_state_parse(js, &j->state) ? -1 : 0;
}

#define EXEC_COLS "id, slurm_job_id, slurm_name, slurm_state, exec_secret_sha256, exec_seq, cancel_requested, state"

int db_exec_live(db *d, const char *executor, db_exec_job **jobs, int *n, ac_err *e) {
    return read_rows(d, "SELECT " EXEC_COLS " FROM jobs WHERE executor = ? AND state = 'running' ORDER BY id",
                     ARGS(A_TEXT(executor)), exec_row, sizeof **jobs, NULL, (void **)jobs, n, "executor jobs", e);
}

int db_exec_get(db *d, long id, db_exec_job *job, char *executor, size_t n, int *found, ac_err *e) {
    db_exec_job *rows;
    int nr;
    char *ex = NULL;
    *found = 0;
    if (read_rows(d, "SELECT " EXEC_COLS " FROM jobs WHERE id = ?", ARGS(A_INT(id)), exec_row, sizeof *rows, NULL,
                  (void **)&rows, &nr, "executor job", e))
        return -1;
    if (nr > 0) {
        *job = rows[0];
        *found = 1;
    }
    free(rows);
    if (*found && read_text(d, "SELECT executor FROM jobs WHERE id = ?", ARGS(A_INT(id)), &ex, "executor", e))
        return -1;
    snprintf(executor, n, "%s", ex ? ex : "");
    free(ex);
    return 0;
}

int db_exec_prepare(db *d, long id, const char *executor, const char *name, const char *secret_sha256, ac_err *e) {
    return write1(d,
                  "UPDATE jobs SET executor = ?, slurm_name = ?, exec_secret_sha256 = ?, exec_secret = NULL,"
                  " slurm_job_id = NULL, slurm_state = NULL, updated_at = ? WHERE id = ?",
                  ARGS(A_TEXT(executor), A_TEXT(name), A_TEXT(secret_sha256), A_REAL(now_s()), A_INT(id)),
                  "executor prepare", NULL, e);
}

/* After the migrations (005): a secret 003 kept in plain text (a job
 * submitted by an older daemon, still running) is replaced by its SHA-256;
 * secure_delete overwrites the freed plain text in the file. */
static int hash_legacy_secrets(db *d, ac_err *e) {
    sqlite3_stmt *st = NULL;
    int rc = 0, n = 0;
    if (sqlite3_prepare_v2(d->wr, "SELECT id, exec_secret FROM jobs WHERE exec_secret IS NOT NULL", -1, &st, NULL))
        return sqerr(d->wr, e, "legacy secrets");
    sqlite3_exec(d->wr, "PRAGMA secure_delete = ON; BEGIN IMMEDIATE", NULL, NULL, NULL);
    while (rc == 0 && sqlite3_step(st) == SQLITE_ROW) {
        char hash[JOBSECRET_HASH_LEN + 1];
        const char *sec = (const char *)sqlite3_column_text(st, 1);
        sqlite3_stmt *up = NULL;
        if (jobsecret_hash(sec ? sec : "", hash, e)) rc = -1;
        else if (sqlite3_prepare_v2(d->wr, "UPDATE jobs SET exec_secret_sha256 = ?, exec_secret = NULL WHERE id = ?", -1,
                                    &up, NULL) ||
                 sqlite3_bind_text(up, 1, hash, -1, SQLITE_TRANSIENT) ||
                 sqlite3_bind_int64(up, 2, sqlite3_column_int64(st, 0)) || sqlite3_step(up) != SQLITE_DONE)
            rc = sqerr(d->wr, e, "legacy secrets");
        sqlite3_finalize(up);
        n++;
    }
    sqlite3_finalize(st);
    if (sqlite3_exec(d->wr, rc ? "ROLLBACK" : "COMMIT", NULL, NULL, NULL) && !rc) rc = sqerr(d->wr, e, "legacy secrets");
    /* the old pages (in the file, and in the log) are overwritten now, not at the next checkpoint */
    if (rc == 0 && n > 0) sqlite3_exec(d->wr, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL);
    sqlite3_exec(d->wr, "PRAGMA secure_delete = OFF", NULL, NULL, NULL);
    return rc;
}

int db_exec_set_slurm(db *d, long id, long slurm_id, const char *state, ac_err *e) {
    return write1(d,
                  "UPDATE jobs SET slurm_job_id = CASE WHEN ?1 > 0 THEN ?1 ELSE slurm_job_id END,"
                  " slurm_state = COALESCE(?2, slurm_state), updated_at = ?3 WHERE id = ?4",
                  ARGS(A_INT(slurm_id), A_TEXT(state), A_REAL(now_s()), A_INT(id)), "executor slurm id", NULL, e);
}

long db_exec_event(db *d, long job, long seq, const char *kind, const char *data, ac_err *e) {
    long id = 0;
    double t = now_s();
    pthread_mutex_lock(&d->wmu);
    int rc = wbegin(d, 0, e);
    sqlite3_stmt *st = NULL;
    if (rc == 0 && prepare(d->wr, "SELECT exec_seq FROM jobs WHERE id = ?", ARGS(A_INT(job)), &st))
        rc = sqerr(d->wr, e, "event seq");
    if (rc == 0) {
        int sr = sqlite3_step(st);
        if (sr != SQLITE_ROW) rc = sr == SQLITE_DONE ? ac_errf(e, "job %ld: no such job", job) : sqerr(d->wr, e, "event seq");
        else if (sqlite3_column_int64(st, 0) >= seq) rc = 1; /* stored already */
    }
    if (st) sqlite3_finalize(st);
    if (rc == 0)
        rc = exec_w(d, "INSERT INTO events (job_id, kind, data, at) VALUES (?, ?, ?, ?)",
                    ARGS(A_INT(job), A_TEXT(kind), A_TEXT(data), A_REAL(t)), "insert event", &id, e);
    if (rc == 0)
        rc = exec_w(d, "UPDATE jobs SET exec_seq = ? WHERE id = ?", ARGS(A_INT(seq), A_INT(job)), "event seq", NULL, e);
    if ((rc >= 0 || sqlite3_get_autocommit(d->wr) == 0) && wend(d, rc == 0, 0, e) && rc == 0) rc = -1;
    if (rc != 1) wr_result(d, rc == 0, e->msg);
    pthread_mutex_unlock(&d->wmu);
    return rc == 1 ? 0 : rc < 0 ? -1 : id;
}

int db_recover(db *d, const char *policy, int max_attempts, void (*ended)(void *ud, long job), void *ud, ac_err *e) {
    db_job *running;
    int nrun;
    job_state st = JOB_RUNNING;
    if (db_job_list(d, &st, NULL, 0, 1000000, &running, &nrun, e)) return -1;
    int n = 0;
    for (int i = 0; i < nrun; i++) {
        const db_job *j = &running[i];
        char *ex = NULL; /* a Slurm job runs on without the daemon: the executor re-attaches it */
        if (read_text(d, "SELECT executor FROM jobs WHERE id = ?", ARGS(A_INT(j->id)), &ex, "recover", e)) {
            db_jobs_free(running, nrun);
            return -1;
        }
        int external = ex && strcmp(ex, "local");
        free(ex);
        if (external) continue;
        int cancel = j->cancel_requested;
        int requeue = !strcmp(policy, "requeue") && j->attempts < max_attempts && !cancel;
        job_state to = cancel ? JOB_CANCELLED : requeue ? JOB_QUEUED : JOB_FAILED;
        const char *why = cancel    ? "cancelled (daemon stopped while cancelling)"
                          : requeue ? "interrupted: the daemon stopped while the job ran; re-queued"
                                    : "interrupted: the daemon stopped while the job ran";
        if (db_job_transition(d, j->id, JOB_RUNNING, to, why, NULL, NULL, e) < 0) {
            db_jobs_free(running, nrun);
            return -1;
        }
        if (to != JOB_QUEUED && ended) ended(ud, j->id);
        n++;
    }
    db_jobs_free(running, nrun);
    return n;
}

typedef struct {
    job_state s;
    long n;
} state_count;

static int count_row(sqlite3_stmt *st, void *elem) {
    state_count *c = elem;
    c->n = (long)sqlite3_column_int64(st, 1);
    return job_state_parse((const char *)sqlite3_column_text(st, 0), &c->s);
}

int db_job_counts(db *d, long counts[JOB_NSTATES], ac_err *e) {
    state_count *c;
    int n;
    memset(counts, 0, sizeof(long) * JOB_NSTATES);
    if (read_rows(d, "SELECT state, COUNT(*) FROM jobs GROUP BY state", NULL, 0, count_row, sizeof *c, NULL,
                  (void **)&c, &n, "counts", e))
        return -1;
    for (int i = 0; i < n; i++) counts[c[i].s] = c[i].n;
    free(c);
    return 0;
}

/* ------------------------------------------------------------- events */

long db_event_insert(db *d, long job, const char *kind, const char *data, ac_err *e) {
    long id = -1;
    if (write1(d, "INSERT INTO events (job_id, kind, data, at) VALUES (?, ?, ?, ?)",
               ARGS(A_INT(job), A_TEXT(kind), A_TEXT(data), A_REAL(now_s())), "insert event", &id, e))
        return -1;
    return id;
}

static int event_row(sqlite3_stmt *st, void *elem) {
    db_event *ev = elem;
    int oom = 0;
    ev->id = (long)sqlite3_column_int64(st, 0);
    snprintf(ev->kind, sizeof ev->kind, "%s", (const char *)sqlite3_column_text(st, 1));
    ev->data = col_text(st, 2, &oom);
    ev->at = sqlite3_column_double(st, 3);
    return oom || !ev->data ? -1 : 0;
}

static void event_clear(void *elem) { free(((db_event *)elem)->data); }

void db_events_free(db_event *evs, int n) {
    for (int i = 0; i < n; i++) free(evs[i].data);
    free(evs);
}

int db_events(db *d, long job, long after, int limit, db_event **events, int *n, ac_err *e) {
    return read_rows(d, "SELECT id, kind, data, at FROM events WHERE job_id = ? AND id > ? ORDER BY id LIMIT ?",
                     ARGS(A_INT(job), A_INT(after), A_INT(limit)), event_row, sizeof **events, event_clear,
                     (void **)events, n, "events", e);
}

/* ------------------------------------------------------------- cost tables */

int db_cost_put(db *d, const char *key, const char *device, const char *dtype, const char *engine, int version,
                const char *source, const char *data, ac_err *e) {
    return write1(d,
                  "INSERT INTO cost_tables (key, device, dtype, engine, version, source, created_at, data)"
                  " VALUES (?,?,?,?,?,?,?,?) ON CONFLICT(key) DO UPDATE SET data = excluded.data,"
                  " source = excluded.source, created_at = excluded.created_at",
                  ARGS(A_TEXT(key), A_TEXT(device), A_TEXT(dtype), A_TEXT(engine), A_INT(version), A_TEXT(source),
                       A_REAL(now_s()), A_TEXT(data)),
                  "put cost table", NULL, e);
}

int db_cost_get(db *d, const char *key, char **data, ac_err *e) {
    return read_text(d, "SELECT data FROM cost_tables WHERE key = ?", ARGS(A_TEXT(key)), data, "get cost table", e);
}

static int cost_row(sqlite3_stmt *st, void *elem) {
    db_cost_row *r = elem;
    snprintf(r->key, sizeof r->key, "%s", (const char *)sqlite3_column_text(st, 0));
    snprintf(r->device, sizeof r->device, "%s", (const char *)sqlite3_column_text(st, 1));
    snprintf(r->dtype, sizeof r->dtype, "%s", (const char *)sqlite3_column_text(st, 2));
    snprintf(r->engine, sizeof r->engine, "%s", (const char *)sqlite3_column_text(st, 3));
    r->version = sqlite3_column_int(st, 4);
    snprintf(r->source, sizeof r->source, "%s", (const char *)sqlite3_column_text(st, 5));
    r->created_at = sqlite3_column_double(st, 6);
    r->hits = (long)sqlite3_column_int64(st, 7);
    return 0;
}

int db_cost_list(db *d, db_cost_row **rows, int *n, ac_err *e) {
    return read_rows(d,
                     "SELECT key, device, dtype, engine, version, source, created_at, hits FROM cost_tables"
                     " ORDER BY created_at",
                     NULL, 0, cost_row, sizeof **rows, NULL, (void **)rows, n, "list cost tables", e);
}

int db_cost_hit(db *d, const char *key, ac_err *e) {
    return write1(d, "UPDATE cost_tables SET hits = hits + 1 WHERE key = ?", ARGS(A_TEXT(key)), "cost hit", NULL, e);
}

int db_cost_source(db *d, const char *key, char *src, size_t n, ac_err *e) {
    char *s;
    src[0] = 0;
    if (read_text(d, "SELECT source FROM cost_tables WHERE key = ?", ARGS(A_TEXT(key)), &s, "cost source", e))
        return -1;
    if (s) snprintf(src, n, "%s", s);
    free(s);
    return 0;
}

/* ------------------------------------------------------------- users, tokens, audit (004) */

static int token_row(sqlite3_stmt *st, void *elem) {
    db_token *t = elem;
    t->id = (long)sqlite3_column_int64(st, 0);
    snprintf(t->user, sizeof t->user, "%s", (const char *)sqlite3_column_text(st, 1));
    snprintf(t->role, sizeof t->role, "%s", (const char *)sqlite3_column_text(st, 2));
    snprintf(t->prefix, sizeof t->prefix, "%s", (const char *)sqlite3_column_text(st, 3));
    t->created_at = sqlite3_column_double(st, 4);
    t->revoked_at = col_time(st, 5, &t->revoked);
    return 0;
}

#define TOKEN_COLS "id, user, role, prefix, created_at, revoked_at"

int db_token_add(db *d, const char *user, const char *role, const char *hash, const char *prefix, long *id,
                 ac_err *e) {
    return write1(d, "INSERT INTO api_tokens (user, role, hash, prefix, created_at) VALUES (?, ?, ?, ?, ?)",
                  ARGS(A_TEXT(user), A_TEXT(role), A_TEXT(hash), A_TEXT(prefix), A_REAL(now_s())), "add token", id,
                  e);
}

int db_token_find(db *d, const char *hash, db_token *t, ac_err *e) {
    db_token *rows;
    int n;
    if (read_rows(d, "SELECT " TOKEN_COLS " FROM api_tokens WHERE hash = ? AND revoked_at IS NULL",
                  ARGS(A_TEXT(hash)), token_row, sizeof *rows, NULL, (void **)&rows, &n, "find token", e))
        return -1;
    if (n) *t = rows[0];
    free(rows);
    return n > 0;
}

int db_token_list(db *d, db_token **rows, int *n, ac_err *e) {
    return read_rows(d, "SELECT " TOKEN_COLS " FROM api_tokens ORDER BY id", NULL, 0, token_row, sizeof **rows, NULL,
                     (void **)rows, n, "list tokens", e);
}

int db_token_revoke(db *d, long id, ac_err *e) {
    pthread_mutex_lock(&d->wmu);
    int rc = file_check(d, e) ? -1
                              : exec_w(d, "UPDATE api_tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
                                       ARGS(A_REAL(now_s()), A_INT(id)), "revoke token", NULL, e);
    int changed = rc == 0 ? sqlite3_changes(d->wr) : 0;
    wr_result(d, rc == 0, e->msg);
    pthread_mutex_unlock(&d->wmu);
    return rc ? -1 : changed ? 0 : 1;
}

int db_tokens_live(db *d, ac_err *e) {
    char *v;
    if (read_text(d, "SELECT EXISTS (SELECT 1 FROM api_tokens WHERE revoked_at IS NULL)", NULL, 0, &v, "count tokens",
                  e))
        return -1;
    int live = v && v[0] == '1';
    free(v);
    return live;
}

/* A text column into a fixed buffer ("" and *has 0 for NULL). */
static void col_copy(sqlite3_stmt *st, int i, char *out, size_t n, int *has) {
    const char *t = (const char *)sqlite3_column_text(st, i);
    *has = t != NULL;
    snprintf(out, n, "%s", t ? t : "");
}

static int audit_row(sqlite3_stmt *st, void *elem) {
    db_audit_row *r = elem;
    int has;
    r->id = (long)sqlite3_column_int64(st, 0);
    r->at = sqlite3_column_double(st, 1);
    col_copy(st, 2, r->user, sizeof r->user, &r->has_user);
    col_copy(st, 3, r->role, sizeof r->role, &r->has_role);
    col_copy(st, 4, r->action, sizeof r->action, &has);
    col_copy(st, 5, r->target, sizeof r->target, &r->has_target);
    r->status = sqlite3_column_int(st, 6);
    return 0;
}

int db_audit_list(db *d, const char *user, long after, int limit, db_audit_row **rows, int *n, ac_err *e) {
    return read_rows(d,
                     "SELECT id, at, user, role, action, target, status FROM audit_log WHERE id > ?"
                     " AND (?2 IS NULL OR user = ?2) ORDER BY id LIMIT ?3",
                     ARGS(A_INT(after), A_TEXT(user), A_INT(limit)), audit_row, sizeof **rows, NULL, (void **)rows, n,
                     "list the audit log", e);
}

int db_audit(db *d, const char *user, const char *role, const char *action, const char *target, int status,
             ac_err *e) {
    return write1(d, "INSERT INTO audit_log (at, user, role, action, target, status) VALUES (?, ?, ?, ?, ?, ?)",
                  ARGS(A_REAL(now_s()), A_TEXT(user), A_TEXT(role), A_TEXT(action), A_TEXT(target), A_INT(status)),
                  "audit", NULL, e);
}
