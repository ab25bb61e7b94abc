"""Benchmark harness: run the modules in ``benchmarks/`` and publish their results.

``bpfree bench NAME`` runs one benchmark and writes ``results/NAME.json`` (see
:mod:`bpfree.bench.runner` for the JSON contract); ``bpfree docs`` turns every result file
into ``docs/BENCHMARKS.md`` (:mod:`bpfree.bench.docs`).
"""

from bpfree.bench.docs import DocsReport, format_number, format_rows_text, generate_docs
from bpfree.bench.environment import (
    describe_device,
    gemm_peak_flops,
    library_versions,
    median_seconds,
)
from bpfree.bench.runner import (
    ROW_KEYS,
    BenchmarkError,
    BenchmarkInfo,
    UnknownBenchmarkError,
    benchmarks_dir,
    default_json_path,
    discover,
    get_benchmark,
    run_benchmark,
    seed_everything,
    validate_result,
    validate_row,
    validate_rows,
)

__all__ = [
    "ROW_KEYS",
    "BenchmarkError",
    "BenchmarkInfo",
    "DocsReport",
    "UnknownBenchmarkError",
    "benchmarks_dir",
    "default_json_path",
    "describe_device",
    "discover",
    "format_number",
    "format_rows_text",
    "gemm_peak_flops",
    "generate_docs",
    "get_benchmark",
    "library_versions",
    "median_seconds",
    "run_benchmark",
    "seed_everything",
    "validate_result",
    "validate_row",
    "validate_rows",
]
