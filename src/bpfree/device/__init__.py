"""The PMT training engine on the device: generated C99, bit-exact with the simulator.

:func:`export_c` writes a self-contained C project for a configured
:class:`~bpfree.pmt.PMTTrainer` (``PMTConfig(device_exact=True)``); :func:`run_c` compiles and
runs it on the host (ctypes) or on an emulated Cortex-M7 (QEMU, semihosting) and returns the
per-step losses and a copy of the model with the C-trained weights.
"""

from .export import TARGETS, DeviceProgram, export_c
from .run import DeviceResult, cyclic_batches, infer_c, run_c

__all__ = ["TARGETS", "DeviceProgram", "DeviceResult", "cyclic_batches", "export_c", "infer_c",
           "run_c"]
