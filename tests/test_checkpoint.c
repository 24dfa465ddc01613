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
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "pipeline/job.h"

static char tiny[1100], dir[64] = "/tmp/ac_test_ckpt_XXXXXX", ckdir[128], out[128];

typedef struct {
    int nstages, nsearch, nresumed;
    int ndistill[2];   /* "distill" step events of the minitron, autocompress arm */
    int narms_restored; /* "distilled arm restored" logs */
    volatile int cancel; /* set once a checkpoint was refused, when stop_on_refusal */
    int stop_on_refusal;
    char stages[16][16];
    char why[600];
} seen;

static void on_event(void *ud, const char *kind, json_t *data) {
    seen *s = ud;
    if (!strcmp(kind, "stage") && s->nstages < 16) {
        snprintf(s->stages[s->nstages], sizeof s->stages[0], "%s", json_string_value(json_object_get(data, "stage")));
        if (json_is_true(json_object_get(data, "resumed"))) s->nresumed++;
        s->nstages++;
    }
    if (!strcmp(kind, "search")) s->nsearch++;
    const char *arm = json_string_value(json_object_get(data, "arm"));
    if (!strcmp(kind, "distill") && arm) s->ndistill[strcmp(arm, "minitron") != 0]++;
    const char *msg = json_string_value(json_object_get(data, "message"));
    if (!strcmp(kind, "log") && msg && !strcmp(msg, "distilled arm restored from its checkpoint")) s->narms_restored++;
    if (!strcmp(kind, "log") && msg && !strcmp(msg, "checkpoint not used")) {
        snprintf(s->why, sizeof s->why, "%s", json_string_value(json_object_get(data, "why")));
        if (s->stop_on_refusal) s->cancel = 1;
    }
}

static int run_spec(const char *key, int stop_on_refusal, long distill_tokens, seen *s, json_t **res, ac_err *e) {
    char calib[1100], held[1100];
    ck_build_path(calib, sizeof calib, "data/calib.txt");
    ck_build_path(held, sizeof held, "data/heldout.txt");
    json_t *spec = json_pack("{s:s,s:s,s:s,s:s,s:{s:s,s:{s:i,s:i,s:i}},s:{s:f},s:{s:i,s:i,s:i},s:i,s:{s:i,s:i}}",
                             "model", tiny, "calibration", calib, "heldout", held, "output", out, "target", "device",
                             "H100", "workload", "batch", 1, "prompt_len", 256, "gen_len", 64, "constraints",
                             "max_params", 1.0e6, "search", "steps", 50, "seed", 3, "dnas_steps", 40,
                             "calibration_tokens", 2048, "eval", "ctx", 64, "windows", 4);
    if (distill_tokens > 0)
        json_object_set_new(spec, "distill", json_pack("{s:I}", "tokens", (json_int_t)distill_tokens));
    static ac_job_spec sp;
    memset(s, 0, sizeof *s);
    s->stop_on_refusal = stop_on_refusal;
    ac_job_ctx ctx = {.emit = on_event, .ud = s, .cancelled = &s->cancel, .threads = 2, .checkpoint_dir = ckdir,
                      .checkpoint_key = key};
    int rc = ac_job_spec_parse(spec, &sp, NULL, e) || ac_job_run(&sp, &ctx, res, e);
    json_decref(spec);
    return rc ? -1 : 0;
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

int main(void) {
    ck_build_path(tiny, sizeof tiny, "models/tiny");
    RUN(test_resume_from_checkpoints);
    RUN(test_resume_distilled_arms);
    return DONE();
}
