// torch ops over the block kernels (qkern.h): torch.ops.nexttok_q.quantize, .mm, .dequantize.
// Threads come from torch's own pool (at::parallel_for, so torch.set_num_threads rules); the
// instruction set is the caller's choice per call (0 portable, 1 AVX2, 2 AVX-512 VNNI, 3 and AMX), so tests
// run every path the machine has and nothing here reads global state.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "ops.h"
#include "qtypes.h"

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace nq_generic {
void repack(int type, const uint8_t* raw, int64_t N, int64_t K, uint8_t* out);
void unpack_rows(int type, const uint8_t* w, int64_t N, int64_t K, const int64_t* rows, int64_t n, uint8_t* out);
void dequantize_rows(int type, const uint8_t* w, int64_t N, int64_t K, const int64_t* rows, int64_t n, float* out);
}

namespace nq_ops {

bool amx_usable();

GemmFn gemm_for(int64_t isa) {
    TORCH_CHECK(isa >= 0 && isa <= 3, "nexttok_q: isa must be 0 (portable), 1 (avx2), 2 (vnni) or 3 (amx), got ", isa);
    // asked here too, not only by features(): a tile instruction before Linux grants the state kills the process
    TORCH_CHECK(isa != 3 || amx_usable(), "nexttok_q: isa 3 (amx): this CPU or its OS gives no AMX-INT8 tiles");
    return isa == 3 ? nq_amx::gemm : isa == 2 ? nq_vnni::gemm : isa == 1 ? nq_avx2::gemm : nq_generic::gemm;
}

QuantFn quant_for(int64_t isa) {
    return isa >= 1 ? nq_avx2::quantize_row : nq_generic::quantize_row;
}

// act(gate) · up over n values of gate and of up into buf (n): qkern.h's gate_range, the AVX2 one
// 8 values at a time (an exp of its own: std::exp's scalar calls took 40 us of a 1.5B model's
// decode layer), the same bits as the portable one.
void prepare_range(const float* gate, const float* up, int64_t n, int64_t mode, int64_t isa, float* buf) {
    (isa >= 1 ? nq_avx2::gate_range : nq_generic::gate_range)(gate, up, n, mode == GELU_TANH_MUL, buf);
}

void prepare_row(const float* x, int64_t K, int64_t mode, int64_t isa, float* buf) {
    prepare_range(x, x + K, K, mode, isa, buf);
}

// Rows of x (M rows, ldx floats apart) -> int8 q (M, K), scales d (M, K/32), sums s (M, K/16),
// ds (M, K/32), of act(gate)·up for the gated modes. The work is pieces of QUANT_PIECE values (every
// group of 32 stands alone), so that one long row, a decode step's MLP input (8960 values of
// act(gate)·up for Qwen2.5-1.5B), is shared out among the threads too.
constexpr int64_t QUANT_PIECE = 1024;

void quantize_rows(const float* xp, int64_t ldx, int64_t M, int64_t K, int64_t mode, int64_t isa, int8_t* qp,
                   float* dp, int16_t* sp, float* dsp) {
    QuantFn fn = quant_for(isa);
    const int64_t pieces = (K + QUANT_PIECE - 1) / QUANT_PIECE;
    at::parallel_for(0, M * pieces, 4, [&](int64_t i0, int64_t i1) {
        std::vector<float> buf(mode == PLAIN ? 0 : QUANT_PIECE);
        for (int64_t i = i0; i < i1; i++) {
            const int64_t m = i / pieces, k0 = i % pieces * QUANT_PIECE, n = std::min(QUANT_PIECE, K - k0);
            const float* row = xp + m * ldx + k0;
            if (mode != PLAIN) {
                prepare_range(row, row + K, n, mode, isa, buf.data());
                row = buf.data();
            }
            fn(row, n, qp + m * K + k0, dp + (m * K + k0) / 32, sp + (m * K + k0) / 16, dsp + (m * K + k0) / 32);
        }
    });
}

int64_t input_width(const at::Tensor& x, int64_t mode, const char* op) {
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
                "nexttok_q.", op, ": x must be a contiguous float32 (M, K) tensor");
    TORCH_CHECK(mode >= PLAIN && mode <= GELU_TANH_MUL, "nexttok_q.", op, ": unknown mode ", mode);
    const int64_t K = mode == PLAIN ? x.size(1) : x.size(1) / 2;
    TORCH_CHECK(K % 32 == 0 && K > 0, "nexttok_q.", op, ": K must be a positive multiple of 32, got ", K);
    return K;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize(const at::Tensor& x, int64_t mode, int64_t isa) {
    const int64_t M = x.size(0), K = input_width(x, mode, "quantize");
    auto q = at::empty({M, K}, x.options().dtype(at::kChar));
    auto d = at::empty({M, K / 32}, x.options());
    auto s = at::empty({M, K / 16}, x.options().dtype(at::kShort));
    auto ds = at::empty({M, K / 32}, x.options());
    quantize_rows(x.data_ptr<float>(), x.size(1), M, K, mode, isa, q.data_ptr<int8_t>(), d.data_ptr<float>(),
                  s.data_ptr<int16_t>(), ds.data_ptr<float>());
    return {q, d, s, ds};
}

int64_t tile_bytes(int64_t type, int64_t K) { return nq_tile_bytes((int)type, K); }

void check_type(int64_t type, int64_t K, const char* op) {
    TORCH_CHECK(nq_known((int)type), "nexttok_q.", op, ": unsupported block type ", type);
    TORCH_CHECK(K > 0 && K % nq_block_elems((int)type) == 0, "nexttok_q.", op, ": ", K,
                " values are not whole blocks of type ", type);
}

void check_packed(const at::Tensor& w, int64_t type, int64_t rows, int64_t K, const char* op) {
    check_type(type, K, op);
    TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kByte && w.is_contiguous() &&
                    w.size(0) == (rows + NQ_TILE - 1) / NQ_TILE && w.size(1) == tile_bytes(type, K),
                "nexttok_q.", op, ": weight is not ", rows, " rows of ", K, " values of type ", type, " in tiles");
}

