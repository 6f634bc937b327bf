"""planner checker: exercise 1: the bytes one rank sends per step, before running it.

A wrong answer is diagnosed by readings of the rule: each reading changes one or more of its
parts (how pieces are padded, the element size, the ring's share, which collective reduces
the gradients, how many times parameters are gathered). The reading that reproduces the
learner's number with the fewest changes names the mistakes; no reading: the message says
which collective's bytes the planner counts and how far the answer is from their sum.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from ... import comm
from ...course.check import fail, passed, run_on_world
from .. import predict
from ..plan import plan
from ..spec import Layout, ModelSpec
from ._shared import _and, _number, _same, call_learner

BUCKET_MB = 0.02  # lesson 02's tour buckets: the course GPT spreads over several
BYTES_CASES = tuple((world, zero) for world in (2, 3, 4) for zero in (0, 1, 2, 3))
RUN_WORLD = 3  # the real run: ZeRO-2 on 3 ranks pads every bucket
HINTS = {
    ZeroDivisionError: "A division by zero: the ring's share is (N-1)/N with N = world "
    "(world >= 2 here), and padding is ceil(numel / N) · N.",
    IndexError: "An index out of range: numels has one entry per bucket or unit (the root "
    "unit is numels[-1]); loop over the list rather than over range(world).",
    TypeError: "A type error: numels is a list of ints, world and zero are ints, and "
    "comm.ring_bytes(op, nbytes, world) takes an op name, a byte count and the world size.",
    KeyError: "comm.ring_bytes(op, nbytes, world) knows the ops 'all_reduce', "
    "'reduce_scatter' and 'all_gather' (underscores, lower case).",
}


def _course_gpt() -> ModelSpec:
    from ...data_parallel.fixture import build

    return ModelSpec.of(build("gpt").model)


def _layout(world: int, zero: int) -> Layout:
    return Layout(dp=world, zero=zero, bucket_cap_mb=BUCKET_MB, global_batch=12)


def _numels(spec: ModelSpec, layout: Layout) -> list[int]:
    """What the learner is given: bucket sizes (stages 0-2) or FSDP units, root last."""
    return spec.fsdp_units() if layout.zero == 3 else predict.zero_buckets(spec, layout)


# -- readings of the rule: each part, its right value first, then the usual mistakes ------------

PADS = ("right", "none", "each", "total", "one_more")  # right: DDP none, ZeRO/FSDP each
ELEMENT = (4, 1, 2, 8, 32)  # bytes per element: 1 = elements, 2 = a 16-bit type, 32 = bits
SHARES = ("ring", "whole", "all_reduce_once")  # (N-1)/N; the whole message; all-reduce 1x
REDUCES = ("reduce_scatter", "all_reduce", "none")  # ZeRO / FSDP gradients
GATHERS = ("right", "none", "once", "twice", "root_first", "zero3")  # parameters gathered

WHY = {
    ("pad", "none"): "each {piece} is padded to a multiple of N = {n} before it is sharded "
    "(every rank owns an equal chunk, ceil(numel/N) elements), and the collectives move the "
    "padded size: pad each {piece}, then apply the ring's (N-1)/N",
    ("pad", "each"): "DDP all-reduces each bucket as it is: nothing is sharded, so nothing is "
    "padded",
    ("pad", "total"): "you padded the total: padding is per {piece}, each padded on its own to "
    "a multiple of N = {n} (each is a separate flat tensor sharded N ways), so the pads add up",
    ("pad", "one_more"): "a {piece} whose size already divides by N = {n} is not padded: "
    "ceil(numel/N)·N, not (numel//N + 1)·N",
    ("element", 1): "that is in elements: float32 has 4 bytes per element",
    ("element", 2): "2 bytes per element is a 16-bit type; this exercise's gradients and "
    "parameters are float32, 4 bytes",
    ("element", 8): "8 bytes per element is float64; this exercise's are float32, 4 bytes",
    ("element", 32): "that is in bits: float32 has 4 bytes per element, not 32",
    ("share", "whole"): "a ring collective sends (N-1)/N of the message from each rank, not "
    "all of it (an all-reduce 2(N-1)/N): with N = {n}, {m}/{n} of what you counted "
    "(comm.ring_bytes)",
    ("share", "all_reduce_once"): "an all-reduce sends 2(N-1)/N of the message on a ring: a "
    "reduce-scatter, then an all-gather; you counted it as one (N-1)/N pass",
    ("reduce", "all_reduce"): "ZeRO and FSDP reduce-scatter the gradients: each rank needs "
    "only the sum of its own chunk, (N-1)/N of the padded flat, not the all-reduce's 2(N-1)/N",
    ("reduce", "none"): "the gradients still have to be summed over the ranks: one "
    "reduce-scatter of every padded {piece}, (N-1)/N of it",
    ("gather", "none"): "the reduce-scatter is only half of a ZeRO step: after each rank steps "
    "its chunk, an all-gather puts the updated parameters back on every rank, (N-1)/N of the "
    "padded flat again. ZeRO-1/2 send what DDP sends, 2(N-1)/N·4Ψ",
    ("gather", "zero3"): "ZeRO-1/2 keep the whole parameters on every rank: nothing is "
    "gathered in forward or backward, one all-gather after the step. Gathering for forward "
    "and backward is FSDP's (ZeRO-3's) 3(N-1)/N",
    ("gather", "once"): "FSDP frees each unit's gathered parameters after its forward "
    "(reshard after forward) and all-gathers them again for its backward: two all-gathers "
    "per unit but the root, plus the reduce-scatter, 3(N-1)/N·4Ψ",
    ("gather", "twice"): "the root unit (the last: embeddings, tied head, final norm) is not "
    "resharded after forward: the backward starts with it, so its parameters are still "
    "there. Every unit is gathered in forward, every unit but the root in backward",
    ("gather", "root_first"): "the root unit is the last in numels (embeddings, tied head, "
    "final norm), not the first: it is the one gathered once",
    ("gather", "ddp"): "DDP gathers nothing: every rank holds and steps the whole model, one "
    "all-reduce of each bucket is all it sends",
}


def _reading(
    numels: list[int],
    n: int,
    zero: int,
    pad="each",
    element=4,
    share="ring",
    reduce="reduce_scatter",
    gather="right",
) -> float:
    """Bytes per step under one reading of the rule (the right one with the defaults)."""

    if pad == "right":
        pad = "none" if zero == 0 else "each"

    def size(e: int) -> int:
        if pad == "each" or (pad == "total" and len(numels) == 1):
            return -(-e // n) * n
        return (e // n + 1) * n if pad == "one_more" else e

    sizes = [element * size(e) for e in numels]
    total = sum(sizes)
    if pad == "total":
        total = element * -(-sum(numels) // n) * n

    def sent(op: str, nbytes: float) -> float:
        if share == "whole":
            return nbytes * (2 if op == "all_reduce" else 1)
        if share == "all_reduce_once" and op == "all_reduce":
            return comm.ring_bytes("reduce_scatter", nbytes, n)
        return comm.ring_bytes(op, nbytes, n)

    if zero == 0:
        grads = sum(sent("all_reduce", s) for s in sizes) if pad != "total" else 0.0
        if pad == "total":
            grads = sent("all_reduce", total)
        return grads + (sent("all_gather", total) if gather == "ddp" else 0.0)
    gather = "right" if gather == "ddp" else gather
    reduced = {
        "reduce_scatter": sent("reduce_scatter", total),
        "none": 0.0,
        "all_reduce": sent("all_reduce", total),
    }[reduce]
    root, first = sizes[-1], sizes[0]
    if pad == "total":  # the total padded, the root's own padded size subtracted
        root, first = (element * -(-e // n) * n for e in (numels[-1], numels[0]))
    fsdp = 2 * total - root
    gathered = {
        "right": total if zero < 3 else fsdp,
        "none": 0.0,
        "once": total,
        "twice": 2 * total,
        "root_first": 2 * total - first,
        "zero3": fsdp,
    }[gather]
    return reduced + sent("all_gather", gathered)


def _readings(zero: int):
    """(changes from the right reading, kwargs) in order of how many parts they change."""
    gathers = ("right", "ddp") if zero == 0 else GATHERS[:-1] if zero == 3 else GATHERS
    right = _right(zero)
    reduces = ("reduce_scatter",) if zero == 0 else REDUCES
    out = []
    for pad, el, share, red, gather in itertools.product(PADS, ELEMENT, SHARES, reduces, gathers):
        if gather in ("once", "twice", "root_first") and zero < 3:
            continue
        kw = dict(pad=pad, element=el, share=share, reduce=red, gather=gather)
        changed = [(k, v) for k, v in kw.items() if v != right[k]]
        if changed and len(changed) <= 2:
            out.append((changed, kw))
    return sorted(out, key=lambda c: len(c[0]))


def _explain(changed, n: int, zero: int) -> str:
    piece = "unit" if zero == 3 else "bucket"
    return "; and ".join(WHY[c].format(n=n, m=n - 1, piece=piece) for c in changed)


def _right(zero: int) -> dict:
    return dict(pad="right", element=4, share="ring", reduce="reduce_scatter", gather="right")


def _changes(kw: dict, answers: dict) -> list:
    """The parts of reading `kw` that change the bytes of a case the learner got wrong."""
    out = []
    for (w, z), (numels, got, right) in answers.items():
        if _same(got, right):
            continue
        value = _reading(numels, w, z, **kw)
        if not _same(value, got):
            continue
        for part, v in kw.items():
            if v != _right(z)[part] and (part, v) not in out:
                if not _same(value, _reading(numels, w, z, **{**kw, part: _right(z)[part]})):
                    out.append((part, v))
    return out


def _diagnose(answers: dict, n: int, zero: int) -> str:
    """Name the mistakes behind the first wrong case (`n`, `zero`): of the readings that
    reproduce it, the one that reproduces the learner's answers on the most cases (one world
    can hide a difference: at N = 2, (N-1)/N = 1/2), then the fewest changes; every part it
    changes that matters in a case the learner got wrong is named."""
    numels, got, right = answers[n, zero]
    say = f"you said {got:,.0f} bytes, the planner {right:,.0f}"
    best, score = None, -1
    for _, kw in _readings(zero):
        if not _same(got, _reading(numels, n, zero, **kw)):
            continue
        agree = sum(
            _same(a, _reading(nums, w, z, **kw)) for (w, z), (nums, a, _) in answers.items()
        )
        if agree > score:
            best, score = kw, agree
    if best is not None:
        return f"{_explain(_changes(best, answers), n, zero)}. {say}."
    parts = _parts(numels, n, zero)
    listed = ", ".join(f"{op} {v:,.0f}" for op, v in parts.items())
    return (
        f"{say}, {got / right:.4f}x ({got - right:+,.0f} bytes); the planner counts {listed} "
        f"(numels={numels}, world={n}, zero={zero})."
    )


def _parts(numels: list[int], n: int, zero: int) -> dict[str, float]:
    """The right answer by collective."""
    if zero == 0:
        return {"all-reduce": _reading(numels, n, 0, pad="none")}
    padded = sum(4 * -(-e // n) * n for e in numels)
    reduced = comm.ring_bytes("reduce_scatter", padded, n)
    return {"reduce-scatter": reduced, "all-gather": _reading(numels, n, zero) - reduced}


def _zero2_run_rank(bucket_cap_mb: float, steps: int = 2) -> float:
    """Lesson 02's ZeRO-2 of the course GPT on this rank, on its slice of a global batch of
    12 sequences: bytes sent per training step (the ledger)."""
    import torch.distributed as dist

    from ...data import shard_batch
    from ...data_parallel.fixture import build
    from ...zero import ZeroDataParallel
    from ...zero.fixture import ADAM

    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build("gpt", steps=steps, global_batch=12)
    zero = ZeroDataParallel(model, stage=2, bucket_cap_mb=bucket_cap_mb, **ADAM)
    with comm.record() as ledger:
        for batch in batches:
            zero.optimizer.zero_grad()
            x, y = shard_batch(batch, rank, world)
            loss_fn(zero(x), y).backward()
            zero.finish_gradient_sync()
            zero.optimizer.step()
    return sum(r.ring_bytes for r in ledger.records) / steps


def _answer(fn: Callable, numels: list[int], n: int, zero: int) -> float:
    call = f"bytes_per_step({numels}, {n}, {zero})"
    out = call_learner(fn, call, HINTS, list(numels), n, zero)
    got = _number(out)
    if got is None:
        fail(f"{call} did not return a number (it returned {out!r}); return the bytes.")
    return got


def check_bytes_per_step(bytes_per_step: Callable) -> None:
    """`bytes_per_step(numels, world, zero)` against the planner, then against a run."""
    spec = _course_gpt()
    answers = {}  # (world, zero) -> (numels, the learner's bytes, the planner's)
    for n, zero in BYTES_CASES:
        layout = _layout(n, zero)
        numels = _numels(spec, layout)
        got = _answer(bytes_per_step, numels, n, zero)
        answers[n, zero] = (numels, got, plan(spec, layout).bytes_sent)
    for (n, zero), (_, got, right) in answers.items():
        if not _same(got, right):
            fail(f"world {n}, zero={zero}: {_diagnose(answers, n, zero)}")
    numels = _numels(spec, _layout(RUN_WORLD, 2))
    measured = run_on_world(_zero2_run_rank, RUN_WORLD, BUCKET_MB, timeout_s=120)[0]
    predicted = _answer(bytes_per_step, numels, RUN_WORLD, 2)
    if not _same(predicted, measured):
        fail(
            f"the planner agrees with you, but a ZeRO-2 run on {RUN_WORLD} ranks sent "
            f"{measured:,.0f} bytes per step, not {predicted:,.0f}: the planner and the run "
            "disagree, a bug in minidist (please report it)."
        )
    passed(
        f"bytes_per_step equals the planner for ZeRO 0-3 on worlds of {_and((2, 3, 4))}; and a "
        f"real ZeRO-2 run on {RUN_WORLD} ranks sent {measured:,.0f} bytes per step, as you "
        "predicted"
    )
