"""whatif.transforms."""
