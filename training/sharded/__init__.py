"""Training on a placement split over nodes (``moment place --nodes N``, :mod:`training.place.nodes`).

- :mod:`training.sharded.features`: this node's shard opened and checked against the other nodes'
  (:func:`~training.sharded.features.open_sharded`), and the feature source that serves a batch's rows
  (:class:`~training.sharded.features.ShardedFeatures`): the node's own from its store, the rest from
  the locality cache or their holders;
- :mod:`training.sharded.remote_cache`: the locality cache, the hottest rows other nodes hold;
- :mod:`training.sharded.exchange`: the per-step exchange of rows between nodes (``EXCHANGES``).

The layout of the rows over the nodes and its files are :mod:`iostack.shards`'.
"""
