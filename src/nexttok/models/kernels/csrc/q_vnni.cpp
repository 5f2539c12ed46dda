// AVX-512 VNNI on 256-bit registers (AVX512VL): one vpdpbusd per 32 weights.
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#define NQ_NS nq_vnni
#define NQ_AVX2 1
#define NQ_VNNI 1
// Software prefetch 2 KiB ahead on Intel's CPUs only (NQ_AHEAD_INTEL: CPUID's vendor, at load). On an AMD
// EPYC Zen 4 (AVX-512 VNNI, 2 MiB pages) the hardware prefetcher alone keeps one core near its ~34 GB/s, and
// the requests slowed a Q4_K weight from memory (131072x1536, one thread: bench/kernels_ab.py read
// 0.98-1.29x without them over six runs, median 1.08x); the Qwen2.5-1.5B-shaped Q4_K_M file decoded 1.19x
// faster without them (alternating processes, 8 rounds). On an Intel Xeon with AVX-512 VNNI and no AMX,
// one row times a weight from memory ran 1.13x and 1.04x (Q4_K), 1.13x and 1.45x (Q6_K), 1.15x (Q4_0),
// 1.16x and 1.33x (Q5_K), 1.21x and 1.22x (Q8_0) as fast with them, in two runs of 9 widely swinging rounds
// (bench/kernels_ab.py --against b8b2139 --isa avx512-vnni --types Q4_K,Q6_K,Q4_0,Q5_K,Q8_0 --rows 1
// --shape 96000,1536 --threads 2 --rounds 9), and
// the Qwen2.5-1.5B-shaped Q4_K_M file decoded 1.65x llama-bench's tg where it had read 1.18x
// (bench/scale.py). Xeons with AMX take q_amx.cpp, which keeps them too.
#define NQ_AHEAD 2048
#define NQ_AHEAD_INTEL 1
#include "qkern.h"
