// AVX-512 VNNI on 256-bit registers (AVX512VL): one vpdpbusd per 32 weights.
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#define NQ_NS nq_vnni
#define NQ_AVX2 1
#define NQ_VNNI 1
// No software prefetch: on an AMD EPYC Zen 4 (AVX-512 VNNI, 2 MiB pages) the hardware prefetcher alone
// keeps one core near its ~34 GB/s, and the requests 2 KiB ahead slowed a Q4_K weight from memory
// (131072x1536, one thread: bench/kernels_ab.py read 0.98-1.29x without them over six runs, median
// 1.08x); the Qwen2.5-1.5B-shaped Q4_K_M file decoded 1.19x faster without them (alternating
// processes, 8 rounds). An Intel Xeon with AMX takes q_amx.cpp, which keeps them (1.3-1.5x there); Xeons
// with VNNI and no AMX are not measured.
#define NQ_AHEAD 0
#include "qkern.h"
