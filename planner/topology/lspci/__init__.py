"""``lspci``: the dumps and their join into a topology (:mod:`.parse`), the tree of
``-t``/``-tv`` (:mod:`.tree`), and names read without ``-nn`` (:mod:`.names`)."""
