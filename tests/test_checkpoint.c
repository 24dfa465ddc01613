/*
 * test_checkpoint.c - stage checkpoints (src/pipeline/checkpoint_int.h) on the
 * tiny model, without Slurm (tests/test_slurm.py requeues a real batch
 * job): a job run with a checkpoint directory keeps calibrate, profile and
 * search; run again with the same key it restores the three (their "stage"
 * events say resumed, no search event is emitted, the report lists them)
 * and reports the same calibration curves, architectures, predictions and
 * perplexities, and exports the same config.json, as the first run; a cut
 * search checkpoint is not used (calibrate and profile are restored, search
 * runs again) and the outcome is the same again; under another key nothing
 * is restored (that run is cancelled once it said why). A job with
 * distillation also keeps each distilled arm (test_resume_distilled_arms).
 * A mixture-of-experts (Qwen3-MoE) and a hybrid Mamba-MoE (nemotron_h)
 * job, on the fixtures of tests/gen_fixtures.py with a tokenizer cut to
 * their vocabulary, stopped after their search and run again, restore the
 * three stages and give the uninterrupted run's structures, predictions,
 * perplexities and exported weights; their distilled arms are restored
 * too; a cut file, a foreign one and one of the previous format version
 * (01) are not used (test_resume_moe, test_resume_hybrid).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "format/model.h"
#include "pipeline/job.h"

static char tiny[1100], dir[64] = "/tmp/ac_test_ckpt_XXXXXX", ckdir[128], out[128];

enum { STOP_NEVER, STOP_ON_REFUSAL, STOP_AFTER_SEARCH };

typedef struct {
    int nstages, nsearch, nresumed;
    int ndistill[2];   /* "distill" step events of the minitron, autocompress arm */
    int narms_restored; /* "distilled arm restored" logs */
    volatile int cancel; /* set when a checkpoint was refused (STOP_ON_REFUSAL), the search began (STOP_AFTER_SEARCH) */
    int stop;
    char stages[16][16];
    int resumed[16]; /* stages[i] was restored */
    char why[600];
} seen;

static void on_event(void *ud, const char *kind, json_t *data) {
    seen *s = ud;
    if (!strcmp(kind, "stage") && s->nstages < 16) {
        const char *st = json_string_value(json_object_get(data, "stage"));
        snprintf(s->stages[s->nstages], sizeof s->stages[0], "%s", st);
        s->resumed[s->nstages] = json_is_true(json_object_get(data, "resumed"));
        s->nresumed += s->resumed[s->nstages];
        s->nstages++;
        /* the job checks its flag before each stage: the search runs to its end (and its checkpoint) first */
        if (s->stop == STOP_AFTER_SEARCH && !strcmp(st, "search")) s->cancel = 1;
    }
    if (!strcmp(kind, "search")) s->nsearch++;
    const char *arm = json_string_value(json_object_get(data, "arm"));
    if (!strcmp(kind, "distill") && arm) s->ndistill[strcmp(arm, "minitron") != 0]++;
    const char *msg = json_string_value(json_object_get(data, "message"));
    if (!strcmp(kind, "log") && msg && !strcmp(msg, "distilled arm restored from its checkpoint")) s->narms_restored++;
    if (!strcmp(kind, "log") && msg && !strcmp(msg, "checkpoint not used")) {
        snprintf(s->why, sizeof s->why, "%s", json_string_value(json_object_get(data, "why")));
        if (s->stop == STOP_ON_REFUSAL) s->cancel = 1;
    }
}

/* One job: model, its checkpoint directory and output, the key (the spec's digest in the daemon), when to stop,
 * distillation tokens (0: none), the parameter limit and the workload's prompt and generation lengths. */
typedef struct {
    const char *model, *ckdir, *out, *key;
    int stop;
    long distill;
    double max_params;
    int prompt, gen;
    int dseq, dbatch;   /* distill.seq_len, distill.batch (0: the defaults) */
    const char *search; /* more search fields (JSON; NULL: none) */
} job_opts;

