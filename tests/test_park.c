/*
 * test_park.c - students parked in files (format/park.h) and a two-arm job
 * that never holds both of its students in memory (pipeline/students_int.h,
 * issue 30 item 8).
 *
 *  - ac_model_park on an owned BF16 model, dense and mixture-of-experts:
 *    every matrix holds the same bytes as an owned copy made before (the
 *    reference), perplexity is bit-identical, no file is left in the
 *    directory, and the process's resident memory (VmRSS) falls by the
 *    matrices' size when parked, rises by it when a forward reads them and
 *    falls again after ac_model_drop_pages. A model it cannot park (a
 *    resident checkpoint, a directory that does not exist) is refused and
 *    left as it was.
 *  - Slicing a student (ac_prune_bf16) of a one-layer mixture-of-experts
 *    model, softmax and nemotron_h, many experts, kept whole: the peak
 *    resident memory over the start stays within the student's bytes plus
 *    4 MiB, and the student holds the source's bytes (the former slicing
 *    gathered a layer's experts into fp32 buffers first: twice the
 *    student's expert bytes over).
 *  - A whole two-arm job in this process on a random BF16 checkpoint whose
 *    matrices dwarf the job's buffers: the peak resident memory of the
 *    prune, evaluate and export stages (VmHWM, reset at each stage event
 *    through /proc/self/clear_refs) over the memory at the start of prune
 *    stays within the larger student's bytes plus a slack smaller than the
 *    smaller student: holding both students at once (as the prune stage did
 *    before, through evaluate) exceeds it. Skips where the kernel cannot
 *    reset the peak.
 */
#include <dirent.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "core/fsafe.h"
#include "format/model_int.h"
#include "format/park.h"
#include "pipeline/job.h"
#include "pipeline/jobspec.h"
#include "runtime/eval.h"
#include "search/slice.h"
#include "synth.h"

#define MIB (1024.0 * 1024.0)

/* A /proc/self/status field in kB (key with its colon: "VmRSS:", "VmHWM:"); -1 when absent. */
static long status_kb(const char *key) {
    char buf[8192];
    FILE *f = fopen("/proc/self/status", "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    const char *p = strstr(buf, key);
    return p ? strtol(p + strlen(key), NULL, 10) : -1;
}

/* Reset VmHWM to the current RSS (Linux >= 4.0): 1 done. */
static int reset_peak(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return 0;
    int ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok;
}

static unsigned long long rng = 88172645463325252ULL;
static float urand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0) * 2 - 1);
}

static void fill(float *p, size_t n, float scale) {
    for (size_t i = 0; p && i < n; i++) p[i] = scale * urand();
}

static void ones(float *p, size_t n) {
    for (size_t i = 0; p && i < n; i++) p[i] = 1;
}

/* A random fp32 model of arch a (matrices ~ 1/sqrt(fan-in), norms 1). */
static int random_model(const ac_arch *a, ac_model *m, ac_err *e) {
    if (ac_model_alloc(m, a, e)) return -1;
    size_t H = a->hidden, V = a->vocab, hd = a->head_dim;
    float s = 1.0f / sqrtf((float)H);
    fill(m->embed, V * H, 1);
    if (m->lm_head != m->embed) fill(m->lm_head, V * H, s);
    ones(m->final_norm, H);
    for (int l = 0; l < a->n_layers; l++) {
        const ac_layer_arch *L = &a->layers[l];
        ac_layer_w *w = &m->L[l];
        for (int k = AC_W_Q; k <= AC_W_D; k++) {
            size_t n;
            float *p = ac_layer_matrix(m, l, (ac_wmat)k, &n);
            fill(p, n, s);
        }
        ones(w->in_norm, H), ones(w->post_norm, H), ones(w->q_norm, hd), ones(w->k_norm, hd);
        if (L->n_experts) {
            size_t E = L->n_experts, Fe = L->expert_ffn;
            fill(w->router, E * H, s);
            for (size_t x = 0; x < E; x++) fill(w->eg[x], Fe * H, s), fill(w->eu[x], Fe * H, s), fill(w->ed[x], H * Fe, s);
        }
    }
    return 0;
}

