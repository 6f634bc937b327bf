"""Lesson 06's entries in the harnesses: the `memory` bench (lessons 01-06 side by side)."""

from . import bench  # noqa: F401  (registers `python -m minidist bench memory`)
