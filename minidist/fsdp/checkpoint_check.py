"""The checks before a sharded checkpoint is loaded: a complete one, of this model.

The validation part of `minidist.fsdp.checkpoint` (what a checkpoint records is
`checkpoint_layout.py`'s). Zhao et al. 2023, "PyTorch FSDP" (VLDB), on sharded state dicts:
a load on another number of ranks reshards by the recorded names and global shapes, so
these must match the model before any tensor is read.

`_read` accepts only a complete checkpoint of this format (not an unfinished or replaced
save, not a DCP checkpoint of someone else's), finishes a save stopped between its two
renames (`checkpoint_files.recover`), pins one version (`minidist.checkpoint_pin`: its
files held open, so that a save replacing it meanwhile changes nothing that is read),
verifies every file and chunk against the checksums and reads it without running code from
it (`checkpoint_safe.py`), and returns the pinned version, DCP's metadata and the layout
record; `_check` compares them with a wrapper and raises
`CheckpointMismatchError` naming the first trainable parameter, flat unit, frozen parameter
or buffer, or optimizer entry (class, param group units) whose name or shape differs.
Neither changes anything.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata

from ..checkpoint_files import CheckpointError
from ..checkpoint_pin import Pinned, pin
from ..checkpoint_schema import check_fsdp_layout
from .checkpoint_layout import (
    FORMAT,
    LAYOUT_KEY,
    REPLACED,
    UNFINISHED,
    _layout,
    _optimizer_class,
    _optimizer_units,
    _Sharded,
    _unit_key,
)
from .checkpoint_safe import dcp_load, verify


class CheckpointMismatchError(ValueError):
    """The checkpoint holds another model or optimizer than the one it is loaded into."""


# -- reading a checkpoint ----------------------------------------------------------------------
def _read(path: Path) -> tuple[Pinned, Metadata, dict]:
    """A pinned version (its files held open: close it), DCP's metadata and the layout
    record, verified against the checksums and read without running code from the file;
    refuses anything but a complete checkpoint of this format."""
    if path.name.startswith(".") and path.name.endswith(UNFINISHED):
        raise ValueError(f"{path} is an unfinished save (interrupted before completion)")
    try:
        pinned = pin(path)
    except FileNotFoundError:
        unfinished = path.with_name(f".{path.name}{UNFINISHED}")
        replaced = path.with_name(f".{path.name}{REPLACED}")
        hint = (
            f"; {unfinished} is an unfinished save, it never completed"
            if unfinished.exists()
            else f"; the checkpoint it replaced is in {replaced}"
            if replaced.exists()
            else ""
        )
        raise FileNotFoundError(f"no checkpoint at {path}{hint}") from None
    try:
        meta = verify(pinned)
        if LAYOUT_KEY not in meta.state_dict_metadata:
            raise ValueError(f"{path} is a DCP checkpoint but not minidist's (no {LAYOUT_KEY})")
        if not isinstance(meta.state_dict_metadata[LAYOUT_KEY], BytesStorageMetadata):
            raise CheckpointError(f"{path}: {LAYOUT_KEY} is not stored as a string")
        record = {LAYOUT_KEY: None}
        with warnings.catch_warnings():  # no_dist warns that it is a single-process read
            warnings.simplefilter("ignore")
            dcp_load(record, pinned, no_dist=True)
        where = f"{path}: {LAYOUT_KEY}"
        try:
            layout = json.loads(record[LAYOUT_KEY])
        except (TypeError, ValueError) as e:  # not a string, not JSON
            raise CheckpointError(f"{where} is not a JSON layout record ({e})") from None
        if isinstance(layout, dict) and layout.get("format") != FORMAT:
            raise CheckpointError(f"{path}: unknown checkpoint format {layout.get('format')!r}")
        check_fsdp_layout(layout, meta, where, FORMAT, _unit_key)  # every field's type
    except BaseException:
        pinned.close()
        raise
    return pinned, meta, layout


def _item(items: list, i: int):
    return items[i] if i < len(items) else "no such entry"


def _shape(shape) -> str:
    return "no such entry" if shape is None else str(list(shape))


def _mismatch(what: str, saved, mine) -> CheckpointMismatchError:
    return CheckpointMismatchError(
        f"checkpoint does not fit this model: {what}: the checkpoint has {saved}, this "
        f"{'optimizer' if what.startswith('optim') else 'model'} has {mine}"
    )


def _check(meta: Metadata, layout: dict, s: _Sharded, optimizer) -> None:
    """Raise naming the first entry whose name or shape differs; changes nothing."""
    mine = _layout(s, None)

    def params(record: dict) -> dict[str, str]:
        return {
            n: f"{list(shape)} {u['dtype']}"
            for u in record["units"]
            for n, shape in zip(u["names"], u["shapes"])
        }

    saved_params, my_params = params(layout), params(mine)
    for name in [*my_params, *(n for n in saved_params if n not in my_params)]:
        if saved_params.get(name) != my_params.get(name):
            raise _mismatch(
                f"trainable parameter {name}",
                saved_params.get(name, "no such parameter"),
                my_params.get(name, "no such parameter"),
            )
    saved_units, my_units = [u["key"] for u in layout["units"]], [u["key"] for u in mine["units"]]
    if saved_units != my_units:
        i = next((i for i, (a, b) in enumerate(zip(saved_units, my_units)) if a != b), None)
        i = min(len(saved_units), len(my_units)) if i is None else i
        raise _mismatch(
            f"flat unit {i} (the same parameters grouped otherwise: another wrap policy or "
            "bucket size; load_full reads any grouping)",
            _item(saved_units, i),
            _item(my_units, i),
        )
    saved_whole = {
        k[len("model.") :]: tuple(md.size)
        for k, md in meta.state_dict_metadata.items()
        if k.startswith("model.") and not k.startswith("model.flat[")
    }
    my_whole = {n: tuple(t.shape) for n, t in s.replicated.items()}
    for name in [*my_whole, *(n for n in saved_whole if n not in my_whole)]:
        if saved_whole.get(name) != my_whole.get(name):
            raise _mismatch(
                f"frozen parameter or buffer {name}",
                _shape(saved_whole.get(name)),
                _shape(my_whole.get(name)),
            )
    if optimizer is None:
        return
    opt = layout["optimizer"]
    if opt is None:
        raise CheckpointMismatchError("checkpoint has no optimizer state (saved without one)")
    if opt["class"] != _optimizer_class(optimizer):
        raise _mismatch("optimizer class", opt["class"], _optimizer_class(optimizer))
    groups = [[_unit_key(u.names) for u in g] for g in _optimizer_units(optimizer, s.units)]
    for g in range(max(len(opt["groups"]), len(groups))):
        a = sorted(opt["groups"][g]) if g < len(opt["groups"]) else "no such group"
        b = sorted(groups[g]) if g < len(groups) else "no such group"
        if a != b:
            raise _mismatch(f"optimizer param_groups[{g}] units", a, b)
