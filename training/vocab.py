"""The words a training run's settings take, in a module that imports nothing.

Each tuple is the one table its setting is checked against, by the code that
implements it (which imports it from here), and what ``moment`` offers for it: the
command line builds its parser from these without importing torch, numpy or the
implementations (tests/test_startup.py), and a new word is added here once.
"""

from __future__ import annotations

__all__ = ["DATASET_CHECKS", "DATASET_FEATURE_DTYPES", "DYNAMIC_CACHE_ON", "EXCHANGES", "GPU_MODES", "GRAPH_ON",
           "HETERO_MODEL_NAMES", "LINK_DECODERS", "MODEL_NAMES", "TRAIN_MODEL_NAMES", "NEGATIVE_METHODS", "PRECISIONS",
           "SAMPLE_ON"]

#: the GNNs :data:`training.models.MODELS` builds, by name
MODEL_NAMES = ("sage", "gat", "gcn")

#: the models of a heterogeneous dataset (:data:`training.hetero.train.HETERO_MODELS`), by name
HETERO_MODEL_NAMES = ("hetero-sage", "rgcn")

#: every ``moment train --model``: homogeneous GNNs, then heterogeneous ones
TRAIN_MODEL_NAMES = (*MODEL_NAMES, *HETERO_MODEL_NAMES)

#: where a run samples: ``auto`` (the GPU when the graph fits there), ``cpu``, ``gpu``
SAMPLE_ON = ("auto", "cpu", "gpu")

#: where a CSR may live while a run samples from it (:mod:`training.diskcsr`)
GRAPH_ON = ("memory", "disk")

#: how the ranks of a sharded placement exchange feature rows (:mod:`training.sharded.exchange`)
EXCHANGES = ("alltoall", "rpc")

#: the arithmetic a run trains in (:mod:`training.precision`): ``32`` (float32, the default),
#: ``bf16-mixed`` (autocast to bfloat16), ``16-mixed`` (autocast to float16, loss scaled); names as Lightning's
PRECISIONS = ("32", "bf16-mixed", "16-mixed")

#: where the cache that fills on access (:mod:`training.cached_features`) holds its rows: host memory or the
#: rank's GPU
DYNAMIC_CACHE_ON = ("host", "gpu")

#: how the GPUs' caches split the hot rows: each GPU holds them all, or its share
GPU_MODES = ("replicate", "partition")

#: dtypes a dataset's feature matrix may have (numpy names, as written in meta.json); the types a
#: placement may store rows in are another list, iostack.vocab.STORAGE_DTYPES
DATASET_FEATURE_DTYPES = ("float32", "float16", "float64", "uint8", "int8")

#: how much of a dataset's arrays a run checks against their CRC-32s: every block training reads, on a
#: background thread (:mod:`training.background_verify`), or only the sample checked on opening
DATASET_CHECKS = ("background", "open")

#: how link prediction draws negative pairs (:mod:`training.link.negatives`)
NEGATIVE_METHODS = ("uniform", "degree")

#: how a link predictor scores a pair from its endpoints' embeddings (:mod:`training.link.model`)
LINK_DECODERS = ("dot", "mlp")
