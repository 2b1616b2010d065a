"""whatif.dashboard."""
