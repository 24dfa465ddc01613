/*
 * jobspec.c - the job spec's field table and the one parser that walks it
 * (see jobspec.h). Every rule of a field (type, range, default, allowed
 * values, where it is stored) is one line below; validation, defaults, the
 * error's field name and the JSON schema all come from those lines.
 * Unknown fields are errors, as the design asks.
 */
#include "pipeline/jobspec.h"

#include <assert.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "format/deci.h"
#include "cost/engines.h"
#include "compress/distill.h"
#include "core/dtype.h"
#include "core/fsafe.h"
#include "format/gguf.h"
#include "pipeline/job.h"
#include "pipeline/jobcheck.h"
#include "runtime/tasks.h"

_Static_assert(sizeof(ac_method) == sizeof(int) && sizeof(ac_export_target) == sizeof(int), "enums are stored as int");
_Static_assert(AC_METHOD_MINITRON == 1 && AC_EXPORT_LLAMA == 1 && AC_EXPORT_GGUF == 2,
               "enum lists below follow the enums");

static const char *const METHODS[] = {"autocompress", "minitron", NULL};
static const char *const DTYPES[] = {"bf16", "fp16", "fp32", "fp8", NULL};
/* Enum fields store the index of the string: these lists are in the order
 * of ac_method and ac_export_target (search.h). */
static const char *const EXPORTS[] = {"deci", "llama", "gguf", NULL};
static const char *const LINKS[] = {"nvlink", "pcie", NULL};
static const char *const SMETHODS[] = {"dnas", "surrogate", NULL};
static const char *const CMETHODS[] = {"auto", "exact", "streamed", "anchored", NULL}; /* AC_CALIB_* order (importance.h) */
_Static_assert(AC_SEARCH_DNAS == 0 && AC_SEARCH_SURROGATE == 1, "SMETHODS order");
/* Old names an enum still accepts: pairs of old, current. */
static const char *const EXPORT_ALIASES[] = {"gguf-deci", "gguf", NULL};

#define AT(st, m) .off = offsetof(st, m), .size = sizeof(((st *)0)->m)
#define STR(nm, st, m, fl, d)                                                                                          \
    { .name = nm, .type = AC_F_STR, .flags = (fl) | AC_F_NODEFAULT, AT(st, m), .doc = d }
#define INT(nm, st, m, l, h, df, fl, d)                                                                                \
    { .name = nm, .type = AC_F_INT, .flags = fl, .lo = l, .hi = h, .def = df, AT(st, m), .doc = d }
#define NUM(nm, st, m, l, h, df, fl, d)                                                                                \
    { .name = nm, .type = AC_F_NUM, .flags = fl, .lo = l, .hi = h, .def = df, AT(st, m), .doc = d }
#define BOOL(nm, st, m, df, d)                                                                                         \
    { .name = nm, .type = AC_F_BOOL, .def = df, AT(st, m), .doc = d }
#define ENUM(nm, st, m, en, df, fl, d)                                                                                 \
    { .name = nm, .type = AC_F_ENUM, .flags = fl, .def = df, .enums = en, AT(st, m), .doc = d }
#define ENUM_ALIASED(nm, st, m, en, al, df, fl, d)                                                                     \
    { .name = nm, .type = AC_F_ENUM, .flags = fl, .def = df, .enums = en, .aliases = al, AT(st, m), .doc = d }
#define OBJ(nm, st, m, sb, fl, d)                                                                                      \
    { .name = nm, .type = AC_F_OBJ, .flags = fl, .sub = sb, AT(st, m), .doc = d }
#define ARR(nm, st, m, cnt, sb, maxn, d)                                                                               \
    {                                                                                                                  \
        .name = nm, .type = AC_F_ARR, .hi = maxn, .sub = sb, AT(st, m), .count_off = offsetof(st, cnt),                \
        .item_size = sizeof(((st *)0)->m[0]), .doc = d                                                                 \
    }
#define END                                                                                                            \
    { .name = NULL }
#define ND AC_F_NODEFAULT

