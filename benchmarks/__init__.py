"""The side-by-side benchmark (``python -m benchmarks.run``, from the repository root).

* ``systems.py``  what is compared: the training runs and the decoded systems, as tables
* ``jobs.py``     the steps (train, distill, EOS sweep, timed decode) and their typed keys
* ``plan.py``     which steps a run has, what each waits for; the system rows from the results
* ``schedule.py`` running the steps: shared ones ``--jobs`` at a time, timed decodes alone
* ``report.py``   results.json -> ratios, markdown table, iterations plot
* ``targets.py``  the performance targets of ``targets.json``, measured on the rows
* ``cli.py``      the flags and their full/``--quick`` defaults; ``run.py`` the entry point
"""