// The file's blocks (N, bytes per row) written as tiles of 8 rows into out ((N + 7) / 8, bytes per
// tile): a chunk of a weight's rows at a time, so the loader can let go of the file's pages as it goes.
void repack_into(const at::Tensor& raw, int64_t type, int64_t K, at::Tensor out) {
    check_type(type, K, "repack");
    TORCH_CHECK(raw.dim() == 2 && raw.scalar_type() == at::kByte &&
                    raw.size(1) == K / nq_block_elems((int)type) * nq_block_bytes((int)type),
                "nexttok_q.repack: raw is not rows of ", K, " values of type ", type);
    const int64_t N = raw.size(0);
    TORCH_CHECK(out.dim() == 2 && out.scalar_type() == at::kByte && out.is_contiguous() &&
                    out.size(0) == (N + NQ_TILE - 1) / NQ_TILE && out.size(1) == tile_bytes(type, K),
                "nexttok_q.repack: out is not ", (N + NQ_TILE - 1) / NQ_TILE, " tiles of ", tile_bytes(type, K), " bytes");
    auto src = raw.contiguous();
    nq_generic::repack((int)type, src.data_ptr<uint8_t>(), N, K, out.data_ptr<uint8_t>());
}

at::Tensor repack(const at::Tensor& raw, int64_t type, int64_t K) {
    check_type(type, K, "repack");
    auto out = at::empty({(raw.size(0) + NQ_TILE - 1) / NQ_TILE, tile_bytes(type, K)}, raw.options().dtype(at::kByte));
    repack_into(raw, type, K, out);
    return out;
}

at::Tensor row_index(const at::Tensor& rows, int64_t N, const char* op) {
    auto idx = rows.to(at::kLong).contiguous();
    const int64_t* ip = idx.data_ptr<int64_t>();
    for (int64_t i = 0; i < idx.numel(); i++)
        TORCH_CHECK(ip[i] >= 0 && ip[i] < N, "nexttok_q.", op, ": row ", ip[i], " is not in 0..", N - 1);
    return idx;
}

// The rows of one matrix of a weight of N rows stacked as `matrices` (experts) of whole tiles each.
int64_t matrix_rows(int64_t N, int64_t matrices, const char* op) {
    TORCH_CHECK(matrices >= 1 && N % matrices == 0 && (matrices == 1 || N / matrices % NQ_TILE == 0), "nexttok_q.", op,
                ": ", N, " rows are not ", matrices, " matrices of whole tiles of ", NQ_TILE);
    return N / matrices;
}

// Rows of tiles back as the file's bytes (n, bytes per row).
at::Tensor unpack(const at::Tensor& w, int64_t type, int64_t N, const at::Tensor& rows, int64_t K, int64_t matrices) {
    check_packed(w, type, N, K, "unpack");
    auto idx = row_index(rows, N, "unpack");
    auto out = at::empty({idx.numel(), K / nq_block_elems((int)type) * nq_block_bytes((int)type)}, w.options());
    nq_generic::unpack_rows((int)type, w.data_ptr<uint8_t>(), matrix_rows(N, matrices, "unpack"), K,
                            idx.data_ptr<int64_t>(), idx.numel(), out.data_ptr<uint8_t>());
    return out;
}

// y (M, N) = x · Wᵀ where W's rows are the parts' rows (a fused q/k/v may mix types), each part
// in tiles; threads split the tiles of all parts together. Checks the parts against K; N back.
int64_t check_parts(at::TensorList weights, at::IntArrayRef types, at::IntArrayRef rows, int64_t K, const char* op) {
    TORCH_CHECK(weights.size() == types.size() && weights.size() == rows.size() && !weights.empty(),
                "nexttok_q.", op, ": one type and row count per weight part");
    int64_t N = 0;
    for (size_t i = 0; i < weights.size(); i++) {
        check_packed(weights[i], types[i], rows[i], K, op);
        N += rows[i];
    }
    return N;
}

// A block kernel's status (qkern.h's gemm): 0, or why it did nothing, as a one-line error.
void check_gemm(int status, int64_t M, int64_t K) {
    TORCH_CHECK(status != -1, "nexttok_q: out of memory for the sums of ", M, " activation rows of ", K, " values");
    TORCH_CHECK(status == 0, "nexttok_q: a weight type the block kernels do not know");
}

