// cuda_emu.cc - see cuda_emu.h. Test infrastructure only: linked into
// build/tests/libac_cuda_emu.so together with src/cuda/ac_cuda.cu.
#include "cuda_emu.h"

#include <cblas.h>
#include <setjmp.h>
#include <ucontext.h>
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/common_interface_defs.h>
#endif

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>

dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace {

const size_t STACK_BYTES = 256 * 1024;
const int MAX_THREADS = 1024;

// A barrier of a group of fibers (the block, or one warp): complete when
// every live member has arrived; gen counts completions.
struct barrier {
    int arrived = 0;
    unsigned long gen = 0;
};

struct fiber {
    jmp_buf jb;           // the _setjmp switch's saved context
    void *sp = nullptr;   // emu_switch's saved stack pointer
    char *stack = nullptr;
    void *fake = nullptr; // AddressSanitizer's fake-stack handle
    int thread = -1;      // the thread it runs, -1 when free
};

// The block being run: its threads, the fibers they run on, and barrier
// state. Barriers count the threads still alive (started or not), so
// threads that returned early do not block others.
//
// Threads start lazily: a fiber that finishes a thread without ever waiting
// goes straight on to the next thread not yet started, on the same stack
// and without a switch, so a kernel without barriers runs as a loop of calls
// on one fiber; a thread that waits keeps its fiber, and the next thread
// starts on a free one. Any order is a valid schedule of a CUDA block.
struct block_run {
    fiber f[MAX_THREADS]; // fixed: a parked fiber holds a reference to its own entry
    int nfibers = 0;
    int free_fibers[MAX_THREADS], nfree = 0; // parked fibers with no thread
    jmp_buf sched;
    void *sched_sp = nullptr;
    void *sched_fake = nullptr;
    const void *sched_bottom = nullptr;
    size_t sched_size = 0;
    const std::function<void()> *body = nullptr;
    int cur = 0;  // the running fiber
    int live = 0, nthreads = 0;
    int next = 0; // the first thread not yet started
    int fiber_of[MAX_THREADS];
    bool done[MAX_THREADS];
    barrier block, warp[MAX_THREADS / 32];
    int warp_live[MAX_THREADS / 32], warp_size[MAX_THREADS / 32];
    float slot[2][MAX_THREADS]; // double-buffered by warp barrier generation
    unsigned long events = 0; // arrivals, releases, exits: progress
    bool failed = false;
} R;

cudaError_t last_error = cudaSuccess; // launch errors, cleared by cudaGetLastError
cudaError_t sticky = cudaSuccess;     // kernel faults: every later call fails, as on a device
std::map<const void *, int> max_dynamic;
std::set<void *> allocations;
void *dynamic_shared = nullptr;

void kernel_fault(const char *why) {
    fprintf(stderr, "cuda_emu: kernel fault in block (%u,%u,%u) thread (%u,%u,%u): %s\n", blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x,
            threadIdx.y, threadIdx.z, why);
    R.failed = true;
    sticky = last_error = cudaErrorLaunchFailure;
}

// Context switches; a test run switches ~10^9 times, so each must be cheap.
// On x86-64 (without AddressSanitizer) emu_switch below: it pushes the
// callee-saved registers on the running stack, keeps the stack pointer and
// pops the other context's; a new fiber's stack is laid out so that the
// first switch to it returns into fiber_main. Elsewhere, and under ASan
// (whose fiber annotations wrap the switches), a fiber's stack is entered
// once through makecontext and fibers then switch with _setjmp/_longjmp,
// which (unlike swapcontext) make no system call (-DEMU_SETJMP_SWITCH
// picks these on x86-64 too).
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(EMU_SETJMP_SWITCH)
#define EMU_ASM_SWITCH 1
extern "C" void emu_switch(void **save_sp, void *to_sp);
asm(".text\n.globl emu_switch\n.hidden emu_switch\n.type emu_switch, @function\nemu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n  ret\n"
    ".size emu_switch, .-emu_switch\n");
#endif

#ifdef __SANITIZE_ADDRESS__
#define SW_START(fake, bottom, size) __sanitizer_start_switch_fiber(fake, bottom, size)
#define SW_FINISH(fake, bottom, size) __sanitizer_finish_switch_fiber(fake, bottom, size)
#else
#define SW_START(fake, bottom, size) ((void)0)
#define SW_FINISH(fake, bottom, size) ((void)0)
#endif

#ifdef EMU_ASM_SWITCH
void to_scheduler() { emu_switch(&R.f[R.cur].sp, R.sched_sp); }
void to_fiber(int i) { emu_switch(&R.sched_sp, R.f[i].sp); }
#else
void to_scheduler() {
    fiber &f = R.f[R.cur];
    SW_START(&f.fake, R.sched_bottom, R.sched_size);
    if (!_setjmp(f.jb)) _longjmp(R.sched, 1);
    SW_FINISH(f.fake, &R.sched_bottom, &R.sched_size);
}

void to_fiber(int i) {
    SW_START(&R.sched_fake, R.f[i].stack, STACK_BYTES);
    if (!_setjmp(R.sched)) _longjmp(R.f[i].jb, 1);
    SW_FINISH(R.sched_fake, nullptr, nullptr);
}
#endif

void yield() { to_scheduler(); }

int linear_tid() { return (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)); }

