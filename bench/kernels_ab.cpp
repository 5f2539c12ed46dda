// The driver of bench/kernels_ab.py: one block type's matmul by two builds of csrc/qkern.h (A: an
// older commit's, B: this tree's) on the same random weights, timed in alternation in one process.
//
// a.o and b.o each compile their own qkern.h (with its qtypes.h) into namespace nq_a / nq_b; this
// file sees only B's qtypes.h, for the sizes (the tile layout is the same in both, or the outputs
// below differ and the script says so).
//
//   kernels_ab TYPE N K ROWS ROUNDS REPEAT
// prints "max_diff D max_abs M" and then one line per round: "A seconds B seconds" (medians of
// REPEAT calls), the tiles shared out among the OpenMP threads as the extension shares them.
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <cmath>
#include <random>
#include <vector>

#include "qtypes.h"

#define DECLARE(NS)                                                                                             \
    namespace NS {                                                                                              \
    int gemm(int type, const uint8_t* w, int64_t t0, int64_t t1, int64_t N, int64_t K, const int8_t* q,          \
             const float* d, const int16_t* s, const float* ds, int64_t M, float* out, int64_t ldo);            \
    void quantize_row(const float* x, int64_t K, int8_t* q, float* d, int16_t* s, float* ds);                   \
    }
DECLARE(nq_a)
DECLARE(nq_b)

using Gemm = decltype(&nq_b::gemm);

static double seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char** argv) {
    syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */);  // AMX's tiles, where there are any
    if (argc != 7) {
        fprintf(stderr, "usage: kernels_ab TYPE N K ROWS ROUNDS REPEAT\n");
        return 2;
    }
    const int type = atoi(argv[1]);
    const int64_t N = atoll(argv[2]), K = atoll(argv[3]), M = atoll(argv[4]);
    const int rounds = atoi(argv[5]), repeat = atoi(argv[6]);
    if (!nq_known(type) || N % NQ_TILE || K % nq_block_elems(type) || M < 1) {
        fprintf(stderr, "kernels_ab: type %d with N %lld, K %lld, rows %lld does not fit\n", type, (long long)N,
                (long long)K, (long long)M);
        return 2;
    }
    const int64_t tiles = N / NQ_TILE, tile_bytes = K / nq_block_elems(type) * nq_unit_bytes(type);
    std::mt19937 rng(1);
    // on 2 MiB pages, as the extension holds weights (kernels/slabs.py)
    const size_t bytes = tiles * tile_bytes, huge = 2u << 20, held = (bytes + huge - 1) / huge * huge;
    std::unique_ptr<uint8_t, decltype(&free)> weights((uint8_t*)aligned_alloc(huge, held), free);
    uint8_t* w = weights.get();
    madvise(w, held, MADV_HUGEPAGE);
    for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t)rng();
    // float16 scales in every unit's header: 2^-7 .. 2^-6 (MXFP4's bytes are E8M0 exponents near 2^-7)
    for (int64_t u = 0; u < (int64_t)bytes / nq_unit_bytes(type); u++) {
        uint8_t* p = &w[u * nq_unit_bytes(type)];
        if (type == NQ_MXFP4) {
            for (int i = 0; i < NQ_TILE; i++) p[i] = (uint8_t)(120 + rng() % 4);
            continue;
        }
        for (int i = 0; i < nq_header(type) / 2; i++) {
            const uint16_t h = (uint16_t)(0x2000 + rng() % 0x400);
            memcpy(p + 2 * i, &h, 2);
        }
    }
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    std::vector<float> x(M * K), d(M * K / 32), ds(M * K / 32);
    std::vector<int8_t> q(M * K);
    std::vector<int16_t> s(M * K / 16);
    for (auto& v : x) v = uniform(rng);
    for (int64_t m = 0; m < M; m++)
        nq_b::quantize_row(&x[m * K], K, &q[m * K], &d[m * K / 32], &s[m * K / 16], &ds[m * K / 32]);
    std::vector<float> out_a(M * N), out_b(M * N);
    auto run = [&](Gemm fn, float* out) {
#pragma omp parallel
        {
            const int i = omp_get_thread_num(), n = omp_get_num_threads();
            fn(type, w, tiles * i / n, tiles * (i + 1) / n, N, K, q.data(), d.data(), s.data(), ds.data(), M,
               out, N);
        }
    };
    run(nq_a::gemm, out_a.data());
    run(nq_b::gemm, out_b.data());
    double diff = 0, largest = 0;
    for (int64_t i = 0; i < M * N; i++) {
        diff = std::max(diff, (double)std::fabs(out_a[i] - out_b[i]));
        largest = std::max(largest, (double)std::fabs(out_a[i]));
    }
    printf("max_diff %g max_abs %g\n", diff, largest);
    auto median = [&](Gemm fn, float* out) {
        std::vector<double> t(repeat);
        for (int r = 0; r < repeat; r++) {
            const double start = seconds();
            run(fn, out);
            t[r] = seconds() - start;
        }
        std::nth_element(t.begin(), t.begin() + repeat / 2, t.end());
        return t[repeat / 2];
    };
    for (int r = 0; r < rounds; r++) {
        const bool a_first = r % 2 == 0;  // the order turned round every other round
        const double first = median(a_first ? nq_a::gemm : nq_b::gemm, a_first ? out_a.data() : out_b.data());
        const double second = median(a_first ? nq_b::gemm : nq_a::gemm, a_first ? out_b.data() : out_a.data());
        printf("A %.9f B %.9f\n", a_first ? first : second, a_first ? second : first);
        fflush(stdout);
    }
    return 0;
}
