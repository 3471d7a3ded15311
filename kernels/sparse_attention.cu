// sparse_attention.cu: softmax(q . K_sel / sqrt(MAIN_DIM)) over the rows the indexer
// selected, through the MLA up-projection W (MAIN_DIM x MAIN_DIM, row-major, from
// `mla_up_projection()` in src/engine/backend/mod.rs); per job the argmax position
// (ties: lower position) and its softmax weight.
//
// A batch holds several jobs. Stored latent key rows of all jobs are concatenated (job j
// owns rows row_start[j] .. row_start[j+1], MAIN_DIM f32 each, position-major), and so
// are the selected positions (job j owns sel_start[j] .. sel_start[j+1], positions
// relative to the job's first row). The host checks every selected position is < n_j.
//
// Logits equal the CPU backend's bit for bit for each path: one thread per value,
// sequential sums in the CPU's order starting from -0.0 (Rust's f32 `sum()`), or +0.0
// where the CPU accumulates into a zeroed buffer, non-contractible __fmul_rn/__fadd_rn,
// then * 0.125 (1/sqrt(64)); non-finite logits become -inf. The argmax is therefore
// identical; the weight goes through expf and a tree sum, equal within a few ulp.
//
//   Mma:    the query absorbs W once (q' = W^T (W q)); logits of the selected rows only.
//   Legacy: every stored row is projected (W k_j) and scored against W q (dense), the
//           selection becomes a mask, then a masked softmax over all rows: the same
//           argmax for n / k times the rows and MAIN_DIM times the work per row.
//
// sanitize_score, job_of and count_stale_pages are kernels/common.cuh's.

#define MAIN_DIM 64
#define ATTN_THREADS 256

__device__ __forceinline__ float dot_sum(const float* __restrict__ a, const float* __restrict__ b)
{
    float acc = -0.0f;
    for (unsigned int d = 0; d < MAIN_DIM; ++d) {
        acc = __fadd_rn(acc, __fmul_rn(a[d], b[d]));
    }
    return acc;
}

// One thread per (job, element) of `jobs` MAIN_DIM-vectors, grid-stride:
// f(t, job, element) with t = job * MAIN_DIM + element.
template <typename F>
__device__ __forceinline__ void for_each_job_element(unsigned int jobs, F f)
{
    const unsigned int total = jobs * MAIN_DIM;
    for (unsigned int t = blockIdx.x * blockDim.x + threadIdx.x; t < total; t += gridDim.x * blockDim.x) {
        const unsigned int job = t / MAIN_DIM;
        f(t, job, t - job * MAIN_DIM);
    }
}

// projected[j][i] = sum_d W[i][d] * q_j[d]: one thread per (job, i).
extern "C" __global__ void mla_project_queries(const float* __restrict__ w,
                                               const float* __restrict__ queries,
                                               unsigned int jobs,
                                               float* __restrict__ projected)
{
    for_each_job_element(jobs, [=](unsigned int t, unsigned int job, unsigned int i) {
        projected[t] = dot_sum(w + i * MAIN_DIM, queries + job * MAIN_DIM);
    });
}

// absorbed[j][c] = sum_i W[i][c] * projected[j][i], accumulated from +0.0 in i order:
// one thread per (job, c).
extern "C" __global__ void mla_absorb_queries(const float* __restrict__ w,
                                              const float* __restrict__ projected,
                                              unsigned int jobs,
                                              float* __restrict__ absorbed)
{
    for_each_job_element(jobs, [=](unsigned int t, unsigned int job, unsigned int c) {
        float acc = 0.0f;
        for (unsigned int i = 0; i < MAIN_DIM; ++i) {
            acc = __fadd_rn(acc, __fmul_rn(w[i * MAIN_DIM + c], projected[job * MAIN_DIM + i]));
        }
        absorbed[t] = acc;
    });
}

__device__ __forceinline__ bool beats(float logit, unsigned int position, float best_logit, unsigned int best_position)
{
    return logit > best_logit || (logit == best_logit && position < best_position);
}

