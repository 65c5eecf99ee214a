# A decode or verify forward in one native call (lookupdec.native_layers): the rows' embeddings, their
# rotary rows, every decoder layer (ext/csrc/layers.h), the final norm and, when asked, lm_head for
# some rows; a tree step's ids, positions and attention bias are built here from the tree's arrays.
#
# Right after a forward the weights it streamed (85 MB for the embedded model in the quantized
# format) have pushed the interpreter's and torch's code and data out of the caches, so each
# torch call around the layers ran 5-10 times slower than warm: some 350 us a one-row step and
# 400 us a tree step (2-core AMD EPYC). Here the same operations run from C on the same values.

from libc.float cimport FLT_MAX
from libc.stdint cimport int32_t
from libc.stdlib cimport malloc, free
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec


cdef inline double _now() noexcept nogil:
    cdef timespec t
    clock_gettime(CLOCK_MONOTONIC, &t)
    return t.tv_sec + t.tv_nsec * 1e-9


cdef void _tree_bias(float *bias, int64_t W, int64_t past, int64_t n, const int32_t *parents, int64_t m,
                     const uint8_t *visible) noexcept nogil:
    """``tree_rows.tree_attention_bias`` (W, past + W): every row sees the past and the root; node i
    (row 1 + i) also its ancestors and itself; extra row e (row 1 + n + e) the extra rows ``visible``
    names; 0 where a row attends, -FLT_MAX (float32's ``finfo.min``) elsewhere."""
    cdef int64_t cols = past + W, r, c, i, e, f, p
    cdef float *row
    for r in range(W):
        row = bias + r * cols
        for c in range(cols):
            row[c] = 0.0 if c <= past else -FLT_MAX
    for i in range(n):
        row = bias + (1 + i) * cols + past + 1
        p = parents[i]
        if p >= 0:
            memcpy(row, bias + (1 + p) * cols + past + 1, sizeof(float) * (p + 1))
        row[i] = 0.0
    for e in range(m):
        row = bias + (1 + n + e) * cols + past + 1 + n
        for f in range(m):
            if visible[e * m + f]:
                row[f] = 0.0


