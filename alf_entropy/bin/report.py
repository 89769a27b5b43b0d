"""``alf-entropy-report``: the command; the tool is :mod:`alf_entropy.experiments.report`."""

import sys

from alf_entropy.experiments.report import main, write_report

__all__ = ["main", "write_report"]

if __name__ == "__main__":
    sys.exit(main())