// A run's weights at most, and the least a thread takes from another's range (or one span).
constexpr int64_t CHUNK_BYTES = 1 << 20;
constexpr int64_t GUIDED_LEAST = 256 << 10;

// Spans (of tiles) [lo, hi) of one thread's range, in one atomic word: its owner takes runs from the
// front, a thread done with its own takes from the back.
struct Range {
    std::atomic<uint64_t> word{0};
    static uint64_t pack(int64_t lo, int64_t hi) { return (uint64_t)lo << 32 | (uint64_t)hi; }
    static int64_t lo(uint64_t w) { return (int64_t)(w >> 32); }
    static int64_t hi(uint64_t w) { return (int64_t)(w & 0xffffffffu); }
    int64_t left() const {
        const uint64_t w = word.load();
        return hi(w) - lo(w);
    }
    // the next run [first, first + n) of at most `most` spans (from the back: half what is left, at
    // least `least`), or n = 0 once the range is empty
    std::pair<int64_t, int64_t> take(bool front, int64_t most, int64_t least) {
        uint64_t w = word.load();
        for (;;) {
            const int64_t l = lo(w), h = hi(w), left = h - l;
            if (left <= 0) return {0, 0};
            const int64_t n = front ? std::min(left, most) : std::min(left, std::max(least, left / 2));
            if (word.compare_exchange_weak(w, front ? pack(l + n, h) : pack(l, h - n)))
                return {front ? l : h - n, n};
        }
    }
};

void gemm_parts(const int8_t* qp, const float* dp, const int16_t* sp, const float* dsp, int64_t M, int64_t K,
                at::TensorList weights, at::IntArrayRef types, at::IntArrayRef rows, int64_t isa, float* op) {
    std::vector<int64_t> tile0(weights.size() + 1, 0), row0(weights.size() + 1, 0);
    for (size_t i = 0; i < weights.size(); i++) {
        tile0[i + 1] = tile0[i] + weights[i].size(0);
        row0[i + 1] = row0[i] + rows[i];
    }
    const int64_t N = row0.back(), tiles = tile0.back();
    GemmFn fn = gemm_for(isa);
    auto run = [&](int64_t t0, int64_t t1) {
        for (size_t i = 0; i < weights.size(); i++) {
            const int64_t lo = std::max(t0, tile0[i]), hi = std::min(t1, tile0[i + 1]);
            if (lo >= hi) continue;
            check_gemm(fn((int)types[i], weights[i].data_ptr<uint8_t>(), lo - tile0[i], hi - tile0[i], rows[i], K, qp,
                          dp, sp, dsp, M, op + row0[i], N), M, K);
        }
    };
    // The work in spans of tiles: one row times long rows (qtypes.h), whole groups of them, so that no
    // two threads read pieces of one group; else single tiles.
    const int64_t span = M == 1 && nq_pieces(K) > 1 ? NQ_GROUP : 1, spans = (tiles + span - 1) / span;
    const auto run_spans = [&](int64_t a, int64_t b) { run(a * span, std::min(b * span, tiles)); };
    const int64_t threads = at::get_num_threads(), grain = std::max<int64_t>(1, 32 / std::max<int64_t>(1, M) / span);
    const int64_t span_bytes = weights[0].size(1) * span, by_bytes = std::max<int64_t>(1, CHUNK_BYTES / span_bytes);
    const int64_t chunk = std::max(grain, std::min(spans / (8 * threads), by_bytes));
    const int64_t chunks = (spans + chunk - 1) / chunk;
    if (threads == 1 || chunks == 1 || at::in_parallel_region()) {
        run(0, tiles);
        return;
    }
    // Each thread reads a range of its own front to back, one stream from memory, in runs of at most
    // `chunk`; then takes from the back of the range with most left, half of it (down to
    // GUIDED_LEAST), so no thread waits long for another's last run. Before, the threads took the
    // next run of one shared range in turn, each stream broken at every run: this decoded the
    // 1.5B-shaped Q4_K_M file 1.04x as fast, the default model and Qwen2.5-0.5B 1.05x (Zen 4, 2
    // threads, 16 alternating pairs). A tile is one thread's whichever takes it: the same bits.
    const int64_t parts = std::min(threads, chunks), least = std::max<int64_t>(1, std::min(chunk, GUIDED_LEAST / span_bytes));
    std::vector<Range> ranges(parts);
    for (int64_t i = 0; i < parts; i++) ranges[i].word.store(Range::pack(i * spans / parts, (i + 1) * spans / parts));
    at::parallel_for(0, parts, 1, [&](int64_t me, int64_t) {
        for (auto [t0, n] = ranges[me].take(true, chunk, least); n > 0; std::tie(t0, n) = ranges[me].take(true, chunk, least))
            run_spans(t0, t0 + n);
        for (;;) {
            int64_t most = 0, from = -1;
            for (int64_t i = 0; i < parts; i++)
                if (const int64_t left = ranges[i].left(); left > most) most = left, from = i;
            if (from < 0) return;
            const auto [t0, n] = ranges[from].take(false, chunk, least);
            if (n > 0) run_spans(t0, t0 + n);
        }
    });
}

