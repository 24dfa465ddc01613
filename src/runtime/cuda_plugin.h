/*
 * cuda_plugin.h - finds and loads the CUDA backend plugin (libac_cuda.so,
 * built from src/cuda when nvcc is present) with dlopen, so the library and
 * its binaries run unchanged on machines without CUDA. ac_cuda() returns
 * NULL when the plugin, the driver or a device is missing; *why says which.
 * Search order: $AC_CUDA_PLUGIN, the executable's directory and its parent,
 * the loader path.
 */
#ifndef AC_CUDA_PLUGIN_H
#define AC_CUDA_PLUGIN_H

#include <stddef.h>

#include "cuda/ac_cuda.h" /* ac_cuda_api: the plugin ABI */
#include "model.h"

const ac_cuda_api *ac_cuda(const char **why);

#endif
