/*
 * db.h - the daemon's SQLite store: migrations, the job state machine,
 * progress events, the cost-table cache. Reads return typed rows (db_job,
 * job_state, db_event, ...); the JSON the API sends is built from them in
 * one place (http.c).
 *
 * One writer connection (behind a mutex) and one reader connection (WAL
 * lets reads run beside the writer), busy timeout set, every state change in
 * a transaction that also records the transition with its timestamp.
 * Functions return 0 / -1 with ac_err, or as documented.
 *
 * Every statement's result is checked, BEGIN and COMMIT included. A failed
 * write (a full disk, an I/O error) returns -1 and marks the store
 * degraded until the next write succeeds; db_health reports it (for
 * /healthz). db_health and every write check that the open database is
 * still the file at its path (device, inode, link count) and writable. A
 * database file deleted while open is written back to its path from the
 * open copy (SQLite's online backup, then the connections reopened on it),
 * so the jobs accepted before the deletion survive a restart; until that
 * succeeds (the directory cannot take a file) writes are refused (-1, a
 * failed write: 503) and it is tried again at each write and health check.
 * A file replaced or made read-only (immutable) while open is refused the
 * same way rather than taking writes a restart would lose. Job inserts and state transitions commit with
 * synchronous=FULL (the WAL is fsynced at each of those commits); progress
 * events and cache hits with NORMAL.
 */
#ifndef AC_DB_H
#define AC_DB_H

#include <jansson.h>

#include "autocompress.h"

typedef struct {
    int version;
    const char *name;
    const char *sql;
} db_migration;
extern const db_migration db_migrations[];

typedef struct db db;

int db_open(const char *path, db **out, ac_err *e);
void db_close(db *d);
int db_schema_version(db *d);

/* A job's state; one name table (job_state_name / job_state_parse) maps
 * them to and from the strings of the API and the database. */
typedef enum { JOB_QUEUED, JOB_RUNNING, JOB_SUCCEEDED, JOB_FAILED, JOB_CANCELLED, JOB_NSTATES } job_state;
/* db_job_transition's `from` when any state that has not ended will do. */
#define JOB_ANY_LIVE ((job_state)-1)

const char *job_state_name(job_state s);
/* 0 and *out, or -1 when name is not a state. */
int job_state_parse(const char *name, job_state *out);
int job_state_terminal(job_state s);

typedef struct {
    int has_from;
    job_state from, to;
    double at;
    char *reason; /* NULL when none */
} db_transition;

/* One row of jobs. Strings are owned (db_job_clear); NULL when the column
 * is NULL. Times are seconds since the epoch; 0 with has_* unset for NULL. */
typedef struct {
    long id;
    char *name, *device, *reason;
    job_state state;
    int priority, cancel_requested, has_result, has_started, has_finished;
    long attempts;
    double created_at, updated_at, started_at, finished_at;
    char *owner;                /* the user who submitted it (migration 004); NULL: none recorded */
    char *spec;                 /* db_job_get only: the spec JSON text */
    db_transition *transitions; /* db_job_get only */
    int ntransitions;
} db_job;
void db_job_clear(db_job *j);
void db_jobs_free(db_job *jobs, int n);

/* A queued job in scheduling order: its id, its reason, the spec's target.device. */
typedef struct {
    long id;
    char reason[256];
    char device[128];
} db_queued;

typedef struct {
    long id;
    char kind[64];
    char *data; /* JSON text (owned) */
    double at;
} db_event;
void db_events_free(db_event *evs, int n);

typedef struct {
    char key[512], device[256], dtype[32], engine[64], source[32];
    int version;
    long hits;
    double created_at;
} db_cost_row;

/* Jobs. */
/* idem_key (may be NULL): when a job with that Idempotency-Key exists, no
 * job is inserted; its id is returned and *existing_spec (caller frees) is
 * set to its spec so the caller can tell a retry from a conflict. */
long db_job_insert(db *d, const char *spec_json, const char *name, int priority, const char *owner,
                   const char *idem_key, char **existing_spec, ac_err *e);
/* *found = 0 when the id is unknown; else *job filled (db_job_clear). */
int db_job_get(db *d, long id, db_job *job, int *found, ac_err *e);
/* The spec JSON text of a job (caller frees), NULL when unknown. */
int db_job_spec(db *d, long id, char **spec, ac_err *e);
/* *result = the result JSON text (caller frees), NULL when none. */
int db_job_result(db *d, long id, char **result, ac_err *e);
/* Jobs with id > after (in state *state when state is not NULL, of that
 * owner when owner is not NULL), at most limit. */
int db_job_list(db *d, const job_state *state, const char *owner, long after, int limit, db_job **jobs, int *n,
                ac_err *e);
/* The owner of job id into owner ("" when none is recorded); *found 0 when the id is unknown. */
int db_job_owner(db *d, long id, char *owner, size_t n, int *found, ac_err *e);
/* Move a job to state `to` if it is in `from` (JOB_ANY_LIVE = any non-terminal).
 * Returns 1 when the job was not in that state (nothing changed). Optional
 * fields (NULL = unchanged): reason, device, result JSON. */
int db_job_transition(db *d, long id, job_state from, job_state to, const char *reason, const char *device,
                      const char *result, ac_err *e);
