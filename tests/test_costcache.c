/*
 * test_costcache.c - the cost-table cache as the library sees it (an
 * ac_cost_cache handed in) and its SQLite implementation (daemon/costcache.c):
 * a table put through a file cache lands in a database whose schema the
 * migrations made; it comes back equal through a read-only file cache and
 * through the daemon's db; absent keys, files and caches find nothing; and
 * ac_cost_table_for takes the local CPU's table from the cache without
 * measuring; tables are keyed by node kind: a table of a host with the same
 * CPU model name but other instruction sets (or of a GPU under another
 * driver) is not this host's.
 */
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "costcache.h"
#include "cost/costmodel.h"
#include "db.h"
#include "cost/device.h"

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

/* A roofline table's JSON keeps every figure it prices with: the SM count
 * of the wave model, the FP16-accumulate rate, the FP8 input quantisation
 * (tables_equal compares JSON, which would not see one left out). */
static void test_roofline_json_keeps_its_rates(void) {
    const char *dev[] = {"RTX4090", "H100"}, *dt[] = {"bf16", "fp8"};
    for (int i = 0; i < 2; i++) {
        ac_err e;
        ac_cost_table t, u;
        CHECK(ac_cost_roofline(ac_device_spec_find(dev[i]), dt[i], &t, &e) == 0, "%s", e.msg);
        json_t *j = ac_cost_table_to_json(&t);
        CHECK(ac_cost_table_from_json(j, &u, &e) == 0, "%s: %s", dev[i], e.msg);
        CHECK(u.sms == t.sms && u.peak_acc16_tflops == t.peak_acc16_tflops && u.fp8_act == t.fp8_act,
              "%s %s: sms %d/%d, fp16-acc %g/%g, fp8 input %d/%d", dev[i], dt[i], u.sms, t.sms, u.peak_acc16_tflops,
              t.peak_acc16_tflops, u.fp8_act, t.fp8_act);
        CHECK(i || t.peak_acc16_tflops > t.peak_tflops, "the RTX 4090's FP16-accumulate rate");
        CHECK(!i || t.fp8_act, "the H100's FP8 GEMMs quantise their input");
        json_decref(j);
        ac_cost_table_free(&t);
        ac_cost_table_free(&u);
    }
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

/* A stand-in table (the L4 datasheet's, fp32; a measurement would never
 * produce it) under key, put into a writable file cache at path; cpu: the
 * local CPU as a target. */
static void put_stand_in(const char *key, ac_cost_table *t, ac_cost_cache *rw, ac_target *cpu) {
    ac_err e;
    CHECK(ac_cost_roofline(ac_device_spec_find("L4"), "fp32", t, &e) == 0, "%s", e.msg);
    snprintf(t->key, sizeof t->key, "%s", key);
    snprintf(t->device, sizeof t->device, "stand-in");
    costcache_file(rw, path, 1);
    CHECK(rw->put(rw->ud, t, &e) == 0, "%s", e.msg);
    CHECK(ac_target_resolve("cpu", cpu, &e) == 0, "%s", e.msg);
}

/* The local CPU's table comes from the cache (no measurement). */
static void test_cpu_table_from_cache(void) {
    fresh();
    ac_err e;
    ac_cost_table fake, got;
    char key[384];
    ac_cost_cpu_key(2, "fp32", key, sizeof key, NULL, 0);
    ac_cost_cache rw;
    ac_target cpu;
    put_stand_in(key, &fake, &rw, &cpu);
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

/* The kernel's flags for the first CPU in /proc/cpuinfo, and its model name
 * (the test's own reading, not the library's). */
static void cpuinfo(char *model, size_t mn, char *flags, size_t fn) {
    char line[8192];
    model[0] = flags[0] = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f) && !(model[0] && flags[0])) {
        char *c = strchr(line, ':');
        if (!c) continue;
        c[strcspn(c, "\n")] = 0;
        if (!strncmp(line, "model name", 10) && !model[0]) snprintf(model, mn, "%s", c + 2);
        if (!strncmp(line, "flags", 5) && !flags[0]) snprintf(flags, fn, " %s ", c + 2);
    }
    if (f) fclose(f);
}

static void test_keys_by_node_kind(void) {
    fresh();
    ac_err e;
    char model[256], flags[8192], key[384], want[512];
    cpuinfo(model, sizeof model, flags, sizeof flags);
    /* the key names the CPU model and exactly the listed instruction sets this CPU has */
    const char *isa[] = {"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"};
    char list[128] = "";
    for (int i = 0; i < 5; i++) {
        char w[40];
        snprintf(w, sizeof w, " %s ", isa[i]);
        if (strstr(flags, w)) snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", list[0] ? " " : "", isa[i]);
    }
    ac_cost_cpu_key(2, "fp32", key, sizeof key, NULL, 0);
    snprintf(want, sizeof want, "cpu: %s [%s] (2 threads)|fp32|", model, list[0] ? list : "none");
    CHECK(!strncmp(key, want, strlen(want)), "key %s, expected it to start %s", key, want);
    /* a host of another kind with the same CPU model name: a VM that hides its vector units */
    ac_cost_table other, got;
    char okey[384] = "", *open = strchr(key, '[');
    CHECK(open != NULL, "no node kind in %s", key);
    if (open) snprintf(okey, sizeof okey, "%.*s[none]%s", (int)(open - key), key, strchr(open, ']') + 1);
    CHECK(strcmp(okey, key) != 0 || !list[0], "same key %s", okey);
    ac_cost_cache rw;
    ac_target cpu;
    put_stand_in(okey, &other, &rw, &cpu);
    int hit = 1;
    if (list[0]) /* not this host's table: nothing cached for this kind, and no measuring asked */
        CHECK(ac_cost_table_for(&cpu, "fp32", &rw, 2, 0, NULL, NULL, &got, &hit, &e) != 0 && !hit &&
                  strstr(e.msg, "no measured"),
              "another node kind's table was used: %s", e.msg);
    /* the same table under this host's key is its own */
    snprintf(other.key, sizeof other.key, "%s", key);
    CHECK(rw.put(rw.ud, &other, &e) == 0, "%s", e.msg);
    CHECK(ac_cost_table_for(&cpu, "fp32", &rw, 2, 0, NULL, NULL, &got, &hit, &e) == 0 && hit, "%s", e.msg);
    if (hit) ac_cost_table_free(&got);
    ac_cost_table_free(&other);
    /* a GPU's key: the model, its compute capability and the driver's version */
    int drv = ac_cuda_driver_version();
    ac_cost_cuda_key("NVIDIA H100 80GB HBM3", 90, key, sizeof key);
    snprintf(want, sizeof want, "cuda:NVIDIA H100 80GB HBM3 [sm_90, driver %d]|bf16|cublas|v", drv);
    CHECK(!strncmp(key, want, strlen(want)), "key %s", key);
    cleanup();
}

int main(void) {
    RUN(test_roofline_json_keeps_its_rates);
    RUN(test_file_cache_round_trip);
    RUN(test_cpu_table_from_cache);
    RUN(test_keys_by_node_kind);
    return DONE();
}
