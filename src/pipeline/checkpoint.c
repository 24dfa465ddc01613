/*
 * checkpoint.c - stage outputs on disk (checkpoint_int.h).
 */
#include "checkpoint_int.h"

#include <dirent.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/dtype.h"

/* The format's version is the magic's last two digits: 02 added the
 * mixture-of-experts and Mamba rows of the importance and the base
 * architecture to the header, 03 the hybrid's Mamba-head loss curves. A file of another version is not read (its
 * stage runs again). */
#define CKPT_MAGIC "ACCKPT03"
#define CKPT_MAGIC_STEM "ACCKPT"

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
static int len_experts(const ac_arch *a, int l) { return a->layers[l].n_experts; }
static int len_echan(const ac_arch *a, int l) { return a->layers[l].n_experts * a->layers[l].expert_ffn; }
static int len_ssm(const ac_arch *a, int l) { return a->layers[l].ssm_heads; }
static int len_ssm_chan(const ac_arch *a, int l) { return a->layers[l].ssm_heads * a->ssm_head_dim; }

/* The importance's fields, by offset: every per-layer rows field (each row
 * as long as the base architecture says), then the flat arrays (of L
 * layers or H hidden channels), in the order the file holds them. */
#define IMP_ROWS(f, len, t)                                                                                            \
    { offsetof(ac_importance, f), len, sizeof(t) }
static const struct {
    size_t off;
    row_len len;
    size_t sz;
} IMP_ROW_FIELDS[] = {
    IMP_ROWS(kv_order, len_kv, int),
    IMP_ROWS(kv_score, len_kv, double),
    IMP_ROWS(ffn_order, len_ffn, int),
    IMP_ROWS(ffn_score, len_ffn, double),
    IMP_ROWS(head_order, len_heads, int),
    IMP_ROWS(head_score, len_heads, double),
    IMP_ROWS(mt_ffn_order, len_ffn, int),
    IMP_ROWS(mt_ffn_score, len_ffn, double),
    IMP_ROWS(expert_order, len_experts, int),
    IMP_ROWS(expert_score, len_experts, double),
    IMP_ROWS(echan_order, len_echan, int),
    IMP_ROWS(echan_score, len_echan, double),
    IMP_ROWS(ssm_head_order, len_ssm, int),
    IMP_ROWS(ssm_head_score, len_ssm, double),
    IMP_ROWS(ssm_chan_score, len_ssm_chan, double),
};
#define IMP_FLAT(f, per_layer, t)                                                                                      \
    { offsetof(ac_importance, f), per_layer, sizeof(t) }
static const struct {
    size_t off;
    int per_layer; /* 1: L items, 0: H */
    size_t sz;
} IMP_FLAT_FIELDS[] = {
    IMP_FLAT(hid_order, 0, int),
    IMP_FLAT(hid_score, 0, double),
    IMP_FLAT(layer_bi, 1, double),
    IMP_FLAT(attn_sens, 1, double[AC_SENS_POINTS]),
    IMP_FLAT(ffn_sens, 1, double[AC_SENS_POINTS]),
    IMP_FLAT(merge_n, 1, int),
    IMP_FLAT(merge_r, 1, double[8]),
    IMP_FLAT(merge_sens, 1, double[8]),
    IMP_FLAT(mt_hid_order, 0, int),
    IMP_FLAT(mt_hid_score, 0, double),
    IMP_FLAT(ssm_sens, 1, double[AC_SENS_POINTS]),
};
enum {
    N_ROWF = sizeof IMP_ROW_FIELDS / sizeof *IMP_ROW_FIELDS,
    N_FLATF = sizeof IMP_FLAT_FIELDS / sizeof *IMP_FLAT_FIELDS
};
static void **field(const ac_importance *im, size_t off) { return (void **)((char *)im + off); }

static void w_rows(wr *w, void *const *rows, const ac_arch *a, row_len len, size_t sz) {
    w_i64(w, rows ? a->n_layers : -1);
    for (int l = 0; rows && l < a->n_layers; l++) w_arr(w, rows[l], len(a, l), sz);
}

