"""Reservoir: a caching device-memory allocator, PyTorch's exactly and better.

This distribution holds the ``reservoir`` command (``python -m reservoir``),
and :mod:`reservoir.torch`, which serves PyTorch's CUDA allocations from
Reservoir (import it explicitly; torch is imported only then).
"""

from __future__ import annotations

from ._native import ReservoirError, __version__

__all__ = ["ReservoirError", "__version__"]
