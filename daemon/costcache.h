/*
 * costcache.h - the SQLite implementation of the library's cost-table
 * cache (ac_cost_cache, costmodel.h), over the daemon's schema (the
 * migrations are the only definition of the cost_tables table).
 */
#ifndef AC_COSTCACHE_H
#define AC_COSTCACHE_H

#include "autocompress.h"
#include "db.h"

/* Over the daemon's open database (reads through its reader connection). */
void costcache_db(ac_cost_cache *c, db *d);

/* Over a database file, for the worker and the CLI. get opens it read-only
 * (a missing or unreadable file holds nothing); with writable, put opens it
 * through db_open (creating it and applying the migrations) and stores. */
void costcache_file(ac_cost_cache *c, const char *path, int writable);

/* Over tables in memory, {key: table JSON} (not consumed; it must outlive
 * the cache): the worker's, handed over by the daemon on stdin. Read-only. */
void costcache_json(ac_cost_cache *c, const json_t *tables);

#endif
