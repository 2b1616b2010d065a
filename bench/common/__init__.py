"""Helpers shared by the bench scripts (not benches themselves)."""
