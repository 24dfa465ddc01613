/*
 * fuzz_parsers - fuzz entry for the parsers of outside input. The first
 * byte of an input picks the parser (byte % 11):
 *   0 safetensors header          5 cost-table import (POST /v1/cost-tables)
 *   1 config.json                 6 estimate body (POST /v1/estimate)
 *   2 tokenizer.json              7 daemon config file
 *   3 job spec                    8 worker event line (worker -> daemon)
 *   4 sharded index JSON          9 tokenizer encoding of arbitrary text
 *     (model.safetensors.index.json, through st_set_open on a scratch dir)
 *  10 GGUF file (weights and tokenizer, ac_gguf_load_buf)
 * `fuzz_parsers --extremes` runs every JSON seed with each of its numbers
 * replaced by values that overflow conversions (see run_extremes).
 * Built two ways:
 *  - `make fuzz` (clang, -DAC_LIBFUZZER -fsanitize=fuzzer,address,undefined):
 *    build/fuzz/fuzz_parsers, a libFuzzer target; docs/testing.md says how to run it;
 *  - plain (default): `fuzz_parsers N SEED` runs N random mutations of
 *    built-in seeds through every parser (used by the test suite under ASan).
 */
#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/api.h"
#include "config.h"
#include "cost/costmodel.h"
#include "core/fsafe.h"
#include "format/gguf.h"
#include "pipeline/job.h"
#include "format/model.h"
#include "format/safetensors.h"
#include "format/tokenizer.h"
#include "wevent.h"

#define NTARGETS 11

/* A byte-level BPE tokenizer (all 256 byte symbols, GPT-2's byte-to-unicode
 * map, a few merges, the Llama-3 split regex), for target 9. */
static const char *SPLIT9 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static char *tok9_json(void) {
    json_t *vocab = json_object();
    int next = 256;
    for (int b = 0; b < 256; b++) {
        static int extra = 0;
        int cp = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae) ? b : 0x100 + extra++;
        char u[4];
        if (cp < 0x80) {
            u[0] = (char)cp;
            u[1] = 0;
        } else {
            u[0] = (char)(0xc0 | (cp >> 6));
            u[1] = (char)(0x80 | (cp & 0x3f));
            u[2] = 0;
        }
        json_object_set_new(vocab, u, json_integer(b));
    }
    const char *merged[] = {"he", "ll", "hell", "\xc4\xa0w", "or", NULL};
    for (int i = 0; merged[i]; i++) json_object_set_new(vocab, merged[i], json_integer(next++));
    json_t *t = json_pack("{s:{s:s,s:o,s:[s,s,s,s,s]},s:{s:s,s:[{s:s,s:{s:s},s:s,s:b},{s:s,s:b,s:b}]},s:{s:s}}",
                          "model", "type", "BPE", "vocab", vocab, "merges", "h e", "l l", "he ll", "\xc4\xa0 w", "o r",
                          "pre_tokenizer", "type", "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex",
                          SPLIT9, "behavior", "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0,
                          "use_regex", 0, "decoder", "type", "ByteLevel");
    char *s = t ? json_dumps(t, JSON_COMPACT) : NULL;
    json_decref(t);
    return s;
}

static ac_tokenizer *tok9;
static char scratch[64]; /* a directory for target 4 (also the only model root) */