at::Tensor mm(const at::Tensor& q, const at::Tensor& d, const at::Tensor& s, const at::Tensor& ds,
              at::TensorList weights, at::IntArrayRef types, at::IntArrayRef rows, int64_t isa) {
    TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kChar && q.is_contiguous(), "nexttok_q.mm: bad activations");
    const int64_t M = q.size(0), K = q.size(1);
    TORCH_CHECK(d.numel() == M * (K / 32) && s.numel() == M * (K / 16) && ds.numel() == M * (K / 32),
                "nexttok_q.mm: activation scales do not match q");
    gemm_for(isa);
    const int64_t N = check_parts(weights, types, rows, K, "mm");
    auto out = at::empty({M, N}, q.options().dtype(at::kFloat));
    gemm_parts(q.data_ptr<int8_t>(), d.data_ptr<float>(), s.data_ptr<int16_t>(), ds.data_ptr<float>(), M, K, weights,
               types, rows, isa, out.data_ptr<float>());
    return out;
}

// Scratch for linear's quantized input, grown as needed and kept per calling thread.
struct Scratch {
    std::vector<int8_t> q;
    std::vector<float> d, ds;
    std::vector<int16_t> s;
};

// y (M, N) = prepare(x) · Wᵀ (+ bias) in one call: the input quantized into scratch, then mm.
at::Tensor linear(const at::Tensor& x, at::TensorList weights, at::IntArrayRef types, at::IntArrayRef rows,
                  const std::optional<at::Tensor>& bias, int64_t mode, int64_t isa) {
    const int64_t K = input_width(x, mode, "linear"), M = x.size(0);
    gemm_for(isa);
    const int64_t N = check_parts(weights, types, rows, K, "linear");
    if (bias.has_value())
        TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == N,
                    "nexttok_q.linear: bias must be ", N, " contiguous float32 values");
    thread_local Scratch scratch;
    scratch.q.resize(M * K);
    scratch.d.resize(M * (K / 32));
    scratch.ds.resize(M * (K / 32));
    scratch.s.resize(M * (K / 16));
    quantize_rows(x.data_ptr<float>(), x.size(1), M, K, mode, isa, scratch.q.data(), scratch.d.data(), scratch.s.data(),
                  scratch.ds.data());
    auto out = at::empty({M, N}, x.options());
    float* op = out.data_ptr<float>();
    gemm_parts(scratch.q.data(), scratch.d.data(), scratch.s.data(), scratch.ds.data(), M, K, weights, types, rows,
               isa, op);
    if (bias.has_value()) {
        const float* b = bias->data_ptr<float>();
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) op[m * N + n] += b[n];
    }
    return out;
}

// ---- mixtures of experts: every row multiplied by the weights of the expert it is routed to ----
// A part holds n_experts × rows[p] rows in tiles, expert e's from tile e · rows[p] / 8 (so rows[p]
// is a multiple of 8). Rows are grouped by expert, so each expert's tiles are read once for all of
// its rows, and an expert no row routes to is never read (a decode step reads only its k experts).

// Quantized activation rows (quantize_row's outputs), K values each.
struct QRows {
    int64_t K = 0;
    std::vector<int8_t> q;
    std::vector<float> d, ds;
    std::vector<int16_t> s;
    void resize(int64_t rows, int64_t k) {
        K = k;
        q.resize(rows * k);
        d.resize(rows * (k / 32));
        ds.resize(rows * (k / 32));
        s.resize(rows * (k / 16));
    }
    void copy_row(int64_t to, const QRows& from, int64_t row) {
        const int64_t G = K / 32;
        memcpy(&q[to * K], &from.q[row * K], K);
        memcpy(&d[to * G], &from.d[row * G], G * sizeof(float));
        memcpy(&ds[to * G], &from.ds[row * G], G * sizeof(float));
        memcpy(&s[to * 2 * G], &from.s[row * 2 * G], 2 * G * sizeof(int16_t));
    }
};

// R rows' experts -> the rows grouped by expert: order[start[e]..start[e + 1]) are expert e's, in order.
struct Grouped {
    std::vector<int64_t> start, order;
};

Grouped group_by_expert(const int64_t* expert, int64_t R, int64_t n_experts) {
    Grouped g;
    g.start.assign(n_experts + 1, 0);
    g.order.resize(R);
    for (int64_t r = 0; r < R; r++) {
        TORCH_CHECK(expert[r] >= 0 && expert[r] < n_experts, "nexttok_q: expert ", expert[r], " out of range 0..",
                    n_experts - 1);
        g.start[expert[r] + 1]++;
    }
    for (int64_t e = 0; e < n_experts; e++) g.start[e + 1] += g.start[e];
    std::vector<int64_t> fill(g.start.begin(), g.start.end() - 1);
    for (int64_t r = 0; r < R; r++) g.order[fill[expert[r]]++] = r;
    return g;
}

