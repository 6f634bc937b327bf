"""Checks of command-line arguments that run before anything else does (issue 27).

Each returns nothing or the rule the argument broke, in words, so that the caller reports it
the argparse way: one line naming the argument, exit status 2 (`parser.error`). argparse's
`type=` converters (`positive_int`) do the same from inside `parse_args`.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an int") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def writable_folder(path: Path) -> str | None:
    """Why `path` cannot be (or become) a folder we write into, or None if it can: every part
    of it that exists must be a folder, and the deepest existing one writable."""
    path = Path(os.path.abspath(path))
    for part in [path, *path.parents]:
        if part.exists():
            if not part.is_dir():
                return f"{part} is not a folder" + ("" if part == path else f" (in {path})")
            if not os.access(part, os.W_OK | os.X_OK):
                return f"{part} is not writable"
            return None
    return None


def writable_file(path: Path) -> str | None:
    """Why a file cannot be written at `path` (its folder must exist and be writable, and
    the path itself must not be a folder), or None if it can."""
    path = Path(os.path.abspath(path))
    if path.is_dir():
        return f"{path} is a folder, not a file"
    folder = path.parent
    if not folder.is_dir():
        return f"its folder {folder} does not exist (or is not a folder)"
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return f"{path} is not writable"
    return None


def notebook_folder(path: Path) -> str | None:
    """Why `path` is not a folder of notebooks, or None if it is."""
    if not path.is_dir():
        return f"{path} is not a folder"
    if not any(path.glob("*.ipynb")):
        return f"{path} holds no notebook (*.ipynb)"
    return None
