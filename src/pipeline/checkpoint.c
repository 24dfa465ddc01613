/*
 * checkpoint.c - stage outputs on disk (checkpoint_int.h).
 */
#include "checkpoint_int.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/dtype.h"

#define CKPT_MAGIC "ACCKPT01"

/* ------------------------------------------------------------- writing */

typedef struct {
    FILE *f;
    int bad;
} wr;

static void w_bytes(wr *w, const void *p, size_t n) {
    if (!w->bad && n && fwrite(p, 1, n, w->f) != n) w->bad = 1;
}
static void w_i64(wr *w, long long v) { w_bytes(w, &v, sizeof v); }
static void w_f64(wr *w, double v) { w_bytes(w, &v, sizeof v); }
/* An array of n items of size sz: its count (-1: NULL), then the items. */
static void w_arr(wr *w, const void *a, long n, size_t sz) {
    w_i64(w, a ? n : -1);
    if (a) w_bytes(w, a, (size_t)n * sz);
}
static void w_str(wr *w, const char *s) { w_arr(w, s, s ? (long)strlen(s) : 0, 1); }
static void w_json(wr *w, const json_t *j) {
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    if (j && !s) w->bad = 1;
    w_str(w, s);
    free(s);
}

/* Rows [L] of per-layer arrays, row l of len(l) items (the top pointer NULL: absent). */
typedef int (*row_len)(const ac_arch *a, int l);
static int len_kv(const ac_arch *a, int l) { return a->layers[l].n_kv_heads; }
static int len_ffn(const ac_arch *a, int l) { return a->layers[l].ffn; }
static int len_heads(const ac_arch *a, int l) { return a->layers[l].n_heads; }

static void w_rows(wr *w, void *const *rows, const ac_arch *a, row_len len, size_t sz) {
    w_i64(w, rows ? a->n_layers : -1);
    for (int l = 0; rows && l < a->n_layers; l++) w_arr(w, rows[l], len(a, l), sz);
}

static void w_importance(wr *w, const ac_importance *im, const ac_arch *a) {
    int L = im->n_layers, H = im->hidden;
    w_i64(w, L);
    w_i64(w, H);
    if (!L) return; /* none (no DNAS orders) */
    w_rows(w, (void *const *)im->kv_order, a, len_kv, sizeof(int));
    w_rows(w, (void *const *)im->kv_score, a, len_kv, sizeof(double));
    w_rows(w, (void *const *)im->ffn_order, a, len_ffn, sizeof(int));
    w_rows(w, (void *const *)im->ffn_score, a, len_ffn, sizeof(double));
    w_arr(w, im->hid_order, H, sizeof(int));
    w_arr(w, im->hid_score, H, sizeof(double));
    w_arr(w, im->layer_bi, L, sizeof(double));
    w_f64(w, im->base_loss);
    w_arr(w, im->attn_sens, L, sizeof *im->attn_sens);
    w_arr(w, im->ffn_sens, L, sizeof *im->ffn_sens);
    w_bytes(w, im->hid_frac, sizeof im->hid_frac);
    w_bytes(w, im->hid_sens, sizeof im->hid_sens);
    w_arr(w, im->merge_n, L, sizeof(int));
    w_arr(w, im->merge_r, L, sizeof *im->merge_r);
    w_arr(w, im->merge_sens, L, sizeof *im->merge_sens);
    w_i64(w, im->tokens);
    w_rows(w, (void *const *)im->head_order, a, len_heads, sizeof(int));
    w_rows(w, (void *const *)im->head_score, a, len_heads, sizeof(double));
    w_rows(w, (void *const *)im->mt_ffn_order, a, len_ffn, sizeof(int));
    w_rows(w, (void *const *)im->mt_ffn_score, a, len_ffn, sizeof(double));
    w_arr(w, im->mt_hid_order, H, sizeof(int));
    w_arr(w, im->mt_hid_score, H, sizeof(double));
    w_i64(w, im->streamed);
    w_i64(w, im->method);
}

