/*
 * db.h - the daemon's SQLite store: migrations, the job state machine,
 * progress events, the cost-table cache.
 *
 * One writer connection (behind a mutex) and one reader connection (WAL
 * lets reads run beside the writer), busy timeout set, every state change in
 * a transaction that also records the transition with its timestamp.
 * Functions return 0 / -1 with ac_err, or as documented.
 *
 * Every statement's result is checked, BEGIN and COMMIT included. A failed
 * write (a full disk, an I/O error) returns -1 and marks the store
 * degraded until the next write succeeds; db_health reports it (for
 * /healthz). Job inserts and state transitions commit with
 * synchronous=FULL (the WAL is fsynced at each of those commits); progress
 * events and cache hits with NORMAL.
 */
#ifndef AC_DB_H
#define AC_DB_H

#include <jansson.h>

#include "err.h"

typedef struct { int version; const char *name; const char *sql; } db_migration;
extern const db_migration db_migrations[];

typedef struct db db;

int db_open(const char *path, db **out, ac_err *e);
void db_close(db *d);
int db_schema_version(db *d);

/* Jobs. */
/* idem_key (may be NULL): when a job with that Idempotency-Key exists, no
 * job is inserted; its id is returned and *existing_spec (caller frees) is
 * set to its spec so the caller can tell a retry from a conflict. */
long db_job_insert(db *d, const char *spec_json, const char *name, int priority, const char *idem_key, char **existing_spec,
                   ac_err *e);
/* *job = full job object (NULL when the id is unknown). */
int db_job_get(db *d, long id, json_t **job, ac_err *e);
/* *result = the result JSON text (caller frees), NULL when none. */
int db_job_result(db *d, long id, char **result, ac_err *e);
int db_job_list(db *d, const char *state, long after, int limit, json_t **jobs, ac_err *e);
/* Move a job to state `to` if it is in `from` (NULL = any non-terminal).
 * Returns 1 when the job was not in that state (nothing changed). Optional
 * fields (NULL = unchanged): reason, device, result JSON. */
int db_job_transition(db *d, long id, const char *from, const char *to, const char *reason, const char *device,
                      const char *result, ac_err *e);
/* Queued jobs in scheduling order (priority desc, then age):
 * [{id, reason, device: the spec's target.device}]. */
int db_queue(db *d, json_t **queue, ac_err *e);
int db_job_set(db *d, long id, const char *column, const char *text, long num, ac_err *e);
/* Recovery after a crash: running jobs -> queued (policy "requeue", until
 * max_attempts) or failed ("fail"). Returns the number recovered. */
int db_recover(db *d, const char *policy, int max_attempts, ac_err *e);
int db_job_counts(db *d, json_t **counts, ac_err *e);

/* Events. Returns the new event id (> 0) or -1. */
long db_event_insert(db *d, long job, const char *kind, const char *data_json, ac_err *e);
/* Events of a job with id > after, at most limit: [{id,kind,data,at}]. */
int db_events(db *d, long job, long after, int limit, json_t **events, ac_err *e);

/* Cost tables. */
int db_cost_put(db *d, const char *key, const char *device, const char *dtype, const char *engine, int version,
                const char *source, const char *data, ac_err *e);
/* *data (caller frees) or NULL when absent. */
int db_cost_get(db *d, const char *key, char **data, ac_err *e);
int db_cost_hit(db *d, const char *key, ac_err *e);
int db_cost_list(db *d, json_t **list, ac_err *e);
/* The source of the cached table under key ("measured", "imported", ...)
 * into src (n bytes), "" when absent. */
int db_cost_source(db *d, const char *key, char *src, size_t n, ac_err *e);

/* 1 when the last write failed (message in msg), else 0. */
int db_health(db *d, char *msg, size_t n, long *write_failures);

#endif
