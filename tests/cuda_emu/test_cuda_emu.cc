// test_cuda_emu.cc - the CPU emulation of CUDA (cuda_emu.h) itself: every
// thread of every block runs once with its own coordinates, barriers and
// warp shuffles order threads as on a device (block reductions at several
// block sizes), launch limits are errors, and a barrier deadlock or a
// shuffle on a partial warp is a sticky kernel fault. Each fault is provoked
// in a child process, since the fault poisons every later call, as on a GPU.
#include "cuda_emu.h"

#include <sys/wait.h>
#include <unistd.h>

#include <vector>

#include "check.h"

__global__ void k_coords(int *out) {
    int t = (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
    int b = (int)(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
    int nt = (int)(blockDim.x * blockDim.y * blockDim.z);
    out[b * nt + t] += b * 10000 + t + 1;
}

// The plugin's own block sum (lanes by xor shuffles, warps through shared
// memory), run here on the emulator.
#include "../../src/cuda/ac_cuda_reduce_int.h"

// Each thread writes the sum of (its block's thread index + 1) and, after a
// second reduction of a value that depends on the first, that too.
__global__ void k_reduce(float *out) {
    float s = acc_block_sum((float)threadIdx.x + 1);
    float s2 = acc_block_sum(s * (threadIdx.x & 1));
    out[(blockIdx.x * blockDim.x + threadIdx.x) * 2] = s;
    out[(blockIdx.x * blockDim.x + threadIdx.x) * 2 + 1] = s2;
}

// Lane 0 waits at a shuffle its warp never reaches; the others wait at a
// __syncthreads lane 0 never reaches.
__global__ void k_deadlock(float *out) {
    if (threadIdx.x == 0)
        out[0] = __shfl_xor_sync(0xffffffff, 1.0f, 1);
    else
        __syncthreads();
}

__global__ void k_shuffle(float *out) { out[threadIdx.x] = __shfl_xor_sync(0xffffffff, (float)threadIdx.x, 1); }

static void test_every_thread_once(void) {
    dim3 grids[3] = {dim3(1), dim3(3, 2), dim3(2, 1, 3)}, blocks[3] = {dim3(1), dim3(32, 3, 2), dim3(1024)};
    for (int c = 0; c < 3; c++) {
        int nb = (int)(grids[c].x * grids[c].y * grids[c].z), nt = (int)(blocks[c].x * blocks[c].y * blocks[c].z);
        int *d;
        CHECK(cudaMalloc(&d, sizeof(int) * nb * nt) == cudaSuccess, "malloc");
        cudaMemset(d, 0, sizeof(int) * nb * nt);
        AC_LAUNCH(k_coords, grids[c], blocks[c], 0, 0, d);
        CHECK(cudaGetLastError() == cudaSuccess, "launch %d", c);
        std::vector<int> h(nb * nt);
        cudaMemcpy(h.data(), d, sizeof(int) * nb * nt, cudaMemcpyDeviceToHost);
        int bad = 0;
        for (int b = 0; b < nb; b++)
            for (int t = 0; t < nt; t++) bad += h[b * nt + t] != b * 10000 + t + 1;
        CHECK(bad == 0, "case %d: %d of %d threads ran not exactly once with their coordinates", c, bad, nb * nt);
        cudaFree(d);
    }
}

static void test_block_reductions(void) {
    int sizes[4] = {32, 64, 96, 1024};
    for (int c = 0; c < 4; c++) {
        int n = sizes[c], nb = 3;
        float *d;
        CHECK(cudaMalloc(&d, sizeof(float) * 2 * nb * n) == cudaSuccess, "malloc");
        AC_LAUNCH(k_reduce, nb, n, 0, 0, d);
        CHECK(cudaGetLastError() == cudaSuccess, "launch %d", n);
        std::vector<float> h(2 * nb * n);
        cudaMemcpy(h.data(), d, sizeof(float) * 2 * nb * n, cudaMemcpyDeviceToHost);
        float want = (float)n * (n + 1) / 2, want2 = want * (n / 2);
        int bad = 0;
        for (int i = 0; i < nb * n; i++) bad += h[2 * i] != want || h[2 * i + 1] != want2;
        CHECK(bad == 0, "block of %d: %d threads saw another sum (thread 0: %g, %g; want %g, %g)", n, bad, h[0], h[1],
              want, want2);
        cudaFree(d);
    }
}

static void test_launch_limits(void) {
    float *d;
    CHECK(cudaMalloc(&d, 4096) == cudaSuccess, "malloc");
    AC_LAUNCH(k_shuffle, 1, 2048, 0, 0, d);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "2048 threads per block refused");
    AC_LAUNCH(k_shuffle, 1, 32, 64 * 1024, 0, d);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue, "64 KiB of dynamic shared memory without the attribute refused");
    AC_LAUNCH(k_shuffle, 1, 32, 0, 0, d);
    CHECK(cudaGetLastError() == cudaSuccess, "a good launch after refused ones runs (launch errors are not sticky)");
    cudaFree(d);
}

// Runs one launch in a child; its exit status: the launch's error, then
// whether a later launch also failed (the sticky fault).
static int child_launch(int which, int *later_failed) {
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
        float *d;
        cudaMalloc(&d, 4096);
        if (which == 0)
            AC_LAUNCH(k_deadlock, 1, 32, 0, 0, d);
        else
            AC_LAUNCH(k_shuffle, 1, 48, 0, 0, d);
        int e = cudaGetLastError();
        AC_LAUNCH(k_coords, 1, 1, 0, 0, (int *)d);
        _exit((e == cudaErrorLaunchFailure ? 1 : 0) | (cudaGetLastError() == cudaErrorLaunchFailure ? 2 : 0));
    }
    int st = 0;
    waitpid(p, &st, 0);
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    *later_failed = code >= 0 && (code & 2);
    return code >= 0 && (code & 1);
}

static void test_faults_are_sticky(void) {
    int later;
    CHECK(child_launch(0, &later), "a barrier deadlock is a launch failure");
    CHECK(later, "and every later launch fails");
    CHECK(child_launch(1, &later), "a full-mask shuffle on a 16-lane warp is a launch failure");
    CHECK(later, "and every later launch fails");
}

int main(void) {
    RUN(test_every_thread_once);
    RUN(test_block_reductions);
    RUN(test_launch_limits);
    RUN(test_faults_are_sticky);
    return DONE();
}