static int run_job(const job_opts *o, seen *s, json_t **res, ac_err *e) {
    char calib[1100], held[1100];
    ck_build_path(calib, sizeof calib, "data/calib.txt");
    ck_build_path(held, sizeof held, "data/heldout.txt");
    json_t *spec = json_pack("{s:s,s:s,s:s,s:s,s:{s:s,s:{s:i,s:i,s:i}},s:{s:f},s:{s:i,s:i,s:i},s:i,s:{s:i,s:i}}",
                             "model", o->model, "calibration", calib, "heldout", held, "output", o->out, "target",
                             "device", "H100", "workload", "batch", 1, "prompt_len", o->prompt, "gen_len", o->gen,
                             "constraints", "max_params", o->max_params, "search", "steps", 50, "seed", 3,
                             "dnas_steps", 40, "calibration_tokens", 2048, "eval", "ctx", 64, "windows", 4);
    if (o->search) {
        json_t *x = json_loads(o->search, 0, NULL);
        json_object_update(json_object_get(spec, "search"), x);
        json_decref(x);
    }
    if (o->distill > 0) {
        json_t *d = json_pack("{s:I}", "tokens", (json_int_t)o->distill);
        if (o->dseq) json_object_set_new(d, "seq_len", json_integer(o->dseq));
        if (o->dbatch) json_object_set_new(d, "batch", json_integer(o->dbatch));
        json_object_set_new(spec, "distill", d);
    }
    static ac_job_spec sp;
    memset(s, 0, sizeof *s);
    s->stop = o->stop;
    ac_job_ctx ctx = {.emit = on_event, .ud = s, .cancelled = &s->cancel, .threads = ck_threads(), .checkpoint_dir = o->ckdir,
                      .checkpoint_key = o->key};
    int rc = ac_job_spec_parse(spec, &sp, NULL, e) || ac_job_run(&sp, &ctx, res, e);
    json_decref(spec);
    return rc ? -1 : 0;
}

static int run_spec(const char *key, int stop_on_refusal, long distill_tokens, seen *s, json_t **res, ac_err *e) {
    job_opts o = {tiny, ckdir, out, key, stop_on_refusal ? STOP_ON_REFUSAL : STOP_NEVER, distill_tokens, 1.0e6, 256, 64,
                  0, 0, NULL};
    return run_job(&o, s, res, e);
}

static int run(const char *key, int stop_on_refusal, seen *s, json_t **res, ac_err *e) {
    return run_spec(key, stop_on_refusal, 0, s, res, e);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *b = calloc(1, 1 << 20);
    if (b) b[fread(b, 1, (1 << 20) - 1, f)] = 0;
    fclose(f);
    return b;
}

/* The fields of two reports of one spec that do not depend on timing. */
static int same_outcome(json_t *a, json_t *b, const char **what) {
    static const char *arm_keys[] = {"architecture", "predicted", "feasible", "predicted_loss_increase", "perplexity",
                                     "nll"};
    *what = "importance";
    if (!json_equal(json_object_get(a, "importance"), json_object_get(b, "importance"))) return 0;
    const char *arms[] = {"minitron", "autocompress"};
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 6; k++) {
            *what = arm_keys[k];
            if (!json_equal(json_object_get(json_object_get(a, arms[i]), arm_keys[k]),
                            json_object_get(json_object_get(b, arms[i]), arm_keys[k])))
                return 0;
        }
    *what = "chosen";
    return json_equal(json_object_get(a, "chosen"), json_object_get(b, "chosen"));
}

