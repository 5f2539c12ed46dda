// The portable path (plain C++, whatever the compiler's baseline vectorises), plus what runs once
// per weight and needs no speed: repacking the file's blocks into tiles (qtypes.h), back, and
// dequantizing rows.
#define NQ_NS nq_generic
#define NQ_AVX2 0
#define NQ_VNNI 0
#include "qkern.h"

namespace nq_generic {
namespace {

// Where a file block keeps its parts (ggml's block_* structs).
struct FileLayout {
    int d, second, qh, qs, scales;  // byte offsets; -1 where the type has none
};

FileLayout file_layout(int type) {
    switch (type) {
    case NQ_Q4_0: case NQ_IQ4_NL: return {0, -1, -1, 2, -1};
    case NQ_Q4_1: return {0, 2, -1, 4, -1};
    case NQ_Q5_0: return {0, -1, 2, 6, -1};
    case NQ_Q5_1: return {0, 2, 4, 8, -1};
    case NQ_Q8_0: return {0, -1, -1, 2, -1};
    case NQ_MXFP4: return {0, -1, -1, 1, -1};     // d: the E8M0 byte e
    case NQ_Q2_K: return {80, 82, -1, 16, 0};     // scales 0, qs 16, d 80, dmin 82
    case NQ_Q3_K: return {108, -1, 0, 32, 96};    // hmask 0, qs 32, scales 96, d 108
    case NQ_IQ4_XS: return {0, -1, -1, 8, 2};     // d 0, scales_h 2, scales_l 4, qs 8
    case NQ_Q4_K: return {0, 2, -1, 16, 4};
    case NQ_Q5_K: return {0, 2, 16, 48, 4};
    default: return {208, -1, 128, 0, 192};  // Q6_K: ql 0, qh 128, scales 192, d 208
    }
}

// Q4_K / Q5_K: the j-th 6-bit scale and min of the 12 packed bytes (j < 4: low 6 bits of bytes
// j and j + 4; j >= 4: a nibble of byte j + 4 and the top 2 bits of bytes j - 4 and j)
void scale_min_k4(const uint8_t* q, int j, int* sc, int* mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

void pack_scale_min_k4(const int* sc, const int* mn, uint8_t* q) {
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        q[j + 4] = (uint8_t)((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
        q[j + 8] = (uint8_t)((sc[j + 4] & 0xf) | ((mn[j + 4] & 0xf) << 4));
    }
}

// A value split over a file block: its low bits at (lo_byte, lo_shift), the bits above them at
// (hi_byte, hi_shift).
struct Place {
    int lo_byte, lo_shift, hi_byte, hi_shift;
};

int get_split(const uint8_t* blk, Place p, int lo_bits, int hi_bits) {
    const int lo = (blk[p.lo_byte] >> p.lo_shift) & ((1 << lo_bits) - 1);
    return hi_bits ? lo | ((blk[p.hi_byte] >> p.hi_shift) & ((1 << hi_bits) - 1)) << lo_bits : lo;
}

void put_split(uint8_t* blk, Place p, int lo_bits, int hi_bits, int v) {  // into a zeroed block
    blk[p.lo_byte] |= (uint8_t)((v & ((1 << lo_bits) - 1)) << p.lo_shift);
    if (hi_bits) blk[p.hi_byte] |= (uint8_t)((v >> lo_bits) << p.hi_shift);
}

// Element e of group j of a file block: its code's nq_low_bits and nq_high_bits.
Place place(int type, int j, int e) {
    const FileLayout f = file_layout(type);
    switch (type) {
    case NQ_Q8_0: return {f.qs + e, 0, -1, 0};
    case NQ_IQ4_XS: return {f.qs + 16 * j + e % 16, e < 16 ? 0 : 4, -1, 0};
    case NQ_Q2_K: case NQ_Q3_K: return {f.qs + 32 * (j / 4) + e, 2 * (j % 4), f.qh + e, j};
    case NQ_Q4_K: case NQ_Q5_K: return {f.qs + 32 * (j / 2) + e, (j & 1) ? 4 : 0, f.qh + e, j};
    case NQ_Q6_K: {
        const int h = j / 4, s = j % 4;
        return {f.qs + 64 * h + 32 * (s & 1) + e, (s & 2) ? 4 : 0, f.qh + 32 * h + e, 2 * s};
    }
    default:  // Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4: 16 bytes of nibbles (and 32 5th bits)
        return {f.qs + e % 16, e < 16 ? 0 : 4, f.qh + e / 8, e % 8};
    }
}

// Q3_K's i-th scale (of 16) and IQ4_XS's (of 8): 6 bits, as 4 + 2 (see the gguf package's layout).
Place six_bit_scale(int type, int i) {
    const int at = file_layout(type).scales;
    return type == NQ_Q3_K ? Place{at + i % 8, 4 * (i / 8), at + 8 + i % 4, 2 * (i / 4)}
                           : Place{at + 2 + i / 2, 4 * (i % 2), at + i / 4, 2 * (i % 4)};
}

// Group j's scales from a file block into row r's bytes of the unit's group scales gs.
void scales_to_unit(int type, const uint8_t* blk, int j, uint8_t* gs, int r) {
    const FileLayout f = file_layout(type);
    switch (type) {
    case NQ_Q4_K: case NQ_Q5_K: {
        int sc, mn;
        scale_min_k4(blk + f.scales, j, &sc, &mn);
        gs[r] = (uint8_t)sc;
        gs[8 + r] = (uint8_t)mn;
        break;
    }
    case NQ_Q2_K: case NQ_Q6_K:  // a byte per 16 values
        gs[r] = blk[f.scales + 2 * j];
        gs[8 + r] = blk[f.scales + 2 * j + 1];
        break;
    case NQ_Q3_K:
        gs[r] = (uint8_t)(get_split(blk, six_bit_scale(type, 2 * j), 4, 2) - 32);
        gs[8 + r] = (uint8_t)(get_split(blk, six_bit_scale(type, 2 * j + 1), 4, 2) - 32);
        break;
    case NQ_IQ4_XS:
        gs[r] = (uint8_t)(get_split(blk, six_bit_scale(type, j), 4, 2) - 32);
        break;
    }
}

// The reverse, into a zeroed block (Q4_K / Q5_K: collected in sc, mn and packed once all are).
void scales_to_file(int type, const uint8_t* gs, int r, int j, uint8_t* blk, int* sc, int* mn) {
    const FileLayout f = file_layout(type);
    switch (type) {
    case NQ_Q4_K: case NQ_Q5_K:
        sc[j] = gs[r];
        mn[j] = gs[8 + r];
        break;
    case NQ_Q2_K: case NQ_Q6_K:
        blk[f.scales + 2 * j] = gs[r];
        blk[f.scales + 2 * j + 1] = gs[8 + r];
        break;
    case NQ_Q3_K:
        put_split(blk, six_bit_scale(type, 2 * j), 4, 2, (int8_t)gs[r] + 32);
        put_split(blk, six_bit_scale(type, 2 * j + 1), 4, 2, (int8_t)gs[8 + r] + 32);
        break;
    case NQ_IQ4_XS:
        put_split(blk, six_bit_scale(type, j), 4, 2, (int8_t)gs[r] + 32);
        break;
    }
}

// Row r's code u of element e into a unit's zeroed group planes p (unit_code reads it back).
void put_unit_code(int type, uint8_t* p, int r, int e, int u) {
    const int c = e / 4, at = 4 * r + e % 4, lo = nq_low_bits(type), hi = nq_high_bits(type);
    p[32 * nq_plane_vector(lo, c) + at] |= (uint8_t)((u & ((1 << lo) - 1)) << nq_plane_shift(lo, c));
    if (hi) p[32 * (lo + nq_plane_vector(hi, c)) + at] |= (uint8_t)((u >> lo) << nq_plane_shift(hi, c));
}

int header_bytes(int type) { return type == NQ_MXFP4 ? 1 : 2; }  // per row: d f16, or e


// Group j's 32 codes of row r from a file block into a unit's zeroed planes p. Where the low bits
// are whole bytes (Q8_0) or nibbles the planes take 4 bytes at a time: a nibble type whose file byte
// holds values e and e + 16 (Q4_0's layout) is the planes' own byte; one whose values e run over
// 32 bytes at one shift (the K types) pairs two of them. Other bits go a value at a time.
template <int type>
void codes_to_unit(const uint8_t* blk, int j, uint8_t* p, int r) {
    constexpr int lo = nq_low_bits(type), hi = nq_high_bits(type);
    const Place first = place(type, j, 0), second = place(type, j, 16);
    if constexpr (lo == 8) {
        for (int c = 0; c < 8; c++) memcpy(p + 32 * c + 4 * r, blk + first.lo_byte + 4 * c, 4);
    } else if constexpr (lo == 4) {
        const uint8_t* src = blk + first.lo_byte;
        if (second.lo_byte == first.lo_byte && first.lo_shift == 0 && second.lo_shift == 4) {
            for (int c = 0; c < 4; c++) memcpy(p + 32 * c + 4 * r, src + 4 * c, 4);
        } else {
            const int sh = first.lo_shift;
            for (int c = 0; c < 4; c++)
                for (int i = 0; i < 4; i++)
                    p[32 * c + 4 * r + i] = (uint8_t)(((src[4 * c + i] >> sh) & 15) |
                                                      (((src[16 + 4 * c + i] >> sh) & 15) << 4));
        }
    } else {
        for (int e = 0; e < 32; e++) put_unit_code(type, p, r, e, get_split(blk, place(type, j, e), lo, hi));
        return;
    }
    for (int e = 0; hi && e < 32; e++) {  // the high bits, into their planes after the low ones
        const Place at = place(type, j, e);
        const int c = e / 4, u = (blk[at.hi_byte] >> at.hi_shift) & ((1 << hi) - 1);
        p[32 * (lo + nq_plane_vector(hi, c)) + 4 * r + e % 4] |= (uint8_t)(u << nq_plane_shift(hi, c));
    }
}

// Unit b of row n's tile in a matrix of N rows (qtypes.h), from w, the matrix's first tile.
template <typename Byte>
Byte* unit_of(Byte* w, int type, int64_t N, int64_t K, int64_t n, int64_t b) {
    const int64_t units = K / nq_block_elems(type);
    return w + nq_unit_at(n / NQ_TILE, b, (N + NQ_TILE - 1) / NQ_TILE, units, nq_pieces(K), nq_unit_bytes(type));
}

// Tile t of a weight from the file's blocks, the type a constant, so that the element loop's
// layout switches fold away (a switch per element made loading the default model's 135M values
// take 0.67 s).
template <int TYPE>
void repack_tile(const uint8_t* raw, int64_t N, int64_t K, uint8_t* out, int64_t t) {
    constexpr int type = TYPE;
    const int64_t units = K / nq_block_elems(type), row_bytes = units * nq_block_bytes(type);
    const FileLayout f = file_layout(type);
    constexpr int gpu = nq_block_elems(type) / 32;
    const int hb = header_bytes(type);
    for (int64_t b = 0; b < units; b++) memset(unit_of(out, type, N, K, t * NQ_TILE, b), 0, nq_unit_bytes(type));
    for (int64_t n = t * NQ_TILE; n < N && n < (t + 1) * NQ_TILE; n++) {
        const int r = (int)(n % NQ_TILE);
        for (int64_t b = 0; b < units; b++) {
            const uint8_t* blk = raw + n * row_bytes + b * nq_block_bytes(type);
            uint8_t* unit = unit_of(out, type, N, K, n, b);
            memcpy(unit + hb * r, blk + f.d, hb);
            if (f.second >= 0) memcpy(unit + 16 + 2 * r, blk + f.second, 2);
            for (int j = 0; j < gpu; j++) {
                uint8_t* gs = unit + nq_header(type) + j * (nq_group_scales(type) + nq_planes(type));
                scales_to_unit(type, blk, j, gs, r);
                codes_to_unit<type>(blk, j, gs + nq_group_scales(type), r);
            }
        }
    }
}

// The matrix of N rows (of those stacked one after another from w) that holds row `row`, and the
// row's place in it.
const uint8_t* matrix_of(const uint8_t* w, int type, int64_t N, int64_t K, int64_t* row) {
    const int64_t m = *row / N, tiles = (N + NQ_TILE - 1) / NQ_TILE;
    *row %= N;
    return w + m * tiles * nq_tile_bytes(type, K);
}

}  // namespace

// raw (N, bytes per row) file blocks -> a matrix of N rows in tiles of 8 rows (zero rows past N),
// the tiles shared out among the threads.
void repack(int type, const uint8_t* raw, int64_t N, int64_t K, uint8_t* out) {
    const int64_t tiles = (N + NQ_TILE - 1) / NQ_TILE;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        switch (type) {
#define NQ_REPACK_CASE(T) case T: repack_tile<T>(raw, N, K, out, t); break;
        NQ_EACH_TYPE(NQ_REPACK_CASE)
#undef NQ_REPACK_CASE
        }
    }
}

// Tiles back to the file's own bytes for rows (n,) of matrices of N rows each: exactly what repack
// was given.
void unpack_rows(int type, const uint8_t* w, int64_t N, int64_t K, const int64_t* rows, int64_t n, uint8_t* out) {
    const int64_t units = K / nq_block_elems(type), row_bytes = units * nq_block_bytes(type);
    const FileLayout f = file_layout(type);
    const int gpu = nq_block_elems(type) / 32, hb = header_bytes(type);
    memset(out, 0, n * row_bytes);
    for (int64_t i = 0; i < n; i++) {
        int64_t row = rows[i];
        const uint8_t* matrix = matrix_of(w, type, N, K, &row);
        const int r = (int)(row % NQ_TILE);
        for (int64_t b = 0; b < units; b++) {
            const uint8_t* unit = unit_of(matrix, type, N, K, row, b);
            uint8_t* blk = out + i * row_bytes + b * nq_block_bytes(type);
            memcpy(blk + f.d, unit + hb * r, hb);
            if (f.second >= 0) memcpy(blk + f.second, unit + 16 + 2 * r, 2);
            int sc[8], mn[8];
            for (int j = 0; j < gpu; j++) {
                scales_to_file(type, group_at(type, unit, j), r, j, blk, sc, mn);
                for (int e = 0; e < 32; e++)
                    put_split(blk, place(type, j, e), nq_low_bits(type), nq_high_bits(type),
                              unit_code(type, unit, r, j, e));
            }
            if (type == NQ_Q4_K || type == NQ_Q5_K) pack_scale_min_k4(sc, mn, blk + f.scales);
        }
    }
}

// Rows (n,) of a repacked weight (matrices of N rows each) as floats: out[i·K + k].
void dequantize_rows(int type, const uint8_t* w, int64_t N, int64_t K, const int64_t* rows, int64_t n, float* out) {
    const int64_t units = K / nq_block_elems(type);
    const int gpu = nq_block_elems(type) / 32;
    for (int64_t i = 0; i < n; i++) {
        int64_t row = rows[i];
        const uint8_t* matrix = matrix_of(w, type, N, K, &row);
        const int r = (int)(row % NQ_TILE);
        float* o = out + i * K;
        for (int64_t b = 0; b < units; b++) {
            const uint8_t* unit = unit_of(matrix, type, N, K, row, b);
            for (int j = 0; j < gpu; j++)
                for (int e = 0; e < 32; e++) *o++ = unit_float(type, unit, r, j, e);
        }
    }
}
}  // namespace nq_generic