static void init_once(void) {
    static int done;
    if (done) return;
    done = 1;
    ac_err e;
    char *tj = tok9_json();
    if (!tj || ac_tok_parse(tj, strlen(tj), &tok9, &e)) {
        fprintf(stderr, "fuzz: tokenizer seed: %s\n", tj ? e.msg : "oom");
        abort();
    }
    free(tj);
    snprintf(scratch, sizeof scratch, "/tmp/fuzz_parsers.%d", (int)getpid());
    char shard[128];
    snprintf(shard, sizeof shard, "%s/model-00001-of-00001.safetensors", scratch);
    if (mkdir(scratch, 0700) && errno != EEXIST) abort();
    FILE *f = fopen(shard, "wb"); /* one valid shard with tensor "a" */
    const char *h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    uint64_t hl = strlen(h);
    if (!f || fwrite(&hl, 8, 1, f) != 1 || fwrite(h, 1, hl, f) != hl || fwrite("\0\0\0\0\0\0\0\0", 1, 8, f) != 8 ||
        fclose(f))
        abort();
    const char *roots[] = {scratch};
    if (ac_fsafe_set_roots(roots, 1, &e)) abort(); /* estimate bodies naming other paths are refused by name */
}

static void fuzz_index(const uint8_t *p, size_t n) {
    char path[128];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", scratch);
    FILE *f = fopen(path, "wb");
    if (!f) return;
    size_t w = fwrite(p, 1, n, f);
    fclose(f);
    if (w != n) return;
    st_set s;
    ac_err e;
    if (st_set_open(scratch, &s, &e) == 0) st_set_close(&s);
}

static void fuzz_json_targets(int which, const uint8_t *p, size_t n) {
    ac_err e;
    json_t *j = json_loadb((const char *)p, n, JSON_REJECT_DUPLICATES, NULL);
    if (!j) return;
    const char *field;
    if (which == 5) {
        ac_cost_table t;
        if (ac_cost_table_validate(j, &field, &e) == 0 && ac_cost_table_from_json(j, &t, &e) == 0)
            ac_cost_table_free(&t);
    } else if (which == 6) {
        json_t *out = NULL;
        if (json_is_object(j) && ac_estimate_json(j, NULL, 2, &out, &field, &e) == 0) json_decref(out);
    } else if (which == 7) {
        ac_config c;
        config_defaults(&c);
        config_parse(&c, j, &e);
        config_free(&c);
    }
    json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    init_once();
    ac_err e;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    switch (data[0] % NTARGETS) {
    case 0: {
        st_file f;
        if (st_parse(p, n, &f, &e) == 0) st_close(&f);
        break;
    }
    case 1: {
        json_t *j = json_loadb((const char *)p, n, 0, NULL);
        ac_arch a;
        if (j && ac_arch_from_config(j, &a, &e) == 0) ac_arch_free(&a);
        json_decref(j);
        break;
    }
    case 2: {
        ac_tokenizer *t;
        if (ac_tok_parse((const char *)p, n, &t, &e) == 0) {
            int *ids;
            size_t ni;
            if (ac_tok_encode(t, "hello world 123", 15, &ids, &ni, &e) == 0) free(ids);
            ac_tok_free(t);
        }
        break;
    }
    case 3: {
        json_t *j = json_loadb((const char *)p, n, 0, NULL);
        if (j) ac_job_validate(j, &e);
        json_decref(j);
        break;
    }
    case 4: fuzz_index(p, n); break;
    case 5:
    case 6:
    case 7: fuzz_json_targets(data[0] % NTARGETS, p, n); break;
    case 8: {
        wevent w;
        if (wevent_parse((const char *)p, n, &w) == 0) wevent_free(&w);
        break;
    }
    case 9: {
        int *ids;
        size_t ni;
        if (ac_tok_encode(tok9, (const char *)p, n, &ids, &ni, &e) == 0) {
            char *txt;
            size_t tl;
            if (ac_tok_decode(tok9, ids, ni, &txt, &tl, &e) == 0) free(txt);
            free(ids);
        }
        break;
    }
    default: {
        ac_model m;
        ac_tokenizer *t;
        if (ac_gguf_load_buf(p, n, &m, &t, &e) == 0) {
            ac_model_free(&m);
            ac_tok_free(t);
        }
    }
    }
    return 0;
}

