// One decoder layer of the Llama shape for one new token per row, in one call: what the eager
// layer does in ~25 torch operations (each a dispatch and an allocation, ~3 us apiece, which cost
// more than the layer's matmuls on a small model) done here on scratch rows. The steps are the very
// row functions the separate ops use (ops.h), in the same order, so the result equals the eager
// layer's bit for bit:
//
//   x ─RMSNorm→ qkv (+bias) ─[q/k head norms]─RoPE(q, k)→ k, v written into the cache at `ends`
//     → attention of q over the keys [starts, ends] → o_proj (+bias) → x += ...
//     ─RMSNorm→ gate_up (+bias) → silu(gate)·up → down (+bias) → x += ...
//
// The cache is the caller's: k and v stores (rows, Hkv, L, D) with contiguous head rows, and for
// each batch row its store row, the slot its new key goes to and the first slot it attends from.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <optional>
#include <vector>

#include "ops.h"

namespace nq_ops {
namespace {

// A weight in tiles (its parts stacked) with its optional bias: the BlockLinear of nexttok.
struct Linear {
    std::vector<at::Tensor> weights;
    std::vector<int64_t> types, rows;
    at::Tensor bias;  // undefined: none
    int64_t K = 0, N = 0;

    Linear(std::vector<at::Tensor> w, std::vector<int64_t> t, std::vector<int64_t> r, std::optional<at::Tensor> b,
           int64_t k)
        : weights(std::move(w)), types(std::move(t)), rows(std::move(r)), K(k) {
        N = check_parts(weights, types, rows, K, "decode_layer");
        if (b.has_value()) {
            TORCH_CHECK(b->scalar_type() == at::kFloat && b->is_contiguous() && b->numel() == N,
                        "nexttok_q.decode_layer: a bias of ", N, " contiguous float32 values needed");
            bias = *b;
        }
    }
};

struct QScratch {
    std::vector<int8_t> q;
    std::vector<float> d, ds;
    std::vector<int16_t> s;
};

// out (M, N) = prepare(x) · Wᵀ + bias, as nexttok_q.linear computes it.
void apply(const Linear& lin, const float* x, int64_t ldx, int64_t M, int64_t mode, int64_t isa, QScratch& sc,
           float* out) {
    const int64_t K = lin.K;
    sc.q.resize(M * K);
    sc.d.resize(M * (K / 32));
    sc.ds.resize(M * (K / 32));
    sc.s.resize(M * (K / 16));
    quantize_rows(x, ldx, M, K, mode, isa, sc.q.data(), sc.d.data(), sc.s.data(), sc.ds.data());
    gemm_parts(sc.q.data(), sc.d.data(), sc.s.data(), sc.ds.data(), M, K, lin.weights, lin.types, lin.rows, isa, out);
    if (lin.bias.defined()) {
        const float* b = lin.bias.data_ptr<float>();
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < lin.N; n++) out[m * lin.N + n] += b[n];
    }
}

at::Tensor float_vector(const std::optional<at::Tensor>& t, int64_t n, const char* what) {
    if (!t.has_value()) return at::Tensor();
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->dim() == 1 && t->numel() == n,
                "nexttok_q.decode_layer: ", what, " must be ", n, " float32 values");
    return t->contiguous();
}

}  // namespace

class DecodeLayer {
   public:
    DecodeLayer(const at::Tensor& attn_norm, const at::Tensor& mlp_norm, double eps, Linear qkv,
                const std::optional<at::Tensor>& q_norm, const std::optional<at::Tensor>& k_norm, Linear o,
                Linear gate_up, Linear down, int64_t n_q, int64_t n_kv, int64_t head_dim, int64_t mode, int64_t isa)
        : qkv_(std::move(qkv)), o_(std::move(o)), gate_up_(std::move(gate_up)), down_(std::move(down)),
          eps_((float)eps), nq_(n_q), nkv_(n_kv), hd_(head_dim), mode_(mode), isa_(isa) {
        H_ = qkv_.K;
        TORCH_CHECK(mode == SILU_MUL || mode == GELU_TANH_MUL, "nexttok_q.decode_layer: mode must be a gated one");
        TORCH_CHECK(n_kv > 0 && n_q % n_kv == 0 && head_dim % 2 == 0 && qkv_.N == (n_q + 2 * n_kv) * head_dim &&
                        o_.K == n_q * head_dim && o_.N == H_ && gate_up_.K == H_ && gate_up_.N == 2 * down_.K &&
                        down_.N == H_,
                    "nexttok_q.decode_layer: the layer's shapes do not fit together");
        gemm_for(isa);
        attn_norm_ = float_vector(attn_norm, H_, "attn_norm");
        mlp_norm_ = float_vector(mlp_norm, H_, "mlp_norm");
        q_norm_ = float_vector(q_norm, hd_, "q_norm");
        k_norm_ = float_vector(k_norm, hd_, "k_norm");
        TORCH_CHECK(q_norm_.defined() == k_norm_.defined(), "nexttok_q.decode_layer: q and k norms go together");
    }

