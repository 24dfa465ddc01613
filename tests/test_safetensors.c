/* test_safetensors.c - reader validation on corrupt input, writer round trip,
 * sharded sets, dtype conversions. */
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "check.h"
#include "format/model.h"
#include "format/safetensors.h"
#include "core/tensor.h"

/* Build an image from a header string and n data bytes. */
static size_t mk(unsigned char *buf, const char *hdr, size_t ndata) {
    size_t hl = strlen(hdr);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, hdr, hl);
    memset(buf + 8 + hl, 0x3c, ndata);
    return 8 + hl + ndata;
}

static int parse_fails(const char *hdr, size_t ndata, const char *want) {
    unsigned char buf[4096];
    size_t n = mk(buf, hdr, ndata);
    st_file f;
    ac_err e = {{0}};
    int rc = st_parse(buf, n, &f, &e);
    if (rc == 0) {
        st_close(&f);
        return 0;
    }
    if (want && !strstr(e.msg, want)) {
        fprintf(stderr, "  message '%s' lacks '%s'\n", e.msg, want);
        return 0;
    }
    return 1;
}

static void test_valid_header(void) {
    unsigned char buf[4096];
    size_t n =
        mk(buf,
           "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
           "\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[16,22]},\"s\":{\"dtype\":\"F32\",\"shape\":[],"
           "\"data_offsets\":[22,26]},"
           "\"z\":{\"dtype\":\"F16\",\"shape\":[0,4],\"data_offsets\":[26,26]}}",
           26);
    st_file f;
    ac_err e = {{0}};
    CHECK(st_parse(buf, n, &f, &e) == 0, "%s", e.msg);
    CHECK(f.n == 4, "n=%d", f.n);
    const st_tensor *b = st_find(&f, "b");
    CHECK(b && b->dtype == ST_BF16 && b->shape[0] == 3 && st_numel(b) == 3, "b");
    const st_tensor *s = st_find(&f, "s");
    CHECK(s && s->ndim == 0 && st_numel(s) == 1, "scalar");
    st_close(&f);
}

static void test_corrupt_headers(void) {
    CHECK(parse_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "beyond data"),
          "truncated data");
    CHECK(parse_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "shape needs"),
          "shape mismatch");
    CHECK(parse_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\","
                      "\"shape\":[2],\"data_offsets\":[4,12]}}",
                      12, "overlap"),
          "overlap");
    CHECK(parse_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "gap"), "gap at start");
    CHECK(parse_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, "cover"),
          "trailing bytes");
    CHECK(parse_fails("{\"a\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype"), "dtype");
    CHECK(parse_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "non-negative"),
          "neg shape");
    CHECK(parse_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"F32\","
                      "\"shape\":[1],\"data_offsets\":[4,8]}}",
                      8, "duplicate"),
          "dup keys");
    CHECK(parse_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]", 4, "JSON"), "bad json");
    CHECK(parse_fails("[1,2]", 0, "object"), "not object");
    CHECK(parse_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,4]}}", 4,
                      "too large"),
          "overflow");
    CHECK(parse_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8, "data_offsets"),
          "reversed offsets");
    CHECK(parse_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4, "unexpected"),
          "extra field");
    /* header length beyond the file, and above the hard limit */
    unsigned char buf[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'};
    st_file f;
    ac_err e = {{0}};
    CHECK(st_parse(buf, 10, &f, &e) != 0 && strstr(e.msg, "past end"), "%s", e.msg);
    unsigned char big[16] = {0, 0, 0, 0, 0, 1, 0, 0, '{', '}'};
    CHECK(st_parse(big, 10, &f, &e) != 0 && strstr(e.msg, "exceeds limit"), "%s", e.msg);
    CHECK(st_parse(buf, 5, &f, &e) != 0, "too short");
}

static void test_every_truncation(void) {
    /* Cutting a valid file at every length must fail cleanly, never crash. */
    unsigned char buf[4096];
    size_t n = mk(buf,
                  "{\"a\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[0,12]},\"b\":{\"dtype\":\"F32\","
                  "\"shape\":[1],\"data_offsets\":[12,16]}}",
                  16);
    int ok = 1;
    for (size_t cut = 0; cut < n; cut++) {
        st_file f;
        ac_err e;
        if (st_parse(buf, cut, &f, &e) == 0) {
            ok = 0;
            st_close(&f);
        }
    }
    CHECK(ok, "a truncated image parsed");
}

