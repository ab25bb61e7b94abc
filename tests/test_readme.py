"""Every Python block of README.md runs as pasted (issue 35: 9 of 10 blocks used undefined
names). Each block runs in a fresh namespace in an empty working folder, so a block that leans
on another block's names, or on a file it did not write, fails here.

A block preceded by ``<!-- readme-test: slow -->`` runs only with ``-m slow``; one preceded by
``<!-- readme-test: needs-data -->`` reads datasets bpfree does not ship, and skips (naming the
missing file) where ``$BPFREE_DATA`` / ``../shared/data`` lacks them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"
# A fenced block at the start of a line; the optional marker comment right above it.
_BLOCK = re.compile(r"(?:<!-- readme-test: (?P<marker>[\w-]+) -->\n)?^```(?P<lang>\w*)\n"
                    r"(?P<code>.*?)^```$", re.S | re.M)
MARKERS = ("slow", "needs-data")


def readme_blocks(text: str) -> list[tuple[int, str, str, str]]:
    """``(line, language, marker, code)`` of each fenced block of ``text``."""
    return [(text[:m.start("code")].count("\n"), m["lang"], m["marker"] or "", m["code"])
            for m in _BLOCK.finditer(text)]


PYTHON = [(line, marker, code) for line, lang, marker, code in readme_blocks(README.read_text())
          if lang == "python"]


def test_the_readme_has_python_blocks_and_known_markers():
    assert len(PYTHON) >= 10
    assert {marker for _, marker, _ in PYTHON} <= {"", *MARKERS}
    # A block indented inside a list item is not a fenced block on its own line.
    assert not re.search(r"^ +```python", README.read_text(), re.M)


def test_block_parser_sees_markers_and_languages():
    text = "a\n<!-- readme-test: slow -->\n```python\nx = 1\n```\n```\nsh\n```\n"
    assert readme_blocks(text) == [(3, "python", "slow", "x = 1\n"), (6, "", "", "sh\n")]


def _params() -> list:
    return [pytest.param(marker, code, id=f"README.md:{line}",
                         marks=[pytest.mark.slow] if marker == "slow" else [])
            for line, marker, code in PYTHON]


@pytest.mark.parametrize("marker, code", _params())
def test_readme_python_block_runs(marker, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    try:
        exec(compile(code, f"README.md block in {tmp_path}", "exec"), {"__name__": "__readme__"})
    except FileNotFoundError as err:
        if marker != "needs-data":
            raise
        pytest.skip(f"the block's data is not here: {err}")
    finally:
        torch.set_num_threads(threads)
