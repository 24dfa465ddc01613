/*
 * test_jobspec.c - the typed job spec: proto/job.schema.json is what the
 * field table generates; defaults are the ones the pipeline used before the
 * table existed (hard-coded below, from the old ac_job_run and
 * ac_engine_profile_from_json); every bounded field of the published schema
 * is rejected just outside its bounds with the error naming that field;
 * target resolution; the path list the daemon's policy walks.
 */
#include <math.h>
#include <string.h>

#include "check.h"
#include "search/constraints.h"
#include "cost/costmodel.h"
#include "pipeline/jobspec.h"
#include "format/safetensors.h"

static json_t *minimal(const char *device) {
    return json_pack("{s:s,s:s,s:{s:s},s:{s:f}}", "model", "/m", "calibration", "/c.txt", "target", "device", device,
                     "constraints", "max_tpot_ms", 5.0);
}

static void test_schema_file_is_generated_from_table(void) {
    char path[1024];
    const char *root = getenv("AC_TEST_ROOT");
    snprintf(path, sizeof path, "%s/proto/job.schema.json", root ? root : ".");
    json_error_t je;
    json_t *file = json_load_file(path, 0, &je), *gen = ac_job_spec_schema();
    CHECK(file != NULL, "%s: %s", path, je.text);
    CHECK(file && json_equal(file, gen), "proto/job.schema.json is stale: regenerate with build/autocompress schema");
    json_decref(file);
    json_decref(gen);
}

/* The dashboard's constraint list (web/constraints.js) is the table's,
 * and the spec's constraints section holds exactly the table's rows: each
 * name parses into the limit the searches read, with the table's bounds. */
static void test_constraint_table_is_the_one_list(void) {
    char path[1024];
    const char *root = getenv("AC_TEST_ROOT");
    snprintf(path, sizeof path, "%s/web/constraints.js", root ? root : ".");
    size_t len = 0;
    ac_err e = {{0}};
    char *file = ac_read_file(path, 1 << 20, &len, &e), *gen = ac_constraint_table_js();
    CHECK(file != NULL, "%s: %s", path, e.msg);
    CHECK(file && gen && !strcmp(file, gen), "web/constraints.js is stale: regenerate with build/autocompress constraints");
    free(file);
    free(gen);

    const ac_field *f = ac_job_spec_fields();
    while (f->name && strcmp(f->name, "constraints")) f++;
    CHECK(f->name && f->type == AC_F_OBJ, "no constraints section");
    if (!f->name) return;
    int n = 0;
    for (const ac_field *g = f->sub; g->name; g++, n++) {
        const ac_constraint *c = ac_constraint_table() + n;
        CHECK(n < AC_NCONSTRAINTS && !strcmp(g->name, c->name) && g->lo == c->lo && g->hi == c->hi,
              "spec field %d (%s) is not the table's row", n, g->name);
        if (n >= AC_NCONSTRAINTS) break;
        json_t *j = minimal("cpu");
        json_object_set_new(j, "constraints", json_pack("{s:f}", c->name, 1.5 * c->lo + 0.25));
        ac_job_spec s;
        CHECK(ac_job_spec_parse(j, &s, NULL, &e) == 0, "%s: %s", c->name, e.msg);
        for (int k = 0; k < AC_NCONSTRAINTS; k++) {
            double want = k == n ? 1.5 * c->lo + 0.25 : 0;
            CHECK(ac_constraint_limit(ac_constraint_table() + k, &s.limits) == want, "%s lands in row %d", c->name, k);
        }
        json_t *back = ac_constraints_json(&s.limits);
        CHECK(json_object_size(back) == 1 && json_real_value(json_object_get(back, c->name)) == 1.5 * c->lo + 0.25,
              "%s: ac_constraints_json", c->name);
        json_decref(back);
        json_decref(j);
    }
    CHECK(n == AC_NCONSTRAINTS, "%d spec fields for %d rows", n, AC_NCONSTRAINTS);

    /* the violation: relative, signed by direction, met at <= 1e-9 */
    const ac_constraint *tpot = NULL, *tps = NULL;
    for (int k = 0; k < AC_NCONSTRAINTS; k++) {
        const ac_constraint *c = ac_constraint_table() + k;
        if (c->m == AC_M_TPOT) tpot = c;
        if (c->m == AC_M_TOKENS_PER_S) tps = c;
    }
    CHECK(tpot && tps && !tpot->ge && tps->ge && !strcmp(tpot->metric, "tpot_ms") && !strcmp(tps->unit, "tokens/s"),
          "directions and names");
    if (!tpot || !tps) return;
    CHECK(ac_constraint_g(tpot, 6, 5) == 6.0 / 5 - 1 && ac_constraint_g(tpot, 4, 5) < 0, "max: %g",
          ac_constraint_g(tpot, 6, 5));
    CHECK(ac_constraint_g(tps, 80, 100) == 1 - 80.0 / 100 && ac_constraint_g(tps, 120, 100) < 0, "min: %g",
          ac_constraint_g(tps, 80, 100));
    CHECK(ac_constraint_dg(tpot, 5) == 0.2 && ac_constraint_dg(tps, 4) == -0.25, "d g / d value");
    CHECK(ac_constraint_met(tpot, 5, 5) && !ac_constraint_met(tpot, 5.001, 5) && ac_constraint_met(tps, 100, 100),
          "met");
}