static const ac_field ENGINE[] = {
    ENUM("name", ac_engine_in, engine, ac_engine_names, -1, ND,
         "the serving engine whose scheduler, KV blocks, memory preallocation, CUDA graphs and per-step overhead the "
         "prediction models (docs/costmodel.md; default: autocompress-cpu on cpu, else vllm)"),
    ENUM("weights_dtype", ac_engine_in, weights_dtype, DTYPES, -1, ND,
         "default: on cpu the checkpoint's (bf16 for a BF16 checkpoint, whose BF16 cost table the CPU engine's BF16 kernels are measured in; fp32 for any other), else bf16"),
    ENUM("kv_dtype", ac_engine_in, kv_dtype, DTYPES, -1, ND, "default: fp32 on cpu, else bf16"),
    INT("block_size", ac_engine_in, block_size, 1, 1024, -1, ND,
        "KV-cache block in tokens (default: the engine's: vllm 16, trtllm 32, sglang 1, llamacpp 1, cpu 1)"),
    NUM("gpu_memory_utilization", ac_engine_in, mem_util, 0.05, 1, NAN, ND,
        "fraction of device memory the engine preallocates (trtllm: of the memory free after weights; default: vllm "
        "0.9, trtllm 0.9, sglang 0.88 at tp 1, cpu 0.8)"),
    NUM("overhead_ms", ac_engine_in, overhead_ms, 0, 1e4, NAN, ND,
        "per forward call (scheduler, sampling); default: 0 on cpu, else 0.3"),
    NUM("seq_overhead_us", ac_engine_in, seq_overhead_us, 0, 1e4, NAN, ND,
        "host work per sequence a forward call carries (scheduling, sampling, detokenising), microseconds; default: "
        "the engine's (docs/costmodel.md)"),
    NUM("overhead_gib", ac_engine_in, overhead_gib, 0, 1e4, NAN, ND,
        "runtime memory outside weights, KV cache, activations; default: 0 on cpu, llamacpp 0.5, else 1.5"),
    INT("max_num_batched_tokens", ac_engine_in, max_batched_tokens, 1, 1 << 20, -1, ND,
        "tokens one iteration schedules (the chunked-prefill budget); default: the engine's for the device"),
    INT("max_num_seqs", ac_engine_in, max_seqs, 1, 1 << 20, -1, ND, "requests running at once; default: the engine's"),
    INT("cuda_graph_max_bs", ac_engine_in, graph_max, 0, 1 << 16, -1, ND,
        "largest size run as a CUDA graph, 0 = none (eager); default: the engine's"),
    END,
};
static const ac_field WORKLOAD[] = {
    INT("batch", ac_workload, batch, 1, 65536, 1, 0, "sequences decoded together"),
    INT("prompt_len", ac_workload, prompt_len, 1, 1 << 22, 512, 0, NULL),
    INT("gen_len", ac_workload, gen_len, 1, 1 << 22, 128, 0, NULL),
    NUM("arrival_rate", ac_workload, arrival_rate, 0, 1e6, 0, 0,
        "Poisson requests per second: a served workload through the engine's scheduler (0 = none)"),
    INT("concurrency", ac_workload, concurrency, 0, 1 << 20, 0, 0,
        "at most this many requests in flight (alone: a closed loop at that concurrency; 0 = none)"),
    BOOL("offline", ac_workload, offline, 0, "every request queued at once (the engine's offline throughput)"),
    INT("requests", ac_workload, requests, 1, 100000, 512, 0, "requests a served workload simulates"),
    NUM("length_spread", ac_workload, length_spread, 0, 0.99, 0, 0,
        "served workloads: prompt and output lengths uniform within +-this fraction"),
    INT("seed", ac_workload, seed, 0, 2147483647, 0, 0, "served workloads: arrivals and lengths"),
    END,
};
static const ac_field TARGET[] = {
    STR("device", ac_target_spec, device, AC_F_REQUIRED,
        "cpu, cuda, cuda:N, or a spec profile: H100, H200, B200, A100, L4, RTX4090, RTX5080, RTX5070"),
    OBJ("engine", ac_target_spec, engine_in, ENGINE, 0, NULL),
    OBJ("workload", ac_target_spec, workload, WORKLOAD, 0, NULL),
    INT("tp", ac_target_spec, tp, 1, 64, 1, 0,
        "tensor-parallel GPUs: heads, KV heads, FFN and vocabulary split tp ways, two all-reduces per layer"),
    ENUM("interconnect", ac_target_spec, link, LINKS, -1, ND,
         "the all-reduce link under tp > 1 (default: nvlink where the profile has it, else pcie)"),
    END,
};
/* The limits: the constraint table's rows (constraints.h), the one list of them. */
#define CFIELD(nm, mem, metric, unit, m, kind, lo, hi, doc)                                                            \
    NUM(nm, ac_constraints, mem, lo, hi, 0, ND, AC_CONSTRAINT_DOC(metric, unit, kind, doc)),
