/*
 * fuzz_parsers - fuzz entry for the parsers of outside input: safetensors
 * header, config.json, tokenizer.json, job spec, GGUF file. Built two ways:
 *  - with -DAC_LIBFUZZER and clang -fsanitize=fuzzer: a libFuzzer target;
 *  - plain (default): `fuzz_parsers N SEED` runs N random mutations of
 *    built-in seeds through every parser (used by the test suite under ASan).
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "job.h"
#include "model.h"
#include "safetensors.h"
#include "tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    ac_err e;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    switch (data[0] % 5) {
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
    "\1{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":2,\"num_attention_heads\":2,\"intermediate_size\":16,"
    "\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":1,\"high_freq_factor\":4,\"original_max_position_embeddings\":64}}",
    "\2{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]},\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}",
    "\2{\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"fuse_unk\":true,\"unk_token\":\"<unk>\",\"vocab\":{\"<unk>\":0,\"<0x68>\":1,"
    "\"\\u2581\":2,\"o\":3,\"\\u2581o\":4},\"merges\":[\"\\u2581 o\"]},\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":"
    "\"Prepend\",\"prepend\":\"\\u2581\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"}]}}",
    "\2{\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"vocab\":{\"<unk>\":0,\"\\u2581\":1,\"o\":2,\"\\u2581o\":3},\"merges\":[[\"\\u2581\",\"o\"]]},"
    "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"first\",\"split\":true}}",
    "\3{\"model\":\"/m\",\"calibration\":\"/c.txt\",\"output\":\"/o\",\"target\":{\"device\":\"H100\"},\"constraints\":{\"max_tpot_ms\":5}}",
};

/* The GGUF seed: a one-layer model with the SentencePiece-style tokenizer
 * of seeds[3], written by the exporter. */
static unsigned char *gguf_seed(size_t *n) {
    char dir[] = "/tmp/ac_fuzz_XXXXXX", tj[64], gp[64];
    if (!mkdtemp(dir)) return NULL;
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    snprintf(gp, sizeof gp, "%s/m.gguf", dir);
    FILE *f = fopen(tj, "w");
    if (!f) return NULL;
    fputs(seeds[3] + 1, f);
    fclose(f);
    ac_layer_arch L = {2, 1, 4};
    ac_arch a = {.vocab = 8, .hidden = 4, .head_dim = 2, .n_layers = 1, .max_pos = 16, .eps = 1e-5f, .rope_theta = 1e4f, .bos_id = -1,
                 .eos_id = -1, .layers = &L};
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

int main(int argc, char **argv) {
    long iters = argc > 1 ? atol(argv[1]) : 20000;
    unsigned seed = argc > 2 ? (unsigned)atoi(argv[2]) : 1;
    srand(seed);
    size_t gn = 0;
    unsigned char *gg = gguf_seed(&gn);
    ac_model gm;
    ac_tokenizer *gt;
    ac_err ge;
    if (!gg || gn + 1 > 8192 || ac_gguf_load_buf(gg, gn, &gm, &gt, &ge)) { fprintf(stderr, "fuzz_parsers: cannot build the GGUF seed\n"); return 1; }
    ac_model_free(&gm);
    ac_tok_free(gt);
    unsigned char buf[8192];
    for (long i = 0; i < iters; i++) {
        int s = (int)(i % 5);
        size_t n = s == 0 ? 8 + strlen(seeds[0] + 1) + 1 : s < 4 ? strlen(seeds[s] + 1) + 1 : gn + 1;
        if (s == 4) {
            buf[0] = 4;
            memcpy(buf + 1, gg, gn);
        } else if (s == 0) { /* safetensors: length prefix + header + 8 data bytes */
            const char *h = seeds[0] + 1;
            size_t hl = strlen(h);
            buf[0] = 0;
            for (int k = 0; k < 8; k++) buf[1 + k] = (unsigned char)(hl >> (8 * k));
            memcpy(buf + 9, h, hl);
            memset(buf + 9 + hl, 0, 8);
            n = 9 + hl + 8;
        } else memcpy(buf, seeds[s], n);
        int muts = 1 + rand() % 8;
        for (int m = 0; m < muts && n > 2; m++) {
            size_t at = 1 + (size_t)rand() % (n - 1);
            switch (rand() % 4) {
            case 0: buf[at] = (unsigned char)rand(); break;
            case 1: buf[at] ^= (unsigned char)(1 << (rand() % 8)); break;
            case 2: if (n > 2) n = at; break; /* truncate */
            default: buf[at] = "{}[]\",:0123456789e-"[rand() % 19];
            }
        }
        LLVMFuzzerTestOneInput(buf, n);
    }
    free(gg);
    printf("fuzzed %ld inputs without a crash\n", iters);
    return 0;
}
#endif