// Completes b when all of its `members` live fibers have arrived.
bool complete_if_all(barrier &b, int members) {
    if (b.arrived == 0 || b.arrived != members) return false;
    b.arrived = 0;
    b.gen++;
    R.events++;
    return true;
}

// Arrive at b and wait (yielding) until it completes.
void arrive_and_wait(barrier &b, int members) {
    unsigned long g = b.gen;
    R.events++;
    b.arrived++;
    if (complete_if_all(b, members)) return;
    while (b.gen == g && !R.failed) yield();
}

// A fiber exited: barriers its group waits on may now be complete.
void release_if_complete() {
    complete_if_all(R.block, R.live);
    for (int w = 0; w * 32 < R.nthreads; w++) complete_if_all(R.warp[w], R.warp_live[w]);
}

dim3 thread_coords(int t) {
    return dim3(t % blockDim.x, (t / blockDim.x) % blockDim.y, t / (blockDim.x * blockDim.y));
}

// Gives thread t to the running fiber and makes it the current thread.
void take_thread(int t) {
    R.f[R.cur].thread = t;
    R.fiber_of[t] = R.cur;
    threadIdx = thread_coords(t);
    R.events++;
}

// A fiber's whole life: each time the scheduler hands it a thread, run
// that thread and every thread not yet started after it until one waits (it
// then keeps this fiber) or none is left; then go back free. Never returns.
void fiber_main() {
    SW_FINISH(nullptr, &R.sched_bottom, &R.sched_size);
    for (;;) {
        int me = R.cur;
        for (int t = R.f[me].thread; t >= 0 && !R.failed;) {
            (*R.body)();
            R.done[t] = true;
            R.live--;
            R.warp_live[t / 32]--;
            R.events++;
            release_if_complete();
            t = -1;
            if (R.next < R.nthreads && !R.failed) take_thread(t = R.next++);
        }
        R.f[me].thread = -1;
        R.free_fibers[R.nfree++] = me;
        to_scheduler();
    }
}

#ifdef EMU_ASM_SWITCH
void new_fiber(int i) {
    R.f[i].stack = (char *)malloc(STACK_BYTES);
    // emu_switch pops six registers, then returns into fiber_main with the
    // stack as a call leaves it (a return address slot, 16-byte aligned above)
    void **sp = (void **)(((uintptr_t)R.f[i].stack + STACK_BYTES) & ~(uintptr_t)15);
    *--sp = nullptr;
    *--sp = (void *)fiber_main;
    for (int r = 0; r < 6; r++) *--sp = nullptr;
    R.f[i].sp = sp;
}
#else
ucontext_t creator, entry_ctx;

// Parks (its context saved for to_fiber), then runs fiber_main when resumed.
void fiber_entry() {
    if (!_setjmp(R.f[R.cur].jb)) setcontext(&creator);
    fiber_main();
}

void new_fiber(int i) {
    R.f[i].stack = (char *)malloc(STACK_BYTES);
    getcontext(&entry_ctx);
    entry_ctx.uc_stack.ss_sp = R.f[i].stack;
    entry_ctx.uc_stack.ss_size = STACK_BYTES;
    entry_ctx.uc_link = nullptr;
    makecontext(&entry_ctx, fiber_entry, 0);
    R.cur = i;
    swapcontext(&creator, &entry_ctx);
}
#endif

