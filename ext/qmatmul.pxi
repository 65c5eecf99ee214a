# Native kernels of the fast forward: products with weights in GGML's Q4_1 / Q8_0 blocks (ext/csrc/qmatmul.h)
# for lookupdec.products, the RMS norm (ext/csrc/rmsnorm.h), decode-time attention (ext/csrc/attention.h) and
# the decoder layers of a step in one call (ext/csrc/layers.h), the top-k of logit rows (ext/csrc/topk.h) and
# a token drawn from a logit row (ext/csrc/sample.h).

from libc.stdint cimport int8_t, uint8_t, uint16_t, uint32_t
from libc.string cimport memcpy


cdef extern from "qmatmul.h" nogil:
    int LK_Q4_1
    int LK_Q8_0
    int LK_BF16
    int LK_I8
    int64_t lk_qpack_i8_bytes(int fmt, int64_t n, int64_t k)
    int64_t lk_qpack_i8_floats(int fmt, int64_t n, int64_t k)
    void lk_qpack_i8(int fmt, const uint8_t *qs, const float *dm, int64_t n, int64_t k, uint8_t *pq, float *pdm)
    int lk_qmatmul_i8_native()
    const char *lk_qmatmul_i8_route()
    int lk_qmatmul(int fmt, const float *x, int64_t rows, int64_t k, const uint8_t *qs, const float *dm,
                   int64_t n, float *y, int threads)
    const char *lk_qmatmul_isa()
    int lk_qmatmul_bf16_native()
    const char *lk_qmatmul_bf16_isa()
    int lk_qmatmul_force_isa(const char *name)
    int lk_qmatmul_tall_rows(int rows)


cdef extern from "rmsnorm.h" nogil:
    void lk_rms_norm(const float *x, int64_t rows, int64_t n, const float *w, float eps, float *y)


cdef extern from "attention.h" nogil:
    int LK_KV_F32
    int LK_KV_F16
    int lk_attend_block_tiles(int tiles)
    int lk_attend(int n_seq, const int64_t *meta, const int64_t *kv, int layer, const float *qk, const float *v,
                  int64_t v_stride, int H, int Hk, int D, float scale, float *out, int threads)


cdef extern from "layers.h" nogil:
    ctypedef struct lk_shape:
        int64_t hidden, heads, kv_heads, head_dim, inter
        float eps, scale
    int LK_LAYER_INT64S
    int lk_decode_layers(const void *layers, int n_layers, const lk_shape *shape, float *x, int64_t R,
                         const float *cos, const float *sin, int n_seq, const int64_t *meta, const int64_t *kv,
                         int threads)
    void lk_rotary(const float *x, int64_t R, int64_t heads, int64_t D, const float *cos, const float *sin,
                   float *out)
    void lk_silu_mul(const float *gu, int64_t R, int64_t inter, float *a)


cdef extern from "topk.h" nogil:
    int LK_TOPK_MAX
    void lk_topk_rows(const float *x, int64_t R, int64_t n, int k, int64_t *ids, float *probs)


cdef extern from "rowexp.h" nogil:
    int64_t lk_row_argmax(const float *x, int64_t n)


cdef extern from "sample.h" nogil:
    int64_t lk_sample_row(const float *x, int64_t n, float temperature, double u, float *e)


cdef extern from "qpool.h" nogil:
    const char *lk_pool_kind()
    void lk_pool_force_own_threads(int on)


QMATMUL_FORMATS = {"q4_1": 0, "q8_0": 1}
QMATMUL_BF16 = LK_BF16  # or'ed into a format: bfloat16 products (qmatmul.h)
QMATMUL_I8 = LK_I8  # or'ed into a format: 8-bit activations, on weights repacked by qpack_i8 (qmatmul.h)


