// Matrix-vector (and small matrix-matrix) products over GGUF weights repacked in tiles of 8 rows
// (qtypes.h), with activations quantized to 8 bits per group of 32.
//
// Included once per instruction set by q_generic.cpp, q_avx2.cpp, q_vnni.cpp and q_amx.cpp, each of
// which defines NQ_NS (its namespace) and NQ_AVX2 / NQ_VNNI (/ NQ_AMX) before including it, after a
// `#pragma GCC target` for its instructions. Only C headers and intrinsics here, and every helper
// `static inline`, so no function compiled for one instruction set can stand in for another's.
//
// Activations (nq_quantize_row): int8 q[K], a float scale d per 32, the int8 sums per 16 (s) and
// d·(sum per 32) (ds). Each format's weight is w = A·u + B (u unsigned, the group's bytes), so
//     Σ w·x = A·d·Σ u·q + B·ds
// and the int8 dot takes unsigned weights (vpdpbusd / vpmaddubsw want one unsigned operand):
//     Q4_0  A = d,       B = -8 d          Q4_1, Q5_1  A = d, B = m
//     Q5_0  A = d,       B = -16 d         Q8_0  A = d, u = w + 128 and B = -128 d (VNNI), or
//     Q4_K  A = d·sc_j,  B = -dmin·mn_j          signed bytes by the sign trick (AVX2)
//     Q5_K  as Q4_K                         IQ4_NL  A = d, u = the codebook's value (+ 128 and
//     Q6_K  A = d·sc,    B = -32 d·sc               B = -128 d on VNNI, signed on AVX2, as Q8_0)
//     Q3_K  A = d·sc,    B = -4 d·sc        MXFP4   as IQ4_NL, d = 2^(e - 128) (E8M0, halved as
//     Q2_K  A = d·sc,    B = -dmin·mn               the codebook holds twice the FP4 values)
//                                           IQ4_XS  as IQ4_NL, A = d·(ls_j - 32)
// (Q2_K, Q3_K, Q6_K: sc and mn per 16 values, B times the activations' sum per 16: d·s.)
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stdlib.h>
#if NQ_AVX2
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "qtypes.h"

namespace NQ_NS {

#ifndef NQ_AMX
#define NQ_AMX 0  // AMX tiles for pair_rows' 16-row steps (q_amx.cpp)
#endif
#ifndef NQ_AHEAD
#define NQ_AHEAD 2048  // bytes of weights requested ahead of the one being read (tile_rows); 0: none
#endif
#ifndef NQ_AHEAD_INTEL
#define NQ_AHEAD_INTEL 0  // 1: requested ahead only where the CPU is Intel's (q_vnni.cpp)
#endif

// Whether tile_rows requests weights ahead, fixed when the library loads: x86 (NQ_AVX2), NQ_AHEAD > 0
// and, under NQ_AHEAD_INTEL, CPUID's vendor "GenuineIntel" (ebx, edx, ecx). This runs at load on any
// x86 CPU, under the unit's target pragma: it compiles to cpuid and compares alone (objdump, GCC 12).
static const bool ahead_on = [] {
#if NQ_AVX2 && NQ_AHEAD_INTEL
    unsigned a, b, c, d;
    return NQ_AHEAD > 0 && __get_cpuid(0, &a, &b, &c, &d) && b == 0x756e6547 && d == 0x49656e69 && c == 0x6c65746e;
#elif NQ_AVX2
    return NQ_AHEAD > 0;
#else
    return false;
#endif
}();

static inline float f16(const uint8_t* p) {
    uint16_t h;
    memcpy(&h, p, 2);
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000 | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {  // subnormal: normalise
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

// MXFP4's scale: the E8M0 byte e is 2^(e - 127), halved (ggml's GGML_E8M0_TO_FP32_HALF); e < 2
// are subnormal floats, e = 255 (NaN in E8M0) is 2^127 as in ggml.
static inline float e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

// The codebooks (ggml's kvalues_iq4nl, shared by IQ4_XS, and kvalues_mxfp4: twice the E2M1 values).
static const int8_t IQ4_NL_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
static const int8_t MXFP4_VALUES[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
static inline const int8_t* codebook_values(int type) { return type == NQ_MXFP4 ? MXFP4_VALUES : IQ4_NL_VALUES; }

// The int8 dot products see signed weights (Q8_0's bytes, a codebook's values) on AVX2, and the
// largest |weight| bounds how many chunks vpmaddubsw's int16 sums can take.
static inline constexpr bool signed_weights(int type) { return type == NQ_Q8_0 || nq_codebook(type); }
static inline constexpr int weight_max(int type) {
    return type == NQ_Q8_0 ? 128 : type == NQ_MXFP4 ? 12 : nq_codebook(type) ? 127
         : (1 << (nq_low_bits(type) + nq_high_bits(type))) - 1;
}

// VNNI's Q3_K and Q6_K: their dots' chains start from -k·s of each half (dot_chains), which gemm_type
// works out once a call for all its rows (chain_starts), and their sums take the weights' d once a
// unit, as AVX2's Q4_K and Q5_K do (one vmulps a row and group fewer). One row: 1.10x (Q6_K, Q3_K in L2,
// Zen 4, bench/kernels_ab.py); 3 rows 1.07-1.10x.
template <int TYPE>
static inline constexpr bool offset_chains() { return NQ_VNNI && (TYPE == NQ_Q3_K || TYPE == NQ_Q6_K); }

// ---- scalar access to a unit (8 rows of one file block, repacked) ----

static inline const uint8_t* group_at(int type, const uint8_t* unit, int j) {  // its scale bytes
    return unit + nq_header(type) + j * (nq_group_scales(type) + nq_planes(type));
}

// Row r's scale in the header: d, or MXFP4's 2^(e - 128).
static inline float row_scale(int type, const uint8_t* unit, int r) {
    return type == NQ_MXFP4 ? e8m0_half(unit[r]) : f16(unit + 2 * r);
}

// The bits of chunk c, byte `at`, in a plane of `bits` bits per value (qtypes.h).
static inline int plane_bits(const uint8_t* plane, int bits, int c, int at) {
    return (plane[32 * nq_plane_vector(bits, c) + at] >> nq_plane_shift(bits, c)) & ((1 << bits) - 1);
}

// Row r's stored code of element e of group j: its low bits, its high bits above them.
static inline int unit_code(int type, const uint8_t* unit, int r, int j, int e) {
    const uint8_t* p = group_at(type, unit, j) + nq_group_scales(type);
    const int c = e / 4, at = 4 * r + e % 4, lo = nq_low_bits(type), hi = nq_high_bits(type);
    int u = plane_bits(p, lo, c, at);
    if (hi) u |= plane_bits(p + 32 * lo, hi, c, at) << lo;
    return u;
}

// The integer the dot products take for it: u, or the signed weight (Q8_0, the codebook types).
static inline int unit_value(int type, const uint8_t* unit, int r, int j, int e) {
    const int u = unit_code(type, unit, r, j, e);
    return nq_codebook(type) ? codebook_values(type)[u] : type == NQ_Q8_0 ? (int8_t)u : u;
}

// The float value of row r's element e of group j (exactly as the gguf package dequantizes:
// the same float32 products in the same order).
static inline float unit_float(int type, const uint8_t* unit, int r, int j, int e) {
    const int u = unit_value(type, unit, r, j, e);
    const float d = row_scale(type, unit, r);
    const uint8_t* gs = group_at(type, unit, j);
    const uint8_t half = gs[8 * (e / 16) + r];  // the per-16 types' scale byte
    switch (type) {
    case NQ_Q4_0: return d * (float)(u - 8);
    case NQ_Q5_0: return d * (float)(u - 16);
    case NQ_Q8_0: case NQ_IQ4_NL: case NQ_MXFP4: return d * (float)u;
    case NQ_IQ4_XS: return (d * (float)(int8_t)gs[r]) * (float)u;
    case NQ_Q4_1: case NQ_Q5_1: return d * (float)u + f16(unit + 16 + 2 * r);
    case NQ_Q2_K: return (d * (float)(half & 0xf)) * (float)u - f16(unit + 16 + 2 * r) * (float)(half >> 4);
    case NQ_Q3_K: return (d * (float)(int8_t)half) * (float)(u - 4);
    case NQ_Q6_K: return (d * (float)(int8_t)half) * (float)(u - 32);
    default: return (d * (float)gs[r]) * (float)u - f16(unit + 16 + 2 * r) * (float)gs[8 + r];
    }
}

// One tile of a weight: where its pieces lie (qtypes.h).
struct TileAt {
    const uint8_t* w;  // the matrix's first tile
    int64_t t, tiles, units, pieces, ub;
    const uint8_t* piece(int64_t p) const { return w + nq_piece_at(t, p, tiles, units, pieces, ub); }
    int64_t start(int64_t p) const { return nq_piece_start(units, pieces, p); }
};

#if NQ_AVX2
static inline __m256 load_f16x8(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
static inline __m256i load_u8x8(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)); }
static inline __m256 load_i8x8(const uint8_t* p, bool is_signed) {
    __m128i b = _mm_loadl_epi64((const __m128i*)p);
    return _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b));
}

// e8m0_half of 8 E8M0 bytes.
static inline __m256 load_e8m0_half_x8(const uint8_t* p) {
    const __m256i e = load_u8x8(p);
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    const __m256i small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, subnormal, small));
}

// The header's scales of 8 rows.
template <int TYPE>
static inline __m256 header_scales(const uint8_t* unit) {
    return TYPE == NQ_MXFP4 ? load_e8m0_half_x8(unit) : load_f16x8(unit);
}

