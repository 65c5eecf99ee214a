/* What the attention's vector routines share (attention_isa.c, attention_lanes.c): the target
 * attributes, and the loads of a cache row in either element type. Internal to ext/csrc. */
#ifndef LK_ATTENTION_SIMD_H
#define LK_ATTENTION_SIMD_H

#include <stdint.h>

#include "attention_isa.h"

#if (defined(__x86_64__) || defined(__i386__)) && !defined(LK_NO_X86)
#define LK_X86 1
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,fma")))
#define AVX2 __attribute__((target("avx2,fma,f16c"))) /* F16C: a float16 cache's elements */
#define INLINE512 AVX512 static inline __attribute__((always_inline))
#define INLINE256 AVX2 static inline __attribute__((always_inline))

/* 16 (8) elements of a cache row from element d: float32, or float16 turned into float32 (exact). */
INLINE512 __m512 load512(const void *row, int64_t d, const int half) {
    return half ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + d)))
                : _mm512_loadu_ps((const float *)row + d);
}
INLINE256 __m256 load256(const void *row, int64_t d, const int half) {
    return half ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + d)))
                : _mm256_loadu_ps((const float *)row + d);
}
/* The address of element d of a cache row. */
static inline const void *at(const void *row, int64_t d, const int half) {
    return half ? (const void *)((const uint16_t *)row + d) : (const void *)((const float *)row + d);
}

/* dots_block of the AVX-512 routines (attention_isa.h), over float32 and float16 keys: attention_lanes.c. */
void lk_attn_dots_lanes512(const float *const *q, int nq, const void *keys, int64_t stride, int64_t nk, int D,
                           float *const *out, float *kt);
void lk_attn_dots_lanes512_h(const float *const *q, int nq, const void *keys, int64_t stride, int64_t nk, int D,
                             float *const *out, float *kt);
#endif

#endif
