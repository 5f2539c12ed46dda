// AVX-512 VNNI with AMX: q_vnni.cpp's kernels, whose 16-row steps over two tiles (pair_rows, prefill)
// take each group's 16 x 16 dots from one tile multiply (tdpbsud) instead of 128 vpdpbusd. Chosen at
// run time where the CPU has AMX-INT8 and Linux grants the process its tile state (ops.cpp features).
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8")
#define NQ_NS nq_amx
#define NQ_AVX2 1
#define NQ_VNNI 1
#define NQ_AMX 1
#define NQ_AHEAD 0  // as q_vnni.cpp
#include "qkern.h"