static void w_result(wr *w, const ac_search_result *r) {
    int has = r->arch.layers != NULL;
    w_i64(w, has);
    if (!has) return;
    json_t *a = ac_arch_to_json(&r->arch);
    w_json(w, a);
    json_decref(a);
    w_bytes(w, &r->cost, sizeof r->cost);
    w_f64(w, r->pred_loss);
    w_i64(w, r->feasible);
    w_i64(w, r->steps_run);
    w_json(w, r->detail);
}

/* ------------------------------------------------------------- reading */

typedef struct {
    FILE *f;
    int bad;
} rd;

static void r_bytes(rd *r, void *p, size_t n) {
    if (!r->bad && n && fread(p, 1, n, r->f) != n) r->bad = 1;
}
static long long r_i64(rd *r) {
    long long v = 0;
    r_bytes(r, &v, sizeof v);
    return v;
}
static double r_f64(rd *r) {
    double v = 0;
    r_bytes(r, &v, sizeof v);
    return v;
}
/* An array written by w_arr that must hold n items (or be NULL): owned
 * (one spare zeroed item), NULL when it was NULL or on a mismatch (bad). */
static void *r_arr(rd *r, long n, size_t sz) {
    long long c = r_i64(r);
    if (r->bad || c == -1) return NULL;
    if (c != n || n < 0) {
        r->bad = 1;
        return NULL;
    }
    void *p = calloc((size_t)n + 1, sz);
    if (!p) {
        r->bad = 1;
        return NULL;
    }
    r_bytes(r, p, (size_t)n * sz);
    return p;
}
/* A string written by w_str (owned, NUL-terminated), NULL for NULL. */
static char *r_str(rd *r) {
    long long c = r_i64(r);
    if (r->bad || c == -1) return NULL;
    if (c < 0 || c > (1LL << 30)) {
        r->bad = 1;
        return NULL;
    }
    char *s = calloc((size_t)c + 1, 1);
    if (!s) {
        r->bad = 1;
        return NULL;
    }
    r_bytes(r, s, (size_t)c);
    return s;
}
static json_t *r_json(rd *r) {
    char *s = r_str(r);
    json_t *j = s ? json_loads(s, JSON_DECODE_ANY, NULL) : NULL;
    if (s && !j) r->bad = 1;
    free(s);
    return j;
}

static void **r_rows(rd *r, const ac_arch *a, row_len len, size_t sz) {
    long long c = r_i64(r);
    if (r->bad || c == -1) return NULL;
    if (c != a->n_layers) {
        r->bad = 1;
        return NULL;
    }
    void **rows = calloc((size_t)a->n_layers, sizeof *rows);
    if (!rows) {
        r->bad = 1;
        return NULL;
    }
    for (int l = 0; l < a->n_layers; l++) rows[l] = r_arr(r, len(a, l), sz);
    return rows;
}

static void r_importance(rd *r, ac_importance *im, const ac_arch *a) {
    memset(im, 0, sizeof *im);
    long long L = r_i64(r), H = r_i64(r);
    if (r->bad || L == 0) return;
    if (L != a->n_layers || H != a->hidden) {
        r->bad = 1;
        return;
    }
    im->n_layers = (int)L;
    im->hidden = (int)H;
    im->kv_order = (int **)r_rows(r, a, len_kv, sizeof(int));
    im->kv_score = (double **)r_rows(r, a, len_kv, sizeof(double));
    im->ffn_order = (int **)r_rows(r, a, len_ffn, sizeof(int));
    im->ffn_score = (double **)r_rows(r, a, len_ffn, sizeof(double));
    im->hid_order = r_arr(r, (long)H, sizeof(int));
    im->hid_score = r_arr(r, (long)H, sizeof(double));
    im->layer_bi = r_arr(r, (long)L, sizeof(double));
    im->base_loss = r_f64(r);
    im->attn_sens = r_arr(r, (long)L, sizeof *im->attn_sens);
    im->ffn_sens = r_arr(r, (long)L, sizeof *im->ffn_sens);
    r_bytes(r, im->hid_frac, sizeof im->hid_frac);
    r_bytes(r, im->hid_sens, sizeof im->hid_sens);
    im->merge_n = r_arr(r, (long)L, sizeof(int));
    im->merge_r = r_arr(r, (long)L, sizeof *im->merge_r);
    im->merge_sens = r_arr(r, (long)L, sizeof *im->merge_sens);
    im->tokens = (long)r_i64(r);
    im->head_order = (int **)r_rows(r, a, len_heads, sizeof(int));
    im->head_score = (double **)r_rows(r, a, len_heads, sizeof(double));
    im->mt_ffn_order = (int **)r_rows(r, a, len_ffn, sizeof(int));
    im->mt_ffn_score = (double **)r_rows(r, a, len_ffn, sizeof(double));
    im->mt_hid_order = r_arr(r, (long)H, sizeof(int));
    im->mt_hid_score = r_arr(r, (long)H, sizeof(double));
    im->streamed = (int)r_i64(r);
    im->method = (int)r_i64(r);
}

