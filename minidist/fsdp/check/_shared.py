"""Helpers the fsdp checkers share."""

from __future__ import annotations

WORLDS = (2, 3, 4)
