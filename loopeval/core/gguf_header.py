"""A GGUF file's header, metadata and tensor table, read and checked before any weights load.

transformers' GGUF reader fails on a damaged file with ``struct.error``, a NumPy error or
a model that does not take the weights, after seconds to minutes of work. :func:`read_header`
parses the header (GGUF versions 2 and 3) with every length checked against the file size,
and :func:`check_header` checks the tensor table against the file (each tensor's bytes lie
inside it, at its alignment) and against the architecture the metadata names (its
``<arch>.*`` keys are there, every tensor name belongs to that architecture, each block
has the same tensors, and the embedding, attention and feed-forward shapes agree with the
metadata). Every refusal is one ``ValueError`` line naming the file.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 4  # GGML_MAX_DIMS
_MIN_TENSOR = 32  # the fewest bytes a tensor-table entry takes (name length, one dimension, type, offset)
_DEFAULT_ALIGNMENT = 32


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]  # GGUF order: the fastest-varying dimension first (ne[0], ne[1], ...)
    type: int
    offset: int  # from the start of the data section
    nbytes: int


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict
    tensors: dict[str, Tensor]
    data_start: int
    size: int

    @property
    def architecture(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None


class _Cut(Exception):
    """The file ends inside the structure being read."""


class _Reader:
    def __init__(self, buf, size: int):
        self.buf, self.size, self.pos = buf, size, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self.size:
            raise _Cut(f"needs {n} bytes at byte {self.pos}")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def scalar(self, fmt: str):
        n = struct.calcsize(fmt)
        return struct.unpack(fmt, self.take(n))[0]

    def string(self) -> str:
        raw = self.take(self.scalar("<Q"))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"a string at byte {self.pos - len(raw)} is not UTF-8") from None

    def value(self, kind: int):
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.scalar("<I"), self.scalar("<Q")
            if item in _SCALARS:  # one bounds check, then one unpack for the whole array
                width = struct.calcsize(_SCALARS[item])
                return list(struct.unpack(f"<{count}{_SCALARS[item][1]}", self.take(count * width)))
            if count > self.size - self.pos:  # every item takes at least one byte
                raise _Cut(f"an array of {count} items at byte {self.pos}")
            return [self.value(item) for _ in range(count)]
        raise ValueError(f"unknown metadata value type {kind} at byte {self.pos - 4}")


def _nbytes(shape: tuple[int, ...], kind: int, name: str) -> int:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    except (ValueError, KeyError):
        raise ValueError(f"tensor {name}: unknown tensor type {kind}") from None
    count = 1
    for d in shape:
        count *= d
    if shape and shape[0] % block:
        raise ValueError(f"tensor {name}: its first dimension {shape[0]} is not a multiple of its type's block of {block}")
    return count // block * type_size


def read_header(file: str | Path) -> GGUFHeader:
    """The header, metadata and tensor table of the GGUF ``file``; ``ValueError`` naming
    the file if it is cut short or malformed anywhere in them."""
    path = Path(file)
    size = path.stat().st_size
    if size < 24:
        raise ValueError(f"{file}: not a whole GGUF file ({size} bytes; the header alone takes 24)")
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        r = _Reader(buf, size)
        try:
            if r.take(4) != b"GGUF":
                raise ValueError("it does not start with b'GGUF'")
            version = r.scalar("<I")
            if version not in (2, 3):
                raise ValueError(f"GGUF version {version}; loopeval reads versions 2 and 3")
            n_tensors, n_kv = r.scalar("<Q"), r.scalar("<Q")
            metadata, key = {}, None
            for _ in range(n_kv):
                key = r.string()
                metadata[key] = r.value(r.scalar("<I"))
            key = None
            if n_tensors * _MIN_TENSOR > size - r.pos:
                raise _Cut(f"the header claims {n_tensors} tensors, which the {size - r.pos} bytes after the "
                           "metadata cannot list")
            tensors = {}
            for i in range(n_tensors):
                name = r.string()
                n_dims = r.scalar("<I")
                if not 1 <= n_dims <= _MAX_DIMS:
                    raise ValueError(f"tensor {i + 1} of {n_tensors} ({name!r}): {n_dims} dimensions "
                                     f"(GGUF allows 1 to {_MAX_DIMS})")
                shape = tuple(r.scalar("<Q") for _ in range(n_dims))
                kind, offset = r.scalar("<I"), r.scalar("<Q")
                if name in tensors:
                    raise ValueError(f"tensor {name} is listed twice")
                tensors[name] = Tensor(name, shape, kind, offset, _nbytes(shape, kind, name))
        except _Cut as exc:
            where = f"in the value of metadata key {key!r}" if key else "in its header or tensor table"
            raise ValueError(f"{file}: the GGUF file is cut short {where}, or its counts are wrong ({exc}; the file has "
                             f"{size} bytes)") from None
        except (ValueError, struct.error) as exc:
            raise ValueError(f"{file}: not a valid GGUF file ({exc})") from None
    alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1:
        raise ValueError(f"{file}: general.alignment is {alignment!r}, not a positive whole number")
    data_start = -(-r.pos // alignment) * alignment
    return GGUFHeader(version, metadata, tensors, data_start, size)


def check_header(file: str | Path) -> GGUFHeader:
    """:func:`read_header`, then the tensor table against the file size and the
    architecture (module docstring); ``ValueError`` naming the file and the first fault."""
    header = read_header(file)
    try:
        _check_data(header)
        _check_architecture(header)
    except ValueError as exc:
        raise ValueError(f"{file}: {exc}") from None
    return header


def _check_data(header: GGUFHeader) -> None:
    if not header.tensors:
        raise ValueError("the GGUF file holds no tensors")
    alignment = header.metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
    room = header.size - header.data_start
    for t in header.tensors.values():
        if t.offset % alignment:
            raise ValueError(f"tensor {t.name} starts at offset {t.offset}, not a multiple of the alignment {alignment}")
        if t.offset + t.nbytes > room:
            raise ValueError(f"the GGUF file is cut short: tensor {t.name} needs bytes {t.offset}..{t.offset + t.nbytes} "
                             f"of the data section, which holds {max(room, 0)}")


def _check_architecture(header: GGUFHeader) -> None:
    from gguf.constants import MODEL_ARCH_NAMES, MODEL_TENSORS, TENSOR_NAMES

    arch = header.architecture
    if arch is None:
        raise ValueError(f"no general.architecture string in the metadata (got {header.metadata.get('general.architecture')!r})")
    by_name = {name: key for key, name in MODEL_ARCH_NAMES.items()}
    if arch not in by_name:
        raise ValueError(f"architecture {arch!r} is not one the gguf library knows")
    meta = header.metadata
    needed = ("block_count", "embedding_length", "attention.head_count")
    missing = [k for k in needed if not isinstance(meta.get(f"{arch}.{k}"), int)]
    if missing:
        raise ValueError(f"architecture {arch!r}, but the metadata has no whole-number {', '.join(f'{arch}.{k}' for k in missing)}")
    blocks, width = meta[f"{arch}.block_count"], meta[f"{arch}.embedding_length"]
    allowed = {TENSOR_NAMES[t].format(bid=b) + suffix for t in MODEL_TENSORS[by_name[arch]]
               for b in range(blocks) for suffix in (".weight", ".bias")}
    foreign = sorted(n for n in header.tensors if n not in allowed)
    if foreign:
        raise ValueError(f"architecture {arch!r} with {blocks} blocks has no tensor {foreign[0]} "
                         f"({len(foreign)} of {len(header.tensors)} tensors do not belong to it)")
    per_block = [{n.split(".", 2)[2] for n in header.tensors if n.startswith(f"blk.{b}.")} for b in range(blocks)]
    for b, names in enumerate(per_block):
        if names != per_block[0]:
            gap = sorted(per_block[0] ^ names)[0]
            raise ValueError(f"block {b} of {blocks} differs from block 0 in tensor {gap} ({arch}.block_count is {blocks})")
    embedding = header.tensors.get("token_embd.weight")
    if embedding is None:
        raise ValueError("no token_embd.weight tensor")
    for name, t in header.tensors.items():
        if name == "token_embd.weight" or any(name.endswith(f".{kind}.weight") for kind in (
                "attn_q", "attn_k", "attn_v", "ffn_up", "ffn_gate")):
            if t.shape[0] != width:
                raise ValueError(f"tensor {name} has shape {list(t.shape)} (GGUF order), but {arch}.embedding_length "
                                 f"is {width}")