// Block-wide argmax, then the sum of exp(logit - max) over the counted entries (all of
// them, or those whose mask byte is set); every thread of the block must call it.
// Thread 0 writes the job's result; weight 0 when the sum is not positive (all -inf).
__device__ void reduce_softmax_argmax(float local_best, unsigned int local_position, const float* __restrict__ logits,
                                      const unsigned char* __restrict__ mask, unsigned int count, unsigned int job,
                                      unsigned int* __restrict__ out_argmax, float* __restrict__ out_weight)
{
    __shared__ float best_logit[ATTN_THREADS];
    __shared__ unsigned int best_position[ATTN_THREADS];
    __shared__ float partial_sum[ATTN_THREADS];

    best_logit[threadIdx.x] = local_best;
    best_position[threadIdx.x] = local_position;
    __syncthreads();
    for (unsigned int stride = ATTN_THREADS / 2; stride > 0u; stride >>= 1) {
        if (threadIdx.x < stride) {
            const float other = best_logit[threadIdx.x + stride];
            const unsigned int other_position = best_position[threadIdx.x + stride];
            if (beats(other, other_position, best_logit[threadIdx.x], best_position[threadIdx.x])) {
                best_logit[threadIdx.x] = other;
                best_position[threadIdx.x] = other_position;
            }
        }
        __syncthreads();
    }
    const float max_logit = best_logit[0];
    float sum = 0.0f;
    for (unsigned int i = threadIdx.x; i < count; i += ATTN_THREADS) {
        if (mask == 0 || mask[i] != 0) {
            sum = __fadd_rn(sum, expf(logits[i] - max_logit));
        }
    }
    partial_sum[threadIdx.x] = sum;
    __syncthreads();
    for (unsigned int stride = ATTN_THREADS / 2; stride > 0u; stride >>= 1) {
        if (threadIdx.x < stride) {
            partial_sum[threadIdx.x] = __fadd_rn(partial_sum[threadIdx.x], partial_sum[threadIdx.x + stride]);
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const float total = partial_sum[0];
        out_argmax[job] = best_position[0];
        out_weight[job] = total > 0.0f ? expf(best_logit[0] - max_logit) / total : 0.0f;
    }
}

// The MMA path's body for one job (one block of ATTN_THREADS): the logit of every
// selected position (row_of(position) is its main-KV row), kept in `logits`, then the
// softmax weight of the argmax. Both layouts (contiguous rows, page tables) use it.
template <typename RowOf>
__device__ __forceinline__ void selected_softmax_argmax(const float* q, const unsigned int* __restrict__ selected,
                                                        const unsigned int* __restrict__ sel_start, unsigned int job,
                                                        RowOf row_of, float* __restrict__ logits,
                                                        unsigned int* __restrict__ out_argmax,
                                                        float* __restrict__ out_weight)
{
    const unsigned int first = sel_start[job];
    const unsigned int count = sel_start[job + 1] - first;
    float local_best = -__int_as_float(0x7F800000);
    unsigned int local_position = 0xFFFFFFFFu;
    for (unsigned int i = threadIdx.x; i < count; i += ATTN_THREADS) {
        const unsigned int position = selected[first + i];
        const float logit = sanitize_score(__fmul_rn(dot_sum(q, row_of(position)), 0.125f));
        logits[first + i] = logit;
        if (beats(logit, position, local_best, local_position)) {
            local_best = logit;
            local_position = position;
        }
    }
    reduce_softmax_argmax(local_best, local_position, logits + first, 0, count, job, out_argmax, out_weight);
}

// One block of ATTN_THREADS per job; logits scratch holds one f32 per selected entry.
extern "C" __global__ void sparse_attention_mma(const float* __restrict__ absorbed_queries,
                                                const float* __restrict__ keys,
                                                const unsigned int* __restrict__ row_start,
                                                const unsigned int* __restrict__ selected,
                                                const unsigned int* __restrict__ sel_start,
                                                float* __restrict__ logits,
                                                unsigned int* __restrict__ out_argmax,
                                                float* __restrict__ out_weight)
{
    const unsigned int job = blockIdx.x;
    const float* q = absorbed_queries + (unsigned long long)job * MAIN_DIM;
    const float* job_keys = keys + (unsigned long long)row_start[job] * MAIN_DIM;
    selected_softmax_argmax(
        q, selected, sel_start, job, [=](unsigned int position) { return job_keys + (unsigned long long)position * MAIN_DIM; },
        logits, out_argmax, out_weight);
}

// The Legacy dense pass's body for both layouts: one thread per row of every job, W
// staged in shared memory; key_of(job, row) is the row's main-KV key.
template <typename KeyOf>
__device__ __forceinline__ void legacy_dense_logits(const float* __restrict__ w,
                                                    const float* __restrict__ projected_queries,
                                                    const unsigned int* __restrict__ row_start, unsigned int jobs,
                                                    float* __restrict__ dense_logits, KeyOf key_of)
{
    __shared__ float w_shared[MAIN_DIM * MAIN_DIM];
    for (unsigned int i = threadIdx.x; i < MAIN_DIM * MAIN_DIM; i += blockDim.x) {
        w_shared[i] = w[i];
    }
    __syncthreads();
    const unsigned int rows = row_start[jobs];
    for (unsigned int row = blockIdx.x * blockDim.x + threadIdx.x; row < rows; row += gridDim.x * blockDim.x) {
        const unsigned int job = job_of(row_start, jobs, row);
        const float* pq = projected_queries + (unsigned long long)job * MAIN_DIM;
        const float* key = key_of(job, row);
        float acc = -0.0f;
        for (unsigned int c = 0; c < MAIN_DIM; ++c) {
            acc = __fadd_rn(acc, __fmul_rn(pq[c], dot_sum(w_shared + c * MAIN_DIM, key)));
        }
        dense_logits[row] = sanitize_score(__fmul_rn(acc, 0.125f));
    }
}

// Dense pass: one thread per stored row of every job; W is staged in shared memory.
// logit = sum_c (W q)[c] * (sum_d W[c][d] * k[d]), each sum from -0.0, then * 0.125.
extern "C" __global__ void sparse_attention_legacy_dense(const float* __restrict__ w,
                                                         const float* __restrict__ projected_queries,
                                                         const float* __restrict__ keys,
                                                         const unsigned int* __restrict__ row_start,
                                                         unsigned int jobs,
                                                         float* __restrict__ dense_logits)
{
    legacy_dense_logits(w, projected_queries, row_start, jobs, dense_logits,
                        [=](unsigned int, unsigned int row) { return keys + (unsigned long long)row * MAIN_DIM; });
}

// Mask pass: mask (one byte per row, zeroed by the host) gets 1 on every selected row.
extern "C" __global__ void sparse_attention_legacy_mask(const unsigned int* __restrict__ row_start,
                                                        const unsigned int* __restrict__ selected,
                                                        const unsigned int* __restrict__ sel_start,
                                                        unsigned int jobs,
                                                        unsigned char* __restrict__ mask)
{
    const unsigned int total = sel_start[jobs];
    for (unsigned int s = blockIdx.x * blockDim.x + threadIdx.x; s < total; s += gridDim.x * blockDim.x) {
        const unsigned int job = job_of(sel_start, jobs, s);
        mask[row_start[job] + selected[s]] = 1u;
    }
}

// Masked softmax: one block of ATTN_THREADS per job, scanning every row of the job.
extern "C" __global__ void sparse_attention_legacy_softmax(const float* __restrict__ dense_logits,
                                                           const unsigned char* __restrict__ mask,
                                                           const unsigned int* __restrict__ row_start,
                                                           unsigned int* __restrict__ out_argmax,
                                                           float* __restrict__ out_weight)
{
    const unsigned int job = blockIdx.x;
    const unsigned int first = row_start[job];
    const unsigned int n = row_start[job + 1] - first;
    float local_best = -__int_as_float(0x7F800000);
    unsigned int local_position = 0xFFFFFFFFu;
    for (unsigned int position = threadIdx.x; position < n; position += ATTN_THREADS) {
        if (mask[first + position] != 0) {
            const float logit = dense_logits[first + position];
            if (beats(logit, position, local_best, local_position)) {
                local_best = logit;
                local_position = position;
            }
        }
    }
    reduce_softmax_argmax(local_best, local_position, dense_logits + first, mask + first, n, job, out_argmax,
                          out_weight);
}

// ---------------------------------------------------------------------------------
// Paged variants: the same logits (bit for bit) with the main keys read from a device
// pool through page tables (crates/engine/src/backend/paged.rs). Row p of job j is row
// p % page_tokens of page page_table[page_start[j] + p / page_tokens]; page q's rows are
// main_pool[(q * page_tokens + row) * MAIN_DIM ...]. Only the selected rows are read
// (Mma); Legacy reads every row of the job, as its dense pass does above.
//
// Main-KV reads are always gated on the host (the compute stream waits on the page's
// main-KV load-back event), so the tag check here should never count; it is the
// control of the index-K count in indexer_topk.cu: one thread per page of the job
// compares the page's main-KV generation tag with the expected one.

__device__ __forceinline__ const float* paged_row(const float* __restrict__ main_pool,
                                                  const unsigned int* __restrict__ job_pages,
                                                  unsigned int page_tokens, unsigned int position)
{
    const unsigned long long page = job_pages[position / page_tokens];
    return main_pool + (page * page_tokens + position % page_tokens) * MAIN_DIM;
}

extern "C" __global__ void paged_sparse_attention_mma(const float* __restrict__ absorbed_queries,
                                                      const float* __restrict__ main_pool,
                                                      const unsigned int* __restrict__ main_tag,
                                                      const unsigned int* __restrict__ page_table,
                                                      const unsigned int* __restrict__ page_expected,
                                                      const unsigned int* __restrict__ page_start,
                                                      unsigned int page_tokens,
                                                      const unsigned int* __restrict__ selected,
                                                      const unsigned int* __restrict__ sel_start,
                                                      float* __restrict__ logits,
                                                      unsigned int* __restrict__ out_argmax,
                                                      float* __restrict__ out_weight,
                                                      unsigned long long* __restrict__ stale)
{
    const unsigned int job = blockIdx.x;
    const unsigned int* job_pages = page_table + page_start[job];
    count_stale_pages(main_tag, job_pages, page_expected + page_start[job], page_start[job + 1] - page_start[job],
                     stale);
    const float* q = absorbed_queries + (unsigned long long)job * MAIN_DIM;
    selected_softmax_argmax(
        q, selected, sel_start, job,
        [=](unsigned int position) { return paged_row(main_pool, job_pages, page_tokens, position); }, logits,
        out_argmax, out_weight);
}

// Dense pass of the Legacy path through page tables: one thread per row of every job.
extern "C" __global__ void paged_attention_legacy_dense(const float* __restrict__ w,
                                                        const float* __restrict__ projected_queries,
                                                        const float* __restrict__ main_pool,
                                                        const unsigned int* __restrict__ page_table,
                                                        const unsigned int* __restrict__ page_start,
                                                        unsigned int page_tokens,
                                                        const unsigned int* __restrict__ row_start,
                                                        unsigned int jobs,
                                                        float* __restrict__ dense_logits)
{
    legacy_dense_logits(w, projected_queries, row_start, jobs, dense_logits,
                        [=](unsigned int job, unsigned int row) {
                            return paged_row(main_pool, page_table + page_start[job], page_tokens, row - row_start[job]);
                        });
}

// Main-KV tag check of the Legacy path (its dense pass has no per-job block): one
// block per job.
extern "C" __global__ void paged_count_stale_main(const unsigned int* __restrict__ main_tag,
                                                  const unsigned int* __restrict__ page_table,
                                                  const unsigned int* __restrict__ page_expected,
                                                  const unsigned int* __restrict__ page_start,
                                                  unsigned long long* __restrict__ stale)
{
    const unsigned int job = blockIdx.x;
    count_stale_pages(main_tag, page_table + page_start[job], page_expected + page_start[job],
                     page_start[job + 1] - page_start[job], stale);
}
