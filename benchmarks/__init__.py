"""The side-by-side benchmark (``python -m benchmarks.run``, from the repository root).

``benchmarks/README.md`` maps its modules; in short: ``systems.py`` says what is compared,
``jobs.py`` and ``plan.py`` what a run does, ``schedule.py`` how it runs, ``report.py`` and
``targets.py`` (goals in ``targets.json``) what is reported, ``run.py`` and ``cli.py`` the
command line, ``retime.py`` ``--time-only``, ``checks.py`` the ``--teacher``/``--distilled`` checks.
"""
