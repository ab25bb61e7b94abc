"""Progress bars and logging for long public entry points (:func:`bpfree.harness.fit`,
:func:`bpfree.pinn.train_zo`, :func:`bpfree.ttzo.train`, :func:`bpfree.tinyfoa.fit_epochs`).

One rule for all of them: a bar shows by default when stderr is a terminal (an interactive
user), never in a pipe, a log file or a test run; ``progress=False`` or ``quiet=True`` hides
it, ``progress=True`` forces it, and a string both forces it and titles it. Messages a user
may want to see or silence go to the ``"bpfree"`` logger (``logging.getLogger("bpfree")``);
the library installs no handler, so they follow the application's logging configuration.
"""

from __future__ import annotations

import logging
import sys

from tqdm.auto import tqdm

__all__ = ["logger", "progress_bar", "show_progress", "silence"]

#: The library's logger; children are named after modules (``bpfree.harness``, ...).
logger = logging.getLogger("bpfree")
_silenced = False


def silence(on: bool = True) -> None:
    """Hide every bar of this process, even those asked for (``bpfree --quiet``)."""
    global _silenced
    _silenced = bool(on)


def show_progress(progress: bool | str | None = None, quiet: bool = False) -> bool:
    """Whether to draw a bar: never with ``quiet``; as asked with a bool or a title string;
    by default (``None``) only when stderr is a terminal."""
    if quiet or progress is False or _silenced:
        return False
    if progress is None:
        stream = sys.stderr
        return bool(getattr(stream, "isatty", None) and stream.isatty())
    return True


def progress_bar(total: int | None, desc: str, progress: bool | str | None = None,
                 quiet: bool = False, **kwargs) -> tqdm:
    """A tqdm bar of ``total`` steps (None: unknown), titled ``progress`` when it is a string,
    else ``desc``; disabled unless :func:`show_progress`. The bar leaves no line behind."""
    title = progress if isinstance(progress, str) else desc
    return tqdm(total=total, desc=title, disable=not show_progress(progress, quiet),
                leave=False, **kwargs)
