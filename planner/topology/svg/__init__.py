"""Topology pictures as SVG: the drawing (:mod:`.draw`), where the boxes go
(:mod:`.layout`), the texts (:mod:`.text`), which node hangs under which (:mod:`.tree`),
and the colours and legend (:mod:`.style`)."""