/* Queued jobs in scheduling order (priority desc, then age). */
int db_queue(db *d, db_queued **queue, int *n, ac_err *e);
int db_job_set_reason(db *d, long id, const char *reason, ac_err *e);
int db_job_set_pid(db *d, long id, long pid, ac_err *e);
int db_job_set_cancel(db *d, long id, ac_err *e);
/* Recovery after a crash: running jobs -> queued (policy "requeue", until
 * max_attempts) or failed ("fail"), cancelled when a cancel was asked;
 * ended (may be NULL) is called with each job that failed or was cancelled
 * (the caller removes what it kept for a run again). Returns the number
 * recovered. */
int db_recover(db *d, const char *policy, int max_attempts, void (*ended)(void *ud, long job), void *ud, ac_err *e);
int db_job_counts(db *d, long counts[JOB_NSTATES], ac_err *e);

/* Executor columns (migration 003): how a job that an executor other than
 * the local one runs is tracked. A job with an executor other than "local"
 * is left running by db_recover: its executor re-attaches it. */
typedef struct {
    long id, slurm_job_id; /* slurm_job_id 0: not known (yet) */
    char name[64];         /* the batch job's name */
    char slurm_state[32];  /* the last state Slurm reported, "" when none */
    char secret_sha256[80]; /* the SHA-256 (hex) of the per-job secret the worker posts events with, "" when none */
    long seq;              /* the last worker event stored */
    int cancel_requested;
    job_state state;
} db_exec_job;
/* Running jobs of that executor, by id (caller frees *jobs). */
int db_exec_live(db *d, const char *executor, db_exec_job **jobs, int *n, ac_err *e);
/* One job's executor columns; executor gets "" when none was recorded (a local job, or one not
 * placed yet). *found 0 when unknown. */
int db_exec_get(db *d, long id, db_exec_job *job, char *executor, size_t n, int *found, ac_err *e);
/* Before submission: the executor, the batch job's name and the SHA-256 of
 * the job's new secret (jobsecret.h; the secret itself is never stored). */
int db_exec_prepare(db *d, long id, const char *executor, const char *name, const char *secret_sha256, ac_err *e);
/* The Slurm job id (when > 0) and the state Slurm reports (when not NULL). */
int db_exec_set_slurm(db *d, long id, long slurm_id, const char *state, ac_err *e);
/* A worker event with its sequence number, stored with the job's exec_seq
 * in one transaction: its event id, 0 when an event with that seq was
 * stored already, -1 on error. */
long db_exec_event(db *d, long job, long seq, const char *kind, const char *data, ac_err *e);

/* Events. Returns the new event id (> 0) or -1. */
long db_event_insert(db *d, long job, const char *kind, const char *data_json, ac_err *e);
/* Events of a job with id > after, at most limit (db_events_free). */
int db_events(db *d, long job, long after, int limit, db_event **events, int *n, ac_err *e);

/* Cost tables. */
int db_cost_put(db *d, const char *key, const char *device, const char *dtype, const char *engine, int version,
                const char *source, const char *data, ac_err *e);
/* *data (caller frees) or NULL when absent. */
int db_cost_get(db *d, const char *key, char **data, ac_err *e);
int db_cost_hit(db *d, const char *key, ac_err *e);
/* Every cached table's row, oldest first (caller frees *rows). */
int db_cost_list(db *d, db_cost_row **rows, int *n, ac_err *e);
/* The source of the cached table under key ("measured", "imported", ...)
 * into src (n bytes), "" when absent. */
int db_cost_source(db *d, const char *key, char *src, size_t n, ac_err *e);

/* API tokens (migration 004): stored as the SHA-256 of the token (hex),
 * with its first characters (prefix) to tell them apart; role is read,
 * submit or admin. */
typedef struct {
    long id;
    char user[64], role[16], prefix[16];
    double created_at, revoked_at;
    int revoked;
} db_token;
int db_token_add(db *d, const char *user, const char *role, const char *hash, const char *prefix, long *id,
                 ac_err *e);
/* The live (not revoked) token with that hash: 1 and *t, 0 none, -1 error. */
int db_token_find(db *d, const char *hash, db_token *t, ac_err *e);
/* Every token, revoked ones too, by id (caller frees *rows). */
int db_token_list(db *d, db_token **rows, int *n, ac_err *e);
/* Revoke token id: 0, 1 when no live token has that id, -1 error. */
int db_token_revoke(db *d, long id, ac_err *e);
/* 1 when some token is live, 0 when none, -1 error. */
int db_tokens_live(db *d, ac_err *e);
/* One line of the audit log: who (user and role, NULL without tokens),
 * what (action, e.g. "POST /v1/jobs"), on what (target, may be NULL), and
 * the HTTP status (0 for a command). */
int db_audit(db *d, const char *user, const char *role, const char *action, const char *target, int status,
             ac_err *e);
/* One audit row as read back; a NULL column is "" with its has_ flag 0. */
typedef struct {
    long id;
    double at;
    char user[64], role[16], action[300], target[160];
    int has_user, has_role, has_target, status;
} db_audit_row;
/* Audit rows with id > after, oldest first, of that user when user is not
 * NULL, at most limit (caller frees *rows). */
int db_audit_list(db *d, const char *user, long after, int limit, db_audit_row **rows, int *n, ac_err *e);

/* 1 when the last write failed (message in msg), else 0. */
int db_health(db *d, char *msg, size_t n, long *write_failures);

#endif