/* The same, its matrices BF16 and owned (what ac_prune_bf16 makes). */
static int random_bf16(const ac_arch *a, ac_model *m, ac_err *e) {
    return random_model(a, m, e) || ac_model_make_bf16(m, e) ? -1 : 0;
}

/* Every matrix of a model: pointers and element counts (ac_model_each_matrix's order). */
typedef struct {
    int n;
    const void *p[512];
    size_t len[512];
} slots;

static int slot_fn(void *ud, float **p, size_t n) {
    slots *s = ud;
    if (s->n == 512) return -1;
    s->p[s->n] = *p, s->len[s->n++] = n;
    return 0;
}

/* 1 when a and b hold the same matrices, byte for byte (BF16). */
static int same_matrices(ac_model *a, ac_model *b) {
    slots sa = {0}, sb = {0};
    if (ac_model_each_matrix(a, slot_fn, &sa) || ac_model_each_matrix(b, slot_fn, &sb) || sa.n != sb.n || !sa.n)
        return 0;
    for (int i = 0; i < sa.n; i++)
        if (sa.len[i] != sb.len[i] || memcmp(sa.p[i], sb.p[i], sa.len[i] * 2)) return 0;
    return 1;
}

/* Files in dir other than "." and ".." */
static int dir_entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)))
        n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
    if (d) closedir(d);
    return d ? n : -1;
}

static double matrix_bytes(const ac_arch *a) { return 2 * ac_arch_params(a); }

static int ids[512];

/* Park m (owned BF16) beside a reference copy: same bytes, same perplexity, no file left. */
static void park_and_compare(ac_model *m, const char *what) {
    ac_err e;
    ac_model ref;
    char dir[] = "/tmp/ac_test_park_XXXXXX", path[300];
    if (!mkdtemp(dir) || ac_model_to_bf16(m, &ref, &e)) {
        CHECK(0, "%s: setup", what);
        return;
    }
    snprintf(path, sizeof path, "%s/student-%s", dir, what);
    ac_ppl_opts po = {.ctx = 32, .max_windows = 4, .batch = 4};
    ac_ppl_result p0, p1;
    int rc = ac_model_park(m, path, &e);
    CHECK(rc == 0, "%s: park: %s", what, e.msg);
    CHECK(m->wmap && !m->wown && ac_model_wdt(m) == ST_BF16, "%s: parked model is not a mapped BF16 one", what);
    CHECK(dir_entries(dir) == 0, "%s: %d files left in %s", what, dir_entries(dir), dir);
    CHECK(same_matrices(m, &ref), "%s: parked matrices differ from the owned copy", what);
    int ok = ac_perplexity(&ref, ids, 128, &po, NULL, NULL, NULL, &p0, &e) == 0 &&
             ac_perplexity(m, ids, 128, &po, NULL, NULL, NULL, &p1, &e) == 0;
    CHECK(ok && p0.nll == p1.nll && isfinite(p0.nll), "%s: nll parked %.9g vs owned %.9g (%s)", what, p1.nll, p0.nll,
          ok ? "" : e.msg);
    printf("  %s: %.1f MiB parked, nll %.6f both\n", what, matrix_bytes(&m->a) / MIB, p1.nll);
    ac_model_free(&ref);
    rmdir(dir);
}

static void test_park_roundtrip(void) {
    for (int i = 0; i < 512; i++) ids[i] = (int)((i * 7919u + 13) % 700);
    ac_err e;
    ac_model m;
    ac_arch a = mk_arch(3, 64, 16, 4, 2, 96, 768);
    CHECK(random_bf16(&a, &m, &e) == 0, "dense model: %s", e.msg);
    park_and_compare(&m, "dense");
    ac_model_free(&m);
    /* Qwen3-MoE: QK-norm, a dense layer between two of 5 experts (top-2), untied head */
    snprintf(a.model_type, sizeof a.model_type, "qwen3_moe");
    a.qk_norm = 1, a.top_k = 2, a.norm_topk = 1;
    for (int l = 0; l < 3; l += 2) a.layers[l] = (ac_layer_arch){4, 2, 0, 5, 48, 0};
    CHECK(random_bf16(&a, &m, &e) == 0, "MoE model: %s", e.msg);
    park_and_compare(&m, "moe");
    ac_model_free(&m);
    ac_arch_free(&a);
}

