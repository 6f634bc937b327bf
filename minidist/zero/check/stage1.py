"""zero checker: exercise 3: the stage-1 step."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ... import comm
from ...course.check import close, fail, passed, run_on_world
from ...data import shard_batch
from ...data_parallel.fixture import build
from ...memory import optimizer_state_tensors, tensor_bytes
from .. import theory
from ..fixture import ZERO_MLP
from ..flat import FlatShard
from ._shared import _and
from .reduce_scatter import _diagnose_chunk_values

STAGE1_WORLDS = (3, 2, 4)  # 3 first: there N, N-1 and 1/N are three different mistakes
STAGE1_STEPS = 2
LR = 1e-2
# float32 summation order differs from one process by a few ulps, and Adam's step m/sqrt(v)
# is about ±lr whatever the gradient's size, so where a gradient is a near-cancelling sum the
# ulps become a visible difference (up to ~2e-5 here, see tests/test_zero.py). A missed,
# doubled or stale update moves a parameter by about lr = 1e-2.
PARAM_ATOL = 1e-4
STAGE1_HANG_HINT = (
    "Every rank must make the same collectives in the same order: one reduce-scatter of the "
    "whole flat gradient, then one all-gather into the whole flat_param."
)

STAGE1_HINTS = {  # an exception's words -> its likely cause in this exercise
    r"is being modified inplace|modified inplace with grad|leaf Variable that requires grad": (
        "the all-gather writes into flat_param, and self.shard, a Parameter that requires "
        "grad, is a view of it: autograd refuses an in-place write it cannot record. Pass "
        "self.shard.detach() (the same memory without autograd: an in-place all-gather, no "
        "copy needed)"
    ),
}


def make_adam(params: list) -> torch.optim.Optimizer:
    """The optimizer the checker hands to `ZeroStage1` (module level: it travels to ranks)."""
    return torch.optim.Adam(params, lr=LR)


def _mlp():
    """Lesson 01's MLP, small, with a 3-element last bias; 12 samples a step (N = 2, 3, 4)."""
    return build("mlp", steps=STAGE1_STEPS, global_batch=12, in_dim=8, hidden=16, **ZERO_MLP)


def _stage1_rank(cls: type) -> list[dict]:
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = _mlp()
    params = [p for p in model.parameters() if p.requires_grad]
    layout = FlatShard(params, world, rank)
    flat_param = layout.flatten([p.detach() for p in params])
    for p, view in zip(params, layout.views(flat_param)):
        p.data = view  # the model's parameters live in flat_param, as in ZeroDataParallel
    zero = cls(flat_param, make_adam)
    shard = getattr(zero, "shard", None)
    first = shard.detach().reshape(-1).clone() if isinstance(shard, torch.Tensor) else None
    view_at = None  # where self.shard starts inside flat_param's storage, if it is a view
    if isinstance(shard, torch.Tensor) and _same_storage(shard, flat_param):
        view_at = (shard.data_ptr() - flat_param.data_ptr()) // flat_param.element_size()
    steps = []
    for batch in batches:
        x, y = shard_batch(batch, rank, world)
        for p in params:
            p.grad = None
        loss_fn(model(x), y).backward()
        flat_grad = layout.flatten([p.grad for p in params])
        local, before = flat_grad.clone(), flat_param.clone()
        with comm.record() as ledger:
            zero.step(flat_grad)
        shard = getattr(zero, "shard", None)
        opt = getattr(zero, "optimizer", None)
        mine = getattr(zero, "flat_param", flat_param)
        has_grad = isinstance(shard, torch.Tensor) and shard.grad is not None
        steps.append(
            dict(
                local=local,
                before=before,
                after=flat_param.clone(),
                rebound=mine.detach().clone() if mine is not flat_param else None,
                grad=shard.grad.detach().clone() if has_grad else None,
                shard_numel=shard.numel() if isinstance(shard, torch.Tensor) else None,
                state_bytes=(
                    tensor_bytes(optimizer_state_tensors(opt)) if opt is not None else None
                ),
                first_shard=first,
                view_at=view_at,
                records=[(r.op, r.ring_bytes) for r in ledger.records],
            )
        )
    return steps


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _stage1_reference(world: int) -> list[dict]:
    """One process, Adam on every trainable parameter: per step the mean gradient and the
    parameters after the step, both in the flat padded layout of a world of `world`."""
    model, batches, loss_fn = _mlp()
    params = [p for p in model.parameters() if p.requires_grad]
    layout = FlatShard(params, world, 0)
    opt = make_adam(params)
    initial = layout.flatten([p.detach() for p in params])
    out = []
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        grad = layout.flatten([p.grad for p in params])
        opt.step()
        out.append(
            dict(grad=grad, params=layout.flatten([p.detach() for p in params]), initial=initial)
        )
    return out


