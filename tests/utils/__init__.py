"""Tests for ``alf_entropy.utils``."""
