// kbp_stamps.cuh: in-kernel phase stamps for profiling builds (`kbpc compile --stamps`): when a
// kernel's phases start and end inside the replayed step, CTA by CTA, with the step's math unchanged.
// A replay timeline (bench/replay_timeline.py) says when each kernel ran; the stamps say where the
// time went inside it (the wait for the previous kernel, a histogram, the last CTA's gather), which
// earlier sessions could only guess from early-return probe builds whose wrong outputs changed the
// routing of every later layer.
//
// Launch contract: none. Without KBP_STAMPS (every product build) each macro below expands to
// nothing, so a kernel's machine code does not depend on its stamp sites. A kernel instance TU of a
// stamp build defines KBP_STAMPS before its includes (templates/kernel_instance.cu.j2) and exports
// its log through kbp_stamps_<instance>() (the step program's kbp_stamp_logs lists them all).
//
// Use, in a __global__ function (stamps are taken by the CTA's thread (0, 0, 0) only):
//   KBP_STAMP_BEGIN();           first statement: t[0], and the CTA's record slot (one relaxed
//                                atomicAdd whose result is needed only at the end, so nothing waits)
//   KBP_STAMP(kStampWaitIn);     just before pdl_wait()   (t[1])
//   KBP_STAMP(kStampWaitOut);    just after it            (t[2])
//   KBP_STAMP(3) .. KBP_STAMP(6) the kernel's own phase boundaries, named where they are placed
//   KBP_STAMP_END();             last statement on every path to the kernel's end: t[7] and the record
// BEGIN and END share one scope (the wrapper around a kernel body: a return inside the body comes
// back to END). A phase a CTA never reaches stays 0. KBP_STAMP may sit in a device function the
// kernel calls: the times live in 64 bytes of the CTA's shared memory until END writes them out.
//
// Log (per TU, zero at load; the host reads it and zeroes `count` between replays): count is the
// number of CTAs that began (those past kStampCapacity are counted but not stored), record i is
//   {grid (%gridid: one value per launch), block (linear blockIdx), smid, t[8] (%globaltimer, ns)}.
#pragma once

#include <stdint.h>

namespace kbp {

constexpr int kStampBegin = 0, kStampWaitIn = 1, kStampWaitOut = 2, kStampEnd = 7;
constexpr int kStampTimes = 8;
constexpr unsigned kStampCapacity = 1u << 16;   // CTAs a TU records between two reads of its log

struct StampRecord {            // 80 bytes; kbpc/runtime/stamps.py reads the same layout
    unsigned long long grid;
    unsigned block;
    unsigned smid;
    unsigned long long t[kStampTimes];
};
static_assert(sizeof(StampRecord) == 80, "the host reads 80-byte records");

#if defined(KBP_STAMPS)

static __device__ StampRecord kbp_stamp_log[kStampCapacity];
static __device__ unsigned kbp_stamp_count;

__device__ __forceinline__ bool stamp_thread() { return (threadIdx.x | threadIdx.y | threadIdx.z) == 0; }

__device__ __forceinline__ unsigned long long stamp_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ unsigned long long* stamp_times() {
    __shared__ unsigned long long t[kStampTimes];
    return t;
}

__device__ __forceinline__ unsigned stamp_begin() {
    if (!stamp_thread()) return 0u;
    unsigned long long* t = stamp_times();
    t[0] = stamp_now();
#pragma unroll
    for (int i = 1; i < kStampTimes; ++i) t[i] = 0ull;
    return atomicAdd(&kbp_stamp_count, 1u);
}

__device__ __forceinline__ void stamp(int i) {
    if (stamp_thread()) stamp_times()[i] = stamp_now();
}

__device__ __forceinline__ void stamp_end(unsigned slot) {
    if (!stamp_thread()) return;
    unsigned long long* t = stamp_times();
    t[kStampEnd] = stamp_now();
    if (slot >= kStampCapacity) return;
    StampRecord& r = kbp_stamp_log[slot];
    unsigned long long grid;
    unsigned smid;
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(grid));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    r.grid = grid;
    r.block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    r.smid = smid;
#pragma unroll
    for (int i = 0; i < kStampTimes; ++i) r.t[i] = t[i];
}

#define KBP_STAMP_BEGIN() const unsigned kbp_stamp_slot_ = ::kbp::stamp_begin()
#define KBP_STAMP(i) ::kbp::stamp(i)
#define KBP_STAMP_END() ::kbp::stamp_end(kbp_stamp_slot_)

// The TU's log for the host (called by kbp_stamps_<instance> in a stamp build's kernel TU).
inline cudaError_t stamp_log_addresses(void** log, void** count) {
    cudaError_t err = cudaGetSymbolAddress(log, kbp_stamp_log);
    if (err != cudaSuccess) return err;
    return cudaGetSymbolAddress(count, kbp_stamp_count);
}

#else

#define KBP_STAMP_BEGIN() ((void)0)
#define KBP_STAMP(i) ((void)0)
#define KBP_STAMP_END() ((void)0)

#endif

}  // namespace kbp
