"""`--threads` and `--quiet` on every command (issue 35: torch's default threads oversubscribe a
shared machine; long runs should show progress on a terminal and hide it on request)."""

from __future__ import annotations

import argparse

import pytest
import torch

from bpfree import cli, progress


@pytest.fixture(autouse=True)
def _restore():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
    progress.silence(False)


def test_threads_sets_torch_intra_op_threads_before_the_command(capsys):
    assert cli.main(["--threads", "1", "memory", "--model", "digits-mlp", "--method", "bp"]) == 0
    assert torch.get_num_threads() == 1
    assert cli.main(["memory", "--threads", "2", "--model", "digits-mlp", "--method", "bp"]) == 0
    assert torch.get_num_threads() == 2


def test_default_threads_is_small_and_the_environment_overrides_it(monkeypatch):
    monkeypatch.delenv(cli.THREADS_ENV_VAR, raising=False)
    assert 1 <= cli.default_threads() <= 4
    monkeypatch.setenv(cli.THREADS_ENV_VAR, "3")
    assert cli.default_threads() == 3
    monkeypatch.setenv(cli.THREADS_ENV_VAR, "zero")
    with pytest.raises(argparse.ArgumentTypeError, match=r"\$BPFREE_THREADS must be an int >= 1"):
        cli.default_threads()


@pytest.mark.parametrize("value", ["0", "-2", "many"])
def test_bad_threads_is_a_usage_error(value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--threads", value])
    assert exit_info.value.code == 2
    assert "--threads must be an int >= 1" in capsys.readouterr().err


def test_every_command_takes_threads_and_quiet():
    parser = cli.build_parser()
    commands = parser._subparsers._group_actions[0].choices
    for name, sub in commands.items():
        assert {"--threads", "--quiet"} <= set(sub._option_string_actions), name


def test_quiet_silences_even_a_requested_bar():
    assert progress.show_progress(True)
    progress.silence()
    assert not progress.show_progress(True) and not progress.show_progress("title")
