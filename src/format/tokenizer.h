/*
 * tokenizer.h - Hugging Face tokenizer.json BPE, two families:
 *  - byte-level (GPT-2, Llama-3, Qwen2): a Split (PCRE2 regex) and/or
 *    ByteLevel pre-tokenizer, ignore_merges;
 *  - SentencePiece-style (Llama-2, Mistral, TinyLlama): Prepend/Replace
 *    normalizers or a Metaspace pre-tokenizer (prepend_scheme, split),
 *    byte_fallback to <0xNN> tokens, unk_token with fuse_unk.
 * Added/special tokens are matched in the raw text first; then, per
 * segment, the normalizers (NFC/NFD/NFKC/NFKD through utf8proc, as Qwen2
 * declares NFC; Prepend; Replace of a string); merges in the "a b" or
 * ["a","b"] form. Encode and decode. Not supported (an error at load):
 * other normalizers (Lowercase, BertNormalizer...), regex Replace, other
 * Split behaviours, WordPiece/Unigram models.
 *
 * Ownership: ac_tok_load returns a tokenizer the caller frees with
 * ac_tok_free; encode/decode return heap arrays the caller frees.
 */
#ifndef AC_TOKENIZER_H
#define AC_TOKENIZER_H

#include <stddef.h>

#include "core/err.h"

typedef struct ac_tokenizer ac_tokenizer;

int ac_tok_load(const char *path, ac_tokenizer **out, ac_err *e);
/* Parse from a JSON string (the fuzz entry). */
int ac_tok_parse(const char *json, size_t len, ac_tokenizer **out, ac_err *e);
void ac_tok_free(ac_tokenizer *t);
int ac_tok_vocab_size(const ac_tokenizer *t);
/* Id of an exact token string, or -1. */
int ac_tok_id(const ac_tokenizer *t, const char *token);

/* Encode len bytes of UTF-8 text into *ids (malloc'd, *n entries). */
int ac_tok_encode(const ac_tokenizer *t, const char *text, size_t len, int **ids, size_t *n, ac_err *e);
/* Decode ids into *text (malloc'd, NUL-terminated, *len bytes). */
int ac_tok_decode(const ac_tokenizer *t, const int *ids, size_t n, char **text, size_t *len, ac_err *e);

#endif
