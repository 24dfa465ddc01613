/* tasks.c - see tasks.h. */
#include "runtime/tasks.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine.h"
#include "core/fsafe.h"
#include "format/gguf.h"

/* ---------------------------------------------------------------- parsing */

/* One line, its strings borrowed from the JSON value. For a plain line
 * ctx[i] is the one context and cont[i] choice i; for a partial-evaluation
 * line ctx[i] is choice i's context and cont[i] the shared continuation. */
typedef struct {
    json_t *j;
    int n, gold;
    const char *ctx[AC_MC_MAX_CHOICES], *cont[AC_MC_MAX_CHOICES];
    const char *delim;
    const char *norm[AC_MC_MAX_CHOICES]; /* the text whose length acc_norm divides by */
} mc_line;

static int str_array(json_t *a, const char *what, const char **out, int *n, ac_err *e) {
    if (!json_is_array(a) || json_array_size(a) < 1 || json_array_size(a) > AC_MC_MAX_CHOICES)
        return ac_errf(e, "\"%s\" must be an array of 1 to %d strings", what, AC_MC_MAX_CHOICES);
    *n = (int)json_array_size(a);
    for (int i = 0; i < *n; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_string(v)) return ac_errf(e, "\"%s\"[%d] must be a string", what, i);
        out[i] = json_string_value(v);
    }
    return 0;
}

static int parse_line(const char *s, size_t len, mc_line *L, ac_err *e) {
    json_error_t je;
    memset(L, 0, sizeof *L);
    L->j = json_loadb(s, len, JSON_REJECT_DUPLICATES, &je);
    if (!L->j) return ac_errf(e, "not JSON: %s", je.text);
    if (!json_is_object(L->j)) return ac_errf(e, "must be a JSON object");
    const char *k;
    json_t *v;
    json_object_foreach(L->j, k, v) {
        static const char *const known[] = {"context", "choices", "gold", "contexts", "continuation",
                                            "target_delimiter", "id", "meta", NULL};
        int i = 0;
        while (known[i] && strcmp(known[i], k)) i++;
        if (!known[i]) return ac_errf(e, "unknown field \"%.60s\"", k);
    }
    json_t *ctx = json_object_get(L->j, "context"), *ctxs = json_object_get(L->j, "contexts");
    if (!!ctx == !!ctxs) return ac_errf(e, "needs \"context\" (with \"choices\") or \"contexts\" (with \"continuation\")");
    if (ctx) {
        if (!json_is_string(ctx)) return ac_errf(e, "\"context\" must be a string");
        if (json_object_get(L->j, "continuation")) return ac_errf(e, "\"continuation\" goes with \"contexts\"");
        if (str_array(json_object_get(L->j, "choices"), "choices", L->cont, &L->n, e)) return -1;
        for (int i = 0; i < L->n; i++) L->ctx[i] = json_string_value(ctx), L->norm[i] = L->cont[i];
    } else {
        json_t *c = json_object_get(L->j, "continuation");
        if (!json_is_string(c)) return ac_errf(e, "\"continuation\" must be a string (with \"contexts\")");
        if (json_object_get(L->j, "choices")) return ac_errf(e, "\"choices\" goes with \"context\"");
        if (str_array(ctxs, "contexts", L->ctx, &L->n, e)) return -1;
        for (int i = 0; i < L->n; i++) L->cont[i] = json_string_value(c), L->norm[i] = L->ctx[i];
    }
    json_t *d = json_object_get(L->j, "target_delimiter");
    if (d && !json_is_string(d)) return ac_errf(e, "\"target_delimiter\" must be a string");
    L->delim = d ? json_string_value(d) : " ";
    json_t *g = json_object_get(L->j, "gold");
    if (!json_is_integer(g)) return ac_errf(e, "\"gold\" must be an integer (the index of the right choice)");
    if (json_integer_value(g) < 0 || json_integer_value(g) >= L->n)
        return ac_errf(e, "gold %lld is outside the %d choices", (long long)json_integer_value(g), L->n);
    L->gold = (int)json_integer_value(g);
    for (int i = 0; i < L->n; i++)
        if (!*L->delim && !*L->cont[i]) return ac_errf(e, "choice %d has an empty continuation", i);
    return 0;
}

/* Calls fn on each non-blank line of the file (1-based line numbers in
 * errors). */
