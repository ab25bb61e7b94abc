"""Test-wide set-up: the benchmarks' shared helper modules (benchmarks/_*.py, the experiment
drivers that are not library code) import by name, as they do under ``bpfree bench``, through
the runner's own mechanism (appended to ``sys.path``: pytest's ``pythonpath`` option prepends,
and benchmarks/tflite.py would then shadow the installed ``tflite`` package).
"""

from bpfree.bench.runner import benchmarks_dir, share_helpers

share_helpers(benchmarks_dir())
