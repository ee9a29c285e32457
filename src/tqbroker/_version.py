"""The version of tqbroker: stated here once (hatch reads it into the distribution's metadata)."""

from __future__ import annotations

__version__ = "0.1.0"