static void test_resume_from_checkpoints(void) {
    struct stat st;
    if (stat(tiny, &st)) SKIP("no tiny model (make tiny-model)");
    if (!mkdtemp(dir)) SKIP("no temp dir");
    snprintf(ckdir, sizeof ckdir, "%s/checkpoint", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    mkdir(ckdir, 0700);
    ac_err e = {{0}};
    seen s1, s2, s3;
    json_t *r1 = NULL, *r2 = NULL, *r3 = NULL;
    const char *what = "";
    char cfg[200];
    snprintf(cfg, sizeof cfg, "%s/config.json", out);

    /* the first run computes every stage and keeps three */
    CHECK(run("spec-a", 0, &s1, &r1, &e) == 0, "first run: %s", e.msg);
    if (!r1) return;
    char *cfg1 = slurp(cfg);
    CHECK(s1.nresumed == 0 && s1.nsearch > 0 && !json_object_get(r1, "resumed_stages"), "first run resumed something");
    const char *names[] = {"calibrate", "profile", "search"};
    for (int i = 0; i < 3; i++) {
        char p[200];
        snprintf(p, sizeof p, "%s/%s.ckpt", ckdir, names[i]);
        CHECK(stat(p, &st) == 0 && st.st_size > 64, "no checkpoint %s", p);
    }

    /* run again with the same key: the three are restored, the search does not run */
    CHECK(run("spec-a", 0, &s2, &r2, &e) == 0, "second run: %s", e.msg);
    if (r2) {
        json_t *rs = json_object_get(r2, "resumed_stages");
        CHECK(s2.nresumed == 3 && s2.nsearch == 0 && json_array_size(rs) == 3 &&
                  !strcmp(json_string_value(json_array_get(rs, 0)), "calibrate") &&
                  !strcmp(json_string_value(json_array_get(rs, 2)), "search"),
              "second run: %d resumed, %d search events", s2.nresumed, s2.nsearch);
        CHECK(s2.nstages == s1.nstages, "stage events %d vs %d", s2.nstages, s1.nstages);
        CHECK(same_outcome(r1, r2, &what), "the resumed run's %s differs", what);
        char *cfg2 = slurp(cfg);
        CHECK(cfg1 && cfg2 && !strcmp(cfg1, cfg2), "config.json differs");
        free(cfg2);
    }

    /* a cut search checkpoint (a node lost while writing one: here cut by hand) is not used: calibrate and
     * profile are restored, search runs again, the outcome is the same */
    char p[200];
    snprintf(p, sizeof p, "%s/search.ckpt", ckdir);
    CHECK(stat(p, &st) == 0 && truncate(p, st.st_size - 9) == 0, "cannot cut %s", p);
    CHECK(run("spec-a", 0, &s3, &r3, &e) == 0, "third run: %s", e.msg);
    CHECK(s3.nresumed == 2 && s3.nsearch > 0 && strstr(s3.why, "cannot be read back"),
          "cut search checkpoint: %d resumed, %d search events (%s)", s3.nresumed, s3.nsearch, s3.why);
    if (r3) CHECK(same_outcome(r1, r3, &what), "the partly resumed run's %s differs", what);

    /* another key (another spec): nothing restored, the log says why (then the run is stopped) */
    seen s4;
    json_t *r4 = NULL;
    CHECK(run("spec-b", 1, &s4, &r4, &e) != 0 && !r4, "the run with another key was not stopped");
    CHECK(s4.nresumed == 0 && strstr(s4.why, "another job"), "another key: %d resumed (%s)", s4.nresumed, s4.why);
    json_decref(r4);

    char *tm = json_dumps(json_object_get(r1, "timings_s"), JSON_COMPACT | JSON_REAL_PRECISION(3));
    printf("  first run's stages (s): %s\n", tm ? tm : "?");
    free(tm);

    free(cfg1);
    json_decref(r1);
    json_decref(r2);
    json_decref(r3);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) fprintf(stderr, "cannot remove %s\n", dir);
}

/* Both arms' distilled students are kept (distill.ARM.ckpt and its model
 * directory). With the minitron arm's checkpoint removed, a run again
 * restores the three stages and the autocompress arm (its distillation
 * fields as the first run reported them, its run time included), distils
 * the minitron arm alone, and has the same outcome and the same
 * distillation losses. Released (ac_job_release_checkpoints, as the
 * worker does after its result), the students are gone and the stage
 * files stay. */