static void r_result(rd *r, ac_search_result *res, const ac_arch *base, ac_err *e) {
    memset(res, 0, sizeof *res);
    if (!r_i64(r) || r->bad) return;
    json_t *a = r_json(r);
    if (r->bad || !a || ac_arch_from_json(a, base, &res->arch, e)) r->bad = 1;
    json_decref(a);
    r_bytes(r, &res->cost, sizeof res->cost);
    res->pred_loss = r_f64(r);
    res->feasible = (int)r_i64(r);
    res->steps_run = (int)r_i64(r);
    res->detail = r_json(r);
}

/* ------------------------------------------------------------- files */

static const char *const CKPT_STAGES[] = {"calibrate", "profile", "search"};

int ac_ckpt_stage(const char *stage) {
    for (size_t i = 0; i < sizeof CKPT_STAGES / sizeof *CKPT_STAGES; i++)
        if (!strcmp(stage, CKPT_STAGES[i])) return 1;
    return 0;
}

int ac_ckpt_supported(const job_state *s) {
    if (ac_arch_has_moe(&s->m.a)) return 0;
    for (int l = 0; l < s->m.a.n_layers; l++)
        if (s->m.a.layers[l].ssm_heads > 0) return 0;
    return 1;
}

static void header(wr *w, const job_state *s, const char *key, const char *stage) {
    w_bytes(w, CKPT_MAGIC, 8);
    w_str(w, stage);
    w_str(w, key);
    w_i64(w, s->m.a.n_layers);
    w_i64(w, s->m.a.hidden);
    w_i64(w, s->m.a.vocab);
    w_i64(w, (long long)sizeof(ac_cost));
    w_i64(w, AC_SENS_POINTS);
}

/* Open DIR/STAGE.ckpt and check its header: 1 (r open, at the stage's
 * run time), 0 none usable (why says why when there was a file). */
static int open_checked(rd *r, const job_state *s, const char *dir, const char *key, const char *stage, char *path,
                        size_t pn, char *why, size_t n) {
    snprintf(path, pn, "%s/%s.ckpt", dir, stage);
    why[0] = 0;
    *r = (rd){fopen(path, "rb"), 0};
    if (!r->f) return 0;
    char magic[8];
    r_bytes(r, magic, 8);
    char *st = r_str(r), *k = r_str(r);
    long long L = r_i64(r), H = r_i64(r), V = r_i64(r), cs = r_i64(r), sp = r_i64(r);
    int same = !r->bad && !memcmp(magic, CKPT_MAGIC, 8) && st && !strcmp(st, stage) && k && !strcmp(k, key) &&
               L == s->m.a.n_layers && H == s->m.a.hidden && V == s->m.a.vocab && cs == (long long)sizeof(ac_cost) &&
               sp == AC_SENS_POINTS;
    free(st);
    free(k);
    if (!same) {
        fclose(r->f);
        snprintf(why, n, "%s is from another job, spec, model or build", path);
        return 0;
    }
    return 1;
}

/* Write w's file: the end mark, flushed and synced, renamed from tmp to path. */
static int commit(wr *w, const char *tmp, const char *path, ac_err *e) {
    w_bytes(w, CKPT_MAGIC, 8); /* the end: a cut file is not read */
    int bad = w->bad || fflush(w->f) || fsync(fileno(w->f));
    if (fclose(w->f)) bad = 1;
    if (bad || rename(tmp, path)) {
        int err = errno;
        unlink(tmp);
        return ac_errf(e, "checkpoint %s: %s", path, bad ? "write failed" : strerror(err));
    }
    return 0;
}

