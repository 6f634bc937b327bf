"""A learner's crash, hang or endless loop turned into a checker message, never a traceback.

A checker runs the learner's code on a world (`check.run_on_world`) or in this process
(`call_learner`). Whatever that code raises reaches the learner as a `LearnerFailed`: what
was raised, where in *their* code (the deepest frame outside minidist, torch and Python's
library: a notebook cell or the learner's own file), and the likely cause in the exercise's
terms, from the checker's `hints`. `hints` maps a regular expression (searched in the
exception's type, message and the failing line) to the likely cause, or is a function of a
`Failure` returning one (or None).

A rank that fails inside a collective (gloo's "Connection closed by peer", "Received data
size doesn't match expected size", a rank that left while its peers still waited) gets
`COLLECTIVE_HINT` and the rank that failed first; a world still running at its timeout gets
the same hint, or the learner's loop that never ended is named as such.
"""

from __future__ import annotations

import re
import signal
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..runtime import RankFailedError

COLLECTIVE_HINT = (
    "every rank must make the same collectives, in the same order, with the same sizes "
    "(a collective inside an `if` that holds on some ranks only, a different loop count, or "
    "a buffer of another size on one rank ends like this)"
)
IN_PROCESS_TIMEOUT_S = 5.0
_COLLECTIVE_PATTERNS = (
    r"Connection (closed|reset) by peer",
    r"doesn't match (the )?expected size",
    r"Received data size",
    r"DistBackendError",
    r"gloo",
    r"Broken pipe",
    r"Timed out waiting",
)
_LIBRARY = (str(Path(__file__).resolve().parents[1]), "site-packages", "/lib/python3", "<frozen")
# What commonly goes wrong, whatever the exercise (a checker's own hints come first).
GENERIC_HINTS: dict[str, str] = {
    r"shares memory with the (input|output)": "one collective's input and output overlap: a "
    "view of the buffer it writes (a slice, .detach() or .data of it) anywhere but this "
    "rank's own chunk is overwritten while it is still being sent or reduced, so the result "
    "depends on the backend (gloo happens to copy the input first; for NCCL it is undefined). "
    "The in-place form is exactly this rank's own chunk r of the larger buffer (all-gather: "
    "input = output[r·n : (r+1)·n]; reduce-scatter: output = input[r·n : (r+1)·n]); anything "
    "else needs a copy (.clone()) or a buffer of its own",
    r"view size is not compatible": ".view() needs memory laid out in order (a transposed or "
    "sliced tensor is not): use .reshape(), which copies only when it must",
    r"'NoneType' object": "a value was None where your code expected a tensor: a parameter "
    "without a gradient (frozen, or not used in the loss) has p.grad None; skip it",
    r"^IndexError|out of (range|bounds)": "an index one past the end (an off-by-one: count "
    "from 0, the last of N items is N-1, and range(a, b) stops before b)",
    r"must match the size|size mismatch|shape .* is invalid|mat1 and mat2": "two tensors of "
    "different sizes met: a chunk or buffer of the wrong length (elements vs bytes, padded vs "
    "unpadded, whole vs 1/N)",
    r"expected scalar type|dtype": "tensors of two dtypes met: keep the dtype you were given",
    r"leaf Variable that requires grad": "an in-place write into a parameter while autograd "
    "records: do it under torch.no_grad()",
}


class CheckFailed(AssertionError):
    """The learner's code ran but gave a wrong answer; the message says what to look at."""


class LearnerFailed(CheckFailed, RankFailedError):
    """The learner's code raised, hung or crashed a rank; the message explains it.

    A `RankFailedError` too (with `.rank`), so checkers that catch one still see it, and its
    message quotes the exception's own last line, which they may search.
    """

    def __init__(self, rank: int | None, message: str):
        AssertionError.__init__(self, message)
        self.rank = rank


@dataclass
class Failure:
    """What a traceback says: the exception and the learner's frame it came from."""

    kind: str  # the exception's type name ("IndexError"), or "" when the rank just died
    message: str  # its message (or how the process died)
    where: str  # "`fn` (file, line N): <source line>", or "" when no learner frame
    source: str  # the learner's failing line ("" when unknown)

    @property
    def text(self) -> str:
        return f"{self.kind}: {self.message}\n{self.source}"

    def said(self) -> str:
        message = re.sub(r"\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", self.message)
        message = re.sub(r"\.? ?This is typically caused.*", "", message, flags=re.S)
        what = f"{self.kind}: {message}" if self.kind else message
        return what if len(what) < 300 else what[:300] + " ..."


