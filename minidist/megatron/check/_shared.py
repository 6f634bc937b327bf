"""Helpers the megatron checkers share."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch.distributed as dist

# torch.distributed's collectives a learner might call instead of minidist.comm's
_SPIED = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "reduce",
    "all_to_all_single",
    "send",
    "recv",
)


def _and(items) -> str:
    names = [str(i) for i in items]
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]


class _Tracked:
    """An async work that remembers whether anyone waited for it."""

    def __init__(self, work):
        self.work, self.waited = work, False

    def wait(self, *args, **kwargs):
        self.waited = True
        return self.work.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.work, name)


class Calls(list):
    """The collectives' names, and the async works they returned (`unwaited()`)."""

    def __init__(self):
        super().__init__()
        self.works: list[_Tracked] = []

    def unwaited(self) -> int:
        """How many async works nobody waited for; waits for them now (so that none is
        still running when the checker reads the tensors or starts the next answer)."""
        pending = [w for w in self.works if not w.waited]
        for w in pending:
            w.work.wait()
        return len(pending)


@contextmanager
def torch_collectives() -> Iterator[Calls]:
    """The names of every torch.distributed collective called inside, minidist.comm's own
    calls included (each comm collective makes exactly one): fewer ledger records than
    names means the learner called torch.distributed directly, invisible to the ledger.
    Async works come back wrapped, so that `calls.unwaited()` can tell which were never
    waited for."""
    calls = Calls()
    saved = {name: getattr(dist, name) for name in _SPIED}

    def spy(name, fn):
        def wrapper(*args, **kwargs):
            calls.append(name)
            work = fn(*args, **kwargs)
            if kwargs.get("async_op") and work is not None:
                work = _Tracked(work)
                calls.works.append(work)
            return work

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
