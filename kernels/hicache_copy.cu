// hicache_copy.cu: gather pages of the device page pool into one contiguous buffer,
// in page-table order. This is the reader side of the HiCache load-back: it runs on the
// compute stream, while load-backs (host tier -> pool) run on their own copy stream.
// Whether the gather waits for an in-flight load-back is decided by the host (a stream
// wait on the load-back's event); the kernel itself never synchronises with the copy,
// so a missing wait is a real read-before-write race on the page.
//
// Launched only by LoadBackPool (crates/engine/src/backend/cuda/loadback.rs), which the
// served engine does not use yet: a planned change moves prefill's page pool onto the
// GPU through it. Until then only the crate's GPU test runs this kernel.

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
