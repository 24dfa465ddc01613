/* costcache.c - see costcache.h. */
#include "costcache.h"

#include <sqlite3.h>
#include <stdlib.h>
#include <unistd.h>

static int from_text(const char *key, const char *data, ac_cost_table *t, int *found, ac_err *e) {
    json_t *j = json_loads(data, 0, NULL);
    int rc = j && ac_cost_table_from_json(j, t, e) == 0 ? 0 : ac_errf(e, "cached cost table %s is corrupt", key);
    json_decref(j);
    *found = rc == 0;
    return rc;
}

static int put_db(db *d, const ac_cost_table *t, ac_err *e) {
    json_t *j = ac_cost_table_to_json(t);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) return ac_errf(e, "out of memory");
    int rc = db_cost_put(d, t->key, t->device, t->dtype, t->engine, t->version, t->source, s, e);
    free(s);
    return rc;
}

static int db_get(void *ud, const char *key, ac_cost_table *t, int *found, ac_err *e) {
    char *data;
    *found = 0;
    if (db_cost_get(ud, key, &data, e)) return -1;
    int rc = data ? from_text(key, data, t, found, e) : 0;
    free(data);
    return rc;
}

static int db_put(void *ud, const ac_cost_table *t, ac_err *e) { return put_db(ud, t, e); }

void costcache_db(ac_cost_cache *c, db *d) { *c = (ac_cost_cache){.get = db_get, .put = db_put, .ud = d}; }

static int file_get(void *ud, const char *key, ac_cost_table *t, int *found, ac_err *e) {
    const char *path = ud;
    *found = 0;
    if (!path || access(path, R_OK) != 0) return 0;
    sqlite3 *c;
    if (sqlite3_open_v2(path, &c, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        sqlite3_close(c);
        return 0;
    }
    sqlite3_busy_timeout(c, 5000);
    sqlite3_stmt *st;
    int rc = 0;
    if (sqlite3_prepare_v2(c, "SELECT data FROM cost_tables WHERE key = ?", -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_text(st, 1, key, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(st) == SQLITE_ROW) rc = from_text(key, (const char *)sqlite3_column_text(st, 0), t, found, e);
        sqlite3_finalize(st);
    }
    sqlite3_close(c);
    return rc;
}

static int file_put(void *ud, const ac_cost_table *t, ac_err *e) {
    db *d;
    if (db_open(ud, &d, e)) return -1;
    int rc = put_db(d, t, e);
    db_close(d);
    return rc;
}

void costcache_file(ac_cost_cache *c, const char *path, int writable) {
    *c = (ac_cost_cache){.get = file_get, .put = writable && path ? file_put : NULL, .ud = (void *)path};
}

static int json_get(void *ud, const char *key, ac_cost_table *t, int *found, ac_err *e) {
    const json_t *j = json_object_get(ud, key);
    *found = 0;
    if (!j) return 0;
    int rc = ac_cost_table_from_json(j, t, e) == 0 ? 0 : ac_errf(e, "cost table %s is corrupt", key);
    *found = rc == 0;
    return rc;
}

void costcache_json(ac_cost_cache *c, const json_t *tables) {
    *c = (ac_cost_cache){.get = json_get, .put = NULL, .ud = (void *)tables};
}
