//! kvsim's KV kernels: one node's paged KV pool and its page tags in device memory.
//!
//! This is the CUDA mirror of the Rust module `kvsim_engine::gpu::layout`, which
//! HostGpu runs on the CPU: the same constants (the #defines below; a test compares
//! them with the Rust consts), the same memory layout, the same tag words and flag
//! encoding, and the same float operations in the same order. It is compiled at run
//! time by NVRTC (or loaded from the committed kv.ptx) with --fmad=false, so no
//! multiply-add is fused and the GPU computes bit-identical scores and tokens. It is
//! not a performance-tuned attention: one block per request, scalar loads.
//!
//! Layout: the pool is (pages + 1) * page_size slots; slot s of page p starts at float
//! (p * page_size + s) * (key_width + KV_VALUE_LANES): the key, then the value lanes.
//! Tags: KV_TAG_WORDS u64 words per page, [KV_TAG_PRESENT | room, room generation,
//! page generation], all zero when no tag is stored. Per-request flag: KV_FLAG_OK, or
//! 1 + the index of the first page-table entry whose stored tag is not the reader's.

#define KV_VALUE_LANES 32
#define KV_TAG_WORDS 3
#define KV_TAG_PRESENT 0x100000000ULL
#define KV_FLAG_OK 0u
#define KV_NO_MISMATCH 0xFFFFFFFFu
#define KV_ATTEND_THREADS 128
#define KV_EXP_MIN -87.0f
#define KV_EXP_LOG2E 1.44269504f
#define KV_EXP_LN2_HI 0.693359375f
#define KV_EXP_LN2_LO -2.1219444e-4f
#define KV_EXP_C2 0.5f
#define KV_EXP_C3 0.16666667f
#define KV_EXP_C4 0.041666668f
#define KV_EXP_C5 0.008333334f
#define KV_EXP_C6 0.0013888889f

typedef unsigned int u32;
typedef unsigned long long u64;
// Loads in flight per thread while kv_attend stages a page (kernel-only: no Rust
// mirror, it changes no value).
constexpr u32 kv_stage_batch = 16;

// layout::slot_floats
__device__ __forceinline__ u64 kv_slot_floats(u32 key_width) {
    return (u64)key_width + KV_VALUE_LANES;
}

// layout::page_slot_offset
__device__ __forceinline__ u64 kv_page_slot_offset(u32 page, u32 slot, u32 page_size, u32 key_width) {
    return ((u64)page * page_size + slot) * kv_slot_floats(key_width);
}

// mod.rs hadamard: (-1)^popcount(row & col)
__device__ __forceinline__ float kv_hadamard(u32 row, u32 col) {
    return (__popc(row & col) % 2 == 0) ? 1.0f : -1.0f;
}

// layout::tag_matches
__device__ __forceinline__ bool kv_tag_matches(const u64* tags, u32 pool_pages, u32 page,
                                               u64 page_gen, u32 room, u64 room_gen) {
    if (page > pool_pages) {
        return false;
    }
    const u64* t = tags + (u64)page * KV_TAG_WORDS;
    return t[0] == (KV_TAG_PRESENT | (u64)room) && t[1] == room_gen && t[2] == page_gen;
}

// layout::echo_exp
__device__ __forceinline__ float kv_echo_exp(float x) {
    if (x < KV_EXP_MIN) {
        return 0.0f;
    }
    float k = floorf(x * KV_EXP_LOG2E + 0.5f);
    float r = (x - k * KV_EXP_LN2_HI) - k * KV_EXP_LN2_LO;
    float p = 1.0f + r * (1.0f + r * (KV_EXP_C2 + r * (KV_EXP_C3 + r * (KV_EXP_C4 + r * (KV_EXP_C5 + r * KV_EXP_C6)))));
    float scale = __int_as_float((int)(((u32)((int)k + 127)) << 23));
    return p * scale;
}

// Write the KV of tokens[0..n] at positions start.. through a page table (prefill and
// each decode step's generated token); stamps each touched page's tag from the thread
// that writes its first touched slot. The host splits a run whose touched table
// entries repeat a page into ordered launches, so no two threads write one slot.
extern "C" __global__ void kv_write_tokens(float* data, u64* tags, u32 pool_pages, u32 page_size,
                                           u32 key_width, const u32* table_page,
                                           const u64* table_gen, u32 table_len, u64 start,
                                           const u32* tokens, u32 n, u32 room, u64 room_gen) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) {
        return;
    }
    u64 pos = start + i;
    u64 idx = pos / page_size;
    if (idx >= table_len) {
        return;
    }
    u32 page = table_page[idx];
    if (page > pool_pages) {
        return;
    }
    u32 slot = (u32)(pos % page_size);
    float* s = data + kv_page_slot_offset(page, slot, page_size, key_width);
    for (u32 j = 0; j < key_width; j++) {
        s[j] = kv_hadamard(slot, j);
    }
    u32 tok = tokens[i];
    for (u32 b = 0; b < KV_VALUE_LANES; b++) {
        s[key_width + b] = (tok & (1u << b)) != 0 ? 1.0f : 0.0f;
    }
    if (i == 0 || slot == 0) {
        u64* t = tags + (u64)page * KV_TAG_WORDS;
        t[0] = KV_TAG_PRESENT | (u64)room;
        t[1] = room_gen;
        t[2] = table_gen[idx];
    }
}

