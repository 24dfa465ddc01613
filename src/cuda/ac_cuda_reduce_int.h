/*
 * ac_cuda_reduce_int.h - the block-wide sum the plugin's row kernels share
 * (internal to src/cuda: the trainer's kernels, ac_cuda_train.cu, and the
 * Mamba-2 ones, ac_cuda_ssm.cu). Include it after the CUDA (or emulator)
 * headers. Each translation unit gets its own copy (static).
 */
#ifndef AC_CUDA_REDUCE_H
#define AC_CUDA_REDUCE_H

/* Sum of v over the block; every thread gets it. blockDim.x a multiple of
 * 32 (full-warp shuffles); every thread of the block must call it. */
static __device__ inline float acc_block_sum(float v) {
    __shared__ float red[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = 0;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) r += red[i];
    __syncthreads(); // all have read red before the next reduction writes it
    return r;
}

#endif
