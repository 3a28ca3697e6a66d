"""iostack: the tiered feature store (GPU cache, CPU cache, SSD bins, read backends).

Built in a later issue; the package exists so that the dependency order
``moment → training → iostack → planner`` is fixed from the start.
"""
