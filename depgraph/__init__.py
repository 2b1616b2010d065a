"""whatif.depgraph."""