def _diagnose_shard(s: dict, initial: torch.Tensor, rank: int, world: int) -> str | None:
    """Is self.shard (as __init__ left it) this rank's chunk of flat_param?"""
    chunk = initial.numel() // world
    got = s["first_shard"]
    right = got is not None and close(got, initial[rank * chunk : (rank + 1) * chunk])
    if got is None or got.numel() != chunk or (right and s["view_at"] == rank * chunk):
        return None
    if right and s["view_at"] != rank * chunk:
        where = (
            "a copy: it shares no storage with flat_param"
            if s["view_at"] is None
            else f"a view of flat_param starting at element {s['view_at']}, not {rank * chunk}"
        )
        return (
            f"rank {rank}'s self.shard holds the right values but is {where}. It must be a "
            f"view of flat_param[{rank * chunk} : {(rank + 1) * chunk}] "
            "(nn.Parameter(flat_param[a:b]) shares the storage; .clone(), torch.tensor(...) "
            "or .detach().clone() copy it): a copy doubles this chunk's memory and the "
            "update lands in it instead of in the model's parameters."
        )
    for j in range(world):
        if close(got, initial[j * chunk : (j + 1) * chunk]):
            return (
                f"rank {rank}'s self.shard is chunk {j} of flat_param; rank r owns chunk r, "
                f"elements [r·{chunk}, (r+1)·{chunk}): the chunk reduce-scatter gives it the "
                "gradient of, and the one all-gather takes from it."
            )
    return (
        f"rank {rank}'s self.shard does not hold elements [r·{chunk}, (r+1)·{chunk}) of "
        "flat_param: take that slice (a view, flat_param[start : start + chunk])."
    )


def _diagnose_memory(s: dict, rank: int, world: int, padded: int) -> str | None:
    chunk = padded // world
    state, numel = s["state_bytes"], s["shard_numel"]
    expected = 8 * chunk + 4
    if numel is None:
        return (
            "there is no self.shard: in __init__ keep this rank's chunk of flat_param as "
            "self.shard (an nn.Parameter), and build self.optimizer = make_optimizer([self.shard])."
        )
    if state is None:
        return "there is no self.optimizer: build it in __init__ with make_optimizer([self.shard])."
    if numel == padded or state >= 8 * padded:
        return (
            f"rank {rank}'s optimizer holds {state} bytes of state: Adam's two moments for all "
            f"{padded} elements (8 bytes each, + 4 for its step count), as in plain data "
            f"parallelism, so {world} ranks hold {world} copies of it. You stepped the full "
            f"parameters. ZeRO-1 steps only this rank's chunk: self.shard = the {chunk} elements "
            f"[r·{chunk}, (r+1)·{chunk}) of flat_param, and the optimizer on it alone holds "
            f"8·{chunk} + 4 = {expected} bytes, 1/N of the state."
        )
    if numel != chunk:
        return (
            f"self.shard has {numel} elements on rank {rank}; this rank's chunk of the "
            f"{padded}-element flat_param has {padded} / {world} = {chunk}."
        )
    if state == 0:
        return (
            "self.optimizer holds no state after step(): Adam creates its two moments at its "
            "first step on a parameter that has a gradient. Either self.optimizer.step() was "
            "never called, or it ran before self.shard.grad was set (an optimizer skips a "
            "parameter whose grad is None): set the reduced gradient first, then step."
        )
    if state != expected:
        return (
            f"rank {rank}'s optimizer holds {state} bytes of state; Adam on a chunk of {chunk} "
            f"elements holds 8·{chunk} + 4 = {expected}: build it on [self.shard] only."
        )
    return None


