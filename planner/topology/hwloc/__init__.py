"""hwloc's XML export (``lstopo --of xml``): the tree walk (:mod:`.parse`), the XML's
elements (:mod:`.elements`), and the links beyond the tree (:mod:`.links`)."""