// BITS bits of every byte from bit FROM to bit TO: one shift and one and (the 16-bit shift moves
// a neighbour byte's bits in, outside the mask, as every field lies within its byte).
template <int FROM, int TO, int BITS>
static inline __m256i field(__m256i v) {
    if constexpr (FROM > TO) v = _mm256_srli_epi16(v, FROM - TO);
    if constexpr (FROM < TO) v = _mm256_slli_epi16(v, TO - FROM);
    return _mm256_and_si256(v, _mm256_set1_epi8((char)(((1 << BITS) - 1) << TO)));
}

// A codebook's 16 values in both 128-bit lanes (vpshufb looks up within each): signed for AVX2's
// sign trick, + 128 for VNNI (unsigned, B = -128·A as Q8_0's).
template <int TYPE>
static inline __m256i codebook() {
    if constexpr (!nq_codebook(TYPE)) {
        return _mm256_setzero_si256();
    } else {
        const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)codebook_values(TYPE)));
        return NQ_VNNI ? _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)) : v;
    }
}

// VNNI, the types of plain nibbles: chunks 4..7 (a byte's high nibble) stay where they are, 16·u
// (group_chunks), and their dots are shifted right by 4 once a group (dot_chunks) instead of each
// chunk by 4 first.
// Exact: 16·u·x summed over a group is at most 240·127·16 in magnitude, and a multiple of 16.
template <int TYPE>
static inline constexpr bool high_in_place() {
    return NQ_VNNI && (TYPE == NQ_Q4_0 || TYPE == NQ_Q4_1 || TYPE == NQ_Q4_K);
}

// Chunk C (values 4C..4C+3) of 8 rows of group planes p: one 256-bit register, row r in lane r.
// C is a template argument so that every shift is an immediate.
template <int TYPE, int C>
static inline __m256i chunk(const uint8_t* p, __m256i book) {
    constexpr int lo = nq_low_bits(TYPE), hi = nq_high_bits(TYPE);
    const __m256i v = _mm256_loadu_si256((const __m256i*)(p + 32 * nq_plane_vector(lo, C)));
    if constexpr (TYPE == NQ_Q8_0) {
        return NQ_VNNI ? _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)) : v;  // VNNI: u = w + 128
    } else {
        __m256i u = field<nq_plane_shift(lo, C), 0, lo>(v);
        if constexpr (hi > 0) {
            const __m256i h = _mm256_loadu_si256((const __m256i*)(p + 32 * (lo + nq_plane_vector(hi, C))));
            u = _mm256_or_si256(u, field<nq_plane_shift(hi, C), lo, hi>(h));
        }
        return nq_codebook(TYPE) ? _mm256_shuffle_epi8(book, u) : u;
    }
}

template <int TYPE>
static inline void group_chunks(const uint8_t* p, __m256i* w) {
    // the plain nibble types on VNNI (high_in_place): each vector of nibbles loaded once for its two
    // chunks, u and 16·u. The empty asm keeps the compiler from folding the load into both ands: two
    // loads of the same 32 bytes, which one row ran 10-12% slower on (Q4_0, Q4_1; Zen 4)
    if constexpr (high_in_place<TYPE>()) {
        for (int c = 0; c < 4; c++) {
            __m256i v = _mm256_loadu_si256((const __m256i*)(p + 32 * c));
            __asm__("" : "+x"(v));
            w[c] = _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
            w[c + 4] = _mm256_and_si256(v, _mm256_set1_epi8((char)0xf0));
        }
        return;
    }
    const __m256i b = codebook<TYPE>();
    w[0] = chunk<TYPE, 0>(p, b); w[1] = chunk<TYPE, 1>(p, b); w[2] = chunk<TYPE, 2>(p, b); w[3] = chunk<TYPE, 3>(p, b);
    w[4] = chunk<TYPE, 4>(p, b); w[5] = chunk<TYPE, 5>(p, b); w[6] = chunk<TYPE, 6>(p, b); w[7] = chunk<TYPE, 7>(p, b);
}

#if NQ_VNNI
// acc + the dots of w's 8 lanes with the 4 bytes at x in every lane: one vpdpbusd whose memory operand
// is broadcast ({1to8}, AVX-512VL), where the intrinsics compiled to a vpbroadcastd and a vpdpbusd.
// A group's 8 loads folded so ran every type 1.02-1.25x faster at 1, 4 and 16 rows in L2 (Zen 4,
// bench/kernels_ab.py; Q6_K 1.05/1.13/1.16x, Q4_K 1.14/1.03/1.14x, Q4_0 1.14/1.19/1.25x): the step
// was bound by its instruction count, not by the multiply pipes. The same integers, the same bits.
static inline __m256i dpbusd_b(__m256i acc, __m256i w, const int8_t* x) {
    __asm__("vpdpbusd %2%{1to8%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t*)x));
    return acc;
}
#endif

#if NQ_VNNI
// The few operations dot_chains takes, on 256-bit registers (one tile) and 512-bit ones (two: pair_rows).
static inline __m512i dpbusd_z(__m512i acc, __m512i w, const int8_t* x) {  // dpbusd_b's {1to16}
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t*)x));
    return acc;
}
static inline __m256i dpbusd_v(__m256i acc, __m256i w, const int8_t* x) { return dpbusd_b(acc, w, x); }
static inline __m512i dpbusd_v(__m512i acc, __m512i w, const int8_t* x) { return dpbusd_z(acc, w, x); }
static inline void splat(__m256i* v, int32_t a) { *v = _mm256_set1_epi32(a); }
static inline void splat(__m512i* v, int32_t a) { *v = _mm512_set1_epi32(a); }
static inline __m256i add_v(__m256i a, __m256i b) { return _mm256_add_epi32(a, b); }
static inline __m512i add_v(__m512i a, __m512i b) { return _mm512_add_epi32(a, b); }
static inline __m256i sixteenth_v(__m256i a) { return _mm256_srai_epi32(a, 4); }
static inline __m512i sixteenth_v(__m512i a) { return _mm512_srai_epi32(a, 4); }

// Σ over chunks C0..C1-1 of u·x by vpdpbusd, in two chains: the even chunks' and the odd ones' (each
// waits on the one before it in its chain, and a single chain of 8 held a group for 8 of its
// latencies: Zen 4, one row, Q4_K +8%), or for the plain nibble types (high_in_place) the low
// nibbles' and the high ones' (16·u, a sixteenth of it taken once). The first chain starts from
// `start`: Q3_K's and Q6_K's -k·Σx of the half (offset_chains), so that their offset costs no
// multiply (vpmaddwd) and no subtraction a row, where the FP0/FP1 pipes that vpdpbusd, vpmulld,
// vmulps and vfmadd share bound the multi-row steps (Zen 4); 0 for the other types.
template <int TYPE, int C0, int C1, typename V>
static inline V dot_chains(const V* w, const int8_t* x, int32_t start = 0) {
    static_assert(!high_in_place<TYPE>() || (C0 == 0 && C1 == 8), "a whole group");
    V even, odd;
    splat(&even, start);
    splat(&odd, 0);
    for (int c = C0; c < C1; c++) {
        if (high_in_place<TYPE>() ? c >= 4 : ((c - C0) & 1)) odd = dpbusd_v(odd, w[c], x + 4 * c);
        else even = dpbusd_v(even, w[c], x + 4 * c);
    }
    return add_v(even, high_in_place<TYPE>() ? sixteenth_v(odd) : odd);
}
#endif

static inline __m256i bcast4(const int8_t* x) {
    int32_t four;
    memcpy(&four, x, 4);
    return _mm256_set1_epi32(four);
}

// Σ over chunks C0..C1-1 of u·x for one activation row x (32 int8), lane r = row r. By vpmaddubsw
// (AVX2) times `by`, each 32-bit lane's int16 factor twice (vpmaddwd's; ones: 1): the per-16 types'
// scale of the half, or Q4_K's and Q5_K's sc_j. VNNI: by vpdpbusd, and for the per-16 types (one
// half a call) times `by` as one int32 per lane (vpmulld; half_scales32), the same integers: the
// vpmaddubsw path they took before ran 1.03-1.14x slower (Q6_K, Q3_K, Q2_K at 1, 8 and 16 rows in
// L2, Zen 4; their dots scaled as floats had been as fast at one row and 15-22% slower at eight).
template <int TYPE, int C0, int C1>
static inline __m256i dot_chunks(const __m256i* w, const int8_t* x, __m256i by = _mm256_set1_epi16(1)) {
#if NQ_VNNI
    const __m256i sum = dot_chains<TYPE, C0, C1>(w, x);
    return nq_per16(TYPE) ? _mm256_mullo_epi32(sum, by) : sum;  // exact: |sc·Σu·x| <= 128·63·127·16 (Q6_K)
#else
    __m256i acc = _mm256_setzero_si256();
    // vpmaddubsw pairs into int16, summed over as many chunks as cannot overflow (each int16 takes
    // 2 products of at most weight_max · 127 per chunk), then vpmaddwd
    constexpr int run = 32767 / (2 * 127 * weight_max(TYPE));
    static_assert(run >= 1, "one vpmaddubsw pair must fit int16");
    for (int c = C0; c < C1; c += run) {
        __m256i sum16 = _mm256_setzero_si256();
        for (int k = c; k < c + run && k < C1; k++) {
            const __m256i xv = bcast4(x + 4 * k);
            const __m256i p = signed_weights(TYPE)  // |w| and x with w's sign
                                  ? _mm256_maddubs_epi16(_mm256_sign_epi8(w[k], w[k]), _mm256_sign_epi8(xv, w[k]))
                                  : _mm256_maddubs_epi16(w[k], xv);
            sum16 = _mm256_add_epi16(sum16, p);
        }
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(sum16, by));
    }
    return acc;
#endif
}

