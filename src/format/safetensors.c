/*
 * safetensors.c - see safetensors.h. The header is untrusted input: every
 * field is checked (length bound, JSON shape, dtype, shape/offset agreement,
 * contiguous coverage of the data buffer, no duplicates) before a tensor
 * pointer is handed out. Fuzzed by tests/fuzz_safetensors.c.
 */
#include "format/safetensors.h"
#include "core/fsafe.h"
#include "core/fsafe_write.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int64_t st_numel(const st_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

static int cmp_begin(const void *a, const void *b) {
    const st_tensor *x = *(st_tensor *const *)a, *y = *(st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static void free_tensors(st_file *f) {
    for (int i = 0; i < f->n; i++) free(f->t[i].name);
    free(f->t);
    f->t = NULL;
    f->n = 0;
}

static int check_metadata(const json_t *v, ac_err *e) {
    if (!json_is_object(v)) return ac_errf(e, "__metadata__ is not an object");
    const char *mk;
    json_t *mv;
    json_object_foreach((json_t *)v, mk,
                        mv) if (!json_is_string(mv)) return ac_errf(e, "__metadata__.%s is not a string", mk);
    return 0;
}

/* One tensor entry {dtype, shape, data_offsets} of the header into t
 * (t->name and t->data set last), checked against the data length. */
static int parse_entry(const char *key, const json_t *v, const unsigned char *data, uint64_t data_len, st_tensor *t,
                       ac_err *e) {
    if (!json_is_object(v)) return ac_errf(e, "tensor %s: entry is not an object", key);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) || json_array_size(jo) != 2)
        return ac_errf(e, "tensor %s: needs dtype (string), shape (array), data_offsets ([begin,end])", key);
    if (json_object_size(v) != 3) return ac_errf(e, "tensor %s: unexpected fields in entry", key);
    if (st_dtype_parse(json_string_value(jd), &t->dtype))
        return ac_errf(e, "tensor %s: unknown dtype %s", key, json_string_value(jd));
    size_t nd = json_array_size(js);
    if (nd > ST_MAX_DIMS) return ac_errf(e, "tensor %s: %zu dimensions (max %d)", key, nd, ST_MAX_DIMS);
    t->ndim = (int)nd;
    unsigned __int128 numel = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return ac_errf(e, "tensor %s: shape[%zu] is not a non-negative integer", key, i);
        t->shape[i] = json_integer_value(d);
        numel *= (unsigned __int128)t->shape[i];
        if (numel > ((unsigned __int128)1 << 62)) return ac_errf(e, "tensor %s: shape too large", key);
    }
    json_t *b = json_array_get(jo, 0), *en = json_array_get(jo, 1);
    if (!json_is_integer(b) || !json_is_integer(en) || json_integer_value(b) < 0 ||
        json_integer_value(en) < json_integer_value(b))
        return ac_errf(e, "tensor %s: bad data_offsets", key);
    t->begin = (uint64_t)json_integer_value(b);
    t->end = (uint64_t)json_integer_value(en);
    if (t->end > data_len)
        return ac_errf(e, "tensor %s: data_offsets end %llu beyond data (%llu bytes); file truncated?", key,
                       (unsigned long long)t->end, (unsigned long long)data_len);
    unsigned __int128 want = numel * st_dtype_size(t->dtype);
    if (want != t->end - t->begin)
        return ac_errf(e, "tensor %s: shape needs %llu bytes but offsets give %llu", key, (unsigned long long)want,
                       (unsigned long long)(t->end - t->begin));
    if (!(t->name = strdup(key))) return ac_errf(e, "out of memory");
    t->data = data + t->begin;
    return 0;
}

/* The tensors, sorted by offset, must tile the data buffer exactly. */
static int check_coverage(st_tensor **order, int n, uint64_t data_len, ac_err *e) {
    qsort(order, n, sizeof *order, cmp_begin);
    uint64_t pos = 0;
    for (int i = 0; i < n; i++) {
        if (order[i]->begin != pos)
            return ac_errf(e, "tensor %s: data at %llu but expected %llu (gap or overlap)", order[i]->name,
                           (unsigned long long)order[i]->begin, (unsigned long long)pos);
        pos = order[i]->end;
    }
    if (pos != data_len)
        return ac_errf(e, "data buffer has %llu bytes but tensors cover %llu", (unsigned long long)data_len,
                       (unsigned long long)pos);
    return 0;
}

/* The header's JSON object (only whitespace or NULs may pad it). */
static json_t *parse_header(const unsigned char *p, uint64_t hn, ac_err *e) {
    json_error_t je;
    json_t *root = json_loadb((const char *)p + 8, hn, JSON_REJECT_DUPLICATES | JSON_DISABLE_EOF_CHECK, &je);
    char why[160];
    if (!root) {
        ac_errf(e, "header JSON: %s (at byte %d)", ac_fsafe_json_why(je.text, why, sizeof why), je.position);
        return NULL;
    }
    for (size_t i = je.position; i < hn; i++)
        if (p[8 + i] != ' ' && p[8 + i] != '\n' && p[8 + i] != '\t' && p[8 + i] != '\r' && p[8 + i] != 0) {
            json_decref(root);
            ac_errf(e, "garbage after header JSON at byte %zu", i);
            return NULL;
        }
    if (!json_is_object(root)) {
        json_decref(root);
        ac_errf(e, "header is not a JSON object");
        return NULL;
    }
    return root;
}

