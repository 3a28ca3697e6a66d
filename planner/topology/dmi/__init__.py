"""``dmidecode``: slots, processors and onboard devices (:mod:`.parse`), the text as
SMBIOS records (:mod:`.records`), and the slots joined to a PCI tree (:mod:`.join`)."""
