"""planner checker: exercise 1: the bytes one rank sends per step, before running it."""

from __future__ import annotations

from collections.abc import Callable

from ... import comm
from ...course.check import fail, passed, run_on_world
from .. import predict
from ..plan import plan
from ..spec import Layout, ModelSpec
from ._shared import _and, _number, _same

BUCKET_MB = 0.02  # lesson 02's tour buckets: the course GPT spreads over several
BYTES_CASES = tuple((world, zero) for world in (2, 3, 4) for zero in (0, 1, 2, 3))
RUN_WORLD = 3  # the real run: ZeRO-2 on 3 ranks pads every bucket


def _course_gpt() -> ModelSpec:
    from ...data_parallel.fixture import build

    return ModelSpec.of(build("gpt").model)


def _layout(world: int, zero: int) -> Layout:
    return Layout(dp=world, zero=zero, bucket_cap_mb=BUCKET_MB, global_batch=12)


def _numels(spec: ModelSpec, layout: Layout) -> list[int]:
    """What the learner is given: bucket sizes (stages 0-2) or FSDP units, root last."""
    return spec.fsdp_units() if layout.zero == 3 else predict.zero_buckets(spec, layout)


def _variant(numels: list[int], n: int, zero: int, pad=True, gathers=None) -> float:
    """Bytes per step under a (possibly wrong) reading of the rule: `pad` each piece to a
    multiple of n; `gathers`: all-gathers of the pieces (ZeRO: 1; FSDP: "fsdp" = every unit
    in forward and each non-root unit in backward, "once", "twice")."""

    def size(e: int) -> int:
        return 4 * (-(-e // n) * n if pad else e)

    if zero == 0:
        return sum(comm.ring_bytes("all_reduce", size(e), n) for e in numels)
    sizes = [size(e) for e in numels]
    if zero in (1, 2):
        gathered = sum(sizes) * (1 if gathers is None else gathers)
    else:
        gathered = {"fsdp": 2 * sum(sizes) - sizes[-1], "once": sum(sizes),
                    "twice": 2 * sum(sizes)}[gathers or "fsdp"]  # fmt: skip
    return comm.ring_bytes("reduce_scatter", sum(sizes), n) + comm.ring_bytes(
        "all_gather", gathered, n
    )


def _diagnose(got: float, right: float, numels: list[int], n: int, zero: int) -> str:
    say = f"you said {got:,.0f} bytes, the planner {right:,.0f}"
    if zero in (1, 2, 3) and _same(got, _variant(numels, n, zero, pad=False)):
        what = "bucket" if zero < 3 else "unit"
        return (
            f"each {what} is padded to a multiple of N = {n} before it is sharded (every rank "
            f"owns an equal chunk, ceil(numel/N) elements), and the collectives move the padded "
            f"size: pad each {what}, then apply the ring's (N-1)/N. {say}."
        )
    if zero == 0 and _same(got, _variant(numels, n, 0, pad=True)):
        return (
            "DDP all-reduces each bucket as it is: nothing is sharded, so nothing is padded. "
            f"{say}."
        )
    if zero in (1, 2) and _same(got, _variant(numels, n, zero, gathers=0)):
        return (
            "the reduce-scatter is only half of a ZeRO step: after each rank steps its chunk, "
            "an all-gather puts the updated parameters back on every rank, (N-1)/N of the "
            f"padded flat again. ZeRO-1/2 send what DDP sends, 2(N-1)/N·4Ψ. {say}."
        )
    if zero in (1, 2) and _same(got, _variant(numels, n, 3, gathers="twice")):
        return (
            "ZeRO-1/2 keep the whole parameters on every rank: nothing is gathered in forward "
            "or backward, one all-gather after the step. Gathering for forward and backward "
            f"is FSDP's (ZeRO-3's) 3(N-1)/N. {say}."
        )
    if zero == 3 and _same(got, _variant(numels, n, 3, gathers="once")):
        return (
            "FSDP frees each unit's gathered parameters after its forward (reshard after "
            "forward) and all-gathers them again for its backward: two all-gathers per unit "
            f"but the root, plus the reduce-scatter, 3(N-1)/N·4Ψ. {say}."
        )
    if zero == 3 and _same(got, _variant(numels, n, 3, gathers="twice")):
        return (
            "the root unit (the last: embeddings, tied head, final norm) is not resharded "
            "after forward: the backward starts with it, so its parameters are still there. "
            f"Every unit is gathered in forward, every unit but the root in backward. {say}."
        )
    if n > 1 and _same(got, right * n / (n - 1)):
        return (
            f"a ring collective sends (N-1)/N of the message from each rank, not all of it: "
            f"with N = {n}, {n - 1}/{n} of what you counted (comm.ring_bytes). {say}."
        )
    if _same(got, right / 4):
        return f"that is in elements: float32 has 4 bytes per element. {say}."
    return f"{say} (numels={numels}, world={n}, zero={zero})."


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


def check_bytes_per_step(bytes_per_step: Callable) -> None:
    """`bytes_per_step(numels, world, zero)` against the planner, then against a run."""
    spec = _course_gpt()
    for n, zero in BYTES_CASES:
        layout = _layout(n, zero)
        numels = _numels(spec, layout)
        got = _number(bytes_per_step(list(numels), n, zero))
        if got is None:
            fail(f"bytes_per_step({numels}, {n}, {zero}) did not return a number.")
        right = plan(spec, layout).bytes_sent
        if not _same(got, right):
            fail(f"world {n}, zero={zero}: {_diagnose(got, right, numels, n, zero)}")
    numels = _numels(spec, _layout(RUN_WORLD, 2))
    measured = run_on_world(_zero2_run_rank, RUN_WORLD, BUCKET_MB, timeout_s=120)[0]
    predicted = _number(bytes_per_step(list(numels), RUN_WORLD, 2))
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