static void test_park_refused(void) {
    ac_err e;
    ac_model m, ref;
    ac_arch a = mk_arch(2, 64, 16, 4, 2, 96, 768);
    int ok = random_bf16(&a, &m, &e) == 0 && ac_model_to_bf16(&m, &ref, &e) == 0;
    ac_arch_free(&a);
    CHECK(ok, "setup: %s", e.msg);
    if (!ok) return;
    /* no such directory: refused, the model as it was */
    CHECK(ac_model_park(&m, "/tmp/ac_test_park_no_such_dir/x/student", &e) == -1, "parked into a missing directory");
    CHECK(m.wown && !m.wmap && same_matrices(&m, &ref), "a failed park changed the model");
    /* parked twice, or a model it does not own (a resident checkpoint's mapping): refused */
    char dir[] = "/tmp/ac_test_park_XXXXXX", path[300];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(path, sizeof path, "%s/student", dir);
    CHECK(ac_model_park(&m, path, &e) == 0, "park: %s", e.msg);
    CHECK(ac_model_park(&m, path, &e) == -1, "parked twice");
    CHECK(same_matrices(&m, &ref), "refused second park changed the model");
    ac_model_free(&m);
    char tiny[1100];
    ck_build_path(tiny, sizeof tiny, "models/tiny");
    if (ac_model_load_resident(tiny, &m, &e) == 0) {
        CHECK(ac_model_park(&m, path, &e) == -1, "parked a resident checkpoint's mapping");
        ac_model_free(&m);
    }
    CHECK(dir_entries(dir) == 0, "files left in %s", dir);
    rmdir(dir);
    ac_model_free(&ref);
}

/* Parking gives the matrices' memory back; a forward brings it in; dropping the pages gives it back again. */
static void test_park_memory(void) {
    ac_err e;
    ac_model m;
    ac_arch a = mk_arch(8, 512, 64, 8, 8, 1024, 768);
    double bytes = matrix_bytes(&a); /* ~ 40 MiB */
    int ok = random_bf16(&a, &m, &e) == 0;
    ac_arch_free(&a);
    CHECK(ok, "setup: %s", e.msg);
    if (!ok) return;
    char dir[] = "/tmp/ac_test_park_XXXXXX", path[300];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(path, sizeof path, "%s/student", dir);
    ac_ppl_opts po = {.ctx = 32, .max_windows = 2, .batch = 2};
    ac_ppl_result pr;
    CHECK(ac_perplexity(&m, ids, 64, &po, NULL, NULL, NULL, &pr, &e) == 0, "warm-up: %s", e.msg); /* buffers once */
    malloc_trim(0);
    long r0 = status_kb("VmRSS:");
    ok = ac_model_park(&m, path, &e) == 0;
    CHECK(ok, "park: %s", e.msg);
    malloc_trim(0);
    long r1 = status_kb("VmRSS:");
    CHECK(ok && ac_perplexity(&m, ids, 64, &po, NULL, NULL, NULL, &pr, &e) == 0, "perplexity: %s", e.msg);
    long r2 = status_kb("VmRSS:");
    ac_model_drop_pages(&m);
    long r3 = status_kb("VmRSS:");
    printf("  %.1f MiB of matrices: VmRSS %.1f owned, %.1f parked, %.1f after a forward, %.1f pages dropped (MiB)\n",
           bytes / MIB, r0 / 1024.0, r1 / 1024.0, r2 / 1024.0, r3 / 1024.0);
    double b = bytes / 1024 * 0.8; /* kB, a fifth for pages the forward does not touch and heap slack */
    CHECK(r0 - r1 >= b, "parking freed %ld kB of %.0f", r0 - r1, bytes / 1024);
    CHECK(r2 - r1 >= b, "the forward read %ld kB of the mapping, not %.0f", r2 - r1, bytes / 1024);
    CHECK(r2 - r3 >= b, "dropping the pages freed %ld kB of %.0f", r2 - r3, bytes / 1024);
    ac_model_free(&m);
    rmdir(dir);
}

