/*
 * cuda_emu.h - a CPU emulation of the subset of CUDA and cuBLAS that
 * src/cuda/ac_cuda.cu uses, so that file can be compiled with g++
 * (-DAC_CUDA_EMU) into a test plugin and run on machines without a GPU.
 *
 * What it checks: the kernels' indexing, reductions, barriers and shared
 * memory use, the engine's memory plan and call order, and the cuBLAS
 * argument conventions (cublasGemmEx is carried out by OpenBLAS's
 * cblas_sgemm, which has the same column-major contract, so ac_cuda.cu's
 * transposes and leading dimensions meet independent code). Device memory is
 * host memory, so AddressSanitizer sees out-of-bounds kernel accesses.
 *
 * How: a launch runs its blocks one after another; the threads of a block
 * run on fibers switched at __syncthreads and at warp shuffles, which are
 * real barriers (block-wide and per warp of 32). A thread starts when the
 * one before it finishes or waits, on the same fiber if it finished, so a
 * kernel without barriers costs a call per thread; the switch itself is a
 * few instructions on x86-64 (_setjmp/_longjmp elsewhere and under ASan).
 * tests/cuda_emu/test_cuda_emu.cc tests the emulation itself. Launch limits
 * (threads per block, grid size, dynamic shared memory above 48 KiB without
 * cudaFuncSetAttribute) are errors reported by cudaGetLastError, as on a
 * device; a barrier deadlock or a shuffle on a partial warp is an error too.
 *
 * What it cannot check: timing, memory coalescing, races that only show
 * under real concurrency (threads here never run at the same time).
 */
#ifndef AC_CUDA_EMU_H
#define AC_CUDA_EMU_H

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

/* The running fiber's coordinates (set by the scheduler before each switch). */
extern dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __shared__ static
#define AC_DYNAMIC_SHARED(type, name) type *name = (type *)emu_dynamic_shared()
#define AC_LAUNCH(k, grid, block, shm, stream, ...) \
    emu_launch((const void *)(k), dim3(grid), dim3(block), (size_t)(shm), [&] { k(__VA_ARGS__); })

void *emu_dynamic_shared(void);
void emu_launch(const void *fn, dim3 grid, dim3 block, size_t shm, const std::function<void()> &body);
void __syncthreads(void);
float __shfl_xor_sync(unsigned mask, float v, int lane_mask);

inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}

/* bf16: the high half of an IEEE float, rounded to nearest even. */
struct __nv_bfloat16 {
    uint16_t bits;
};
inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t u = (uint32_t)h.bits << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline __nv_bfloat16 __float2bfloat16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 h;
    if ((u & 0x7fffffffu) > 0x7f800000u) h.bits = 0x7fc0; /* NaN */
    else h.bits = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return h;
}

/* ---- runtime */
typedef enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
    cudaErrorLaunchFailure = 719,
} cudaError_t;
typedef enum { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice, cudaMemcpyDefault } cudaMemcpyKind;
typedef enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 } cudaFuncAttribute;
typedef struct emu_stream *cudaStream_t;
typedef struct emu_event *cudaEvent_t;
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    int multiProcessorCount, major, minor;
};

const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev);
cudaError_t cudaSetDevice(int dev);
cudaError_t emu_malloc(void **p, size_t n);
template <class T> cudaError_t cudaMalloc(T **p, size_t n) { return emu_malloc((void **)p, n); }
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k, cudaStream_t s = nullptr);
cudaError_t cudaMemset(void *p, int v, size_t n);
cudaError_t emu_func_set_attribute(const void *fn, cudaFuncAttribute a, int v);
template <class F> cudaError_t cudaFuncSetAttribute(F *fn, cudaFuncAttribute a, int v) { return emu_func_set_attribute((const void *)fn, a, v); }
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);

/* ---- cuBLAS */
typedef struct emu_blas *cublasHandle_t;
typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType_t;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
/* C[m,n] = alpha op(A)[m,k] op(B)[k,n] + beta C, column-major, lda/ldb/ldc
 * leading dimensions; A, B in CUDA_R_16BF or CUDA_R_32F, C in CUDA_R_32F. */
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *alpha, const void *A,
                            cudaDataType_t at, int lda, const void *B, cudaDataType_t bt, int ldb, const void *beta, void *C, cudaDataType_t ct,
                            int ldc, cublasComputeType_t compute, cublasGemmAlgo_t algo);

#endif