def qmatmul_ptr(int fmt, size_t x, int64_t rows, int64_t k, size_t qs, size_t dm, int64_t n, size_t y,
                int threads):
    """``y = x @ W.T`` over raw addresses; the caller (lookupdec.products) owns the checks.

    ``x``: rows x k float32, ``y``: rows x n float32, both C-contiguous; ``qs`` and ``dm``:
    the blocks of ``fmt`` (0 Q4_1, 1 Q8_0; or'ed with ``QMATMUL_BF16``: bfloat16 products; or with
    ``QMATMUL_I8``: 8-bit activations, ``qs`` and ``dm`` then repacked by ``qpack_i8``) as
    qmatmul.h lays them out; k a multiple of 32.
    Every address must stay valid for the call (the GIL is released during it).
    """
    if fmt & ~(LK_BF16 | LK_I8) not in (0, 1) or rows < 0 or n < 0 or k % 32:
        raise ValueError("qmatmul: bad format or shape")
    cdef int rc
    with nogil:
        rc = lk_qmatmul(fmt, <const float *>x, rows, k, <const uint8_t *>qs, <const float *>dm, n,
                   <float *>y, threads)
    if rc != 0:
        raise MemoryError("qmatmul: out of memory")


def qmatmul_isa():
    """The instruction set the quantized products use on this CPU: "avx512", "avx2" or "c"."""
    return lk_qmatmul_isa().decode()


def qmatmul_bf16_native():
    """Whether this CPU runs the bfloat16 products (``QMATMUL_BF16``) natively (AVX-512 BF16); else they run in C."""
    return bool(lk_qmatmul_bf16_native())


def qmatmul_i8_native():
    """Whether this CPU runs the 8-bit products (``QMATMUL_I8``) with vector instructions (AVX-512 VNNI or
    AVX2); else they run in C."""
    return bool(lk_qmatmul_i8_native())


def qmatmul_i8_isa():
    """The route the 8-bit products take now: "avx512vnni", "avx2" or "c" (it follows ``qmatmul_force_isa``)."""
    return lk_qmatmul_i8_route().decode()


def qpack_i8(int fmt, const uint8_t[:, ::1] qs, const float[:, ::1] dm, int64_t n, int64_t k):
    """The blocks of an ``n`` x ``k`` matrix in format ``fmt`` (0 Q4_1, 1 Q8_0; ``qs`` and ``dm`` as
    qmatmul.h lays them out, one row of blocks per output) repacked for ``QMATMUL_I8`` products:
    ``(bytes, floats)`` as numpy arrays (outputs padded to a multiple of 16)."""
    if fmt not in (0, 1) or n < 0 or k % 32:
        raise ValueError("qpack_i8: bad format or shape")
    nblk = k // 32
    if qs.shape[0] != n or qs.shape[1] != nblk * (16 if fmt == 0 else 32) or dm.shape[0] != n \
            or dm.shape[1] != nblk * (2 if fmt == 0 else 1):
        raise ValueError("qpack_i8: blocks of the wrong shape for the matrix")
    pq = np.empty(lk_qpack_i8_bytes(fmt, n, k), dtype=np.uint8)
    pdm = np.empty(lk_qpack_i8_floats(fmt, n, k), dtype=np.float32)
    cdef uint8_t[::1] pqv = pq
    cdef float[::1] pdmv = pdm
    if n and nblk:
        with nogil:
            lk_qpack_i8(fmt, &qs[0, 0], &dm[0, 0], n, k, &pqv[0], &pdmv[0])
    return pq, pdm


def qmatmul_bf16_isa():
    """The route the bfloat16 products take now: "avx512bf16" or "c"."""
    return lk_qmatmul_bf16_isa().decode()


def qmatmul_threads():
    """Whose threads run the quantized products: "openmp" (the OpenMP team torch uses) or "threads" (our own)."""
    return lk_pool_kind().decode()


def qmatmul_force_isa(str name):
    """Use instruction set ``name`` from now on, if this CPU has it (tests compare the paths); returns whether it did."""
    return bool(lk_qmatmul_force_isa(name.encode()))


