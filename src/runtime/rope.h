/*
 * rope.h - the rotary-embedding tables, computed once on the host for
 * every backend (the CPU engine uses them in place, the CUDA plugin
 * uploads them): cos and sin of position x inverse frequency, the
 * frequencies with Llama-3 scaling when the architecture asks for it.
 */
#ifndef AC_ROPE_H
#define AC_ROPE_H

#include "core/err.h"
#include "format/model.h"

/* cos_t, sin_t: [max_ctx][head_dim/2] each, allocated by the caller. */
int ac_rope_tables(const ac_arch *a, int max_ctx, float *cos_t, float *sin_t, ac_err *e);

#endif
