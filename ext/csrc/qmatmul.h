/* Products with weights kept in GGML's block formats, dequantized inside the kernel.
 *
 *   y[r, n] = sum_k x[r, k] * w[n, k]    (x: R x K float32, y: R x N float32, row-major)
 *
 * Weights are blocks of 32 along k, one row of blocks per output n:
 *   Q4_1: w = d * q + m, q in 0..15: qs holds 16 bytes a block, element j (0..15) in
 *         the low nibble of byte j, element j + 16 in its high nibble; dm holds (d, m)
 *         as float32 (the file's float16 values, widened), two per block.
 *   Q8_0: w = d * q, q in -127..127: qs holds 32 signed bytes a block; dm holds d as
 *         float32, one per block.
 * Every weight is formed exactly as GGML dequantizes it (d * q + m rounded once to
 * float32; d * q is exact), so the product reads the same values as a float32 matrix.
 *
 * Each y[r, n] is summed in one fixed order, whatever R, the other rows, the thread
 * count or n's place in a tile: a row's output never depends on the rest of the
 * batch. The instruction set (AVX-512, AVX2 with FMA, or plain C) is chosen once per
 * process from the CPU; each has its own order. K must be a multiple of 32. */
#ifndef LK_QMATMUL_H
#define LK_QMATMUL_H

#include <stdint.h>

#define LK_QK 32 /* weights per block */
#define LK_Q4_1 0
#define LK_Q8_0 1
/* Or'ed into the format: bfloat16 products. Each weight (formed as above) and each input
 * element is rounded to bfloat16 (to nearest even; subnormals to zero), and the products are
 * summed in float32 (AVX-512 BF16's dot products of pairs where the CPU has them). A row's
 * output is still independent of the other rows. */
#define LK_BF16 16
/* Or'ed into the format: 8-bit activations (qmatmul_i8.c). Each input row is rounded to 8 bits
 * per block of 32 (its own scale per block: a / 127, a the block's largest magnitude), each
 * block's sum is taken in integers against the weights' own integers, then scaled: y = sum over
 * blocks, in order, of fma(float(sum q p), d * s, y) (+ fma(m, s * sum p, y) for Q4_1). The
 * weights must be repacked first (lk_qpack_i8): qs and dm are then the packed bytes and floats.
 * A row's output is still independent of the other rows, bit for bit, on every route. */
#define LK_I8 32

/* Returns LK_OK (also when some threads could not start: the product is still complete), or LK_ENOMEM
 * when the bfloat16 rows could not be allocated (y is then undefined). */
int lk_qmatmul(int fmt, const float *x, int64_t rows, int64_t k, const uint8_t *qs, const float *dm,
               int64_t n, float *y, int threads);

/* The repacked weights of LK_I8 products: their bytes and floats, and the packing itself
 * (qmatmul_i8.c; outputs padded to a multiple of 16). */
int64_t lk_qpack_i8_bytes(int fmt, int64_t n, int64_t k);
int64_t lk_qpack_i8_floats(int fmt, int64_t n, int64_t k);
void lk_qpack_i8(int fmt, const uint8_t *qs, const float *dm, int64_t n, int64_t k, uint8_t *pq, float *pdm);

/* Whether this CPU runs the 8-bit products with vector instructions (AVX-512 VNNI or AVX2); else
 * they run in plain C. */
int lk_qmatmul_i8_native(void);

/* The route the 8-bit products take now: "avx512vnni", "avx2" or "c" (it follows the forced ISA). */
const char *lk_qmatmul_i8_route(void);

/* The instruction set in use: "avx512", "avx2" or "c". */
const char *lk_qmatmul_isa(void);

/* Whether this CPU runs the bfloat16 products natively (AVX-512 BF16); else they run in plain C. */
int lk_qmatmul_bf16_native(void);

/* The route the bfloat16 products take now: "avx512bf16" or "c" (forcing "c" or "avx2" takes "c"). */
const char *lk_qmatmul_bf16_isa(void);

/* The most rows a product takes the tall tiles for (between the 4-row register tile and the
 * scratch tile; the sums are the same bits on every route): 24 with AVX-512, 8 with AVX2, reset
 * when the instruction set is picked or forced. rows >= 0 sets it (tests and benchmarks; 0 or 4:
 * never); returns the value before. */
int lk_qmatmul_tall_rows(int rows);

/* Forces an instruction set ("avx512", "avx2", "c") if the CPU has it (tests); returns 1 if set. */
int lk_qmatmul_force_isa(const char *name);

#endif
