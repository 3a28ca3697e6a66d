"""Placing a dataset's feature rows on a planned machine, one module per stage of the workflow.

- :mod:`training.place.specs`: what a placement is (:class:`~training.place.specs.PlaceSpec`);
- :mod:`training.place.bins`: a plan's traffic targets, for the caches given, as bins with feasible targets;
- :mod:`training.place.policy`: DDAK or a baseline over those bins, an :class:`iostack.placement.Placement`;
- :mod:`training.place.report`: what the placement does to the reads;
- :mod:`training.place.run`: the whole workflow as one call (:func:`~training.place.run.place_dataset`):
  hotness, targets, bins, policy, the bin files, the report, and last the placement's index;
- :mod:`training.place.nodes`: the same over several nodes (:func:`~training.place.nodes.place_sharded`);
- :mod:`training.place.guard`: one writer per placement (a lock on ``out``), and what a killed one left swept.

The plan comes in as an object (:class:`planner.handoff.PlanHandoff`: a plan file read, or
:func:`planner.handoff.plan_now`); the files a placement is made of are :mod:`iostack.placement`'s.
"""