// Checks the experts' parts against K; returns each part's first output column (and N at the end).
std::vector<int64_t> expert_columns(at::TensorList weights, at::IntArrayRef types, at::IntArrayRef rows,
                                    int64_t n_experts, int64_t K, const char* op) {
    TORCH_CHECK(weights.size() == types.size() && weights.size() == rows.size() && !weights.empty() && n_experts > 0,
                "nexttok_q.", op, ": one type and row count per weight part, and experts");
    std::vector<int64_t> col0(weights.size() + 1, 0);
    for (size_t p = 0; p < weights.size(); p++) {
        TORCH_CHECK(rows[p] % NQ_TILE == 0, "nexttok_q.", op, ": an expert's rows (", rows[p], ") must be whole tiles of ",
                    NQ_TILE);
        check_packed(weights[p], types[p], rows[p] * n_experts, K, op);
        col0[p + 1] = col0[p] + rows[p];
    }
    return col0;
}

// out (R, N), row i = the i-th grouped row (x's rows already in group order) times its expert's rows.
void expert_gemm(const QRows& x, const Grouped& g, at::TensorList weights, at::IntArrayRef types,
                 at::IntArrayRef rows, const std::vector<int64_t>& col0, int64_t isa, float* out) {
    const int64_t K = x.K, G = K / 32, N = col0.back(), n_experts = (int64_t)g.start.size() - 1;
    GemmFn fn = gemm_for(isa);
    struct Segment { int64_t e, p, first; };  // (expert, part) runs of tiles, numbered one after another
    std::vector<Segment> segments;
    int64_t total = 0;
    for (int64_t e = 0; e < n_experts; e++) {
        if (g.start[e + 1] == g.start[e]) continue;
        for (size_t p = 0; p < weights.size(); p++) {
            segments.push_back({e, (int64_t)p, total});
            total += rows[p] / NQ_TILE;
        }
    }
    at::parallel_for(0, total, 8, [&](int64_t i0, int64_t i1) {
        for (const Segment& seg : segments) {
            const int64_t tiles = rows[seg.p] / NQ_TILE;
            const int64_t lo = std::max(i0, seg.first), hi = std::min(i1, seg.first + tiles);
            if (lo >= hi) continue;
            const int64_t a = g.start[seg.e], count = g.start[seg.e + 1] - a;
            const uint8_t* w = weights[seg.p].data_ptr<uint8_t>() + seg.e * tiles * tile_bytes(types[seg.p], K);
            check_gemm(fn((int)types[seg.p], w, lo - seg.first, hi - seg.first, rows[seg.p], K, &x.q[a * K],
                          &x.d[a * G], &x.s[a * 2 * G], &x.ds[a * G], count, out + a * N + col0[seg.p], N), count, K);
        }
    });
}

// Rows x (M, K) quantized, then gathered into group order (row i: x[src[order[i]]]).
QRows grouped_input(const at::Tensor& x, const int64_t* src, const Grouped& g, int64_t isa) {
    const int64_t M = x.size(0), K = x.size(1), R = (int64_t)g.order.size();
    QRows all, out;
    all.resize(M, K);
    quantize_rows(x.data_ptr<float>(), K, M, K, PLAIN, isa, all.q.data(), all.d.data(), all.s.data(), all.ds.data());
    out.resize(R, K);
    for (int64_t i = 0; i < R; i++) {
        const int64_t m = src[g.order[i]];
        TORCH_CHECK(m >= 0 && m < M, "nexttok_q: source row ", m, " out of range");
        out.copy_row(i, all, m);
    }
    return out;
}

// A mixture of experts' MLPs in one call: x (T, H), the router's ids and weights (T, k) ->
// out (T, H) = Σ_j weights[t, j] · down_e(act(gate_up_e(x[t]) + b_e) ) + b'_e), e = ids[t, j]:
// gate_up's parts give each expert's [gate | up] rows, down's its hidden rows; act is silu(gate)·up
// (SILU_MUL) or gpt-oss's clamped gate·σ(alpha·gate)·(up + 1) (SWIGLU_OAI); biases optional. The
// (token, expert) rows stay grouped by expert from the first product to the second.
enum { SWIGLU_OAI = 3 };

void activate(float* h, int64_t I, int64_t mode, double alpha, double limit, int64_t isa, float* out) {
    if (mode == SILU_MUL) {
        prepare_row(h, I, SILU_MUL, isa, out);
        return;
    }
    const float a = (float)alpha, l = (float)limit;
    for (int64_t i = 0; i < I; i++) {
        const float g = std::min(h[i], l), u = std::max(std::min(h[I + i], l), -l);
        out[i] = g / (1.0f + std::exp(-a * g)) * (u + 1.0f);
    }
}

