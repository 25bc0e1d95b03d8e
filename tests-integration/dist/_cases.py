"""Which parity cases each launch runs (shared by the tests that read the same cached launch)."""

WORLD2_CASES = ("fsdp2", "tp2", "fsdp2_graph", "tp2_graph")
WORLD4_CASES = ("hsdp2x2", "fsdp2_tp2")   # launched together with the collectives checks
