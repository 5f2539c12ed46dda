// What a sampler chain asks of the whole vocabulary, in two passes instead of a handful of torch
// ops (each of which costs tens of microseconds on a 49k-152k row, more than its arithmetic):
// top_k_kept, the tokens top-k keeps (the k highest logits, ties with the k-th kept, -inf never),
// ids ascending, and their logits.
#include <torch/extension.h>

#include <cmath>  // INFINITY
#include <functional>
#include <queue>
#include <vector>

#include "ops.h"

namespace {

const float* row_of(const at::Tensor& logits, const char* op) {
    TORCH_CHECK(logits.dim() == 1 && logits.scalar_type() == at::kFloat && logits.is_contiguous() &&
                    logits.device().is_cpu() && logits.numel() > 0,
                "nexttok_q.", op, ": logits must be one non-empty contiguous float32 row on the CPU");
    return logits.data_ptr<float>();
}

// The k-th highest value (duplicates counted, as torch.topk(x, k).values[-1]), by a min-heap of
// the k highest seen: a value joins only when it beats the heap's least.
float kth_highest(const float* x, int64_t n, int64_t k) {
    std::priority_queue<float, std::vector<float>, std::greater<float>> heap;
    for (int64_t i = 0; i < k; i++) heap.push(x[i]);
    float least = heap.top();  // kept in a register: nearly every value only meets this compare
    for (int64_t i = k; i < n; i++) {
        if (x[i] > least) {
            heap.pop();
            heap.push(x[i]);
            least = heap.top();
        }
    }
    return least;
}

std::tuple<at::Tensor, at::Tensor> top_k_kept(const at::Tensor& logits, int64_t k) {
    const float* x = row_of(logits, "top_k_kept");
    const int64_t n = logits.numel();
    TORCH_CHECK(k > 0, "nexttok_q.top_k_kept: k must be positive, got ", k);
    const float kth = k >= n ? -INFINITY : kth_highest(x, n, k);  // k >= n: top-k keeps every token
    std::vector<int64_t> ids;
    std::vector<float> values;
    ids.reserve(std::min<int64_t>(n, k + 16));
    values.reserve(ids.capacity());
    for (int64_t i = 0; i < n; i++) {
        if (x[i] >= kth && x[i] > -INFINITY) {
            ids.push_back(i);
            values.push_back(x[i]);
        }
    }
    auto id_tensor = at::empty({(int64_t)ids.size()}, logits.options().dtype(at::kLong));
    auto value_tensor = at::empty({(int64_t)values.size()}, logits.options());
    std::copy(ids.begin(), ids.end(), id_tensor.data_ptr<int64_t>());
    std::copy(values.begin(), values.end(), value_tensor.data_ptr<float>());
    return {id_tensor, value_tensor};
}

}  // namespace

namespace nq_ops {

void bind_select(pybind11::module& module) {
    module.def("top_k_kept", &top_k_kept, "(ids ascending, logits) of the tokens top-k keeps");
}

}  // namespace nq_ops
