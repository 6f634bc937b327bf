"""What a learner's code did with `minidist.comm`, beyond the ledger's bytes.

`watch_comm()` wraps the collectives of `minidist.comm` for the duration of a block (on a
checker's rank: a process of its own) and records every call: the op, the tensors it
wrote into, and for an async call the work it returned, wrapped so that it knows whether
anyone waited on it. A checker then names two mistakes the values may hide: async work
never waited on (gloo often finishes before anyone looks, so the values pass by luck), and
a collective into a temporary buffer that was then copied where it belongs (the memory a
sharded method exists to save).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from .. import comm

WATCHED = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all")


class _Watched:
    """An async work that records whether `wait()` (or its future) was used."""

    def __init__(self, work):
        self._work, self.waited = work, False

    def wait(self, *args):
        self.waited = True
        return self._work.wait(*args)

    def get_future(self):
        self.waited = True
        return self._work.get_future()

    def __getattr__(self, name):
        return getattr(self._work, name)


@dataclass
class Call:
    op: str
    outputs: list[torch.Tensor]  # what the collective wrote into
    work: _Watched | None = None  # None for a blocking call


@dataclass
class Watch:
    calls: list[Call] = field(default_factory=list)

    def never_waited(self) -> list[str]:
        """The ops of async calls whose work nobody waited on."""
        return [c.op for c in self.calls if c.work is not None and not c.work.waited]

    def wrote_outside(self, op: str, target: torch.Tensor) -> bool:
        """Whether some `op` wrote into a tensor that does not share `target`'s storage."""
        ptr = target.untyped_storage().data_ptr()
        return any(
            o.untyped_storage().data_ptr() != ptr
            for c in self.calls
            if c.op == op
            for o in c.outputs
        )


def _outputs(op: str, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    first = args[0] if args else kwargs.get("output", kwargs.get("tensor"))
    items = first if isinstance(first, list | tuple) else [first]
    return [t for t in items if isinstance(t, torch.Tensor)]


@contextmanager
def watch_comm() -> Iterator[Watch]:
    """Record every `minidist.comm` collective made inside the block (see the module)."""
    watch = Watch()
    real = {name: getattr(comm, name) for name in WATCHED}

    def wrap(name):
        def call(*args, **kwargs):
            outputs = _outputs(name, args, kwargs)
            work = real[name](*args, **kwargs)
            record = Call(name, outputs)
            if work is not None:
                record.work = work = _Watched(work)
            watch.calls.append(record)
            return work

        return call

    for name in WATCHED:
        setattr(comm, name, wrap(name))
    try:
        yield watch
    finally:
        for name, fn in real.items():
            setattr(comm, name, fn)
