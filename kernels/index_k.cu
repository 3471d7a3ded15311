// index_k.cu: quantize and store DSA indexer keys (index-K).
//
// Layout per token, exactly IndexKDtype::bytes_per_token (src/engine/backend/mod.rs):
//   bf16: 128 x 2 B, little-endian bf16 bits                      (256 B/token)
//   fp8:  128 x 1 B e4m3 of key/scale, then the f32 scale, LE     (132 B/token)
//         scale = amax / 448 (amax = max |key|); scale = 1 when amax == 0
//
// The conversions are written out by hand (NVRTC from the PyPI package ships no
// cuda_bf16.h / cuda_fp8.h) and match the Rust `half` (bf16::from_f32) and `float8`
// (F8E4M3::from_f32, saturating finite) crates bit for bit:
//   bf16: round to nearest even, NaN -> quiet NaN keeping the upper mantissa;
//   e4m3: the value is widened to double and rounded to nearest even, |x| > 464
//         saturates to +-448 (0x7E), NaN -> 0x7F, |x| <= 2^-10 -> signed zero.
// Compile with --fmad=false so the divisions and products round like the CPU's.

#define INDEX_DIM 128
#define FP8_TOKEN_BYTES (INDEX_DIM + 4)
#define E4M3_MAX 448.0f

__device__ __forceinline__ unsigned short f32_to_bf16_bits(float value)
{
    unsigned int x = __float_as_uint(value);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) {
        return (unsigned short)((x >> 16) | 0x0040u);
    }
    const unsigned int round_bit = 0x00008000u;
    if ((x & round_bit) != 0u && (x & (3u * round_bit - 1u)) != 0u) {
        return (unsigned short)((x >> 16) + 1u);
    }
    return (unsigned short)(x >> 16);
}

__device__ __forceinline__ unsigned char f32_to_e4m3_bits(float value)
{
    const unsigned long long xbits = (unsigned long long)__double_as_longlong((double)value);
    const unsigned long long dp_inf_bits = 0x7FF0000000000000ull;
    const unsigned long long mindenorm_o2 = 0x3F50000000000000ull;   // 2^-10
    const unsigned long long overflow_threshold = 0x407D000000000000ull; // 464.0
    const unsigned long long minnorm = 0x3F90000000000000ull;        // 2^-6
    const unsigned int significand_bits = 4u;
    const unsigned long long dp_half_ulp = 1ull << (53u - significand_bits - 1u);

    const unsigned char sign = (unsigned char)((xbits >> 63) << 7);
    const unsigned char exp =
        (unsigned char)(((unsigned int)((xbits >> 52) & 0x7FFu) - 1023u + 7u) & 0xFFu);
    const unsigned char mantissa = (unsigned char)((xbits >> (53u - significand_bits)) & 0x7u);
    const unsigned long long absx = xbits & 0x7FFFFFFFFFFFFFFFull;

    unsigned char res;
    if (absx <= mindenorm_o2) {
        res = 0;
    } else if (absx > dp_inf_bits) {
        res = 0x7F;
    } else if (absx > overflow_threshold) {
        res = 0x7E;
    } else if (absx >= minnorm) {
        res = (unsigned char)((exp << (significand_bits - 1u)) | mantissa);
        const unsigned long long round = xbits & ((dp_half_ulp << 1) - 1ull);
        if (round > dp_half_ulp || (round == dp_half_ulp && (mantissa & 1u) != 0u)) {
            res = (unsigned char)(res + 1u);
        }
    } else {
        const unsigned int shift = (1u - (unsigned int)exp) & 0xFFu;
        const unsigned char full_mantissa = (unsigned char)(mantissa | (1u << (significand_bits - 1u)));
        res = (unsigned char)(full_mantissa >> shift);
        const unsigned long long round =
            (xbits | (1ull << (53u - 1u))) & ((dp_half_ulp << (shift + 1u)) - 1ull);
        if (round > (dp_half_ulp << shift) || (round == (dp_half_ulp << shift) && (res & 1u) != 0u)) {
            res = (unsigned char)(res + 1u);
        }
    }
    return (unsigned char)(res | sign);
}