static const ac_field CONSTRAINTS[] = {
    AC_CONSTRAINT_ROWS(CFIELD) END,
};
#undef CFIELD
static const ac_field SEARCH[] = {
    INT("steps", ac_search_opts, steps, 1, 100000, 300, 0, NULL),
    INT("seed", ac_search_opts, seed, 0, 2147483647, 0, 0, NULL),
    NUM("lr", ac_search_opts, lr, 1e-6, 10, 0.03, 0, NULL),
    ENUM_ALIASED("export_target", ac_search_opts, target, EXPORTS, EXPORT_ALIASES, AC_EXPORT_DECI, 0,
                 "deci: vLLM/TRT-LLM nemotron-nas (per-layer FFN width; attention keeps every query head with "
                 "KV heads merged to a divisor, or is removed); gguf: model.gguf for llama.cpp (arch llama when "
                 "uniform, deci otherwise; per-layer KV groups pruned with their query heads; layer 0 keeps "
                 "attention, no layer keeps attention without its FFN, the last layer keeps its FFN); gguf-deci: "
                 "old name of gguf; llama: uniform layers. Default deci, llama for a mixture-of-experts model"),
    INT("ffn_multiple", ac_search_opts, ffn_multiple, 1, 4096, 0, ND,
        "FFN width step; default: 256 for deci (the loaders' grid; other values must be multiples of it), else 32"),
    INT("hidden_multiple", ac_search_opts, hidden_multiple, 1, 4096, 16, 0, NULL),
    BOOL("prune_hidden", ac_search_opts, prune_hidden, 1, NULL),
    BOOL(
        "prune_experts", ac_search_opts, prune_experts, 1,
        "mixture-of-experts models: whole experts may be removed (one count for every MoE layer); a dense model's spec "
        "may not name it"),
    BOOL("prune_expert_ffn", ac_search_opts, prune_expert_ffn, 0,
         "mixture-of-experts models: every expert's width may be cut (one width for every MoE layer, each expert "
         "keeping its own best channels; Minitron's moe_ffn_hidden_size axis and dnas's expert-width gates; the "
         "surrogate search keeps the width); a dense model's spec may not name it"),
    INT("min_top_k", ac_search_opts, min_top_k, 0, 1 << 16, 0, 0,
        "mixture-of-experts models: top-k (experts per token, one for the model) searched from this to the model's: "
        "the autocompress arm searches at each and keeps the feasible result with the least predicted loss (its "
        "search's prediction plus the measured loss of routing to fewer experts); Minitron keeps the model's; 0: the "
        "model's top-k; a dense model's spec may not name it"),
    BOOL("gguf", ac_search_opts, gguf, 0, "with export_target llama: also write the uniform result as model.gguf"),
    ENUM("method", ac_search_opts, method, SMETHODS, AC_SEARCH_DNAS, 0,
         "dnas: hard-concrete gates trained through the network with the distillation loss and the expected-cost "
         "augmented Lagrangian (src/search/dnas.c), initialised from the surrogate; surrogate: the additive per-layer "
         "sensitivity relaxation only (fast)"),
    INT("dnas_steps", ac_search_opts, dnas_steps, 1, 100000, 300, 0, NULL),
    NUM("dnas_lr", ac_search_opts, dnas_lr, 1e-6, 10, 0.1, 0, "Adam step on the gates' log_alpha"),
    INT("dnas_batch", ac_search_opts, dnas_batch, 1, 4096, 4, 0, NULL),
    INT("dnas_seq_len", ac_search_opts, dnas_seq_len, 2, 1 << 16, 64, 0, NULL),
    BOOL("cotrain", ac_search_opts, cotrain, 0,
         "train the weights (a copy, AdamW) with the gates; the result is sliced from the original weights unless "
         "keep_weights"),
    BOOL("keep_weights", ac_search_opts, keep_weights, 0,
         "with cotrain: the autocompress arm is sliced from the weights trained with the gates (under the "
         "distillation loss) instead of the original ones (the repair refits it to their own outputs); their tokens "
         "count in distill.tokens as the arm's gates"),
    END,
};
static const ac_field TASK[] = {
    STR("name", ac_eval_task, name, AC_F_REQUIRED, "the report's key: letters, digits, '_', '.', '-'; unique"),
    STR("path", ac_eval_task, path, AC_F_REQUIRED | AC_F_PATH_FILE,
        "JSONL, one question a line: {\"context\", \"choices\", \"gold\"} (docs/tasks.md)"),
    END,
};
static const ac_field EVAL[] = {
    INT("ctx", ac_eval_spec, ctx, 8, 1 << 16, 128, 0, NULL),
    INT("windows", ac_eval_spec, windows, 0, 1 << 20, 32, 0, "0 = every window of the held-out text"),
    ARR("tasks", ac_eval_spec, tasks, ntasks, TASK, AC_MAX_TASKS,
        "multiple-choice tasks scored on every arm as lm-evaluation-harness scores them (acc, acc_norm; "
        "docs/tasks.md)"),
    END,
};
static const ac_field DISTILL[] = {
    INT("tokens", ac_distill_spec, tokens, 0, AC_DISTILL_MAX_TOKENS, 0, 0,
        "each arm's total training-token budget (batch x seq_len per step): the autocompress arm's candidate ranking, "
        "co-trained gate search (search.cotrain) and final distillation together, the minitron arm's final "
        "distillation; 0 = no distillation"),
    STR("text", ac_distill_spec, text, AC_F_PATH_FILE, "UTF-8 training text (default: the whole calibration file)"),
    NUM("lr", ac_distill_spec, lr, 1e-8, 1, 1e-3, 0, "AdamW peak rate; 5 % linear warmup, cosine to lr/10"),
    INT("seq_len", ac_distill_spec, seq_len, 8, 1 << 16, 128, 0, NULL),
    INT("batch", ac_distill_spec, batch, 1, 4096, 8, 0, NULL),
    NUM("temperature", ac_distill_spec, temperature, 0.05, 100, 1, 0,
        "loss tau^2 KL(softmax(teacher/tau) || softmax(student/tau))"),
    NUM("ce_weight", ac_distill_spec, ce_weight, 0, 1, 0, 0, "weight of next-token cross-entropy mixed into the loss"),
    INT("seed", ac_distill_spec, seed, 0, 2147483647, 1, 0, "window sampling"),
    INT("candidates", ac_distill_spec, candidates, 1, 8, 1, 0,
        "autocompress arm: feasible structures ranked by their held-out loss after a short distillation (the search's, "
        "the surrogate's, the best uniform one, then further search seeds; 3 ranks the first three); 1 = the "
        "search's, no ranking (the default: on the tiny model the ranking did not help, docs/benchmarks.md)"),
    INT("candidate_steps", ac_distill_spec, candidate_steps, 1, 100000, 8, 0,
        "distillation steps of each candidate's short distillation (at most ranking_tokens allows)"),
    INT("ranking_tokens", ac_distill_spec, ranking_tokens, 0, AC_DISTILL_MAX_TOKENS, 0, 0,
        "tokens of distill.tokens the ranking may spend; 0 = a quarter of distill.tokens"),
    END,
};
static const char *const MSCORES[] = {"loss", "task", NULL};
static const char *const MMETRICS[] = {"acc", "acc_norm", NULL};
static const ac_field MINITRON[] = {
    ENUM("score", ac_minitron_spec, score, MSCORES, 0, 0,
         "how the top-k candidates are compared: loss (calibration perplexity, the lowest kept) or task (an "
         "eval.tasks entry's accuracy, the highest kept, as Model-Optimizer scores them with MMLU)"),
    STR("task", ac_minitron_spec, task, 0, "with score task: the eval.tasks name scored (default: the first)"),
    ENUM("metric", ac_minitron_spec, opts.score_norm, MMETRICS, 0, 0, "with score task: acc or acc_norm"),
    INT("top_k", ac_minitron_spec, opts.top_k, 1, 1000, 10, 0, "candidates scored (Model-Optimizer's top_k)"),
    NUM("max_width_pruning", ac_minitron_spec, opts.max_width_pruning, 0.01, 0.99, 0.40, 0,
        "width axes keep their choices from int((1 - this) n) up (Model-Optimizer's cap)"),
    NUM("max_depth_pruning", ac_minitron_spec, opts.max_depth_pruning, 0.01, 0.99, 0.20, 0,
        "num_layers keeps its choices from int((1 - this) n) up (Model-Optimizer's cap)"),
    INT("hidden_size_divisor", ac_minitron_spec, opts.hidden_divisor, 1, 1 << 20, -1, ND,
        "default: min(256, round(hidden / 16)), Model-Optimizer's 256 on 8B-class models"),
    INT("ffn_hidden_size_divisor", ac_minitron_spec, opts.ffn_divisor, 1, 1 << 20, -1, ND,
        "default: min(512, round(ffn / 16))"),
    INT("num_layers_divisor", ac_minitron_spec, opts.layers_divisor, 1, 1024, -1, ND,
        "default: min(2, round(layers / 16))"),
    INT("num_moe_experts_divisor", ac_minitron_spec, opts.experts_divisor, 1, 1 << 16, -1, ND,
        "default: min(8, round(experts / 16))"),
    END,
};
static const ac_field PUZZLE[] = {
    BOOL("enabled", ac_puzzle_spec, enabled, 0,
         "run the puzzle arm too: a library of block variants per layer scored by block-local distillation, one "
         "per layer chosen by a mixed-integer program under the limits, distilled as the other arms"),
    INT("steps", ac_puzzle_spec, steps, 0, 100000, 40, 0, "block-local distillation steps per block variant"),
    INT("windows", ac_puzzle_spec, windows, 2, 1 << 16, 32, 0,
        "calibration windows (of eval.ctx tokens) for block-local distillation; a quarter held out for the scores"),
    INT("batch", ac_puzzle_spec, batch, 1, 4096, 4, 0, "windows per block-local distillation step"),
    NUM("lr", ac_puzzle_spec, lr, 1e-8, 1, 1e-3, 0, "AdamW peak rate of block-local distillation, cosine to lr/10"),
    END,
};
static const ac_field SPEC[] = {
    STR("name", ac_job_spec, name, 0, NULL),
    STR("model", ac_job_spec, model, AC_F_REQUIRED | AC_F_PATH_DIR,
        "Absolute path of a Hugging Face model directory (config.json, *.safetensors or index, tokenizer.json) under "
        "one "
        "of the server's model_roots."),
    STR("calibration", ac_job_spec, calibration, AC_F_REQUIRED | AC_F_PATH_FILE,
        "Absolute path of a UTF-8 text file: importance and sensitivity passes."),
    STR("heldout", ac_job_spec, heldout, AC_F_PATH_FILE,
        "Absolute path of a UTF-8 text file for perplexity before/after (default: calibration)."),
    STR("output", ac_job_spec, output, AC_F_PATH_OUT,
        "Directory for the pruned checkpoint and report.json (default: DATA_DIR/jobs/ID/output)."),
    OBJ("target", ac_job_spec, target, TARGET, AC_F_REQUIRED, NULL),
    OBJ("constraints", ac_job_spec, limits, CONSTRAINTS, AC_F_REQUIRED | AC_F_NONEMPTY, NULL),
    ENUM("method", ac_job_spec, method, METHODS, AC_METHOD_AUTOCOMPRESS, 0, NULL),
    OBJ("search", ac_job_spec, search, SEARCH, 0, NULL),
    OBJ("eval", ac_job_spec, eval, EVAL, 0, NULL),
    BOOL("repair", ac_job_spec, repair, 1, "least-squares refit of pruned FFN down projections"),
    INT("calibration_tokens", ac_job_spec, calibration_tokens, 256, 1 << 24, 16384, 0, NULL),
    ENUM("calibration_method", ac_job_spec, calibration_method, CMETHODS, 0, 0,
         "sensitivity curves: exact (every point through the rest of the network), streamed (gradient-scored, "
         "layer by layer; docs/search.md), anchored (50/100 % anchors), auto (exact up to 2e12 "
         "FLOPs or on CUDA); a hybrid (nemotron_h) gets curves, Mamba heads included, from every method (its FLOPs "
         "counted per layer)"),
    INT("priority", ac_job_spec, priority, -1000, 1000, 0, 0, NULL),
    OBJ("distill", ac_job_spec, distill, DISTILL, 0, NULL),
    OBJ("minitron", ac_job_spec, minitron, MINITRON, 0,
        "the Minitron arm (NVIDIA Model-Optimizer's mcore_minitron search; docs/search.md): caps, divisors, top_k "
        "and candidate scoring, Model-Optimizer's defaults"),
    OBJ("puzzle", ac_job_spec, puzzle, PUZZLE, 0, NULL),
    END,
};

