"""Unpickling limited to the classes the public graph formats need.

Planetoid files and the GraphGallery ``.npz`` files are pickles (Python 2 ones
for Planetoid). A pickle may name any importable callable, so a plain
``pickle.load`` of a downloaded file can run arbitrary code. This unpickler
resolves only numpy arrays and dtypes, scipy sparse matrices, and the builtin
containers; anything else is refused with a :class:`DatasetError`.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from training.data import DatasetError

#: (module, name) pairs a pickle may reference; Python 2 spellings included because
#: ``find_class`` sees the names before ``fix_imports`` maps them
_ALLOWED = {
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("collections", "defaultdict"), ("collections", "OrderedDict"),
    ("__builtin__", "list"), ("builtins", "list"), ("__builtin__", "dict"), ("builtins", "dict"),
    ("__builtin__", "set"), ("builtins", "set"), ("__builtin__", "object"), ("builtins", "object"),
    ("__builtin__", "tuple"), ("builtins", "tuple"),
    ("copy_reg", "_reconstructor"), ("copyreg", "_reconstructor"),
    # Python 3 writes the bytes of an array in a protocol-2 pickle as _codecs.encode(str, "latin1")
    ("_codecs", "encode"),
}
for _fmt in ("csr", "csc", "coo"):
    for _mod in (f"scipy.sparse.{_fmt}", f"scipy.sparse._{_fmt}"):
        for _cls in (f"{_fmt}_matrix", f"{_fmt}_array"):
            _ALLOWED.add((_mod, _cls))


class _RestrictedUnpickler(pickle.Unpickler):
    source = "<pickle>"

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise DatasetError(
                f"{self.source}: the pickle refers to {module}.{name}, which a graph file never needs; "
                "refusing to load it (is this the right file?)"
            )
        if module.startswith("scipy.sparse."):
            # old pickles name private submodules (scipy.sparse.csr) that SciPy deprecates;
            # the classes are the public ones
            module = "scipy.sparse"
        return super().find_class(module, name)


def safe_load(data: bytes, source: str | Path, *, encoding: str = "latin1") -> Any:
    """Unpickle ``data`` with only numpy / scipy / builtin containers allowed.

    >>> import pickle
    >>> safe_load(pickle.dumps({1: [2, 3]}), "x.pkl")
    {1: [2, 3]}
    >>> safe_load(pickle.dumps(print), "x.pkl")
    Traceback (most recent call last):
    ...
    training.data.DatasetError: x.pkl: the pickle refers to builtins.print, which a graph file never needs; refusing to load it (is this the right file?)
    """  # noqa: E501 (a doctest's or a capture's line, as printed)
    up = _RestrictedUnpickler(io.BytesIO(data), encoding=encoding, fix_imports=True)
    up.source = str(source)
    try:
        return up.load()
    except DatasetError:
        raise
    # Exception: a damaged pickle fails wherever the damage is met, in pickle itself or in the
    # numpy/scipy constructors it calls (UnpicklingError, OverflowError, RecursionError, struct.error,
    # ValueError, ...; tests/test_fuzz_files.py); only the allow-list's own refusal passes through
    except Exception as exc:
        raise DatasetError(
            f"{source}: not a readable pickle ({type(exc).__name__}: {exc}); "
            "the file is truncated or corrupt, download it again"
        ) from None


def npz_member(zf: zipfile.ZipFile, key: str, source: Path) -> np.ndarray | Any:
    """Array ``key`` of an open ``.npz``; a 0-d object array is unpickled safely and its object returned."""
    try:
        raw = zf.read(f"{key}.npy")
    except KeyError:
        raise DatasetError(f"{source}: key {key!r} is missing (keys: {', '.join(list_npz_keys(zf))})") from None
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise DatasetError(f"{source}: member {key!r} is corrupt ({exc}); download the file again") from None
    f = io.BytesIO(raw)
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    except ValueError as exc:
        raise DatasetError(f"{source}: member {key!r} is not a .npy array ({exc})") from None
    if dtype.hasobject:
        obj = safe_load(f.read(), f"{source}[{key}]", encoding="latin1")
        if isinstance(obj, np.ndarray) and obj.dtype.hasobject and obj.shape == ():
            return obj.item()
        return obj
    count = int(np.prod(shape)) if shape else 1
    data = f.read()
    if len(data) < count * dtype.itemsize:
        raise DatasetError(
            f"{source}: member {key!r} holds {len(data)} bytes, needs {count * dtype.itemsize}; the file is truncated"
        )
    arr = np.frombuffer(data, dtype=dtype, count=count)
    return arr.reshape(shape, order="F" if fortran else "C")


def list_npz_keys(zf: zipfile.ZipFile) -> list[str]:
    return [n[:-4] if n.endswith(".npy") else n for n in zf.namelist()]
