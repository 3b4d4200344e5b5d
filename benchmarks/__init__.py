"""The side-by-side benchmark (``python -m benchmarks.run``, from the repository root) and the decoding
profile (``python -m benchmarks.profile_decode``); ``benchmarks/README.md`` has the results."""