/* ---- slicing a student: one expert at a time ---- */

static int all_matrix_bytes(void *ud, float **p, size_t n) {
    (void)p;
    *(double *)ud += 2.0 * (double)n;
    return 0;
}

/* ac_prune_bf16 of a one-layer mixture-of-experts model (64 experts of
 * 512 x 256: 48 MiB of BF16 experts) to its own shape: the peak resident
 * memory over the start stays within the student's bytes plus a slack far
 * below the experts' fp32 size (the former slicing filled fp32 buffers for
 * a whole layer's experts, twice the student's expert bytes; the hybrid's a
 * one-layer fp32 model and its BF16 copy) and the student is the source's
 * matrices exactly. Softmax (Qwen3-MoE, with attention) and nemotron_h
 * (shared expert, no gate) layers. */
static void prune_peak(ac_arch *a, const char *what) {
    ac_err e;
    ac_model m, s;
    if (random_bf16(a, &m, &e)) {
        CHECK(0, "%s: setup: %s", what, e.msg);
        return;
    }
    ac_importance imp;
    memset(&imp, 0, sizeof imp);
    int H = a->hidden, nkv = a->layers[0].n_kv_heads, *hid = malloc(sizeof(int) * H), kv[8];
    for (int c = 0; hid && c < H; c++) hid[c] = c;
    for (int g = 0; g < nkv && g < 8; g++) kv[g] = g;
    int *kvo[1] = {kv};
    imp.n_layers = 1, imp.hidden = H, imp.hid_order = hid, imp.kv_order = nkv ? kvo : NULL;
    malloc_trim(0);
    int reset = reset_peak();
    long r0 = status_kb("VmRSS:");
    int rc = hid ? ac_prune_bf16(&m, a, &imp, &s, &e) : -1;
    long peak = status_kb("VmHWM:");
    free(hid);
    CHECK(rc == 0, "%s: ac_prune_bf16: %s", what, e.msg);
    if (rc) {
        ac_model_free(&m);
        return;
    }
    double bytes = 0;
    ac_model_each_matrix(&s, all_matrix_bytes, &bytes);
    double over = (peak - r0) * 1024.0, slack = 4 * MIB;
    printf("  %s: student %.1f MiB, peak over the start %.1f MiB (limit %.1f)\n", what, bytes / MIB, over / MIB,
           (bytes + slack) / MIB);
    CHECK(!reset || over <= bytes + slack, "%s: slicing peaked %.1f MiB over its start, over the student's %.1f MiB + %.1f",
          what, over / MIB, bytes / MIB, slack / MIB);
    CHECK(same_matrices(&s, &m), "%s: the student differs from the source it keeps whole", what);
    ac_model_free(&s);
    ac_model_free(&m);
}

static void test_prune_one_expert_at_a_time(void) {
    if (!reset_peak()) SKIP("this kernel cannot reset the peak RSS (/proc/self/clear_refs)");
    ac_arch a = mk_arch(1, 256, 64, 4, 2, 0, 256);
    snprintf(a.model_type, sizeof a.model_type, "qwen3_moe");
    a.qk_norm = 1, a.top_k = 2, a.norm_topk = 1;
    a.layers[0] = (ac_layer_arch){4, 2, 0, 64, 512, 0};
    prune_peak(&a, "qwen3_moe");
    /* nemotron_h: one MoE layer (no attention), experts without a gate beside a shared expert */
    snprintf(a.model_type, sizeof a.model_type, "nemotron_h");
    a.qk_norm = 0, a.hybrid = 1, a.shared_ffn = 256, a.routed_scale = 1;
    a.ssm_head_dim = 8, a.ssm_state = 16, a.ssm_groups = 1, a.ssm_conv = 4;
    a.layers[0] = (ac_layer_arch){0, 0, 0, 96, 512, 0};
    prune_peak(&a, "nemotron_h");
    ac_arch_free(&a);
}