    // x (B, hidden) float32 -> the layer's output (B, hidden). cos, sin (B, D/2): each row's angle;
    // k, v: the layer's stores (rows, Hkv, L, D); slot, starts, ends (B,) int64: each batch row's
    // store row, first key and the slot of its new key (attended over starts..ends inclusive).
    at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& k,
                       const at::Tensor& v, const at::Tensor& slot, const at::Tensor& starts,
                       const at::Tensor& ends) const {
        TORCH_CHECK(x.dim() == 2 && x.size(1) == H_ && x.scalar_type() == at::kFloat && x.is_contiguous(),
                    "nexttok_q.decode_layer: x must be a contiguous float32 (B, ", H_, ") tensor");
        const int64_t B = x.size(0), D = hd_, half = D / 2, nh = nq_ + 2 * nkv_;
        TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.scalar_type() == at::kFloat &&
                        sin.scalar_type() == at::kFloat && cos.numel() == B * half && sin.numel() == B * half,
                    "nexttok_q.decode_layer: cos and sin must be contiguous float32 (B, ", half, ")");
        TORCH_CHECK(k.dim() == 4 && v.dim() == 4 && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat &&
                        k.sizes() == v.sizes() && k.size(1) == nkv_ && k.size(3) == D && k.stride(3) == 1 &&
                        v.stride(3) == 1,
                    "nexttok_q.decode_layer: k and v must be float32 stores (rows, ", nkv_, ", L, ", D, ")");
        for (const at::Tensor* t : {&slot, &starts, &ends})
            TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous() && t->numel() == B,
                        "nexttok_q.decode_layer: slot, starts and ends must be B int64 values");
        const int64_t* sl = slot.data_ptr<int64_t>();
        const int64_t* st = starts.data_ptr<int64_t>();
        const int64_t* en = ends.data_ptr<int64_t>();
        for (int64_t b = 0; b < B; b++)
            TORCH_CHECK(sl[b] >= 0 && sl[b] < k.size(0) && en[b] >= 0 && en[b] < k.size(2) && st[b] >= 0 &&
                            st[b] <= en[b],
                        "nexttok_q.decode_layer: row ", b, " writes slot ", en[b], " of store row ", sl[b],
                        " from ", st[b], ", outside the cache");

        thread_local QScratch sc;
        thread_local std::vector<float> norm, heads, attn, inner;
        const int64_t I = down_.K;
        norm.resize(B * H_);
        heads.resize(B * nh * D);
        attn.resize(B * nq_ * D);
        inner.resize(B * 2 * I);
        const float* xp = x.data_ptr<float>();
        const float* an = attn_norm_.data_ptr<float>();
        for (int64_t b = 0; b < B; b++) rms_norm_row(xp + b * H_, an, H_, eps_, 0.0f, &norm[b * H_]);
        apply(qkv_, norm.data(), H_, B, PLAIN, isa_, sc, heads.data());

        float* kp = k.data_ptr<float>();
        float* vp = v.data_ptr<float>();
        std::vector<float> tmp(D);
        for (int64_t b = 0; b < B; b++) {
            float* row = &heads[b * nh * D];
            const float* c = cos.data_ptr<float>() + b * half;
            const float* s = sin.data_ptr<float>() + b * half;
            for (int64_t h = 0; h < nq_ + nkv_; h++) {  // q and k heads: norm (Qwen3), then RoPE
                float* a = row + h * D;
                if (q_norm_.defined()) {
                    const float* w = (h < nq_ ? q_norm_ : k_norm_).data_ptr<float>();
                    rms_norm_row(a, w, D, eps_, 0.0f, tmp.data());
                    std::copy(tmp.begin(), tmp.end(), a);
                }
                rope_head(a, c, s, D, tmp.data());
                std::copy(tmp.begin(), tmp.end(), a);
            }
            for (int64_t g = 0; g < nkv_; g++) {  // this token's key and value into the cache
                const int64_t kofs = sl[b] * k.stride(0) + g * k.stride(1) + en[b] * k.stride(2);
                const int64_t vofs = sl[b] * v.stride(0) + g * v.stride(1) + en[b] * v.stride(2);
                std::copy(row + (nq_ + g) * D, row + (nq_ + g + 1) * D, kp + kofs);
                std::copy(row + (nq_ + nkv_ + g) * D, row + (nq_ + nkv_ + g + 1) * D, vp + vofs);
            }
        }
        AttendFn fn = attend_for(isa_);
        const float scale = 1.0f / std::sqrt((float)D);
        const int64_t rep = nq_ / nkv_;
        int64_t most = 1;
        for (int64_t b = 0; b < B; b++) most = std::max(most, en[b] + 1 - st[b]);
        const int64_t grain = std::max<int64_t>(1, 16384 / (most * D));  // as nexttok_q.attend splits
        const float* hp = heads.data();  // thread_local: the pool's threads must see this thread's rows
        float* ap = attn.data();
        at::parallel_for(0, B * nq_, grain, [&](int64_t i0, int64_t i1) {
            std::vector<float> scores(most);
            for (int64_t i = i0; i < i1; i++) {
                const int64_t b = i / nq_, h = i % nq_, g = h / rep;
                const int64_t kofs = sl[b] * k.stride(0) + g * k.stride(1) + st[b] * k.stride(2);
                const int64_t vofs = sl[b] * v.stride(0) + g * v.stride(1) + st[b] * v.stride(2);
                fn(hp + (b * nh + h) * D, kp + kofs, vp + vofs, k.stride(2), v.stride(2), en[b] + 1 - st[b], D, scale,
                   -INFINITY, scores.data(), ap + (b * nq_ + h) * D);
            }
        });

        auto out = at::empty({B, H_}, x.options());
        float* op = out.data_ptr<float>();
        apply(o_, attn.data(), nq_ * D, B, PLAIN, isa_, sc, op);
        for (int64_t i = 0; i < B * H_; i++) op[i] = xp[i] + op[i];
        const float* mn = mlp_norm_.data_ptr<float>();
        for (int64_t b = 0; b < B; b++) rms_norm_row(op + b * H_, mn, H_, eps_, 0.0f, &norm[b * H_]);
        apply(gate_up_, norm.data(), H_, B, PLAIN, isa_, sc, inner.data());
        std::vector<float> mlp(B * H_);
        apply(down_, inner.data(), 2 * I, B, mode_, isa_, sc, mlp.data());
        for (int64_t i = 0; i < B * H_; i++) op[i] = op[i] + mlp[i];
        return out;
    }

   private:
    Linear qkv_, o_, gate_up_, down_;
    at::Tensor attn_norm_, mlp_norm_, q_norm_, k_norm_;
    float eps_;
    int64_t H_ = 0, nq_, nkv_, hd_, mode_, isa_;
};

