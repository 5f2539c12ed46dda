// GGUF block types the kernels run (by their ggml type numbers), each file block's size, and the
// layout the weights are repacked into at load: tiles of 8 rows, so that one 256-bit register
// holds 4 consecutive weights of each of 8 rows and the int8 dot products give 8 outputs at once.
//
// A tile is a run of units, one per file block (32 values, or 256 for the K types and IQ4_XS). A
// unit is a header, then per group of 32 values its scale bytes and its weight planes:
//
//   type    header (8 rows each)    per group (8 rows)          planes per group (8 rows)
//   Q4_0    d f16                    -                           nibbles 128
//   Q4_1    d, m f16                 -                           nibbles 128
//   Q5_0    d f16                    -                           nibbles 128, 5th bits 32
//   Q5_1    d, m f16                 -                           nibbles 128, 5th bits 32
//   Q8_0    d f16                    -                           bytes 256
//   IQ4_NL  d f16                    -                           nibbles 128 (codebook indices)
//   MXFP4   e (E8M0 byte)            -                           nibbles 128 (codebook indices)
//   Q2_K    d, dmin f16              per 16: sc | mn << 4        low 2 bits 64
//   Q3_K    d f16                    per 16: sc - 32 int8        low 2 bits 64, 3rd bits 32
//   Q4_K    d, dmin f16              sc, mn int8 (6-bit)         nibbles 128
//   Q5_K    d, dmin f16              sc, mn int8                 nibbles 128, 5th bits 32
//   Q6_K    d f16                    per 16: sc int8             nibbles 128, top 2 bits 64
//   IQ4_XS  d f16                    ls - 32 int8                nibbles 128 (codebook indices)
//
// A plane of b bits per value is b vectors of 32 bytes, byte 4r + i of each holding row r's
// values 4c + i of 8 / b chunks c, b bits apiece (nq_plane_vector, nq_plane_shift):
//   nibbles (b = 4)  vector c % 4, bits 4(c / 4): vector j holds 4j + i (low), 16 + 4j + i (high)
//   2 bits  (b = 2)  vector c / 4, bits 2(c % 4)
//   1 bit   (b = 1)  the one vector, bit c
//   bytes   (b = 8)  vector c (Q8_0's signed bytes)
// A type's planes are its low bits (nq_low_bits), then its high bits: u = low | high << low bits;
// a codebook type's u indexes its table. Per-16 scales: byte r for row r's values 0..15 of the
// group, byte 8 + r for 16..31.
// So chunk c (values 4c..4c+3 of every row) is a shift and an and away (and an or for high
// bits, a vpshufb for a codebook). The bytes held match the file's within 4% (Q3_K: 114 per 256 values instead of 110; Q4_K 148 for 144; IQ4_XS 138 for 136).
#pragma once

#include <stdint.h>

enum {
    NQ_Q4_0 = 2, NQ_Q4_1 = 3, NQ_Q5_0 = 6, NQ_Q5_1 = 7, NQ_Q8_0 = 8, NQ_Q2_K = 10, NQ_Q3_K = 11,
    NQ_Q4_K = 12, NQ_Q5_K = 13, NQ_Q6_K = 14, NQ_IQ4_NL = 20, NQ_IQ4_XS = 23, NQ_MXFP4 = 39,
};
enum { NQ_TILE = 8 };
// Every type above as X(type), for the switches that pick a type's template (gemm, repack) and nq_known.
#define NQ_EACH_TYPE(X)                                                                                  \
    X(NQ_Q4_0) X(NQ_Q4_1) X(NQ_Q5_0) X(NQ_Q5_1) X(NQ_Q8_0) X(NQ_Q2_K) X(NQ_Q3_K) X(NQ_Q4_K) X(NQ_Q5_K)  \
    X(NQ_Q6_K) X(NQ_IQ4_NL) X(NQ_IQ4_XS) X(NQ_MXFP4)

static inline constexpr bool nq_known(int type) {
#define NQ_IS_TYPE(T) type == T ||
    return NQ_EACH_TYPE(NQ_IS_TYPE) false;
#undef NQ_IS_TYPE
}
static inline constexpr int nq_block_elems(int type) {
    return type == NQ_Q2_K || type == NQ_Q3_K || type == NQ_Q4_K || type == NQ_Q5_K || type == NQ_Q6_K ||
           type == NQ_IQ4_XS ? 256 : 32;
}

static inline constexpr int nq_block_bytes(int type) {
    return type == NQ_Q4_0 ? 18 : type == NQ_Q4_1 ? 20 : type == NQ_Q5_0 ? 22 : type == NQ_Q5_1 ? 24
         : type == NQ_Q8_0 ? 34 : type == NQ_Q2_K ? 84 : type == NQ_Q3_K ? 110 : type == NQ_Q4_K ? 144
         : type == NQ_Q5_K ? 176 : type == NQ_Q6_K ? 210 : type == NQ_IQ4_NL ? 18 : type == NQ_IQ4_XS ? 136
         : type == NQ_MXFP4 ? 17 : 0;
}
static inline constexpr bool nq_has5(int type) { return type == NQ_Q5_0 || type == NQ_Q5_1 || type == NQ_Q5_K; }
static inline constexpr bool nq_has_min(int type) {  // a second f16 in the header (m or dmin)
    return type == NQ_Q4_1 || type == NQ_Q5_1 || type == NQ_Q2_K || type == NQ_Q4_K || type == NQ_Q5_K;
}
// the nibbles index a table of 16 signed values (IQ4_NL's and IQ4_XS's, MXFP4's)
static inline constexpr bool nq_codebook(int type) { return type == NQ_IQ4_NL || type == NQ_IQ4_XS || type == NQ_MXFP4; }
// a scale per 16 values (two per group), which also weighs the sums of the activations per 16
static inline constexpr bool nq_per16(int type) { return type == NQ_Q2_K || type == NQ_Q3_K || type == NQ_Q6_K; }

