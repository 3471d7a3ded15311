// hicache_copy.cu: gather pages of the device page pool into one contiguous buffer,
// in page-table order. This is the reader side of the HiCache load-back: it runs on the
// compute stream, while load-backs (host tier -> pool) run on their own copy stream.
// Whether the gather waits for an in-flight load-back is decided by the host (a stream
// wait on the load-back's event); the kernel itself never synchronises with the copy,
// so a missing wait is a real read-before-write race on the page.
//
// gather_pages is launched only by LoadBackPool (crates/engine/src/backend/cuda/loadback.rs,
// superseded by the paged pools, kept for its test). paged_gather_sequence below is the
// served prefill's reader on --device cuda: it gathers a finished prompt's rows out of
// the paged pool for shipping to decode (crates/engine/src/backend/cuda/pool.rs).
// load_acquire_u32 is kernels/common.cuh's.

extern "C" __global__ void gather_pages(const unsigned char* __restrict__ pool,
                                        const unsigned int* __restrict__ page_ids,
                                        unsigned int num_pages,
                                        unsigned int page_bytes,
                                        unsigned char* __restrict__ out)
{
    const unsigned long long total = (unsigned long long)num_pages * page_bytes;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned long long page = i / page_bytes;
        const unsigned long long offset = i - page * page_bytes;
        out[i] = pool[(unsigned long long)page_ids[page] * page_bytes + offset];
    }
}

// The modelled duration of a prefill forward on the compute stream (one thread spins on
// the GPU's global timer): the miniature model's own kernels take microseconds where a
// real model's forward over the same tokens takes milliseconds, and the HiCache race is
// decided by how long the copy engine has before the prompt's KV is read for shipping.
// Launched between a step's writes and its gathers only when the engine is tuned with a
// nonzero --prefill-forward-ns-per-token.
extern "C" __global__ void model_forward_delay(unsigned long long ns)
{
    unsigned long long start;
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

#define GATHER_MAIN_DIM 64

// One block per page of the sequence (page-table order): rows first..first+n of the
// output get the page's main KV (GATHER_MAIN_DIM f32 per row) and index-K (width bytes
// per row, width a multiple of 4, copied as 32-bit words). Before any data is read,
// thread 0 loads both generation tags of the page (ld.acquire.gpu) and compares them
// with the generation the host expects: bit 0 of page_stale[p] = index-K tag mismatch,
// bit 1 = main-KV tag mismatch, each also added to stale[0] / stale[1]. The host made
// this stream wait on the main-KV load-back events (always) and on the index-K ones
// (only with SGLANG_DSV4_INDEX_K_HICACHE_SYNC=1); without that wait the copy engine may
// still be writing the index-K page while this block reads it, and then the page's
// index-K tag, copied after its data on the same copy stream, does not match yet.
extern "C" __global__ void paged_gather_sequence(const float* __restrict__ main_pool,
                                                 const unsigned char* __restrict__ index_pool,
                                                 const unsigned int* __restrict__ main_tag,
                                                 const unsigned int* __restrict__ index_tag,
                                                 const unsigned int* __restrict__ page_table,
                                                 const unsigned int* __restrict__ page_expected,
                                                 unsigned int num_pages, unsigned int rows,
                                                 unsigned int page_tokens, unsigned int width,
                                                 float* __restrict__ main_out,
                                                 unsigned char* __restrict__ index_out,
                                                 unsigned int* __restrict__ page_stale,
                                                 unsigned long long* __restrict__ stale)
{
    const unsigned int p = blockIdx.x;
    if (p >= num_pages) {
        return;
    }
    const unsigned int page = page_table[p];
    if (threadIdx.x == 0) {
        unsigned int flags = 0;
        if (load_acquire_u32(index_tag + page) != page_expected[p]) {
            flags |= 1u;
            atomicAdd(stale, 1ull);
        }
        if (load_acquire_u32(main_tag + page) != page_expected[p]) {
            flags |= 2u;
            atomicAdd(stale + 1, 1ull);
        }
        page_stale[p] = flags;
    }
    __syncthreads();
    const unsigned int first = p * page_tokens;
    const unsigned int left = rows - first;
    const unsigned int n = left < page_tokens ? left : page_tokens;
    const float* main_src = main_pool + (unsigned long long)page * page_tokens * GATHER_MAIN_DIM;
    float* main_dst = main_out + (unsigned long long)first * GATHER_MAIN_DIM;
    for (unsigned int i = threadIdx.x; i < n * GATHER_MAIN_DIM; i += blockDim.x) {
        main_dst[i] = main_src[i];
    }
    const unsigned int words = n * (width / 4);
    const unsigned int* index_src =
        (const unsigned int*)(index_pool + (unsigned long long)page * page_tokens * width);
    unsigned int* index_dst = (unsigned int*)(index_out + (unsigned long long)first * width);
    for (unsigned int i = threadIdx.x; i < words; i += blockDim.x) {
        index_dst[i] = index_src[i];
    }
}
