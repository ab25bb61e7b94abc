"""Self-test of the benchmark harness (not a paper result): times a tiny matmul.

Used by tests/test_bench.py and tests/test_cli.py; keep it trivial and fast.
"""

import torch

from bpfree.bench import median_seconds

NAME = "smoke"
DESCRIPTION = (
    "Self-test of the benchmark harness, not a paper result: times a tiny matmul and "
    "checks a known value against a stand-in 'paper' number."
)
SEED = 0


def run(quick: bool) -> list[dict]:
    """Two rows: a timing (no paper number) and an exact value with a 'paper' number."""
    n = 32 if quick else 64
    a = torch.randn(n, n)
    b = torch.eye(n)
    seconds = median_seconds(lambda: a @ b, repeats=5 if quick else 25)
    table = "harness self-test"
    setting = f"{n}x{n} float32"
    return [
        {"table": table, "method": "torch.matmul", "setting": setting,
         "metric": "median time (us)", "value": seconds * 1e6, "paper": None},
        # trace(I) = n exactly: a cell whose stand-in 'paper' number is always matched.
        {"table": table, "method": "torch.eye", "setting": setting,
         "metric": "trace", "value": float(b.trace()), "paper": float(n)},
    ]
