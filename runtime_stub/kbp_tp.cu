// kbp_tp.cu: the tensor-parallel half of the runtime (hand-written; compiled and linked, with
// NCCL, only into the libraries of a tensor-parallel bundle: a tp = 1 library never sees NCCL).
//
// One process per GPU, one communicator per process (ncclCommInitRankConfig, non-blocking so that
// every wait has a deadline). The collective region is one NCCL allocation (ncclMemAlloc) of
// kbp_step_info.comm_bytes, registered as a symmetric window (NCCL_WIN_COLL_SYMMETRIC), so the
// step's small all-gathers run on NCCL's symmetric-memory low-latency kernels. Each post-mix site
// owns `ranks` slots of that region; a rank writes its BF16 partial into its own slot and the
// in-place all-gather fills the others (a plain data movement: the sum happens afterwards, in the
// post-mix kernel, in rank order, so every rank gets the same bits). The all-gathers are enqueued
// on the step's stream and captured in its CUDA graph like any kernel.
//
// A rank that dies or hangs must not hang the others: init and every wait poll with a deadline,
// then ncclCommAbort (which unblocks NCCL kernels in flight) and report the timeout.
#include "kbp_runtime.h"

#include <nccl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 27, 0)
#error "kbpc tensor parallelism needs NCCL 2.27 or newer (symmetric memory windows)"
#endif

namespace {

struct TpState {
    ncclComm_t comm = nullptr;
    ncclWindow_t window = nullptr;
    void* region = nullptr;            // the collective region (ncclMemAlloc)
    void* staging = nullptr;           // host exchanges (kbp_tp_exchange): in, then ranks x out
    int exchange = 256;                // bytes per rank an exchange may carry
    cudaStream_t side = nullptr;       // stream of the host exchanges
    int rank = 0, ranks = 1;
    int failed = 0;                    // a wait timed out or NCCL failed: the communicator is aborted
    int loopback = 0;                  // one rank alone (tests): all-gathers are no-ops
};

TpState g_tp;
thread_local char g_tp_error[512] = "";

double now_ms() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int tp_fail(const char* what, const char* why) {
    snprintf(g_tp_error, sizeof g_tp_error, "rank %d of %d: %s: %s", g_tp.rank, g_tp.ranks, what, why);
    return 1;
}

void abort_comm() {
    if (g_tp.comm && !g_tp.failed) ncclCommAbort(g_tp.comm);
    g_tp.failed = 1;
}

// Poll a non-blocking call to completion, with a deadline.
int settle(ncclResult_t r, const char* what, double deadline_ms) {
    while (r == ncclInProgress) {
        if (now_ms() > deadline_ms) {
            abort_comm();
            return tp_fail(what, "timed out (a rank died or hangs?)");
        }
        struct timespec pause = {0, 200000};
        nanosleep(&pause, nullptr);
        ncclCommGetAsyncError(g_tp.comm, &r);
    }
    if (r != ncclSuccess) {
        abort_comm();
        return tp_fail(what, ncclGetErrorString(r));
    }
    return 0;
}

}  // namespace

