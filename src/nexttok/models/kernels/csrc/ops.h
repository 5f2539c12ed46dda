// What ops.cpp shares with decode.cpp: the block kernels of each instruction set (qkern.h, built
// once per ISA) and the row-level steps the torch ops are made of, so that a fused decode layer
// computes exactly what the separate ops compute, bit for bit.
#pragma once
#include <torch/extension.h>

#include <cstdint>

#define NQ_DECLARE(ns)                                                                                       \
    namespace ns {                                                                                           \
    int gemm(int type, const uint8_t* w, int64_t t0, int64_t t1, int64_t N, int64_t K, const int8_t* q,        \
             const float* d, const int16_t* s, const float* ds, int64_t M, float* out, int64_t ldo);          \
    void quantize_row(const float* x, int64_t K, int8_t* q, float* d, int16_t* s, float* ds);                 \
    void attend_row(const float* q, const float* k, const float* v, int64_t ldk, int64_t ldv, int64_t S,       \
                    int64_t D, float scale, float sink, float* scores, float* out);                           \
    void gate_range(const float* gate, const float* up, int64_t n, bool gelu, float* out);                    \
    bool prefetching();                                                                                      \
    }
NQ_DECLARE(nq_generic)
NQ_DECLARE(nq_avx2)
NQ_DECLARE(nq_vnni)
NQ_DECLARE(nq_amx)

namespace nq_ops {

enum Mode { PLAIN = 0, SILU_MUL = 1, GELU_TANH_MUL = 2 };

using GemmFn = decltype(&nq_generic::gemm);
using QuantFn = decltype(&nq_generic::quantize_row);
using AttendFn = decltype(&nq_generic::attend_row);

GemmFn gemm_for(int64_t isa);
inline AttendFn attend_for(int64_t isa) { return isa >= 1 ? nq_avx2::attend_row : nq_generic::attend_row; }

// act(gate) · up for one row x = [gate | up] of 2K floats into buf (K); every isa gives the same bits.
void prepare_row(const float* x, int64_t K, int64_t mode, int64_t isa, float* buf);
// Rows of x (M rows, ldx floats apart) -> int8 q (M, K), scales d (M, K/32), sums s (M, K/16), ds.
void quantize_rows(const float* xp, int64_t ldx, int64_t M, int64_t K, int64_t mode, int64_t isa, int8_t* qp,
                   float* dp, int16_t* sp, float* dsp);
// Checks the parts of a weight against K; their rows added up back.
int64_t check_parts(at::TensorList weights, at::IntArrayRef types, at::IntArrayRef rows, int64_t K, const char* op);
// out (M, N, ldo N) = x · Wᵀ over the parts' tiles, threads splitting the tiles.
void gemm_parts(const int8_t* qp, const float* dp, const int16_t* sp, const float* dsp, int64_t M, int64_t K,
                at::TensorList weights, at::IntArrayRef types, at::IntArrayRef rows, int64_t isa, float* op);
// Rows of a tiled weight (type, N rows of K values, stacked as `matrices` of N / matrices rows each)
// as float32 (n, K): torch.ops.nexttok_q.dequantize.
at::Tensor dequantize(const at::Tensor& w, int64_t type, int64_t N, const at::Tensor& rows, int64_t K,
                      int64_t matrices = 1);
// One row of RMSNorm: o = (w + add) · (r / sqrt(mean(r²) + eps)).
inline void rms_norm_row(const float* r, const float* w, int64_t K, float eps, float add, float* o) {
    float ss = 0;
    for (int64_t k = 0; k < K; k++) ss += r[k] * r[k];
    const float inv = 1.0f / std::sqrt(ss / (float)K + eps);
    for (int64_t k = 0; k < K; k++) o[k] = (w[k] + add) * (r[k] * inv);
}
// RoPE on one head of D values: pairs (j, j + D/2) turned by the angle whose cos and sin are c, s.
inline void rope_head(const float* a, const float* c, const float* s, int64_t D, float* o) {
    const int64_t half = D / 2;
    for (int64_t j = 0; j < half; j++) {
        const float x1 = a[j], x2 = a[half + j];
        o[j] = x1 * c[j] - x2 * s[j];
        o[half + j] = x2 * c[j] + x1 * s[j];
    }
}

// The fused decode layer's Python classes (decode.cpp).
void bind_decode(pybind11::module& module);
// A sampler chain's passes over the vocabulary (select.cpp).
void bind_select(pybind11::module& module);

}  // namespace nq_ops
