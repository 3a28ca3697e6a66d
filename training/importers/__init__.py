"""Importers: public graph formats to the dataset directory of :mod:`training.data`.

One module per format, each with ``detect(src) -> bool`` and ``import_<format>(src,
dst, **options) -> Path``:

========== ============================================ ==========================================
format     source                                       module
========== ============================================ ==========================================
planetoid  directory of ``ind.<name>.*`` pickles         :mod:`training.importers.planetoid`
npz        gnn-benchmark ``.npz`` file                  :mod:`training.importers.npz`
ogb        OGB node-property directory (raw/, split/;  :mod:`training.importers.ogb`,
           CSV or papers100M's binary raw/data.npz)     :mod:`training.importers.ogb_binary`
igb        IGB directory (processed/paper/...)          :mod:`training.importers.igb`
ogb-hetero OGB heterogeneous raw directory (ogbn-mag:    :mod:`training.hetero.mag`
           raw/num-node-dict, relations/, split/)
igb-hetero IGBH directory (processed/<type>/node_feat,   :mod:`training.hetero.igbh`
           processed/<src>__<rel>__<dst>/edge_index)
hdf5       HDF5 file (CSR or edge list, features, ...)  :mod:`training.importers.hdf5`
edgelist   SNAP text edge list, optionally gzipped      :mod:`training.importers.edgelist`
webgraph   WebGraph BV graph (BASENAME.graph/.properties) :mod:`training.importers.webgraph`
========== ============================================ ==========================================

>>> import_dataset  # doctest: +ELLIPSIS
<function import_dataset at ...>
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

#: format name -> (module, import function); detection tries them in this order
FORMATS: dict[str, tuple[str, str]] = {
    "planetoid": ("training.importers.planetoid", "import_planetoid"),
    # the heterogeneous layouts first: IGBH holds IGB's paper__cites__paper too
    "ogb-hetero": ("training.hetero.mag", "import_ogb_hetero"),
    "igb-hetero": ("training.hetero.igbh", "import_igbh"),
    "ogb": ("training.importers.ogb", "import_ogb"),
    "igb": ("training.importers.igb", "import_igb"),
    "npz": ("training.importers.npz", "import_npz"),
    "hdf5": ("training.importers.hdf5", "import_hdf5"),
    "webgraph": ("training.importers.webgraph", "import_webgraph"),
    "edgelist": ("training.importers.edgelist", "import_edgelist"),
}


def detect_format(src: str | Path) -> str:
    """The format of ``src``, judged by its file names (and, for single files, their first bytes)."""
    from training.data import DatasetError  # here, not above: FORMATS is read by `moment --help`

    src = Path(src)
    if not src.exists() and not Path(f"{src}.properties").exists():  # a WebGraph basename names no file
        raise DatasetError(f"{src}: no such file or directory")
    for fmt, (mod, _) in FORMATS.items():
        if importlib.import_module(mod).detect(src):
            return fmt
    raise DatasetError(
        f"{src}: cannot tell its format (expected ind.<name>.* files, an OGB raw/ + split/ directory (ogbn-mag's "
        "heterogeneous one with raw/num-node-dict.csv.gz), an IGB or IGBH processed/ directory, a gnn-benchmark "
        ".npz, an HDF5 file, a text edge list or a WebGraph BASENAME); "
        f"pass `format={{{','.join(FORMATS)}}}`"
    )


def import_dataset(src: str | Path, dst: str | Path, *, format: str = "auto", **options: Any) -> Path:
    """Convert ``src`` in ``format`` (``"auto"`` detects it) into the dataset directory ``dst``.

    ``options`` go to the format's import function (``name``, ``overwrite``,
    ``progress``, ``feature_dtype`` are accepted by every format). Returns ``dst``.
    """
    from training.data import DatasetError

    fmt = detect_format(src) if format == "auto" else format
    if fmt not in FORMATS:
        raise DatasetError(f"`format` {format!r}: expected auto or one of {', '.join(FORMATS)}")
    mod, func = FORMATS[fmt]
    return getattr(importlib.import_module(mod), func)(src, dst, **options)
