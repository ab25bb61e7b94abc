"""``.tflite`` in, ``.tflite`` out: load a full-integer LiteRT model, train it, save it back.

* :func:`load` reads a full-integer ``.tflite`` file into a
  :class:`~bpfree.quant.ptq.QuantizedModel` built from :mod:`bpfree.quant`'s TFLite-exact
  integer layers (:mod:`.reader`);
* :func:`save` writes a ``QuantizedModel`` (loaded, from :func:`~bpfree.quant.quantize_model`, or
  MCUNet-in1) as a ``.tflite`` that LiteRT runs with the same integer outputs (:mod:`.writer`);
  a loaded model goes back into a copy of its own file with only weights and biases changed,
  keeping operators, signature, tensor names and metadata (:mod:`.patch`);
* :class:`TFLiteFormatError` is raised for anything that cannot be loaded;
* :mod:`.softmax`: LiteRT's int8 SOFTMAX (inference only); :mod:`.oracle`: LiteRT's
  interpreter for the tests and ``bpfree bench tflite``; :mod:`.adapt`: ``bpfree adapt``.

docs/TFLITE.md has the operator coverage table and the exactness checks against LiteRT.
"""

from .reader import from_bytes, load
from .schema import SUPPORTED_OPS, TFLiteFormatError
from .softmax import QSoftmax
from .stages import QPad, litert_linear, use_litert_kernels
from .patch import PatchError, patched_bytes
from .writer import file_bytes, save, to_bytes

__all__ = ["PatchError", "QPad", "QSoftmax", "SUPPORTED_OPS", "TFLiteFormatError", "file_bytes",
           "from_bytes", "litert_linear", "load", "patched_bytes", "save", "to_bytes",
           "use_litert_kernels"]
