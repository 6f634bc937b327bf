"""Where the site may be written, checked before anything is read or removed (`site.build_site`).

The site replaces its output folder. An output folder is only ever replaced when it is
empty or a previous build: each build leaves a marker file, `MARKER`, at its root. Refused,
with one line naming `--out` and the rule:

- a folder that holds, or lies inside, a source of the site or the checkout itself
  (`--out notebooks` would delete the course's notebooks, `--out .` the checkout);
- an existing folder that is not empty and holds no marker (not ours to delete);
- a regular file, or a place that cannot be written.

The new site is built next to the old one, in a temporary folder, and swapped in at the
end: a build that fails leaves the previous site as it was.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

MARKER = ".minidist-site"
MARKER_TEXT = "a site built by `python -m minidist site`: the next build replaces this folder\n"
# What the site is built from (a folder holding or inside any of these is refused).
SOURCES = ("README.md", "pyproject.toml", "notebooks", "exercises", "solutions", "minidist", ".git")


class SiteError(ValueError):
    """A refused `site` invocation: the message is one line naming the argument and the rule."""


def check_checkout(root: Path) -> None:
    """The site is built from a minidist checkout: its README, pyproject.toml and notebooks."""
    missing = [n for n in ("README.md", "pyproject.toml", "notebooks") if not (root / n).exists()]
    if missing:
        raise SiteError(
            f"`python -m minidist site` runs in a minidist checkout (the folder holding "
            f"notebooks/, README.md and pyproject.toml); {root} lacks {', '.join(missing)}"
        )


def _within(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def check_output(root: Path, out: Path) -> Path:
    """The resolved output folder, or a `SiteError` saying why it may not be (re)written."""
    root, target = root.resolve(), out.resolve()
    if _within(root, target):
        raise SiteError(f"--out {out}: the output folder would hold the checkout {root}")
    for name in SOURCES:
        source = root / name
        if source.exists() and (_within(target, source) or _within(source, target)):
            how = "lies inside" if _within(target, source) else "holds"
            how = "is" if target == source else how
            raise SiteError(
                f"--out {out}: the output folder {how} the site's source {name}; "
                "choose a folder of its own (default build/site)"
            )
    if target.exists() and not target.is_dir():
        raise SiteError(f"--out {out}: exists and is not a folder")
    if target.is_dir() and any(target.iterdir()) and not (target / MARKER).is_file():
        raise SiteError(
            f"--out {out}: the folder holds files that no site build wrote (no {MARKER}); "
            "the build replaces its output folder, so give an empty or new one"
        )
    parent = next((p for p in [target, *target.parents] if p.exists()), None)
    if parent is None or not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise SiteError(f"--out {out}: cannot be written ({parent} is not a writable folder)")
    return target


def staging(target: Path) -> Path:
    """An empty folder beside `target` to build into (the same file system: renamed in)."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        built = Path(tempfile.mkdtemp(prefix=f".{target.name}-building-", dir=target.parent))
    except OSError as exc:
        raise SiteError(f"--out {target}: cannot be written ({exc.strerror})") from None
    umask = os.umask(0)
    os.umask(umask)
    built.chmod(0o777 & ~umask)  # mkdtemp's folder is private; a site is not
    return built


def swap_in(built: Path, target: Path) -> None:
    """Mark the new build and put it where the old one was."""
    (built / MARKER).write_text(MARKER_TEXT)
    if target.exists():
        old = target.with_name(f".{target.name}-old-{os.getpid()}")
        target.rename(old)
        built.rename(target)
        shutil.rmtree(old)
    else:
        built.rename(target)
