"""Link prediction: edge splits, negative sampling, the link-level sampler, the predictor, its metrics.

One module per job: :mod:`~training.link.edges` (edge keys and the train/valid/test split),
:mod:`~training.link.negatives` (uniform and degree-based negatives), :mod:`~training.link.store`
(an edge-split dataset on disk), :mod:`~training.link.sampler` (seed edges to one sampled subgraph),
:mod:`~training.link.model` (encoder and decoder), :mod:`~training.link.metrics` (AUC, Hits@K, MRR as
OGB computes them), :mod:`~training.link.train` (``moment train --task link``).
"""