// Copy pages out into a contiguous buffer (the source side of a transfer).
extern "C" __global__ void kv_gather_pages(const float* data, const u32* pages, u32 n,
                                           u32 page_floats, float* out) {
    u64 total = (u64)n * page_floats;
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (u64)gridDim.x * blockDim.x) {
        u64 k = e / page_floats;
        u64 f = e % page_floats;
        out[e] = data[(u64)pages[k] * page_floats + f];
    }
}

// Copy pages in from a contiguous buffer and stamp each with the receiver's tag (the
// destination side of a transfer). The host never passes one page twice.
extern "C" __global__ void kv_scatter_pages(float* data, u64* tags, const u32* pages,
                                            const u64* gens, u32 n, u32 page_floats,
                                            const float* in, u32 room, u64 room_gen) {
    u64 total = (u64)n * page_floats;
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (u64)gridDim.x * blockDim.x) {
        u64 k = e / page_floats;
        u64 f = e % page_floats;
        data[(u64)pages[k] * page_floats + f] = in[e];
        if (f == 0) {
            u64* t = tags + (u64)pages[k] * KV_TAG_WORDS;
            t[0] = KV_TAG_PRESENT | (u64)room;
            t[1] = room_gen;
            t[2] = gens[k];
        }
    }
}

// Zero pages and clear their tags (defense 7, zero-on-free).
extern "C" __global__ void kv_zero_pages(float* data, u64* tags, const u32* pages, u32 n,
                                         u32 page_floats) {
    u64 total = (u64)n * page_floats;
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (u64)gridDim.x * blockDim.x) {
        u64 k = e / page_floats;
        u64 f = e % page_floats;
        data[(u64)pages[k] * page_floats + f] = 0.0f;
        if (f < KV_TAG_WORDS) {
            tags[(u64)pages[k] * KV_TAG_WORDS + f] = 0;
        }
    }
}

// The tokens stored at positions start..start+n through a page table (token_at, and
// the per-position part of the transfer checksum; layout::decode_value per slot).
extern "C" __global__ void kv_decode_tokens(const float* data, u32 pool_pages, u32 page_size,
                                            u32 key_width, const u32* table_page, u32 table_len,
                                            u64 start, u32 n, u32* out) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) {
        return;
    }
    u64 pos = start + i;
    u64 idx = pos / page_size;
    u32 tok = 0;
    if (idx < table_len && table_page[idx] <= pool_pages) {
        u32 slot = (u32)(pos % page_size);
        const float* v = data + kv_page_slot_offset(table_page[idx], slot, page_size, key_width) + key_width;
        for (u32 b = 0; b < KV_VALUE_LANES; b++) {
            if (v[b] > 0.5f) {
                tok |= 1u << b;
            }
        }
    }
    out[i] = tok;
}

// The tag check alone over one page table (layout::validate_tags): *flag starts at
// KV_NO_MISMATCH and ends as the first mismatching index (the host turns it into the
// flag).
extern "C" __global__ void kv_check_tags(const u64* tags, u32 pool_pages, const u32* table_page,
                                         const u64* table_gen, u32 table_len, u32 room,
                                         u64 room_gen, u32* first_bad) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < table_len &&
        !kv_tag_matches(tags, pool_pages, table_page[i], table_gen[i], room, room_gen)) {
        atomicMin(first_bad, i);
    }
}

