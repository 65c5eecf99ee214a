/* IEEE float16 <-> float32, scalar and portable: the KV cache's float16 format (attention.h).
 *
 * lk_half_from_float rounds to nearest, ties to even, as IEEE 754 and torch's .half() do:
 * above 65520 (the first value that rounds past 65504) it gives infinity, a NaN gives the
 * quiet NaN 0x7e00 with the sign kept, and values below 2^-14 become subnormals (or zero).
 * lk_half_to_float is exact: every float16 is a float32. Both are used on every instruction
 * set (the vector forms in attention_isa.c, F16C / AVX-512, compute the same values). */
#ifndef LK_HALF_H
#define LK_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint16_t lk_half_from_float(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504: infinity */
    if (ax >= 0x38800000u) {                                  /* a normal float16 (>= 2^-14) */
        uint32_t r = ax - (112u << 23);                       /* exponent bias 127 -> 15 */
        r += 0xfffu + ((r >> 13) & 1u);                       /* to nearest, ties to even */
        return (uint16_t)(sign | (r >> 13));
    }
    if (ax <= 0x33000000u) return sign; /* at most 2^-25, half the least subnormal: zero (a tie goes to even) */
    uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
    int shift = (int)(126u - e); /* value = m 2^(e - 150) = (m >> shift) units of 2^-24 */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

static inline float lk_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7fffu, bits;
    if (em < 0x400u) { /* zero or subnormal: em units of 2^-24, exact */
        float f = (float)em * 0x1p-24f;
        return sign ? -f : f;
    }
    if (em >= 0x7c00u)
        bits = sign | 0x7f800000u | ((em & 0x3ffu) << 13); /* infinity, NaN */
    else
        bits = sign | ((em << 13) + (112u << 23));
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

#endif