// The same Σ u·x for one activation row with each chunk unpacked next to its product rather than
// all 8 first: a single row uses each chunk once, and the 8 chunks of the types with high bits
// (Q3_K, Q5_K, Q6_K), with their temporaries, overflowed the 16 registers. Unsigned weights only.
template <int TYPE, int C, int C1>
static inline __m256i sum16_unpacked(const uint8_t* p, const int8_t* x) {
    static_assert(!signed_weights(TYPE), "the sign trick is dot_chunks'");
    const __m256i product = _mm256_maddubs_epi16(chunk<TYPE, C>(p, codebook<TYPE>()), bcast4(x + 4 * C));
    if constexpr (C + 1 < C1) return _mm256_add_epi16(product, sum16_unpacked<TYPE, C + 1, C1>(p, x));
    else return product;
}

template <int TYPE, int C0, int C1>
static inline __m256i dot_unpacked(const uint8_t* p, const int8_t* x, __m256i by) {
    constexpr int run = 32767 / (2 * 127 * weight_max(TYPE)), n = run < C1 - C0 ? run : C1 - C0;
    const __m256i part = _mm256_madd_epi16(sum16_unpacked<TYPE, C0, C0 + n>(p, x), by);
    if constexpr (C0 + n < C1) return _mm256_add_epi32(part, dot_unpacked<TYPE, C0 + n, C1>(p, x, by));
    else return part;
}

// A row's two sums of 16 (s₀, s₁: adjacent int16 at sr) times vpmaddwd's factors (f₀, f₁) in every
// lane: s₀·f₀ + s₁·f₁.
static inline __m256i times_sums16(const int16_t* sr, __m256i f) {
    return _mm256_madd_epi16(bcast4((const int8_t*)sr), f);
}

// VNNI's types whose weight is A·(u - k) (B = -k·A): Q4_0, Q5_0, and the +128 of the codebook
// types. Their k·Σx is taken from the dot in integers (k·(s₀ + s₁), exact), so that no B·ds is
// summed as a float: -128·A overflowed float32 for MXFP4's largest scales (2^124: an inf where every
// product is finite). Q8_0 keeps its B·ds, one fma on acc (its d is a float16: no overflow), as its
// one-row step ran 4% slower with the integer offset and 1.5% with the B·ds in sums of their own.
template <int TYPE>
static inline constexpr int int_offset() {
    return !NQ_VNNI || TYPE == NQ_Q8_0 ? 0
         : TYPE == NQ_Q4_0 ? 8 : TYPE == NQ_Q5_0 ? 16 : signed_weights(TYPE) ? 128 : 0;
}

// A and B of w = A·u + B for 8 rows, types with one scale per 32 values.
template <int TYPE>
static inline void group_ab(__m256 dw, __m256 second, const uint8_t* gs, __m256* A, __m256* B) {
    if (TYPE == NQ_Q4_K || TYPE == NQ_Q5_K) {
        *A = _mm256_mul_ps(dw, load_i8x8(gs, false));
        *B = _mm256_mul_ps(_mm256_mul_ps(second, load_i8x8(gs + 8, false)), _mm256_set1_ps(-1.0f));
    } else if (TYPE == NQ_Q4_1 || TYPE == NQ_Q5_1) {
        *A = dw;
        *B = second;
    } else {
        *A = TYPE == NQ_IQ4_XS ? _mm256_mul_ps(dw, load_i8x8(gs, true)) : dw;
        const float k = TYPE == NQ_Q4_0 ? -8.0f : TYPE == NQ_Q5_0 ? -16.0f : NQ_VNNI ? -128.0f : 0.0f;
        *B = _mm256_mul_ps(*A, _mm256_set1_ps(k));
    }
}

// The same scales as int16 factors for vpmaddwd. by[h]: row r's sc of half h in both int16 halves
// of lane r (times the pairs of a dot's sums); bm: (k·mn₀, k·mn₁) in lane r's two halves (times
// the activation sums (s₀, s₁) of a row, broadcast), k = 4 (Q3_K), 32 (Q6_K) or 1 (Q2_K's mins).
// Each 32-bit lane's int16 pair (lo's lane, hi's lane): what vpmaddwd multiplies a lane's pair by.
static inline __m256i int16_pairs(__m256i lo, __m256i hi) {
    return _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(hi, 16));
}

// Built from 32-bit lanes (the 8-row step's way: its registers are full, and these few operations
// are shared by 8 rows).
template <int TYPE>
static inline void half_factors_by_lane(const uint8_t* gs, __m256i* by, __m256i* bm) {
    constexpr int k = TYPE == NQ_Q3_K ? 4 : TYPE == NQ_Q6_K ? 32 : 1;
    __m256i mn[2];
    for (int h = 0; h < 2; h++) {
        const __m128i b = _mm_loadl_epi64((const __m128i*)(gs + 8 * h));
        const __m256i v = TYPE == NQ_Q2_K ? _mm256_and_si256(_mm256_cvtepu8_epi32(b), _mm256_set1_epi32(0xf))
                                          : _mm256_cvtepi8_epi32(b);
        by[h] = int16_pairs(v, v);
        mn[h] = TYPE == NQ_Q2_K ? _mm256_srli_epi32(_mm256_cvtepu8_epi32(b), 4) : _mm256_mullo_epi32(v, _mm256_set1_epi32(k));
    }
    *bm = int16_pairs(mn[0], mn[1]);
}

// The same factors from the 16 scale bytes widened to int16 at once and placed by byte shuffles:
// 8-10 operations where the above takes 15-17, for the fewer-row steps, where they weigh more per row.
template <int TYPE>
static inline void half_factors_by_shuffle(const uint8_t* gs, __m256i* by, __m256i* bm) {
    const __m128i b = _mm_loadu_si128((const __m128i*)gs);  // half 0's rows 0..7, half 1's rows 0..7
    __m256i sc, mn;
    if constexpr (TYPE == NQ_Q2_K) {  // sc | mn << 4
        const __m256i v = _mm256_cvtepu8_epi16(b);
        sc = _mm256_and_si256(v, _mm256_set1_epi16(0xf));
        mn = _mm256_srli_epi16(v, 4);
    } else {
        sc = _mm256_cvtepi8_epi16(b);
        mn = _mm256_slli_epi16(sc, TYPE == NQ_Q3_K ? 2 : 5);  // k·sc (|32·sc| <= 4096)
    }
    // row r's int16 twice in lane r: rows 0..3 in the low 128-bit lane, 4..7 in the high one
    const __m256i twice = _mm256_setr_epi8(0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5, 6, 7, 6, 7,
                                           8, 9, 8, 9, 10, 11, 10, 11, 12, 13, 12, 13, 14, 15, 14, 15);
    by[0] = _mm256_shuffle_epi8(_mm256_permute4x64_epi64(sc, 0x44), twice);  // half 0 in both lanes
    by[1] = _mm256_shuffle_epi8(_mm256_permute4x64_epi64(sc, 0xee), twice);  // half 1
    // (half 0's, half 1's) of row r in lane r, from 128-bit lanes of (rows 0..3 of both halves),
    // (rows 4..7 of both halves)
    const __m256i both = _mm256_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15,
                                          0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
    *bm = _mm256_shuffle_epi8(_mm256_permute4x64_epi64(mn, 0xd8), both);
}

// VNNI's factors of the per-16 types' dots (dot_chunks): each half's scale as an int32 in lane r,
// Q2_K's the low nibble of its byte.
template <int TYPE>
static inline void half_scales32(const uint8_t* gs, __m256i* sc) {
    for (int h = 0; h < 2; h++) {
        const __m128i b = _mm_loadl_epi64((const __m128i*)(gs + 8 * h));
        sc[h] = TYPE == NQ_Q2_K ? _mm256_and_si256(_mm256_cvtepu8_epi32(b), _mm256_set1_epi32(0xf))
                                : _mm256_cvtepi8_epi32(b);
    }
}

// by: vpmaddwd's factors (AVX2) or vpmulld's (VNNI, whose dots take no int16 pairs); bm: as above.
template <int TYPE, int R>
static inline void half_factors(const uint8_t* gs, __m256i* by, __m256i* bm) {
    if constexpr (R >= 8) half_factors_by_lane<TYPE>(gs, by, bm);
    else half_factors_by_shuffle<TYPE>(gs, by, bm);
    if constexpr (NQ_VNNI) half_scales32<TYPE>(gs, by);
}

// Q4_K's and Q5_K's sc_j as vpmaddwd's factors, sc_j twice in lane r (row r): the dots come out as
// sc_j·Σu·x in integers, which saves converting and multiplying the scales as floats.
static inline __m256i k_scale_factors(const uint8_t* gs) {
    const __m256i twice = _mm256_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1,
                                           4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1);
    return _mm256_shuffle_epi8(_mm256_broadcastq_epi64(_mm_loadl_epi64((const __m128i*)gs)), twice);
}

// Their min factors dmin·mn_j of 8 rows (second: the unit's dmin), for the inline sums and the
// second pass alike: one product, so both sum the same values.
static inline __m256 k_dmin_mn(const uint8_t* gs, __m256 second) {
    return _mm256_mul_ps(load_i8x8(gs + 8, false), second);
}

