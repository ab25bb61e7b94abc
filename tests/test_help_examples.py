"""Every example printed by a `--help` runs (issue 35: the device and classify examples exited
with status 2).

The examples are read from the help pages themselves (``bpfree --help``, each command's and
each ``device`` action's), so a new example is tested without touching this file. Each command's
examples run in order in one fresh folder (``device run prog`` uses the ``prog`` that ``device
export`` wrote just before). Files the examples name as the user's own (adapt's
``model.tflite``, ``new_site.npz`` and ``images/``) are made by :func:`_user_files`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import subprocess
from pathlib import Path

import numpy as np
import pytest

from bpfree.cli import build_parser, main

#: Examples that take minutes on CI's two cores: the MCUNet-in1 programs (export lowers and
#: links 730 KB of weights), the 20-epoch demo, the fleet's worker processes.
SLOW = (r"mcunet", r"^bpfree demo$", r"^bpfree fleet")
#: A command whose examples read what another's wrote run after those, in the same folder:
#: `docs` regenerates the page from the results/ that `bench` writes.
FOLLOWS = {"docs": "bench"}
#: Examples that need the cortex-m7 toolchain (`make device-toolchain`).
NEEDS_M7 = r"--target cortex-m7"


def _help_pages() -> dict[str, str]:
    """Help text of the top-level parser, every command and every device action."""
    pages = {}

    def visit(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        pages[" ".join(("bpfree", *path))] = parser.format_help()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    visit(sub, (*path, name))

    visit(build_parser(), ())
    return pages


def examples_of(text: str) -> list[str]:
    """The command lines under a help page's "example:" / "examples:" heading ("\\" joins
    continued lines), up to the first blank line."""
    body = re.split(r"^examples?:\n", text, maxsplit=1, flags=re.M)
    if len(body) < 2:
        return []
    block = re.sub(r"\s*\\\n\s*", " ", body[1].split("\n\n", 1)[0])
    # the top-level page adds a comment after two spaces: "bpfree demo    train ..."
    return [re.split(r"\s{2,}", line.strip())[0] for line in block.splitlines()
            if line.strip().startswith("bpfree ")]


def _all_examples() -> dict[str, list[str]]:
    """Each command's examples (by first word after bpfree), first appearance first."""
    groups: dict[str, list[str]] = {}
    for text in _help_pages().values():
        for command in examples_of(text):
            name = shlex.split(command)[1]
            group = groups.setdefault(FOLLOWS.get(name, name), [])
            if command not in group:
                group.append(command)
    return groups


EXAMPLES = _all_examples()


def _user_files(folder: Path) -> None:
    """adapt's examples name the user's model and data: a small int8 CNN and two classes."""
    from PIL import Image

    from bpfree import tflite as bt
    from bpfree.models import mnist_cnn
    from test_tflite import quantized

    bt.save(quantized(mnist_cnn, (1, 28, 28)), folder / "model.tflite",
            input_shape=(1, 28, 28))
    rng = np.random.default_rng(0)
    y = np.arange(40) % 2
    x = (rng.random((40, 1, 28, 28)) * (0.5 + 0.5 * y[:, None, None, None])).astype(np.float32)
    np.savez(folder / "new_site.npz", x=x, y=y)
    for label, name in enumerate(("cats", "dogs")):
        (folder / "images" / name).mkdir(parents=True)
        for i in range(8):
            pixels = rng.integers(0, 256, (40, 30, 3), dtype=np.uint8) // (label + 1)
            Image.fromarray(pixels).save(folder / "images" / name / f"{i}.png")


def _dirty_checkout() -> bool:
    root = Path(__file__).resolve().parents[1]
    try:
        out = subprocess.run(["git", "-C", str(root), "status", "--porcelain",
                              "--untracked-files=no"], capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and bool(out.stdout.strip())


def test_every_help_page_with_options_has_examples():
    assert set(EXAMPLES) >= {"demo", "bench", "memory", "classify", "fleet", "adapt", "device"}
    assert any(c.startswith("bpfree docs") for c in EXAMPLES["bench"])
    for page, text in _help_pages().items():
        if page.count(" ") <= 2:  # bpfree, bpfree CMD, bpfree device ACTION
            assert examples_of(text), f"{page} --help shows no example"
    # none is a bare command that only prints its usage (exit status 2)
    assert "bpfree device" not in EXAMPLES["device"]


def _cases():
    for group, commands in EXAMPLES.items():
        for speed in ("fast", "slow"):
            chosen = [c for c in commands
                      if any(re.search(p, c) for p in SLOW) == (speed == "slow")]
            if chosen:
                marks = [pytest.mark.slow] if speed == "slow" else []
                yield pytest.param(group, chosen, marks=marks, id=f"{group}-{speed}")


@pytest.mark.parametrize("group, commands", list(_cases()))
def test_help_examples_run(group, commands, tmp_path, monkeypatch):
    from bpfree.device.mcu import missing_tools

    monkeypatch.chdir(tmp_path)
    if group == "adapt":
        _user_files(tmp_path)
    for command in commands:
        if re.search(NEEDS_M7, command) and missing_tools():
            continue  # the cortex-m7 tests name the missing tools; here only what can run
        argv = shlex.split(command)[1:]
        if argv[0] == "bench" and len(argv) > 1 and not argv[1].startswith("-") \
                and _dirty_checkout():
            argv.append("--allow-dirty")  # a benchmark refuses a dirty checkout by design
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = main(argv)
        assert rc == 0, f"`{command}` exited {rc}:\n{out.getvalue()[-2000:]}"
