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
    case NQ_Q4_0: return {0, -1, -1, 2, -1};
    case NQ_Q4_1: return {0, 2, -1, 4, -1};
    case NQ_Q5_0: return {0, -1, 2, 6, -1};
    case NQ_Q5_1: return {0, 2, 4, 8, -1};
    case NQ_Q8_0: return {0, -1, -1, 2, -1};
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

// Element e of group j of a file block: where its low 4 bits are (byte, shift), and its high
// bits (byte, shift, width); Q8_0 aside (a plain byte).
struct Place {
    int lo_byte, lo_shift, hi_byte, hi_shift, hi_bits;
};

Place place(int type, int j, int e) {
    const FileLayout f = file_layout(type);
    switch (type) {
    case NQ_Q4_0: case NQ_Q4_1: case NQ_Q5_0: case NQ_Q5_1:
        return {f.qs + e % 16, e < 16 ? 0 : 4, f.qh + e / 8, e % 8, nq_has5(type) ? 1 : 0};
    case NQ_Q4_K: case NQ_Q5_K:
        return {f.qs + 32 * (j / 2) + e, (j & 1) ? 4 : 0, f.qh + e, j, type == NQ_Q5_K ? 1 : 0};
    default: {  // Q6_K
        const int h = j / 4, s = j % 4;
        return {f.qs + 64 * h + 32 * (s & 1) + e, (s & 2) ? 4 : 0, f.qh + 32 * h + e, 2 * s, 2};
    }
    }
}

}  // namespace

// raw (N, bytes per row) file blocks -> tiles of 8 rows (zero rows past N).
void repack(int type, const uint8_t* raw, int64_t N, int64_t K, uint8_t* out) {
    const int64_t units = K / nq_block_elems(type), row_bytes = units * nq_block_bytes(type);
    const int64_t tiles = (N + NQ_TILE - 1) / NQ_TILE, ub = nq_unit_bytes(type);
    const FileLayout f = file_layout(type);
    const int gpu = nq_block_elems(type) / 32;
    memset(out, 0, tiles * units * ub);
    for (int64_t n = 0; n < N; n++) {
        const int r = (int)(n % NQ_TILE);
        for (int64_t b = 0; b < units; b++) {
            const uint8_t* blk = raw + n * row_bytes + b * nq_block_bytes(type);
            uint8_t* unit = out + (n / NQ_TILE * units + b) * ub;
            memcpy(unit + 2 * r, blk + f.d, 2);
            if (f.second >= 0) memcpy(unit + 16 + 2 * r, blk + f.second, 2);
            for (int j = 0; j < gpu; j++) {
                uint8_t* gs = unit + nq_header(type) + j * (nq_group_scales(type) + nq_planes(type));
                uint8_t* p = gs + nq_group_scales(type);
                if (type == NQ_Q4_K || type == NQ_Q5_K) {
                    int sc, mn;
                    scale_min_k4(blk + f.scales, j, &sc, &mn);
                    gs[r] = (uint8_t)sc;
                    gs[8 + r] = (uint8_t)mn;
                } else if (type == NQ_Q6_K) {
                    gs[r] = blk[f.scales + 2 * j];
                    gs[8 + r] = blk[f.scales + 2 * j + 1];
                }
                for (int e = 0; e < 32; e++) {
                    const int c = e / 4, at = 4 * r + e % 4;
                    if (type == NQ_Q8_0) {
                        p[32 * c + at] = blk[f.qs + e];
                        continue;
                    }
                    const Place pl = place(type, j, e);
                    const int lo = (blk[pl.lo_byte] >> pl.lo_shift) & 0xf;
                    const int hi = pl.hi_bits ? (blk[pl.hi_byte] >> pl.hi_shift) & ((1 << pl.hi_bits) - 1) : 0;
                    p[32 * (c & 3) + at] |= (uint8_t)(lo << (c < 4 ? 0 : 4));
                    if (nq_has5(type)) p[128 + at] |= (uint8_t)(hi << c);
                    if (type == NQ_Q6_K) p[128 + 32 * (c / 4) + at] |= (uint8_t)(hi << (2 * (c & 3)));
                }
            }
        }
    }
}

// Tiles back to the file's own bytes for rows (n,): exactly what repack was given.
void unpack_rows(int type, const uint8_t* w, int64_t K, const int64_t* rows, int64_t n, uint8_t* out) {
    const int64_t units = K / nq_block_elems(type), row_bytes = units * nq_block_bytes(type);
    const int64_t ub = nq_unit_bytes(type);
    const FileLayout f = file_layout(type);
    const int gpu = nq_block_elems(type) / 32;
    memset(out, 0, n * row_bytes);
    for (int64_t i = 0; i < n; i++) {
        const int r = (int)(rows[i] % NQ_TILE);
        for (int64_t b = 0; b < units; b++) {
            const uint8_t* unit = w + (rows[i] / NQ_TILE * units + b) * ub;
            uint8_t* blk = out + i * row_bytes + b * nq_block_bytes(type);
            memcpy(blk + f.d, unit + 2 * r, 2);
            if (f.second >= 0) memcpy(blk + f.second, unit + 16 + 2 * r, 2);
            int sc[8], mn[8];
            for (int j = 0; j < gpu; j++) {
                const uint8_t* gs = group_at(type, unit, j);
                if (type == NQ_Q4_K || type == NQ_Q5_K) {
                    sc[j] = gs[r];
                    mn[j] = gs[8 + r];
                } else if (type == NQ_Q6_K) {
                    blk[f.scales + 2 * j] = gs[r];
                    blk[f.scales + 2 * j + 1] = gs[8 + r];
                }
                for (int e = 0; e < 32; e++) {
                    const int u = unit_value(type, unit, r, j, e);
                    if (type == NQ_Q8_0) {
                        blk[f.qs + e] = (uint8_t)u;
                        continue;
                    }
                    const Place pl = place(type, j, e);
                    blk[pl.lo_byte] |= (uint8_t)((u & 0xf) << pl.lo_shift);
                    if (pl.hi_bits) blk[pl.hi_byte] |= (uint8_t)((u >> 4) << pl.hi_shift);
                }
            }
            if (type == NQ_Q4_K || type == NQ_Q5_K) pack_scale_min_k4(sc, mn, blk + f.scales);
        }
    }
}

// Rows (n,) of a repacked weight as floats: out[i·K + k].
void dequantize_rows(int type, const uint8_t* w, int64_t K, const int64_t* rows, int64_t n, float* out) {
    const int64_t units = K / nq_block_elems(type), ub = nq_unit_bytes(type);
    const int gpu = nq_block_elems(type) / 32;
    for (int64_t i = 0; i < n; i++) {
        const int r = (int)(rows[i] % NQ_TILE);
        float* o = out + i * K;
        for (int64_t b = 0; b < units; b++) {
            const uint8_t* unit = w + (rows[i] / NQ_TILE * units + b) * ub;
            for (int j = 0; j < gpu; j++)
                for (int e = 0; e < 32; e++) *o++ = unit_float(type, unit, r, j, e);
        }
    }
}
}  // namespace nq_generic