static void test_write_roundtrip_and_shards(void) {
    char dir[] = "/tmp/ac_st_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    float a[6] = {1, -2, 3.5f, 0, 1e-3f, 65504};
    uint16_t b[6];
    ac_err e = {{0}};
    CHECK(ac_from_f32(b, a, ST_BF16, 6, &e) == 0, "conv");
    st_wtensor t[3] = {{"x.weight", ST_F32, 2, {2, 3}, a}, {"y", ST_BF16, 1, {6}, b}, {"z", ST_F32, 1, {6}, a}};
    CHECK(st_write_sharded(dir, t, 3, 40, &e) == 0, "%s", e.msg);
    st_set s;
    CHECK(st_set_open(dir, &s, &e) == 0, "%s", e.msg);
    CHECK(s.n == 2, "expected 2 shards, got %d", s.n);
    const st_tensor *x = st_set_find(&s, "x.weight"), *y = st_set_find(&s, "y"), *z = st_set_find(&s, "z");
    CHECK(x && y && z, "find");
    if (x && y) {
        CHECK(memcmp(x->data, a, 24) == 0, "x data");
        float back[6];
        ac_to_f32(back, y->data, y->dtype, 6, &e);
        for (int i = 0; i < 6; i++)
            CHECK(fabsf(back[i] - a[i]) <= fabsf(a[i]) / 128 + 1e-6f, "bf16 %d %g %g", i, back[i], a[i]);
    }
    st_set_close(&s);
    /* header padded to a multiple of 8 */
    char p[512];
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    FILE *fp = fopen(p, "rb");
    uint64_t hl = 0;
    if (fp) {
        CHECK(fread(&hl, 8, 1, fp) == 1, "read");
        fclose(fp);
    }
    CHECK(hl % 8 == 0 && hl > 0, "header length %llu", (unsigned long long)hl);
    /* index naming a missing tensor */
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    fp = fopen(p, "w");
    fprintf(fp, "{\"weight_map\":{\"nope\":\"model-00001-of-00002.safetensors\"}}");
    fclose(fp);
    CHECK(st_set_open(dir, &s, &e) != 0 && strstr(e.msg, "nope"), "%s", e.msg);
    fp = fopen(p, "w");
    fprintf(fp, "{\"weight_map\":{\"x.weight\":\"../etc/passwd\"}}");
    fclose(fp);
    CHECK(st_set_open(dir, &s, &e) != 0 && strstr(e.msg, "model directory"), "%s", e.msg);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "cleanup");
}

static void test_half_conversions(void) {
    /* fp16: exact for representable values, RNE for others, inf/nan/subnormal. */
    CHECK(ac_f16_to_f32(0x3c00) == 1.0f, "one");
    CHECK(ac_f16_to_f32(0x0001) == ldexpf(1, -24), "subnormal");
    CHECK(ac_f32_to_f16(65504.0f) == 0x7bff, "max");
    CHECK(ac_f32_to_f16(70000.0f) == 0x7c00, "overflow");
    CHECK(ac_f32_to_f16(ldexpf(1, -24)) == 0x0001, "to subnormal");
    CHECK(ac_f32_to_f16(1.0f + ldexpf(1, -11)) == 0x3c00, "tie to even");
    CHECK(ac_f32_to_f16(1.0f + 3 * ldexpf(1, -11)) == 0x3c02, "tie to even up");
    int bad = 0;
    for (uint32_t h = 0; h < 0x7c00; h++)
        if (ac_f32_to_f16(ac_f16_to_f32((uint16_t)h)) != h) bad++;
    CHECK(bad == 0, "%d fp16 values do not round trip", bad);
    CHECK(ac_f32_to_bf16(1.00390625f) == 0x3f80, "bf16 tie to even");
    CHECK(ac_f32_to_bf16(1.01171875f) == 0x3f82, "bf16 tie up");
    CHECK(isnan(ac_bf16_to_f32(ac_f32_to_bf16(NAN))), "nan");
}

/* 16-bit weights at an odd address (a GGUF tensor's offset need not be
 * even): converted byte-wise, no misaligned load (make test-asan runs this
 * under UBSan), values against an independent decoding of the bits. */
static double ref_half(uint16_t h, int bf16) {
    if (bf16) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    int s = h >> 15, ex = (h >> 10) & 31, m = h & 1023;
    double v = ex == 0 ? ldexp(m, -24) : ex == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, ex - 25);
    return s ? -v : v;
}

static void test_unaligned_half_conversion(void) {
    unsigned char raw[2 * 37 + 1];
    for (size_t i = 0; i < sizeof raw; i++) raw[i] = (unsigned char)(i * 37 + 11);
    raw[1 + 2 * 5 + 1] = 0x7c; /* an F16 infinity among them: the exponent's top bits */
    raw[1 + 2 * 5] = 0;
    for (int bf = 0; bf < 2; bf++) {
        float out[37];
        ac_err e;
        CHECK(ac_to_f32(out, raw + 1, bf ? ST_BF16 : ST_F16, 37, &e) == 0, "%s", e.msg);
        for (int i = 0; i < 37; i++) {
            uint16_t h = (uint16_t)(raw[1 + 2 * i] | raw[2 + 2 * i] << 8);
            double r = ref_half(h, bf);
            CHECK((isnan(r) && isnan(out[i])) || (double)out[i] == r, "%s %d: %g vs %g", bf ? "bf16" : "f16", i, out[i], r);
        }
    }
}

