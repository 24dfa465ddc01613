/*
 * views.h - the JSON the API sends for the store's rows (db.h types): one
 * place that names a job's, an event's, an audit entry's and a cost table's fields. The HTTP
 * routes and nothing else turn rows into JSON; NULL out of memory.
 */
#ifndef AC_VIEWS_H
#define AC_VIEWS_H

#include <jansson.h>

#include "db.h"

/* A job: its row; with spec and transitions when the job came from db_job_get. */
json_t *view_job(const db_job *j);
/* {"jobs": [...], "next_after": id of the last when the page is full, else null} */
json_t *view_job_page(const db_job *jobs, int n, int limit);
/* {"entries": [{id, at, user, role, action, target, status}], "next_after":
 * id of the last when the page is full, else null} (NULL columns as null) */
json_t *view_audit_page(const db_audit_row *rows, int n, int limit);
/* {"events": [{id, kind, data, at}]} */
json_t *view_events(const db_event *evs, int n);
/* {"tables": [{key, device, dtype, engine, version, source, created_at, hits}]} */
json_t *view_cost_tables(const db_cost_row *rows, int n);

#endif
