"""training: datasets, neighbour sampler, sampling server, models and the DDP loop.

Built in later issues; the package exists so that the dependency order
``moment → training → iostack → planner`` is fixed from the start.
"""