at::Tensor moe_mlp(const at::Tensor& x, const at::Tensor& ids, const at::Tensor& weights, at::TensorList gate_up,
                   at::IntArrayRef gate_up_types, at::IntArrayRef gate_up_rows, at::TensorList down,
                   at::IntArrayRef down_types, at::IntArrayRef down_rows, int64_t n_experts,
                   const std::optional<at::Tensor>& gate_up_bias, const std::optional<at::Tensor>& down_bias,
                   int64_t mode, double alpha, double limit, int64_t isa) {
    const int64_t H = input_width(x, PLAIN, "moe_mlp"), T = x.size(0);
    gemm_for(isa);
    TORCH_CHECK(mode == SILU_MUL || mode == SWIGLU_OAI, "nexttok_q.moe_mlp: mode must be SILU_MUL or SWIGLU_OAI");
    auto id = ids.to(at::kLong).contiguous();
    auto w = weights.to(at::kFloat).contiguous();
    TORCH_CHECK(id.dim() == 2 && id.size(0) == T && w.sizes() == id.sizes(), "nexttok_q.moe_mlp: ids and weights (T, k)");
    const int64_t k = id.size(1), R = T * k;
    const std::vector<int64_t> c1 = expert_columns(gate_up, gate_up_types, gate_up_rows, n_experts, H, "moe_mlp");
    const int64_t I2 = c1.back(), I = I2 / 2;
    const std::vector<int64_t> c2 = expert_columns(down, down_types, down_rows, n_experts, I, "moe_mlp");
    TORCH_CHECK(c2.back() == H && I2 % 2 == 0, "nexttok_q.moe_mlp: down must give ", H, " values from ", I);
    for (const auto* b : {&gate_up_bias, &down_bias})
        if (b->has_value())
            TORCH_CHECK((*b)->scalar_type() == at::kFloat && (*b)->is_contiguous() && (*b)->dim() == 2 &&
                            (*b)->size(0) == n_experts,
                        "nexttok_q.moe_mlp: biases are float32 (experts, width)");
    const int64_t* ip = id.data_ptr<int64_t>();
    const Grouped g = group_by_expert(ip, R, n_experts);
    std::vector<int64_t> src(R);
    for (int64_t r = 0; r < R; r++) src[r] = r / k;
    const QRows in = grouped_input(x, src.data(), g, isa);
    std::vector<float> h(R * I2);
    expert_gemm(in, g, gate_up, gate_up_types, gate_up_rows, c1, isa, h.data());
    QRows mid;
    mid.resize(R, I);
    const float* b1 = gate_up_bias.has_value() ? gate_up_bias->data_ptr<float>() : nullptr;
    QuantFn qf = quant_for(isa);
    at::parallel_for(0, R, 16, [&](int64_t r0, int64_t r1) {
        std::vector<float> a(I);
        for (int64_t i = r0; i < r1; i++) {
            float* row = &h[i * I2];
            if (b1) {
                const float* b = b1 + ip[g.order[i]] * I2;
                for (int64_t c = 0; c < I2; c++) row[c] += b[c];
            }
            activate(row, I, mode, alpha, limit, isa, a.data());
            qf(a.data(), I, &mid.q[i * I], &mid.d[i * (I / 32)], &mid.s[i * (I / 16)], &mid.ds[i * (I / 32)]);
        }
    });
    std::vector<float> y(R * H);
    expert_gemm(mid, g, down, down_types, down_rows, c2, isa, y.data());
    std::vector<int64_t> at_row(R);  // where each (token, choice) row ended up in group order
    for (int64_t i = 0; i < R; i++) at_row[g.order[i]] = i;
    const float* b2 = down_bias.has_value() ? down_bias->data_ptr<float>() : nullptr;
    const float* wp = w.data_ptr<float>();
    auto out = at::empty({T, H}, x.options());
    float* op = out.data_ptr<float>();
    at::parallel_for(0, T, 4, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; t++) {
            float* o = op + t * H;
            for (int64_t c = 0; c < H; c++) o[c] = 0.0f;
            for (int64_t j = 0; j < k; j++) {  // in the router's order, whatever the grouping
                const float* yr = &y[at_row[t * k + j] * H];
                const float* b = b2 ? b2 + ip[t * k + j] * H : nullptr;
                const float wt = wp[t * k + j];
                for (int64_t c = 0; c < H; c++) o[c] += wt * (b ? yr[c] + b[c] : yr[c]);
            }
        }
    });
    return out;
}

// RMSNorm in float32 over the last dimension: x / sqrt(mean(x²) + eps) · weight (offset added to
// the weight first: Gemma's 1 + w).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, double offset) {
    TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat && weight.dim() == 1 &&
                    x.dim() >= 1 && x.size(-1) == weight.numel(),
                "nexttok_q.rms_norm: float32 x (..., K) and weight (K,) needed");
    auto src = x.contiguous();
    auto w = weight.contiguous();
    const int64_t K = w.numel(), M = K ? src.numel() / K : 0;
    auto out = at::empty_like(src);
    const float* xp = src.data_ptr<float>();
    const float* wp = w.data_ptr<float>();
    float* op = out.data_ptr<float>();
    const float add = (float)offset;
    at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
        for (int64_t m = m0; m < m1; m++) {
            rms_norm_row(xp + m * K, wp, K, (float)eps, add, op + m * K);
        }
    });
    return out;
}

// act(gate) · up for x = [gate | up] (..., 2K) -> (..., K); mode SILU_MUL or GELU_TANH_MUL.
at::Tensor glu(const at::Tensor& x, int64_t mode, int64_t isa) {
    TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() >= 1 && x.size(-1) % 2 == 0,
                "nexttok_q.glu: float32 x (..., 2K) needed");
    TORCH_CHECK(mode == SILU_MUL || mode == GELU_TANH_MUL, "nexttok_q.glu: mode must be SILU_MUL or GELU_TANH_MUL");
    gemm_for(isa);
    auto src = x.contiguous();
    const int64_t K = src.size(-1) / 2, M = K ? src.numel() / (2 * K) : 0;
    auto sizes = src.sizes().vec();
    sizes.back() = K;
    auto out = at::empty(sizes, src.options());
    const float* xp = src.data_ptr<float>();
    float* op = out.data_ptr<float>();
    at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
        for (int64_t m = m0; m < m1; m++) prepare_row(xp + m * 2 * K, K, mode, isa, op + m * K);
    });
    return out;
}

