"""Utilities: nests, schedulers, averagers, distributions and summaries."""