def parse_traceback(text: str) -> Failure:
    """The last exception in a formatted traceback and the deepest learner frame under it."""
    block = re.split(r"\n(?:During handling|The above exception)[^\n]*\n", text)[-1]
    frames = re.findall(r'  File "([^"]+)", line (\d+), in (\S+)\n(?:    (.*)\n)?', block)
    mine = [f for f in frames if not any(lib in f[0] for lib in _LIBRARY)]
    where, source = "", ""
    if mine:
        path, line, fn, source = mine[-1]
        cell = "a notebook cell" if "ipykernel" in path or path.startswith("<") else path
        where = f"`{fn}` ({cell}, line {line})" + (f": `{source.strip()}`" if source else "")
        source = source.strip()
    frame_list = list(re.finditer(r'  File "[^"]+", line \d+, in \S+\n', block))
    rest = block[frame_list[-1].end() :] if frame_list else block
    lines = rest.split("\n")
    first = next((i for i, ln in enumerate(lines) if ln and not ln.startswith(" ")), len(lines))
    last = "\n".join(lines[first:]).strip()
    match = re.match(r"^([A-Za-z_][\w.]*)(?::\s?(.*))?$", last, re.S)
    if not frames or not match:  # a rank that died: how, and what native code said last
        lines = [ln.strip() for ln in text.strip().splitlines()] or [text]
        said = next((ln for ln in lines if ln.startswith("what():")), lines[-1])
        detail = said.removeprefix("what():").strip() if len(lines) > 1 else ""
        how = lines[0].split("; the last lines")[0]
        return Failure("", f"{how} ({detail})" if detail else how, "", "")
    kind = match.group(1).rsplit(".", 1)[-1]
    return Failure(kind, (match.group(2) or "").strip(), where, source)


# A collective that refuses this rank's own arguments before sending anything: the cause is
# in this rank's buffers, not in a peer (what gloo says, and what it means).
LOCAL_COLLECTIVE_HINTS: dict[str, str] = {
    r"outputShape\[0\] \* worldSize == inputShape\[0\] \((\d+) vs\. (\d+)\)": "this rank's "
    "buffers do not fit the collective: output elements × group size ({0}) != input elements "
    "({1}). comm.reduce_scatter and comm.all_gather take flat (1-D) tensors, the whole one "
    "exactly t times the part",
    r"dtype\(\) == .*\((\w+) vs\. (\w+)\)": "the output buffer and the input have different "
    "dtypes ({0} vs {1}): make the buffer with dtype=x.dtype",
    r"invalid tensor size at index \d+ \(expected \(([^)]*)\), got \(([^)]*)\)\)": "the "
    "buffers' shapes do not fit: the collective expected ({0}) and got ({1}); flatten both "
    "(.reshape(-1)) so that the whole holds t times the part's elements",
}


def local_collective_cause(text: str) -> str | None:
    """What a collective's refusal of its own arguments means, or None."""
    for pattern, cause in LOCAL_COLLECTIVE_HINTS.items():
        m = re.search(pattern, text)
        if m:
            return cause.format(*m.groups())
    return None


Hints = Mapping[str, str] | Callable[[Failure], str | None] | None


def likely_cause(failure: Failure, hints: Hints = None, generic: bool = True) -> str | None:
    """The checker's hint that fits `failure` (first match wins), else a generic one."""
    if callable(hints):
        found = hints(failure)
        if found:
            return found
        hints = None
    for table in (hints or {}, GENERIC_HINTS if generic else {}):
        for pattern, cause in table.items():
            if re.search(pattern, failure.text, re.M):
                return cause
    return None


def in_collective(text: str) -> bool:
    return any(re.search(p, text, re.I) for p in _COLLECTIVE_PATTERNS)


def explain_rank_failure(
    exc: RankFailedError, world_size: int | None, hints: Hints = None, hang_hint: str = ""
) -> LearnerFailed:
    """The checker message for a rank that raised or died on a world."""
    text = str(exc).split("\n", 1)[-1]
    # The runtime's notes on the other ranks follow the first failure's traceback.
    after = re.search(r"\(ranks (\[[\d, ]*\]) failed after it\)", text)
    lost = re.search(r"\(ranks (\[[\d, ]*\]) lost their peer[^)]*\)", text)
    notes = [m.start() for m in (after, lost) if m]
    text = text[: min(notes)] if notes else text
    failure = parse_traceback(text)
    world = f"on a world of {world_size}, " if world_size else ""
    others = f"; ranks {after.group(1)} failed after it" if after else ""
    others += f"; ranks {lost.group(1)} lost their peer" if lost else ""
    said = failure.text if failure.kind else text
    local = local_collective_cause(said)
    if local and not likely_cause(failure, hints, generic=False):
        where = f" in {failure.where}" if failure.where else ""
        message = (
            f"{world}rank {exc.rank}: a collective{where} refused this rank's own arguments "
            f"before sending anything ({failure.said()}): {local}{others}."
        )
        return LearnerFailed(exc.rank, message)
    if in_collective(said) and not likely_cause(failure, hints, generic=False):
        where = f" in {failure.where}" if failure.where else ""
        message = (
            f"{world}rank {exc.rank} failed first, inside a collective{where} "
            f"({failure.said()}: a peer had left it or sent another size){others}: "
            f"{COLLECTIVE_HINT}. {hang_hint}"
        )
        return LearnerFailed(exc.rank, message.rstrip())
    return LearnerFailed(exc.rank, _message(f"{world}rank {exc.rank}", failure, hints, others))