// out[r·ldo + 0..7] for the 8 rows of one tile and R activation rows, unit b at tile + b·ub. PIECE:
// units b0..b1 - 1 only (a piece of a long row, qtypes.h): from b0 > 0 the sums so far come from carry
// (16·R floats), and where b1 stops short of the last unit they go back there, not to out. A row's
// sums run in the same order whether the tile is read in one call or a piece at a time. (A whole
// tile's code is its own instance: read through a walk over pieces, one row in L2 lost 4-11%.)
template <int TYPE, int R, bool PIECE = false>
static void tile_rows(const uint8_t* tile, int64_t K, const int8_t* q, const float* d, const int16_t* s,
                      const float* ds, const int32_t* ks, float* out, int64_t ldo, int valid, int64_t b0 = 0,
                      int64_t b1 = 0, float* carry = nullptr) {
    const int gpu = nq_block_elems(TYPE) / 32, ub = nq_unit_bytes(TYPE);
    const int64_t units = K / nq_block_elems(TYPE), G = K / 32;
    if constexpr (!PIECE) b0 = 0, b1 = units;
    // Q4_K, Q5_K (AVX2): per unit Σ_j sc_j·dot_j·d_j, times the unit's d once, and the min terms
    // Σ dmin·mn_j·ds_j in sums of their own, subtracted at the end. Inline for 1 and 2 rows; in a
    // second pass over the tile's scales for more, whose registers are taken. The same sums in the
    // same order either way: a row's result does not depend on the row count (tested)
    constexpr bool k_mins = (TYPE == NQ_Q4_K || TYPE == NQ_Q5_K) && !NQ_VNNI, mins_inline = R <= 2;
    // one row, AVX2: Q3_K, Q5_K, Q6_K unpack each chunk as its product needs it (dot_unpacked); Q2_K
    // and Q4_K, whose chunks are a shift and an and away, lost 2-3% so. VNNI (32 registers, vpdpbusd
    // for every type) unpacks all 8 first
    constexpr bool unpack_as_used = R == 1 && !NQ_VNNI && (TYPE == NQ_Q3_K || TYPE == NQ_Q6_K || TYPE == NQ_Q5_K);
    __m256 acc[R], mins[R];
    for (int r = 0; r < R; r++) {
        acc[r] = PIECE && b0 > 0 ? _mm256_loadu_ps(carry + 16 * r) : _mm256_setzero_ps();
        mins[r] = PIECE && b0 > 0 ? _mm256_loadu_ps(carry + 16 * r + 8) : _mm256_setzero_ps();
    }
    for (int64_t b = b0; b < b1; b++) {
        const uint8_t* unit = tile + b * ub;
        // the lines NQ_AHEAD bytes on requested as each unit is read: weights stream from memory once
        // per token, and the hardware prefetcher stops at every 4 KiB page. Spread over the loop, not
        // a burst per tile: the burst overran the fill buffers (AMD EPYC, 2 threads, 8192x2048
        // weights from memory: Q4_0 19.4 -> 24 GB/s, Q6_K 17.6 -> 22.4, Q8_0 19.2 -> 22). On VNNI,
        // Intel's CPUs only (q_vnni.cpp)
        if constexpr (NQ_AHEAD > 0)
            if (ahead_on)
                for (int o = 0; o < ub; o += 64) _mm_prefetch((const char*)(unit + NQ_AHEAD + o), _MM_HINT_T0);
        const __m256 dw = header_scales<TYPE>(unit);
        const __m256 second = nq_has_min(TYPE) ? load_f16x8(unit + 16) : _mm256_setzero_ps();
        // AVX2's Q4_K, Q5_K: the unit's Σ sc_j·dot_j·d, times its d once (VNNI's Q3_K, Q6_K likewise)
        constexpr bool unit_d = k_mins || offset_chains<TYPE>();
        __m256 unit_acc[unit_d ? R : 1];
        for (int r = 0; r < (unit_d ? R : 1); r++) unit_acc[r] = _mm256_setzero_ps();
        for (int j = 0; j < gpu; j++) {
            const int64_t g = b * gpu + j;
            const uint8_t* gs = group_at(TYPE, unit, j);
            const uint8_t* planes = gs + nq_group_scales(TYPE);
            __m256i w[8];
            if constexpr (!unpack_as_used) group_chunks<TYPE>(planes, w);
            if constexpr (nq_per16(TYPE)) {  // Σ = dw·da·(sc₀·dot₀ + sc₁·dot₁) + B·da·(mn₀·s₀ + mn₁·s₁)
                // all in integers: Σ sc_h·dot_h and Σ k·mn_h·s_h, one conversion each (Q3_K, Q6_K: one,
                // as their offset k shares dw's factor: Σ sc_h·(dot_h - k·s_h) = Σ sc_h·Σ (u - k)·x)
                __m256i by[2], bm;
                half_factors<TYPE, R>(gs, by, &bm);
                for (int r = 0; r < R; r++) {
                    const int8_t* x = q + r * K + 32 * g;
                    const __m256 da = _mm256_set1_ps(d[r * G + g]);
                    __m256i t;
#if NQ_VNNI
                    if constexpr (offset_chains<TYPE>()) {
                        const int32_t* from = ks + r * 2 * G + 2 * g;
                        t = _mm256_add_epi32(_mm256_mullo_epi32(dot_chains<TYPE, 0, 4>(w, x, from[0]), by[0]),
                                             _mm256_mullo_epi32(dot_chains<TYPE, 4, 8>(w, x, from[1]), by[1]));
                        unit_acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), da, unit_acc[r]);
                        continue;
                    }
#endif
                    if constexpr (unpack_as_used)
                        t = _mm256_add_epi32(dot_unpacked<TYPE, 0, 4>(planes, x, by[0]),
                                             dot_unpacked<TYPE, 4, 8>(planes, x, by[1]));
                    else
                        t = _mm256_add_epi32(dot_chunks<TYPE, 0, 4>(w, x, by[0]), dot_chunks<TYPE, 4, 8>(w, x, by[1]));
                    const __m256i m = times_sums16(s + r * 2 * G + 2 * g, bm);
                    if constexpr (TYPE == NQ_Q2_K) {
                        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(dw, da), acc[r]);
                        acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(second, da), acc[r]);
                    } else {
                        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(t, m)), _mm256_mul_ps(dw, da), acc[r]);
                    }
                }
            } else if constexpr (k_mins) {
                const __m256i by = k_scale_factors(gs);
                const __m256 dmin_mn = k_dmin_mn(gs, second);
                for (int r = 0; r < R; r++) {
                    __m256i sum;
                    const int8_t* x = q + r * K + 32 * g;
                    if constexpr (unpack_as_used) sum = dot_unpacked<TYPE, 0, 8>(planes, x, by);
                    else sum = dot_chunks<TYPE, 0, 8>(w, x, by);
                    const __m256 dot = _mm256_cvtepi32_ps(sum);
                    unit_acc[r] = _mm256_fmadd_ps(dot, _mm256_set1_ps(d[r * G + g]), unit_acc[r]);
                    if constexpr (mins_inline) mins[r] = _mm256_fmadd_ps(dmin_mn, _mm256_set1_ps(ds[r * G + g]), mins[r]);
                }
            } else {
                __m256 A, B;
                group_ab<TYPE>(dw, second, gs, &A, &B);
                for (int r = 0; r < R; r++) {
                    __m256i sum = dot_chunks<TYPE, 0, 8>(w, q + r * K + 32 * g);
                    if constexpr (int_offset<TYPE>() != 0)
                        sum = _mm256_sub_epi32(sum, times_sums16(s + r * 2 * G + 2 * g, _mm256_set1_epi16(int_offset<TYPE>())));
                    const __m256 dot = _mm256_cvtepi32_ps(sum);
                    acc[r] = _mm256_fmadd_ps(dot, _mm256_mul_ps(A, _mm256_set1_ps(d[r * G + g])), acc[r]);
                    // the min terms (Q4_1, Q5_1, Q4_K, Q5_K): VNNI's in sums of their own (one fma a
                    // group on acc's chain, not two)
                    if constexpr (NQ_VNNI && nq_has_min(TYPE))
                        mins[r] = _mm256_fmadd_ps(B, _mm256_set1_ps(ds[r * G + g]), mins[r]);
                    else if constexpr (int_offset<TYPE>() == 0 && (!signed_weights(TYPE) || NQ_VNNI))
                        acc[r] = _mm256_fmadd_ps(B, _mm256_set1_ps(ds[r * G + g]), acc[r]);
                }
            }
        }
        if constexpr (unit_d)
            for (int r = 0; r < R; r++) acc[r] = _mm256_fmadd_ps(unit_acc[r], dw, acc[r]);
    }
    if constexpr (k_mins && !mins_inline) {
        for (int64_t b = b0; b < b1; b++) {
            const uint8_t* unit = tile + b * ub;
            const __m256 second = load_f16x8(unit + 16);
            for (int j = 0; j < gpu; j++) {
                const int64_t g = b * gpu + j;
                const __m256 dmin_mn = k_dmin_mn(group_at(TYPE, unit, j), second);
                for (int r = 0; r < R; r++) mins[r] = _mm256_fmadd_ps(dmin_mn, _mm256_set1_ps(ds[r * G + g]), mins[r]);
            }
        }
    }
    if (PIECE && b1 < units) {
        for (int r = 0; r < R; r++) {
            _mm256_storeu_ps(carry + 16 * r, acc[r]);
            _mm256_storeu_ps(carry + 16 * r + 8, mins[r]);
        }
        return;
    }
    for (int r = 0; r < R; r++) {
        if constexpr (k_mins) acc[r] = _mm256_sub_ps(acc[r], mins[r]);
        if constexpr (NQ_VNNI && nq_has_min(TYPE)) acc[r] = _mm256_add_ps(acc[r], mins[r]);  // as summed above
        if (valid == NQ_TILE) {
            _mm256_storeu_ps(out + r * ldo, acc[r]);
        } else {
            float tmp[NQ_TILE];
            _mm256_storeu_ps(tmp, acc[r]);
            memcpy(out + r * ldo, tmp, valid * sizeof(float));
        }
    }
}
#else
// Row r's factors of group j: Σ w·x = A·d·(sc₀·dot₀ + sc₁·dot₁) + B·(per-16 types: d·(mn₀·s₀ +
// mn₁·s₁); the others: ds), the dots over the group's two halves of u (signed where AVX2's are).
struct Factors {
    float A, B;
    int sc[2], mn[2];
};

