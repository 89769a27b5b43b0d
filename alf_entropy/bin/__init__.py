"""Command-line entry points (``alf-entropy-train``, ``-sweep``, ``-report``)."""
