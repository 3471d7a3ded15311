// common.cuh: device helpers that several kernels share. Not a kernel file of its own:
// KERNEL_SOURCES (crates/engine/src/backend/cuda/mod.rs) puts this text before every
// kernels/*.cu it embeds, because NVRTC compiles those embedded sources with no file
// system to look a header up in.

#ifndef BISECT_KERNELS_COMMON_CUH
#define BISECT_KERNELS_COMMON_CUH

// A non-finite score or logit (stale garbage) becomes -inf, so that it ranks last, as
// on the CPU.
__device__ __forceinline__ float sanitize_score(float score)
{
    return (__float_as_uint(score) & 0x7F800000u) != 0x7F800000u ? score : -__int_as_float(0x7F800000);
}

// The job that owns `index` when job j owns start[j] .. start[j + 1] (prefix sums over
// `jobs` jobs): rows, selections or tiles of a batch.
__device__ __forceinline__ unsigned int job_of(const unsigned int* start, unsigned int jobs, unsigned int index)
{
    unsigned int lo = 0, hi = jobs;
    while (hi - lo > 1u) {
        const unsigned int mid = (lo + hi) / 2u;
        if (start[mid] <= index) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// A generation tag, loaded with acquire semantics at GPU scope (ld.acquire.gpu): a
// load-back copies a page's data and then its tag on one copy stream, so a tag that
// holds the expected generation means the data before it has landed.
__device__ __forceinline__ unsigned int load_acquire_u32(const unsigned int* address)
{
    unsigned int value;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
    return value;
}

// Adds to *stale one per page of `pages` (count of them) whose tag in `tags` does not
// hold the generation the host expects (expected[i] for pages[i]), the block's threads
// striding over the pages; ends with a block barrier (every thread must call it).
__device__ __forceinline__ void count_stale_pages(const unsigned int* __restrict__ tags,
                                                  const unsigned int* __restrict__ pages,
                                                  const unsigned int* __restrict__ expected, unsigned int count,
                                                  unsigned long long* __restrict__ stale)
{
    for (unsigned int i = threadIdx.x; i < count; i += blockDim.x) {
        if (load_acquire_u32(tags + pages[i]) != expected[i]) {
            atomicAdd(stale, 1ull);
        }
    }
    __syncthreads();
}

#endif