const ac_field *ac_job_spec_fields(void) { return SPEC; }
const ac_field *ac_target_spec_fields(void) { return TARGET; }

/* ---------------------------------------------------------------- parsing */

static _Thread_local char field_buf[256];

static void store_int(void *p, size_t size, long long v) {
    if (size == sizeof(int64_t))
        *(int64_t *)p = v;
    else {
        assert(size == sizeof(int32_t));
        *(int32_t *)p = (int32_t)v;
    }
}

/* The table's defaults into the section at base (and its subsections). */
static void set_defaults(const ac_field *fs, char *base) {
    for (const ac_field *f = fs; f->name; f++) {
        char *p = base + f->off;
        switch (f->type) {
        case AC_F_STR: memset(p, 0, f->size); break;
        case AC_F_INT: store_int(p, f->size, (long long)f->def); break;
        case AC_F_NUM: *(double *)p = f->def; break;
        case AC_F_BOOL:
        case AC_F_ENUM: *(int *)p = (int)f->def; break;
        case AC_F_OBJ: set_defaults(f->sub, p); break;
        case AC_F_ARR:
            *(int *)(base + f->count_off) = 0;
            for (int i = 0; i < (int)f->hi; i++) set_defaults(f->sub, p + i * f->item_size);
            break;
        default: assert(!"field type");
        }
    }
}

static const char *const TYPE_NAMES[] = {"a non-empty string", "an integer",         "a number",
                                         "a boolean",          "a non-empty string", "an object",
                                         "an array of objects"};

static int parse_obj(const json_t *o, const ac_field *fs, char *base, const char *prefix, const char **fieldp,
                     ac_err *e);