def qmatmul_tall_rows(int rows=-1):
    """The most rows a product takes the tall tiles for (24 with AVX-512, 8 with AVX2, reset when the
    instruction set is forced); ``rows`` >= 0 sets it (tests and benchmarks compare the routes, which
    give the same bits). Returns the value before."""
    return lk_qmatmul_tall_rows(rows)


def attend_block_tiles(int tiles=-1):
    """The fewest tiles of queries (4 each: a row's heads of one kv head, side by side) for which a task of
    the native attention scores its keys with the keys in the vector lanes (AVX-512 only; 5 by default,
    0 = never); ``tiles`` >= 0 sets it (tests and benchmarks compare the routes, which give the same
    bits). Returns the value before."""
    return lk_attend_block_tiles(tiles)


def qmatmul_force_own_threads(bint on):
    """Tests: run the products on our own threads even where an OpenMP team is loaded (``on=False`` undoes it)."""
    lk_pool_force_own_threads(on)


def rms_norm_ptr(size_t x, int64_t rows, int64_t n, size_t w, float eps, size_t y):
    """RMS-normalise ``rows`` float32 rows of ``n`` at address ``x`` into ``y`` with weights ``w`` (ext/csrc/rmsnorm.h).

    Raw addresses, as ``qmatmul_ptr``: the caller (lookupdec.fast_forward) owns the checks.
    """
    if rows < 0 or n <= 0:
        raise ValueError("rms_norm: bad shape")
    with nogil:
        lk_rms_norm(<const float *>x, rows, n, <const float *>w, eps, <float *>y)


def attend_ptr(int n_seq, size_t meta, size_t kv, int layer, size_t qk, size_t v, int64_t v_stride, int heads,
               int kv_heads, int head_dim, float scale, size_t out, int threads):
    """One layer's attention for the new rows of ``n_seq`` sequences (ext/csrc/attention.h).

    ``meta``: int64 ``(n_seq, 4)`` (first row, rows, cached rows, bias address or 0); ``kv``:
    int64 ``(n_seq, 3)`` (cache address, capacity, ``KV_FLOAT32`` or ``KV_FLOAT16``). Raw
    addresses, as ``qmatmul_ptr``: the caller (lookupdec.fast_forward) owns the checks; an unknown
    cache format is a ValueError, before anything is written.
    """
    if n_seq < 0 or heads <= 0 or kv_heads <= 0 or head_dim <= 0 or heads % kv_heads:
        raise ValueError("attend: bad shape")
    cdef int rc
    with nogil:
        rc = lk_attend(n_seq, <const int64_t *>meta, <const int64_t *>kv, layer, <const float *>qk,
                       <const float *>v, v_stride, heads, kv_heads, head_dim, scale, <float *>out, threads)
    _attend_rc(rc, "attend")


cdef _attend_rc(int rc, str what):
    if rc == LK_ERANGE:
        raise ValueError(f"{what}: a key or value of this model reached float16's range (65,504), which a float16 "
                         "KV cache cannot hold; use kv_dtype='float32' (--kv-dtype float32)")
    if rc == LK_EBADARG:
        raise ValueError(f"{what}: a KV cache format other than KV_FLOAT32 ({LK_KV_F32}) or KV_FLOAT16 ({LK_KV_F16})")
    if rc != 0:
        raise MemoryError(f"{what}: out of memory")


LAYER_INT64S = LK_LAYER_INT64S
# A KV cache's element format, the third int64 of its ``kv`` row (ext/csrc/attention.h).
KV_FLOAT32, KV_FLOAT16 = LK_KV_F32, LK_KV_F16


