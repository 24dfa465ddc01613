/* test_fsafe_write.c - confined writes (fsafe_write.h): symbolic links
 * planted at a file's name, in its directory's path, or swapped in for a
 * parent between two writes make the write fail with a message naming the
 * link, and nothing outside the root is created or changed; the same with
 * openat2 and with the per-component fallback (AC_FSAFE_NO_OPENAT2). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "core/fsafe.h"
#include "core/fsafe_write.h"
#include "format/safetensors.h"

static char root[256], outside[256];

static void put(const char *path, const char *s) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(s, f);
        fclose(f);
    }
}

static int has(const char *path, const char *s) {
    char buf[256] = {0};
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    return n == strlen(s) && !memcmp(buf, s, n);
}

/* entries in dir other than . and .. (their count) */
static int entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
    closedir(d);
    return n;
}

static void path(char *out, const char *a, const char *b) {
    if (snprintf(out, 512, "%s/%s", a, b) >= 512) abort();
}

static void setup(void) {
    snprintf(root, sizeof root, "/tmp/ac_fsw_root_XXXXXX");
    snprintf(outside, sizeof outside, "/tmp/ac_fsw_out_XXXXXX");
    if (!mkdtemp(root) || !mkdtemp(outside)) exit(1);
    const char *r[1] = {root};
    ac_err e;
    if (ac_fsafe_set_roots(r, 1, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        exit(1);
    }
}

static void teardown(void) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", root, outside);
    if (system(cmd)) fprintf(stderr, "cleanup failed\n");
}

static void test_writes_and_dirs(void) {
    setup();
    char d[512], f[512];
    ac_err e = {{0}};
    path(d, root, "a/b/out");
    CHECK(ac_fsafe_mkdirs(d, &e) == 0, "%s", e.msg);
    CHECK(ac_fsafe_mkdirs(d, &e) == 0, "again: %s", e.msg);
    path(f, d, "x.txt");
    CHECK(ac_fsafe_write(f, "hello", 5, &e) == 0, "%s", e.msg);
    CHECK(has(f, "hello"), "content");
    CHECK(ac_fsafe_write(f, "again", 5, &e) == 0 && has(f, "again"), "replace a regular file: %s", e.msg);
    CHECK(entries(d) == 1, "a temporary left behind: %d entries", entries(d));
    float a[3] = {1, 2, 3};
    st_wtensor t = {"w", ST_F32, 1, {3, 0}, a};
    path(f, d, "model.safetensors");
    CHECK(st_write(f, &t, 1, &e) == 0, "%s", e.msg);
    st_file sf;
    CHECK(st_open(f, &sf, &e) == 0 && sf.n == 1, "%s", e.msg);
    if (sf.n == 1) st_close(&sf);
    path(f, outside, "x");
    CHECK(ac_fsafe_write(f, "x", 1, &e) != 0 && strstr(e.msg, "outside the allowed model_roots"), "%s", e.msg);
    CHECK(ac_fsafe_mkdirs(f, &e) != 0 && entries(outside) == 0, "mkdirs outside: %s", e.msg);
    teardown();
}

/* A symlink at the file's own name (report.json in an existing output
 * directory) is neither followed nor replaced. */
static void test_link_at_name(void) {
    setup();
    char d[512], f[512], victim[512], fresh[512];
    ac_err e = {{0}};
    path(d, root, "out");
    CHECK(ac_fsafe_mkdirs(d, &e) == 0, "%s", e.msg);
    path(victim, outside, "victim");
    put(victim, "orig");
    path(f, d, "report.json");
    CHECK(symlink(victim, f) == 0, "symlink");
    json_t *j = json_pack("{s:i}", "a", 1);
    CHECK(ac_fsafe_write_json(f, j, 0, &e) != 0, "a report written through a symlink");
    CHECK(strstr(e.msg, "report.json") && strstr(e.msg, "symbolic link"), "message: %s", e.msg);
    CHECK(has(victim, "orig"), "the file outside changed");
    struct stat sb;
    CHECK(lstat(f, &sb) == 0 && S_ISLNK(sb.st_mode), "the link itself was replaced");
    CHECK(entries(d) == 1, "a temporary left behind: %d entries", entries(d));
    /* a dangling link: nothing created at its target */
    path(fresh, outside, "fresh");
    path(f, d, "model.gguf");
    CHECK(symlink(fresh, f) == 0, "symlink");
    CHECK(ac_fsafe_write(f, "x", 1, &e) != 0 && access(fresh, F_OK) != 0, "dangling link followed: %s", e.msg);
    json_decref(j);
    teardown();
}