static inline Factors factors(int type, const uint8_t* unit, const uint8_t* gs, int r) {
    const float dw = row_scale(type, unit, r), second = nq_has_min(type) ? f16(unit + 16 + 2 * r) : 0.0f;
    Factors f = {dw, 0.0f, {1, 1}, {0, 0}};  // Q8_0, IQ4_NL, MXFP4: signed u, B = 0
    switch (type) {
    case NQ_Q4_0: f.B = -8 * dw; break;
    case NQ_Q5_0: f.B = -16 * dw; break;
    case NQ_Q4_1: case NQ_Q5_1: f.B = second; break;
    case NQ_Q4_K: case NQ_Q5_K: f.A = dw * gs[r]; f.B = -second * gs[8 + r]; break;
    case NQ_IQ4_XS: f.A = dw * (int8_t)gs[r]; break;
    case NQ_Q2_K:
        f.B = -second;
        for (int h = 0; h < 2; h++) f.sc[h] = gs[8 * h + r] & 0xf, f.mn[h] = gs[8 * h + r] >> 4;
        break;
    case NQ_Q3_K: case NQ_Q6_K:
        f.B = (type == NQ_Q3_K ? -4 : -32) * dw;
        for (int h = 0; h < 2; h++) f.sc[h] = f.mn[h] = (int8_t)gs[8 * h + r];
        break;
    }
    return f;
}

// The portable path: the same integer sums, one row of the tile at a time (the float ones in
// another order than AVX2's for Q4_K and Q5_K, whose mins AVX2 subtracts at the end).
template <int TYPE, int R, bool PIECE = false>
static void tile_rows(const uint8_t* tile, int64_t K, const int8_t* q, const float* d, const int16_t* s,
                      const float* ds, const int32_t* ks, float* out, int64_t ldo, int valid, int64_t b0 = 0,
                      int64_t b1 = 0, float* carry = nullptr) {
    const int gpu = nq_block_elems(TYPE) / 32, ub = nq_unit_bytes(TYPE);
    const int64_t units = K / nq_block_elems(TYPE), G = K / 32;
    if constexpr (!PIECE) b0 = 0, b1 = units;
    for (int row = 0; row < valid; row++) {
        float acc[R];
        for (int r = 0; r < R; r++) acc[r] = b0 > 0 ? carry[16 * r + row] : 0.0f;
        for (int64_t b = b0; b < b1; b++) {
            const uint8_t* unit = tile + b * ub;
            for (int j = 0; j < gpu; j++) {
                const int64_t g = b * gpu + j;
                const Factors f = factors(TYPE, unit, group_at(TYPE, unit, j), row);
                int u[32];
                for (int e = 0; e < 32; e++) u[e] = unit_value(TYPE, unit, row, j, e);
                for (int r = 0; r < R; r++) {
                    const int8_t* x = q + r * K + 32 * g;
                    int32_t lo = 0, hi = 0;
                    for (int e = 0; e < 16; e++) {
                        lo += u[e] * x[e];
                        hi += u[e + 16] * x[e + 16];
                    }
                    const int16_t* sr = s + r * 2 * G + 2 * g;
                    const float da = d[r * G + g];
                    acc[r] += (float)(f.sc[0] * lo + f.sc[1] * hi) * (f.A * da);
                    acc[r] += f.B * (nq_per16(TYPE) ? da * (float)(f.mn[0] * sr[0] + f.mn[1] * sr[1]) : ds[r * G + g]);
                }
            }
        }
        for (int r = 0; r < R; r++) (b1 < units ? carry[16 * r + row] : out[r * ldo + row]) = acc[r];
    }
}
#endif

#if NQ_VNNI
// ---- two tiles at once on 512-bit registers (VNNI, 16 activation rows a step) ----
// Tile t's 8 rows in lanes 0..7 and tile t + 1's in lanes 8..15: one broadcast of 4 activation bytes
// then feeds 16 rows' vpdpbusd. The 8-row steps issued two loads a cycle (the broadcast operands, the
// sums' and scales' broadcasts), about as many as Zen 4 takes, beside the vpdpbusd, vpmulld and fmas
// on its two FP0/FP1 pipes; sharing the broadcasts leaves those pipes the bound. A 512-bit operation
// takes a 256-bit pipe twice there, so the arithmetic is the same; the issue slots and loads halve.
// Every product and sum is the 8-row step's, in the same order: the same bits (tested).
template <int TYPE>
static inline constexpr bool pairs() { return TYPE != NQ_Q8_0 && TYPE != NQ_Q2_K; }

static inline __m512i pair_i(__m256i a, __m256i b) { return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1); }
static inline __m512 pair_f(__m256 a, __m256 b) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(a)), _mm256_castps_pd(b), 1));
}
static inline __m512i pair_load(const uint8_t* a, const uint8_t* b) {
    return pair_i(_mm256_loadu_si256((const __m256i*)a), _mm256_loadu_si256((const __m256i*)b));
}
// 8 bytes of each tile's group scales: 16 bytes, tile t's first
static inline __m128i pair_bytes(const uint8_t* a, const uint8_t* b) {
    return _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i*)a), _mm_loadl_epi64((const __m128i*)b));
}

template <int FROM, int TO, int BITS>
static inline __m512i field_z(__m512i v) {
    if constexpr (FROM > TO) v = _mm512_srli_epi16(v, FROM - TO);
    if constexpr (FROM < TO) v = _mm512_slli_epi16(v, TO - FROM);
    return _mm512_and_si512(v, _mm512_set1_epi8((char)(((1 << BITS) - 1) << TO)));
}

// chunk() of the two tiles' planes (the plane vectors, each of both tiles)
template <int TYPE, int C>
static inline __m512i chunk_z(const __m512i* planes, __m512i book) {
    constexpr int lo = nq_low_bits(TYPE), hi = nq_high_bits(TYPE);
    __m512i u = field_z<nq_plane_shift(lo, C), 0, lo>(planes[nq_plane_vector(lo, C)]);
    if constexpr (hi > 0) u = _mm512_or_si512(u, field_z<nq_plane_shift(hi, C), lo, hi>(planes[lo + nq_plane_vector(hi, C)]));
    return nq_codebook(TYPE) ? _mm512_shuffle_epi8(book, u) : u;
}

// group_chunks() of both tiles
template <int TYPE>
static inline void pair_chunks(const uint8_t* pa, const uint8_t* pb, __m512i* w) {
    constexpr int np = nq_low_bits(TYPE) + nq_high_bits(TYPE);
    __m512i planes[np];
    for (int i = 0; i < np; i++) planes[i] = pair_load(pa + 32 * i, pb + 32 * i);
    if constexpr (high_in_place<TYPE>()) {
        for (int c = 0; c < 4; c++) {
            w[c] = _mm512_and_si512(planes[c], _mm512_set1_epi8(0x0f));
            w[c + 4] = _mm512_and_si512(planes[c], _mm512_set1_epi8((char)0xf0));
        }
        return;
    }
    const __m256i b = codebook<TYPE>();
    const __m512i book = pair_i(b, b);
    w[0] = chunk_z<TYPE, 0>(planes, book); w[1] = chunk_z<TYPE, 1>(planes, book); w[2] = chunk_z<TYPE, 2>(planes, book);
    w[3] = chunk_z<TYPE, 3>(planes, book); w[4] = chunk_z<TYPE, 4>(planes, book); w[5] = chunk_z<TYPE, 5>(planes, book);
    w[6] = chunk_z<TYPE, 6>(planes, book); w[7] = chunk_z<TYPE, 7>(planes, book);
}

// group_ab() of both tiles (VNNI's: B is used by the min types only)
template <int TYPE>
static inline void pair_ab(__m512 dw, __m512 second, const uint8_t* ga, const uint8_t* gb, __m512* A, __m512* B) {
    if constexpr (TYPE == NQ_Q4_K || TYPE == NQ_Q5_K) {
        *A = _mm512_mul_ps(dw, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(pair_bytes(ga, gb))));
        const __m512 mn = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(pair_bytes(ga + 8, gb + 8)));
        *B = _mm512_mul_ps(_mm512_mul_ps(second, mn), _mm512_set1_ps(-1.0f));
    } else if constexpr (TYPE == NQ_Q4_1 || TYPE == NQ_Q5_1) {
        *A = dw;
        *B = second;
    } else {
        *A = TYPE == NQ_IQ4_XS ? _mm512_mul_ps(dw, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(pair_bytes(ga, gb)))) : dw;
        *B = _mm512_setzero_ps();
    }
}

// The header's scales of both tiles' units
template <int TYPE>
static inline __m512 pair_scales(const uint8_t* ua, const uint8_t* ub) {
    return pair_f(header_scales<TYPE>(ua), header_scales<TYPE>(ub));
}

// ---- AMX (q_amx.cpp): pair_rows' 16 x 16 dots of a group by one tile multiply ----
// A group's 16 activation rows of 32 bytes are A; the two tiles' 8 chunks are B, one 64-byte row each
// (chunk c: values 4c..4c+3 of the 16 weight rows, vpdpbusd's layout, which is AMX's); tdpbsud gives
// the 16 x 16 int32 dots (C), taking A signed (the activations) and B unsigned (u) as vpdpbusd takes
// them the other way round: the same integers, so every row keeps the VNNI path's bits (tested).
// Tile registers 0-2 hold A, B and C of the even groups, 3-5 of the odd ones. The dots of a batch of
// 8 groups are taken before any is scaled, and the batch's chunks are all stored before the first
// tile load: a tile load right after the stores it reads waits for them to reach the cache, and so
// group after group (a first version) AMX ran Q4_K slower than vpdpbusd. Batched, Q4_K at 16 rows in
// L2 runs 1.48x (Intel Xeon with AMX, one thread; bench/kernels_ab.py --against b648b95 --isa amx
// --against-isa avx512-vnni --rows 16).
// The per-16 types (offset_chains), whose halves of 16 values each take a scale, stay on vpdpbusd:
// a tile multiply a half, batched as the others (a scratch version), ran Q6_K and Q3_K no faster:
// their sums' vpmulld and the halves' loads stay, and are most of their step.
template <int TYPE>
static inline constexpr bool amx_pairs() { return NQ_AMX && !offset_chains<TYPE>(); }
constexpr int AMX_BATCH = NQ_AMX ? 8 : 1;  // groups whose dots are taken before their sums are scaled