static int each_line(const char *path, int (*fn)(void *ud, const mc_line *L, ac_err *e), void *ud, int *ndocs,
                     ac_err *e) {
    size_t len;
    char *text = ac_fsafe_read(path, AC_FK_TEXT, &len, e);
    if (!text) return -1;
    int rc = 0, lineno = 0, n = 0;
    for (size_t p = 0; p < len && !rc;) {
        size_t q = p;
        while (q < len && text[q] != '\n') q++;
        lineno++;
        size_t a = p;
        while (a < q && (text[a] == ' ' || text[a] == '\t' || text[a] == '\r')) a++;
        if (a < q) {
            mc_line L;
            rc = parse_line(text + p, q - p, &L, e) || (fn && fn(ud, &L, e));
            if (rc) ac_errctx(e, "%s line %d", path, lineno);
            json_decref(L.j);
            n++;
        }
        p = q + 1;
    }
    free(text);
    if (!rc && n == 0) rc = ac_errf(e, "%s: no questions (one JSON object a line)", path);
    if (ndocs) *ndocs = n;
    return rc ? -1 : 0;
}

int ac_mc_check_file(const char *path, int *ndocs, ac_err *e) { return each_line(path, NULL, NULL, ndocs, e); }

/* ---------------------------------------------------------------- tokenising */

typedef struct {
    const ac_tokenizer *t;
    int prefix_id, vocab;
    ac_mc_task *k;
    size_t cap_tok;
    int cap_req, cap_doc; /* entries allocated per request, per question */
} loader;

static int grow_tok(int **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    int *q = realloc(*p, c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

static int is_py_space(unsigned char c) { return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f); }

static double utf8_chars(const char *s) {
    double n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xc0) != 0x80;
    return n;
}

/* The harness's _encode_pair: ids of context, then of the continuation. */
static int encode_pair(loader *ld, const char *ctx, const char *delim, const char *choice, ac_err *e) {
    ac_mc_task *k = ld->k;
    size_t lc = strlen(ctx), ld_ = strlen(delim), lch = strlen(choice), sp = lc;
    while (sp > 0 && is_py_space((unsigned char)ctx[sp - 1])) sp--; /* trailing spaces move to the continuation */
    char *whole = malloc(lc + ld_ + lch + 1);
    if (!whole) return ac_errf(e, "out of memory");
    memcpy(whole, ctx, lc);
    memcpy(whole + lc, delim, ld_);
    memcpy(whole + lc + ld_, choice, lch + 1);
    int *ci = NULL, *wi = NULL;
    size_t nc = 0, nw = 0;
    int rc = 0;
    if (sp == 0) { /* empty context: the prefix token, then the whole continuation */
        if (ld->prefix_id < 0) rc = ac_errf(e, "empty context and the model has no BOS or EOS token");
        else rc = ac_tok_encode(ld->t, whole, lc + ld_ + lch, &wi, &nw, e);
    } else {
        rc = ac_tok_encode(ld->t, ctx, sp, &ci, &nc, e) || ac_tok_encode(ld->t, whole, lc + ld_ + lch, &wi, &nw, e);
    }
    free(whole);
    if (!rc && sp > 0 && nc == 0) rc = ac_errf(e, "the context has no tokens");
    size_t ncont = sp == 0 ? nw : nw > nc ? nw - nc : 0;
    if (!rc && ncont == 0) rc = ac_errf(e, "the continuation \"%.40s\" has no tokens of its own", choice);
    size_t nctx = sp == 0 ? 1 : nc, n = nctx + ncont;
    if (!rc && grow_tok(&k->tok, &ld->cap_tok, k->off[k->nreq] + n, sizeof *k->tok))
        rc = ac_errf(e, "out of memory");
    if (!rc) {
        int *dst = k->tok + k->off[k->nreq];
        if (sp == 0)
            dst[0] = ld->prefix_id;
        else
            memcpy(dst, ci, nc * sizeof *dst);
        memcpy(dst + nctx, wi + (nw - ncont), ncont * sizeof *dst);
        for (size_t i = 0; i < n; i++)
            if (ld->vocab > 0 && (dst[i] < 0 || dst[i] >= ld->vocab)) {
                rc = ac_errf(e, "token id %d outside the model's vocabulary of %d", dst[i], ld->vocab);
                break;
            }
        k->ncont[k->nreq] = (int)ncont;
        k->off[k->nreq + 1] = k->off[k->nreq] + n;
    }
    free(ci);
    free(wi);
    return rc ? -1 : 0;
}

