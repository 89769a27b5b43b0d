"""Tests for ``alf_entropy.experiments``."""
