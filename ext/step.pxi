# A decode or verify forward's body in one native call (lookupdec.native_layers.NativeBody): the rows'
# embeddings, their rotary rows, every decoder layer (ext/csrc/layers.h) and the final norm.
#
# Right after a forward the weights it streamed (85 MB for the embedded model in the quantized
# format) have pushed the interpreter's and torch's code and data out of the caches, so each
# torch call around the layers ran 5-10 times slower than warm: some 350 us a step (2-core AMD
# EPYC). Here the same operations run from C, in the same order on the same values.

from libc.stdlib cimport malloc, free
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec


cdef inline double _now() noexcept nogil:
    cdef timespec t
    clock_gettime(CLOCK_MONOTONIC, &t)
    return t.tv_sec + t.tv_nsec * 1e-9


cdef inline void _block_row(bint q41, const uint8_t *q, const uint16_t *dm, Py_ssize_t nb, float *o) noexcept nogil:
    """One row of a block-format matrix as float32 (``dequant_rows``' loop: d * q + m; d * q exact)."""
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


def decode_body_ptr(size_t layers, int n_layers, int64_t hidden, int heads, int kv_heads, int head_dim, int64_t inter,
                    float eps, float scale, size_t final_norm, float final_eps,
                    str embed_fmt, size_t embed_qs, size_t embed_dm, size_t embed_f32, int64_t vocab,
                    size_t ids, size_t positions, int64_t rows, size_t cos, size_t sin, int64_t table_rows,
                    int64_t past, size_t bias, size_t kv, int64_t capacity, size_t out, int threads,
                    int head_fmt=-1, size_t head_qs=0, size_t head_dm=0, size_t logits=0):
    """One sequence's ``rows`` new rows on top of its cache, to their final-normed hidden states.

    ``ids``/``positions``: int64 ``(rows,)``; the embedding is the block matrix ``embed_qs`` /
    ``embed_dm`` (``embed_fmt`` "q4_1" or "q8_0", scales float16 as uint16) or, with ``embed_fmt``
    "float32", the ``(vocab, hidden)`` matrix ``embed_f32``; ``cos``/``sin``: the rotary tables
    ``(table_rows, head_dim)``; ``bias``: float32 ``(rows, past + rows)`` or 0 (no mask);
    ``kv``: the cache's ``(layers, 2, kv_heads, capacity, head_dim)`` float32 store, with room for
    ``past + rows``; ``out``: float32 ``(rows, hidden)``. Raw addresses, as ``decode_layers_ptr``:
    the caller (lookupdec.native_layers) owns the shapes. An id outside the vocabulary is an
    IndexError; a position outside the tables a ValueError (the caller grows them first).

    With ``head_fmt`` >= 0 (a ``qmatmul_ptr`` format), also every row's logits from ``out`` into
    ``logits`` (``(rows, vocab)``) through ``lm_head``'s blocks ``head_qs`` / ``head_dm``: returns the
    seconds that product took (the cost model prices ``lm_head`` apart), else 0.
    """
    cdef bint q41 = embed_fmt == "q4_1", q80 = embed_fmt == "q8_0"
    if not (q41 or q80 or embed_fmt == "float32"):
        raise ValueError(f"decode_body: unknown embedding format {embed_fmt!r}")
    if rows <= 0 or hidden % 32 or n_layers < 0 or heads <= 0 or kv_heads <= 0 or head_dim <= 0 or heads % kv_heads:
        raise ValueError("decode_body: bad shape")
    if past < 0 or past + rows > capacity:
        raise ValueError(f"decode_body: {past} + {rows} rows do not fit a cache of {capacity}")
    cdef const int64_t *tok = <const int64_t *>ids
    cdef const int64_t *pos = <const int64_t *>positions
    cdef Py_ssize_t r
    for r in range(rows):
        if tok[r] < 0 or tok[r] >= vocab:
            raise IndexError(f"token ids must be in [0, {vocab}), got {tok[r]}")
        if pos[r] < 0 or pos[r] >= table_rows:
            raise ValueError(f"decode_body: position {pos[r]} outside the rotary tables ({table_rows} rows)")
    cdef lk_shape shape
    shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.inter = hidden, heads, kv_heads, head_dim, inter
    shape.eps, shape.scale = eps, scale
    cdef int64_t meta[4]
    cdef int64_t kv_row[2]
    meta[0], meta[1], meta[2], meta[3] = 0, rows, past, <int64_t>bias
    kv_row[0], kv_row[1] = <int64_t>kv, capacity
    cdef Py_ssize_t nb = hidden // 32, qrow = hidden // 2 if q41 else hidden, drow = 2 * nb if q41 else nb
    cdef float *x = <float *>malloc(sizeof(float) * rows * (hidden + 2 * head_dim))
    if x == NULL:
        raise MemoryError("decode_body: out of memory")
    cdef float *c = x + rows * hidden
    cdef float *s = c + rows * head_dim
    cdef int rc
    cdef double t0 = 0.0, head_s = 0.0
    with nogil:
        for r in range(rows):
            if q41 or q80:
                _block_row(q41, <const uint8_t *>embed_qs + tok[r] * qrow, <const uint16_t *>embed_dm + tok[r] * drow,
                           nb, x + r * hidden)
            else:
                memcpy(x + r * hidden, <const float *>embed_f32 + tok[r] * hidden, sizeof(float) * hidden)
            memcpy(c + r * head_dim, <const float *>cos + pos[r] * head_dim, sizeof(float) * head_dim)
            memcpy(s + r * head_dim, <const float *>sin + pos[r] * head_dim, sizeof(float) * head_dim)
        rc = lk_decode_layers(<const void *>layers, n_layers, &shape, x, rows, c, s, 1, meta, kv_row, threads)
        if rc == 0:
            lk_rms_norm(x, rows, hidden, <const float *>final_norm, final_eps, <float *>out)
        if rc == 0 and head_fmt >= 0:
            t0 = _now()
            rc = lk_qmatmul(head_fmt, <const float *>out, rows, hidden, <const uint8_t *>head_qs,
                            <const float *>head_dm, vocab, <float *>logits, threads)
            head_s = _now() - t0
    free(x)
    if rc != 0:
        raise MemoryError("decode_body: out of memory")
    return head_s
