"""Where the site may be written, checked before anything is read or removed (`site.build_site`).

An output folder is only ever written when it is empty or a previous build: each build
leaves a manifest, `MARKER`, at its root, listing every file it wrote. A rebuild removes
only the files the previous manifest lists and leaves everything else (a `.git`, a `CNAME`
added to publish the folder); a new file that would land on a file no build wrote is
refused. Refused, with one line naming `--out` and the rule:

- a folder that holds, or lies inside, a source of the site or the checkout itself
  (`--out notebooks` would delete the course's notebooks, `--out .` the checkout);
- an existing folder that is not empty and holds no marker (not ours to delete);
- a regular file, or a place that cannot be written.

The new site is built next to the old one, in a temporary folder, and moved in at the end:
a build that fails leaves the previous site as it was. While files move, the manifest lists
the old and the new ones, so an interrupted move leaves nothing that the next build does not
know it wrote.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath

MARKER = ".minidist-site"
MARKER_TEXT = (
    "a site built by `python -m minidist site`; the next build replaces the files listed "
    "below, and only those\n"
)
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
    """Put the new build where the old one was: the files the previous manifest lists are
    removed or replaced, every other file in `target` stays."""
    new = _files(built)
    if not target.exists():
        _write_manifest(built, new)
        built.rename(target)
        return
    old = read_manifest(target)
    try:
        _check_no_clash(target, new, old)
    except SiteError:
        shutil.rmtree(built)
        raise
    _write_manifest(target, old | new)  # an interrupted move still lists all it wrote
    for rel in sorted(old - new):
        path = target / rel
        if _inside_without_links(target, rel) and (path.is_symlink() or path.is_file()):
            path.unlink()
    for rel in sorted(new):
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(built / rel, target / rel)
    folders = {p for f in old for p in PurePosixPath(f).parents if p != PurePosixPath(".")}
    for folder in sorted(folders, key=_depth):
        if _inside_without_links(target, f"{folder}/x"):
            try:
                (target / folder).rmdir()  # only when empty: the user's files stay
            except OSError:
                pass
    _write_manifest(target, new)
    shutil.rmtree(built)


def read_manifest(target: Path) -> set[str]:
    """The files a previous build says it wrote (relative, inside `target`: a forged line
    that climbs out, or is absolute, is not ours and is ignored); none for an empty folder."""
    if not (target / MARKER).is_file():
        return set()
    lines = (target / MARKER).read_text(errors="replace").splitlines()[1:]
    clean = (PurePosixPath(line) for line in lines if line)
    return {str(p) for p in clean if not p.is_absolute() and ".." not in p.parts}


def _files(built: Path) -> set[str]:
    return {
        p.relative_to(built).as_posix()
        for p in built.rglob("*")
        if p.name != MARKER and (p.is_symlink() or not p.is_dir())
    }


def _depth(rel: PurePosixPath) -> int:
    return -len(rel.parts)


def _inside_without_links(target: Path, rel: str) -> bool:
    """No folder between `target` and `rel` is a symlink (never remove through one)."""
    here = target
    for part in PurePosixPath(rel).parts[:-1]:
        here = here / part
        if here.is_symlink() or (here.exists() and not here.is_dir()):
            return False
    return True


def _check_no_clash(target: Path, new: set[str], old: set[str]) -> None:
    """Every new file lands where nothing is, or on a file the previous build wrote."""
    for rel in sorted(new):
        path = target / rel
        there = path.is_symlink() or path.exists()
        theirs = rel not in old or (path.is_dir() and not path.is_symlink())
        if not _inside_without_links(target, rel) or (there and theirs):
            raise SiteError(
                f"--out {target}: {rel} was not written by a site build (not in {MARKER}) "
                "and the new build would replace it; move it away or give another folder"
            )


def _write_manifest(folder: Path, files: set[str]) -> None:
    tmp = folder / f"{MARKER}.{os.getpid()}"
    tmp.write_text(MARKER_TEXT + "".join(f"{rel}\n" for rel in sorted(files)))
    os.replace(tmp, folder / MARKER)