/* Room for nreq requests and ndocs questions (plus the end markers). */
static int reserve(loader *ld, int nreq, int ndocs) {
    ac_mc_task *k = ld->k;
    if (nreq + 1 > ld->cap_req) {
        int c = ld->cap_req ? ld->cap_req : 64;
        while (c < nreq + 1) c *= 2;
        size_t *o = realloc(k->off, sizeof *o * c);
        if (o) k->off = o;
        int *nc = realloc(k->ncont, sizeof *nc * c);
        if (nc) k->ncont = nc;
        double *ch = realloc(k->chars, sizeof *ch * c);
        if (ch) k->chars = ch;
        if (!o || !nc || !ch) return -1;
        ld->cap_req = c;
    }
    if (ndocs + 1 > ld->cap_doc) {
        int c = ld->cap_doc ? ld->cap_doc : 64;
        while (c < ndocs + 1) c *= 2;
        int *f = realloc(k->first, sizeof *f * c);
        if (f) k->first = f;
        int *g = realloc(k->gold, sizeof *g * c);
        if (g) k->gold = g;
        if (!f || !g) return -1;
        ld->cap_doc = c;
    }
    return 0;
}

static int load_line(void *ud, const mc_line *L, ac_err *e) {
    loader *ld = ud;
    ac_mc_task *k = ld->k;
    if (reserve(ld, k->nreq + L->n, k->ndocs + 1)) return ac_errf(e, "out of memory");
    if (k->ndocs == 0) k->off[0] = 0, k->first[0] = 0;
    for (int i = 0; i < L->n; i++) {
        if (encode_pair(ld, L->ctx[i], L->delim, L->cont[i], e)) return ac_errctx(e, "choice %d", i);
        double c = utf8_chars(L->norm[i]);
        k->chars[k->nreq++] = c > 0 ? c : 1;
    }
    k->gold[k->ndocs] = L->gold;
    k->first[++k->ndocs] = k->nreq;
    return 0;
}

int ac_mc_load(const char *path, const ac_tokenizer *t, int prefix_id, int vocab, ac_mc_task *out, ac_err *e) {
    memset(out, 0, sizeof *out);
    loader ld = {.t = t, .prefix_id = prefix_id, .vocab = vocab, .k = out};
    if (each_line(path, load_line, &ld, NULL, e)) {
        ac_mc_free(out);
        return -1;
    }
    return 0;
}

int ac_mc_load_for(const char *model_dir, const ac_arch *a, const char *path, ac_mc_task *out, ac_err *e) {
    ac_tokenizer *t;
    char tp[4200];
    if (ac_gguf_is_path(model_dir)) {
        if (ac_gguf_tokenizer(model_dir, &t, e)) return -1;
    } else {
        if (ac_fsafe_join(model_dir, "tokenizer.json", tp, sizeof tp, e) || ac_tok_load(tp, &t, e)) return -1;
    }
    int prefix = a->bos_id >= 0 ? a->bos_id : a->eos_id;
    int rc = ac_mc_load(path, t, prefix, a->vocab, out, e);
    ac_tok_free(t);
    return rc;
}

void ac_mc_free(ac_mc_task *t) {
    free(t->gold);
    free(t->first);
    free(t->tok);
    free(t->off);
    free(t->ncont);
    free(t->chars);
    memset(t, 0, sizeof *t);
}

/* ---------------------------------------------------------------- scoring */

/* Request r's input: its tokens but the last, at most max_len of them
 * (the last ones); *skip: tokens dropped from the front. */
static int input_len(const ac_mc_task *t, int r, int max_len, int *skip) {
    int n = (int)(t->off[r + 1] - t->off[r]) - 1;
    *skip = n > max_len ? n - max_len : 0;
    return n - *skip;
}

typedef struct {
    int len, q;
} by_len;
static int by_len_desc(const void *a, const void *b) {
    const by_len *x = a, *y = b;
    return x->len != y->len ? y->len - x->len : x->q - y->q;
}

/* log softmax(row)[tok] in double. */
static double logprob(const float *row, int V, int tok) {
    double mx = row[0];
    for (int i = 1; i < V; i++)
        if (row[i] > mx) mx = row[i];
    double s = 0;
    for (int i = 0; i < V; i++) s += exp((double)row[i] - mx);
    return (double)row[tok] - mx - log(s);
}

static double stderr_of(double p, int n) { return n < 2 ? NAN : sqrt(p * (1 - p) * n / (n - 1) / n); }

