"""Atomic, verifiable training checkpoints in the safetensors format.

A checkpoint holds up to three sections: the model's ``state_dict``, the optimizer's
``state_dict`` and an ``extra`` dict (RNG states, seeds, step counters, anything small).
Nested containers are flattened: every tensor (and numpy array) goes into the safetensors
payload under a path-like key such as ``optimizer/state/0/momentum_buffer``; the non-tensor
skeleton goes into the safetensors metadata as JSON in which every value carries a type tag,
so int dict keys, tuples, big ints and floats (exactly, as hex; inf and NaN included)
survive the round trip. Nothing is ever pickled, so loading a checkpoint cannot run code.

Integrity: the metadata stores the format version, each tensor's dtype, shape and SHA-256,
and a SHA-256 digest over the metadata itself. :func:`load_checkpoint` checks all of it
before returning anything and raises :class:`CheckpointError` naming the file otherwise.

Durability: :func:`save_checkpoint` serializes everything in memory first, writes a temporary
file in the destination directory, flushes and fsyncs it, ``os.replace``-s it over the
destination and fsyncs the directory. A crash or an exception at any point leaves either the
old checkpoint or the new one, never a mix, and no temporary file.

Resuming from a checkpoint is bit-identical to never stopping, provided the training loop's
own randomness is saved too (see :func:`capture_rng_state` / :func:`restore_rng_state`).

The package's parts: :mod:`.format` (the file layout: type-tagged skeleton, tensor records,
digest, header checks), :mod:`.store` (atomic save, verified load, all-or-nothing restore),
:mod:`.rng` (the global RNG states to keep in ``extra``).
"""

from .format import FORMAT_VERSION, Checkpoint, CheckpointError
from .rng import capture_rng_state, restore_rng_state
from .store import load_checkpoint, restore_checkpoint, save_checkpoint, serialize_checkpoint

__all__ = [
    "FORMAT_VERSION",
    "Checkpoint",
    "CheckpointError",
    "capture_rng_state",
    "load_checkpoint",
    "restore_checkpoint",
    "restore_rng_state",
    "save_checkpoint",
    "serialize_checkpoint",
]