/* One member: check and store. field_buf names it. */
static int parse_value(const json_t *v, const ac_field *f, char *p, const char **fieldp, ac_err *e) {
    int ok = 1;
    switch (f->type) {
    case AC_F_STR:
    case AC_F_ENUM: ok = json_is_string(v) && json_string_length(v) > 0 && json_string_length(v) < AC_SPEC_STR; break;
    case AC_F_INT: ok = json_is_integer(v); break;
    case AC_F_NUM: ok = json_is_number(v) && isfinite(json_number_value(v)); break;
    case AC_F_BOOL: ok = json_is_boolean(v); break;
    case AC_F_OBJ: ok = json_is_object(v); break;
    case AC_F_ARR: ok = json_is_array(v); break;
    }
    *fieldp = field_buf;
    if (!ok) return ac_errf(e, "%s must be %s", field_buf, TYPE_NAMES[f->type]);
    if (f->type == AC_F_INT || f->type == AC_F_NUM) {
        double x = json_number_value(v);
        if (x < f->lo || x > f->hi) return ac_errf(e, "%s=%g is outside [%g, %g]", field_buf, x, f->lo, f->hi);
        if (f->type == AC_F_INT)
            store_int(p, f->size, json_integer_value(v));
        else
            *(double *)p = x;
    } else if (f->type == AC_F_STR) {
        if (json_string_length(v) >= f->size)
            return ac_errf(e, "%s must be a non-empty string of at most %zu bytes", field_buf, f->size - 1);
        memcpy(p, json_string_value(v), json_string_length(v) + 1);
    } else if (f->type == AC_F_ENUM) {
        const char *name = json_string_value(v);
        for (int k = 0; f->aliases && f->aliases[k]; k += 2)
            if (!strcmp(f->aliases[k], name)) name = f->aliases[k + 1];
        int i = 0;
        while (f->enums[i] && strcmp(f->enums[i], name)) i++;
        if (!f->enums[i]) {
            char names[256] = "";
            for (int k = 0; f->enums[k]; k++)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? ", " : "", f->enums[k]);
            return ac_errf(e, "%s=\"%.64s\" is not one of: %s", field_buf, json_string_value(v), names);
        }
        *(int *)p = i;
    } else if (f->type == AC_F_BOOL) {
        *(int *)p = json_is_true(v);
    } else if (f->type == AC_F_ARR) {
        if (json_array_size(v) > (size_t)f->hi)
            return ac_errf(e, "%s has %zu entries; at most %d", field_buf, json_array_size(v), (int)f->hi);
        char name[256];
        snprintf(name, sizeof name, "%s", field_buf);
        for (size_t i = 0; i < json_array_size(v); i++) {
            char pre[300];
            snprintf(pre, sizeof pre, "%.250s[%zu].", name, i);
            json_t *it = json_array_get(v, i);
            if (!json_is_object(it)) {
                snprintf(field_buf, sizeof field_buf, "%.200s[%zu]", name, i);
                return ac_errf(e, "%s must be an object", field_buf);
            }
            if (parse_obj(it, f->sub, p + i * f->item_size, pre, fieldp, e)) return -1;
        }
        *(int *)(p - f->off + f->count_off) = (int)json_array_size(v);
    } else {
        char pre[300];
        snprintf(pre, sizeof pre, "%.250s.", field_buf);
        if (parse_obj(v, f->sub, p, pre, fieldp, e)) return -1;
        if ((f->flags & AC_F_NONEMPTY) && json_object_size(v) == 0) {
            char names[200] = "";
            for (const ac_field *g = f->sub; g->name; g++)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", g == f->sub ? "" : ", ", g->name);
            snprintf(field_buf, sizeof field_buf, "%.*s", (int)strlen(pre) - 1, pre);
            return ac_errf(e, "%s must name at least one limit (%s)", field_buf, names);
        }
    }
    return 0;
}

static int parse_obj(const json_t *o, const ac_field *fs, char *base, const char *prefix, const char **fieldp,
                     ac_err *e) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)o, k, v) {
        const ac_field *f = fs;
        while (f->name && strcmp(f->name, k)) f++;
        snprintf(field_buf, sizeof field_buf, "%.120s%.120s", prefix, k);
        *fieldp = field_buf;
        if (!f->name) return ac_errf(e, "unknown field %s", field_buf);
        if (parse_value(v, f, base + f->off, fieldp, e)) return -1;
    }
    for (const ac_field *f = fs; f->name; f++)
        if ((f->flags & AC_F_REQUIRED) && !json_object_get(o, f->name)) {
            snprintf(field_buf, sizeof field_buf, "%.120s%.120s", prefix, f->name);
            *fieldp = field_buf;
            return ac_errf(e, "missing required field %s", field_buf);
        }
    return 0;
}

static int dtype_bytes(int i) { return i == 2 ? 4 : i == 3 ? 1 : 2; /* bf16, fp16, fp32, fp8 */ }

/* Device resolution and the engine profile: device-class defaults, then
 * the overrides the spec gave. */
