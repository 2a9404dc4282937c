"""TO_CHANGELOG (spec 4.2): a Delta change data feed -> append-only change records, its pairing and its keyed state."""