// Paged echo attention for a batch, one block of KV_ATTEND_THREADS per request, with
// the tag check inside: when `check` is set, the block validates every entry of the
// request's page table first and, on a mismatch, raises the request's flag and never
// reads its KV. Then layout::attend_page on the page that holds the query, step by
// step. Dynamic shared memory: 2 * page_size floats (scores, weights), plus, when
// `stage` is set, the page's slots at a stride of key_width + KV_VALUE_LANES + 1
// floats: the block first copies them in with coalesced loads (the host sets `stage`
// when they fit). Staged or not, the same values are read in the same order.
extern "C" __global__ void kv_attend(const float* data, const u64* tags, u32 pool_pages,
                                     u32 page_size, u32 key_width, float scale,
                                     const u32* table_page, const u64* table_gen,
                                     const u32* req_off, const u32* req_len, const u32* req_room,
                                     const u64* req_room_gen, const u64* req_seq_len,
                                     const u64* req_query_pos, u32 check, u32 stage,
                                     u32 n_req, u32* out_token, u32* out_flag) {
    extern __shared__ float kv_smem[];
    float* scores = kv_smem;
    float* weights = kv_smem + page_size;
    __shared__ u32 first_bad;
    __shared__ float max_s;
    __shared__ float total_s;
    __shared__ int accept;
    u32 r = blockIdx.x;
    if (r >= n_req) {
        return;
    }
    u32 tid = threadIdx.x;
    u32 off = req_off[r];
    u32 len = req_len[r];
    if (tid == 0) {
        first_bad = KV_NO_MISMATCH;
    }
    __syncthreads();
    if (check) {
        for (u32 i = tid; i < len; i += blockDim.x) {
            if (!kv_tag_matches(tags, pool_pages, table_page[off + i], table_gen[off + i],
                                req_room[r], req_room_gen[r])) {
                atomicMin(&first_bad, i);
            }
        }
    }
    __syncthreads();
    if (first_bad != KV_NO_MISMATCH) {
        if (tid == 0) {
            out_flag[r] = first_bad + 1;
            out_token[r] = 0;
        }
        return;
    }
    u64 seq_len = req_seq_len[r];
    u64 qpos = req_query_pos[r];
    u64 idx = qpos / page_size;
    if (qpos >= seq_len || idx >= len || table_page[off + idx] > pool_pages) {
        if (tid == 0) {
            out_flag[r] = KV_FLAG_OK;
            out_token[r] = 0;
        }
        return;
    }
    u32 qslot = (u32)(qpos % page_size);
    u64 page_start = idx * page_size;
    u64 rest = seq_len - page_start;
    u32 valid = rest < page_size ? (u32)rest : page_size;
    u64 sf = kv_slot_floats(key_width);
    const float* page = data + kv_page_slot_offset(table_page[off + idx], 0, page_size, key_width);
    // Floats between consecutive slots of `page`: the pool's layout, or one more when
    // staged, so the threads of a warp reading one column of keys hit distinct banks.
    u64 stride = sf;
    if (stage) {
        // The page's valid slots are contiguous: consecutive threads copy consecutive
        // floats, kv_stage_batch loads in flight per thread before any is stored (a
        // loop that stores each load before issuing the next waits a memory latency
        // per float it copies).
        float* staged = kv_smem + 2 * page_size;
        u32 total = valid * (u32)sf;
        for (u32 base = tid; base < total; base += kv_stage_batch * blockDim.x) {
            float v[kv_stage_batch];
#pragma unroll
            for (u32 k = 0; k < kv_stage_batch; k++) {
                u32 e = base + k * blockDim.x;
                v[k] = e < total ? page[e] : 0.0f;
            }
#pragma unroll
            for (u32 k = 0; k < kv_stage_batch; k++) {
                u32 e = base + k * blockDim.x;
                if (e < total) {
                    u32 slot = e / (u32)sf;
                    staged[slot * (sf + 1) + (e - slot * (u32)sf)] = v[k];
                }
            }
        }
        __syncthreads();
        page = staged;
        stride = sf + 1;
    }
    // Scores: one slot per thread, each a sequential dot product.
    for (u32 slot = tid; slot < valid; slot += blockDim.x) {
        const float* key = page + slot * stride;
        float dot = 0.0f;
        for (u32 j = 0; j < key_width; j++) {
            dot += key[j] * kv_hadamard(qslot, j);
        }
        scores[slot] = dot * scale;
    }
    __syncthreads();
    if (tid == 0) {
        float m = -__int_as_float(0x7f800000);
        for (u32 s = 0; s < valid; s++) {
            m = fmaxf(m, scores[s]);
        }
        max_s = m;
    }
    __syncthreads();
    for (u32 slot = tid; slot < valid; slot += blockDim.x) {
        weights[slot] = kv_echo_exp(scores[slot] - max_s);
    }
    __syncthreads();
    if (tid == 0) {
        float total = 0.0f;
        u32 best = 0;
        float best_w = 0.0f;
        for (u32 i = 0; i < valid; i++) {
            total += weights[i];
            if (weights[i] > best_w) {
                best = i;
                best_w = weights[i];
            }
        }
        total_s = total;
        accept = !(valid == 0 || best_w / total <= 0.5f || scores[best] <= 0.0f);
    }
    __syncthreads();
    if (!accept) {
        if (tid == 0) {
            out_flag[r] = KV_FLAG_OK;
            out_token[r] = 0;
        }
        return;
    }
    // Each weight divided by the total once, in place (the same quotient
    // layout::attend_page takes for each slot).
    for (u32 slot = tid; slot < valid; slot += blockDim.x) {
        weights[slot] = weights[slot] / total_s;
    }
    __syncthreads();
    // Values: one lane per thread of the first warp, a sequential weighted sum.
    if (tid < 32) {
        float acc = 0.0f;
        for (u32 slot = 0; slot < valid; slot++) {
            acc += weights[slot] * page[slot * stride + key_width + tid];
        }
        u32 bits = __ballot_sync(0xffffffffu, acc > 0.5f);
        if (tid == 0) {
            out_flag[r] = KV_FLAG_OK;
            out_token[r] = bits;
        }
    }
}
