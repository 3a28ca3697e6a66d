"""The words the store's settings take, in a module that imports nothing.

Each tuple is the one table its setting is checked against, by the code that
implements it (which imports it from here), and what ``moment`` offers for it: the
command line builds its parser from these without importing numpy or torch
(tests/test_startup.py).
"""

from __future__ import annotations

__all__ = ["ENGINES", "STORAGE_DTYPES"]

#: read engines of the POSIX backend: ``uring`` (io_uring), ``aio`` (native AIO), ``threads``
#: (preadv); ``auto``: see :mod:`iostack.backends.choice`
ENGINES = ("auto", "uring", "aio", "threads")

#: the types a placement may store its rows in (a dataset's own feature types are
#: training.vocab.DATASET_FEATURE_DTYPES: float64 and uint8 there, bfloat16 here)
STORAGE_DTYPES = ("float32", "float16", "bfloat16", "int8")
