# Native kernels of the fast forward: products with weights in GGML's Q4_1 / Q8_0 blocks (ext/csrc/qmatmul.h)
# for lookupdec.products, the RMS norm (ext/csrc/rmsnorm.h) and decode-time attention (ext/csrc/attention.h).

from libc.stdint cimport uint8_t


cdef extern from "qmatmul.h" nogil:
    int LK_Q4_1
    int LK_Q8_0
    int lk_qmatmul(int fmt, const float *x, int64_t rows, int64_t k, const uint8_t *qs, const float *dm,
                   int64_t n, float *y, int threads)
    const char *lk_qmatmul_isa()
    int lk_qmatmul_force_isa(const char *name)


cdef extern from "rmsnorm.h" nogil:
    void lk_rms_norm(const float *x, int64_t rows, int64_t n, const float *w, float eps, float *y)


cdef extern from "attention.h" nogil:
    int lk_attend(int n_seq, const int64_t *meta, const int64_t *kv, int layer, const float *qk, const float *v,
                  int64_t v_stride, int H, int Hk, int D, float scale, float *out, int threads)


cdef extern from "qpool.h" nogil:
    const char *lk_pool_kind()
    void lk_pool_force_own_threads(int on)


QMATMUL_FORMATS = {"q4_1": 0, "q8_0": 1}


def qmatmul_ptr(int fmt, size_t x, int64_t rows, int64_t k, size_t qs, size_t dm, int64_t n, size_t y,
                int threads):
    """``y = x @ W.T`` over raw addresses; the caller (lookupdec.products) owns the checks.

    ``x``: rows x k float32, ``y``: rows x n float32, both C-contiguous; ``qs`` and ``dm``:
    the blocks of ``fmt`` (0 Q4_1, 1 Q8_0) as qmatmul.h lays them out; k a multiple of 32.
    Every address must stay valid for the call (the GIL is released during it).
    """
    if fmt not in (0, 1) or rows < 0 or n < 0 or k % 32:
        raise ValueError("qmatmul: bad format or shape")
    with nogil:
        lk_qmatmul(fmt, <const float *>x, rows, k, <const uint8_t *>qs, <const float *>dm, n,
                   <float *>y, threads)


def qmatmul_isa():
    """The instruction set the quantized products use on this CPU: "avx512", "avx2" or "c"."""
    return lk_qmatmul_isa().decode()


def qmatmul_threads():
    """Whose threads run the quantized products: "openmp" (the OpenMP team torch uses) or "threads" (our own)."""
    return lk_pool_kind().decode()


def qmatmul_force_isa(str name):
    """Use instruction set ``name`` from now on, if this CPU has it (tests compare the paths); returns whether it did."""
    return bool(lk_qmatmul_force_isa(name.encode()))


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
    int64 ``(n_seq, 2)`` (cache address, capacity). Raw addresses, as ``qmatmul_ptr``: the
    caller (lookupdec.fast_forward) owns the checks.
    """
    if n_seq < 0 or heads <= 0 or kv_heads <= 0 or head_dim <= 0 or heads % kv_heads:
        raise ValueError("attend: bad shape")
    cdef int rc
    with nogil:
        rc = lk_attend(n_seq, <const int64_t *>meta, <const int64_t *>kv, layer, <const float *>qk,
                       <const float *>v, v_stride, heads, kv_heads, head_dim, scale, <float *>out, threads)
    if rc != 0:
        raise MemoryError("attend: out of memory")