/* A directory on the way swapped for a symlink after the directories were
 * made (mid-job), or the output directory itself a symlink. */
static void test_parent_swapped(void) {
    setup();
    char d[512], f[512], p[512], old[512], sub[512];
    ac_err e = {{0}};
    path(d, root, "p/q/out");
    CHECK(ac_fsafe_mkdirs(d, &e) == 0, "%s", e.msg);
    path(p, root, "p");
    path(old, root, "p.old");
    path(sub, outside, "q/out");
    CHECK(rename(p, old) == 0 && symlink(outside, p) == 0, "swap");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", sub);
    CHECK(system(cmd) == 0, "mkdir");
    path(f, d, "model.safetensors");
    float a[2] = {1, 2};
    st_wtensor t = {"w", ST_F32, 1, {2, 0}, a};
    CHECK(st_write(f, &t, 1, &e) != 0, "written through a swapped parent");
    CHECK(strstr(e.msg, p) && strstr(e.msg, "symbolic link"), "message does not name %s: %s", p, e.msg);
    CHECK(entries(sub) == 0, "something written outside: %d entries", entries(sub));
    CHECK(ac_fsafe_mkdirs(d, &e) != 0 && strstr(e.msg, "symbolic link"), "mkdirs through the link: %s", e.msg);
    path(f, d, "new/deeper");
    CHECK(ac_fsafe_mkdirs(f, &e) != 0 && entries(sub) == 0, "mkdirs created outside: %s", e.msg);
    /* the output directory itself a symlink */
    path(d, root, "outlink");
    CHECK(symlink(outside, d) == 0, "symlink");
    CHECK(ac_fsafe_mkdirs(d, &e) != 0 && strstr(e.msg, "outlink"), "%s", e.msg);
    path(f, d, "tokenizer.json");
    CHECK(ac_fsafe_write(f, "x", 1, &e) != 0 && strstr(e.msg, "outlink"), "%s", e.msg);
    CHECK(entries(outside) == 1, "outside changed: %d entries", entries(outside));
    teardown();
}

/* Without roots (the CLI): paths as named, relative ones too; a symlink at
 * the name is still refused. */
static void test_no_roots(void) {
    ac_err e = {{0}};
    ac_fsafe_set_roots(NULL, 0, &e);
    char dir[] = "/tmp/ac_fsw_cli_XXXXXX", cwd[1024], f[512], v[512];
    CHECK(mkdtemp(dir) && getcwd(cwd, sizeof cwd), "tmp");
    CHECK(chdir(dir) == 0, "chdir");
    CHECK(ac_fsafe_mkdirs("rel/dir", &e) == 0 && ac_fsafe_write("rel/dir/f", "ab", 2, &e) == 0, "%s", e.msg);
    CHECK(has("rel/dir/f", "ab"), "relative write");
    path(v, dir, "victim");
    put(v, "orig");
    path(f, dir, "link");
    CHECK(symlink(v, f) == 0, "symlink");
    CHECK(ac_fsafe_write(f, "zz", 2, &e) != 0 && has(v, "orig"), "followed: %s", e.msg);
    CHECK(chdir(cwd) == 0, "chdir back");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "cleanup");
}

static void test_fallback_without_openat2(void) {
    setenv("AC_FSAFE_NO_OPENAT2", "1", 1);
    test_writes_and_dirs();
    test_link_at_name();
    test_parent_swapped();
    /* a read through a swapped directory is refused on the fallback too */
    setup();
    char d[512], f[512];
    ac_err e = {{0}};
    path(d, root, "lnk");
    CHECK(symlink(outside, d) == 0, "symlink");
    path(f, outside, "config.json");
    put(f, "{}");
    path(f, d, "config.json");
    CHECK(ac_fsafe_open(f, AC_FK_CONFIG, NULL, &e) < 0 && strstr(e.msg, "symbolic link"), "read: %s", e.msg);
    teardown();
    unsetenv("AC_FSAFE_NO_OPENAT2");
}

int main(void) {
    RUN(test_writes_and_dirs);
    RUN(test_link_at_name);
    RUN(test_parent_swapped);
    RUN(test_no_roots);
    RUN(test_fallback_without_openat2);
    printf("RESULT %d %d %d\n", ck_pass, ck_fail, ck_skip);
    return ck_fail != 0;
}