int ac_ckpt_save(const job_state *s, const char *dir, const char *key, const char *stage, double seconds, ac_err *e) {
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/%s.ckpt", dir, stage);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    wr w = {fopen(tmp, "wb"), 0};
    if (!w.f) return ac_errf(e, "checkpoint %s: %s", tmp, strerror(errno));
    header(&w, s, key, stage);
    w_f64(&w, seconds);
    if (!strcmp(stage, "calibrate"))
        w_importance(&w, &s->imp, &s->m.a);
    else if (!strcmp(stage, "profile")) {
        json_t *t = ac_cost_table_to_json(&s->table);
        w_json(&w, t);
        json_decref(t);
        w_i64(&w, s->cache_hit);
    } else if (!strcmp(stage, "search")) {
        w_i64(&w, s->two_arms);
        w_result(&w, &s->rm);
        w_result(&w, &s->ra);
        w_importance(&w, &s->imp_d, &s->m.a);
    }
    return commit(&w, tmp, path, e);
}

int ac_ckpt_load(job_state *s, const char *dir, const char *key, const char *stage, double *seconds, char *why,
                 size_t n) {
    char path[4200];
    rd r;
    if (!open_checked(&r, s, dir, key, stage, path, sizeof path, why, n)) return 0;
    char magic[8];
    *seconds = r_f64(&r);
    ac_importance imp = {0};
    ac_cost_table table = {0};
    ac_search_result rm = {0}, ra = {0};
    int two = 0, hit = 0, have_table = 0;
    ac_err e2 = {{0}};
    if (!strcmp(stage, "calibrate"))
        r_importance(&r, &imp, &s->m.a);
    else if (!strcmp(stage, "profile")) {
        json_t *t = r_json(&r);
        if (!t || ac_cost_table_from_json(t, &table, &e2))
            r.bad = 1;
        else
            have_table = 1;
        json_decref(t);
        hit = (int)r_i64(&r);
    } else if (!strcmp(stage, "search")) {
        two = (int)r_i64(&r);
        r_result(&r, &rm, &s->m.a, &e2);
        r_result(&r, &ra, &s->m.a, &e2);
        r_importance(&r, &imp, &s->m.a);
    }
    r_bytes(&r, magic, 8);
    int ok = !r.bad && !memcmp(magic, CKPT_MAGIC, 8) && fgetc(r.f) == EOF;
    fclose(r.f);
    if (!ok) {
        ac_importance_free(&imp);
        if (have_table) ac_cost_table_free(&table);
        ac_search_result_free(&rm);
        ac_search_result_free(&ra);
        snprintf(why, n, "%s cannot be read back%s%s", path, e2.msg[0] ? ": " : "", e2.msg);
        return 0;
    }
    if (!strcmp(stage, "calibrate"))
        s->imp = imp;
    else if (!strcmp(stage, "profile")) {
        s->table = table;
        s->cache_hit = hit;
    } else {
        s->two_arms = two;
        s->rm = rm;
        s->ra = ra;
        s->imp_d = imp;
    }
    return 1;
}

/* ------------------------------------------------------------- distilled arms */

/* A flat directory (what ac_model_save writes: files only) removed. */
static void rm_flat(const char *d) {
    DIR *dp = opendir(d);
    if (dp) {
        struct dirent *de;
        char p[4400];
        while ((de = readdir(dp)))
            if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
                snprintf(p, sizeof p, "%s/%s", d, de->d_name);
                unlink(p);
            }
        closedir(dp);
    }
    rmdir(d);
}

static int arch_json_equal(const ac_arch *a, const json_t *j) {
    json_t *x = ac_arch_to_json(a);
    int eq = x && j && json_equal(x, j);
    json_decref(x);
    return eq;
}