static void test_resume_distilled_arms(void) {
    struct stat st;
    if (stat(tiny, &st)) SKIP("no tiny model (make tiny-model)");
    snprintf(dir, sizeof dir, "/tmp/ac_test_ckpt_XXXXXX");
    if (!mkdtemp(dir)) SKIP("no temp dir");
    snprintf(ckdir, sizeof ckdir, "%s/checkpoint", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    mkdir(ckdir, 0700);
    ac_err e = {{0}};
    seen s1, s2;
    json_t *r1 = NULL, *r2 = NULL;
    const char *what = "";
    CHECK(run_spec("spec-d", 0, 4096, &s1, &r1, &e) == 0, "first run: %s", e.msg);
    if (!r1) return;
    CHECK(s1.ndistill[0] > 0 && s1.ndistill[1] > 0 && s1.narms_restored == 0, "first run: distill events %d, %d",
          s1.ndistill[0], s1.ndistill[1]);
    const char *arms[] = {"minitron", "autocompress"};
    char p[200];
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/distill.%s.ckpt", ckdir, arms[i]);
        CHECK(stat(p, &st) == 0, "no checkpoint %s", p);
        snprintf(p, sizeof p, "%s/distill.%s.model/config.json", ckdir, arms[i]);
        CHECK(stat(p, &st) == 0, "no student %s", p);
    }
    json_t *m1 = json_object_get(r1, "minitron"), *a1 = json_object_get(r1, "autocompress");
    CHECK(json_object_get(m1, "distill") && json_object_get(a1, "distill"), "the first run's arms have no distill");
    snprintf(p, sizeof p, "%s/distill.minitron.ckpt", ckdir);
    CHECK(unlink(p) == 0, "cannot remove %s", p);
    CHECK(run_spec("spec-d", 0, 4096, &s2, &r2, &e) == 0, "second run: %s", e.msg);
    if (r2) {
        json_t *rs = json_object_get(r2, "resumed_stages"), *m2 = json_object_get(r2, "minitron"),
               *a2 = json_object_get(r2, "autocompress");
        char *t = json_dumps(rs, JSON_COMPACT);
        CHECK(s2.ndistill[0] > 0 && s2.ndistill[1] == 0 && s2.narms_restored == 1 && json_array_size(rs) == 4 &&
                  !strcmp(json_string_value(json_array_get(rs, 3)), "distill.autocompress"),
              "second run: distill events %d, %d; resumed %s", s2.ndistill[0], s2.ndistill[1], t ? t : "?");
        free(t);
        CHECK(same_outcome(r1, r2, &what), "the resumed run's %s differs", what);
        CHECK(json_equal(json_object_get(a1, "distill"), json_object_get(a2, "distill")) &&
                  json_equal(json_object_get(a1, "perplexity_pruned"), json_object_get(a2, "perplexity_pruned")),
              "the restored arm's distill fields differ");
        CHECK(json_equal(json_object_get(json_object_get(m1, "distill"), "loss_last"),
                         json_object_get(json_object_get(m2, "distill"), "loss_last")),
              "the distilled-again arm's last loss differs");
    }
    /* what the worker does once the job has its result: the students go, the stage files stay */
    ac_job_release_checkpoints(ckdir);
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/distill.%s.model", ckdir, arms[i]);
        CHECK(stat(p, &st) != 0, "%s is still there", p);
        snprintf(p, sizeof p, "%s/distill.%s.ckpt", ckdir, arms[i]);
        CHECK(stat(p, &st) != 0, "%s is still there", p);
    }
    snprintf(p, sizeof p, "%s/search.ckpt", ckdir);
    CHECK(stat(p, &st) == 0, "the release removed %s", p);
    json_decref(r1);
    json_decref(r2);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) fprintf(stderr, "cannot remove %s\n", dir);
}

/* ------------------------------------------------------------- MoE and hybrid */

/* 1 when files a and b hold the same bytes. */
static int same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb, ca, cb;
    while (same && (ca = fgetc(fa)) == (cb = fgetc(fb)))
        if (ca == EOF) break;
    if (same && ca != cb) same = 0;
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

/* tiny's tokenizer cut to the ids below vocab (its 256 bytes and the first
 * merges, whose tokens come in merge order), without its added
 * end-of-text token, at dst: the fixtures' vocabulary is smaller. */
