/* views.c - see views.h. */
#include "views.h"

static json_t *str_or_null(const char *s) { return s ? json_string(s) : json_null(); }

static json_t *time_or_null(int has, double t) { return has ? json_real(t) : json_null(); }

static json_t *view_transitions(const db_job *j) {
    json_t *a = json_array();
    for (int i = 0; a && i < j->ntransitions; i++) {
        const db_transition *t = &j->transitions[i];
        json_t *o =
            json_pack("{s:o,s:s,s:f,s:o}", "from", t->has_from ? json_string(job_state_name(t->from)) : json_null(),
                      "to", job_state_name(t->to), "at", t->at, "reason", str_or_null(t->reason));
        if (!o || json_array_append_new(a, o)) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

json_t *view_job(const db_job *j) {
    json_t *o = json_pack("{s:I,s:o,s:s,s:i,s:o,s:o,s:I,s:b,s:f,s:f,s:o,s:o}", "id", (json_int_t)j->id, "name",
                          str_or_null(j->name), "state", job_state_name(j->state), "priority", j->priority, "device",
                          str_or_null(j->device), "reason", str_or_null(j->reason), "attempts", (json_int_t)j->attempts,
                          "cancel_requested", j->cancel_requested, "created_at", j->created_at, "updated_at",
                          j->updated_at, "started_at", time_or_null(j->has_started, j->started_at), "finished_at",
                          time_or_null(j->has_finished, j->finished_at));
    if (o && json_object_set_new(o, "owner", str_or_null(j->owner))) {
        json_decref(o);
        return NULL;
    }
    if (!o || !j->spec) return o;
    json_t *spec = json_loads(j->spec, 0, NULL), *tr = view_transitions(j);
    if (!tr || json_object_set_new(o, "spec", spec ? spec : json_null()) ||
        json_object_set_new(o, "has_result", json_boolean(j->has_result)) ||
        json_object_set_new(o, "transitions", tr)) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* {key: a, "next_after": last when the page is full, else null}; consumes a (NULL: out of memory). */
static json_t *page(const char *key, json_t *a, int n, int limit, long last) {
    if (!a) return NULL;
    return json_pack("{s:o,s:o}", key, a, "next_after", n == limit && n > 0 ? json_integer(last) : json_null());
}

json_t *view_job_page(const db_job *jobs, int n, int limit) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) {
        json_t *o = view_job(&jobs[i]);
        if (!o || json_array_append_new(a, o)) {
            json_decref(a);
            a = NULL;
        }
    }
    return page("jobs", a, n, limit, n > 0 ? jobs[n - 1].id : 0);
}

json_t *view_audit_page(const db_audit_row *rows, int n, int limit) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) {
        const db_audit_row *r = &rows[i];
        json_t *o = json_pack("{s:I,s:f,s:o,s:o,s:s,s:o,s:i}", "id", (json_int_t)r->id, "at", r->at, "user",
                              str_or_null(r->has_user ? r->user : NULL), "role",
                              str_or_null(r->has_role ? r->role : NULL), "action", r->action, "target",
                              str_or_null(r->has_target ? r->target : NULL), "status", r->status);
        if (!o || json_array_append_new(a, o)) {
            json_decref(a);
            a = NULL;
        }
    }
    return page("entries", a, n, limit, n > 0 ? rows[n - 1].id : 0);
}

json_t *view_events(const db_event *evs, int n) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) {
        json_t *data = json_loads(evs[i].data, JSON_DECODE_ANY, NULL);
        json_t *o = json_pack("{s:I,s:s,s:o,s:f}", "id", (json_int_t)evs[i].id, "kind", evs[i].kind, "data",
                              data ? data : json_null(), "at", evs[i].at);
        if (!o || json_array_append_new(a, o)) {
            json_decref(a);
            a = NULL;
        }
    }
    return a ? json_pack("{s:o}", "events", a) : NULL;
}

json_t *view_cost_tables(const db_cost_row *rows, int n) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) {
        const db_cost_row *r = &rows[i];
        json_t *o = json_pack("{s:s,s:s,s:s,s:s,s:i,s:s,s:f,s:I}", "key", r->key, "device", r->device, "dtype",
                              r->dtype, "engine", r->engine, "version", r->version, "source", r->source, "created_at",
                              r->created_at, "hits", (json_int_t)r->hits);
        if (!o || json_array_append_new(a, o)) {
            json_decref(a);
            a = NULL;
        }
    }
    return a ? json_pack("{s:o}", "tables", a) : NULL;
}
