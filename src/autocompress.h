/*
 * autocompress.h - the library's one public header: what the daemon
 * (daemon/), the CLI (tools/) and any other program built on the library
 * include. It names every public header of src/'s folders, lowest layer
 * first (docs/layers.md); a header named *_int.h is private to its folder
 * and is not here. The Makefile compiles daemon/ and tools/ against
 * build/inc/public, which holds this header and the public ones only, and
 * `make check-layers` refuses any other library include from them.
 */
#ifndef AC_AUTOCOMPRESS_H
#define AC_AUTOCOMPRESS_H

/* core: errors, buffers, confined files, element types */
#include "core/buf.h"
#include "core/dtype.h"
#include "core/err.h"
#include "core/fsafe.h"
#include "core/fsafe_write.h"
#include "core/tensor.h"

/* format: safetensors, the model and its config, tokenizer, GGUF, deci */
#include "format/deci.h"
#include "format/gguf.h"
#include "format/model.h"
#include "format/park.h"
#include "format/safetensors.h"
#include "format/tokenizer.h"

/* runtime: kernels, the engine and its backends, eval, the trainer */
#include "runtime/backward_cpu.h"
#include "runtime/block.h"
#include "runtime/block_cpu.h"
#include "runtime/block_grad.h"
#include "runtime/cuda_plugin.h"
#include "runtime/engine.h"
#include "runtime/eval.h"
#include "runtime/kernels_avx512bf16.h"
#include "runtime/kernels_cpu.h"
#include "runtime/optim.h"
#include "runtime/rope.h"
#include "runtime/tasks.h"
#include "runtime/train.h"

/* cost: devices, targets, measured cost tables, the cost model */
#include "cost/costmodel.h"
#include "cost/device.h"
#include "cost/engines.h"
#include "cost/provenance.h"
#include "cost/quiet.h"
#include "cost/target.h"

/* search: statistics, importance, slicing, Minitron, DNAS, the architecture search, top-k choices */
#include "search/constraints.h"
#include "search/dnas.h"
#include "search/importance.h"
#include "search/minitron.h"
#include "search/puzzle.h"
#include "search/search.h"
#include "search/slice.h"
#include "search/ssm_prune.h"
#include "search/stats.h"
#include "search/stream.h"
#include "search/topk.h"

/* compress: pruning with repair, distillation */
#include "compress/distill.h"
#include "compress/prune.h"

/* pipeline: the job spec, its checks and stages, the report */
#include "pipeline/job.h"
#include "pipeline/jobcheck.h"
#include "pipeline/jobspec.h"
#include "pipeline/modelcard.h"
#include "pipeline/reporthtml.h"

/* api: the entry points the daemon and the CLI call */
#include "api/api.h"

#endif /* AC_AUTOCOMPRESS_H */
