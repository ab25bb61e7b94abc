"""Test-wide set-up: the benchmarks' shared helper modules (benchmarks/_*.py, the experiment
drivers that are not library code) import by name, as they do under ``bpfree bench``.

Appended, not prepended (pytest's ``pythonpath`` option prepends): benchmarks/tflite.py must
not shadow the installed ``tflite`` package.
"""

import sys
from pathlib import Path

_BENCHMARKS = str(Path(__file__).resolve().parents[1] / "benchmarks")
if _BENCHMARKS not in sys.path:
    sys.path.append(_BENCHMARKS)