static void test_defaults_match_the_old_pipeline(void) {
    static ac_job_spec s;
    ac_err e;
    json_t *j = minimal("H100");
    CHECK(ac_job_spec_parse(j, &s, NULL, &e) == 0, "%s", e.msg);
    CHECK(s.search.steps == 300 && s.search.seed == 0 && fabs(s.search.lr - 0.03) < 1e-15, "search defaults");
    /* ffn_multiple defaults to the export target's step: the loaders' 256 grid for deci, 32 otherwise */
    CHECK(s.search.ffn_multiple == 256 && s.search.hidden_multiple == 16 && s.search.prune_hidden == 1,
          "search widths");
    json_object_set_new(j, "search", json_pack("{s:s}", "export_target", "llama"));
    static ac_job_spec s2;
    CHECK(ac_job_spec_parse(j, &s2, NULL, &e) == 0 && s2.search.ffn_multiple == 32, "llama ffn_multiple default");
    CHECK(s.search.target == AC_EXPORT_DECI && s.method == AC_METHOD_AUTOCOMPRESS, "export target / method");
    CHECK(s.eval.ctx == 128 && s.eval.windows == 32 && s.calibration_tokens == 16384 && s.repair == 1, "eval");
    CHECK(s.priority == 0 && s.distill.tokens == 0, "priority, distillation off");
    const ac_workload *w = &s.target.workload;
    CHECK(w->batch == 1 && w->prompt_len == 512 && w->gen_len == 128, "workload %d %d %d", w->batch, w->prompt_len,
          w->gen_len);
    const ac_engine_profile *p = &s.target.engine;
    CHECK(!strcmp(p->name, "vllm") && p->w_bytes == 2 && p->kv_bytes == 2 && p->act_bytes == 2 && p->block_size == 16,
          "gpu profile %s %d %d %d", p->name, p->w_bytes, p->kv_bytes, p->block_size);
    CHECK(p->mem_util == 0.9 && p->overhead_ms == 0.3 && p->overhead_gib == 1.5, "gpu profile figures");
    CHECK(!strcmp(s.heldout, "/c.txt"), "heldout defaults to calibration: %s", s.heldout);
    CHECK(s.limits.max_tpot_ms == 5 && s.limits.max_ttft_ms == 0 && s.limits.min_tokens_per_s == 0, "limits");
    CHECK(s.target.dev.kind == AC_TARGET_PROFILE && !strcmp(s.target.dev.profile->name, "H100"), "resolved H100");
    json_decref(j);
    j = minimal("cpu");
    json_object_set_new(json_object_get(j, "target"), "engine",
                        json_pack("{s:s,s:s,s:i}", "weights_dtype", "fp8", "kv_dtype", "fp16", "block_size", 32));
    CHECK(ac_job_spec_parse(j, &s, NULL, &e) == 0, "%s", e.msg);
    p = &s.target.engine;
    CHECK(!strcmp(p->name, "autocompress-cpu") && p->w_bytes == 1 && p->act_bytes == 2 && p->kv_bytes == 2 &&
              p->block_size == 32,
          "cpu profile with overrides %s %d %d %d %d", p->name, p->w_bytes, p->act_bytes, p->kv_bytes, p->block_size);
    CHECK(p->mem_util == 0.8 && p->overhead_ms == 0 && p->overhead_gib == 0, "cpu profile figures");
    json_decref(j);
}