/* ---- a whole job's memory per stage ---- */

typedef struct {
    char stage[32];
    long start_kb, peak_kb;
} stage_mem;
static stage_mem mem[16];
static int nmem, peak_ok = 1;

static void close_stage(void) {
    if (nmem) mem[nmem - 1].peak_kb = status_kb("VmHWM:");
}

static void mem_emit(void *ud, const char *kind, json_t *data) {
    (void)ud;
    if (strcmp(kind, "stage") || nmem == 16) return;
    close_stage();
    peak_ok &= reset_peak();
    snprintf(mem[nmem].stage, sizeof mem[nmem].stage, "%s", json_string_value(json_object_get(data, "stage")));
    mem[nmem++].start_kb = status_kb("VmRSS:");
}

static const stage_mem *stage_of(const char *name) {
    for (int i = 0; i < nmem; i++)
        if (!strcmp(mem[i].stage, name)) return &mem[i];
    return NULL;
}

/* A random BF16 checkpoint (16 layers of hidden 768, FFN 768, 6 heads of
 * 128, vocab 768 with the tiny model's tokenizer: 129 MiB of matrices) in
 * dir: many thin layers, so that the job's buffers per layer are small
 * beside a student. */
static int make_checkpoint(const char *dir, ac_arch *a, ac_err *e) {
    *a = mk_arch(16, 768, 128, 6, 6, 768, 768);
    ac_model m;
    char from[1100], to[400];
    if (random_model(a, &m, e)) return -1;
    int rc = ac_model_save(&m, dir, ST_BF16, e);
    ac_model_free(&m);
    ck_build_path(from, sizeof from, "models/tiny/tokenizer.json");
    snprintf(to, sizeof to, "%s/tokenizer.json", dir);
    size_t len;
    char *d = rc ? NULL : ac_read_file(from, 1 << 24, &len, e);
    FILE *f = d ? fopen(to, "wb") : NULL;
    rc = !f || fwrite(d, 1, len, f) != len;
    if (f) rc |= fclose(f) != 0;
    free(d);
    malloc_trim(0);
    return rc ? -1 : 0;
}

