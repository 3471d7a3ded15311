// indexer_topk.cu: DSA indexer scores over stored index-K, then the top-k positions.
//
// A batch holds several jobs (one query each). Rows (positions) of all jobs are
// concatenated: job j owns rows row_start[j] .. row_start[j+1], its index-K bytes start
// at row_start[j] * bytes_per_token, its query at j * INDEX_DIM.
//
// Scores must equal the CPU backend's (src/engine/backend/cpu.rs and the `layout`
// module) bit for bit, so each row's dot product runs in one thread, sequentially over
// d = 0..127, starting from -0.0 like Rust's f32 `sum()`, with non-contractible
// __fmul_rn/__fadd_rn:
//   bf16: score = sum_d q[d] * f32(bits << 16)
//   fp8:  score = sum_d q[d] * (e4m3(k[d]) * scale), NaN patterns decoding to +0
// A non-finite score (stale garbage) is replaced by -inf so it ranks last
// (sanitize_score; it, job_of and count_stale_pages are kernels/common.cuh's).
//
// Top-k order: score descending, ties by the lower position. Both variants sort the
// same 64-bit composite key (order-preserving score bits << 32 | ~position), which is
// unique per row, so their results are identical:
//   V1: full bitonic sort of every row of the job (global scratch, one block per job);
//   V2: radix select of the k-th largest key (8 passes of 8-bit histograms), then a
//       rank sort of the k survivors only.

#define INDEX_DIM 128
#define FP8_TOKEN_BYTES (INDEX_DIM + 4)

__device__ __forceinline__ float bf16_bits_to_f32(unsigned int bits)
{
    return __uint_as_float(bits << 16);
}

// e4m3 -> f32, equal to the CPU's decode table (float8's to_f32, exact): normals map
// exponent-bias 7 -> 127, subnormals are m * 2^-9, the NaN patterns 0x7F/0xFF give +0.
__device__ __forceinline__ float e4m3_bits_to_f32(unsigned int bits)
{
    const unsigned int sign = (bits & 0x80u) << 24;
    const unsigned int exponent = (bits >> 3) & 0xFu;
    const unsigned int mantissa = bits & 0x7u;
    if ((bits & 0x7Fu) == 0x7Fu) {
        return 0.0f;
    }
    if (exponent == 0u) {
        const float magnitude = __fmul_rn((float)mantissa, 0.001953125f); // 2^-9
        return __uint_as_float(__float_as_uint(magnitude) | sign);
    }
    return __uint_as_float(sign | ((exponent + 120u) << 23) | (mantissa << 20));
}

// One thread per stored row of every job: the row's score against its job's query,
// summed in dimension order from -0.0 over the dequantized index key (bf16: 2 bytes an
// element; fp8: 1 byte an element, then the f32 scale).
template <bool FP8>
__device__ __forceinline__ void score_rows(const float* __restrict__ queries, const unsigned char* __restrict__ index_k,
                                           const unsigned int* __restrict__ row_start, unsigned int jobs,
                                           float* __restrict__ scores)
{
    const unsigned int rows = row_start[jobs];
    for (unsigned int row = blockIdx.x * blockDim.x + threadIdx.x; row < rows; row += gridDim.x * blockDim.x) {
        const float* q = queries + (unsigned long long)job_of(row_start, jobs, row) * INDEX_DIM;
        const unsigned char* k = index_k + (unsigned long long)row * (FP8 ? FP8_TOKEN_BYTES : INDEX_DIM * 2);
        float acc = -0.0f;
        if (FP8) {
            const unsigned int scale_bits = (unsigned int)k[INDEX_DIM] | ((unsigned int)k[INDEX_DIM + 1] << 8) |
                                            ((unsigned int)k[INDEX_DIM + 2] << 16) |
                                            ((unsigned int)k[INDEX_DIM + 3] << 24);
            const float scale = __uint_as_float(scale_bits);
            for (unsigned int d = 0; d < INDEX_DIM; ++d) {
                const float dequantized = __fmul_rn(e4m3_bits_to_f32(k[d]), scale);
                acc = __fadd_rn(acc, __fmul_rn(q[d], dequantized));
            }
        } else {
            for (unsigned int d = 0; d < INDEX_DIM; ++d) {
                const unsigned int bits = (unsigned int)k[2 * d] | ((unsigned int)k[2 * d + 1] << 8);
                acc = __fadd_rn(acc, __fmul_rn(q[d], bf16_bits_to_f32(bits)));
            }
        }
        scores[row] = sanitize_score(acc);
    }
}