extern "C" {

const char* kbp_tp_last_error(void) { return g_tp_error; }

int kbp_tp_unique_id(unsigned char* out, int size) {
    ncclUniqueId id;
    if (size != (int)sizeof id) return tp_fail("unique id", "wrong buffer size");
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return tp_fail("ncclGetUniqueId", ncclGetErrorString(r));
    memcpy(out, &id, sizeof id);
    return 0;
}

int kbp_tp_init(int rank, int ranks, const unsigned char* id_bytes, int size, int timeout_ms,
                int exchange_bytes) {
    const KbpStepInfo& info = kbp_step_info;
    g_tp.rank = rank;
    g_tp.ranks = ranks;
    if (ranks != info.tp_ranks || rank != info.tp_rank)
        return tp_fail("init", "this library was built for another rank or rank count");
    if (size != (int)sizeof(ncclUniqueId)) return tp_fail("init", "wrong unique id size");
    if (exchange_bytes < 8) return tp_fail("init", "exchanges need at least 8 bytes");
    g_tp.exchange = (exchange_bytes + 255) / 256 * 256;
    ncclUniqueId id;
    memcpy(&id, id_bytes, sizeof id);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    double deadline = now_ms() + timeout_ms;
    if (settle(ncclCommInitRankConfig(&g_tp.comm, ranks, id, rank, &config), "ncclCommInitRankConfig", deadline))
        return 1;
    size_t bytes = info.comm_bytes > 0 ? info.comm_bytes : 256;
    if (settle(ncclMemAlloc(&g_tp.region, bytes), "ncclMemAlloc (collective region)", deadline)) return 1;
    if (settle(ncclMemAlloc(&g_tp.staging, (size_t)g_tp.exchange * (1 + ranks)), "ncclMemAlloc (staging)", deadline))
        return 1;
    if (cudaMemset(g_tp.region, 0, bytes) != cudaSuccess) return tp_fail("init", "clearing the region failed");
    if (settle(ncclCommWindowRegister(g_tp.comm, g_tp.region, bytes, &g_tp.window, NCCL_WIN_COLL_SYMMETRIC),
               "ncclCommWindowRegister", deadline))
        return 1;
    if (cudaStreamCreateWithFlags(&g_tp.side, cudaStreamNonBlocking) != cudaSuccess)
        return tp_fail("init", "creating the exchange stream failed");
    return 0;
}

// One rank without NCCL (tests on one GPU): the caller owns `region` and fills the other ranks'
// slots before each step; the step's all-gathers do nothing.
int kbp_tp_init_loopback(void* region, int rank) {
    const KbpStepInfo& info = kbp_step_info;
    if (rank != info.tp_rank) return tp_fail("loopback", "this library was built for another rank");
    g_tp = TpState();
    g_tp.region = region;
    g_tp.rank = rank;
    g_tp.ranks = info.tp_ranks;
    g_tp.loopback = 1;
    return 0;
}

void* kbp_tp_comm_buffer(void) { return g_tp.region; }

// The step's collective: slot `rank` of `base` (slot_bytes each) to every rank's same slot.
cudaError_t kbp_tp_all_gather(void* base, size_t slot_bytes, cudaStream_t stream) {
    if (g_tp.loopback) return cudaSuccess;
    if (!g_tp.comm || g_tp.failed) return cudaErrorNotReady;
    char* slots = (char*)base;
    ncclResult_t r = ncclAllGather(slots + slot_bytes * g_tp.rank, slots, slot_bytes, ncclUint8, g_tp.comm, stream);
    if (settle(r, "ncclAllGather", now_ms() + 10000.0)) return cudaErrorUnknown;
    return cudaSuccess;
}

// Wait for `stream` with a deadline; on timeout the communicator is aborted (so the NCCL kernels
// of this rank end) and the error names the timeout.
int kbp_tp_wait(cudaStream_t stream, int timeout_ms, const char* what) {
    double deadline = now_ms() + timeout_ms;
    for (;;) {
        cudaError_t e = cudaStreamQuery(stream);
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotReady) return tp_fail(what, cudaGetErrorString(e));
        ncclResult_t async = ncclSuccess;
        if (g_tp.comm) ncclCommGetAsyncError(g_tp.comm, &async);
        if (async != ncclSuccess && async != ncclInProgress) {
            abort_comm();
            return tp_fail(what, ncclGetErrorString(async));
        }
        if (now_ms() > deadline) {
            abort_comm();
            char why[128];
            snprintf(why, sizeof why, "no progress within %d ms (a rank died or hangs in a collective?)", timeout_ms);
            return tp_fail(what, why);
        }
        struct timespec pause = {0, 50000};
        nanosleep(&pause, nullptr);
    }
}

// All-gather `bytes` (<= the init's exchange_bytes) of host data from every rank into
// out[ranks][bytes], rank order (the argmax pairs, or the logits slices padded to one size).
int kbp_tp_exchange(const void* in, void* out, int bytes, int timeout_ms) {
    if (!g_tp.comm || g_tp.failed) return tp_fail("exchange", "no communicator");
    if (bytes < 1 || bytes > g_tp.exchange) return tp_fail("exchange", "more bytes than kbp_tp_init allowed");
    char* stage = (char*)g_tp.staging;
    if (cudaMemcpyAsync(stage, in, bytes, cudaMemcpyHostToDevice, g_tp.side) != cudaSuccess)
        return tp_fail("exchange", "copy in failed");
    char* gathered = stage + g_tp.exchange;
    ncclResult_t r = ncclAllGather(stage, gathered, bytes, ncclUint8, g_tp.comm, g_tp.side);
    if (settle(r, "ncclAllGather (exchange)", now_ms() + timeout_ms)) return 1;
    if (cudaMemcpyAsync(out, gathered, (size_t)bytes * g_tp.ranks, cudaMemcpyDeviceToHost, g_tp.side) != cudaSuccess)
        return tp_fail("exchange", "copy out failed");
    return kbp_tp_wait(g_tp.side, timeout_ms, "exchange");
}

int kbp_tp_finalize(void) {
    if (!g_tp.comm) {
        g_tp = TpState();
        return 0;
    }
    if (!g_tp.failed) {
        if (g_tp.window) ncclCommWindowDeregister(g_tp.comm, g_tp.window);
        ncclCommDestroy(g_tp.comm);
    }
    if (g_tp.region) ncclMemFree(g_tp.region);
    if (g_tp.staging) ncclMemFree(g_tp.staging);
    if (g_tp.side) cudaStreamDestroy(g_tp.side);
    g_tp = TpState();
    return 0;
}

}  // extern "C"