#if NQ_AMX
constexpr int AMX_SHARED = 128;  // rows from which the 16-row steps share two tiles' chunks made once

struct AmxPalette {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};
static inline void amx_configure() {
    AmxPalette c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    const int shapes[6][2] = {{16, 32}, {8, 64}, {16, 64}, {16, 32}, {8, 64}, {16, 64}};
    for (int t = 0; t < 6; t++) c.rows[t] = (uint8_t)shapes[t][0], c.colsb[t] = (uint16_t)shapes[t][1];
    _tile_loadconfig(&c);
}

// The chunks of groups g0..g0 + n - 1 of two tiles' units (unit u of tile t at ua(u), of tile t + 1
// `apart` bytes on) as B: 8 rows of 64 bytes each, at out + 512·(g - g0). The plain nibble types'
// high chunks (16·u) go in as u.
template <int TYPE, typename At>
static inline void amx_chunks(At ua, int64_t apart, int64_t g0, int64_t n, uint8_t* out) {
    constexpr int gpu = nq_block_elems(TYPE) / 32;
    for (int64_t i = 0; i < n; i++) {
        const uint8_t* unit = ua((g0 + i) / gpu);
        const uint8_t* ga = group_at(TYPE, unit, (int)((g0 + i) % gpu));
        const uint8_t* gb = group_at(TYPE, unit + apart, (int)((g0 + i) % gpu));
        __m512i w[8];
        pair_chunks<TYPE>(ga + nq_group_scales(TYPE), gb + nq_group_scales(TYPE), w);
        for (int c = 0; c < 8; c++)
            _mm512_store_si512((__m512i*)(out + 512 * i + 64 * c), high_in_place<TYPE>() && c >= 4 ? _mm512_srli_epi16(w[c], 4) : w[c]);
    }
}

// The dots of n groups from g0 (at most AMX_BATCH), their B at chunks (amx_chunks'), with 16 activation rows K
// bytes apart: dots[i][16·r + c] for group g0 + i, row r and weight row c. The even and odd groups'
// steps are written out twice: GCC's tile intrinsics paste the register number into the assembly, so
// it cannot be a template argument.
static inline void amx_dots(const uint8_t* chunks, int64_t g0, int64_t n, const int8_t* q, int64_t K,
                            int32_t (*dots)[256]) {
    for (int i = 0; i < n; i++) {
        const int8_t* x = q + 32 * (g0 + i);
        if (i & 1) {
            _tile_loadd(4, chunks + 512 * i, 64);
            _tile_loadd(3, x, K);
            _tile_zero(5);
            _tile_dpbsud(5, 3, 4);
            _tile_stored(5, dots[i], 64);
        } else {
            _tile_loadd(1, chunks + 512 * i, 64);
            _tile_loadd(0, x, K);
            _tile_zero(2);
            _tile_dpbsud(2, 0, 1);
            _tile_stored(2, dots[i], 64);
        }
    }
}

// Every group's chunks of tiles t and t + 1 (amx_chunks), piece by piece, into a buffer of the calling
// thread's (16·K bytes, grown as needed): null where it cannot grow. Prefill's steps of 16 rows then
// share them, where each step unpacked them again: at 512 rows Q4_K, Q4_0 and IQ4_XS ran 1.09-1.12x,
// at 128 rows 1.02-1.08x (512 x 1536 in L2, one thread; bench/kernels_ab.py --isa amx --against
// 9eec73c --rows 128,512); with the bound lowered (scratch), 64 rows ran as fast and 32 slower: hence
// from AMX_SHARED rows.
template <int TYPE>
static inline const uint8_t* amx_pair_chunks(const TileAt& tile, const TileAt& next, int64_t K) {
    static thread_local uint8_t* held = nullptr;
    static thread_local int64_t size = 0;
    const int64_t need = K / 32 * 512;
    if (need > size) {
        void* grown = nullptr;
        if (posix_memalign(&grown, 64, need)) return nullptr;
        free(held);
        held = (uint8_t*)grown;
        size = need;
    }
    constexpr int gpu = nq_block_elems(TYPE) / 32;
    for (int64_t p = 0; p < tile.pieces; p++) {
        const uint8_t* at = tile.piece(p) - tile.start(p) * tile.ub;
        const int64_t b0 = tile.start(p), b1 = tile.start(p + 1);
        amx_chunks<TYPE>([&](int64_t u) { return at + u * tile.ub; }, next.piece(p) - tile.piece(p), b0 * gpu,
                         (b1 - b0) * gpu, held + b0 * gpu * 512);
    }
    return held;
}
#endif

// tile_rows<TYPE, R>() of tiles t and t + 1 (both whole), out[r·ldo + 0..15]: tile t + 1's units
// `apart` bytes after tile t's, units b0..b1 - 1 with sums carried as tile_rows' (32·R floats)
template <int TYPE, int R, bool PIECE = false>
static void pair_rows(const uint8_t* tile, int64_t apart, int64_t K, const int8_t* q, const float* d,
                      const int16_t* s, const float* ds, const int32_t* ks, float* out, int64_t ldo, int64_t b0 = 0,
                      int64_t b1 = 0, float* carry = nullptr, const uint8_t* chunks = nullptr) {
    const int gpu = nq_block_elems(TYPE) / 32, ub = nq_unit_bytes(TYPE);
    const int64_t units = K / nq_block_elems(TYPE), G = K / 32;
    if constexpr (!PIECE) b0 = 0, b1 = units;
    __m512 acc[R], mins[R];
    for (int r = 0; r < R; r++) {
        acc[r] = PIECE && b0 > 0 ? _mm512_loadu_ps(carry + 32 * r) : _mm512_setzero_ps();
        mins[r] = PIECE && b0 > 0 ? _mm512_loadu_ps(carry + 32 * r + 16) : _mm512_setzero_ps();
    }
    // AMX: the dots of AMX_BATCH groups (whole units) at a time, then their sums scaled below
    constexpr bool amx = amx_pairs<TYPE>() && R == 16;
    constexpr int batch_units = nq_block_elems(TYPE) >= 32 * AMX_BATCH ? 1 : AMX_BATCH * 32 / nq_block_elems(TYPE);
    alignas(64) int32_t dots[amx ? AMX_BATCH : 1][256];
#if NQ_AMX
    alignas(64) uint8_t made[amx ? AMX_BATCH : 1][512];  // the batch's chunks, where none are given
#endif
    for (int64_t b = b0; b < b1; b++) {
        const uint8_t* ua = tile + b * ub;
        const uint8_t* ux = ua + apart;  // tile t + 1's unit
#if NQ_AMX
        if constexpr (amx) {
            if ((b - b0) % batch_units == 0) {
                const int64_t n = (b1 - b < batch_units ? b1 - b : batch_units) * gpu;
                if (!chunks)  // the batch's chunks, every one stored before the first tile load (above)
                    amx_chunks<TYPE>([&](int64_t u) { return tile + u * ub; }, apart, b * gpu, n, made[0]);
                amx_dots(chunks ? chunks + b * gpu * 512 : made[0], b * gpu, n, q, K, dots);
            }
        }
#endif
        const __m512 dw = pair_scales<TYPE>(ua, ux);
        const __m512 second = nq_has_min(TYPE) ? pair_f(load_f16x8(ua + 16), load_f16x8(ux + 16)) : _mm512_setzero_ps();
        __m512 unit_acc[offset_chains<TYPE>() ? R : 1];
        for (int r = 0; r < (offset_chains<TYPE>() ? R : 1); r++) unit_acc[r] = _mm512_setzero_ps();
        for (int j = 0; j < gpu; j++) {
            const int64_t g = b * gpu + j;
            const uint8_t* ga = group_at(TYPE, ua, j);
            const uint8_t* gb = group_at(TYPE, ux, j);
            __m512i w[8];
            if constexpr (!amx) pair_chunks<TYPE>(ga + nq_group_scales(TYPE), gb + nq_group_scales(TYPE), w);
            const int32_t* group_dots = dots[amx ? (b - b0) % batch_units * gpu + j : 0];
            if constexpr (offset_chains<TYPE>()) {
                const __m512i by0 = _mm512_cvtepi8_epi32(pair_bytes(ga, gb)), by1 = _mm512_cvtepi8_epi32(pair_bytes(ga + 8, gb + 8));
                for (int r = 0; r < R; r++) {
                    const int8_t* x = q + r * K + 32 * g;
                    const int32_t* from = ks + r * 2 * G + 2 * g;
                    const __m512i t = _mm512_add_epi32(_mm512_mullo_epi32(dot_chains<TYPE, 0, 4>(w, x, from[0]), by0),
                                                       _mm512_mullo_epi32(dot_chains<TYPE, 4, 8>(w, x, from[1]), by1));
                    unit_acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_set1_ps(d[r * G + g]), unit_acc[r]);
                }
            } else {
                __m512 A, B;
                pair_ab<TYPE>(dw, second, ga, gb, &A, &B);
                for (int r = 0; r < R; r++) {
                    __m512i sum = amx ? _mm512_load_si512((const __m512i*)(group_dots + 16 * r))
                                      : dot_chains<TYPE, 0, 8>(w, q + r * K + 32 * g);
                    if constexpr (int_offset<TYPE>() != 0) {
                        int32_t pair;  // the row's two sums of 16, each times the offset by vpmaddwd
                        memcpy(&pair, s + r * 2 * G + 2 * g, 4);
                        sum = _mm512_sub_epi32(sum, _mm512_madd_epi16(_mm512_set1_epi32(pair), _mm512_set1_epi16(int_offset<TYPE>())));
                    }
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(A, _mm512_set1_ps(d[r * G + g])), acc[r]);
                    if constexpr (nq_has_min(TYPE)) mins[r] = _mm512_fmadd_ps(B, _mm512_set1_ps(ds[r * G + g]), mins[r]);
                }
            }
        }
        if constexpr (offset_chains<TYPE>())
            for (int r = 0; r < R; r++) acc[r] = _mm512_fmadd_ps(unit_acc[r], dw, acc[r]);
    }
    if (PIECE && b1 < units) {
        for (int r = 0; r < R; r++) {
            _mm512_storeu_ps(carry + 32 * r, acc[r]);
            _mm512_storeu_ps(carry + 32 * r + 16, mins[r]);
        }
        return;
    }
    for (int r = 0; r < R; r++) {
        if constexpr (nq_has_min(TYPE)) acc[r] = _mm512_add_ps(acc[r], mins[r]);
        _mm512_storeu_ps(out + r * ldo, acc[r]);
    }
}