// One new query per row attending over all S cached keys (the decode step's ALL mask):
// q (B, H, 1, D), k and v (B, Hkv, S, D) with H a multiple of Hkv (query head h reads key head
// h / (H / Hkv)) and each key row contiguous (a view of the cache: any batch, head and key strides)
// -> (B, H, 1, D). sinks (H,), where given: each head's sink logit joins its softmax (gpt-oss).
// Work splits over (row, head); a head's S keys are one thread's.
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& sinks,
                  int64_t isa) {
    TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.scalar_type() == at::kFloat &&
                    k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat,
                "nexttok_q.attend: float32 q (B, H, 1, D), k and v (B, Hkv, S, D) needed");
    const int64_t B = q.size(0), H = q.size(1), D = q.size(3), Hkv = k.size(1), S = k.size(2);
    TORCH_CHECK(q.size(2) == 1 && k.sizes() == v.sizes() && k.size(0) == B && k.size(3) == D && Hkv > 0 &&
                    H % Hkv == 0 && S > 0,
                "nexttok_q.attend: shapes q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes(), " do not fit");
    TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "nexttok_q.attend: rows must be contiguous");
    at::Tensor sink;
    if (sinks.has_value()) {
        sink = sinks->to(at::kFloat).contiguous();
        TORCH_CHECK(sink.numel() == H, "nexttok_q.attend: one sink per head needed, got ", sink.numel());
    }
    const float* sp = sinks.has_value() ? sink.data_ptr<float>() : nullptr;
    auto fn = attend_for(isa);
    auto out = at::empty({B, 1, H, D}, q.options());  // (B, T, H, D) memory, returned as (B, H, T, D)
    const float scale = 1.0f / std::sqrt((float)D);
    const float* qp = q.data_ptr<float>();
    const float* kp = k.data_ptr<float>();
    const float* vp = v.data_ptr<float>();
    float* op = out.data_ptr<float>();
    const int64_t rep = H / Hkv, grain = std::max<int64_t>(1, 16384 / (S * D));
    at::parallel_for(0, B * H, grain, [&](int64_t i0, int64_t i1) {
        std::vector<float> scores(S);
        for (int64_t i = i0; i < i1; i++) {
            const int64_t b = i / H, h = i % H, g = h / rep;
            fn(qp + b * q.stride(0) + h * q.stride(1), kp + b * k.stride(0) + g * k.stride(1),
               vp + b * v.stride(0) + g * v.stride(1), k.stride(2), v.stride(2), S, D, scale,
               sp ? sp[h] : -INFINITY, scores.data(), op + (b * H + h) * D);
        }
    });
    return out.transpose(1, 2);
}

// RoPE on the first n heads of x (B, T, H, D): pairs (i, i + D/2) turned by each position's angle,
// cos and sin (B, T, 1, D/2) -> (B, T, n, D).
at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t n) {
    TORCH_CHECK(x.dim() == 4 && x.scalar_type() == at::kFloat && cos.scalar_type() == at::kFloat &&
                    sin.scalar_type() == at::kFloat && x.size(-1) % 2 == 0 && n >= 0 && n <= x.size(2),
                "nexttok_q.rope: float32 x (B, T, H, D) and n <= H heads needed");
    const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3), half = D / 2;
    TORCH_CHECK(cos.numel() == B * T * half && sin.numel() == B * T * half,
                "nexttok_q.rope: cos and sin must hold (B, T, 1, D/2) values");
    auto src = x.contiguous();
    auto c = cos.contiguous(), s = sin.contiguous();
    auto out = at::empty({B, T, n, D}, src.options());
    const float* xp = src.data_ptr<float>();
    const float* cp = c.data_ptr<float>();
    const float* sp = s.data_ptr<float>();
    float* op = out.data_ptr<float>();
    at::parallel_for(0, B * T, 64, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; i++) {
            const float* ci = cp + i * half;
            const float* si = sp + i * half;
            for (int64_t h = 0; h < n; h++) rope_head(xp + (i * H + h) * D, ci, si, D, op + (i * n + h) * D);
        }
    });
    return out;
}

at::Tensor dequantize(const at::Tensor& w, int64_t type, int64_t N, const at::Tensor& rows, int64_t K,
                      int64_t matrices) {
    check_packed(w, type, N, K, "dequantize");
    auto idx = row_index(rows, N, "dequantize");
    const int64_t rows_each = matrix_rows(N, matrices, "dequantize");
    const int64_t n = idx.numel();
    const int64_t* ip = idx.data_ptr<int64_t>();
    auto out = at::empty({n, K}, w.options().dtype(at::kFloat));
    float* op = out.data_ptr<float>();
    at::parallel_for(0, n, 64, [&](int64_t i0, int64_t i1) {
        nq_generic::dequantize_rows((int)type, w.data_ptr<uint8_t>(), rows_each, K, ip + i0, i1 - i0, op + i0 * K);
    });
    return out;
}

