// What a sampler chain asks of the whole vocabulary, in two passes instead of a handful of torch
// ops (each of which costs tens of microseconds on a 49k-152k row, more than its arithmetic), and
// the draw over what it kept (pick, below): top_k_kept, the tokens top-k keeps (the k highest logits, ties with the k-th kept, -inf never),
// ids ascending, and their logits. Both passes look at blocks of 64 by their max first (one vector
// max per 8 values), so a 49k row takes ~15 µs (a heap over every value took 86).
#include <torch/extension.h>

#include <algorithm>
#include <cmath>  // INFINITY
#include <functional>
#include <vector>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "ops.h"

namespace {

const float* row_of(const at::Tensor& logits, const char* op) {
    TORCH_CHECK(logits.dim() == 1 && logits.scalar_type() == at::kFloat && logits.is_contiguous() &&
                    logits.device().is_cpu() && logits.numel() > 0,
                "nexttok_q.", op, ": logits must be one non-empty contiguous float32 row on the CPU");
    return logits.data_ptr<float>();
}

// The largest of x[0..n) (max is exact in any order; no NaN reaches here, sample() refuses them
// first): SSE's maxps on every x86-64 CPU, 8 values a step; elsewhere 8 running maxima.
float block_max(const float* x, int64_t n) {
    int64_t i = 0;
    float top = -INFINITY;
#if defined(__SSE2__)
    __m128 a = _mm_set1_ps(-INFINITY), b = a;
    for (; i + 8 <= n; i += 8) {
        a = _mm_max_ps(a, _mm_loadu_ps(x + i));
        b = _mm_max_ps(b, _mm_loadu_ps(x + i + 4));
    }
    float lanes[4];
    _mm_storeu_ps(lanes, _mm_max_ps(a, b));
    for (float v : lanes) top = v > top ? v : top;
#endif
    for (; i < n; i++) top = x[i] > top ? x[i] : top;
    return top;
}

constexpr int64_t BLOCK = 64;  // values looked at one by one only in a block whose max could count

// The k-th highest of x[0..n) (k < n; duplicates counted, as torch.topk(x, k).values[-1]), and each
// BLOCK's max into tops (for the second pass). The k-th highest block max t is a floor of the answer
// (k values reach it), so only the values >= t of the blocks whose max reaches t are candidates:
// about k blocks' worth, where a heap met every value.
float kth_highest(const float* x, int64_t n, int64_t k, std::vector<float>& tops) {
    for (int64_t b = 0; b < n; b += BLOCK) tops.push_back(block_max(x + b, std::min(n, b + BLOCK) - b));
    float floor = -INFINITY;  // fewer blocks than k: every value is a candidate
    if (k <= (int64_t)tops.size()) {
        std::vector<float> order(tops);
        std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), std::greater<float>());
        floor = order[k - 1];
    }
    std::vector<float> candidates;
    candidates.reserve(4 * k);
    for (int64_t b = 0; b < n; b += BLOCK) {
        if (tops[b / BLOCK] < floor) continue;
        for (int64_t i = b; i < std::min(n, b + BLOCK); i++)
            if (x[i] >= floor) candidates.push_back(x[i]);
    }
    std::nth_element(candidates.begin(), candidates.begin() + (k - 1), candidates.end(), std::greater<float>());
    return candidates[k - 1];
}

std::tuple<at::Tensor, at::Tensor> top_k_kept(const at::Tensor& logits, int64_t k) {
    const float* x = row_of(logits, "top_k_kept");
    const int64_t n = logits.numel();
    TORCH_CHECK(k > 0, "nexttok_q.top_k_kept: k must be positive, got ", k);
    std::vector<float> tops;
    tops.reserve(n / BLOCK + 1);
    // k >= n: top-k keeps every token (tops stays empty: every block is looked at)
    const float kth = k >= n ? -INFINITY : kth_highest(x, n, k, tops);
    std::vector<int64_t> ids;
    std::vector<float> values;
    ids.reserve(std::min<int64_t>(n, k + 16));
    values.reserve(ids.capacity());
    for (int64_t b = 0; b < n; b += BLOCK) {
        const int64_t e = std::min(n, b + BLOCK);
        if (!tops.empty() && tops[b / BLOCK] < kth) continue;
        for (int64_t i = b; i < e; i++) {
            if (x[i] >= kth && x[i] > -INFINITY) {
                ids.push_back(i);
                values.push_back(x[i]);
            }
        }
    }
    auto id_tensor = at::empty({(int64_t)ids.size()}, logits.options().dtype(at::kLong));
    auto value_tensor = at::empty({(int64_t)values.size()}, logits.options());
    std::copy(ids.begin(), ids.end(), id_tensor.data_ptr<int64_t>());
    std::copy(values.begin(), values.end(), value_tensor.data_ptr<float>());
    return {id_tensor, value_tensor};
}

// The inverse-CDF draw of sampling.pick over probabilities p (a row of top-k's few kept tokens):
// the tokens with p > 0 laid out most likely first, equal ones by id, and the first whose running
// sum (in double, added in that order, as numpy's float64 cumsum) passes u times the whole sum;
// rounding never lands past the last one. One call where numpy took a dozen (~30 µs on 40 values).
int64_t pick(const at::Tensor& probs, double u) {
    const float* p = row_of(probs, "pick");
    const int64_t n = probs.numel();
    TORCH_CHECK(u >= 0 && u < 1, "nexttok_q.pick: u must be in [0, 1), got ", u);
    std::vector<int64_t> alive;
    alive.reserve(n);
    for (int64_t i = 0; i < n; i++)
        if (p[i] > 0) alive.push_back(i);
    TORCH_CHECK(!alive.empty(), "nexttok_q.pick: no token has a probability above 0");
    std::stable_sort(alive.begin(), alive.end(), [p](int64_t a, int64_t b) { return p[a] > p[b]; });
    double total = 0;
    for (int64_t i : alive) total += (double)p[i];
    const double target = u * total;
    double running = 0;
    for (int64_t i : alive) {
        running += (double)p[i];
        if (running > target) return i;
    }
    return alive.back();
}

}  // namespace

namespace nq_ops {

void bind_select(pybind11::module& module) {
    module.def("top_k_kept", &top_k_kept, "(ids ascending, logits) of the tokens top-k keeps");
    module.def("pick", &pick, "the inverse-CDF draw with u over probabilities, most likely first");
}

}  // namespace nq_ops
