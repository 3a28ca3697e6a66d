"""Feature rows held in the bins in a smaller type: float16, bfloat16, or int8 with a per-column scale.

A placement may store its rows (GPU and CPU caches, SSD bins) in another type
than the dataset's features: a :class:`FeatureCodec` says which, and how to
turn a stored row back into floats. The dataset's own features never change;
only the bins do. Rows are encoded when the bins are written or the caches
filled, and decoded in :meth:`iostack.store.FeatureStore.gather` where they
land (on the GPU after the host→device copy, so fewer bytes cross PCIe).

* ``float32``, ``float16``: IEEE types (``float16`` refuses features outside
  ±65504, which it would turn into infinities);
* ``bfloat16``: float32's range with 8 bits of mantissa; numpy has no such
  type, so the bins hold its bit patterns as ``int16`` and torch views them;
* ``int8``: per column ``j``, ``x ≈ scale[j] * q + zero_point[j]`` with
  ``q`` in ``-128..127``, ``scale[j] = (max_j - min_j) / 255`` and
  ``zero_point[j] = min_j + 128 * scale[j]`` (the value ``q = 0`` stands
  for, in feature units). Each value is within ``scale[j] / 2`` of its
  original (plus float32 rounding); a constant column is exact (scale 0).
  Float features only; NaN and infinities are refused (they have no place
  on an affine grid).

The codec is kept in the placement's manifest (``placement.json``, with a
CRC-32 of the scale and zero-point bytes), so the bins are never decoded with
another codec than the one that wrote them.

>>> import numpy as np, torch
>>> x = np.array([[0.0, 5.0], [1.0, 5.0], [0.5, 5.0]], np.float32)
>>> c = fit_codec(x, "int8")
>>> q = c.encode(x)
>>> q.dtype, c.row_bytes
(dtype('int8'), 2)
>>> c.decode(torch.from_numpy(q))[:, 1].tolist()
[5.0, 5.0, 5.0]
>>> bool((c.decode(torch.from_numpy(q)).numpy() - x).__abs__().max() <= c.scale.max() / 2 + 1e-7)
True
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from iostack.errors import StoreError
from iostack.vocab import STORAGE_DTYPES
from momentbase.jsontypes import JsonObject

#: storage name -> (numpy dtype of the bin files, torch dtype of the rows)
_STORAGE: dict[str, tuple[np.dtype, torch.dtype]] = {
    "float32": (np.dtype(np.float32), torch.float32),
    "float16": (np.dtype(np.float16), torch.float16),
    "bfloat16": (np.dtype(np.int16), torch.bfloat16),  # bit patterns: numpy has no bfloat16
    "int8": (np.dtype(np.int8), torch.int8),
}

#: largest finite float16
FLOAT16_MAX = 65504.0
_FLOAT32_MAX = float(np.finfo(np.float32).max)

#: bytes (as float64) scanned at a time when fitting: bounded memory over a memmap
FIT_CHUNK_BYTES = 16 << 20

Progress = Callable[[str, int, int | None], None]


def check_feature_dtype(name: str, what: str = "`feature_dtype`") -> str:
    """``name`` if it is one of :data:`STORAGE_DTYPES`, else a :class:`StoreError` naming the choices."""
    if name not in _STORAGE:
        raise StoreError(f"{what} {name!r}: not a feature type a placement knows; "
                         f"expected one of {', '.join(STORAGE_DTYPES)}")
    return name


def stored_row_bytes(dtype: str, dim: int) -> int:
    """Bytes of one row of ``dim`` features stored as ``dtype`` (a :data:`STORAGE_DTYPES` name).

    >>> stored_row_bytes("float32", 128), stored_row_bytes("bfloat16", 128), stored_row_bytes("int8", 128)
    (512, 256, 128)
    """
    return int(dim) * _STORAGE[check_feature_dtype(dtype)][0].itemsize


@dataclass(frozen=True, eq=False)
class FeatureCodec:
    """How a placement's bins hold rows of ``dim`` features (see the module docstring).

    ``dtype``: the storage type (:data:`STORAGE_DTYPES`); ``source_dtype``: the
    numpy dtype string of the features it was made from; ``scale`` and
    ``zero_point``: ``(dim,)`` float32, int8 only (``x ≈ scale * q + zero_point``).
    """

    dtype: str
    dim: int
    source_dtype: str
    scale: np.ndarray | None = None
    zero_point: np.ndarray | None = None

    def __post_init__(self) -> None:
        check_feature_dtype(self.dtype, "feature dtype")
        if self.dtype == "int8":
            for name in ("scale", "zero_point"):
                v = getattr(self, name)
                if v is None or np.shape(v) != (self.dim,):
                    raise StoreError(f"an int8 feature codec needs {name} of shape ({self.dim},), got "
                                     f"{None if v is None else np.shape(v)}")
                arr = np.ascontiguousarray(v, np.float32)
                arr.setflags(write=False)
                object.__setattr__(self, name, arr)

    @property
    def storage_np(self) -> np.dtype:
        """numpy dtype of the bin files (``int16`` bit patterns for bfloat16)."""
        return _STORAGE[self.dtype][0]

    @property
    def storage_torch(self) -> torch.dtype:
        """torch dtype of the stored rows."""
        return _STORAGE[self.dtype][1]

    @property
    def row_bytes(self) -> int:
        return self.dim * self.storage_np.itemsize

    # -- encoding (host, numpy) -----------------------------------------------------------------
    def encode(self, block: np.ndarray) -> np.ndarray:
        """Rows ``(n, dim)`` of the source features as stored: ``(n, dim)`` of :attr:`storage_np`."""
        x = np.asarray(block)
        if x.ndim == 1:
            x = x.reshape(-1, 1)
        if self.dtype == "float32" or self.dtype == "float16":
            return x.astype(self.storage_np)
        if self.dtype == "bfloat16":
            # torch rounds to nearest even; its bit patterns are what the bins keep
            t = torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.bfloat16)
            return t.view(torch.int16).numpy()
        assert self.scale is not None and self.zero_point is not None
        scale = self.scale.astype(np.float64)
        safe = np.where(scale > 0, scale, 1.0)  # a constant column: x - zero_point is 0
        q = np.rint((x.astype(np.float64) - self.zero_point.astype(np.float64)) / safe)
        return np.clip(q, -128, 127).astype(np.int8)

    def encode_torch(self, block: np.ndarray) -> torch.Tensor:
        """:meth:`encode` as a host tensor of :attr:`storage_torch`."""
        return to_torch(self.encode(block), self.storage_torch)

    # -- decoding (where the rows are) -----------------------------------------------------------
    def tables(self, to_device: Callable[[torch.Tensor], torch.Tensor] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(scale, zero_point)`` as float32 tensors (``to_device`` moves them), int8 only; else ``None``."""
        if self.dtype != "int8":
            return None
        assert self.scale is not None and self.zero_point is not None
        s, z = torch.from_numpy(self.scale.copy()), torch.from_numpy(self.zero_point.copy())
        return (to_device(s), to_device(z)) if to_device is not None else (s, z)

    def decode(self, rows: torch.Tensor, dtype: torch.dtype | None = None,
               tables: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Stored ``rows`` ``(n, dim)`` as ``dtype`` (default float32), computed on the rows' device.

        ``tables``: :meth:`tables` on that device (made here, on the host, if not given).
        """
        out = torch.float32 if dtype is None else dtype
        if rows.dtype == torch.int16 and self.dtype == "bfloat16":
            rows = rows.view(torch.bfloat16)
        if self.dtype != "int8":
            return rows if rows.dtype == out else rows.to(out)
        scale, zero = tables if tables is not None else self.tables()
        x = torch.addcmul(zero, rows.to(torch.float32), scale)  # zero + q * scale, one pass
        return x if out == torch.float32 else x.to(out)

    # -- the manifest ----------------------------------------------------------------------------
    def checksum(self) -> int:
        """CRC-32 of what decoding depends on: type, dim, scale and zero-point bytes."""
        crc = zlib.crc32(f"{self.dtype}:{self.dim}:{self.source_dtype}".encode())
        for a in (self.scale, self.zero_point):
            if a is not None:
                crc = zlib.crc32(np.ascontiguousarray(a, "<f4").tobytes(), crc)
        return crc

    def to_manifest(self) -> JsonObject:
        """A JSON-able dict (float32 values written exactly, as Python floats)."""
        d: JsonObject = {"dtype": self.dtype, "dim": self.dim, "source_dtype": self.source_dtype}
        if self.scale is not None and self.zero_point is not None:
            d["scale"] = self.scale.astype(np.float64).tolist()
            d["zero_point"] = self.zero_point.astype(np.float64).tolist()
        d["crc32"] = self.checksum()
        return d

    @classmethod
    def from_manifest(cls, data: Any, where: str = "placement.json") -> FeatureCodec:
        """The codec :meth:`to_manifest` wrote; a :class:`StoreError` naming ``where`` if it is damaged."""
        fix = "place the dataset again (`force=True`)"
        if not isinstance(data, dict):
            raise StoreError(f"{where}: field 'features' is not an object; {fix}")
        try:
            codec = cls(str(data["dtype"]), int(data["dim"]), str(data["source_dtype"]),
                        None if "scale" not in data else np.asarray(data["scale"], np.float64),
                        None if "zero_point" not in data else np.asarray(data["zero_point"], np.float64))
            want = int(data["crc32"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreError(f"{where}: field 'features' is malformed ({type(exc).__name__}: {exc}); {fix}") from None
        except StoreError as exc:
            raise StoreError(f"{where}: {exc}; {fix}") from None
        if codec.checksum() != want:
            raise StoreError(f"{where}: the feature codec ({codec.dtype}) does not match its checksum "
                             f"({codec.checksum():#010x}, manifest says {want:#010x}); {fix}")
        return codec


def to_torch(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """numpy rows as a torch tensor of ``dtype`` (bfloat16 from its int16 bit patterns), no copy."""
    t = torch.from_numpy(a)
    return t.view(dtype) if t.dtype != dtype else t


def fit_codec(features: np.ndarray, dtype: str, *, chunk_bytes: int = FIT_CHUNK_BYTES,
              progress: Progress | None = None) -> FeatureCodec:
    """The codec that stores ``features`` (``(V, dim)``, array or memmap) as ``dtype``.

    Reads the features ``chunk_bytes`` (as float64) at a time, and only where
    a check or the int8 ranges need it (bounded memory). For
    ``int8``: float features only, every value finite; the scale and zero
    point of each column from its minimum and maximum. For ``float16``: every
    finite value within ±65504. Any type: values within float32's range (the
    gather returns float32). Raises :class:`StoreError` naming the first
    offending row and column and the fix.

    >>> c = fit_codec(np.array([[-1.0, 2.0], [1.0, 2.0]], np.float32), "int8")
    >>> [round(float(v), 5) for v in (*c.scale, *c.zero_point)]
    [0.00784, 0.0, 0.00392, 2.0]
    """
    check_feature_dtype(dtype)
    x = features.reshape(-1, 1) if features.ndim == 1 else features
    if x.ndim != 2:
        raise StoreError(f"features of shape {tuple(features.shape)}: expected (num_vertices, dim)")
    src = np.dtype(x.dtype)
    if dtype == "int8" and src.kind != "f":
        raise StoreError(f"`feature_dtype` int8: the features are {src}, not floats; int8 with a scale per column "
                         "is for float features (store them as float32 or float16, or import float features)")
    if src.kind not in "fiub":
        raise StoreError(f"features of dtype {src}: not numbers a feature bin can hold")
    n, dim = int(x.shape[0]), int(x.shape[1])
    lo = np.full(dim, np.inf)
    hi = np.full(dim, -np.inf)
    # float32 and bfloat16 hold every float32 value: only wider sources, float16 and int8 need a scan
    scan = dtype in ("int8", "float16") or (src.kind == "f" and src.itemsize > 4)
    step = max(1, chunk_bytes // max(1, 8 * dim))
    for a in range(0, n if scan else 0, step):
        blk = np.asarray(x[a:a + step], np.float64)
        _check_block(blk, a, dtype)
        if dtype == "int8" and blk.size:
            np.minimum(lo, blk.min(axis=0), out=lo)
            np.maximum(hi, blk.max(axis=0), out=hi)
        if progress is not None:
            progress("fitting the feature codec", min(n, a + step), n)
    if dtype != "int8":
        return FeatureCodec(dtype, dim, src.str)
    if n == 0:
        lo[:], hi[:] = 0.0, 0.0
    scale = ((hi - lo) / 255.0).astype(np.float32)
    zero = (lo + 128.0 * scale.astype(np.float64)).astype(np.float32)
    return FeatureCodec("int8", dim, src.str, scale, zero)


def _check_block(blk: np.ndarray, first_row: int, dtype: str) -> None:
    """Refuse values ``dtype`` cannot hold (see :func:`fit_codec`); ``blk`` is float64 rows from ``first_row``."""
    if dtype == "int8":
        bad = ~np.isfinite(blk) | (np.abs(blk) > _FLOAT32_MAX)
        why = ("NaN, infinite and beyond-float32 values have no int8 code; clean the features, or store them "
               "as float16/bfloat16")
    elif dtype == "float16":
        bad = np.isfinite(blk) & (np.abs(blk) > FLOAT16_MAX)
        why = f"float16 holds at most ±{FLOAT16_MAX:g}; store them as bfloat16 (float32's range) or float32"
    else:
        bad = np.isfinite(blk) & (np.abs(blk) > _FLOAT32_MAX)
        why = "beyond float32's range, which the gather returns; scale the features"
    if bad.any():
        r, c = (int(i) for i in np.argwhere(bad)[0])
        raise StoreError(f"`feature_dtype` {dtype}: feature row {first_row + r}, column {c} is "
                         f"{float(blk[r, c])!r}: {why}")


__all__ = ["FeatureCodec", "check_feature_dtype", "fit_codec", "stored_row_bytes", "to_torch"]
