// AVX-512 VNNI on 256-bit registers (AVX512VL): one vpdpbusd per 32 weights.
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#define NQ_NS nq_vnni
#define NQ_AVX2 1
#define NQ_VNNI 1
#include "qkern.h"
