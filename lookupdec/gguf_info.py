"""How a GGUF file stores its tensors, read from the header alone (no tensor data, no tokenizer parsing):
each tensor's name, type, shape and place in the file, and the file's architecture.

``gguf.GGUFReader`` builds an object for every metadata item (seconds for a
tokenizer of 49k strings); the weight-format rule only needs each tensor's
type, so this walks the header with ``struct`` and skips the metadata values.
"""
from __future__ import annotations

import dataclasses
import mmap
import struct
from dataclasses import dataclass

# GGUF metadata value types: fixed sizes of the scalar ones (8 = string, 9 = array).
_SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
# GGML tensor type ids of plain float storage; every other id is a block-quantized type
# whose scales are float16 (Q4_0.. Q8_1, the K-quants, the IQ types).
FLOAT_TYPES = {0: "float32", 1: "float16", 30: "bfloat16", 28: "float64"}


def _skip_value(buf, pos: int, vtype: int) -> int:
    if vtype in _SCALAR_SIZE:
        return pos + _SCALAR_SIZE[vtype]
    if vtype == _STRING:
        (n,) = struct.unpack_from("<Q", buf, pos)
        return pos + 8 + n
    if vtype == _ARRAY:
        etype, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if etype in _SCALAR_SIZE:
            return pos + count * _SCALAR_SIZE[etype]
        for _ in range(count):
            pos = _skip_value(buf, pos, etype)
        return pos
    raise ValueError(f"unknown GGUF metadata value type {vtype}")


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file, as its header describes it."""

    name: str
    type_id: int  # GGML type id (FLOAT_TYPES names the plain float ones)
    shape: tuple[int, ...]  # as GGUF lists it: the fastest-varying dimension first
    offset: int  # bytes from the start of the file


@dataclass(frozen=True)
class GGUFHeader:
    """What ``read_header`` takes from a GGUF file: its architecture and its tensors."""

    architecture: str  # general.architecture ("" when absent)
    tensors: list[TensorInfo]


def _string(buf, pos: int) -> str:
    (n,) = struct.unpack_from("<Q", buf, pos)
    return bytes(buf[pos + 8: pos + 8 + n]).decode("utf-8")


def read_header(path: str) -> GGUFHeader:
    """A GGUF file's architecture and tensors, from its header (metadata values skipped but two).

    Raises:
        ValueError: not a GGUF file, or a header this reader does not know.
    """
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        try:
            magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
            if magic != b"GGUF" or version not in (2, 3):
                raise ValueError(f"{path!r} is not a GGUF file of version 2 or 3")
            pos, architecture, alignment = 24, "", 32
            for _ in range(n_kv):
                key = _string(buf, pos)
                pos += 8 + len(key.encode("utf-8"))
                (vtype,) = struct.unpack_from("<I", buf, pos)
                if key == "general.architecture" and vtype == _STRING:
                    architecture = _string(buf, pos + 4)
                elif key == "general.alignment" and vtype == 4:  # uint32
                    (alignment,) = struct.unpack_from("<I", buf, pos + 4)
                pos = _skip_value(buf, pos + 4, vtype)
            infos = []
            for _ in range(n_tensors):
                name = _string(buf, pos)
                pos += 8 + len(name.encode("utf-8"))
                (n_dims,) = struct.unpack_from("<I", buf, pos)
                dims = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
                pos += 4 + 8 * n_dims
                ttype, offset = struct.unpack_from("<IQ", buf, pos)
                pos += 12
                infos.append(TensorInfo(name, int(ttype), tuple(int(d) for d in dims), int(offset)))
            if alignment < 1:
                raise ValueError(f"{path!r}: GGUF alignment {alignment}")
            start = -(-pos // alignment) * alignment  # the tensor data begins at the next multiple
            return GGUFHeader(architecture, [dataclasses.replace(t, offset=start + t.offset) for t in infos])
        except struct.error as exc:
            raise ValueError(f"{path!r}: truncated or malformed GGUF header ({exc})") from None


def gguf_tensor_types(path: str) -> dict[str, tuple[int, tuple[int, ...]]]:
    """Each tensor's GGML type id and shape, from a GGUF file's header.

    Args:
        path: a ``.gguf`` file (version 2 or 3).
    Returns:
        ``{name: (type_id, shape)}`` (``FLOAT_TYPES`` names the plain float ids).
    Raises:
        ValueError: not a GGUF file, or a header this reader does not know.

    Example:
        >>> gguf_tensor_types(embedded_model_file())["token_embd.weight"]   # doctest: +SKIP
        (8, (576, 49152))
    """
    return {t.name: (t.type_id, t.shape) for t in read_header(path).tensors}


def gguf_weight_storage(path: str) -> str:
    """How a GGUF file stores its weight matrices (its 2-D tensors).

    Returns:
        "quantized" when every matrix is block-quantized (its scales float16) or float16,
        "float16" when every matrix is float16, else the widest plain float type among
        them ("float32", "bfloat16", "float64").

    Example:
        >>> gguf_weight_storage(embedded_model_file())      # Q4_1 and Q8_0   # doctest: +SKIP
        'quantized'
    """
    kinds = {FLOAT_TYPES.get(t, "quantized") for t, shape in gguf_tensor_types(path).values() if len(shape) == 2}
    if kinds <= {"float16"}:
        return "float16"
    if kinds <= {"quantized", "float16"}:
        return "quantized"
    for wide in ("float64", "float32", "bfloat16"):
        if wide in kinds:
            return wide
    return "quantized"  # pragma: no cover  (every kind is named above)