int ac_mc_score(const ac_model *m, const ac_mc_task *t, int batch, int max_len, double *lls, ac_mc_result *r,
                ac_err *e) {
    memset(r, 0, sizeof *r);
    if (t->nreq < 1) return ac_errf(e, "task: no questions");
    if (batch < 1) batch = 1;
    if (max_len <= 0) max_len = m->a.max_pos > 0 ? m->a.max_pos : 2048;
    int V = m->a.vocab, longest = 0, s;
    for (int q = 0; q < t->nreq; q++) {
        if (t->ncont[q] > max_len)
            return ac_errf(e, "task: a continuation of %d tokens is longer than the model's context %d", t->ncont[q],
                           max_len);
        int n = input_len(t, q, max_len, &s);
        if (n > longest) longest = n;
    }
    /* at most 4096 tokens a forward (the engine's activations and KV cache
     * scale with them, as a perplexity batch of 4 x 1024 does), and the
     * logits, batch x longest x vocab floats, at most 256 MiB */
    while (batch > 1 && ((double)batch * longest > 4096 || (double)batch * longest * V * 4 > 256.0 * 1048576))
        batch /= 2;
    by_len *order = malloc(sizeof *order * t->nreq);
    int *buf = malloc(sizeof(int) * (size_t)batch * longest);
    double *ll = lls ? lls : malloc(sizeof(double) * t->nreq);
    if (!order || !buf || !ll) {
        free(order), free(buf);
        if (!lls) free(ll);
        return ac_errf(e, "out of memory");
    }
    for (int q = 0; q < t->nreq; q++) order[q] = (by_len){input_len(t, q, max_len, &s), q};
    qsort(order, t->nreq, sizeof *order, by_len_desc);
    ac_engine en;
    int rc = ac_engine_init(&en, m, batch, longest, e);
    double t0 = ac_now();
    for (int i = 0; !rc && i < t->nreq; i += batch) {
        int B = t->nreq - i < batch ? t->nreq - i : batch;
        int n = order[i].len; /* the longest of this batch */
        for (int b = 0; b < B; b++) {
            int q = order[i + b].q, nb = input_len(t, q, max_len, &s);
            memcpy(buf + (size_t)b * n, t->tok + t->off[q] + s, sizeof(int) * nb);
            for (int k = nb; k < n; k++) buf[(size_t)b * n + k] = 0; /* right padding: never attended to */
        }
        rc = ac_engine_forward(&en, buf, B, n, 0, 0, e);
        r->tokens += (long)B * n;
        for (int b = 0; !rc && b < B; b++) {
            int q = order[i + b].q, nb = input_len(t, q, max_len, &s);
            const int *full = t->tok + t->off[q] + s; /* full[k + 1] is predicted by input row k */
            double sum = 0;
            for (int k = nb - t->ncont[q]; k < nb; k++)
                sum += logprob(en.logits + ((size_t)b * n + k) * V, V, full[k + 1]);
            ll[q] = sum;
        }
    }
    if (!rc) {
        int hit = 0, hitn = 0;
        for (int d = 0; d < t->ndocs; d++) {
            int best = -1, bestn = -1;
            for (int q = t->first[d]; q < t->first[d + 1]; q++) {
                if (best < 0 || ll[q] > ll[best]) best = q;
                if (bestn < 0 || ll[q] / t->chars[q] > ll[bestn] / t->chars[bestn]) bestn = q;
            }
            hit += best - t->first[d] == t->gold[d];
            hitn += bestn - t->first[d] == t->gold[d];
        }
        r->n = t->ndocs;
        r->acc = (double)hit / t->ndocs;
        r->acc_norm = (double)hitn / t->ndocs;
        r->acc_stderr = stderr_of(r->acc, t->ndocs);
        r->norm_stderr = stderr_of(r->acc_norm, t->ndocs);
    }
    r->seconds = ac_now() - t0;
    if (en.m) ac_engine_free(&en);
    free(order);
    free(buf);
    if (!lls) free(ll);
    return rc ? -1 : 0;
}

json_t *ac_mc_result_json(const ac_mc_result *r) {
    return json_pack("{s:f,s:f,s:i,s:o,s:o,s:f}", "acc", r->acc, "acc_norm", r->acc_norm, "n", r->n, "stderr",
                     isnan(r->acc_stderr) ? json_null() : json_real(r->acc_stderr), "acc_norm_stderr",
                     isnan(r->norm_stderr) ? json_null() : json_real(r->norm_stderr), "seconds", r->seconds);
}