// AMX-INT8 usable by this process: the CPU has it (CPUID 7.0 EDX bits 24, 25), the OS keeps the tile
// state (XCR0 bits 17, 18), and Linux grants this process its 8 KiB of tile data (ARCH_REQ_XCOMP_PERM,
// asked once; a refusal leaves AMX off, and an AMX instruction without it would kill the process).
bool amx_usable() {
#if defined(__x86_64__) && defined(__linux__)
    static const bool usable = [] {
        unsigned a, b, c, d;
        if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 24) & 1) || !((d >> 25) & 1)) return false;
        if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return false;  // OSXSAVE: xgetbv allowed
        unsigned lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        if (((lo >> 17) & 3) != 3) return false;
        constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
        return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    }();
    return usable;
#else
    return false;
#endif
}

// The instruction sets this CPU (and OS) can run: bit 0 AVX2+FMA+F16C, bit 1 AVX-512 VNNI (with VL, BW),
// bit 2 that and AMX-INT8 (amx_usable).
int64_t features() {
    __builtin_cpu_init();
    int64_t bits = 0;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) bits |= 1;
    if ((bits & 1) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
        bits |= 2;
    if ((bits & 2) && amx_usable()) bits |= 4;
    return bits;
}

}  // namespace nq_ops

using namespace nq_ops;

TORCH_LIBRARY(nexttok_q, m) {
    m.def("quantize(Tensor x, int mode, int isa) -> (Tensor, Tensor, Tensor, Tensor)");
    m.def("mm(Tensor q, Tensor d, Tensor s, Tensor ds, Tensor[] weights, int[] types, int[] rows, int isa) -> Tensor");
    m.def("repack(Tensor raw, int type, int k) -> Tensor");
    m.def("repack_into(Tensor raw, int type, int k, Tensor(a!) out) -> ()");
    m.def("unpack(Tensor w, int type, int n, Tensor rows, int k, int matrices=1) -> Tensor");
    m.def("dequantize(Tensor w, int type, int n, Tensor rows, int k, int matrices=1) -> Tensor");
    m.def("linear(Tensor x, Tensor[] weights, int[] types, int[] rows, Tensor? bias, int mode, int isa) -> Tensor");
    m.def("moe_mlp(Tensor x, Tensor ids, Tensor weights, Tensor[] gate_up, int[] gate_up_types, int[] gate_up_rows, "
          "Tensor[] down, int[] down_types, int[] down_rows, int n_experts, Tensor? gate_up_bias, Tensor? down_bias, "
          "int mode, float alpha, float limit, int isa) -> Tensor");
    m.def("rms_norm(Tensor x, Tensor weight, float eps, float offset) -> Tensor");
    m.def("glu(Tensor x, int mode, int isa) -> Tensor");
    m.def("rope(Tensor x, Tensor cos, Tensor sin, int n) -> Tensor");
    m.def("attend(Tensor q, Tensor k, Tensor v, Tensor? sinks, int isa) -> Tensor");
}

TORCH_LIBRARY_IMPL(nexttok_q, CPU, m) {
    m.impl("quantize", &quantize);
    m.impl("mm", &mm);
    m.impl("repack", &repack);
    m.impl("repack_into", &repack_into);
    m.impl("unpack", &unpack);
    m.impl("dequantize", &dequantize);
    m.impl("linear", &linear);
    m.impl("moe_mlp", &moe_mlp);
    m.impl("rms_norm", &rms_norm);
    m.impl("glu", &glu);
    m.impl("rope", &rope);
    m.impl("attend", &attend);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
    module.def("features", &features, "bit 0: AVX2+FMA; bit 1: AVX-512 VNNI; bit 2: and AMX-INT8");
    module.def(
        "prefetching",
        [](int64_t isa) {
            switch (isa) {
            case 3: return nq_amx::prefetching();
            case 2: return nq_vnni::prefetching();
            case 1: return nq_avx2::prefetching();
            default: return nq_generic::prefetching();
            }
        },
        "whether an isa's kernels request weights ahead on this CPU (software prefetch)");
    module.def("tile_bytes", &tile_bytes, "bytes of one tile of 8 rows of K values of a type (qtypes.h)");
    module.attr("GROUP") = (int64_t)NQ_GROUP;  // tiles per group where rows are long (qtypes.h)
    // the eager path calls these directly: a pybind call costs ~1 us less than torch.ops' dispatch
    module.def("linear", [](const at::Tensor& x, const std::vector<at::Tensor>& weights, const std::vector<int64_t>& types,
                            const std::vector<int64_t>& rows, const std::optional<at::Tensor>& bias, int64_t mode,
                            int64_t isa) { return linear(x, weights, types, rows, bias, mode, isa); });
    module.def("rms_norm", &rms_norm);
    module.def("glu", &glu);
    module.def("rope", &rope);
    module.def("attend", &attend);
    bind_decode(module);
    bind_select(module);
}