def _message(who: str, failure: Failure, hints: Hints, others: str = "") -> str:
    if not failure.kind:
        return f"{who} died: {failure.message}{others}. " + COLLECTIVE_HINT + "."
    where = f" in {failure.where}" if failure.where else ""
    cause = likely_cause(failure, hints)
    because = f" Likely cause: {cause}." if cause else ""
    return f"{who}: your code raised {failure.said()}{where}{others}.{because}"


class _LearnerTimeout(BaseException):
    """Raised in this process when the learner's code outlives its time (not an Exception:
    a learner's `except Exception` must not swallow it). `wall_s`: the clock's limit, if
    that is the one that ran out (None: the CPU time's)."""

    def __init__(self, wall_s: float | None = None):
        super().__init__()
        self.wall_s = wall_s


# Behind the CPU-time limit, a wall-clock one for code that waits without computing (a
# lock, a queue): this many times the CPU limit, at least WALL_MIN_S.
WALL_FACTOR = 10
WALL_MIN_S = 60.0


@contextmanager
def time_limit(seconds: float):
    """Interrupt the block after `seconds` of this process's CPU time (so that a right answer
    is not cut short on a loaded machine: a loop that never ends burns CPU, a busy machine
    only delays it), or after WALL_FACTOR times as long by the clock, at least WALL_MIN_S.
    Main thread only; elsewhere it runs unbounded. An outer timer (pytest-timeout's, say)
    is re-armed afterwards with the time it had left."""
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return

    # the clocks read before the outer timers: the time between the reads (a preemption,
    # 1.3 ms under make test's load) then counts as spent, and the outer timer is re-armed
    # no later than it would have fired (read after, it came back that much later)
    start = {signal.ITIMER_REAL: time.monotonic(), signal.ITIMER_PROF: time.process_time()}
    outer = {t: signal.getitimer(t) for t in (signal.ITIMER_REAL, signal.ITIMER_PROF)}
    wall = max(WALL_FACTOR * seconds, WALL_MIN_S)
    if outer[signal.ITIMER_REAL][0] > 0:  # never later than an outer timer would fire
        wall = min(wall, outer[signal.ITIMER_REAL][0])

    def _stop(signum, frame):
        raise _LearnerTimeout(wall if signum == signal.SIGALRM else None)

    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGALRM, signal.SIGPROF)}
    signal.setitimer(signal.ITIMER_PROF, seconds)
    signal.setitimer(signal.ITIMER_REAL, wall)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.setitimer(signal.ITIMER_PROF, 0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        now = {signal.ITIMER_REAL: time.monotonic(), signal.ITIMER_PROF: time.process_time()}
        for timer, (delay, interval) in outer.items():
            if delay > 0:
                left = max(delay - (now[timer] - start[timer]), 1e-3)
                signal.setitimer(timer, left, interval)


def bounded(seconds: float, diagnose: Callable[..., str | None], *args: Any) -> str | None:
    """`diagnose(*args)` (a checker's own search: replaying a schedule, probing a table),
    stopped after `seconds`: then a message saying what could not be finished, so that a
    check always answers in seconds, whatever the learner's answer makes the search do."""
    try:
        with time_limit(seconds):
            return diagnose(*args)
    except _LearnerTimeout as stop:
        name = getattr(diagnose, "__name__", "the diagnosis")
        return (
            f"the answer is wrong, and the checker's search for why ({name}) did not finish "
            f"in {limit_words(seconds, stop)}: your code's results send it very far (a step "
            "or an index that never comes back to where it should, or a loop that does not "
            "end)."
        )


def limit_words(seconds: float, stop: _LearnerTimeout) -> str:
    """Which of `time_limit(seconds)`'s limits stopped the code, in words."""
    if stop.wall_s is not None:
        return f"{round(stop.wall_s, 1):g} s by the clock"
    return f"{seconds:g} s of CPU time"


def call_learner(
    fn: Callable,
    *args: Any,
    hints: Hints = None,
    what: str = "",
    timeout_s: float = IN_PROCESS_TIMEOUT_S,
    **kwargs: Any,
) -> Any:
    """Call the learner's `fn` in this process: an exception or a loop that never ends
    becomes a `LearnerFailed` naming it (`what` says for which input, e.g. "on rank 2 of 4")."""
    who = what or f"calling {getattr(fn, '__name__', 'your function')}"
    try:
        with time_limit(timeout_s):
            return fn(*args, **kwargs)
    except NotImplementedError:
        raise
    except _LearnerTimeout as stop:
        if stop.wall_s is not None:
            why = "waiting for something that never comes (a lock, a queue, a sleep)"
        else:
            why = "a loop that never ends, or one far too long"
        raise LearnerFailed(
            None,
            f"{who}: your code was still running after {limit_words(timeout_s, stop)} (a "
            f"correct answer takes milliseconds): {why}.",
        ) from None
    except Exception as exc:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        raise LearnerFailed(None, _message(who, parse_traceback(text), hints)) from None