int ac_ckpt_save_arm(const job_state *s, const char *dir, const char *key, const char *arm, const ac_model *m,
                     const json_t *report, ac_err *e) {
    char stage[64], path[4200], tmp[4300], mdir[4200], mtmp[4300];
    snprintf(stage, sizeof stage, "distill.%s", arm);
    snprintf(path, sizeof path, "%s/%s.ckpt", dir, stage);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    snprintf(mdir, sizeof mdir, "%s/%s.model", dir, stage);
    snprintf(mtmp, sizeof mtmp, "%s.tmp", mdir);
    unlink(path); /* the .ckpt commits the model directory: none while it changes */
    rm_flat(mtmp);
    /* fp32: norms and biases as trained (a BF16 file would round them), matrices widened exactly */
    if (ac_model_save(m, mtmp, ST_F32, e)) {
        rm_flat(mtmp);
        return ac_errctx(e, "checkpoint %s", mtmp);
    }
    rm_flat(mdir);
    if (rename(mtmp, mdir)) {
        int err = errno;
        rm_flat(mtmp);
        return ac_errf(e, "checkpoint %s: %s", mdir, strerror(err));
    }
    wr w = {fopen(tmp, "wb"), 0};
    if (!w.f) return ac_errf(e, "checkpoint %s: %s", tmp, strerror(errno));
    header(&w, s, key, stage);
    json_t *a = ac_arch_to_json(&m->a);
    w_json(&w, a);
    json_decref(a);
    w_i64(&w, ac_model_wdt(m));
    w_json(&w, report);
    return commit(&w, tmp, path, e);
}

int ac_ckpt_load_arm(const job_state *s, const char *dir, const char *key, const char *arm, ac_model *m,
                     json_t **report, char *why, size_t n) {
    char stage[64], path[4200], mdir[4200];
    snprintf(stage, sizeof stage, "distill.%s", arm);
    snprintf(mdir, sizeof mdir, "%s/%s.model", dir, stage);
    *report = NULL;
    rd r;
    if (!open_checked(&r, s, dir, key, stage, path, sizeof path, why, n)) return 0;
    char magic[8];
    json_t *a = r_json(&r);
    int wdt = (int)r_i64(&r);
    json_t *rep = r_json(&r);
    r_bytes(&r, magic, 8);
    int ok = !r.bad && !memcmp(magic, CKPT_MAGIC, 8) && fgetc(r.f) == EOF && json_is_object(rep);
    fclose(r.f);
    ac_model got = {0};
    ac_err e2 = {{0}};
    if (!ok)
        snprintf(why, n, "%s cannot be read back", path);
    else if (!arch_json_equal(&m->a, a) || wdt != ac_model_wdt(m))
        snprintf(why, n, "%s is for another student (this run pruned a different structure)", path), ok = 0;
    else if (ac_model_load(mdir, &got, &e2) || (wdt == ST_BF16 && ac_model_make_bf16(&got, &e2)))
        snprintf(why, n, "%s cannot be read back: %s", mdir, e2.msg), ok = 0;
    else if (!arch_json_equal(&got.a, a) || ac_model_wdt(&got) != wdt)
        snprintf(why, n, "%s does not hold the student %s describes", mdir, path), ok = 0;
    json_decref(a);
    if (!ok) {
        ac_model_free(&got);
        json_decref(rep);
        return 0;
    }
    ac_model_free(m);
    *m = got;
    *report = rep;
    return 1;
}

void ac_ckpt_release_arms(const char *dir) {
    static const char *arms[] = {"minitron", "autocompress"};
    char p[4200];
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/distill.%s.ckpt", dir, arms[i]);
        unlink(p);
        snprintf(p, sizeof p, "%s/distill.%s.ckpt.tmp", dir, arms[i]);
        unlink(p);
        snprintf(p, sizeof p, "%s/distill.%s.model", dir, arms[i]);
        rm_flat(p);
        snprintf(p, sizeof p, "%s/distill.%s.model.tmp", dir, arms[i]);
        rm_flat(p);
    }
}

void ac_ckpt_clear(const char *dir) {
    char p[4200];
    for (size_t i = 0; i < sizeof CKPT_STAGES / sizeof *CKPT_STAGES; i++) {
        snprintf(p, sizeof p, "%s/%s.ckpt", dir, CKPT_STAGES[i]);
        unlink(p);
        snprintf(p, sizeof p, "%s/%s.ckpt.tmp", dir, CKPT_STAGES[i]);
        unlink(p);
    }
    ac_ckpt_release_arms(dir);
}
