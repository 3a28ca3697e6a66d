"""Link prediction: edge splits, negative sampling, the link-level sampler, the predictor, its metrics.

One module per job: :mod:`~training.link.edges` (edge keys and the train/valid/test split),
:mod:`~training.link.negatives` (uniform and degree-based negatives), :mod:`~training.link.store`
(an edge-split dataset on disk), :mod:`~training.link.sampler` (seed edges to one sampled subgraph),
:mod:`~training.link.batches` (each rank's seed edges and negative stream at each step),
:mod:`~training.link.model` (encoder, decoder, loss), :mod:`~training.link.metrics` (AUC, Hits@K, MRR as
OGB computes them), :mod:`~training.link.train` (``moment train --task link``, one process or under
``torchrun``), :mod:`~training.link.loader` (link batches for the user's own loop).
"""
