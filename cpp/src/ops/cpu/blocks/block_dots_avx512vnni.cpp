// block_dots.inc for AVX512-VNNI on 256-bit lanes (AVX512VL) (CMakeLists.txt gives this file its flags).
#if defined(__x86_64__)
#define RV_BLOCK_DOTS block_dots_avx512vnni
#define RV_BLOCK_VNNI 2
#include "ops/cpu/blocks/block_dots.inc"
#endif