static void w_importance(wr *w, const ac_importance *im, const ac_arch *a) {
    int L = im->n_layers, H = im->hidden;
    w_i64(w, L);
    w_i64(w, H);
    if (!L) return; /* none (no DNAS orders) */
    for (int i = 0; i < N_ROWF; i++)
        w_rows(w, *(void *const *const *)field(im, IMP_ROW_FIELDS[i].off), a, IMP_ROW_FIELDS[i].len,
               IMP_ROW_FIELDS[i].sz);
    for (int i = 0; i < N_FLATF; i++)
        w_arr(w, *field(im, IMP_FLAT_FIELDS[i].off), IMP_FLAT_FIELDS[i].per_layer ? L : H, IMP_FLAT_FIELDS[i].sz);
    w_f64(w, im->base_loss);
    w_bytes(w, im->hid_frac, sizeof im->hid_frac);
    w_bytes(w, im->hid_sens, sizeof im->hid_sens);
    w_i64(w, im->tokens);
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

/* An importance read in part (a cut or bad file) freed: every field on its
 * own, as its pairs may be half read (ac_importance_free frees pairs). */
static void imp_discard(ac_importance *im) {
    for (int i = 0; i < N_ROWF; i++) {
        void **rows = *field(im, IMP_ROW_FIELDS[i].off);
        for (int l = 0; rows && l < im->n_layers; l++) free(rows[l]);
        free(rows);
    }
    for (int i = 0; i < N_FLATF; i++) free(*field(im, IMP_FLAT_FIELDS[i].off));
    memset(im, 0, sizeof *im);
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
    for (int i = 0; i < N_ROWF; i++)
        *field(im, IMP_ROW_FIELDS[i].off) = r_rows(r, a, IMP_ROW_FIELDS[i].len, IMP_ROW_FIELDS[i].sz);
    for (int i = 0; i < N_FLATF; i++)
        *field(im, IMP_FLAT_FIELDS[i].off) =
            r_arr(r, IMP_FLAT_FIELDS[i].per_layer ? (long)L : (long)H, IMP_FLAT_FIELDS[i].sz);
    im->base_loss = r_f64(r);
    r_bytes(r, im->hid_frac, sizeof im->hid_frac);
    r_bytes(r, im->hid_sens, sizeof im->hid_sens);
    im->tokens = (long)r_i64(r);
    im->streamed = (int)r_i64(r);
    im->method = (int)r_i64(r);
    if (r->bad) imp_discard(im);
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

static int arch_json_equal(const ac_arch *a, const json_t *j) {
    json_t *x = ac_arch_to_json(a);
    int eq = x && j && json_equal(x, j);
    json_decref(x);
    return eq;
}

static void header(wr *w, const job_state *s, const char *key, const char *stage) {
    w_bytes(w, CKPT_MAGIC, 8);
    w_str(w, stage);
    w_str(w, key);
    w_i64(w, s->m.a.n_layers);
    w_i64(w, s->m.a.hidden);
    w_i64(w, s->m.a.vocab);
    w_i64(w, (long long)sizeof(ac_cost));
    w_i64(w, (long long)sizeof(ac_importance));
    w_i64(w, AC_SENS_POINTS);
    json_t *a = ac_arch_to_json(&s->m.a); /* every layer's shape: experts, expert widths, Mamba heads */
    w_json(w, a);
    json_decref(a);
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
    if (!r->bad && !memcmp(magic, CKPT_MAGIC_STEM, 6) && memcmp(magic, CKPT_MAGIC, 8)) {
        fclose(r->f);
        snprintf(why, n, "%s is of checkpoint format version %.2s, this build reads version %s", path, magic + 6,
                 CKPT_MAGIC + 6);
        return 0;
    }
    char *st = r_str(r), *k = r_str(r);
    long long L = r_i64(r), H = r_i64(r), V = r_i64(r), cs = r_i64(r), is = r_i64(r), sp = r_i64(r);
    json_t *a = r_json(r);
    int same = !r->bad && !memcmp(magic, CKPT_MAGIC, 8) && st && !strcmp(st, stage) && k && !strcmp(k, key) &&
               L == s->m.a.n_layers && H == s->m.a.hidden && V == s->m.a.vocab && cs == (long long)sizeof(ac_cost) &&
               is == (long long)sizeof(ac_importance) && sp == AC_SENS_POINTS && arch_json_equal(&s->m.a, a);
    free(st);
    free(k);
    json_decref(a);
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
        imp_discard(&imp);
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
    if (wdt == ST_BF16) ac_model_round_vectors(&got, ST_BF16); /* as the distilled student was (distill.c) */
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