def decode_layers_ptr(size_t layers, int n_layers, int64_t hidden, int heads, int kv_heads, int head_dim,
                      int64_t inter, float eps, float scale, size_t x, int64_t rows, size_t cos, size_t sin,
                      int n_seq, size_t meta, size_t kv, int threads):
    """Every decoder layer of a decode or verify step in one call (ext/csrc/layers.h).

    ``layers``: int64 ``(n_layers, LAYER_INT64S)``, as ``lk_layer`` lays it out; ``x``: the
    ``rows`` float32 residual rows, updated in place; ``cos``/``sin``: ``(rows, head_dim)``;
    ``meta``/``kv``: the sequences, as ``attend_ptr`` takes them. Raw addresses, as
    ``qmatmul_ptr``: the caller (lookupdec.native_layers) owns the checks.
    """
    if n_layers < 0 or rows < 0 or heads <= 0 or kv_heads <= 0 or head_dim <= 0 or heads % kv_heads:
        raise ValueError("decode_layers: bad shape")
    cdef lk_shape shape
    shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.inter = hidden, heads, kv_heads, head_dim, inter
    shape.eps, shape.scale = eps, scale
    cdef int rc
    with nogil:
        rc = lk_decode_layers(<const void *>layers, n_layers, &shape, <float *>x, rows, <const float *>cos,
                              <const float *>sin, n_seq, <const int64_t *>meta, <const int64_t *>kv, threads)
    _attend_rc(rc, "decode_layers")


def rotary_ptr(size_t x, int64_t rows, int64_t heads, int64_t head_dim, size_t cos, size_t sin, size_t out):
    """Rotary of ``rows`` x ``heads`` float32 head vectors, as the native layers apply it (tests)."""
    if rows < 0 or heads < 0 or head_dim <= 0 or head_dim % 2:
        raise ValueError("rotary: bad shape")
    with nogil:
        lk_rotary(<const float *>x, rows, heads, head_dim, <const float *>cos, <const float *>sin, <float *>out)


def silu_mul_ptr(size_t gu, int64_t rows, int64_t inter, size_t out):
    """``silu(gate) * up`` of ``rows`` float32 rows ``[gate | up]``, as the native layers compute it (tests)."""
    if rows < 0 or inter < 0:
        raise ValueError("silu_mul: bad shape")
    with nogil:
        lk_silu_mul(<const float *>gu, rows, inter, <float *>out)


TOPK_MAX = LK_TOPK_MAX


def topk_rows_ptr(size_t x, int64_t rows, int64_t n, int k, size_t ids, size_t probs):
    """Top-``k`` ids (int64) and softmax probabilities (float32) of ``rows`` float32 rows of ``n`` logits
    (ext/csrc/topk.h). Raw addresses, as ``qmatmul_ptr``: the caller (lookupdec.tree_rows) owns the checks."""
    if rows < 0 or not 1 <= k <= LK_TOPK_MAX or k > n:
        raise ValueError("topk_rows: bad shape")
    with nogil:
        lk_topk_rows(<const float *>x, rows, n, k, <int64_t *>ids, <float *>probs)


def topk_rows_at(list addresses, int64_t n, int k):
    """``topk_rows_ptr`` of separate rows of ``n`` float32 logits, one address each: returns
    ``(ids (R, k) int64, probs (R, k) float32)``, made here (numpy's ``.ctypes`` costs ~5 us an
    array right after a forward). The caller (lookupdec.tree_rows) owns the checks."""
    cdef int64_t R = len(addresses), r
    if n <= 0 or not 1 <= k <= LK_TOPK_MAX or k > n:
        raise ValueError("topk_rows: bad shape")
    ids = np.empty((R, k), dtype=np.int64)
    probs = np.empty((R, k), dtype=np.float32)
    if R == 0:
        return ids, probs
    cdef int64_t[:, ::1] iv = ids
    cdef float[:, ::1] pv = probs
    cdef size_t x
    for r in range(R):
        x = addresses[r]
        with nogil:
            lk_topk_rows(<const float *>x, 1, n, k, &iv[r, 0], &pv[r, 0])
    return ids, probs


def argmax_ptr(size_t x, int64_t n):
    """numpy's ``argmax`` of ``n`` float32 logits at address ``x`` (the first maximum; the first NaN if
    any), read with the widest instruction set this CPU has. A raw address: the caller
    (lookupdec.tree_rows) owns the checks. (numpy's route cost ~22-30 us a step in ``.numpy()``
    alone, right after a forward.)"""
    if n <= 0:
        raise ValueError("argmax: no logits")
    cdef int64_t j
    with nogil:
        j = lk_row_argmax(<const float *>x, n)
    return j