static int parse_fails_at(json_t *spec, const char *want, ac_err *e) {
    static ac_job_spec s;
    const char *f = NULL;
    return ac_job_spec_parse(spec, &s, &f, e) != 0 && f && !strcmp(f, want);
}

/* Walk the published schema: every numeric bound, just outside, must be
 * rejected naming the field; an unknown member of every object likewise. */
static void probe(json_t *root, json_t *holder, json_t *props, const char *prefix, int *probed) {
    const char *k;
    json_t *p;
    json_object_foreach(props, k, p) {
        char field[256];
        ac_err e;
        snprintf(field, sizeof field, "%s%s", prefix, k);
        json_t *saved = json_object_get(holder, k) ? json_deep_copy(json_object_get(holder, k)) : NULL;
        if (json_object_get(p, "properties")) {
            if (!saved) json_object_set_new(holder, k, json_object());
            json_t *sub = json_object_get(holder, k);
            char unk[300], pre[300];
            snprintf(unk, sizeof unk, "%s.no_such_field", field);
            snprintf(pre, sizeof pre, "%s.", field);
            json_object_set_new(sub, "no_such_field", json_true());
            CHECK(parse_fails_at(root, unk, &e), "%s not named: %s", unk, e.msg);
            json_object_del(sub, "no_such_field");
            probe(root, sub, json_object_get(p, "properties"), pre, probed);
        } else {
            json_t *bounds[2] = {json_object_get(p, "minimum"), json_object_get(p, "maximum")};
            for (int side = 0; side < 2; side++) {
                json_t *b = bounds[side];
                if (!b) continue;
                double x = json_number_value(b), d = side ? 1 : -1;
                json_object_set_new(holder, k,
                                    json_is_integer(b) ? json_integer(json_integer_value(b) + (json_int_t)d)
                                                       : json_real(x + d * (fabs(x) * 1e-6 + 1e-12)));
                CHECK(parse_fails_at(root, field, &e), "%s just outside its %s bound: %s", field,
                      side ? "upper" : "lower", e.msg);
                (*probed)++;
            }
            if (json_object_get(p, "enum")) {
                json_object_set_new(holder, k, json_string("no-such-value"));
                CHECK(parse_fails_at(root, field, &e), "%s accepts an unlisted value: %s", field, e.msg);
                (*probed)++;
            }
        }
        if (saved)
            json_object_set_new(holder, k, saved);
        else
            json_object_del(holder, k);
    }
}

static void test_every_bound_names_its_field(void) {
    json_t *sch = ac_job_spec_schema(), *spec = minimal("cpu");
    int probed = 0;
    probe(spec, spec, json_object_get(sch, "properties"), "", &probed);
    CHECK(probed >= 40, "only %d bounds probed", probed);
    static ac_job_spec s;
    ac_err e;
    CHECK(ac_job_spec_parse(spec, &s, NULL, &e) == 0, "spec restored: %s", e.msg);
    json_decref(spec);
    json_decref(sch);
}

