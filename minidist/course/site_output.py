"""Where the site may be written, checked before anything is read or removed (`site.build_site`).

An output folder is only ever written when it is empty or a previous build: each build
leaves a manifest, `MARKER`, at its root, listing every file it wrote with its sha256. A
rebuild removes only the files the previous manifest lists that still have that content,
and leaves everything else (a `.git`, a `CNAME` added to publish the folder, a built page
the user edited, the files a marker written by hand or copied with a folder lists); a new
file that would land on a file that is not such a file is refused. Refused, with one line
naming `--out` and the rule:

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
    "below (sha256, path), and only those still as written\n"
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
    marker = target / MARKER
    if target.is_dir() and any(target.iterdir()) and (marker.is_symlink() or not marker.is_file()):
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
    """Put the new build where the old one was: the files the previous manifest lists, and
    that are still as it wrote them, are removed or replaced; every other file in `target`
    stays (one the user changed since, or listed by a marker the user wrote)."""
    new = {rel: _digest(built / rel) for rel in _files(built)}
    if not target.exists():
        _write_manifest(built, new)
        built.rename(target)
        return
    old = _still_ours(target, read_manifest(target))
    try:
        _check_no_clash(target, new, old)
    except SiteError:
        shutil.rmtree(built)
        raise
    _write_manifest(target, {**old, **new})  # an interrupted move still lists all it wrote
    for rel in sorted(set(old) - set(new)):
        (target / rel).unlink()
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


def read_manifest(target: Path) -> dict[str, str]:
    """{file: its sha256} that a previous build says it wrote (relative, inside `target`: a
    line that climbs out, or is absolute, is not ours and is ignored); none for a folder
    without a marker, or whose marker is a link (the build writes a regular file)."""
    marker = target / MARKER
    if marker.is_symlink() or not marker.is_file():
        return {}
    out = {}
    for line in marker.read_text(errors="replace").splitlines()[1:]:
        digest, _, rel = line.partition(" ")
        path = PurePosixPath(rel) if rel else None
        if len(digest) == 64 and path and not path.is_absolute() and ".." not in path.parts:
            out[str(path)] = digest
    return out


def _still_ours(target: Path, listed: dict[str, str]) -> dict[str, str]:
    """The listed files that are still what the build wrote: reached without a link, and
    with the content it recorded (a marker forged by hand, or copied with a folder, lists
    the user's files; a built file the user edited since is theirs now)."""
    return {
        rel: digest
        for rel, digest in listed.items()
        if _inside_without_links(target, rel) and _digest(target / rel) == digest
    }


def _digest(path: Path) -> str | None:
    """sha256 of a file's bytes (of a link's target text), None when it is neither."""
    import hashlib

    try:
        if path.is_symlink():
            return hashlib.sha256(b"link:" + os.readlink(path).encode()).hexdigest()
        if not path.is_file():
            return None
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        return digest.hexdigest()
    except OSError:
        return None


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


def _check_no_clash(target: Path, new: dict[str, str], old: dict[str, str]) -> None:
    """Every new file lands where nothing is, or on a file the previous build wrote and
    nobody changed since."""
    for rel in sorted(new):
        path = target / rel
        there = path.is_symlink() or path.exists()
        if not _inside_without_links(target, rel) or (there and rel not in old):
            raise SiteError(
                f"--out {target}: {rel} was not written by a site build, or was changed "
                f"since (not as {MARKER} lists it), and the new build would replace it; move "
                "it away or give another folder"
            )


def _write_manifest(folder: Path, files: dict[str, str | None]) -> None:
    tmp = folder / f"{MARKER}.{os.getpid()}"
    lines = "".join(f"{digest} {rel}\n" for rel, digest in sorted(files.items()) if digest)
    tmp.write_text(MARKER_TEXT + lines)
    os.replace(tmp, folder / MARKER)
