/*
 * cuda_plugin.h - finds and loads the CUDA backend plugin (libac_cuda.so,
 * built from src/cuda when nvcc is present) with dlopen, so the library and
 * its binaries run unchanged on machines without CUDA. ac_cuda() returns
 * NULL when the plugin, the driver or a device is missing; *why says which.
 * Search order: $AC_CUDA_PLUGIN, the executable's directory and its parent,
 * the loader path. A plugin whose acc_abi_version is not ACC_ABI_VERSION (or
 * that has none: built before versioning) is refused, *why saying so.
 * Weights go to the plugin in their file dtype (resident BF16/F16 too): it
 * converts each tensor on the device (src/cuda/ac_cuda_conv_int.h).
 */
#ifndef AC_CUDA_PLUGIN_H
#define AC_CUDA_PLUGIN_H

#include <stddef.h>

#include "cuda/ac_cuda.h" /* ac_cuda_api: the plugin ABI */
#include "format/model.h"

const ac_cuda_api *ac_cuda(const char **why);
/* Whether the library at path (a dlopen name) is a plugin this build can
 * use, as ac_cuda checks it (ABI version, complete table; devices are not
 * counted): 0, or -1 with the reason in why (n bytes). */
int ac_cuda_plugin_check(const char *path, char *why, size_t n);

#endif