static void test_errors_and_targets(void) {
    ac_err e;
    json_t *j = minimal("cpu");
    json_object_set_new(j, "constraints", json_object());
    CHECK(parse_fails_at(j, "constraints", &e) && strstr(e.msg, "max_tpot_ms"), "empty constraints: %s", e.msg);
    json_object_set_new(j, "constraints", json_pack("{s:s}", "max_tpot_ms", "5"));
    CHECK(parse_fails_at(j, "constraints.max_tpot_ms", &e) && strstr(e.msg, "must be a number"), "type: %s", e.msg);
    json_object_set_new(j, "constraints", json_pack("{s:f}", "max_params", 1e6));
    json_object_del(j, "model");
    CHECK(parse_fails_at(j, "model", &e) && strstr(e.msg, "missing required"), "missing: %s", e.msg);
    json_object_set_new(j, "model", json_string("/m"));
    json_object_set_new(j, "search", json_pack("{s:f}", "steps", 10.0));
    CHECK(parse_fails_at(j, "search.steps", &e) && strstr(e.msg, "integer"), "integer: %s", e.msg);
    json_object_del(j, "search");
    static const struct {
        const char *dev;
        int ok, kind, ordinal;
    } T[] = {{"cpu", 1, AC_TARGET_CPU, -1},
             {"cuda", 1, AC_TARGET_CUDA, -1},
             {"cuda:3", 1, AC_TARGET_CUDA, 3},
             {"h100", 1, AC_TARGET_PROFILE, -1},
             {"RTX 4090", 1, AC_TARGET_PROFILE, -1},
             {"cuda:", 0, 0, 0},
             {"cuda:x", 0, 0, 0},
             {"cuda1", 0, 0, 0},
             {"cuda:1234", 0, 0, 0},
             {"TPUv9", 0, 0, 0},
             {"cpu0", 0, 0, 0}};
    for (size_t i = 0; i < sizeof T / sizeof *T; i++) {
        static ac_job_spec s;
        const char *f = NULL;
        json_object_set_new(json_object_get(j, "target"), "device", json_string(T[i].dev));
        int rc = ac_job_spec_parse(j, &s, &f, &e);
        if (T[i].ok)
            CHECK(rc == 0 && (int)s.target.dev.kind == T[i].kind && s.target.dev.ordinal == T[i].ordinal, "%s: %s",
                  T[i].dev, e.msg);
        else
            CHECK(rc != 0 && f && !strcmp(f, "target.device"), "%s accepted (field %s)", T[i].dev, f ? f : "-");
    }
    json_decref(j);
}

/* The weights' dtype a target's predictions are for and its CPU table:
 * a cpu target without engine.weights_dtype takes a BF16 checkpoint's
 * (w_bytes 2, the BF16 table), an fp32 or F16 one keeps fp32; a named
 * fp16 on the CPU is fp16 with the fp32 table (the engine has no F16
 * kernels); GPU profiles default to bf16. */
static void test_weights_dtype_for_checkpoint(void) {
    static ac_job_spec s;
    ac_err e;
    ac_engine_profile p;
    json_t *j = minimal("cpu");
    CHECK(ac_job_spec_parse(j, &s, NULL, &e) == 0, "%s", e.msg);
    CHECK(!strcmp(ac_target_weights_dtype(&s.target, ST_BF16), "bf16") &&
              !strcmp(ac_target_weights_dtype(&s.target, ST_F32), "fp32") &&
              !strcmp(ac_target_weights_dtype(&s.target, ST_F16), "fp32"),
          "cpu, unnamed: %s %s %s", ac_target_weights_dtype(&s.target, ST_BF16),
          ac_target_weights_dtype(&s.target, ST_F32), ac_target_weights_dtype(&s.target, ST_F16));
    ac_target_engine_for(&s.target, ST_BF16, &p);
    CHECK(p.w_bytes == 2 && p.act_bytes == 4 && p.kv_bytes == 4, "cpu on BF16: %d %d %d", p.w_bytes, p.act_bytes,
          p.kv_bytes);
    ac_target_engine_for(&s.target, ST_F16, &p);
    CHECK(p.w_bytes == 4, "cpu on F16: %d", p.w_bytes);
    CHECK(!strcmp(ac_target_table_dtype(&s.target, ST_BF16), "bf16") &&
              !strcmp(ac_target_table_dtype(&s.target, ST_F32), "fp32"),
          "cpu tables: %s %s", ac_target_table_dtype(&s.target, ST_BF16), ac_target_table_dtype(&s.target, ST_F32));
    json_decref(j);
    j = minimal("cpu");
    json_object_set_new(json_object_get(j, "target"), "engine", json_pack("{s:s}", "weights_dtype", "fp16"));
    CHECK(ac_job_spec_parse(j, &s, NULL, &e) == 0, "%s", e.msg);
    CHECK(!strcmp(ac_target_weights_dtype(&s.target, ST_BF16), "fp16") &&
              !strcmp(ac_cost_cpu_table_dtype(ac_target_weights_dtype(&s.target, ST_BF16)), "fp32"),
          "cpu fp16: %s", ac_target_weights_dtype(&s.target, ST_BF16));
    CHECK(!strcmp(ac_target_table_dtype(&s.target, ST_BF16), "fp32"), "cpu fp16 table");
    ac_target_engine_for(&s.target, ST_BF16, &p);
    CHECK(p.w_bytes == 2, "named fp16 stays 2 bytes: %d", p.w_bytes);
    json_decref(j);
    j = minimal("H100");
    CHECK(ac_job_spec_parse(j, &s, NULL, &e) == 0, "%s", e.msg);
    CHECK(!strcmp(ac_target_weights_dtype(&s.target, ST_F32), "bf16"), "H100 default");
    CHECK(!strcmp(ac_target_table_dtype(&s.target, ST_F32), "bf16"), "H100 roofline in bf16");
    json_decref(j);
}

