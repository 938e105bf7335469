"""The pilot daemon and everything the three packages share (model, wire protocol)."""

from __future__ import annotations

__version__ = "0.1.0"
