"""What ``moment bench`` measures: the feature store's I/O, in the library so that the command stays thin.

- :mod:`iostack.bench.io`: random row reads from one SSD bin, ours against fio in the same run
  (``moment bench io raw``), and the gather stream through a store (``moment bench io gather``);
- :mod:`iostack.bench.emulate`: a whole training I/O workload replayed through the tiers
  (``moment bench emulate``), DLIO-style; :mod:`iostack.bench.workload` reads its YAML.

Benchmark scripts that set ours beside a reference for the record are in ``tools/``; the reads
into GPU memory that ``moment profile`` measures for ``--backend auto`` are :mod:`hwprofile.gpureads`.
"""