#ifndef AC_LIBFUZZER
static const char *seeds[] = {
    "\0{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
    "\1{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":2,\"num_attention_heads\":2,"
    "\"intermediate_size\":16,"
    "\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":1,\"high_freq_factor\":4,\"original_"
    "max_position_embeddings\":64}}",
    "\2{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a "
    "b\"]},\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}",
    "\2{\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"fuse_unk\":true,\"unk_token\":\"<unk>\",\"vocab\":{\"<unk>"
    "\":0,\"<0x68>\":1,"
    "\"\\u2581\":2,\"o\":3,\"\\u2581o\":4},\"merges\":[\"\\u2581 "
    "o\"]},\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":"
    "\"Prepend\",\"prepend\":\"\\u2581\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" "
    "\"},\"content\":\"\\u2581\"}]}}",
    "\2{\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"vocab\":{\"<unk>\":0,\"\\u2581\":1,\"o\":2,\"\\u2581o\":"
    "3},\"merges\":[[\"\\u2581\",\"o\"]]},"
    "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"first\",\"split\":true}"
    "}",
    "\3{\"model\":\"/m\",\"calibration\":\"/c.txt\",\"output\":\"/"
    "o\",\"target\":{\"device\":\"H100\"},\"constraints\":{\"max_tpot_ms\":5}}",
    "\4{\"metadata\":{\"total_size\":8},\"weight_map\":{\"a\":\"model-00001-of-00001.safetensors\"}}",
    "\5{\"key\":\"k\",\"device\":\"d\",\"dtype\":\"fp32\",\"engine\":\"autocompress-cpu\",\"version\":4,\"source\":"
    "\"measured\","
    "\"memory_gib\":8,\"gemm\":{\"m\":[1,8],\"n\":[16,64],\"k\":[16,64],\"us\":[1,2,3,4,5,6,7,8],\"warm_us\":[1,2,3,4,"
    "5,6,7,8]},"
    "\"cache_bytes\":1e6,\"attention\":{\"head_dims\":[16,64],\"queries\":[1,16],\"extra_keys\":[1,64],\"us\":[1,2,3,4,"
    "5,6,7,8]},"
    "\"elementwise_ns\":1,\"launch_us\":0}",
    "\6{\"architecture\":{\"hidden\":64,\"head_dim\":16,\"vocab\":100,\"layers\":[{\"heads\":4,\"kv_heads\":2,\"ffn\":"
    "128}]},"
    "\"target\":{\"device\":\"H100\",\"workload\":{\"batch\":2,\"prompt_len\":32,\"gen_len\":8}}}",
    "\7{\"listen\":\"127.0.0.1:1\",\"tokens\":[\"0123456789abcdef\"],\"allowed_hosts\":[\"a.example\"],\"max_search_"
    "steps\":10,"
    "\"cancel_grace_s\":1.5,\"use_gpus\":false,\"interrupted_policy\":\"fail\"}",
    "\10{\"kind\":\"cost_table\",\"data\":{\"key\":\"k\",\"cache_hit\":true,\"table\":{\"key\":\"k\"}}}",
    "\11hello world 123 \xc3\xa9\xe2\x82\xac 's\r\n\t  x",
    /* numbers deeper in: a DeciLM config (ffn_mult, n_heads_in_group), a
     * Qwen3-MoE config, a job spec with search / eval / workload values, a
     * served-workload estimate */
    "\1{\"model_type\":\"nemotron-nas\",\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":2,"
    "\"num_attention_heads\":2,\"rope_theta\":10000,\"rms_norm_eps\":1e-5,\"max_position_embeddings\":64,"
    "\"block_configs\":[{\"attention\":{\"n_heads_in_group\":2},\"ffn\":{\"ffn_mult\":3.75}},"
    "{\"attention\":{\"no_op\":true},\"ffn\":{\"ffn_mult\":1.5}}]}",
    "\1{\"model_type\":\"qwen3_moe\",\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":2,"
    "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":4,\"intermediate_size\":16,"
    "\"moe_intermediate_size\":8,\"num_experts\":4,\"num_experts_per_tok\":2,\"decoder_sparse_step\":1,"
    "\"mlp_only_layers\":[0],\"rope_theta\":1000000,\"rms_norm_eps\":1e-6}",
    "\3{\"model\":\"/m\",\"calibration\":\"/c.txt\",\"output\":\"/o\",\"priority\":1,\"calibration_tokens\":4096,"
    "\"target\":{\"device\":\"H100\",\"tp\":1,\"workload\":{\"batch\":4,\"prompt_len\":128,\"gen_len\":32,"
    "\"arrival_rate\":2.5,\"requests\":16,\"concurrency\":4,\"length_spread\":0.5,\"seed\":3}},"
    "\"constraints\":{\"max_params\":1e6,\"max_tpot_ms\":5,\"min_tokens_per_s\":100,\"max_p99_ttft_ms\":50},"
    "\"search\":{\"steps\":50,\"seed\":3,\"lr\":0.1,\"ffn_multiple\":256},\"eval\":{\"ctx\":64,\"windows\":4},"
    "\"distill\":{\"tokens\":1000,\"lr\":0.0001}}",
    "\6{\"architecture\":{\"hidden\":64,\"head_dim\":16,\"vocab\":100,\"layers\":[{\"heads\":4,\"kv_heads\":2,"
    "\"ffn\":128},{\"heads\":4,\"kv_heads\":1,\"ffn\":0,\"experts\":4,\"expert_ffn\":32}],\"top_k\":2},"
    "\"target\":{\"device\":\"H100\",\"tp\":1,\"workload\":{\"batch\":2,\"prompt_len\":32,\"gen_len\":8,"
    "\"arrival_rate\":1.5,\"requests\":8,\"length_spread\":0.25}}}",
};

