"""Utilities: nests, schedulers, distributions and summaries."""