static inline constexpr int nq_header(int type) { return type == NQ_MXFP4 ? 8 : nq_has_min(type) ? 32 : 16; }
static inline constexpr int nq_group_scales(int type) {
    return type == NQ_IQ4_XS ? 8 : nq_per16(type) || type == NQ_Q4_K || type == NQ_Q5_K ? 16 : 0;
}
static inline constexpr int nq_low_bits(int type) {
    return type == NQ_Q8_0 ? 8 : type == NQ_Q2_K || type == NQ_Q3_K ? 2 : 4;
}
static inline constexpr int nq_high_bits(int type) {
    return nq_has5(type) || type == NQ_Q3_K ? 1 : type == NQ_Q6_K ? 2 : 0;
}
static inline constexpr int nq_planes(int type) { return 32 * (nq_low_bits(type) + nq_high_bits(type)); }
static inline constexpr int nq_unit_bytes(int type) {  // one file block of 8 rows, repacked
    return nq_header(type) + nq_block_elems(type) / 32 * (nq_group_scales(type) + nq_planes(type));
}
static inline constexpr int64_t nq_tile_bytes(int type, int64_t K) {  // 8 rows of K values, repacked
    return K / nq_block_elems(type) * nq_unit_bytes(type);
}

// Where a weight's units lie. A weight is a matrix of N rows (stacked experts: each expert's rows
// one such matrix, one after another), T = (N + 7) / 8 tiles of `units` units each. Rows of up to
// NQ_LONG_ROW values: tile t's units one after another, from t·units·unit bytes. Longer rows are read
// in pieces of about NQ_PIECE values (units start(p) .. start(p + 1) - 1, nq_piece_start), and their
// tiles are kept in groups of NQ_GROUP tiles (the last group fewer), each group piece by piece: piece 0
// of each of its tiles, then piece 1 of each, and so on. A one-row product then reads one piece of a
// group's tiles in turn while that piece of the activation row stays in L1: whole tiles of 8 rows of
// 8960 Q4_K values are 40 KiB each, which pushed the row out before the next tile read it. Short rows
// are the one piece of the same formula, and a group's bytes are its rows' alone, repacked as a matrix
// of their own: a weight may be repacked a run of whole groups at a time. Rows of 3584 and 4864
// values read no faster in pieces (with this bound lowered to 3072, bench/kernels_ab.py, one row from
// memory), and products of several rows read a tile's pieces from 0.95x to 1.12x as fast as its units
// in one run: rows stay whole up to 5120 values, which keeps the 4096-value rows of 7-8B models' q/k/v
// and gate/up as they were.
enum { NQ_GROUP = 12 };
static constexpr int64_t NQ_LONG_ROW = 5120, NQ_PIECE = 2048;

static inline constexpr int64_t nq_pieces(int64_t K) { return K > NQ_LONG_ROW ? (K + NQ_PIECE - 1) / NQ_PIECE : 1; }
// Where piece p starts (in units); a short row's one piece without a division.
static inline constexpr int64_t nq_piece_start(int64_t units, int64_t pieces, int64_t p) {
    return pieces == 1 ? units * p : units * p / pieces;
}

// The byte offset of piece p of tile t (of T), its units one after another from there.
static inline constexpr int64_t nq_piece_at(int64_t t, int64_t p, int64_t T, int64_t units, int64_t pieces,
                                            int64_t unit_bytes) {
    if (pieces == 1) return t * units * unit_bytes;
    const int64_t g0 = t - t % NQ_GROUP, gn = T - g0 < NQ_GROUP ? T - g0 : NQ_GROUP;
    const int64_t b0 = nq_piece_start(units, pieces, p), b1 = nq_piece_start(units, pieces, p + 1);
    return (g0 * units + b0 * gn + (t - g0) * (b1 - b0)) * unit_bytes;
}

// The byte offset of unit b of tile t (of T); a short row's without divisions (repack's every unit).
static inline int64_t nq_unit_at(int64_t t, int64_t b, int64_t T, int64_t units, int64_t pieces, int64_t unit_bytes) {
    if (pieces == 1) return (t * units + b) * unit_bytes;
    int64_t p = b * pieces / units;  // the piece holding unit b: start(p) <= b < start(p + 1)
    while (nq_piece_start(units, pieces, p + 1) <= b) p++;
    return nq_piece_at(t, p, T, units, pieces, unit_bytes) + (b - nq_piece_start(units, pieces, p)) * unit_bytes;
}

// Chunk c's place in a plane of `bits` bits per value: its vector, and the shift of its bits.
static inline constexpr int nq_plane_vector(int bits, int c) {
    return bits == 4 ? c & 3 : bits == 2 ? c / 4 : bits == 1 ? 0 : c;
}
static inline constexpr int nq_plane_shift(int bits, int c) {
    return bits == 4 ? 4 * (c / 4) : bits == 2 ? 2 * (c & 3) : bits == 1 ? c : 0;
}
