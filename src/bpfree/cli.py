"""Command-line entry point (argument parsing only; the work lives in the library).

Subcommands implemented elsewhere are listed in :data:`DELEGATED` as
``(name, module, help)``: the module provides ``add_arguments(parser)`` and
``main(args) -> int``. Adding a command is one line there.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence

from bpfree import __version__
from bpfree.io import check_output_path, first_missing_folder

PROG = "bpfree"

DESCRIPTION = """\
bpfree: train neural networks without back-propagation.

Gradients come only from forward evaluations: zeroth-order estimates, forward gradients
and local layer-wise rules. This tool runs the demo, the benchmarks that reproduce the
papers' tables (bench, writing results/*.json), and regenerates docs/BENCHMARKS.md
from those results (docs). Run `bpfree COMMAND --help` for each command's options.
"""

EPILOG = """\
examples:
  bpfree demo                    train a small network without back-propagation
  bpfree bench --list            name the benchmarks
  bpfree bench smoke --quick     run one benchmark, write results/smoke-quick.json
  bpfree docs                    regenerate docs/BENCHMARKS.md from results/*.json

Set BPFREE_DEBUG=1 (or pass --debug) to see tracebacks of errors.
"""

# Commands implemented in other modules, imported when the parser is built. A module that
# is missing (or fails to import) leaves its command listed as "not available".
DELEGATED: list[tuple[str, str, str]] = [
    ("demo", "bpfree.demo", "train a small network on bundled data without back-propagation"),
    ("memory", "bpfree.memory_cli", "measure and estimate the memory of training methods"),
    ("classify", "bpfree.classify", "name the ImageNet classes of an image with the INT8 MCUNet-in1"),
    ("fleet", "bpfree.distributed.cli",
     "train BP-free on W workers or federated clients that exchange seeds and scalars"),
    ("adapt", "bpfree.tflite.adapt", "adapt a .tflite model to new data without back-propagation"),
    ("device", "bpfree.device.cli", "export, run and size the PMT training engine as C99"),
]

_BENCH_EPILOG = """\
examples:
  bpfree bench --list
  bpfree bench smoke --quick
  bpfree bench smoke --seed 1 --json results/smoke-seed1.json

The JSON contract and how to add a benchmark: benchmarks/README.md.
"""

_DOCS_EPILOG = """\
examples:
  bpfree docs
  bpfree docs --results results --out docs/BENCHMARKS.md

Exits with status 1 when some result files were skipped as invalid (they are listed
on stderr and at the top of the page).
"""


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows defaults, keeps the epilog's line breaks, and omits uninformative defaults."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        # "(default: None)" / "(default: False)" say nothing the help text does not.
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def _add_debug(parser: argparse.ArgumentParser, default=argparse.SUPPRESS) -> None:
    # SUPPRESS on subcommands: their default would otherwise overwrite a top-level --debug.
    parser.add_argument("--debug", action="store_true", default=default,
                        help="show the full traceback of errors (also: BPFREE_DEBUG=1)")


#: Environment variable that sets the default of ``--threads``.
THREADS_ENV_VAR = "BPFREE_THREADS"


def default_threads() -> int:
    """torch intra-op threads for a command: ``$BPFREE_THREADS``, else ``min(4, cores)``.
    The models bpfree trains on a CPU are small; more threads than that gain little on them
    and oversubscribe a shared machine (README, "Threads")."""
    value = os.environ.get(THREADS_ENV_VAR, "")
    if value:
        return _threads(value, what=f"${THREADS_ENV_VAR}")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(4, cores or 1))


def _threads(value: str, what: str = "--threads") -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{what} must be an int >= 1, got {value!r}")
    return n


def _add_common(parser: argparse.ArgumentParser, top: bool = False) -> None:
    """``--threads`` and ``--quiet`` on every command (where it does not define its own)."""
    default = None if top else argparse.SUPPRESS
    if "--threads" not in parser._option_string_actions:
        parser.add_argument("--threads", type=_threads, metavar="N", default=default,
                            help="torch intra-op threads (default: $BPFREE_THREADS, else "
                                 "min(4, cores): small models gain little from more)")
    if "--quiet" not in parser._option_string_actions:
        parser.add_argument("--quiet", action="store_true", default=False if top else default,
                            help="no progress bars")


# ----------------------------------------------------------------------------- handlers


def _cmd_bench(args: argparse.Namespace) -> int:
    """Run one benchmark (or list them) and print its rows."""
    # lazy: the benchmark machinery loads torch; `bpfree --help` and Ctrl-C stay instant
    from bpfree.bench import docs, runner

    if args.list:
        registry = runner.discover()
        if not registry:
            print(f"no benchmarks found in {runner.benchmarks_dir()}")
        width = max((len(info.name) for info in registry), default=0)
        for info in registry:
            print(f"{info.name:<{width}}  {info.summary}")
        return 0
    if not args.name:
        known = ", ".join(i.name for i in runner.discover() if i.error is None) or "(none)"
        raise ValueError(f"name a benchmark to run, or use --list; known benchmarks: {known}")
    json_path = runner.default_json_path(args.name, args.quick) if args.json is None else args.json
    document = runner.run_benchmark(
        args.name, quick=args.quick, json_path=json_path, seed=args.seed,
        command=args.command_line, allow_dirty=args.allow_dirty,
    )
    mode = "quick" if document["quick"] else "full"
    print(f"{document['benchmark']} ({mode}) on {document['device']}, seed {document['seed']}, "
          f"{docs.format_seconds(document['seconds'])}")
    print(docs.format_rows_text(document["rows"]))
    print(f"wrote {json_path}")
    # said on the terminal, not only inside the JSON (issue 35: a quick run without MNIST)
    for line in runner.unmeasured(document):
        print(f"{PROG}: warning: {document['benchmark']}: {line}", file=sys.stderr)
    return 0


def _cmd_docs(args: argparse.Namespace) -> int:
    """Regenerate the benchmarks page; invalid result files make the exit status 1."""
    # lazy: as in _cmd_bench (torch loads only for the command that needs it)
    from bpfree.bench import docs

    if args.reledger:
        # lazy: as above, the re-ledger loads benchmark modules only when asked for
        from bpfree.bench.reledger import reledger_results

        redone = reledger_results(args.results, allow_dirty=args.allow_dirty)
        for flip in redone.flips:
            print(f"{flip.source}: {flip.claim}: {flip.before} -> {flip.after}")
        print(f"re-derived the claims of {len(redone.rewritten) + len(redone.unchanged)} "
              f"result file(s) from their rows: {len(redone.rewritten)} changed, "
              f"{len(redone.flips)} verdict(s) flipped")
    report = docs.generate_docs(args.results, args.out)
    for source, reason in report.skipped:
        print(f"{PROG}: warning: skipped {source}: {reason}", file=sys.stderr)
    for warning in report.warnings:
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    print(f"wrote {report.out} from {len(report.used)} result file(s)"
          + (f", skipped {len(report.skipped)} invalid" if report.skipped else ""))
    return 1 if report.skipped else 0


def _unavailable(name: str, reason: str) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        print(f"{PROG}: error: the {name} command is not available ({reason})", file=sys.stderr)
        return 1
    return handler


# ----------------------------------------------------------------------------- parser


def _add_bench(subparsers) -> None:
    p = subparsers.add_parser(
        "bench", help="run a named benchmark and write its JSON result",
        description="Run a benchmark from benchmarks/ and write one JSON document with a row\n"
                    "per cell of the paper's table: our number beside the paper's, with the\n"
                    "seed, device, wall time and library versions of the run.",
        epilog=_BENCH_EPILOG, formatter_class=_HelpFormatter,
    )
    p.add_argument("name", nargs="?", metavar="NAME", help="benchmark to run (see --list)")
    p.add_argument("--quick", action="store_true",
                   help="reduced settings that finish in seconds to minutes (CI, smoke checks)")
    p.add_argument("--json", metavar="PATH",
                   help="where to write the result (default: results/NAME.json, "
                        "or results/NAME-quick.json with --quick)")
    p.add_argument("--seed", type=int, metavar="N",
                   help="seed for torch, numpy and random (default: the benchmark's SEED, else 0)")
    p.add_argument("--list", action="store_true", help="name the benchmarks and exit")
    p.add_argument("--allow-dirty", action="store_true",
                   help="run even when the checkout has uncommitted changes to tracked files "
                        "(the result is marked dirty)")
    _add_debug(p)
    _add_common(p)
    p.set_defaults(handler=_cmd_bench)


def _add_docs(subparsers) -> None:
    # lazy: as in _cmd_bench (torch loads only for the command that needs it)
    from bpfree.bench.docs import DEFAULT_OUT, DEFAULT_RESULTS_DIR

    p = subparsers.add_parser(
        "docs", help="regenerate docs/BENCHMARKS.md from results/*.json",
        description="Generate the benchmarks page from every result file in --results: our\n"
                    "numbers beside the papers', with the device, seed, wall time and versions\n"
                    "of each run. Never edit the generated page by hand.",
        epilog=_DOCS_EPILOG, formatter_class=_HelpFormatter,
    )
    p.add_argument("--results", metavar="DIR", default=DEFAULT_RESULTS_DIR,
                   help="folder of result JSON files")
    p.add_argument("--out", metavar="PATH", default=DEFAULT_OUT, help="Markdown file to write")
    p.add_argument("--reledger", action="store_true",
                   help="first recompute each result file's claims from its committed rows with "
                        "the benchmark's current rules (ledger_from_result; no training), "
                        "rewrite the claims and print every verdict that flips")
    p.add_argument("--allow-dirty", action="store_true",
                   help="with --reledger: accept uncommitted changes (the claims are marked "
                        "dirty)")
    _add_debug(p)
    _add_common(p)
    p.set_defaults(handler=_cmd_docs)


def _add_delegated(subparsers, name: str, module_path: str, help_text: str) -> None:
    """Import a command's module and let it declare its own arguments."""
    try:
        module = importlib.import_module(module_path)
        add_arguments, run = module.add_arguments, module.main
    except (ImportError, AttributeError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        p = subparsers.add_parser(name, help=f"not available ({reason})",
                                  description=f"{name}: not available ({reason})")
        p.set_defaults(handler=_unavailable(name, reason))
        return
    # A module's EPILOG lists its examples (tests/test_help_examples.py runs every one).
    p = subparsers.add_parser(
        name, help=help_text, description=help_text[:1].upper() + help_text[1:] + ".",
        epilog=getattr(module, "EPILOG", f"example:\n  {PROG} {name}"),
        formatter_class=_HelpFormatter,
    )
    _add_debug(p)
    add_arguments(p)
    _add_common(p)
    p.set_defaults(handler=run)


def build_parser() -> argparse.ArgumentParser:
    """The full ``bpfree`` parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog=PROG, description=DESCRIPTION, epilog=EPILOG, formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    _add_debug(parser, default=False)
    _add_common(parser, top=True)
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name, module_path, help_text in DELEGATED[:1]:  # demo first: the entry point for newcomers
        _add_delegated(subparsers, name, module_path, help_text)
    _add_bench(subparsers)
    _add_docs(subparsers)
    for name, module_path, help_text in DELEGATED[1:]:
        _add_delegated(subparsers, name, module_path, help_text)
    return parser


def _debug_enabled(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "debug", False)) or os.environ.get("BPFREE_DEBUG", "") not in ("", "0")


#: Options that name a file a command writes; checked before the command does any work.
_OUTPUT_OPTIONS = ("json", "out")


def _check_outputs(args: argparse.Namespace) -> None:
    for name in _OUTPUT_OPTIONS:
        value = getattr(args, name, None)
        if isinstance(value, str):
            # a command whose --out is a folder it creates (device export) checks the file it
            # writes first inside it
            inside = getattr(args, f"{name}_folder_file", None)
            check_output_path(os.path.join(value, inside) if inside else value,
                              what=f"--{name}")
            missing = first_missing_folder(value)
            if missing is not None:
                # Said before the work, so a mistyped folder shows now, not after the run.
                print(f"{PROG}: note: --{name}: folder {str(missing)!r} does not exist; "
                      "it will be created when the file is written", file=sys.stderr)


def _apply_common(args: argparse.Namespace) -> None:
    """Set torch's intra-op threads and, with ``--quiet``, silence every progress bar."""
    import torch  # lazy: `bpfree --help` stays instant

    from bpfree import progress  # lazy: as torch above

    threads = getattr(args, "threads", None)
    torch.set_num_threads(default_threads() if threads is None else threads)
    if getattr(args, "quiet", False):
        progress.silence()


#: Seeds feed torch's and numpy's generators, which take at most 64-bit signed values.
MAX_SEED = 2**63 - 1


def _check_seed(args: argparse.Namespace) -> None:
    """Every command's ``--seed`` within what the generators take (a command may lower the
    bound with ``set_defaults(seed_max=...)``), so 2**70 is a usage error, not torch's
    'Overflow when unpacking long long'."""
    seed, top = getattr(args, "seed", None), getattr(args, "seed_max", MAX_SEED)
    if isinstance(seed, int) and not 0 <= seed <= top:
        raise ValueError(f"--seed must be an integer in [0, {top}], got {seed}")


def _error(message: str, hint: str = "") -> None:
    print(f"{PROG}: error: {' '.join(str(message).split())}{hint}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: sys.argv[1:]), run the command, return the exit status.

    Bad input (ValueError, FileNotFoundError: a wrong option value, a missing file, a bad
    output path) becomes one line ``bpfree: error: ...`` and status 2; any other failure one
    line naming the exception and status 1; the traceback only with ``--debug`` or
    ``BPFREE_DEBUG=1``. Ctrl-C, also while the commands' modules load, exits 130 quietly.
    """
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


def _exit_interrupted(signum, frame) -> None:
    os.write(2, f"{PROG}: interrupted\n".encode())
    os._exit(130)


@contextlib.contextmanager
def _interrupt_exits_at_once() -> Iterator[None]:
    """While the commands' modules load, Ctrl-C ends the process at once (status 130) instead
    of raising KeyboardInterrupt. Raised inside torch's or numpy's import, the exception is
    not reliably ours to catch: torch's C extension swallows it while it imports numpy (the
    command then ran to the end, status 0), numpy is left half-imported (a RecursionError
    traceback from its lazy attributes, status 1), or it escapes a pybind11 callback (SIGABRT).
    Nothing has been written yet, so no clean-up is skipped. Only on the main thread, and only
    where SIGINT still has Python's default handler (an embedding program's stays)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    signal.signal(signal.SIGINT, _exit_interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _restore_common(args: argparse.Namespace) -> None:
    """Lift ``--quiet`` when the command returns, so that ``main()`` called in a process that
    goes on (a test, a notebook) does not silence every later progress bar. (``--threads``
    stays: setting torch's threads is what that flag is for.)"""
    if getattr(args, "quiet", False):
        from bpfree import progress  # lazy: as in _apply_common

        progress.silence(False)


def _main(argv: list[str]) -> int:
    with _interrupt_exits_at_once():
        parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    args.command_line = shlex.join([PROG, *argv])  # recorded in result files
    debug = _debug_enabled(args)
    try:
        _apply_common(args)
        _check_seed(args)
        _check_outputs(args)
        return int(handler(args) or 0)
    except (ValueError, FileNotFoundError) as exc:
        if debug:
            raise
        _error(exc)
        return 2
    except BrokenPipeError:
        # The reader went away (`bpfree memory ... | head`): stop quietly, as Unix tools do.
        # stdout is pointed at devnull so the interpreter's final flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:  # a failure, not bad input: one line unless debugging
        if debug:
            raise
        _error(f"{type(exc).__name__}: {exc}", " (run with --debug for the traceback)")
        return 1
    finally:
        _restore_common(args)


if __name__ == "__main__":
    sys.exit(main())