static int cut_tokenizer(const char *src, const char *dst, int vocab) {
    json_error_t je;
    json_t *t = json_load_file(src, 0, &je);
    json_t *model = json_object_get(t, "model"), *v = json_object_get(model, "vocab"),
           *merges = json_object_get(model, "merges"), *kept = json_array(), *x;
    if (!json_is_object(v) || !json_is_array(merges) || !kept) {
        json_decref(t);
        json_decref(kept);
        return -1;
    }
    const char *k;
    void *tmp;
    json_object_foreach_safe(v, tmp, k, x) if (json_integer_value(x) >= vocab) json_object_del(v, k);
    size_t i;
    json_array_foreach(merges, i, x) { /* "a b": kept when a, b and ab are all still tokens */
        const char *m = json_string_value(x), *sp = m ? strchr(m, ' ') : NULL;
        if (!sp) continue;
        char a[256], b[256], ab[512];
        snprintf(a, sizeof a, "%.*s", (int)(sp - m), m);
        snprintf(b, sizeof b, "%s", sp + 1);
        snprintf(ab, sizeof ab, "%s%s", a, b);
        if (json_object_get(v, a) && json_object_get(v, b) && json_object_get(v, ab))
            json_array_append(kept, x);
    }
    json_object_set_new(model, "merges", kept);
    json_object_set_new(t, "added_tokens", json_array());
    int rc = json_dump_file(t, dst, 0);
    json_decref(t);
    return rc;
}

/* build/fixtures/models/NAME with a tokenizer into dst; *params: its parameters. */
static int fixture_model(const char *name, const char *dst, double *params) {
    char src[1100], tok[1100], cmd[2600], p[1200];
    snprintf(cmd, sizeof cmd, "fixtures/models/%s", name);
    ck_build_path(src, sizeof src, cmd);
    ck_build_path(tok, sizeof tok, "models/tiny/tokenizer.json");
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s/config.json' '%s/model.safetensors' '%s/'", dst, src, src, dst);
    if (system(cmd)) return -1;
    ac_arch a;
    ac_err e;
    if (ac_arch_load(dst, &a, &e)) return -1;
    *params = ac_arch_params(&a);
    int vocab = a.vocab;
    ac_arch_free(&a);
    snprintf(p, sizeof p, "%s/tokenizer.json", dst);
    return cut_tokenizer(tok, p, vocab);
}

/* The stages a run emitted, "name" or "name*" (restored), joined by spaces. */
static void stage_list(const seen *s, char *buf, size_t n) {
    buf[0] = 0;
    for (int i = 0; i < s->nstages; i++)
        snprintf(buf + strlen(buf), n - strlen(buf), "%s%s%s", i ? " " : "", s->stages[i], s->resumed[i] ? "*" : "");
}

static int has_ckpt(const char *ckd, const char *name) {
    char p[300];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", ckd, name);
    return stat(p, &st) == 0;
}

/* The arms' distillation fields (and their held-out perplexity before it) equal. */
static int same_distill(json_t *a, json_t *b) {
    const char *arms[] = {"minitron", "autocompress"};
    for (int i = 0; i < 2; i++) {
        json_t *x = json_object_get(a, arms[i]), *y = json_object_get(b, arms[i]);
        json_t *dx = json_object_get(json_object_get(x, "distill"), "loss_last"),
               *dy = json_object_get(json_object_get(y, "distill"), "loss_last");
        if (!dx || !json_equal(dx, dy) ||
            !json_equal(json_object_get(x, "perplexity_pruned"), json_object_get(y, "perplexity_pruned")))
            return 0;
    }
    return 1;
}

/* Fixture NAME compressed to frac of its parameters, with distillation:
 * A) an uninterrupted run (checkpoints in ckA); B) a run stopped after its
 * search (checkpoints in ckB); C) B's job run again: calibrate, profile and
 * search restored, no search event, both arms distilled, and A's
 * structures, predictions, perplexities (before and after distillation),
 * chosen arm and exported config.json and weights; D) A's job run again:
 * the three stages and both distilled arms restored, A's outcome again.
 * With faults: E) ckB's search.ckpt marked as format version 01 is not
 * used (the log names the version) and the search runs again and writes a
 * version-02 file; F) ckB's calibrate.ckpt cut in half is not used; G)
 * ckA's files under another key are not used (E-G stop once the refusal
 * was said). */