extern "C" __global__ void indexer_scores_bf16(const float* __restrict__ queries,
                                               const unsigned char* __restrict__ index_k,
                                               const unsigned int* __restrict__ row_start, unsigned int jobs,
                                               float* __restrict__ scores)
{
    score_rows<false>(queries, index_k, row_start, jobs, scores);
}

extern "C" __global__ void indexer_scores_fp8(const float* __restrict__ queries,
                                              const unsigned char* __restrict__ index_k,
                                              const unsigned int* __restrict__ row_start, unsigned int jobs,
                                              float* __restrict__ scores)
{
    score_rows<true>(queries, index_k, row_start, jobs, scores);
}

// Larger key = earlier in the top-k: the score bits made monotone exactly like Rust's
// f32::total_cmp (so -0.0 ranks below +0.0, as on the CPU), then the inverted position.
__device__ __forceinline__ unsigned long long topk_key(float score, unsigned int position)
{
    const unsigned int bits = __float_as_uint(score);
    const unsigned int ordered = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
    return ((unsigned long long)ordered << 32) | (unsigned long long)(0xFFFFFFFFu - position);
}

__device__ __forceinline__ unsigned int topk_key_position(unsigned long long key)
{
    return 0xFFFFFFFFu - (unsigned int)(key & 0xFFFFFFFFull);
}

