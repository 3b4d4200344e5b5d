"""Measuring checkpoints that exist: the harness (``harness.py``), the report (``report.py``) and the
comparisons over them (``peers``, ``engines``, ``constrained``); ``benchmarks/README.md`` has the results."""