#define NSEEDS (sizeof seeds / sizeof *seeds)
#define GGUF_TARGET 10

/* The GGUF seeds (target 10): a one-layer model, and (hybrid) a
 * three-layer nemotron_h_moe (Mamba-2, attention, LatentMoE), with the
 * SentencePiece-style tokenizer of seeds[3], written by the exporter. */
static unsigned char *gguf_seed(size_t *n, int hybrid) {
    char dir[] = "/tmp/ac_fuzz_XXXXXX", tj[64], gp[64];
    if (!mkdtemp(dir)) return NULL;
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    snprintf(gp, sizeof gp, "%s/m.gguf", dir);
    FILE *f = fopen(tj, "w");
    if (!f) return NULL;
    fputs(seeds[3] + 1, f);
    fclose(f);
    ac_layer_arch L[3] = {{2, 1, 4, 0, 0, 0}, {0, 0, 0, 0, 0, 2}, {0, 0, 0, 2, 2, 0}};
    ac_arch a = {.vocab = 8,
                 .hidden = 4,
                 .head_dim = 2,
                 .n_layers = 1,
                 .max_pos = 16,
                 .eps = 1e-5f,
                 .rope_theta = 1e4f,
                 .bos_id = -1,
                 .eos_id = -1,
                 .layers = L};
    if (hybrid) { /* M * E: 2 Mamba heads of 2, state 2, kernel 2; 2 experts of 2 on a latent width of 2 */
        L[0] = L[1], L[1] = (ac_layer_arch){2, 1, 0, 0, 0, 0};
        snprintf(a.model_type, sizeof a.model_type, "nemotron_h");
        a.n_layers = 3, a.hybrid = 1, a.ssm_head_dim = 2, a.ssm_state = 2, a.ssm_groups = 1, a.ssm_conv = 2;
        a.ssm_conv_bias = 1, a.top_k = 1, a.norm_topk = 1, a.router_sigmoid = 1, a.routed_scale = 1;
        a.shared_ffn = 2, a.moe_latent = 2;
    }
    ac_model m;
    ac_err e;
    unsigned char *buf = NULL;
    if (ac_model_alloc(&m, &a, &e) == 0) {
        if (ac_gguf_write(&m, tj, gp, ST_F32, &e) == 0) buf = (unsigned char *)ac_read_file(gp, 1 << 20, n, &e);
        ac_model_free(&m);
    }
    remove(tj);
    remove(gp);
    remove(dir);
    return buf;
}