/* config.json's bounds as docs/formats.md states them: each count at its
 * largest value is not refused for that count, one above is, naming the
 * entry; each real value at the top of its range is not refused for it,
 * just above or at the bottom (excluded) is. */
static int config_refuses(const char *key, json_t *val, const char *rope_key) {
    json_t *c = json_pack("{s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:f,s:f}", "model_type", "llama", "vocab_size", 16,
                          "hidden_size", 8, "num_hidden_layers", 2, "num_attention_heads", 2, "num_key_value_heads", 1,
                          "head_dim", 4, "intermediate_size", 12, "max_position_embeddings", 64, "rope_theta", 1e4,
                          "rms_norm_eps", 1e-5);
    if (rope_key) {
        json_t *rs = json_pack("{s:s,s:f,s:f,s:f,s:i}", "rope_type", "llama3", "factor", 8.0, "low_freq_factor", 1.0,
                               "high_freq_factor", 4.0, "original_max_position_embeddings", 32);
        json_object_set_new(rs, rope_key, val);
        json_object_set_new(c, "rope_scaling", rs);
    } else
        json_object_set_new(c, key, val);
    ac_arch a;
    ac_err e = {{0}};
    int rc = ac_arch_from_config(c, &a, &e);
    json_decref(c);
    if (rc == 0) {
        ac_arch_free(&a);
        return 0;
    }
    char want[80];
    snprintf(want, sizeof want, "%s=", rope_key ? rope_key : key);
    /* refused for this entry's bound (not for another rule) */
    return strstr(e.msg, want) && (strstr(e.msg, "out of range") || strstr(e.msg, "must be above"));
}

static void test_config_bounds(void) {
    static const struct {
        const char *key;
        long long max;
    } ints[] = {{"num_hidden_layers", 4096},  {"hidden_size", 1 << 20}, {"intermediate_size", 1 << 20},
                {"num_attention_heads", 4096}, {"num_key_value_heads", 4096}, {"head_dim", 4096},
                {"vocab_size", 1 << 22},       {"max_position_embeddings", 1 << 24}};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        CHECK(!config_refuses(ints[i].key, json_integer(ints[i].max), NULL), "%s=%lld refused", ints[i].key,
              ints[i].max);
        CHECK(config_refuses(ints[i].key, json_integer(ints[i].max + 1), NULL), "%s=%lld not refused", ints[i].key,
              ints[i].max + 1);
    }
    static const struct {
        const char *key;
        double hi;
        int rope;
    } nums[] = {{"rope_theta", 1e12, 0}, {"rms_norm_eps", 1, 0}, {"factor", 1e4, 1}, {"low_freq_factor", 1e4, 1}};
    for (size_t i = 0; i < sizeof nums / sizeof *nums; i++) {
        const char *rk = nums[i].rope ? nums[i].key : NULL;
        CHECK(!config_refuses(nums[i].key, json_real(nums[i].hi), rk), "%s=%g refused", nums[i].key, nums[i].hi);
        CHECK(config_refuses(nums[i].key, json_real(nums[i].hi * (1 + 1e-9)), rk), "%s just above %g not refused",
              nums[i].key, nums[i].hi);
        CHECK(config_refuses(nums[i].key, json_real(0), rk), "%s=0 not refused", nums[i].key);
    }
    /* a DeciLM block's ffn_mult: (0, 64] */
    const double fm[3] = {64, 64 * (1 + 1e-9), 0};
    for (int i = 0; i < 3; i++) {
        json_t *c = json_pack("{s:s,s:i,s:i,s:i,s:i,s:f,s:f,s:i,s:[{s:{s:i},s:{s:f}}]}", "model_type", "nemotron-nas",
                              "vocab_size", 16, "hidden_size", 8, "num_hidden_layers", 1, "num_attention_heads", 2,
                              "rope_theta", 1e4, "rms_norm_eps", 1e-5, "max_position_embeddings", 64, "block_configs",
                              "attention", "n_heads_in_group", 2, "ffn", "ffn_mult", fm[i]);
        ac_arch a;
        ac_err e = {{0}};
        int rc = ac_arch_from_config(c, &a, &e);
        json_decref(c);
        if (rc == 0) ac_arch_free(&a);
        int refused = rc != 0 && strstr(e.msg, "ffn_mult=") && strstr(e.msg, "must be above");
        CHECK(refused == (i > 0), "ffn_mult=%.10g: %s", fm[i], rc ? e.msg : "accepted");
    }
}

int main(void) {
    RUN(test_valid_header);
    RUN(test_corrupt_headers);
    RUN(test_every_truncation);
    RUN(test_write_roundtrip_and_shards);
    RUN(test_half_conversions);
    RUN(test_unaligned_half_conversion);
    RUN(test_config_bounds);
    return DONE();
}
