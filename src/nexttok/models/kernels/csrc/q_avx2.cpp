// AVX2 + FMA + F16C: int8 dot products by vpmaddubsw / vpmaddwd (every x86-64 CPU since 2013).
#pragma GCC target("avx2,fma,f16c")
#define NQ_NS nq_avx2
#define NQ_AVX2 1
#define NQ_VNNI 0
#include "qkern.h"