def sample_row_ptr(size_t x, int64_t n, float temperature, double u, size_t scratch):
    """The token at ``u`` in [0, 1) of softmax(x / temperature) over ``n`` float32 logits at ``x``
    (ext/csrc/sample.h); ``scratch``: ``n`` float32. Raw addresses: the caller (lookupdec.sampling)
    owns the checks."""
    if n <= 0 or not temperature > 0 or not 0.0 <= u < 1.0:
        raise ValueError("sample_row: bad shape, temperature or u")
    cdef int64_t j
    with nogil:
        j = lk_sample_row(<const float *>x, n, temperature, u, <float *>scratch)
    return j


cdef inline float _half(uint16_t h) noexcept nogil:
    """An IEEE half's value as a float32 (exact: every half is a float32)."""
    cdef uint32_t sign = (<uint32_t>(h & 0x8000)) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits
    cdef float v
    if e == 0:  # zero or subnormal: m * 2^-24, exact
        v = <float>m * 5.9604644775390625e-08
        return -v if sign else v
    if e == 31:
        bits = sign | 0x7f800000u | (m << 13)
    else:
        bits = sign | ((e + 112) << 23) | (m << 13)
    memcpy(&v, &bits, 4)
    return v


cdef inline void _block_row(bint q41, const uint8_t *q, const uint16_t *dm, Py_ssize_t nb, float *o) noexcept nogil:
    """One row of a block-format matrix as float32, as GGML forms it (d * q + m; d * q exact): ``nb``
    blocks of Q4_1 (16 bytes, scales d, m) or Q8_0 (32 bytes, scale d), float16 scales as uint16."""
    cdef Py_ssize_t b, j
    cdef float d, m
    for b in range(nb):
        if q41:
            d, m = _half(dm[2 * b]), _half(dm[2 * b + 1])
            for j in range(16):
                o[32 * b + j] = d * <float>(q[16 * b + j] & 15) + m
                o[32 * b + 16 + j] = d * <float>(q[16 * b + j] >> 4) + m
        else:
            d = _half(dm[b])
            for j in range(32):
                o[32 * b + j] = d * <float>(<int8_t>q[32 * b + j])


def dequant_rows(str fmt, const uint8_t[:, ::1] qs, const uint16_t[:, ::1] dm, list rows, int64_t k):
    """Rows ``rows`` (a list of ints) of a block-format matrix (``lookupdec.blocks``: q4_1 or q8_0,
    ``dm`` its float16 scales as uint16), as ``(R, k)`` float32, each weight formed as GGML forms it (``d * q + m``; ``d * q``
    is exact): an embedding lookup in one call. ``blocks.dequantize_rows`` is the reference; a row
    outside the matrix is an IndexError."""
    cdef Py_ssize_t n = qs.shape[0], R = len(rows), r, nb = k // 32
    cdef int64_t row
    cdef bint q41 = fmt == "q4_1"
    if not q41 and fmt != "q8_0":
        raise ValueError(f"dequant_rows: unknown format {fmt!r}")
    if k % 32 or dm.shape[0] != n or qs.shape[1] != (k // 2 if q41 else k) or dm.shape[1] != (2 * nb if q41 else nb):
        raise ValueError("dequant_rows: blocks of another shape")
    cdef int64_t[::1] at = np.empty(R, np.int64)
    for r in range(R):
        row = rows[r]  # (a Python int: anything else is a TypeError)
        if row < 0 or row >= n:
            raise IndexError(f"rows must be in [0, {n}), got {row}")
        at[r] = row
    out = np.empty((R, k), np.float32)
    cdef float[:, ::1] o = out
    with nogil:
        for r in range(R):
            _block_row(q41, &qs[at[r], 0], &dm[at[r], 0], nb, &o[r, 0])
    return out
