"""LiteRT's interpreter as the oracle of :mod:`bpfree.tflite` (tests and ``bpfree bench tflite``).

``ai-edge-litert`` is a development dependency (``pip install -c constraints.txt -e ".[dev]"``),
imported only when an interpreter is built. ``BUILTIN_REF`` selects LiteRT's reference kernels,
the bit-exact target of :mod:`bpfree.quant`; the optimized kernels and XNNPACK may round ties
differently.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import torch

REASON = ("ai-edge-litert (LiteRT's interpreter, the oracle) is not installed; install the dev "
          "extra: pip install -c constraints.txt -e '.[dev]'")


def litert_available() -> bool:
    return importlib.util.find_spec("ai_edge_litert") is not None


class LiteRT:
    """One LiteRT interpreter of a ``.tflite`` file's bytes; :meth:`__call__` runs a batch."""

    def __init__(self, data: bytes, *, reference: bool = True) -> None:
        if not litert_available():
            raise ImportError(REASON)
        from ai_edge_litert.interpreter import Interpreter, OpResolverType  # lazy: test-only

        kind = OpResolverType.BUILTIN_REF if reference else OpResolverType.AUTO
        self.interpreter = Interpreter(model_content=bytes(data),
                                       experimental_op_resolver_type=kind)
        self.input = self.interpreter.get_input_details()[0]["index"]
        self.output = self.interpreter.get_output_details()[0]["index"]
        self._shape: tuple[int, ...] | None = None

    def __call__(self, x: torch.Tensor) -> np.ndarray:
        """The file's output for the NCHW (or 2-D) batch ``x``, passed to LiteRT as NHWC."""
        xin = x.detach().cpu().permute(0, 2, 3, 1) if x.dim() == 4 else x.detach().cpu()
        xin = np.ascontiguousarray(xin.numpy())
        if xin.shape != self._shape:
            self.interpreter.resize_tensor_input(self.input, list(xin.shape))
            self.interpreter.allocate_tensors()
            self._shape = xin.shape
        self.interpreter.set_tensor(self.input, xin)
        self.interpreter.invoke()
        return self.interpreter.get_tensor(self.output).copy()


def run_litert(data: bytes, x: torch.Tensor, *, reference: bool = True) -> np.ndarray:
    """LiteRT's output for ``x`` (see :class:`LiteRT`)."""
    return LiteRT(data, reference=reference)(x)
