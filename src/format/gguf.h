/*
 * gguf.h - GGUF v3 files (llama.cpp's format): writing a model and its
 * tokenizer as llama.cpp loads them, and reading such a file back into an
 * ac_model and an ac_tokenizer.
 *
 * Written as llama.cpp's convert_hf_to_gguf.py does for LlamaModel and
 * DeciModel: architecture `llama` when every layer has the same shape,
 * `deci` otherwise (per-layer head_count, head_count_kv and
 * feed_forward_length arrays; 0 heads = no attention, 0 = no FFN); explicit
 * key_length / value_length and rope.dimension_count; Q and K rows permuted
 * to llama.cpp's interleaved RoPE pairs; llama3 RoPE scaling as the
 * `rope_freqs` tensor; 2-D weights in BF16 or F32, 1-D ones in F32; tensor
 * names token_embd, blk.N.attn_q ..., output_norm, output. Tokenizers: a
 * byte-level tokenizer.json becomes the `gpt2` model (tokens, token types,
 * merges) with the `pre` type of its split regex (llama-bpe for Llama-3,
 * qwen2, gpt-2); a SentencePiece-style one (byte_fallback, Llama-2 /
 * Mistral) becomes the `llama` model (tokens, scores = minus the rank of the
 * merge that makes each token, types with BYTE for <0xNN>).
 *
 * What llama.cpp cannot run (see ac_gguf_check_arch) is refused here.
 * Reading maps the file (mmap) and converts every tensor to fp32; the
 * tokenizer is rebuilt from the metadata as an equivalent tokenizer.json.
 */
#ifndef AC_GGUF_H
#define AC_GGUF_H

#include <jansson.h>

#include "core/err.h"
#include "format/model.h"
#include "format/tokenizer.h"

/* True when path names a .gguf file (by its suffix). */
int ac_gguf_is_path(const char *path);

/* Whether llama.cpp's runtime runs this architecture correctly: attention
 * in layer 0 (its hyper-parameters come from layer 0), no layer that keeps
 * attention but drops its FFN (llama.cpp's deci graph then drops the
 * attention output), an FFN in the last layer, no sliding window. */
int ac_gguf_check_arch(const ac_arch *a, ac_err *e);
/* llama.cpp's architecture for a: qwen3moe, llama (Mixtral's MoE too),
 * qwen3, or deci for a heterogeneous dense model. */
const char *ac_gguf_arch_name(const ac_arch *a);
/* The per-layer part of that check (what the search keeps to). */
int ac_gguf_check_layers(const ac_arch *a, ac_err *e);
/* Whether a tokenizer.json can be written as a GGUF tokenizer llama.cpp
 * knows (a recognised pre-tokenizer regex, or SentencePiece-style). */
int ac_gguf_check_tokenizer(const char *tokenizer_json, ac_err *e);
/* The checks above on a model directory (config.json, tokenizer.json),
 * for job submission. */
int ac_gguf_check_model_dir(const char *model_dir, ac_err *e);

/* Write m and the tokenizer in tokenizer_json to path. dtype: ST_BF16 or
 * ST_F32 for the 2-D weights. tokenizer_json NULL: no tokenizer metadata
 * (weights only; llama.cpp then cannot tokenize). */
int ac_gguf_write(const ac_model *m, const char *tokenizer_json, const char *path, int dtype, ac_err *e);

/* Read a GGUF file written as above (or by llama.cpp's converter for the
 * llama / deci architectures with F32/F16/BF16 tensors), the hybrid
 * nemotron_h / nemotron_h_moe included: an F32 export reads back
 * bit-identical (A_log from AutoCompress's autocompress.ssm_a_log key; a
 * file without it gets log(-ssm_a), within an ulp or so). */
int ac_gguf_load(const char *path, ac_model *m, ac_err *e);
int ac_gguf_arch(const char *path, ac_arch *a, ac_err *e);
int ac_gguf_tokenizer(const char *path, ac_tokenizer **t, ac_err *e);
/* The same from a buffer (the fuzz entry): the model when m is not NULL,
 * the tokenizer when t is not NULL. */
int ac_gguf_load_buf(const void *data, size_t n, ac_model *m, ac_tokenizer **t, ac_err *e);

/* Reading is bounded before anything is allocated: the header's tensor and
 * metadata counts by what the file's size can hold, every string length,
 * array count and tensor dimension by the bytes left, and the memory the
 * header tables and the tokenizer take to parse by the parse budget (bytes;
 * AC_GGUF_PARSE_BUDGET unless changed). A file over it is refused, saying
 * how much it needs. The weights are checked to lie inside the file before
 * the model is allocated. ac_gguf_parse_budget sets the budget (0: left as
 * it is) and returns the one before. */
#define AC_GGUF_PARSE_BUDGET ((size_t)512 << 20)
size_t ac_gguf_parse_budget(size_t bytes);

#endif