// Starts the next thread on a free fiber (a new one when none is free).
void start_next_thread() {
    if (R.nfree == 0) {
        new_fiber(R.nfibers);
        R.free_fibers[R.nfree++] = R.nfibers++;
    }
    R.cur = R.free_fibers[--R.nfree];
    take_thread(R.next++);
    to_fiber(R.cur);
}

// Runs one block to completion; false on a fault. The fibers of a faulted
// block stay suspended mid-kernel, and none is resumed again (nor reused):
// after a fault every later launch is refused (the sticky error).
bool run_block() {
    R.live = R.nthreads;
    R.next = 0;
    R.block.arrived = 0;
    for (int w = 0; w * 32 < R.nthreads; w++) {
        R.warp[w].arrived = 0;
        R.warp_size[w] = R.warp_live[w] = std::min(32, R.nthreads - w * 32);
    }
    for (int i = 0; i < R.nthreads; i++) R.done[i] = false, R.fiber_of[i] = -1;
    while (R.live > 0 && !R.failed) {
        unsigned long before = R.events;
        for (int i = 0; i < R.next && !R.failed; i++) { // threads waiting at a barrier
            if (R.done[i]) continue;
            R.cur = R.fiber_of[i];
            threadIdx = thread_coords(i);
            to_fiber(R.cur);
        }
        while (R.next < R.nthreads && !R.failed) start_next_thread();
        if (R.events == before && R.live > 0) kernel_fault("barrier deadlock: every live thread waits on a barrier the others never reach");
    }
    return !R.failed;
}

} // namespace

void *emu_dynamic_shared(void) { return dynamic_shared; }

void emu_launch(const void *fn, dim3 grid, dim3 block, size_t shm, const std::function<void()> &body) {
    if (sticky != cudaSuccess) return;
    size_t nt = (size_t)block.x * block.y * block.z;
    if (nt == 0 || nt > (size_t)MAX_THREADS || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u ||
        grid.y > 65535 || grid.z > 65535) {
        fprintf(stderr, "cuda_emu: invalid launch configuration grid (%u,%u,%u) block (%u,%u,%u)\n", grid.x, grid.y, grid.z, block.x, block.y,
                block.z);
        last_error = cudaErrorInvalidConfiguration;
        return;
    }
    auto lim = max_dynamic.find(fn);
    size_t limit = lim == max_dynamic.end() ? 48 * 1024 : (size_t)lim->second;
    if (shm > limit) {
        fprintf(stderr, "cuda_emu: %zu bytes of dynamic shared memory over the kernel's limit %zu\n", shm, limit);
        last_error = cudaErrorInvalidValue;
        return;
    }
    // Shared memory starts as NaN bytes: a kernel reading what it never wrote shows.
    dynamic_shared = malloc(shm ? shm : 1);
    memset(dynamic_shared, 0xff, shm ? shm : 1);
    R.nthreads = (int)nt;
    R.body = &body;
    R.failed = false;
    gridDim = grid;
    blockDim = block;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = dim3(x, y, z);
                if (!run_block()) goto done;
            }
done:
    free(dynamic_shared);
    dynamic_shared = nullptr;
}

void __syncthreads(void) {
    arrive_and_wait(R.block, R.live);
}

float __shfl_xor_sync(unsigned mask, float v, int lane_mask) {
    int t = linear_tid(), w = t / 32, lane = t % 32;
    if (mask != 0xffffffffu || R.warp_size[w] != 32 || R.warp_live[w] != 32 || lane_mask < 0 || lane_mask > 31) {
        kernel_fault("__shfl_xor_sync with a full mask on a partial warp (block size not a multiple of 32, or lanes exited)");
        return v;
    }
    // One barrier per shuffle: consecutive shuffles use alternate buffers,
    // and a lane can only write a buffer again after the next barrier, which
    // every lane reaches after reading this one.
    float *slot = R.slot[R.warp[w].gen & 1];
    slot[t] = v;
    arrive_and_wait(R.warp[w], R.warp_live[w]);
    return slot[w * 32 + (lane ^ lane_mask)];
}

// ---------------------------------------------------------------- runtime

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    }
    return "unknown error";
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = sticky;
    return e;
}

cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev) {
    if (dev != 0) return cudaErrorInvalidDevice;
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "CUDA emulator (CPU)");
    p->totalGlobalMem = (size_t)8 << 30;
    p->multiProcessorCount = 1;
    p->major = 8;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int dev) { return dev == 0 ? sticky : cudaErrorInvalidDevice; }

cudaError_t emu_malloc(void **p, size_t n) {
    *p = malloc(n ? n : 1);
    if (!*p) return cudaErrorMemoryAllocation;
    memset(*p, 0xff, n); // uninitialised device memory reads as NaN
    allocations.insert(*p);
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    if (!allocations.erase(p)) return cudaErrorInvalidValue;
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind) {
    if (sticky != cudaSuccess) return sticky;
    if (n && (!dst || !src)) return cudaErrorInvalidValue;
    memcpy(dst, src, n);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k, cudaStream_t) { return cudaMemcpy(dst, src, n, k); }

cudaError_t cudaMemset(void *p, int v, size_t n) {
    if (n && !p) return cudaErrorInvalidValue;
    memset(p, v, n);
    return sticky;
}

cudaError_t emu_func_set_attribute(const void *fn, cudaFuncAttribute a, int v) {
    if (a != cudaFuncAttributeMaxDynamicSharedMemorySize || v < 0 || v > 227 * 1024) return cudaErrorInvalidValue;
    max_dynamic[fn] = v;
    return cudaSuccess;
}

struct emu_stream {
    int unused;
};
struct emu_event {
    double ms;
};

static double now_ms() { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

cudaError_t cudaStreamCreate(cudaStream_t *s) {
    *s = new emu_stream();
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    delete s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return sticky; }
cudaError_t cudaEventCreate(cudaEvent_t *e) {
    *e = new emu_event();
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
    e->ms = now_ms();
    return sticky;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return sticky; }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    *ms = (float)(b->ms - a->ms);
    return sticky;
}

// ---------------------------------------------------------------- cuBLAS

struct emu_blas {
    cudaStream_t stream;
};

cublasStatus_t cublasCreate(cublasHandle_t *h) {
    *h = new emu_blas();
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

// Operands as FP32 (a copy when BF16): the used part of a column-major
// matrix with `cols` columns of `rows` rows, leading dimension ld.
static const float *as_f32(const void *p, cudaDataType_t t, int rows, int cols, int ld, std::unique_ptr<float[]> &keep) {
    if (t == CUDA_R_32F || rows == 0 || cols == 0) return (const float *)p;
    size_t n = (size_t)(cols - 1) * ld + rows;
    keep.reset(new float[n]);
    for (size_t i = 0; i < n; i++) keep[i] = __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    return keep.get();
}

// The column-major contract of cublasGemmEx carried out by OpenBLAS's
// cblas_sgemm, which has the same contract: an independent implementation
// to hold ac_cuda.cu's transposes and leading dimensions against.
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *alpha, const void *A,
                            cudaDataType_t at, int lda, const void *B, cudaDataType_t bt, int ldb, const void *beta, void *C, cudaDataType_t ct,
                            int ldc, cublasComputeType_t compute, cublasGemmAlgo_t) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (ct != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F || (at != CUDA_R_32F && at != CUDA_R_16BF) || (bt != CUDA_R_32F && bt != CUDA_R_16BF))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    int arows = ta == CUBLAS_OP_N ? m : k, brows = tb == CUBLAS_OP_N ? k : n;
    if (m < 0 || n < 0 || k < 0 || lda < std::max(1, arows) || ldb < std::max(1, brows) || ldc < std::max(1, m))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (sticky != cudaSuccess) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    float al = *(const float *)alpha, be = *(const float *)beta;
    std::unique_ptr<float[]> ka, kb;
    const float *af = as_f32(A, at, arows, ta == CUBLAS_OP_N ? k : m, lda, ka), *bf = as_f32(B, bt, brows, tb == CUBLAS_OP_N ? n : k, ldb, kb);
    float *c = (float *)C;
    if (be == 0) // C is not read when beta is 0 (it may hold NaN)
        for (int j = 0; j < n; j++) memset(c + (size_t)j * ldc, 0, (size_t)m * sizeof(float));
    cblas_sgemm(CblasColMajor, ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, m, n, k, al, af, lda, bf,
                ldb, be, c, ldc);
    return CUBLAS_STATUS_SUCCESS;
}