// pair_rows over two tiles' pieces in turn (qtypes.h)
template <int TYPE, int R>
static void pair_pieces(const TileAt& tile, const TileAt& next, int64_t K, const int8_t* q, const float* d,
                        const int16_t* s, const float* ds, const int32_t* ks, float* out, int64_t ldo,
                        const uint8_t* chunks = nullptr) {
    if (tile.pieces == 1) {
        pair_rows<TYPE, R>(tile.piece(0), next.piece(0) - tile.piece(0), K, q, d, s, ds, ks, out, ldo, 0, 0, nullptr,
                           chunks);
        return;
    }
    alignas(64) float carry[32 * R];
    for (int64_t p = 0; p < tile.pieces; p++) {
        const uint8_t* at = tile.piece(p);
        pair_rows<TYPE, R, true>(at - tile.start(p) * tile.ub, next.piece(p) - at, K, q, d, s, ds, ks, out, ldo,
                                 tile.start(p), tile.start(p + 1), carry, chunks);
    }
}
#endif

// The chains' starts of M activation rows (offset_chains): -k·s of each 16 values, in a buffer of the
// calling thread's that grows as needed (each ISA's and type's own); null if it cannot grow.
template <int TYPE>
static inline const int32_t* chain_starts(const int16_t* s, int64_t n) {
    static thread_local int32_t* held = nullptr;
    static thread_local int64_t size = 0;
    if (n > size) {
        int32_t* grown = (int32_t*)realloc(held, n * sizeof(int32_t));
        if (!grown) return nullptr;
        held = grown;
        size = n;
    }
    constexpr int k = TYPE == NQ_Q3_K ? 4 : 32;
    for (int64_t i = 0; i < n; i++) held[i] = -k * s[i];
    return held;
}

// tile_rows of activation rows m..m + R - 1, over the tile's pieces in turn (qtypes.h)
template <int TYPE, int R>
static inline void tile_step(const TileAt& tile, int64_t K, int64_t m, const int8_t* q, const float* d,
                             const int16_t* s, const float* ds, const int32_t* ks, float* o, int64_t ldo, int valid) {
    const int64_t G = K / 32;
    q += m * K, d += m * G, s += m * 2 * G, ds += m * G, ks = ks ? ks + m * 2 * G : ks, o += m * ldo;
    if (tile.pieces == 1) {
        tile_rows<TYPE, R>(tile.piece(0), K, q, d, s, ds, ks, o, ldo, valid);
        return;
    }
    alignas(64) float carry[16 * R];
    for (int64_t p = 0; p < tile.pieces; p++)
        tile_rows<TYPE, R, true>(tile.piece(p) - tile.start(p) * tile.ub, K, q, d, s, ds, ks, o, ldo, valid,
                                 tile.start(p), tile.start(p + 1), carry);
}

// Rows m..M-1 of one tile in the steps of 16 (VNNI), 8, 4 and fewer rows.
template <int TYPE>
static void gemm_rest(const TileAt& tile, int64_t K, int64_t m, const int8_t* q, const float* d, const int16_t* s,
                      const float* ds, const int32_t* ks, int64_t M, float* o, int64_t ldo, int valid) {
    // 8 rows a step, the weights' unpacking and scales shared by more of them (Q6_K's prefill +10%);
    // Q8_0 has none to share, and the 8 rows' registers slowed it by 5%. VNNI (32 vector registers):
    // 16, which took 3-7% off every type's 16 rows in L2 but Q2_K's (Zen 4, bench/kernels_ab.py)
    if constexpr (NQ_VNNI && TYPE != NQ_Q8_0)
        for (; m + 16 <= M; m += 16) tile_step<TYPE, 16>(tile, K, m, q, d, s, ds, ks, o, ldo, valid);
    for (; TYPE != NQ_Q8_0 && m + 8 <= M; m += 8) tile_step<TYPE, 8>(tile, K, m, q, d, s, ds, ks, o, ldo, valid);
    for (; m + 4 <= M; m += 4) tile_step<TYPE, 4>(tile, K, m, q, d, s, ds, ks, o, ldo, valid);
    switch (M - m) {
    case 3: tile_step<TYPE, 3>(tile, K, m, q, d, s, ds, ks, o, ldo, valid); break;
    case 2: tile_step<TYPE, 2>(tile, K, m, q, d, s, ds, ks, o, ldo, valid); break;
    case 1: tile_step<TYPE, 1>(tile, K, m, q, d, s, ds, ks, o, ldo, valid); break;
    }
}

#if NQ_AVX2
// One row times tiles t0..t1 of long rows (qtypes.h: groups of NQ_GROUP tiles kept piece by piece),
// in the order they are stored: piece p of each of the group's tiles in turn, each tile's sums
// carried to its next piece, so that piece p of the row stays in L1 while the tiles stream past.
// The same sums in the same order as a tile read whole: the same bits (tested). One row times
// 96000 x 8960 weights from memory, 2 threads, against whole tiles one after another: Q4_K 1.16x,
// Q5_K 1.07x, Q6_K 1.06x, Q4_0 1.11x, Q8_0 1.07x (Zen 4, bench/kernels_ab.py --against 0d8bc7d).
template <int TYPE>
static void long_row(const uint8_t* w, int64_t t0, int64_t t1, int64_t N, int64_t K, const int8_t* q,
                     const float* d, const int16_t* s, const float* ds, const int32_t* ks, float* out) {
    const int64_t tiles = (N + NQ_TILE - 1) / NQ_TILE, units = K / nq_block_elems(TYPE), pieces = nq_pieces(K);
    constexpr int64_t ub = nq_unit_bytes(TYPE);
    alignas(64) float carry[16 * NQ_GROUP];
    for (int64_t g0 = t0 - t0 % NQ_GROUP; g0 < t1; g0 += NQ_GROUP) {
        const int64_t lo = t0 > g0 ? t0 : g0, hi = t1 < g0 + NQ_GROUP ? t1 : g0 + NQ_GROUP;
        for (int64_t p = 0; p < pieces; p++) {
            const int64_t b0 = nq_piece_start(units, pieces, p), b1 = nq_piece_start(units, pieces, p + 1);
            // piece p of tile g0, then of g0 + 1, ..., each (b1 - b0) units; as tile_rows takes them
            const uint8_t* region = w + nq_piece_at(g0, p, tiles, units, pieces, ub) - b0 * ub;
            for (int64_t t = lo; t < hi; t++)
                tile_rows<TYPE, 1, true>(region + (t - g0) * (b1 - b0) * ub, K, q, d, s, ds, ks, out + t * NQ_TILE, 0,
                                         (int)(N - t * NQ_TILE < NQ_TILE ? N - t * NQ_TILE : NQ_TILE), b0, b1,
                                         carry + 16 * (t - g0));
        }
    }
}
#endif

// Tiles t0..t1 times M rows; -1 if the chains' starts could not be held.
template <int TYPE>
static int gemm_type(const uint8_t* w, int64_t t0, int64_t t1, int64_t N, int64_t K, const int8_t* q,
                     const float* d, const int16_t* s, const float* ds, int64_t M, float* out, int64_t ldo) {
    const int64_t G = K / 32, tiles = (N + NQ_TILE - 1) / NQ_TILE, pieces = nq_pieces(K);
    const int32_t* ks = nullptr;
    if constexpr (offset_chains<TYPE>())
        if (!(ks = chain_starts<TYPE>(s, M * 2 * G))) return -1;
#if NQ_AVX2
    if (M == 1 && pieces > 1) {
        long_row<TYPE>(w, t0, t1, N, K, q, d, s, ds, ks, out);
        return 0;
    }
#endif
    const auto tile_at = [&](int64_t t) {
        return TileAt{w, t, tiles, K / nq_block_elems(TYPE), pieces, nq_unit_bytes(TYPE)};
    };
#if NQ_AMX
    const bool tiles_on = pairs<TYPE>() && amx_pairs<TYPE>() && M >= 16;  // this thread's tile registers, for this call
    if (tiles_on) amx_configure();
#endif
    for (int64_t t = t0; t < t1; t++) {
        const TileAt tile = tile_at(t);
        const int valid = (int)(N - t * NQ_TILE < NQ_TILE ? N - t * NQ_TILE : NQ_TILE);
        float* o = out + t * NQ_TILE;
        int64_t m = 0;
#if NQ_VNNI
        // two whole tiles, 16 rows a step (pair_rows); what is left of M in the 8-row steps below, a tile at a time
        if constexpr (pairs<TYPE>()) {
            if (M >= 16 && t + 1 < t1 && N - t * NQ_TILE >= 2 * NQ_TILE) {
                const TileAt next = tile_at(t + 1);
                const uint8_t* chunks = nullptr;
#if NQ_AMX
                if (amx_pairs<TYPE>() && M >= AMX_SHARED) chunks = amx_pair_chunks<TYPE>(tile, next, K);
#endif
                for (; m + 16 <= M; m += 16)
                    pair_pieces<TYPE, 16>(tile, next, K, q + m * K, d + m * G, s + m * 2 * G, ds + m * G,
                                          ks ? ks + m * 2 * G : ks, o + m * ldo, ldo, chunks);
                gemm_rest<TYPE>(tile, K, m, q, d, s, ds, ks, M, o, ldo, NQ_TILE);
                gemm_rest<TYPE>(next, K, m, q, d, s, ds, ks, M, o + NQ_TILE, ldo, NQ_TILE);
                t++;
                continue;
            }
        }
#endif
        gemm_rest<TYPE>(tile, K, m, q, d, s, ds, ks, M, o, ldo, valid);
    }
#if NQ_AMX
    if (tiles_on) _tile_release();
#endif
    return 0;
}