int st_parse(const void *buf, size_t len, st_file *f, ac_err *e) {
    memset(f, 0, sizeof *f);
    const unsigned char *p = buf;
    if (len < 8) return ac_errf(e, "file too short for a safetensors header (%zu bytes)", len);
    uint64_t hn = 0;
    for (int i = 7; i >= 0; i--) hn = (hn << 8) | p[i];
    if (hn > ST_MAX_HEADER)
        return ac_errf(e, "header length %llu exceeds limit %llu", (unsigned long long)hn, ST_MAX_HEADER);
    if (hn > len - 8)
        return ac_errf(e, "header length %llu runs past end of file (%zu bytes)", (unsigned long long)hn, len);
    if (hn < 2 || p[8] != '{') return ac_errf(e, "header is not a JSON object");
    uint64_t data_len = len - 8 - hn;
    json_t *root = parse_header(p, hn, e);
    if (!root) return -1;
    size_t nkeys = json_object_size(root);
    f->t = calloc(nkeys ? nkeys : 1, sizeof *f->t);
    st_tensor **order = calloc(nkeys ? nkeys : 1, sizeof *order);
    if (!f->t || !order) {
        free(f->t);
        f->t = NULL;
        free(order);
        json_decref(root);
        return ac_errf(e, "out of memory");
    }
    const char *key;
    json_t *v;
    int rc = 0;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            if ((rc = check_metadata(v, e))) break;
            continue;
        }
        st_tensor *t = &f->t[f->n];
        if ((rc = parse_entry(key, v, p + 8 + hn, data_len, t, e))) break;
        order[f->n++] = t;
    }
    json_decref(root);
    if (!rc) rc = check_coverage(order, f->n, data_len, e);
    free(order);
    if (rc) free_tensors(f);
    return rc;
}

int st_open(const char *path, st_file *f, ac_err *e) {
    memset(f, 0, sizeof *f);
    size_t len;
    int fd = ac_fsafe_open(path, AC_FK_WEIGHTS, &len, e); /* confined, regular file */
    if (fd < 0) return -1;
    void *map = len ? mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (len && map == MAP_FAILED) return ac_errf(e, "cannot mmap %s: %s", path, strerror(errno));
    if (st_parse(map, len, f, e)) {
        if (map) munmap(map, len);
        return ac_errctx(e, "%s", path);
    }
    f->map = map;
    f->map_len = len;
    f->path = strdup(path);
    return 0;
}

void st_close(st_file *f) {
    free_tensors(f);
    if (f->map) munmap(f->map, f->map_len);
    free(f->path);
    memset(f, 0, sizeof *f);
}

const st_tensor *st_find(const st_file *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->t[i].name, name) == 0) return &f->t[i];
    return NULL;
}

int st_set_open(const char *dir, st_set *s, ac_err *e) {
    memset(s, 0, sizeof *s);
    char path[4096];
    if (ac_fsafe_join(dir, "model.safetensors.index.json", path, sizeof path, e)) return -1;
    if (!ac_fsafe_present(path)) {
        if (ac_fsafe_join(dir, "model.safetensors", path, sizeof path, e)) return -1;
        s->files = calloc(1, sizeof *s->files);
        if (!s->files) return ac_errf(e, "out of memory");
        if (st_open(path, &s->files[0], e)) {
            free(s->files);
            s->files = NULL;
            return -1;
        }
        s->n = 1;
        return 0;
    }
    json_t *idx = ac_fsafe_json(path, AC_FK_INDEX, e);
    if (!idx) return -1;
    json_t *wm = json_object_get(idx, "weight_map");
    if (!json_is_object(wm)) {
        json_decref(idx);
        return ac_errf(e, "%s: missing weight_map object", path);
    }
    /* Distinct shard names, in first-seen order. */
    size_t cap = json_object_size(wm);
    const char **shards = calloc(cap ? cap : 1, sizeof *shards);
    int ns = 0;
    const char *k;
    json_t *v;
    int rc = 0;
    json_object_foreach(wm, k, v) {
        if (!json_is_string(v)) {
            rc = ac_errf(e, "%s: weight_map.%s is not a string", path, k);
            break;
        }
        const char *sn = json_string_value(v);
        if (strchr(sn, '/') || strcmp(sn, "..") == 0) {
            rc = ac_errf(e, "%s: shard name %s must be a file in the model directory", path, sn);
            break;
        }
        int found = 0;
        for (int i = 0; i < ns; i++)
            if (strcmp(shards[i], sn) == 0) found = 1;
        if (!found) shards[ns++] = sn;
    }
    if (!rc) {
        s->files = calloc(ns ? ns : 1, sizeof *s->files);
        for (int i = 0; i < ns && !rc; i++) {
            char sp[4096];
            if (ac_fsafe_join(dir, shards[i], sp, sizeof sp, e) || st_open(sp, &s->files[i], e))
                rc = -1;
            else
                s->n++;
        }
    }
    if (!rc) {
        json_object_foreach(wm, k, v) {
            const char *sn = json_string_value(v);
            const st_tensor *t = NULL;
            for (int i = 0; i < s->n; i++) {
                const char *base = strrchr(s->files[i].path, '/');
                if (strcmp(base ? base + 1 : s->files[i].path, sn) == 0) t = st_find(&s->files[i], k);
            }
            if (!t) {
                rc = ac_errf(e, "%s: tensor %s is not in shard %s", path, k, sn);
                break;
            }
        }
    }
    free(shards);
    json_decref(idx);
    if (rc) st_set_close(s);
    return rc;
}

