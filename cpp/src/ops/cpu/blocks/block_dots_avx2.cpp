// block_dots.inc for AVX2 + FMA + F16C (CMakeLists.txt gives this file its flags).
#if defined(__x86_64__)
#define RV_BLOCK_DOTS block_dots_avx2
#define RV_BLOCK_VNNI 0
#include "ops/cpu/blocks/block_dots.inc"
#endif