def _diagnose_params(s: dict, want: torch.Tensor, rank: int, world: int) -> str | None:
    if close(s["after"], want, atol=PARAM_ATOL):
        return None
    chunk = want.numel() // world
    mine = slice(rank * chunk, (rank + 1) * chunk)
    rebound = s["rebound"]
    if rebound is not None and close(rebound, want, atol=PARAM_ATOL):
        return (
            "self.flat_param now is a new tensor holding the right values, but the model's "
            "parameters are views of the flat_param you were given: write into it in place, "
            "comm.all_gather(self.flat_param, ...)."
        )
    others = torch.ones(want.numel(), dtype=torch.bool, device="cpu")
    others[mine] = False
    own_right = close(s["after"][mine], want[mine], atol=PARAM_ATOL)
    others_stale = torch.equal(s["after"][others], s["before"][others])
    if own_right and others_stale and any(op == "all_gather" for op, _ in s["records"]):
        return (
            f"rank {rank}'s own chunk was updated, and an all-gather ran, but flat_param's "
            f"chunks of the other N-1 = {world - 1} ranks still hold the previous step's "
            "values: the all-gather ran before self.optimizer.step(), so it gathered the old "
            "chunks. Step first, then all-gather the updated chunk."
        )
    if own_right and others_stale:
        return (
            f"rank {rank}'s own chunk was updated, but flat_param's chunks of the other N-1 = "
            f"{world - 1} ranks still hold the previous step's values: forgot the all-gather. "
            "After the step, comm.all_gather(self.flat_param, <this rank's updated chunk>) "
            "puts every rank's chunk back into every rank's full parameters."
        )
    if torch.equal(s["after"], s["before"]):
        return (
            f"flat_param did not change at all on rank {rank}: the optimizer updated "
            "self.shard, and nothing wrote it back. If self.shard is a copy, not a view of "
            "flat_param, the all-gather after the step is what updates flat_param."
        )
    bad = sorted({int(i) // chunk for i in (s["after"] - want).abs().gt(PARAM_ATOL).nonzero()})
    return (
        f"after step() rank {rank}'s parameters differ from one process's Adam step by up to "
        f"{float((s['after'] - want).abs().max()):.2g} in chunks {bad}: reduce-scatter the "
        "mean gradient into self.shard.grad, call self.optimizer.step() once, then all-gather."
    )


def check_zero_stage1(zero_stage1_cls: type) -> None:
    """Train lesson 01's MLP with `ZeroStage1(flat_param, make_optimizer)` on N = 2, 3, 4."""
    for world in STAGE1_WORLDS:
        reference = _stage1_reference(world)
        results = run_on_world(
            _stage1_rank, world, zero_stage1_cls, hang_hint=STAGE1_HANG_HINT, hints=STAGE1_HINTS
        )
        padded = reference[0]["grad"].numel()
        sent_theory = theory.bytes_sent_per_step(padded, world, stage=1)
        for step, ref in enumerate(reference):
            for rank, res in enumerate(results):
                s = res[step]
                where = f"on {world} ranks, step {step}"
                problem = _diagnose_memory(s, rank, world, padded)
                problem = problem or _diagnose_shard(s, ref["initial"], rank, world)
                if problem:
                    fail(f"{where}: {problem}")
                if s["grad"] is None:
                    fail(
                        f"{where}: self.shard.grad is None after step(): put the reduced chunk "
                        "in self.shard.grad before self.optimizer.step()."
                    )
                problem = _diagnose_chunk_values(
                    s["grad"].reshape(-1), ref["grad"], s["local"], rank, world
                )
                if problem:
                    fail(f"{where}, self.shard.grad: {problem}")
                problem = _diagnose_params(s, ref["params"], rank, world)
                if problem:
                    fail(f"{where}: {problem}")
                ops = [op for op, _ in s["records"]]
                sent = sum(b for _, b in s["records"])
                if "all_reduce" in ops:
                    fail(
                        f"{where}: the values are right, but the ledger shows {ops}. An "
                        "all-reduce gives every rank the whole mean gradient, 2(N-1)/N·S bytes; "
                        "ZeRO-1 reduce-scatters, (N-1)/N·S, because each rank steps only its "
                        f"chunk, then all-gathers the updated chunks, (N-1)/N·S: {sent_theory:.0f} "
                        f"bytes per step in all, what DDP's all-reduce alone sends. You sent "
                        f"{sent:.0f}."
                    )
                if sorted(ops) != ["all_gather", "reduce_scatter"] or sent != sent_theory:
                    fail(
                        f"{where}: the values are right, but the ledger shows {ops} ({sent:.0f} "
                        f"bytes sent); a stage-1 step is one comm.reduce_scatter and one "
                        f"comm.all_gather of the {padded}-element bucket, {sent_theory:.0f} bytes."
                    )
    passed(
        f"ZeroStage1 trains like one process with Adam for N = {_and(sorted(STAGE1_WORLDS))} "
        f"({STAGE1_STEPS} steps): Adam state for 1/N of the parameters, one reduce-scatter and "
        "one all-gather per step, 2(N-1)/N·S bytes as in DDP"
    )
