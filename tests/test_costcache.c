/*
 * test_costcache.c - the cost-table cache as the library sees it (an
 * ac_cost_cache handed in) and its SQLite implementation (daemon/costcache.c):
 * a table put through a file cache lands in a database whose schema the
 * migrations made; it comes back equal through a read-only file cache and
 * through the daemon's db; absent keys, files and caches find nothing; and
 * ac_cost_table_for takes the local CPU's table from the cache without
 * measuring.
 */
#include <math.h>
#include <unistd.h>

#include "check.h"
#include "costcache.h"
#include "costmodel.h"
#include "db.h"

static char dir[512], path[600];

static void fresh(void) {
    snprintf(dir, sizeof dir, "/tmp/ac_costcache_XXXXXX");
    if (!mkdtemp(dir)) dir[0] = 0;
    snprintf(path, sizeof path, "%s/cache.db", dir);
}

static void cleanup(void) {
    const char *suffix[] = {"", "-wal", "-shm"};
    for (int i = 0; i < 3; i++) {
        char f[700];
        snprintf(f, sizeof f, "%s%s", path, suffix[i]);
        unlink(f);
    }
    rmdir(dir);
}

static int tables_equal(const ac_cost_table *a, const ac_cost_table *b) {
    json_t *x = ac_cost_table_to_json(a), *y = ac_cost_table_to_json(b);
    int eq = json_equal(x, y);
    json_decref(x);
    json_decref(y);
    return eq;
}

static void test_file_cache_round_trip(void) {
    fresh();
    ac_err e;
    ac_cost_table t, got;
    CHECK(ac_cost_roofline(ac_device_spec_find("A100"), "bf16", &t, &e) == 0, "%s", e.msg);
    ac_cost_cache ro, rw;
    costcache_file(&ro, path, 0);
    costcache_file(&rw, path, 1);
    CHECK(ro.put == NULL && rw.put != NULL, "read-only cache has no put");
    int found = 1;
    CHECK(ac_cost_cache_lookup(&ro, t.key, &got, &found, &e) == 0 && !found, "missing file holds nothing");
    CHECK(rw.put(rw.ud, &t, &e) == 0, "%s", e.msg);
    /* the schema is the migrations' */
    db *d;
    CHECK(db_open(path, &d, &e) == 0, "%s", e.msg);
    int last = 0;
    for (const db_migration *m = db_migrations; m->sql; m++) last = m->version;
    CHECK(d && db_schema_version(d) == last, "schema version %d, migrations up to %d", d ? db_schema_version(d) : -1,
          last);
    found = 0;
    CHECK(ac_cost_cache_lookup(&ro, t.key, &got, &found, &e) == 0 && found, "read back: %s", e.msg);
    if (found) {
        CHECK(tables_equal(&t, &got), "file round trip");
        ac_cost_table_free(&got);
    }
    ac_cost_cache dc;
    costcache_db(&dc, d);
    found = 0;
    CHECK(d && ac_cost_cache_lookup(&dc, t.key, &got, &found, &e) == 0 && found, "through the daemon's db: %s", e.msg);
    if (found) {
        CHECK(tables_equal(&t, &got), "db round trip");
        ac_cost_table_free(&got);
    }
    found = 1;
    CHECK(ac_cost_cache_lookup(&dc, "no such key", &got, &found, &e) == 0 && !found, "absent key");
    CHECK(ac_cost_cache_lookup(NULL, t.key, &got, &found, &e) == 0 && !found, "no cache");
    db_close(d);
    ac_cost_table_free(&t);
    cleanup();
}

/* The local CPU's table comes from the cache (no measurement: a stand-in
 * table under the CPU's key, which a measurement would never produce). */
static void test_cpu_table_from_cache(void) {
    fresh();
    ac_err e;
    ac_cost_table fake, got;
    CHECK(ac_cost_roofline(ac_device_spec_find("L4"), "fp32", &fake, &e) == 0, "%s", e.msg);
    ac_cost_cpu_key(2, "fp32", fake.key, sizeof fake.key, NULL, 0);
    snprintf(fake.device, sizeof fake.device, "stand-in");
    ac_cost_cache rw;
    costcache_file(&rw, path, 1);
    CHECK(rw.put(rw.ud, &fake, &e) == 0, "%s", e.msg);
    ac_target cpu;
    CHECK(ac_target_resolve("cpu", &cpu, &e) == 0, "%s", e.msg);
    int hit = 0;
    double t0 = ac_now();
    CHECK(ac_cost_table_for(&cpu, "fp32", &rw, 2, 0, NULL, NULL, &got, &hit, &e) == 0 && hit, "cache hit: %s", e.msg);
    CHECK(ac_now() - t0 < 5, "took %.1f s: measured?", ac_now() - t0);
    if (hit) {
        CHECK(!strcmp(got.device, "stand-in") && tables_equal(&fake, &got), "the cached table");
        ac_cost_table_free(&got);
    }
    ac_cost_cache none = {0};
    CHECK(ac_cost_table_for(&cpu, "fp32", &none, 2, 0, NULL, NULL, &got, &hit, &e) != 0 && strstr(e.msg, "no measured"),
          "without a cache and without measuring: %s", e.msg);
    ac_cost_table_free(&fake);
    cleanup();
}

int main(void) {
    RUN(test_file_cache_round_trip);
    RUN(test_cpu_table_from_cache);
    return DONE();
}