static int target_finish(ac_target_spec *t, const char *prefix, const char **fieldp, ac_err *e) {
    snprintf(field_buf, sizeof field_buf, "%.120sdevice", prefix);
    *fieldp = field_buf;
    if (ac_target_resolve(t->device, &t->dev, e)) return -1;
    const ac_engine_in *in = &t->engine_in;
    ac_engine_profile *p = &t->engine;
    int cpu = t->dev.kind == AC_TARGET_CPU;
    ac_engine_profile_named(in->engine, cpu, p);
    if (in->weights_dtype >= 0)
        p->w_bytes = dtype_bytes(in->weights_dtype), p->act_bytes = p->w_bytes < 2 ? 2 : p->w_bytes;
    /* llama.cpp's cuBLAS path for F16 weights computes in FP16 (docs/costmodel.md) */
    p->gemm_f16_acc = !cpu && in->engine == ac_engine_find("llamacpp") && in->weights_dtype == 1;
    if (in->kv_dtype >= 0) p->kv_bytes = dtype_bytes(in->kv_dtype);
    if (in->block_size > 0) p->block_size = in->block_size;
    if (!isnan(in->mem_util)) p->mem_util = in->mem_util;
    if (!isnan(in->overhead_ms)) p->overhead_ms = in->overhead_ms;
    if (!isnan(in->seq_overhead_us)) p->seq_overhead_us = in->seq_overhead_us;
    if (!isnan(in->overhead_gib)) p->overhead_gib = in->overhead_gib;
    if (in->max_batched_tokens > 0) p->max_batched_tokens = in->max_batched_tokens;
    if (in->max_seqs > 0) p->max_seqs = in->max_seqs;
    if (in->graph_max >= 0) p->graph_max = in->graph_max ? in->graph_max : -1;
    p->tp = t->tp;
    const ac_device_spec *d = t->dev.kind == AC_TARGET_PROFILE ? t->dev.profile : NULL;
    if (t->tp > 1 && cpu) {
        snprintf(field_buf, sizeof field_buf, "%.120stp", prefix);
        return ac_errf(e, "%stp=%d needs a GPU target (the cpu engine runs on one device)", prefix, t->tp);
    }
    if (t->link == 0 && d && d->nvlink_gbs <= 0) {
        snprintf(field_buf, sizeof field_buf, "%.120sinterconnect", prefix);
        return ac_errf(e, "%sinterconnect=nvlink: %s has no NVLink (pcie)", prefix, d->name);
    }
    if (t->link >= 0 && d) p->link_gbs = t->link == 0 ? d->nvlink_gbs : d->pcie_gbs;
    if (t->link == 1 && !d) p->link_gbs = 20;
    *fieldp = "";
    return 0;
}