// One block per job. scratch holds next_pow2(n_j) keys per job from scratch_start[j].
// out holds k slots per job; the first min(k, n_j) are written.
extern "C" __global__ void topk_v1_bitonic(const float* __restrict__ scores,
                                           const unsigned int* __restrict__ row_start,
                                           const unsigned long long* __restrict__ scratch_start,
                                           unsigned long long* __restrict__ scratch,
                                           unsigned int k,
                                           unsigned int* __restrict__ out)
{
    const unsigned int job = blockIdx.x;
    const unsigned int first_row = row_start[job];
    const unsigned int n = row_start[job + 1] - first_row;
    unsigned long long* keys = scratch + scratch_start[job];
    unsigned int padded = 1u;
    while (padded < n) {
        padded <<= 1;
    }
    for (unsigned int i = threadIdx.x; i < padded; i += blockDim.x) {
        // Padding key 0 sorts after every real key: scores are finite or -inf, whose
        // ordered bits are at least 0x007FFFFF.
        keys[i] = i < n ? topk_key(scores[first_row + i], i) : 0ull;
    }
    __syncthreads();
    for (unsigned int size = 2u; size <= padded; size <<= 1) {
        for (unsigned int stride = size >> 1; stride > 0u; stride >>= 1) {
            for (unsigned int i = threadIdx.x; i < padded; i += blockDim.x) {
                const unsigned int partner = i ^ stride;
                if (partner > i) {
                    const bool descending = (i & size) == 0u;
                    const unsigned long long a = keys[i];
                    const unsigned long long b = keys[partner];
                    if ((a < b) == descending) {
                        keys[i] = b;
                        keys[partner] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
    const unsigned int take = n < k ? n : k;
    for (unsigned int r = threadIdx.x; r < take; r += blockDim.x) {
        out[(unsigned long long)job * k + r] = topk_key_position(keys[r]);
    }
}

// One block per job. scratch holds k keys per job (job * k): the selected survivors.
extern "C" __global__ void topk_v2_radix_select(const float* __restrict__ scores,
                                                const unsigned int* __restrict__ row_start,
                                                unsigned long long* __restrict__ scratch,
                                                unsigned int k,
                                                unsigned int* __restrict__ out)
{
    __shared__ unsigned int histogram[256];
    __shared__ unsigned long long prefix;
    __shared__ unsigned long long prefix_mask;
    __shared__ unsigned int remaining;
    __shared__ unsigned int survivors;

    const unsigned int job = blockIdx.x;
    const unsigned int first_row = row_start[job];
    const unsigned int n = row_start[job + 1] - first_row;
    const unsigned int take = n < k ? n : k;
    if (take == 0u) {
        return;
    }
    if (threadIdx.x == 0) {
        prefix = 0ull;
        prefix_mask = 0ull;
        remaining = take;
        survivors = 0u;
    }
    // Keys are unique, so after 8 passes the prefix is exactly the take-th largest key.
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (unsigned int b = threadIdx.x; b < 256u; b += blockDim.x) {
            histogram[b] = 0u;
        }
        __syncthreads();
        const unsigned long long want = prefix;
        const unsigned long long mask = prefix_mask;
        for (unsigned int i = threadIdx.x; i < n; i += blockDim.x) {
            const unsigned long long key = topk_key(scores[first_row + i], i);
            if ((key & mask) == want) {
                atomicAdd(&histogram[(unsigned int)(key >> shift) & 0xFFu], 1u);
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned int above = 0u;
            for (int b = 255; b >= 0; --b) {
                if (above + histogram[b] >= remaining) {
                    prefix |= (unsigned long long)b << shift;
                    prefix_mask |= 0xFFull << shift;
                    remaining -= above;
                    break;
                }
                above += histogram[b];
            }
        }
        __syncthreads();
    }
    const unsigned long long threshold = prefix;
    unsigned long long* selected = scratch + (unsigned long long)job * k;
    for (unsigned int i = threadIdx.x; i < n; i += blockDim.x) {
        const unsigned long long key = topk_key(scores[first_row + i], i);
        if (key >= threshold) {
            selected[atomicAdd(&survivors, 1u)] = key;
        }
    }
    __syncthreads();
    // The survivors arrive in atomic order; ranking by key makes the output deterministic.
    for (unsigned int i = threadIdx.x; i < take; i += blockDim.x) {
        const unsigned long long key = selected[i];
        unsigned int rank = 0u;
        for (unsigned int j = 0; j < take; ++j) {
            rank += selected[j] > key ? 1u : 0u;
        }
        out[(unsigned long long)job * k + rank] = topk_key_position(key);
    }
}

// ---------------------------------------------------------------------------------
// Paged indexer scores: the same scores (bit for bit) read straight from a device pool
// through page tables (crates/engine/src/backend/paged.rs). Pool layout: page p's
// index-K rows are the contiguous bytes index_pool[p * page_tokens * row_bytes ...].
//
// Job j owns the page-table entries page_start[j] .. page_start[j+1] and the score
// slots row_start[j] .. row_start[j+1] (one per position < n_j). A block of
// PAGED_THREADS handles one tile: tile_pages consecutive pages of one job (tile_pages *
// page_tokens <= PAGED_TILE_ROWS). Blocks map to (job, tile) through tile_start (prefix
// sums of tiles per job).
//
// Memory traffic: the tile's pages are read once, coalesced, in 16-byte loads, into
// shared memory (bf16 rows padded to 65 words so that thread t reading word w of row t
// hits bank (t + w) % 32; fp8 rows are 33 words, odd already). Each thread then
// dequantizes its own row in registers and sums it sequentially over d = 0..127, the
// CPU's order, so the score equals the CPU backend's. Only the scores (4 bytes per
// row) go back to global memory, for the top-k kernels above.
//
// Stale reads: before any data is read, one thread per page loads the page's index-K
// generation tag (ld.acquire.gpu, count_stale_pages in kernels/common.cuh) and compares it with the generation the host expects
// (page_expected, parallel to the page table); a mismatch adds one to *stale. A
// load-back copies a page's data and then its tag on one copy stream, so a matching tag
// means the data landed; a mismatch means this read raced an unfinished load-back.

#define PAGED_THREADS 128
#define PAGED_TILE_ROWS 128
#define BF16_ROW_WORDS 64
#define BF16_SMEM_STRIDE 65
#define FP8_ROW_WORDS 33

// Reads the tile's pages (page_bytes each, chunks_per_page 16-byte chunks) from the
// pool, PAGED_THREADS threads striding over the chunks: store(c, page_in_tile, chunk, v)
// gets chunk c of the tile (chunk `chunk` of its page `page_in_tile`), v its bytes.
// Unrolled so that several 16-byte loads are in flight before the first store.
template <typename Store>
__device__ __forceinline__ void load_tile_chunks(const unsigned char* __restrict__ index_pool,
                                                 const unsigned int* __restrict__ page_table, unsigned int first_entry,
                                                 unsigned int pages, unsigned int chunks_per_page,
                                                 unsigned long long page_bytes, Store store)
{
    const unsigned int chunks = pages * chunks_per_page;
#pragma unroll 4
    for (unsigned int c = threadIdx.x; c < chunks; c += PAGED_THREADS) {
        const unsigned int page_in_tile = c / chunks_per_page;
        const unsigned int chunk = c - page_in_tile * chunks_per_page;
        const unsigned long long page = page_table[first_entry + page_in_tile];
        store(c, page_in_tile, chunk, reinterpret_cast<const uint4*>(index_pool + page * page_bytes)[chunk]);
    }
}

// The row this thread scores in its job's tile: true, with its position in the job,
// when the tile holds such a row (thread t takes the tile's row t).
__device__ __forceinline__ bool tile_row(const unsigned int* __restrict__ row_start,
                                         const unsigned int* __restrict__ tile_start, unsigned int job,
                                         unsigned int tile_pages, unsigned int page_tokens, unsigned int pages,
                                         unsigned int* position)
{
    const unsigned int n = row_start[job + 1] - row_start[job];
    const unsigned int tile = blockIdx.x - tile_start[job];
    *position = (tile * tile_pages) * page_tokens + threadIdx.x;
    return threadIdx.x < pages * page_tokens && *position < n;
}

// The tile a block reads: its job, the page-table entry of its first page, and its
// number of pages (at most tile_pages; 0: nothing to do).
struct PagedTile {
    unsigned int job;
    unsigned int first_entry;
    unsigned int pages;
};

// Common prologue of both kernels: which tile this block reads, its job's query in
// shared memory, and the index-K tag check of its pages (count_stale_pages), whose
// closing block barrier makes the query visible to every thread (every thread of the
// block must call it).
__device__ __forceinline__ PagedTile paged_tile_setup(const float* __restrict__ queries,
                                                      const unsigned int* __restrict__ index_tag,
                                                      const unsigned int* __restrict__ page_table,
                                                      const unsigned int* __restrict__ page_expected,
                                                      const unsigned int* __restrict__ page_start,
                                                      const unsigned int* __restrict__ tile_start, unsigned int jobs,
                                                      unsigned int tile_pages, float* q_shared,
                                                      unsigned long long* __restrict__ stale)
{
    const unsigned int job = job_of(tile_start, jobs, blockIdx.x);
    const unsigned int tile = blockIdx.x - tile_start[job];
    const unsigned int first_entry = page_start[job] + tile * tile_pages;
    const unsigned int remaining = page_start[job + 1] - first_entry;
    const unsigned int pages = remaining < tile_pages ? remaining : tile_pages;
    for (unsigned int d = threadIdx.x; d < INDEX_DIM; d += blockDim.x) {
        q_shared[d] = queries[(unsigned long long)job * INDEX_DIM + d];
    }
    count_stale_pages(index_tag, page_table + first_entry, page_expected + first_entry, pages, stale);
    return PagedTile{job, first_entry, pages};
}

// The parameters of both paged_indexer_scores_* kernels, in order: the host launches
// either one with the same arguments (crates/engine/src/backend/cuda/pool/reads.rs).
#define PAGED_SCORES_PARAMS                                                                                        \
    const float* __restrict__ queries, const unsigned char* __restrict__ index_pool,                               \
        const unsigned int* __restrict__ index_tag, const unsigned int* __restrict__ page_table,                   \
        const unsigned int* __restrict__ page_expected, const unsigned int* __restrict__ page_start,               \
        const unsigned int* __restrict__ tile_start, const unsigned int* __restrict__ row_start, unsigned int jobs, \
        unsigned int page_tokens, unsigned int tile_pages, float* __restrict__ scores,                             \
        unsigned long long* __restrict__ stale

extern "C" __global__ __launch_bounds__(PAGED_THREADS) void paged_indexer_scores_bf16(PAGED_SCORES_PARAMS)
{
    __shared__ unsigned int rows_shared[PAGED_TILE_ROWS * BF16_SMEM_STRIDE];
    __shared__ float q_shared[INDEX_DIM];
    const PagedTile tile = paged_tile_setup(queries, index_tag, page_table, page_expected, page_start, tile_start,
                                            jobs, tile_pages, q_shared, stale);
    // 16 chunks of 16 bytes per 256-byte row; consecutive threads read consecutive chunks,
    // each row re-strided to BF16_SMEM_STRIDE words.
    load_tile_chunks(index_pool, page_table, tile.first_entry, tile.pages, page_tokens * (BF16_ROW_WORDS / 4),
                     (unsigned long long)page_tokens * (BF16_ROW_WORDS * 4),
                     [&](unsigned int, unsigned int page_in_tile, unsigned int chunk, uint4 v) {
                         const unsigned int row = page_in_tile * page_tokens + chunk / (BF16_ROW_WORDS / 4);
                         unsigned int* dst = rows_shared + row * BF16_SMEM_STRIDE + (chunk % (BF16_ROW_WORDS / 4)) * 4;
                         dst[0] = v.x;
                         dst[1] = v.y;
                         dst[2] = v.z;
                         dst[3] = v.w;
                     });
    __syncthreads();
    unsigned int position;
    if (tile_row(row_start, tile_start, tile.job, tile_pages, page_tokens, tile.pages, &position)) {
        const unsigned int* row = rows_shared + threadIdx.x * BF16_SMEM_STRIDE;
        float acc = -0.0f;
#pragma unroll 8
        for (unsigned int w = 0; w < BF16_ROW_WORDS; ++w) {
            const unsigned int bits = row[w];
            acc = __fadd_rn(acc, __fmul_rn(q_shared[2 * w], bf16_bits_to_f32(bits & 0xFFFFu)));
            acc = __fadd_rn(acc, __fmul_rn(q_shared[2 * w + 1], bf16_bits_to_f32(bits >> 16)));
        }
        scores[row_start[tile.job] + position] = sanitize_score(acc);
    }
}

extern "C" __global__ __launch_bounds__(PAGED_THREADS) void paged_indexer_scores_fp8(PAGED_SCORES_PARAMS)
{
    __shared__ uint4 rows_shared[PAGED_TILE_ROWS * FP8_ROW_WORDS / 4];
    __shared__ float q_shared[INDEX_DIM];
    const PagedTile tile = paged_tile_setup(queries, index_tag, page_table, page_expected, page_start, tile_start,
                                            jobs, tile_pages, q_shared, stale);
    // A page of page_tokens (a multiple of 4) rows of 132 bytes is a whole number of
    // 16-byte chunks; the tile keeps the pages' bytes back to back.
    load_tile_chunks(index_pool, page_table, tile.first_entry, tile.pages, page_tokens * FP8_ROW_WORDS / 4,
                     (unsigned long long)page_tokens * FP8_TOKEN_BYTES,
                     [&](unsigned int c, unsigned int, unsigned int, uint4 v) { rows_shared[c] = v; });
    __syncthreads();
    unsigned int position;
    if (tile_row(row_start, tile_start, tile.job, tile_pages, page_tokens, tile.pages, &position)) {
        const unsigned int* row = reinterpret_cast<const unsigned int*>(rows_shared) + threadIdx.x * FP8_ROW_WORDS;
        const float scale = __uint_as_float(row[INDEX_DIM / 4]);
        float acc = -0.0f;
#pragma unroll 4
        for (unsigned int w = 0; w < INDEX_DIM / 4; ++w) {
            const unsigned int bits = row[w];
#pragma unroll
            for (unsigned int i = 0; i < 4; ++i) {
                const float dequantized = __fmul_rn(e4m3_bits_to_f32((bits >> (8 * i)) & 0xFFu), scale);
                acc = __fadd_rn(acc, __fmul_rn(q_shared[4 * w + i], dequantized));
            }
        }
        scores[row_start[tile.job] + position] = sanitize_score(acc);
    }
}