void st_set_close(st_set *s) {
    for (int i = 0; i < s->n; i++) st_close(&s->files[i]);
    free(s->files);
    memset(s, 0, sizeof *s);
}

const st_tensor *st_set_find(const st_set *s, const char *name) {
    for (int i = 0; i < s->n; i++) {
        const st_tensor *t = st_find(&s->files[i], name);
        if (t) return t;
    }
    return NULL;
}

static uint64_t wt_bytes(const st_wtensor *t) {
    uint64_t n = st_dtype_size(t->dtype);
    for (int i = 0; i < t->ndim; i++) n *= (uint64_t)t->shape[i];
    return n;
}

int st_write(const char *path, const st_wtensor *t, int n, ac_err *e) {
    json_t *h = json_object();
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        json_t *shape = json_array();
        for (int d = 0; d < t[i].ndim; d++) json_array_append_new(shape, json_integer(t[i].shape[d]));
        uint64_t nb = wt_bytes(&t[i]);
        json_object_set_new(h, t[i].name,
                            json_pack("{s:s,s:o,s:[I,I]}", "dtype", st_dtype_name(t[i].dtype), "shape", shape,
                                      "data_offsets", (json_int_t)off, (json_int_t)(off + nb)));
        off += nb;
    }
    char *hs = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    if (!hs) return ac_errf(e, "out of memory serialising header");
    size_t hl = strlen(hs), padded = (hl + 7) & ~(size_t)7;
    ac_wfile w; /* a temporary beside path, renamed into place (confined: fsafe_write.h) */
    if (ac_fsafe_create(path, &w, e)) {
        free(hs);
        return -1;
    }
    FILE *fp = w.f;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    int ok = fwrite(len8, 1, 8, fp) == 8 && fwrite(hs, 1, hl, fp) == hl;
    for (size_t i = hl; i < padded && ok; i++) ok = fputc(' ', fp) != EOF;
    free(hs);
    for (int i = 0; i < n && ok; i++) {
        uint64_t nb = wt_bytes(&t[i]);
        ok = nb == 0 || fwrite(t[i].data, 1, nb, fp) == nb;
    }
    if (!ok) {
        int err = errno;
        ac_fsafe_discard(&w);
        return ac_errf(e, "cannot write %s: %s", path, strerror(err));
    }
    return ac_fsafe_commit(&w, e);
}

int st_write_sharded(const char *dir, const st_wtensor *t, int n, uint64_t max_shard_bytes, ac_err *e) {
    uint64_t total = 0;
    for (int i = 0; i < n; i++) total += wt_bytes(&t[i]);
    char path[4096];
    if (total <= max_shard_bytes) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        return st_write(path, t, n, e);
    }
    /* Split greedily into shards; count first so names carry the total. */
    int nshards = 0;
    uint64_t cur = 0;
    for (int i = 0; i < n; i++) {
        uint64_t nb = wt_bytes(&t[i]);
        if (i == 0 || (cur + nb > max_shard_bytes && cur > 0)) {
            nshards++;
            cur = 0;
        }
        cur += nb;
    }
    json_t *wm = json_object();
    int start = 0, shard = 0;
    while (start < n) {
        int end = start;
        cur = 0;
        while (end < n && (end == start || cur + wt_bytes(&t[end]) <= max_shard_bytes)) cur += wt_bytes(&t[end++]);
        shard++;
        char name[128];
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", shard, nshards);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if (st_write(path, t + start, end - start, e)) {
            json_decref(wm);
            return -1;
        }
        for (int i = start; i < end; i++) json_object_set_new(wm, t[i].name, json_string(name));
        start = end;
    }
    json_t *idx = json_pack("{s:{s:I},s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", wm);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    int rc = ac_fsafe_write_json(path, idx, JSON_INDENT(2) | JSON_PRESERVE_ORDER, e);
    json_decref(idx);
    return rc;
}