cdef class NativeModel:
    """A model's constants for ``body`` and ``tree``: raw addresses the caller (lookupdec.native_layers)
    keeps alive and checked shapes; each call's own arrays come as addresses too."""

    cdef size_t layers, final_norm, embed_qs, embed_dm, embed_f32, head_qs, head_dm
    cdef int n_layers, head_fmt
    cdef lk_shape shape
    cdef float final_eps
    cdef bint q41, q80
    cdef int64_t vocab
    cdef Py_ssize_t nb, qrow, drow
    cdef readonly str embed_fmt
    cdef object keep  # the arrays behind the addresses, alive as long as this object

    def __init__(self, size_t layers, int n_layers, int64_t hidden, int heads, int kv_heads, int head_dim,
                 int64_t inter, float eps, float scale, size_t final_norm, float final_eps, str embed_fmt,
                 size_t embed_qs, size_t embed_dm, size_t embed_f32, int64_t vocab, int head_fmt=-1,
                 size_t head_qs=0, size_t head_dm=0, object keep=None):
        """``embed_fmt``: "q4_1" or "q8_0" (blocks ``embed_qs``, float16 scales ``embed_dm``) or "float32"
        (the ``(vocab, hidden)`` matrix ``embed_f32``); ``head_fmt`` >= 0: ``lm_head``'s ``qmatmul_ptr``
        format and blocks over the same ``vocab`` (-1: no ``lm_head`` here); ``keep``: the objects that
        own the memory behind these addresses (held here, so a table swapped out of its owner stays
        valid for this object)."""
        self.keep = keep
        self.q41, self.q80, self.embed_fmt = embed_fmt == "q4_1", embed_fmt == "q8_0", embed_fmt
        if not (self.q41 or self.q80 or embed_fmt == "float32"):
            raise ValueError(f"NativeModel: unknown embedding format {embed_fmt!r}")
        if hidden <= 0 or hidden % 32 or n_layers < 0 or heads <= 0 or kv_heads <= 0 or head_dim <= 0 \
                or heads % kv_heads or vocab <= 0:
            raise ValueError("NativeModel: bad shape")
        self.layers, self.n_layers, self.final_norm, self.final_eps = layers, n_layers, final_norm, final_eps
        self.shape.hidden, self.shape.heads, self.shape.kv_heads = hidden, heads, kv_heads
        self.shape.head_dim, self.shape.inter, self.shape.eps, self.shape.scale = head_dim, inter, eps, scale
        self.embed_qs, self.embed_dm, self.embed_f32, self.vocab = embed_qs, embed_dm, embed_f32, vocab
        self.head_fmt, self.head_qs, self.head_dm = head_fmt, head_qs, head_dm
        self.nb = hidden // 32
        self.qrow = hidden // 2 if self.q41 else hidden
        self.drow = 2 * self.nb if self.q41 else self.nb

    @property
    def has_head(self):
        return self.head_fmt >= 0

    cdef object _check(self, const int64_t *tok, const int64_t *pos, int64_t rows, int64_t table_rows, int64_t past,
                       int64_t capacity, int kv_format):
        if kv_format != LK_KV_F32 and kv_format != LK_KV_F16:
            raise ValueError(f"NativeModel: KV cache format {kv_format} is not KV_FLOAT32 or KV_FLOAT16")
        if rows <= 0:
            raise ValueError("NativeModel: no rows")
        if past < 0 or past + rows > capacity:
            raise ValueError(f"NativeModel: {past} + {rows} rows do not fit a cache of {capacity}")
        cdef Py_ssize_t r
        for r in range(rows):
            if tok[r] < 0 or tok[r] >= self.vocab:
                raise IndexError(f"token ids must be in [0, {self.vocab}), got {tok[r]}")
            if pos[r] < 0 or pos[r] >= table_rows:
                raise ValueError(f"NativeModel: position {pos[r]} outside the rotary tables ({table_rows} rows)")

    cdef int _run(self, const int64_t *tok, const int64_t *pos, int64_t rows, const float *cos, const float *sin,
                  int64_t past, const float *bias, size_t kv, int64_t capacity, int kv_format, float *out,
                  const int64_t *want, int64_t n_want, float *logits, int threads, double *head_s) noexcept nogil:
        """Embeddings, rotary rows, layers, final norm into ``out``; then ``lm_head`` of rows ``want``
        (``n_want`` of them; all rows where ``want`` is NULL) into ``logits``. LK_OK or LK_ENOMEM."""
        cdef int64_t hidden = self.shape.hidden, D = self.shape.head_dim, r
        cdef int64_t meta[4]
        cdef int64_t kv_row[3]
        meta[0], meta[1], meta[2], meta[3] = 0, rows, past, <int64_t>bias
        kv_row[0], kv_row[1], kv_row[2] = <int64_t>kv, capacity, kv_format
        cdef int64_t n_sel = (n_want if want != NULL else rows) if logits != NULL else 0
        cdef float *x = <float *>malloc(sizeof(float) * (rows * (hidden + 2 * D) + n_sel * hidden))
        if x == NULL:
            return 1
        cdef float *c = x + rows * hidden
        cdef float *s = c + rows * D
        cdef float *sel = s + rows * D
        cdef int rc
        cdef double t0
        for r in range(rows):
            if self.q41 or self.q80:
                _block_row(self.q41, <const uint8_t *>self.embed_qs + tok[r] * self.qrow,
                           <const uint16_t *>self.embed_dm + tok[r] * self.drow, self.nb, x + r * hidden)
            else:
                memcpy(x + r * hidden, <const float *>self.embed_f32 + tok[r] * hidden, sizeof(float) * hidden)
            memcpy(c + r * D, cos + pos[r] * D, sizeof(float) * D)
            memcpy(s + r * D, sin + pos[r] * D, sizeof(float) * D)
        rc = lk_decode_layers(<const void *>self.layers, self.n_layers, &self.shape, x, rows, c, s, 1, meta, kv_row,
                              threads)
        if rc == 0:
            lk_rms_norm(x, rows, hidden, <const float *>self.final_norm, self.final_eps, out)
        if rc == 0 and n_sel:
            t0 = _now()
            if want != NULL:
                for r in range(n_sel):
                    memcpy(sel + r * hidden, out + want[r] * hidden, sizeof(float) * hidden)
            rc = lk_qmatmul(self.head_fmt, sel if want != NULL else out, n_sel, hidden,
                            <const uint8_t *>self.head_qs, <const float *>self.head_dm, self.vocab, logits, threads)
            head_s[0] = _now() - t0
        free(x)
        return rc

    def body(self, size_t ids, size_t positions, int64_t rows, size_t cos, size_t sin, int64_t table_rows,
             int64_t past, size_t bias, size_t kv, int64_t capacity, size_t out, int threads, size_t logits=0,
             int kv_format=LK_KV_F32):
        """``rows`` new rows of one sequence (int64 ``ids``/``positions``) on top of its cache to their
        final-normed hidden states ``out`` ``(rows, hidden)``; with ``logits``, also every row's logits
        ``(rows, vocab)``. ``cos``/``sin``: the rotary tables ``(table_rows, head_dim)``; ``bias``: float32
        ``(rows, past + rows)`` or 0 (no mask); ``kv``: the cache's ``(layers, 2, kv_heads, capacity,
        head_dim)`` store with room for ``past + rows``, of float32 or (``kv_format`` ``KV_FLOAT16``)
        float16 elements. Returns the seconds ``lm_head`` took (0
        without ``logits``). An id outside the vocabulary is an IndexError, a position outside the
        tables a ValueError (the caller grows them), both before anything is written."""
        if logits and self.head_fmt < 0:
            raise ValueError("NativeModel: no lm_head")
        cdef const int64_t *tok = <const int64_t *>ids
        cdef const int64_t *pos = <const int64_t *>positions
        self._check(tok, pos, rows, table_rows, past, capacity, kv_format)
        cdef int rc
        cdef double head_s = 0.0
        with nogil:
            rc = self._run(tok, pos, rows, <const float *>cos, <const float *>sin, past, <const float *>bias, kv,
                           capacity, kv_format, <float *>out, NULL, 0, <float *>logits, threads, &head_s)
        _attend_rc(rc, "NativeModel")
        return head_s

    def tree(self, int64_t root, size_t tokens, size_t parents, int64_t n, size_t extra_tokens, size_t extra_depth,
             size_t visible, int64_t m, int64_t width, size_t cos, size_t sin, int64_t table_rows, int64_t past,
             size_t kv, int64_t capacity, size_t out, size_t want, int64_t n_want, size_t logits, int threads,
             int kv_format=LK_KV_F32):
        """A verify forward of ``[root] + tree + extra rows`` (padded to ``width`` with the root), as
        ``tree_rows.tree_inputs`` and ``tree_attention_bias`` lay it out: the tree's int64 ``tokens`` and
        int32 ``parents`` (``n``), the extra rows' int64 ``extra_tokens`` / ``extra_depth`` and bool
        ``visible`` ``(m, m)``. Final-normed rows into ``out`` ``(width, hidden)``, the logits of the
        ``n_want`` rows ``want`` (int64) into ``logits``; returns ``lm_head``'s seconds."""
        if self.head_fmt < 0:
            raise ValueError("NativeModel: no lm_head")
        if n < 0 or m < 0 or 1 + n + m > width or n_want < 0:
            raise ValueError(f"NativeModel: {n} nodes and {m} extra rows do not fit {width} rows")
        cdef const int32_t *par = <const int32_t *>parents
        cdef const int64_t *sel = <const int64_t *>want
        cdef Py_ssize_t i
        for i in range(n):
            if par[i] < -1 or par[i] >= i:
                raise ValueError(f"NativeModel: parent {par[i]} of node {i}")
        for i in range(n_want):
            if sel[i] < 0 or sel[i] >= width:
                raise IndexError(f"NativeModel: row {sel[i]} outside {width} rows")
        cdef int64_t *buf = <int64_t *>malloc(sizeof(int64_t) * 2 * width)
        cdef float *bias = <float *>malloc(sizeof(float) * width * (past + width))
        if buf == NULL or bias == NULL:
            free(buf)
            free(bias)
            raise MemoryError("NativeModel: out of memory")
        cdef int64_t *tok = buf
        cdef int64_t *pos = buf + width
        cdef int32_t d
        for i in range(width):
            tok[i], pos[i] = root, past
        for i in range(n):  # depth from the parents: 1 under the root, parents ascending
            tok[1 + i] = (<const int64_t *>tokens)[i]
            pos[1 + i] = past + 1 if par[i] < 0 else pos[1 + par[i]] + 1
        for i in range(m):
            tok[1 + n + i] = (<const int64_t *>extra_tokens)[i]
            pos[1 + n + i] = past + (<const int64_t *>extra_depth)[i]
        cdef int rc
        cdef double head_s = 0.0
        try:
            self._check(tok, pos, width, table_rows, past, capacity, kv_format)
            with nogil:
                _tree_bias(bias, width, past, n, par, m, <const uint8_t *>visible)
                rc = self._run(tok, pos, width, <const float *>cos, <const float *>sin, past, bias, kv, capacity,
                               kv_format, <float *>out, sel, n_want, <float *>logits if n_want else NULL, threads,
                               &head_s)
        finally:
            free(buf)
            free(bias)
        _attend_rc(rc, "NativeModel")
        return head_s
