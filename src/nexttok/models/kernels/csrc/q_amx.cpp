// AVX-512 VNNI with AMX: q_vnni.cpp's kernels, whose 16-row steps over two tiles (pair_rows, prefill)
// take each group's 16 x 16 dots from one tile multiply (tdpbsud) instead of 128 vpdpbusd. Chosen at
// run time where the CPU has AMX-INT8 and Linux grants the process its tile state (ops.cpp features).
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8")
#define NQ_NS nq_amx
#define NQ_AVX2 1
#define NQ_VNNI 1
#define NQ_AMX 1
// Software prefetch 2 KiB ahead, which q_vnni.cpp leaves out for AMD's Zen 4: on this Intel Xeon (with AMX)
// one row times a Q4_K / Q6_K / Q4_0 weight from memory (96000 x 1536, 2 threads) ran 1.52x / 1.29x / 1.41x
// with it (bench/kernels_ab.py --isa amx --against df8dd73 --rows 1 --shape 96000,1536 --threads 2)
#define NQ_AHEAD 2048
#include "qkern.h"
