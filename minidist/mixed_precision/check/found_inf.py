"""mixed_precision checker: exercise 2: every rank agrees on found-inf."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist

from ... import comm
from ...course.check import fail, passed, run_on_world
from ...data import shard_batch
from ...data_parallel.fixture import build
from ...fsdp.fixture import UNITS
from ...fsdp.fully_sharded import FullyShardedDataParallel
from .. import theory
from ._shared import INF, NAN, _and

AGREE_WORLDS = (2, 3, 4)
AGREE_STEPS = 7
# step -> (which ranks, which of their gradients, which element, the value put there); the
# MLP's FSDP gives each rank three flat gradients (44, 352 and 171 elements). Chosen so that
# every wrong test below answers another set of steps.
INJECT = {
    1: ("last", "last", "last", INF),
    3: ("first", "middle", "middle", NAN),
    4: ("all", "first", "first", -INF),
    6: ("middle", "first", "last", INF),
}
_PICK = {"first": lambda n: 0, "middle": lambda n: n // 2, "last": lambda n: n - 1}
AGREE_HANG_HINT = (
    "Every rank must make the same collective at every step, whether or not its own "
    "gradients hold an inf: call the all-reduce unconditionally."
)


def _injected_ranks(step: int, world: int) -> set[int]:
    which = INJECT.get(step, (None,))[0]
    return {
        "last": {world - 1},
        "first": {0},
        "middle": {world // 2},
        "all": set(range(world)),
        None: set(),
    }[which]


def _inject(grads: list[torch.Tensor], step: int) -> None:
    _, tensor, element, value = INJECT[step]
    g = grads[_PICK[tensor](len(grads))]
    g.view(-1)[_PICK[element](g.numel())] = value


def _described(step: int, world: int) -> str:
    _, tensor, element, value = INJECT[step]
    what = "a NaN" if math.isnan(value) else ("-inf" if value < 0 else "an inf")
    ranks = sorted(_injected_ranks(step, world))
    who = "every rank" if len(ranks) == world else _rank_list(ranks)
    return f"step {step}: {what} in the {tensor} gradient ({element} element) of {who}"


# wrong tests -> (the steps at which they say True, given the injection, what they did)
_TEST_MISTAKES = (
    (
        lambda tensor, value, everywhere: tensor == "first",
        "only grads[0] was tested: an overflow in any of this rank's gradients counts; "
        "combine the flags of every g in grads (torch.maximum, or any)",
    ),
    (
        lambda tensor, value, everywhere: tensor == "last",
        "only the last gradient's answer survived: the flag was overwritten in the loop "
        "(found = ... per g) instead of combined (torch.maximum(found, ...), or |=)",
    ),
    (
        lambda tensor, value, everywhere: not math.isnan(value),
        "torch.isinf misses NaN: test ~torch.isfinite(g), which is False for inf, -inf and NaN",
    ),
    (
        lambda tensor, value, everywhere: value != -INF,
        "-inf went unnoticed (a test against float('inf'), torch.isposinf or g.max()): "
        "test ~torch.isfinite(g)",
    ),
    (
        lambda tensor, value, everywhere: everywhere,
        "the flag was True only when *every* rank overflowed: all-reduce it with "
        "ReduceOp.MAX (or SUM and test > 0), not MIN or PRODUCT",
    ),
)


def _test_mistake(world: int, found: list) -> str | None:
    """The wrong test whose answers are `found` (one per step, agreed by every rank)."""
    said = {s for s, f in enumerate(found) if f}
    for predict, why in _TEST_MISTAKES:
        expect = {
            s
            for s, (ranks, tensor, _, value) in INJECT.items()
            if predict(tensor, value, ranks == "all")
        }
        if said == expect:
            missed = sorted(set(INJECT) - said)
            listed = "; ".join(_described(s, world) for s in missed)
            return f"on {world} ranks every rank returned False at {listed}: {why}."
    return None


def right_found_inf(grads: list[torch.Tensor]) -> bool:
    """The answer: a 0/1 flag per rank, all-reduced with MAX (what `DynamicLossScaler` does)."""
    found = torch.zeros((), device="cpu")
    for g in grads:
        found = torch.maximum(found, (~torch.isfinite(g)).any().float())
    comm.all_reduce(found, op=comm.ReduceOp.MAX)
    return bool(found)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


def _agree_run(fn: Callable) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build("mlp", steps=AGREE_STEPS, global_batch=12)
    fsdp = FullyShardedDataParallel(model, wrap=UNITS["mlp"])
    shards = fsdp.sharded_parameters()
    opt = torch.optim.Adam(shards, lr=1e-2)
    steps = []
    for step, batch in enumerate(batches):
        x, y = shard_batch(batch, rank, world)
        opt.zero_grad()
        loss_fn(fsdp(x), y).backward()
        grads = [p.grad for p in shards]
        if rank in _injected_ranks(step, world):
            _inject(grads, step)
        local = any(bool((~torch.isfinite(g)).any()) for g in grads)
        grad_bytes = sum(g.numel() * g.element_size() for g in grads)
        before = [g.clone() for g in grads]
        with comm.record() as ledger:
            found = fn(grads)
        kind = type(found).__name__
        try:
            found = bool(found)
        except (RuntimeError, TypeError, ValueError):
            found = None
        if found is False:
            for g in grads:  # a wrong "False" steps, but keeps the shards finite
                g.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
            opt.step()
        steps.append(
            dict(
                found=found,
                kind=kind,
                local=local,
                grad_bytes=grad_bytes,
                mutated=not all(_same(a, b) for a, b in zip(before, grads)),
                records=[(r.op, r.payload_bytes, r.ring_bytes) for r in ledger.records],
                adam_steps=[int(s["step"]) for s in opt.state.values()],
                shards=[p.detach().clone() for p in shards],
            )
        )
    return dict(steps=steps, params=fsdp.full_parameters())


def _agree_rank(fn: Callable) -> tuple[dict, dict]:
    """The same training twice on this rank: with the right agreement, then with `fn`."""
    return _agree_run(right_found_inf), _agree_run(fn)


def _rank_list(ranks: list[int]) -> str:
    return ("ranks " if len(ranks) > 1 else "rank ") + ", ".join(map(str, ranks))


def _not_agreed(world: int, step: int, results: list, mine: list[dict]) -> str:
    found = [m["steps"][step]["found"] for m in mine]
    skipped = [r for r in range(world) if found[r]]
    stepped = [r for r in range(world) if not found[r]]
    skips = "; ".join(
        f"rank {r} skipped {[s for s, row in enumerate(m['steps']) if row['found']]}"
        for r, m in enumerate(mine)
    )
    drift = max(
        float((a - b).abs().max())
        for m, (right, _) in zip(mine, results)
        for a, b in zip(m["steps"][-1]["shards"], right["steps"][-1]["shards"])
    )
    return (
        f"on {world} ranks, step {step}: {_rank_list(skipped)} found an inf or NaN in its "
        f"own shard and skipped the step, while {_rank_list(stepped)} found none and "
        f"stepped: the ranks did not agree. Over {AGREE_STEPS} steps {skips}: the shards of "
        "one model were updated at different steps, a model no single process would produce "
        f"(they differ from the run where every rank skips together by up to {drift:.2g}). "
        "All-reduce the flag (0 or 1) "
        "with ReduceOp.MAX before deciding, so every rank skips when any rank overflowed."
    )


def check_found_inf_agreement(found_inf_on_any_rank: Callable) -> None:
    """Run `found_inf_on_any_rank(grads) -> bool` inside FSDP training on 2 and 3 ranks."""
    for world in AGREE_WORLDS:
        results = run_on_world(_agree_rank, world, found_inf_on_any_rank, hang_hint=AGREE_HANG_HINT)
        mine = [m for _, m in results]
        for step in range(AGREE_STEPS):
            rows = [m["steps"][step] for m in mine]
            bad = next((r for r in rows if r["found"] is None), None)
            if bad is not None:
                fail(
                    f"on {world} ranks, step {step}: found_inf_on_any_rank returned a "
                    f"{bad['kind']}: return a bool."
                )
        answers = [[m["steps"][s]["found"] for m in mine] for s in range(AGREE_STEPS)]
        if all(len(set(a)) == 1 for a in answers):
            mistake = _test_mistake(world, [a[0] for a in answers])
            if mistake:
                fail(mistake)
        for step in range(AGREE_STEPS):
            rows = [m["steps"][step] for m in mine]
            where = f"on {world} ranks, step {step}"
            found = [r["found"] for r in rows]
            local = [r["local"] for r in rows]
            if len(set(found)) > 1:
                if found == local:
                    fail(_not_agreed(world, step, results, mine))
                fail(
                    f"{where}: the ranks returned {found}: every rank must return the same "
                    "answer, the flag all-reduced over the ranks."
                )
            agreed, anywhere = found[0], any(local)
            if agreed == anywhere:
                continue
            value = INJECT.get(step, (None,) * 4)[3]
            holders = [r for r in range(world) if local[r]]
            if not agreed and value is not None and math.isnan(value):
                fail(
                    f"{where}: {_rank_list(holders)} held a NaN in its gradient and "
                    "found_inf_on_any_rank returned False: torch.isinf misses NaN. Test "
                    "~torch.isfinite(g): an overflow shows as inf or NaN (inf - inf)."
                )
            if not agreed and len(holders) < world:
                fail(
                    f"{where}: {_rank_list(holders)} held an inf, the others none, and every "
                    "rank returned False: the flag must be True when *any* rank overflowed. "
                    "All-reduce it with ReduceOp.MAX (or SUM and test > 0), not MIN or PRODUCT."
                )
            if not agreed:
                fail(f"{where}: every rank held an inf, and found_inf_on_any_rank said False.")
            fail(
                f"{where}: found_inf_on_any_rank returned True, but no rank's gradient holds "
                "an inf or NaN: test ~torch.isfinite(g).any() over this rank's gradients."
            )
        flag = theory.FOUND_INF_BYTES
        for rank, m in enumerate(mine):
            for step, row in enumerate(m["steps"]):
                where = f"on {world} ranks, rank {rank}, step {step}"
                ops = [op for op, *_ in row["records"]]
                payload = sum(p for _, p, _ in row["records"])
                if not ops:
                    fail(
                        f"{where}: the answers agree, but no collective went through "
                        "minidist.comm: call comm.all_reduce(flag, op=comm.ReduceOp.MAX), so "
                        "that the ledger sees it."
                    )
                if payload >= row["grad_bytes"]:
                    fail(
                        f"{where}: the answers agree, but the ledger shows {ops} with "
                        f"{payload} bytes of payload: you reduced the gradients themselves. "
                        f"Each rank's shards hold other chunks of the model, so a sum of them "
                        f"means nothing (and overwrites them); one flag of {flag} bytes is "
                        f"enough, {theory.found_inf_bytes(world):g} bytes sent per step."
                    )
                if len(ops) > 1:
                    fail(
                        f"{where}: the answers agree, but the ledger shows {ops}: one "
                        "all-reduce per step is enough. Combine this rank's gradients into one "
                        "flag first (torch.maximum of the per-tensor flags), then all-reduce it."
                    )
                if row["mutated"]:
                    fail(
                        f"{where}: found_inf_on_any_rank changed the gradients it was given: "
                        "only read them (torch.isfinite(g)), the optimizer steps with them."
                    )
    passed(
        f"found_inf_on_any_rank gives every rank the same answer on {_and(AGREE_WORLDS)} "
        "ranks (inf, -inf and NaN in the first, middle or last gradient of one rank or of "
        "every rank): one "
        f"all-reduce of a {theory.FOUND_INF_BYTES}-byte flag per step, and every rank skips "
        "together"
    )