static void test_paths_for_the_daemon(void) {
    static ac_job_spec s;
    ac_err e;
    json_t *j = minimal("cpu");
    json_object_set_new(j, "output", json_string("/o"));
    json_object_set_new(j, "distill", json_pack("{s:i,s:s}", "tokens", 1000, "text", "/d.txt"));
    CHECK(ac_job_spec_parse(j, &s, NULL, &e) == 0, "%s", e.msg);
    const char *want[][2] = {{"model", "/m"},
                             {"calibration", "/c.txt"},
                             {"heldout", "/c.txt"},
                             {"output", "/o"},
                             {"distill.text", "/d.txt"}};
    const int flags[] = {AC_F_PATH_DIR, AC_F_PATH_FILE, AC_F_PATH_FILE, AC_F_PATH_OUT, AC_F_PATH_FILE};
    const char *f, *p;
    int fl, i = 0;
    for (; ac_job_spec_path(&s, i, &f, &p, &fl); i++)
        CHECK(i < 5 && !strcmp(f, want[i][0]) && !strcmp(p, want[i][1]) && fl == flags[i], "path %d: %s=%s (%d)", i, f,
              p, fl);
    CHECK(i == 5, "%d paths", i);
    CHECK(s.distill.tokens == 1000 && s.distill.seq_len == 128 && s.distill.temperature == 1, "distill section");
    json_decref(j);
}

/* eval.tasks: an array of objects in the field table; each path is a path
 * field for the daemon's policy, and a bad entry names its index. */