// Whether this file's kernels request weights ahead on this CPU (ahead_on).
bool prefetching() { return ahead_on; }

// Tiles t0..t1 of a repacked (N rows, K values) weight times M quantized activation rows:
// out[m·ldo + n]. Returns 0; -1 where a buffer could not be had; -2 for a type this file does not know.
int gemm(int type, const uint8_t* w, int64_t t0, int64_t t1, int64_t N, int64_t K, const int8_t* q,
         const float* d, const int16_t* s, const float* ds, int64_t M, float* out, int64_t ldo) {
    switch (type) {
#define NQ_GEMM_CASE(T) case T: return gemm_type<T>(w, t0, t1, N, K, q, d, s, ds, M, out, ldo);
        NQ_EACH_TYPE(NQ_GEMM_CASE)
#undef NQ_GEMM_CASE
    }
    return -2;
}

#if NQ_AVX2
static inline int hsum_epi32(__m256i v) {
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    return _mm_cvtsi128_si32(h);
}
#endif

// One row of K floats to int8 per group of 32 (scale = max |x| / 127, rounded to nearest even),
// the sums of each 16 of the int8 values and d times each group's sum. AVX2: the same operations
// 8 lanes at a time (max, the one product, rounding to nearest even), so the same bits.
void quantize_row(const float* x, int64_t K, int8_t* q, float* d, int16_t* s, float* ds) {
#if NQ_AVX2
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // packs' lanes back in order
    for (int64_t g = 0; g < K / 32; g++) {
        const float* xg = x + 32 * g;
        __m256 v[4];
        __m256 top = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(xg + 8 * i);
            top = _mm256_max_ps(top, _mm256_andnot_ps(sign, v[i]));
        }
        __m128 t = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
        t = _mm_max_ps(t, _mm_movehl_ps(t, t));
        t = _mm_max_ss(t, _mm_movehdup_ps(t));
        const float amax = _mm_cvtss_f32(t);
        const __m256 inv = _mm256_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
        __m256i n[4];
        for (int i = 0; i < 4; i++)
            n[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const int sa = hsum_epi32(_mm256_add_epi32(n[0], n[1])), sb = hsum_epi32(_mm256_add_epi32(n[2], n[3]));
        const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(n[0], n[1]), _mm256_packs_epi32(n[2], n[3]));
        _mm256_storeu_si256((__m256i*)(q + 32 * g), _mm256_permutevar8x32_epi32(bytes, order));
        d[g] = amax / 127.0f;
        s[2 * g] = (int16_t)sa;
        s[2 * g + 1] = (int16_t)sb;
        ds[g] = d[g] * (float)(sa + sb);
    }
#else
    for (int64_t g = 0; g < K / 32; g++) {
        const float* xg = x + 32 * g;
        int8_t* qg = q + 32 * g;
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xg[i]));
        const float inv = amax > 0 ? 127.0f / amax : 0.0f;
        int sa = 0, sb = 0;
        for (int i = 0; i < 32; i++) {
            qg[i] = (int8_t)nearbyintf(xg[i] * inv);
            (i < 16 ? sa : sb) += qg[i];
        }
        d[g] = amax / 127.0f;
        s[2 * g] = (int16_t)sa;
        s[2 * g + 1] = (int16_t)sb;
        ds[g] = d[g] * (float)(sa + sb);
    }
#endif
}

// act(gate)·up over n values: silu(g)·u, or gelu-tanh(g)·u written g·σ(2t) with t = c·(g + 0.044715·g³)
// (0.5·(1 + tanh t) is σ(2t)), both g / (1 + e^(-z)). e^x is Cephes' expf: x = k·ln2 + r, |r| <=
// ln2/2, a degree-6 polynomial in r, times 2^k by adding k to the exponent bits; x clamped to
// [-87, 88], where 2^k stays a normal float (a NaN passes the clamp and comes out NaN). AVX2 and the
// portable path run the same float operations, an fma wherever there is one and no product left for
// the compiler to fuse into a sum, so their bits are the same (tested).
static const float EXP_LO = -87.0f, EXP_HI = 88.0f, LOG2E = 1.44269504088896341f, LN2_HI = 0.693359375f,
                   LN2_LO = -2.12194440e-4f, GELU_C2 = -1.5957691216057308f;  // -2·sqrt(2/π)
static const float EXP_POLY[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                  4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

static inline float gated_one(float g, float u, bool gelu) {
    // z = -g (silu) or -2c·(g + 0.044715·g³) (gelu-tanh); the clamp as vminps / vmaxps take a NaN
    float z = gelu ? GELU_C2 * fmaf(g * g * 0.044715f, g, g) : -g;
    z = EXP_HI < z ? EXP_HI : z;
    z = EXP_LO > z ? EXP_LO : z;
    const float k = nearbyintf(z * LOG2E);
    float r = fmaf(k, -LN2_HI, z);
    r = fmaf(k, -LN2_LO, r);
    float y = EXP_POLY[0];
    for (int i = 1; i < 6; i++) y = fmaf(y, r, EXP_POLY[i]);
    y = fmaf(y, r * r, r) + 1.0f;
    uint32_t bits;
    memcpy(&bits, &y, 4);
    bits += (uint32_t)(k == k ? (int32_t)k : INT32_MIN) << 23;  // vcvtps2dq's NaN: 0x80000000
    memcpy(&y, &bits, 4);
    return g / (1.0f + y) * u;
}

void gate_range(const float* gate, const float* up, int64_t n, bool gelu, float* out) {
    int64_t i = 0;
#if NQ_AVX2
    const __m256 lo = _mm256_set1_ps(EXP_LO), hi = _mm256_set1_ps(EXP_HI), one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        __m256 z = gelu ? _mm256_mul_ps(_mm256_set1_ps(GELU_C2),
                                        _mm256_fmadd_ps(_mm256_mul_ps(_mm256_mul_ps(g, g), _mm256_set1_ps(0.044715f)), g, g))
                        : _mm256_xor_ps(g, _mm256_set1_ps(-0.0f));
        z = _mm256_min_ps(hi, z);
        z = _mm256_max_ps(lo, z);
        const __m256 k = _mm256_round_ps(_mm256_mul_ps(z, _mm256_set1_ps(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256 r = _mm256_fmadd_ps(k, _mm256_set1_ps(-LN2_HI), z);
        r = _mm256_fmadd_ps(k, _mm256_set1_ps(-LN2_LO), r);
        __m256 y = _mm256_set1_ps(EXP_POLY[0]);
        for (int j = 1; j < 6; j++) y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EXP_POLY[j]));
        y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r), one);
        y = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(y), _mm256_slli_epi32(_mm256_cvtps_epi32(k), 23)));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, y)), _mm256_loadu_ps(up + i)));
    }
#endif
    for (; i < n; i++) out[i] = gated_one(gate[i], up[i], gelu);
}

// Attention of one query row over S keys: out (D) = softmax(q·kᵀ · scale) · v, key and value rows
// ldk / ldv floats apart; scores (S) is scratch. Scores are shifted by their max before exp, as
// every softmax here is.
#if NQ_AVX2
static inline float dot_f32(const float* a, const float* b, int64_t D) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= D; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float sum = _mm_cvtss_f32(h);
    for (; i < D; i++) sum += a[i] * b[i];
    return sum;
}

static inline void axpy_f32(float a, const float* x, float* y, int64_t D) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= D; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < D; i++) y[i] += a * x[i];
}
#else
static inline float dot_f32(const float* a, const float* b, int64_t D) {
    float sum = 0;
    for (int64_t i = 0; i < D; i++) sum += a[i] * b[i];
    return sum;
}

static inline void axpy_f32(float a, const float* x, float* y, int64_t D) {
    for (int64_t i = 0; i < D; i++) y[i] += a * x[i];
}
#endif

void attend_row(const float* q, const float* k, const float* v, int64_t ldk, int64_t ldv, int64_t S, int64_t D,
                float scale, float sink, float* scores, float* out) {
    // sink: a logit that joins the softmax with no value (gpt-oss's attention sinks; -inf: none)
    float top = sink;
    for (int64_t j = 0; j < S; j++) {
        scores[j] = dot_f32(q, k + j * ldk, D) * scale;
        top = fmaxf(top, scores[j]);
    }
    float total = sink == -INFINITY ? 0.0f : expf(sink - top);
    for (int64_t j = 0; j < S; j++) total += (scores[j] = expf(scores[j] - top));
    for (int64_t i = 0; i < D; i++) out[i] = 0;
    for (int64_t j = 0; j < S; j++) axpy_f32(scores[j], v + j * ldv, out, D);
    const float inv = 1.0f / total;
    for (int64_t i = 0; i < D; i++) out[i] *= inv;
}

}  // namespace NQ_NS
