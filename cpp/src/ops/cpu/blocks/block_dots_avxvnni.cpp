// block_dots.inc for AVX-VNNI (with AVX2) (CMakeLists.txt gives this file its flags).
#if defined(__x86_64__)
#define RV_BLOCK_DOTS block_dots_avxvnni
#define RV_BLOCK_VNNI 1
#include "ops/cpu/blocks/block_dots.inc"
#endif
