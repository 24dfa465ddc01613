/*
 * gguf_int.h - what gguf.c (writer) and gguf_read.c (reader) share: the
 * GGUF value and ggml tensor type codes, the pre-tokenizer regexes llama.cpp
 * names, and the tokenizer.json analysis. Not part of the public API.
 */
#ifndef AC_GGUF_INT_H
#define AC_GGUF_INT_H

#include <jansson.h>
#include <stdint.h>

#include "core/err.h"
#include "format/model.h"

enum { GG_U8, GG_I8, GG_U16, GG_I16, GG_U32, GG_I32, GG_F32, GG_BOOL, GG_STR, GG_ARR, GG_U64, GG_I64, GG_F64 };
enum { GGML_F32 = 0, GGML_F16 = 1, GGML_BF16 = 30 };
/* llama.cpp's token types */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

#define GG_ALIGN 32

/* The split regexes of llama.cpp's LLAMA3 ("llama-bpe") and QWEN2 ("qwen2") pre-tokenizers. */
#define GG_RE_LLAMA3                                                                                                   \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "                                         \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define GG_RE_QWEN2                                                                                                    \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "                                              \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

typedef struct {
    int sp;           /* SentencePiece-style (`llama` model) rather than byte-level (`gpt2`) */
    const char *pre;  /* tokenizer.ggml.pre */
    int space_prefix; /* sp: a space is put before the text */
} gg_tokinfo;

int gg_tok_analyse(const json_t *root, gg_tokinfo *ti, ac_err *e);
/* Q/K rows of `heads` heads from Hugging Face's rotate-half order to
 * llama.cpp's interleaved pairs (inverse = 0) or back (inverse = 1). */
void gg_permute_rows(float *dst, const float *src, int heads, int64_t rows, int64_t cols, int inverse);

/* One tensor of a layer as llama.cpp names and shapes it: blk.L.<suffix>,
 * rows x cols (cols 0: a vector), Q/K rows permuted for perm heads (0:
 * none); w points at the layer's weight pointer (read or written). */
typedef struct {
    char name[64];
    float **w;
    int64_t rows, cols;
    int perm;
} gg_layer_tensor;

/* The tensors of layer l of an architecture a whose weights are w, in
 * file order; out holds at least GG_LAYER_TENSORS. Returns the count. A
 * mixture-of-experts layer's router is among them; its experts' matrices,
 * stacked 3-D ({H, Fe, E} as ggml writes shapes) as
 * blk.L.ffn_{gate,up,down}_exps.weight, are not (gg_moe_names). */
#define GG_LAYER_TENSORS 15
int gg_layer_tensors(const ac_arch *a, int l, ac_layer_w *w, gg_layer_tensor *out);
/* The stacked expert tensors' suffixes, gate, up, down (after "blk.L."). */
extern const char *const gg_moe_names[3];

#endif
