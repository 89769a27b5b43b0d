"""``alf-entropy-sweep``: the command; the tool is :mod:`alf_entropy.experiments.sweep`."""

import sys

from alf_entropy.experiments.sweep import main, run_sweep

__all__ = ["main", "run_sweep"]

if __name__ == "__main__":
    sys.exit(main())