/* eval.tasks: names the report can key on, each once. */
static int check_tasks(const ac_eval_spec *ev, const char **fieldp, ac_err *e) {
    for (int i = 0; i < ev->ntasks; i++) {
        const char *n = ev->tasks[i].name;
        snprintf(field_buf, sizeof field_buf, "eval.tasks[%d].name", i);
        *fieldp = field_buf;
        if (strspn(n, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-") != strlen(n))
            return ac_errf(e, "%s=\"%.63s\" may hold only letters, digits, '_', '.' and '-'", field_buf, n);
        for (int j = 0; j < i; j++)
            if (!strcmp(ev->tasks[j].name, n))
                return ac_errf(e, "%s=\"%.63s\" is also eval.tasks[%d].name", field_buf, n, j);
    }
    *fieldp = "";
    return 0;
}

void ac_target_engine_for(const ac_target_spec *t, int checkpoint_wdt, ac_engine_profile *out) {
    *out = t->engine;
    if (t->dev.kind == AC_TARGET_CPU && t->engine_in.weights_dtype < 0 && checkpoint_wdt == ST_BF16) out->w_bytes = 2;
}

const char *ac_target_weights_dtype(const ac_target_spec *t, int checkpoint_wdt) {
    int d = t->engine_in.weights_dtype;
    if (d >= 0 && d < (int)(sizeof DTYPES / sizeof *DTYPES) - 1) return DTYPES[d];
    return t->dev.kind != AC_TARGET_CPU || checkpoint_wdt == ST_BF16 ? "bf16" : "fp32";
}

const char *ac_target_table_dtype(const ac_target_spec *t, int checkpoint_wdt) {
    return t->dev.kind == AC_TARGET_CPU ? ac_cost_cpu_table_dtype(ac_target_weights_dtype(t, checkpoint_wdt))
                                        : ac_engine_profile_dtype(&t->engine);
}

int ac_target_spec_parse(const json_t *j, ac_target_spec *t, const char *prefix, const char **fieldp, ac_err *e) {
    const char *dummy;
    char pre[200];
    if (!fieldp) fieldp = &dummy;
    snprintf(pre, sizeof pre, "%.190s.", prefix);
    memset(t, 0, sizeof *t);
    set_defaults(TARGET, (char *)t);
    *fieldp = prefix;
    if (!json_is_object(j)) return ac_errf(e, "%s must be an object", prefix);
    if (parse_obj(j, TARGET, (char *)t, pre, fieldp, e)) return -1;
    return target_finish(t, pre, fieldp, e);
}

/* Whether the checkpoint in dir (its config.json) has mixture-of-experts
 * layers; 0 when it does not load (its error comes later). */
static int model_has_moe(const char *dir) {
    ac_arch a;
    ac_err ignore;
    if (!dir[0] || ac_arch_load(dir, &a, &ignore)) return 0;
    int moe = ac_arch_has_moe(&a);
    ac_arch_free(&a);
    return moe;
}

/* minitron.score task: the task it names (or the first) must be one of eval.tasks. */
static int minitron_finish(ac_job_spec *s, const char **fieldp, ac_err *e) {
    ac_minitron_spec *m = &s->minitron;
    m->task_index = -1;
    if (!m->score) return 0; /* minitron.task is read with score task only */
    if (!s->eval.ntasks) {
        *fieldp = "minitron.score";
        return ac_errf(e, "minitron.score task needs eval.tasks");
    }
    for (int i = 0; i < s->eval.ntasks && m->task_index < 0; i++)
        if (!m->task[0] || !strcmp(m->task, s->eval.tasks[i].name)) m->task_index = i;
    if (m->task_index < 0) {
        *fieldp = "minitron.task";
        return ac_errf(e, "minitron.task %s is not one of eval.tasks", m->task);
    }
    return 0;
}

int ac_job_spec_parse(const json_t *j, ac_job_spec *s, const char **fieldp, ac_err *e) {
    const char *dummy;
    if (!fieldp) fieldp = &dummy;
    *fieldp = "";
    memset(s, 0, sizeof *s);
    set_defaults(SPEC, (char *)s);
    if (!json_is_object(j)) return ac_errf(e, "job spec must be a JSON object");
    if (parse_obj(j, SPEC, (char *)s, "", fieldp, e)) return -1;
    if (target_finish(&s->target, "target.", fieldp, e) || check_tasks(&s->eval, fieldp, e) ||
        minitron_finish(s, fieldp, e))
        return -1;
    if (!s->heldout[0]) memcpy(s->heldout, s->calibration, sizeof s->heldout);
    /* a mixture-of-experts model's default target is its family's own
     * Hugging Face layout: the deci loaders know dense layers only */
    if (!json_object_get(json_object_get(j, "search"), "export_target") && model_has_moe(s->model))
        s->search.target = AC_EXPORT_LLAMA;
    int deci = s->search.target == AC_EXPORT_DECI, tp = s->target.tp;
    if (!s->search.ffn_multiple) { /* a multiple of tp too: each GPU gets an equal FFN share */
        int m = deci ? AC_DECI_GRID : 32, g = m, b = tp;
        while (b) { /* g = gcd(m, tp) */
            int r = g % b;
            g = b, b = r;
        }
        s->search.ffn_multiple = m / g * tp; /* lcm */
    } else if (tp > 1 && s->search.ffn_multiple % tp) {
        *fieldp = "search.ffn_multiple";
        return ac_errf(e, "search.ffn_multiple=%d must be a multiple of target.tp=%d", s->search.ffn_multiple, tp);
    }
    return ac_deci_validate_spec(deci, s->search.ffn_multiple, fieldp, e) ||
                   ac_gguf_check_spec(&s->search, NULL, fieldp, e)
               ? -1
               : 0;
}

ac_spec_verdict ac_job_spec_check(const json_t *j, ac_job_spec *s, const ac_job_check_opts *opts, const char **fieldp,
                                  ac_err *e) {
    static const ac_job_check_opts none = {0};
    const char *dummy;
    if (!fieldp) fieldp = &dummy;
    if (!opts) opts = &none;
    if (ac_job_spec_parse(j, s, fieldp, e)) return AC_SPEC_INVALID;
    if (opts->need_output && !s->output[0]) {
        *fieldp = "output";
        ac_errf(e, "missing required field output (the directory the pruned checkpoint and report.json go to)");
        return AC_SPEC_INVALID;
    }
    if (opts->rules && opts->rules(opts->ud, s)) return AC_SPEC_REFUSED;
    if (ac_job_check_paths(s, opts->jobs_dir, fieldp, e)) return AC_SPEC_BAD_PATH;
    for (int i = 0; i < s->eval.ntasks; i++) /* each task file's lines, for shape (tasks.h) */
        if (ac_mc_check_file(s->eval.tasks[i].path, NULL, e)) {
            snprintf(field_buf, sizeof field_buf, "eval.tasks[%d].path", i);
            *fieldp = field_buf;
            return AC_SPEC_INVALID;
        }
    /* the model's config (or GGUF header), bounded before anything is sized
     * by it: a hostile one is refused here, not in the worker */
    ac_arch arch;
    *fieldp = "model";
    if (s->model[0] && ac_arch_load(s->model, &arch, e)) return AC_SPEC_INVALID;
    if (s->model[0]) {
        int unreachable = ac_job_check_reachable(s, &arch, fieldp, opts->bound, e); /* jobcheck.h */
        ac_arch_free(&arch);
        if (unreachable) return AC_SPEC_INVALID;
    }
    *fieldp = NULL;
    if (ac_model_check_compressible(s, j, fieldp, e) ||
        ac_deci_validate_model(s->search.target == AC_EXPORT_DECI, s->method == AC_METHOD_MINITRON, s->model, fieldp,
                               e) ||
        ac_gguf_check_spec(&s->search, s->model, fieldp, e) ||
        ac_job_check_tp_model(s->target.tp, s->model, fieldp, e))
        return AC_SPEC_INVALID;
    *fieldp = NULL;
    return AC_SPEC_OK;
}

const char *ac_method_name(ac_method m) {
    assert(m >= 0 && m < (int)(sizeof METHODS / sizeof *METHODS) - 1);
    return METHODS[m];
}

json_t *ac_constraints_json(const ac_constraints *l) {
    json_t *o = json_object();
    for (const ac_constraint *c = ac_constraint_table(); o && c < ac_constraint_table() + AC_NCONSTRAINTS; c++) {
        double v = ac_constraint_limit(c, l);
        if (v > 0) json_object_set_new(o, c->name, json_real(v));
    }
    return o;
}

/* ---------------------------------------------------------------- compatibility (job.h) */

int ac_job_validate_field(const json_t *spec, const char **fieldp, ac_err *e) {
    static _Thread_local ac_job_spec s; /* 33 KB: off the stack of HTTP threads */
    return ac_job_spec_parse(spec, &s, fieldp, e);
}

int ac_job_validate(const json_t *spec, ac_err *e) { return ac_job_validate_field(spec, NULL, e); }

const char *ac_job_path(const json_t *spec, const char *which) {
    return json_string_value(json_object_get(spec, which));
}

/* ---------------------------------------------------------------- paths */

int ac_job_spec_path(const ac_job_spec *s, int i, const char **field, const char **path, int *flags) {
    const int PATHS = AC_F_PATH_DIR | AC_F_PATH_FILE | AC_F_PATH_OUT;
    int k = 0;
    for (const ac_field *f = SPEC; f->name; f++) {
        if (f->type == AC_F_STR && (f->flags & PATHS) && k++ == i) {
            *field = f->name, *path = (const char *)s + f->off, *flags = f->flags & PATHS;
            return 1;
        }
        if (f->type != AC_F_OBJ) continue;
        for (const ac_field *g = f->sub; g->name; g++) {
            if (g->type == AC_F_STR && (g->flags & PATHS) && k++ == i) {
                snprintf(field_buf, sizeof field_buf, "%s.%s", f->name, g->name);
                *field = field_buf, *path = (const char *)s + f->off + g->off, *flags = g->flags & PATHS;
                return 1;
            }
            if (g->type != AC_F_ARR) continue; /* eval.tasks[j].path */
            int n = *(const int *)((const char *)s + f->off + g->count_off);
            for (int j = 0; j < n; j++)
                for (const ac_field *h = g->sub; h->name; h++)
                    if (h->type == AC_F_STR && (h->flags & PATHS) && k++ == i) {
                        snprintf(field_buf, sizeof field_buf, "%s.%s[%d].%s", f->name, g->name, j, h->name);
                        *field = field_buf;
                        *path = (const char *)s + f->off + g->off + j * g->item_size + h->off;
                        *flags = h->flags & PATHS;
                        return 1;
                    }
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- schema */

static json_t *num_json(const ac_field *f, double x) {
    return f->type == AC_F_INT ? json_integer((json_int_t)x) : json_real(x);
}

static json_t *obj_schema(const ac_field *fs, int flags);

static json_t *field_schema(const ac_field *f) {
    json_t *p = json_object();
    switch (f->type) {
    case AC_F_STR:
        json_object_set_new(p, "type", json_string("string"));
        json_object_set_new(p, "minLength", json_integer(1));
        json_object_set_new(p, "maxLength", json_integer((json_int_t)f->size - 1));
        break;
    case AC_F_INT:
    case AC_F_NUM:
        json_object_set_new(p, "type", json_string(f->type == AC_F_INT ? "integer" : "number"));
        json_object_set_new(p, "minimum", num_json(f, f->lo));
        json_object_set_new(p, "maximum", num_json(f, f->hi));
        if (!(f->flags & AC_F_NODEFAULT)) json_object_set_new(p, "default", num_json(f, f->def));
        break;
    case AC_F_BOOL:
        json_object_set_new(p, "type", json_string("boolean"));
        json_object_set_new(p, "default", json_boolean(f->def != 0));
        break;
    case AC_F_ENUM: {
        json_t *en = json_array();
        for (const char *const *s = f->enums; *s; s++) json_array_append_new(en, json_string(*s));
        for (const char *const *s = f->aliases; s && *s; s += 2) json_array_append_new(en, json_string(*s));
        json_object_set_new(p, "enum", en);
        if (!(f->flags & AC_F_NODEFAULT)) json_object_set_new(p, "default", json_string(f->enums[(int)f->def]));
        break;
    }
    case AC_F_OBJ:
        json_decref(p);
        p = obj_schema(f->sub, f->flags);
        break;
    case AC_F_ARR:
        json_object_set_new(p, "type", json_string("array"));
        json_object_set_new(p, "maxItems", json_integer((json_int_t)f->hi));
        json_object_set_new(p, "items", obj_schema(f->sub, 0));
        break;
    }
    if (f->doc) json_object_set_new(p, "description", json_string(f->doc));
    return p;
}

static json_t *obj_schema(const ac_field *fs, int flags) {
    json_t *o = json_object(), *req = json_array(), *props = json_object();
    json_object_set_new(o, "type", json_string("object"));
    json_object_set_new(o, "additionalProperties", json_false());
    for (const ac_field *f = fs; f->name; f++) {
        if (f->flags & AC_F_REQUIRED) json_array_append_new(req, json_string(f->name));
        json_object_set_new(props, f->name, field_schema(f));
    }
    if (json_array_size(req))
        json_object_set_new(o, "required", req);
    else
        json_decref(req);
    if (flags & AC_F_NONEMPTY) json_object_set_new(o, "minProperties", json_integer(1));
    json_object_set_new(o, "properties", props);
    return o;
}

json_t *ac_job_spec_schema(void) {
    json_t *s =
        json_pack("{s:s,s:s,s:s,s:s}", "$schema", "https://json-schema.org/draft/2020-12/schema", "$id",
                  "autocompress/job.schema.json", "title", "AutoCompress job spec (version 1)", "description",
                  "Generated from the field table in src/pipeline/jobspec.c (autocompress schema); unknown fields are "
                  "rejected with 400 and the field named.");
    json_t *o = obj_schema(SPEC, 0);
    json_object_update(s, o);
    json_decref(o);
    /* The rules across fields: with export_target deci (the default),
     * ffn_multiple sits on the loaders' grid (ac_deci_validate_spec);
     * search.gguf needs export_target llama or gguf (ac_gguf_check_spec);
     * a cpu target runs on one device. */
    json_object_set_new(s, "allOf",
                        json_pack("[{s:{s:{s:{s:{s:{s:[s]}}}}},s:{s:{s:{s:{s:{s:i}}}}}},"
                                  "{s:{s:{s:{s:{s:{s:b}},s:[s]}},s:[s]},s:{s:{s:{s:{s:{s:[s,s,s]}},s:[s]}}}}]",
                                  "if", "properties", "search", "properties", "export_target", "enum", "deci", "then",
                                  "properties", "search", "properties", "ffn_multiple", "multipleOf", AC_DECI_GRID,
                                  "if", "properties", "search", "properties", "gguf", "const", 1, "required", "gguf",
                                  "required", "search", "then", "properties", "search", "properties", "export_target",
                                  "enum", "llama", "gguf", "gguf-deci", "required", "export_target"));
    /* target.tp > 1 needs a GPU target (target_finish) */
    json_array_append_new(json_object_get(s, "allOf"),
                          json_pack("{s:{s:{s:{s:{s:{s:s}},s:[s]}},s:[s]},s:{s:{s:{s:{s:{s:i}}}}}}", "if", "properties",
                                    "target", "properties", "device", "const", "cpu", "required", "device", "required",
                                    "target", "then", "properties", "target", "properties", "tp", "maximum", 1));
    /* minitron.score task needs eval.tasks (minitron_finish; that minitron.task names one of them no schema can say) */
    json_array_append_new(json_object_get(s, "allOf"),
                          json_pack("{s:{s:{s:{s:{s:{s:s}},s:[s]}},s:[s]},s:{s:{s:{s:{s:{s:i}},s:[s]}},s:[s]}}", "if",
                                    "properties", "minitron", "properties", "score", "const", "task", "required",
                                    "score", "required", "minitron", "then", "properties", "eval", "properties", "tasks",
                                    "minItems", 1, "required", "tasks", "required", "eval"));
    return s;
}
