"""Helpers the megatron checkers share."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch.distributed as dist

# torch.distributed's collectives a learner might call instead of minidist.comm's
_SPIED = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "broadcast", "reduce", "all_to_all_single", "send", "recv",
)  # fmt: skip


def _and(items) -> str:
    names = [str(i) for i in items]
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]


@contextmanager
def torch_collectives() -> Iterator[list[str]]:
    """The names of every torch.distributed collective called inside, minidist.comm's own
    calls included (each comm collective makes exactly one): fewer ledger records than
    names means the learner called torch.distributed directly, invisible to the ledger."""
    calls: list[str] = []
    saved = {name: getattr(dist, name) for name in _SPIED}

    def spy(name, fn):
        def wrapper(*args, **kwargs):
            calls.append(name)
            return fn(*args, **kwargs)

        return wrapper

    for name, fn in saved.items():
        setattr(dist, name, spy(name, fn))
    try:
        yield calls
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


_COLLECTIVE_BROKE = (
    "Connection closed by peer",
    "doesn't match expected size",
    "Connection reset by peer",
    "Broken pipe",
)


def raised(exc: BaseException) -> tuple[str, bool]:
    """(the last line of what a rank raised, whether it broke inside a collective: gloo's
    words when some ranks made a collective the others did not)."""
    text = str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.split(":")[0].endswith(("Error", "Exception"))]
    last = errors[-1] if errors else (lines[-1] if lines else type(exc).__name__)
    return last, any(words in text for words in _COLLECTIVE_BROKE)