// Consecutive layers of one step in one call: x through layers[0], layers[1], ... as each layer's
// forward, layer i reading its keys from row rows[i] of the stores k[i], v[i] (rows, B, Hkv, L, D),
// the cache's group buffers. A decode step of the default model is then one call, not thirty, and
// the Python around it (a view of each layer's keys, the call's arguments) is paid once.
at::Tensor decode_layers(const std::vector<const DecodeLayer*>& layers, at::Tensor x, const at::Tensor& cos,
                         const at::Tensor& sin, const std::vector<at::Tensor>& k, const std::vector<at::Tensor>& v,
                         const std::vector<int64_t>& rows, const at::Tensor& slot, const at::Tensor& starts,
                         const at::Tensor& ends) {
    const size_t n = layers.size();
    TORCH_CHECK(k.size() == n && v.size() == n && rows.size() == n,
                "nexttok_q.decode_layers: one key store, value store and row per layer");
    for (size_t i = 0; i < n; i++) {
        TORCH_CHECK(layers[i] != nullptr, "nexttok_q.decode_layers: layer ", i, " is None");
        TORCH_CHECK(k[i].dim() == 5 && v[i].dim() == 5 && rows[i] >= 0 && rows[i] < k[i].size(0) &&
                        rows[i] < v[i].size(0),
                    "nexttok_q.decode_layers: layer ", i, " reads row ", rows[i], " of stores that lack it");
        x = layers[i]->forward(x, cos, sin, k[i].select(0, rows[i]), v[i].select(0, rows[i]), slot, starts, ends);
    }
    return x;
}

// A Llama-shaped model's final RMSNorm and output layer, for the step's logits in the same call as
// its layers (decode_logits): the eager head's row functions (RMSNorm's rms_norm_row, BlockLinear's
// quantize and matmul), the same bits.
class DecodeHead {
   public:
    DecodeHead(const at::Tensor& norm, double eps, Linear head, int64_t isa)
        : head_(std::move(head)), eps_((float)eps), isa_(isa) {
        gemm_for(isa);
        norm_ = float_vector(norm, head_.K, "the final norm");
    }