static void test_eval_tasks(void) {
    static ac_job_spec s;
    ac_err e;
    const char *field;
    json_t *j = minimal("cpu");
    json_object_set_new(j, "eval", json_pack("{s:i,s:[{s:s,s:s},{s:s,s:s}]}", "ctx", 64, "tasks", "name", "hella",
                                             "path", "/h.jsonl", "name", "arc_e", "path", "/a.jsonl"));
    CHECK(ac_job_spec_parse(j, &s, NULL, &e) == 0, "%s", e.msg);
    CHECK(s.eval.ntasks == 2 && !strcmp(s.eval.tasks[1].name, "arc_e") && s.eval.ctx == 64, "tasks parsed");
    const char *f, *p;
    int fl, found = 0;
    for (int i = 0; ac_job_spec_path(&s, i, &f, &p, &fl); i++)
        if (!strncmp(f, "eval.tasks", 10)) {
            const char *want = found ? "eval.tasks[1].path" : "eval.tasks[0].path";
            CHECK(!strcmp(f, want) && !strcmp(p, found ? "/a.jsonl" : "/h.jsonl") && fl == AC_F_PATH_FILE,
                  "path %s=%s", f, p);
            found++;
        }
    CHECK(found == 2, "%d task paths", found);
    json_decref(j);
    struct {
        const char *eval, *field;
    } bad[] = {
        {"{\"tasks\": [{\"name\": \"a\"}]}", "eval.tasks[0].path"},
        {"{\"tasks\": [{\"name\": \"a\", \"path\": \"/a\"}, {\"name\": \"a\", \"path\": \"/b\"}]}",
         "eval.tasks[1].name"},
        {"{\"tasks\": [{\"name\": \"a b\", \"path\": \"/a\"}]}", "eval.tasks[0].name"},
        {"{\"tasks\": [{\"name\": \"a\", \"path\": \"/a\", \"split\": 1}]}", "eval.tasks[0].split"},
        {"{\"tasks\": [\"/a\"]}", "eval.tasks[0]"},
        {"{\"tasks\": {\"name\": \"a\"}}", "eval.tasks"},
        {"{\"tasks\": [{},{},{},{},{},{},{},{},{}]}", "eval.tasks"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        j = minimal("cpu");
        json_object_set_new(j, "eval", json_loads(bad[i].eval, 0, NULL));
        field = NULL;
        CHECK(ac_job_spec_parse(j, &s, &field, &e) != 0 && field && !strcmp(field, bad[i].field), "%s: field %s (%s)",
              bad[i].eval, field ? field : "(null)", e.msg);
        json_decref(j);
    }
}

/* minitron: Model-Optimizer's defaults; score task resolves to an
 * eval.tasks entry (the named one, else the first), and a task the spec
 * does not list, or task scoring without eval.tasks, names its field. */
static void test_minitron_section(void) {
    static ac_job_spec s;
    ac_err e;
    const char *field;
    json_t *j = minimal("cpu");
    CHECK(ac_job_spec_parse(j, &s, NULL, &e) == 0, "%s", e.msg);
    CHECK(s.minitron.score == 0 && s.minitron.task_index == -1 && s.minitron.opts.top_k == 10 &&
              s.minitron.opts.max_width_pruning == 0.40 && s.minitron.opts.max_depth_pruning == 0.20 &&
              s.minitron.opts.hidden_divisor <= 0 && s.minitron.opts.score_norm == 0,
          "defaults: loss, top_k 10, caps 0.40 / 0.20, divisors automatic");
    json_decref(j);
    const char *eval = "{\"tasks\": [{\"name\": \"hella\", \"path\": \"/h\"}, {\"name\": \"mmlu\", \"path\": \"/m\"}]}";
    struct {
        const char *minitron;
        int with_tasks, index;
        const char *field;
    } cases[] = {
        {"{\"score\": \"task\"}", 1, 0, NULL},
        {"{\"score\": \"task\", \"task\": \"mmlu\", \"metric\": \"acc_norm\"}", 1, 1, NULL},
        {"{\"score\": \"loss\", \"top_k\": 4, \"ffn_hidden_size_divisor\": 512}", 1, -1, NULL},
        {"{\"score\": \"task\", \"task\": \"arc\"}", 1, -1, "minitron.task"},
        {"{\"score\": \"task\"}", 0, -1, "minitron.score"},
        {"{\"task\": \"mmlu\"}", 1, -1, NULL}, /* read with score task only */
        {"{\"score\": \"mmlu\"}", 1, -1, "minitron.score"},
        {"{\"max_width_pruning\": 1.0}", 1, -1, "minitron.max_width_pruning"},
        {"{\"num_layers_divisor\": 0}", 1, -1, "minitron.num_layers_divisor"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        j = minimal("cpu");
        if (cases[i].with_tasks) json_object_set_new(j, "eval", json_loads(eval, 0, NULL));
        json_object_set_new(j, "minitron", json_loads(cases[i].minitron, 0, NULL));
        field = NULL;
        int rc = ac_job_spec_parse(j, &s, &field, &e);
        if (cases[i].field)
            CHECK(rc != 0 && field && !strcmp(field, cases[i].field), "%s: field %s (%s)", cases[i].minitron,
                  field ? field : "(null)", e.msg);
        else
            CHECK(rc == 0 && s.minitron.task_index == cases[i].index, "%s: %s, task %d", cases[i].minitron,
                  rc ? e.msg : "ok", s.minitron.task_index);
        json_decref(j);
    }
    j = minimal("cpu");
    json_object_set_new(j, "eval", json_loads(eval, 0, NULL));
    json_object_set_new(j, "minitron", json_loads(cases[1].minitron, 0, NULL));
    CHECK(ac_job_spec_parse(j, &s, NULL, &e) == 0 && s.minitron.opts.score_norm == 1, "metric acc_norm");
    json_decref(j);
}

int main(void) {
    RUN(test_schema_file_is_generated_from_table);
    RUN(test_constraint_table_is_the_one_list);
    RUN(test_defaults_match_the_old_pipeline);
    RUN(test_every_bound_names_its_field);
    RUN(test_errors_and_targets);
    RUN(test_paths_for_the_daemon);
    RUN(test_eval_tasks);
    RUN(test_minitron_section);
    RUN(test_weights_dtype_for_checkpoint);
    return DONE();
}