/* The seeds as files (a starting corpus for libFuzzer). */
static int write_seeds(const char *dir, unsigned char *const gg[2], const size_t gn[2]) {
    for (size_t s = 0; s < sizeof seeds / sizeof *seeds; s++) {
        char path[512];
        snprintf(path, sizeof path, "%s/seed-%02zu", dir, s);
        FILE *f = fopen(path, "wb");
        if (!f) {
            perror(path);
            return 1;
        }
        if (s == 0) { /* safetensors: target byte, length prefix, header, 8 data bytes */
            const char *h = seeds[0] + 1;
            uint64_t hl = strlen(h);
            fputc(0, f);
            fwrite(&hl, 8, 1, f);
            fwrite(h, 1, hl, f);
            fwrite("\0\0\0\0\0\0\0\0", 1, 8, f);
        } else
            fwrite(seeds[s], 1, strlen(seeds[s] + 1) + 1, f);
        if (fclose(f)) return 1;
    }
    for (int g = 0; g < 2; g++) {
        char path[512];
        snprintf(path, sizeof path, "%s/seed-%02zu", dir, NSEEDS + (size_t)g);
        FILE *f = fopen(path, "wb");
        if (!f || fputc(GGUF_TARGET, f) == EOF || fwrite(gg[g], 1, gn[g], f) != gn[g] || fclose(f)) {
            perror(path);
            return 1;
        }
    }
    printf("wrote %zu seeds to %s\n", NSEEDS + 2, dir);
    return 0;
}

/* Every number of every JSON seed replaced, one at a time, by each value
 * that overflows or underflows a conversion to an integer or a float
 * (1e300, 1e19, 2^32 + 0.5, ...) and run through its parser: what
 * `make test-asan` runs under UBSan's float-cast-overflow, so a value used
 * before it is ranged stops the program. Returns the number of inputs. */
static long run_extremes(void) {
    static const char *const ext[] = {"1e300", "-1e300", "1e19",  "-1e19", "4294967296.5", "2147483648",
                                      "-2147483649", "1e-300", "-0.0", "0", "1e38", "3.5e38"};
    char buf[8192];
    long runs = 0;
    for (size_t s = 1; s < NSEEDS; s++) {
        const char *sd = seeds[s];
        size_t len = strlen(sd + 1) + 1;
        if (sd[0] == 2 || sd[0] == 9) continue; /* tokenizers, text: numbers there are ids, not sizes */
        for (size_t at = 1; at < len; at++) {
            /* a number starts at a digit or '-' not inside a word or a string value's letters */
            int start = (sd[at] == '-' || (sd[at] >= '0' && sd[at] <= '9')) &&
                        (sd[at - 1] == ':' || sd[at - 1] == '[' || sd[at - 1] == ',');
            if (!start) continue;
            size_t end = at + 1;
            while (end < len && strchr("0123456789.eE+-", sd[end])) end++;
            for (size_t x = 0; x < sizeof ext / sizeof *ext; x++) {
                size_t el = strlen(ext[x]), n = at + el + (len - end);
                if (n > sizeof buf) continue;
                memcpy(buf, sd, at);
                memcpy(buf + at, ext[x], el);
                memcpy(buf + at + el, sd + end, len - end);
                LLVMFuzzerTestOneInput((const uint8_t *)buf, n);
                runs++;
            }
        }
    }
    return runs;
}

/* The scratch directory of target 4 and what the fuzzing left in it. */
static void remove_scratch(void) {
    char p2[160];
    if (!scratch[0]) return;
    snprintf(p2, sizeof p2, "%s/model.safetensors.index.json", scratch);
    unlink(p2);
    snprintf(p2, sizeof p2, "%s/model-00001-of-00001.safetensors", scratch);
    unlink(p2);
    rmdir(scratch);
}