static void resume_family(const char *name, double frac, const char *search, int faults) {
    char d[64] = "/tmp/ac_test_ckpt_XXXXXX", fx[1100];
    snprintf(fx, sizeof fx, "fixtures/models/%s/config.json", name);
    char probe[1200];
    ck_build_path(probe, sizeof probe, fx);
    struct stat st;
    if (stat(probe, &st)) SKIP("no fixture %s (make fixtures)", name);
    ck_build_path(probe, sizeof probe, "models/tiny/tokenizer.json");
    if (stat(probe, &st)) SKIP("no tiny model (make tiny-model)");
    if (!mkdtemp(d)) SKIP("no temp dir");
    char model[128], ckA[128], ckB[128], outA[128], outC[128], outX[128];
    snprintf(model, sizeof model, "%s/model", d);
    snprintf(ckA, sizeof ckA, "%s/ckA", d);
    snprintf(ckB, sizeof ckB, "%s/ckB", d);
    snprintf(outA, sizeof outA, "%s/outA", d);
    snprintf(outC, sizeof outC, "%s/outC", d);
    snprintf(outX, sizeof outX, "%s/outX", d);
    mkdir(ckA, 0700);
    mkdir(ckB, 0700);
    double params = 0;
    ac_err e = {{0}};
    seen s;
    json_t *rA = NULL, *r = NULL;
    char sl[400], pa[300], pb[300];
    const char *what = "";
    CHECK(fixture_model(name, model, &params) == 0, "cannot make %s", model);
    job_opts o = {model, ckA, outA, "spec-moe", STOP_NEVER, 2048, frac * params, 64, 16, 64, 4, search};

    /* A: uninterrupted */
    CHECK(run_job(&o, &s, &rA, &e) == 0, "%s: first run: %s", name, e.msg);
    if (!rA) goto out;
    CHECK(s.nresumed == 0 && s.nsearch > 0 && s.ndistill[0] > 0 && s.ndistill[1] > 0, "%s: first run", name);
    CHECK(has_ckpt(ckA, "calibrate.ckpt") && has_ckpt(ckA, "profile.ckpt") && has_ckpt(ckA, "search.ckpt") &&
              has_ckpt(ckA, "distill.minitron.ckpt") && has_ckpt(ckA, "distill.autocompress.model/config.json"),
          "%s: the first run's checkpoints are missing", name);
    const char *ch = json_string_value(json_object_get(rA, "chosen"));
    printf("  %s: %.0f parameters, limit %.0f; chosen %s, perplexity %.4f\n", name, params, o.max_params,
           ch ? ch : "?", json_number_value(json_object_get(json_object_get(rA, ch ? ch : ""), "perplexity")));

    /* B: stopped after its search */
    o.ckdir = ckB;
    o.out = outX;
    o.stop = STOP_AFTER_SEARCH;
    CHECK(run_job(&o, &s, &r, &e) != 0 && !r && strstr(e.msg, "cancelled"), "%s: the stopped run: %s", name, e.msg);
    stage_list(&s, sl, sizeof sl);
    CHECK(!strcmp(sl, "load calibrate profile search") && has_ckpt(ckB, "search.ckpt") &&
              !has_ckpt(ckB, "distill.minitron.ckpt"),
          "%s: the stopped run's stages: %s", name, sl);
    json_decref(r);
    r = NULL;

    /* C: B's job again */
    o.out = outC;
    o.stop = STOP_NEVER;
    CHECK(run_job(&o, &s, &r, &e) == 0, "%s: resumed run: %s", name, e.msg);
    stage_list(&s, sl, sizeof sl);
    CHECK(!strncmp(sl, "load calibrate* profile* search* prune distill", 46) && s.nsearch == 0 &&
              s.narms_restored == 0 && s.ndistill[0] > 0 && s.ndistill[1] > 0,
          "%s: resumed run's stages: %s (%d search events)", name, sl, s.nsearch);
    if (r) {
        CHECK(same_outcome(rA, r, &what), "%s: the resumed run's %s differs", name, what);
        CHECK(same_distill(rA, r), "%s: the resumed run's distillation differs", name);
        snprintf(pa, sizeof pa, "%s/model.safetensors", outA);
        snprintf(pb, sizeof pb, "%s/model.safetensors", outC);
        CHECK(same_file(pa, pb), "%s: the exported weights differ", name);
        snprintf(pa, sizeof pa, "%s/config.json", outA);
        snprintf(pb, sizeof pb, "%s/config.json", outC);
        CHECK(same_file(pa, pb), "%s: the exported config.json differs", name);
    }
    json_decref(r);
    r = NULL;

    /* D: A's job again: the distilled arms restored too */
    o.ckdir = ckA;
    o.out = outX;
    CHECK(run_job(&o, &s, &r, &e) == 0, "%s: run with distilled arms: %s", name, e.msg);
    CHECK(s.nresumed == 3 && s.narms_restored == 2 && s.ndistill[0] == 0 && s.ndistill[1] == 0,
          "%s: %d stages, %d arms restored, distill events %d %d", name, s.nresumed, s.narms_restored, s.ndistill[0],
          s.ndistill[1]);
    if (r) {
        CHECK(same_outcome(rA, r, &what), "%s: the run with restored arms: %s differs", name, what);
        CHECK(same_distill(rA, r), "%s: the restored arms' distillation fields differ", name);
    }
    json_decref(r);
    r = NULL;
    if (!faults) goto out;

    /* E: a version-01 search.ckpt: not read; the search runs again and writes version 02 */
    snprintf(pa, sizeof pa, "%s/search.ckpt", ckB);
    FILE *f = fopen(pa, "r+b");
    CHECK(f && fwrite("ACCKPT01", 1, 8, f) == 8, "cannot mark %s", pa);
    if (f) fclose(f);
    o.ckdir = ckB;
    o.stop = STOP_ON_REFUSAL;
    CHECK(run_job(&o, &s, &r, &e) != 0 && !r, "%s: the run on a version-01 file was not stopped", name);
    stage_list(&s, sl, sizeof sl);
    CHECK(!strcmp(sl, "load calibrate* profile* search") && s.nsearch > 0 && strstr(s.why, "format version 01"),
          "%s: version 01: %s (%s)", name, sl, s.why);
    char magic[9] = "";
    f = fopen(pa, "rb");
    CHECK(f && fread(magic, 1, 8, f) == 8 && !strcmp(magic, "ACCKPT03"), "%s: search.ckpt not rewritten: %s", name,
          magic);
    if (f) fclose(f);
    json_decref(r);
    r = NULL;

    /* F: a calibrate.ckpt cut in the middle of its importance rows */
    snprintf(pa, sizeof pa, "%s/calibrate.ckpt", ckB);
    CHECK(stat(pa, &st) == 0 && truncate(pa, st.st_size / 2) == 0, "cannot cut %s", pa);
    CHECK(run_job(&o, &s, &r, &e) != 0 && !r, "%s: the run on a cut file was not stopped", name);
    CHECK(s.nresumed == 0 && strstr(s.why, "cannot be read back"), "%s: cut calibrate.ckpt: %d resumed (%s)", name,
          s.nresumed, s.why);
    json_decref(r);
    r = NULL;

    /* G: another key */
    o.ckdir = ckA;
    o.key = "spec-other";
    CHECK(run_job(&o, &s, &r, &e) != 0 && !r, "%s: the run with another key was not stopped", name);
    CHECK(s.nresumed == 0 && strstr(s.why, "another job"), "%s: another key: %d resumed (%s)", name, s.nresumed,
          s.why);
    json_decref(r);
    r = NULL;
out:
    json_decref(rA);
    if (ck_rmtree(d)) fprintf(stderr, "cannot remove %s\n", d);
}

/* Qwen3-MoE (BF16; MoE layers 0 and 2, a dense one between): experts and
 * each expert's channels in the importance and the gate-score orders. */
static void test_resume_moe(void) { resume_family("qwen3moe_mixed_bf16", 0.75, "{\"prune_hidden\": false, \"prune_expert_ffn\": true}", 1); }

/* nemotron_h (BF16; Mamba, MoE, Mamba, attention, MoE): Mamba heads by
 * group, their channels' scores, and the MoE layers' rows. */
static void test_resume_hybrid(void) { resume_family("nemotronh_moe_bf16", 0.75, NULL, 0); }

int main(void) {
    ck_build_path(tiny, sizeof tiny, "models/tiny");
    RUN(test_resume_from_checkpoints);
    RUN(test_resume_distilled_arms);
    RUN(test_resume_moe);
    RUN(test_resume_hybrid);
    return DONE();
}
