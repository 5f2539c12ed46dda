// GGUF block types the kernels run (by their ggml type numbers), each file block's size, and the
// layout the weights are repacked into at load: tiles of 8 rows, so that one 256-bit register
// holds 4 consecutive weights of each of 8 rows and the int8 dot products give 8 outputs at once.
//
// A tile is a run of units, one per file block (32 values, or 256 for the K types). A unit is a
// header, then per group of 32 values its scale bytes (K types) and its weight planes:
//
//   type  header (8 rows each)          per group            planes per group (8 rows)
//   Q4_0  d f16                          -                    nibbles 128
//   Q4_1  d, m f16                       -                    nibbles 128
//   Q5_0  d f16                          -                    nibbles 128, 5th bits 32
//   Q5_1  d, m f16                       -                    nibbles 128, 5th bits 32
//   Q8_0  d f16                          -                    bytes 256
//   Q4_K  d, dmin f16                    sc, mn int8 (6-bit)  nibbles 128
//   Q5_K  d, dmin f16                    sc, mn int8          nibbles 128, 5th bits 32
//   Q6_K  d f16                          sc per 16: 2 int8    nibbles 128, top 2 bits 64
//
// Nibble vector j (j < 4), byte 4r + i: row r's value 4j + i (low nibble) and 16 + 4j + i (high).
// 5th-bit vector, byte 4r + i, bit c: the 5th bit of row r's value 4c + i.
// Top-2-bit vector h (h < 2), byte 4r + i, bits 2c..2c+1: the top bits of row r's 4(4h + c) + i.
// Q8_0 vector c, byte 4r + i: row r's value 4c + i.
// So chunk c (values 4c..4c+3 of every row) is one and/shift away. The bytes held match the
// file's within 3% (Q4_K: 148 per 256 values instead of 144).
#pragma once

#include <stdint.h>

enum {
    NQ_Q4_0 = 2, NQ_Q4_1 = 3, NQ_Q5_0 = 6, NQ_Q5_1 = 7, NQ_Q8_0 = 8,
    NQ_Q4_K = 12, NQ_Q5_K = 13, NQ_Q6_K = 14,
};
enum { NQ_TILE = 8 };

static inline constexpr bool nq_known(int type) {
    return type == NQ_Q4_0 || type == NQ_Q4_1 || type == NQ_Q5_0 || type == NQ_Q5_1 || type == NQ_Q8_0 ||
           type == NQ_Q4_K || type == NQ_Q5_K || type == NQ_Q6_K;
}
static inline constexpr bool nq_k(int type) { return type >= NQ_Q4_K; }
static inline constexpr int nq_block_elems(int type) { return nq_k(type) ? 256 : 32; }

static inline constexpr int nq_block_bytes(int type) {
    return type == NQ_Q4_0 ? 18 : type == NQ_Q4_1 ? 20 : type == NQ_Q5_0 ? 22 : type == NQ_Q5_1 ? 24
         : type == NQ_Q8_0 ? 34 : type == NQ_Q4_K ? 144 : type == NQ_Q5_K ? 176 : type == NQ_Q6_K ? 210 : 0;
}
static inline constexpr bool nq_has5(int type) { return type == NQ_Q5_0 || type == NQ_Q5_1 || type == NQ_Q5_K; }
static inline constexpr bool nq_has_min(int type) {  // a second f16 in the header (m or dmin)
    return type == NQ_Q4_1 || type == NQ_Q5_1 || type == NQ_Q4_K || type == NQ_Q5_K;
}
static inline constexpr int nq_header(int type) { return nq_has_min(type) ? 32 : 16; }
static inline constexpr int nq_group_scales(int type) { return nq_k(type) ? 16 : 0; }
static inline constexpr int nq_planes(int type) {
    return type == NQ_Q8_0 ? 256 : 128 + (nq_has5(type) ? 32 : 0) + (type == NQ_Q6_K ? 64 : 0);
}
static inline constexpr int nq_unit_bytes(int type) {  // one file block of 8 rows, repacked
    return nq_header(type) + nq_block_elems(type) / 32 * (nq_group_scales(type) + nq_planes(type));
}
