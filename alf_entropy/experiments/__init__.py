"""Experiment tools: sweeps, reports and control metrics.

* ``sweep.py``: ``alf-entropy-sweep``, a grid of gin bindings x seeds, each run
  an ``alf-entropy-train`` process (or a Ray task); ``sweep_spec.py``, its
  JSON spec and the runs it expands to; ``packing.py``, several runs as one
  process of several agents (``--pack_seeds``, ``--pack_targets``);
* ``report.py``: ``alf-entropy-report``, a metrics table from the runs'
  TensorBoard events, and ``figures.py``, its figures (matplotlib);
* ``control_metrics.py``: how well an entropy followed its target (tracking
  RMSE, settling times, ...), on plain sequences of numbers.

They sit on top of the library: the trainers, algorithms, controllers,
networks, environments and utils never import this package.
"""