    // x (B, hidden) float32 -> logits (B, vocab)
    at::Tensor forward(const at::Tensor& x) const {
        const int64_t H = head_.K;
        TORCH_CHECK(x.dim() == 2 && x.size(1) == H && x.scalar_type() == at::kFloat && x.is_contiguous(),
                    "nexttok_q.decode_logits: x must be a contiguous float32 (B, ", H, ") tensor");
        const int64_t B = x.size(0);
        thread_local QScratch sc;
        thread_local std::vector<float> normed;
        normed.resize(B * H);
        for (int64_t b = 0; b < B; b++)
            rms_norm_row(x.data_ptr<float>() + b * H, norm_.data_ptr<float>(), H, eps_, 0.0f, &normed[b * H]);
        auto logits = at::empty({B, head_.N}, x.options());
        apply(head_, normed.data(), H, B, PLAIN, isa_, sc, logits.data_ptr<float>());
        return logits;
    }

   private:
    Linear head_;
    at::Tensor norm_;
    float eps_;
    int64_t isa_;
};

// A token table kept in tiles (BlockEmbedding's): its rows are the step's inputs in decode_tokens.
struct DecodeTable {
    at::Tensor tiles;
    int64_t type, rows, K;
};

// decode_layers, then the head: a plain decode step's logits in one call.
at::Tensor decode_logits(const std::vector<const DecodeLayer*>& layers, const DecodeHead& head, at::Tensor x,
                         const at::Tensor& cos, const at::Tensor& sin, const std::vector<at::Tensor>& k,
                         const std::vector<at::Tensor>& v, const std::vector<int64_t>& rows, const at::Tensor& slot,
                         const at::Tensor& starts, const at::Tensor& ends) {
    return head.forward(decode_layers(layers, std::move(x), cos, sin, k, v, rows, slot, starts, ends));
}

// A plain decode step whole, for B rows that all hold positions 0..position-1 in the stores: each
// token's row of the table, RoPE's row `position` of the tables (L, D/2) for every row, each row's
// new key at slot `position` of store row b, every key attended: the logits (B, 1, vocab), as
// FusedDecode.step makes its inputs in Python (~0.25 ms of a 1.5B model's step on cold caches).
at::Tensor decode_tokens(const std::vector<const DecodeLayer*>& layers, const DecodeTable& table,
                         const DecodeHead& head, const at::Tensor& ids, const at::Tensor& cos_table,
                         const at::Tensor& sin_table, int64_t position, const std::vector<at::Tensor>& k,
                         const std::vector<at::Tensor>& v, const std::vector<int64_t>& rows) {
    TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong,
                "nexttok_q.decode_tokens: ids must be one int64 token per row (B,)");
    TORCH_CHECK(cos_table.dim() == 2 && sin_table.sizes() == cos_table.sizes() && position >= 0 &&
                    position < cos_table.size(0),
                "nexttok_q.decode_tokens: position ", position, " is outside the RoPE tables");
    const int64_t B = ids.size(0);
    at::Tensor x = dequantize(table.tiles, table.type, table.rows, ids, table.K);
    const auto row = [&](const at::Tensor& t) { return t.select(0, position).expand({B, t.size(1)}).contiguous(); };
    const auto longs = at::TensorOptions().dtype(at::kLong);
    at::Tensor logits = decode_logits(layers, head, x, row(cos_table), row(sin_table), k, v, rows,
                                      at::arange(B, longs), at::zeros({B}, longs), at::full({B}, position, longs));
    return logits.view({B, 1, logits.size(1)});
}

void bind_decode(pybind11::module& module) {
    namespace py = pybind11;
    py::class_<Linear>(module, "DecodeLinear")
        .def(py::init<std::vector<at::Tensor>, std::vector<int64_t>, std::vector<int64_t>, std::optional<at::Tensor>,
                      int64_t>());
    py::class_<DecodeLayer>(module, "DecodeLayer")
        .def(py::init<const at::Tensor&, const at::Tensor&, double, Linear, const std::optional<at::Tensor>&,
                      const std::optional<at::Tensor>&, Linear, Linear, Linear, int64_t, int64_t, int64_t, int64_t,
                      int64_t>())
        .def("forward", &DecodeLayer::forward);
    // the GIL is let go for the step (the arguments are converted first): the server's threads go on
    module.def("decode_layers", &decode_layers, pybind11::call_guard<pybind11::gil_scoped_release>());
    py::class_<DecodeHead>(module, "DecodeHead")
        .def(py::init<const at::Tensor&, double, Linear, int64_t>())
        .def("forward", &DecodeHead::forward);
    module.def("decode_logits", &decode_logits, pybind11::call_guard<pybind11::gil_scoped_release>());
    py::class_<DecodeTable>(module, "DecodeTable")
        .def(py::init<at::Tensor, int64_t, int64_t, int64_t>());
    module.def("decode_tokens", &decode_tokens, pybind11::call_guard<pybind11::gil_scoped_release>());
}

}  // namespace nq_ops
