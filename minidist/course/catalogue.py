"""Catalogues of likely mistakes: many wrong answers checked with few world launches.

A catalogue lists, for one exercise, wrong answers a learner is likely to write and the
words the checker's message must contain for each (`Mistake`). `catalogue_messages(check,
mistakes)` calls the checker once per answer, as a learner would, but the worlds the checker
starts are shared: the first time the checker asks for a world (a rank function, a world
size, its other arguments), every answer of the catalogue runs on that one world in turn,
and the later answers read their results from it. A world of 4 ranks costs one launch for
the whole catalogue instead of one per answer.

Answers whose ranks diverge (a collective on some ranks only, a hang, a crash on one rank)
would stop a shared world: mark them `alone=True` to run them in worlds of their own. An
answer not so marked that diverges anyway is caught (after every answer the ranks confirm
that they all finished it) and the batch falls back to one world per answer: slower, right.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from .. import comm
from ..runtime import RankFailedError, WorldTimeoutError, launch
from .failures import CheckFailed

_BATCH_S_PER_ANSWER = 2.0  # added to the checker's own limits per answer in a shared world


@dataclass(frozen=True)
class Mistake:
    """A wrong answer (the checker's arguments) and the regex its message must match."""

    name: str
    answer: tuple
    words: str
    alone: bool = False  # its ranks diverge: run it in worlds of its own


@dataclass
class _Batch:
    answers: list[tuple]
    current: int = 0
    cache: dict = field(default_factory=dict)


_batch: _Batch | None = None


def _answer_slots(args: tuple, answer: tuple) -> dict[int, int]:
    """{position in args: position in answer} for the arguments that are the answer's."""
    ids = {id(a): k for k, a in enumerate(answer)}
    return {i: ids[id(a)] for i, a in enumerate(args) if id(a) in ids}


def _each(fn: Callable, arg_lists: list[tuple]) -> list[tuple[str, Any]]:
    """On a rank: fn(*args) for every answer's args. After each answer the ranks exchange
    its index: a rank that is still inside another answer's collectives stops the batch."""
    out = []
    for j, args in enumerate(arg_lists):
        try:
            out.append(("ok", fn(*args)))
        except BaseException:
            out.append(("error", traceback.format_exc()))
        where: list = [None] * dist.get_world_size()
        comm.all_gather_object(where, j)
        if set(where) != {j}:
            raise RuntimeError("the answers' ranks diverged: the batch falls back")
    return out


def launch_shared(fn: Callable, world_size: int, args: tuple, limits: dict) -> list:
    """`launch(fn, world_size, *args, **limits)`, from a shared world while a catalogue runs
    (`limits`: launch's `timeout_s`, `cpu_s`, `idle_s`)."""
    batch = _batch
    slots = _answer_slots(args, batch.answers[batch.current]) if batch else {}
    if not slots:
        return launch(fn, world_size, *args, **limits)
    shape = tuple(("answer", slots[i]) if i in slots else repr(a) for i, a in enumerate(args))
    key = (fn, world_size, shape)
    if key not in batch.cache:
        arg_lists = [
            tuple(answer[slots[i]] if i in slots else a for i, a in enumerate(args))
            for answer in batch.answers
        ]
        more = _BATCH_S_PER_ANSWER * len(arg_lists)  # the idle limit stays: it is per moment
        shared = {k: v + more if k != "idle_s" else v for k, v in limits.items()}
        try:
            per_rank = launch(_each, world_size, fn, arg_lists, **shared)
            batch.cache[key] = [[rank[j] for rank in per_rank] for j in range(len(arg_lists))]
        except (RankFailedError, WorldTimeoutError):
            batch.cache[key] = None
    results = batch.cache[key]
    if results is None:
        return launch(fn, world_size, *args, **limits)
    outcomes = results[batch.current]
    failed = [r for r, (status, _) in enumerate(outcomes) if status == "error"]
    if failed:
        also = f"\n(ranks {failed[1:]} failed after it)" if failed[1:] else ""
        raise RankFailedError(failed[0], outcomes[failed[0]][1] + also)
    return [value for _, value in outcomes]


def message_of(check: Callable, answer: tuple) -> str | None:
    """The message `check(*answer)` fails with; None when it passes. An exception that is
    not a checker message comes back as "UNEXPLAINED <type>: ...", so a test shows it."""
    try:
        check(*answer)
    except CheckFailed as exc:
        return str(exc)
    except NotImplementedError as exc:
        return f"NotImplementedError: {exc}"
    except Exception as exc:
        return f"UNEXPLAINED {type(exc).__name__}: {exc}"
    return None


def catalogue_messages(check: Callable, mistakes: Sequence[Mistake]) -> dict[str, str | None]:
    """{mistake name: the message `check` gives its answer}, sharing world launches."""
    global _batch
    names = [m.name for m in mistakes]
    if len(set(names)) != len(names):
        raise ValueError(f"catalogue_messages: mistake names must be unique, got {names}")
    shared = [m for m in mistakes if not m.alone]
    out: dict[str, str | None] = {}
    _batch = _Batch([m.answer for m in shared])
    try:
        for j, m in enumerate(shared):
            _batch.current = j
            out[m.name] = message_of(check, m.answer)
    finally:
        _batch = None
    for m in mistakes:
        if m.alone:
            out[m.name] = message_of(check, m.answer)
    return out


def names_mistake(mistake: Mistake, message: str | None) -> str | None:
    """None when `message` names `mistake` (matches its words), else why not."""
    if message is None:
        return f"{mistake.name}: the checker passed this wrong answer"
    if message.startswith("UNEXPLAINED"):
        return f"{mistake.name}: a raw error instead of a message: {message}"
    if not re.search(mistake.words, message, re.S | re.I):
        return f"{mistake.name}: the message does not say {mistake.words!r}:\n{message}"
    return None
