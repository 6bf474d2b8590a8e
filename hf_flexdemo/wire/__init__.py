"""The wire: what crosses nodes and how (the replicators, the compression and its transform, the low-bit values, the
collectives); torch only."""
