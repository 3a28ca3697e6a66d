"""Heterogeneous graphs: node and edge types in the dataset format, a typed sampler, hetero models.

Node types are contiguous ranges of one global id space, so the ordinary CSR, sampler and DDAK
keep working over all rows; per-relation CSRs and per-type features sit beside them
(``docs/dataset-format.md``, "Heterogeneous datasets"; ``docs/hetero.md`` says why).
"""