int main(int argc, char **argv) {
    size_t gn[2] = {0, 0};
    unsigned char *gg[2] = {gguf_seed(&gn[0], 0), gguf_seed(&gn[1], 1)}; /* llama, nemotron_h_moe */
    for (int g = 0; g < 2; g++) {
        ac_model gm;
        ac_tokenizer *gt;
        ac_err ge;
        if (!gg[g] || gn[g] + 1 > 8192 || ac_gguf_load_buf(gg[g], gn[g], &gm, &gt, &ge)) {
            fprintf(stderr, "fuzz_parsers: cannot build GGUF seed %d (%zu bytes)\n", g, gn[g]);
            return 1;
        }
        ac_model_free(&gm);
        ac_tok_free(gt);
    }
    if (argc > 2 && !strcmp(argv[1], "--seeds")) {
        int rc = write_seeds(argv[2], gg, gn);
        free(gg[0]), free(gg[1]);
        return rc;
    }
    if (argc > 2 && !strcmp(argv[1], "--run")) { /* replay inputs (crashes, OOMs found by libFuzzer) */
        for (int i = 2; i < argc; i++) {
            ac_err e;
            size_t n;
            char *d = ac_read_file(argv[i], 1u << 24, &n, &e);
            if (!d) {
                fprintf(stderr, "%s\n", e.msg);
                return 1;
            }
            LLVMFuzzerTestOneInput((const uint8_t *)d, n);
            free(d);
        }
        printf("replayed %d inputs\n", argc - 2);
        free(gg[0]), free(gg[1]);
        remove_scratch();
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--extremes")) {
        long n = run_extremes();
        printf("ran %ld inputs with extreme numbers without a crash\n", n);
        free(gg[0]), free(gg[1]);
        remove_scratch();
        return 0;
    }
    long iters = argc > 1 ? atol(argv[1]) : 20000;
    unsigned seed = argc > 2 ? (unsigned)atoi(argv[2]) : 1;
    srand(seed);
    unsigned char buf[8192];
    for (long i = 0; i < iters; i++) {
        int s = (int)(i % (long)(NSEEDS + 2));
        size_t n = s == 0               ? 8 + strlen(seeds[0] + 1) + 1
                   : s < (int)NSEEDS ? strlen(seeds[s] + 1) + 1
                                       : gn[s - NSEEDS] + 1;
        if (s >= (int)NSEEDS) {
            buf[0] = GGUF_TARGET;
            memcpy(buf + 1, gg[s - NSEEDS], gn[s - NSEEDS]);
        } else if (s == 0) { /* safetensors: length prefix + header + 8 data bytes */
            const char *h = seeds[0] + 1;
            size_t hl = strlen(h);
            buf[0] = 0;
            for (int k = 0; k < 8; k++) buf[1 + k] = (unsigned char)(hl >> (8 * k));
            memcpy(buf + 9, h, hl);
            memset(buf + 9 + hl, 0, 8);
            n = 9 + hl + 8;
        } else
            memcpy(buf, seeds[s], n);
        int muts = 1 + rand() % 8;
        for (int m = 0; m < muts && n > 2; m++) {
            size_t at = 1 + (size_t)rand() % (n - 1);
            switch (rand() % 4) {
            case 0: buf[at] = (unsigned char)rand(); break;
            case 1: buf[at] ^= (unsigned char)(1 << (rand() % 8)); break;
            case 2:
                if (n > 2) n = at;
                break; /* truncate */
            default: buf[at] = "{}[]\",:0123456789e-"[rand() % 19];
            }
        }
        LLVMFuzzerTestOneInput(buf, n);
    }
    free(gg[0]), free(gg[1]);
    printf("fuzzed %ld inputs without a crash\n", iters);
    remove_scratch();
    return 0;
}
#endif
