/*
 * deci.h - the `deci` export target: what vLLM's nemotron_nas, TensorRT-LLM's
 * NemotronNAS and Transformers (trust_remote_code) load.
 *
 * The rules, read from those loaders:
 * - One global num_attention_heads and head_dim; per layer the attention is
 *   either removed (attention.no_op) or keeps every query head with
 *   num_attention_heads / attention.n_heads_in_group KV heads.
 * - The FFN width is never read from intermediate_size: every loader computes
 *   _find_multiple(int(2 * ffn.ffn_mult * hidden_size / 3), 256), so widths
 *   live on a 256 grid. A width off the grid is exported by zero-padding the
 *   gate/up rows and down columns up to the grid (exact: silu(0) * 0 = 0).
 * - vLLM fuses the residual add into the next RMSNorm and starts with no
 *   residual: the first layer that does anything must have attention.
 * - model_type "nemotron-nas" is unknown to Transformers: config.json carries
 *   an auto_map to configuration_decilm.py, which we write next to it.
 *
 * This module owns those rules: the grid, ffn_mult values that round-trip
 * through the loaders' formula, the block_configs JSON, the configuration
 * module, and the check that rejects an architecture the target cannot
 * express (what a job spec may ask of it: pipeline/jobcheck.h).
 */
#ifndef AC_DECI_H
#define AC_DECI_H

#include <jansson.h>

#include "core/err.h"
#include "format/model.h"

#define AC_DECI_GRID 256

/* The loaders' formula: FFN width for ffn_mult at this hidden size. */
int ac_deci_loader_ffn(double ffn_mult, int hidden);
/* An ffn_mult for which the loaders' formula returns exactly width (a
 * positive multiple of AC_DECI_GRID); < 0 when none exists. */
double ac_deci_ffn_mult(int width, int hidden);
/* The exported width of a layer keeping `kept` FFN channels: the grid width
 * at or above it (0 stays 0). */
int ac_deci_padded(int kept);
/* 0 when a can be written as a deci config (see above); else -1 and e says
 * which layer breaks which rule. */
int ac_deci_check_arch(const ac_arch *a, ac_err *e);
/* Add the deci-specific keys to an HF config object c built for a
 * (architectures, model_type, auto_map, block_configs; drops the global
 * intermediate_size and num_key_value_heads that deci configs do not have).
 * a must pass ac_deci_check_arch. */
int ac_deci_fill_config(json_t *c, const ac_arch *a, ac_err *e);
/* Write configuration_decilm.py (the DeciLMConfig the auto_map names). */
int ac_deci_write_module(const char *dir, ac_err *e);

/* The exported (padded) architecture for a requested one: each FFN width
 * that is off the grid is padded up to it. */
int ac_deci_pad_arch(const ac_arch *req, ac_arch *out, ac_err *e);
/* Zero-pad every off-grid FFN of m in place (gate/up rows, down columns) up
 * to the grid: the model computes exactly the same function. An owned fp32
 * model only (ac_prune's); others are refused. */
int ac_deci_pad_model(ac_model *m, ac_err *e);

#endif