static void test_job_one_student_at_a_time(void) {
    char calib[1100], held[1100], tok[1100];
    ck_build_path(calib, sizeof calib, "data/calib.txt");
    ck_build_path(held, sizeof held, "data/heldout.txt");
    ck_build_path(tok, sizeof tok, "models/tiny/tokenizer.json");
    if (!ck_exists(calib) || !ck_exists(tok)) SKIP("no tiny model or texts (make tiny-model)");
    if (!reset_peak()) SKIP("this kernel cannot reset the peak RSS (/proc/self/clear_refs)");
    char dir[] = "/tmp/ac_test_park_job_XXXXXX", model[300], out[300];
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    snprintf(model, sizeof model, "%s/model", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    ac_err e;
    ac_arch a;
    mkdir(model, 0755);
    if (make_checkpoint(model, &a, &e)) {
        CHECK(0, "checkpoint: %s", e.msg);
        ac_arch_free(&a);
        ck_rmtree(dir);
        return;
    }
    double P = ac_arch_params(&a);
    json_t *spec = json_pack(
        "{s:s,s:s,s:s,s:s,s:{s:s,s:{s:i,s:i,s:i}},s:{s:f},s:i,s:{s:i,s:i},s:{s:s,s:i}}", "model", model,
        "calibration", calib, "heldout", held, "output", out, "target", "device", "H100", "workload", "batch", 1,
        "prompt_len", 64, "gen_len", 16, "constraints", "max_params", 0.6 * P, "calibration_tokens", 256, "eval",
        "ctx", 64, "windows", 2, "search", "method", "surrogate", "steps", 60);
    static ac_job_spec sp;
    ac_job_ctx ctx = {.emit = mem_emit, .threads = ck_threads()};
    json_t *res = NULL;
    nmem = 0;
    int rc = ac_job_spec_parse(spec, &sp, NULL, &e) || ac_job_run(&sp, &ctx, &res, &e);
    close_stage();
    json_decref(spec);
    CHECK(rc == 0, "job: %s", e.msg);
    CHECK(peak_ok, "the peak RSS could not be reset at every stage");
    if (rc == 0) {
        double sb[2]; /* each student's matrices, bytes (BF16) */
        const char *arms[2] = {"minitron", "autocompress"};
        for (int i = 0; i < 2; i++) {
            ac_arch sa;
            json_t *j = json_object_get(json_object_get(res, arms[i]), "architecture");
            sb[i] = j && ac_arch_from_json(j, &a, &sa, &e) == 0 ? matrix_bytes(&sa) : 0;
            if (j && sb[i] > 0) ac_arch_free(&sa);
        }
        /* the job's own buffers beyond a student: a layer's matrices in fp32 while pruning, the repair's
         * Gram and solve, the engine's activations and KV cache; smaller than either student */
        double slack = 30 * MIB, big = fmax(sb[0], sb[1]), small = fmin(sb[0], sb[1]);
        const stage_mem *pr = stage_of("prune");
        json_t *tm = json_object_get(res, "timings_s");
        printf("  base %.1f MiB; students %.1f (minitron) and %.1f MiB (autocompress); prune stage %.2f s, repaired "
               "layers %lld and %lld\n",
               matrix_bytes(&a) / MIB, sb[0] / MIB, sb[1] / MIB, json_number_value(json_object_get(tm, "prune")),
               json_integer_value(json_object_get(json_object_get(res, "minitron"), "repaired_layers")),
               json_integer_value(json_object_get(json_object_get(res, "autocompress"), "repaired_layers")));
        for (int i = 0; i < nmem; i++)
            printf("  %-9s %6.1f s, start %7.1f MiB, peak %7.1f MiB (%+.1f over prune's start)\n", mem[i].stage,
                   json_number_value(json_object_get(tm, mem[i].stage)), mem[i].start_kb / 1024.0,
                   mem[i].peak_kb / 1024.0, pr ? (mem[i].peak_kb - pr->start_kb) / 1024.0 : 0.0);
        CHECK(small > slack, "the students (%.1f, %.1f MiB) are too small for this test to tell one from two",
              sb[0] / MIB, sb[1] / MIB);
        const char *held_stages[] = {"prune", "evaluate", "export"};
        for (int i = 0; i < 3 && pr; i++) {
            const stage_mem *st = stage_of(held_stages[i]);
            double over = st ? (st->peak_kb - pr->start_kb) * 1024.0 : -1;
            CHECK(st && over <= big + slack,
                  "%s: peak %.1f MiB over prune's start, more than one student (%.1f MiB) and %.0f MiB: both "
                  "students held at once?",
                  held_stages[i], over / MIB, big / MIB, slack / MIB);
        }
        CHECK(pr != NULL, "no prune stage event");
        /* the export is all that stays in the output directory */
        DIR *d = opendir(out);
        struct dirent *de;
        while (d && (de = readdir(d))) CHECK(strncmp(de->d_name, ".student", 8), "%s left in %s", de->d_name, out);
        if (d) closedir(d);
    }
    json_decref(res);
    ac_arch_free(&a);
    ck_rmtree(dir);
}

int main(void) {
    RUN(test_park_roundtrip);
    RUN(test_park_refused);
    RUN(test_park_memory);
    RUN(test_prune_one_expert_at_a_time);
    RUN(test_job_one_student_at_a_time);
    return DONE();
}