// One token's fp8 bytes, by the block of INDEX_DIM threads that holds it (thread t holds
// element x): amax by shared-memory reduction (max is exact, so the reduction order
// cannot change the scale), element t at token_out[t], then the f32 scale as 4
// little-endian bytes after the INDEX_DIM elements. Every thread of the block must call
// it (it has barriers); amax_shared is free again after the caller's next barrier.
__device__ __forceinline__ void quantize_fp8_token(float x, float* amax_shared, unsigned char* token_out)
{
    amax_shared[threadIdx.x] = fabsf(x);
    __syncthreads();
    for (unsigned int stride = INDEX_DIM / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            amax_shared[threadIdx.x] = fmaxf(amax_shared[threadIdx.x], amax_shared[threadIdx.x + stride]);
        }
        __syncthreads();
    }
    const float amax = amax_shared[0];
    const float scale = amax > 0.0f ? __fdiv_rn(amax, E4M3_MAX) : 1.0f;
    token_out[threadIdx.x] = f32_to_e4m3_bits(__fdiv_rn(x, scale));
    if (threadIdx.x == 0) {
        const unsigned int scale_bits = __float_as_uint(scale);
        token_out[INDEX_DIM + 0] = (unsigned char)(scale_bits & 0xFFu);
        token_out[INDEX_DIM + 1] = (unsigned char)((scale_bits >> 8) & 0xFFu);
        token_out[INDEX_DIM + 2] = (unsigned char)((scale_bits >> 16) & 0xFFu);
        token_out[INDEX_DIM + 3] = (unsigned char)(scale_bits >> 24);
    }
}

// One thread per element: keys are n * INDEX_DIM f32, out is n * 256 bytes.
extern "C" __global__ void quantize_index_k_bf16(const float* __restrict__ keys,
                                                 unsigned char* __restrict__ out,
                                                 unsigned int n)
{
    const unsigned long long total = (unsigned long long)n * INDEX_DIM;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned short bits = f32_to_bf16_bits(keys[i]);
        out[2 * i] = (unsigned char)(bits & 0xFFu);
        out[2 * i + 1] = (unsigned char)(bits >> 8);
    }
}

// One block of INDEX_DIM threads per token: amax by shared-memory reduction (max is
// exact, so the reduction order cannot change the scale), then one element per thread.
extern "C" __global__ void quantize_index_k_fp8(const float* __restrict__ keys,
                                                unsigned char* __restrict__ out,
                                                unsigned int n)
{
    __shared__ float amax_shared[INDEX_DIM];
    for (unsigned int token = blockIdx.x; token < n; token += gridDim.x) {
        const float x = keys[(unsigned long long)token * INDEX_DIM + threadIdx.x];
        quantize_fp8_token(x, amax_shared, out + (unsigned long long)token * FP8_TOKEN_BYTES);
        // amax_shared is rewritten by the next token of this block.
        __syncthreads();
    }
}

// Appends rows to a paged pool in one launch (decode's new tokens, one row per running
// sequence per step): row r goes to pool row dst_row[r] (page * page_tokens + row in
// page) of page dst_page[r]. One block of INDEX_DIM threads per row: main key copied,
// index key quantized exactly as the kernels above, then (after a barrier, so the data
// precedes it) the page's two generation tags set to generation[r].
extern "C" __global__ void append_rows(const float* __restrict__ main_keys, const float* __restrict__ index_keys,
                                       const unsigned int* __restrict__ dst_row,
                                       const unsigned int* __restrict__ dst_page,
                                       const unsigned int* __restrict__ generation, unsigned int rows,
                                       unsigned int fp8, float* __restrict__ main_pool,
                                       unsigned char* __restrict__ index_pool, unsigned int* __restrict__ main_tag,
                                       unsigned int* __restrict__ index_tag)
{
    __shared__ float amax_shared[INDEX_DIM];
    for (unsigned int r = blockIdx.x; r < rows; r += gridDim.x) {
        const unsigned long long dst = dst_row[r];
        if (threadIdx.x < 64u) {
            main_pool[dst * 64u + threadIdx.x] = main_keys[(unsigned long long)r * 64u + threadIdx.x];
        }
        const float x = index_keys[(unsigned long long)r * INDEX_DIM + threadIdx.x];
        if (fp8 == 0u) {
            const unsigned short bits = f32_to_bf16_bits(x);
            unsigned char* out = index_pool + dst * (INDEX_DIM * 2);
            out[2 * threadIdx.x] = (unsigned char)(bits & 0xFFu);
            out[2 * threadIdx.x + 1] = (unsigned char)(bits >> 8);
        } else {
            quantize_fp8_token(x, amax_shared, index_pool + dst * FP8_TOKEN_BYTES);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            main_tag[dst_page[r]] = generation[r];
            index_tag[dst_page[r]] = generation[r];
        }
        // amax_shared is rewritten by the next row of this block.
        __syncthreads();
    }
}
