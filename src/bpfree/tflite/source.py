"""Where a loaded layer's integers live in its ``.tflite`` file (:class:`TFLiteSource`).

The reader records it on each layer it builds; :mod:`.patch` uses it to write trained
weights back into a copy of the original file. A module of its own so that the reader and
the patcher both import it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TFLiteSource"]


@dataclass(frozen=True)
class TFLiteSource:
    """Where a layer's integers live in its file: the weight and bias tensor indices (bias -1:
    none), the operator kind (``"conv"``, ``"depthwise"``, ``"fc"``) and, for a
    FULLY_CONNECTED after a RESHAPE of an NHWC tensor, that tensor's ``(H, W, C)`` (the reader
    permuted the weight columns to NCHW order)."""

    weight: int
    bias: int
    kind: str
    flatten_hwc: tuple[int, int, int] | None = None
