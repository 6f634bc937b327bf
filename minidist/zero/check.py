"""Checkers for the ZeRO exercises of lesson 02 (Rajbhandari et al. 2020, "ZeRO", section 5).

1. `check_shard_with_padding(shard_with_padding)`: `shard_with_padding(tensor, rank,
   world_size)` flattens `tensor`, pads it with zeros to a multiple of N and returns chunk
   `rank` of ceil(numel / N) elements: the layout of `FlatShard`. Inputs are numbered 1, 2,
   3, ... so every returned value says which element it is (0 is padding).
2. `check_reduce_scatter_bucket(reduce_scatter_bucket)`: `reduce_scatter_bucket(flat_grad)`
   takes this rank's flat gradient bucket (already padded to a multiple of N) and returns the
   mean over ranks of chunk `rank`, with one `comm.reduce_scatter`. Rank r's input, element
   i, is (i + 1) + 100·2^r, so a sum, a mean, a chunk and a rank's own values all differ.
3. `check_zero_stage1(ZeroStage1)`: one flat bucket of ZeRO stage 1. `ZeroStage1(flat_param,
   make_optimizer)` keeps this rank's chunk of the flat parameters as `self.shard` and an
   optimizer over it only; `step(flat_grad)` reduce-scatters the mean gradient of that chunk
   into `self.shard.grad`, steps, and all-gathers the updated chunks into `flat_param`. Run on
   lesson 01's MLP (its parameters are views of `flat_param`) for two Adam steps and
   compared with one process.

All run on real worlds of 2, 3 and 4 ranks (3 gives padding everywhere), compare with the
reference and read a `comm.record()` ledger, so a wrong answer is named: no padding, wrong
chunk, padding not zero, forgot to divide, divided twice, all-reduce instead of
reduce-scatter, optimizer state of the full parameters, forgot the all-gather.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from .. import comm
from ..course.check import best_scale, close, fail, passed, run_on_world
from ..data import shard_batch
from ..data_parallel.fixture import build
from ..memory import optimizer_state_tensors, tensor_bytes
from ..runtime import RankFailedError
from . import theory
from .fixture import ZERO_MLP
from .flat import FlatShard


def _and(worlds) -> str:
    """(2, 3, 4) -> "2, 3 and 4"."""
    names = [str(w) for w in worlds]
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]


# -- exercise 1: shard with padding ----------------------------------------------------------

SHARD_CASES = {  # world -> shapes: padding of 1 to N-1, none, and ranks owning padding only
    2: [(3,), (2, 4)],
    3: [(7,), (2, 2)],
    4: [(3, 5), (2, 3), (10,), (2, 4)],
}


def _numbered(shape: tuple[int, ...]) -> torch.Tensor:
    """Elements 1, 2, 3, ...: a value says which flat element it is; 0 is padding."""
    n = 1
    for s in shape:
        n *= s
    return torch.arange(1, n + 1, dtype=torch.float32).reshape(shape)


def _padded(numel: int, world: int) -> torch.Tensor:
    chunk = -(-numel // world)
    return torch.cat(
        [torch.arange(1, numel + 1, dtype=torch.float32), torch.zeros(chunk * world - numel)]
    )


def _shard_rank(fn: Callable, shapes: list[tuple[int, ...]]) -> list[dict]:
    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for shape in shapes:
        t = _numbered(shape)
        got = fn(t, rank, world)
        got = got.detach().clone() if isinstance(got, torch.Tensor) else type(got).__name__
        out.append(dict(got=got, mutated=not torch.equal(t, _numbered(shape))))
    return out


def _which_elements(got: torch.Tensor, numel: int) -> str:
    """The flat indices `got` holds, 0-based, "pad" for zeros."""
    names = []
    for v in got.tolist():
        if v == 0:
            names.append("pad")
        elif v == int(v) and 1 <= v <= numel:
            names.append(str(int(v) - 1))
        else:
            names.append(f"{v:g}?")
    return "[" + ", ".join(names) + "]"


def _diagnose_shards(world: int, shape: tuple[int, ...], outs: list) -> str | None:
    numel = _numbered(shape).numel()
    chunk = -(-numel // world)
    padded = _padded(numel, world)
    what = f"a tensor of shape {tuple(shape)} ({numel} elements) on {world} ranks"
    rule = (
        f"pad with zeros to {chunk * world} elements (the next multiple of N={world}) and give "
        f"rank r elements [r·{chunk}, (r+1)·{chunk})"
    )
    for rank, got in enumerate(outs):
        if not isinstance(got, torch.Tensor):
            return f"{what}: rank {rank} returned a {got}; return the chunk as a tensor."
        if got.dim() != 1:
            return (
                f"{what}: rank {rank} returned shape {tuple(got.shape)}: flatten first "
                "(tensor.reshape(-1)); a chunk is a 1-D piece of the flat tensor."
            )
    sizes = [got.numel() for got in outs]
    if sizes != [chunk] * world:
        if sum(sizes) == numel and len(set(sizes)) > 1:
            return (
                f"{what}: the chunks have {sizes} elements: without padding {numel} elements do "
                f"not cut into {world} equal chunks (torch.chunk and tensor_split make the last "
                f"ones shorter). Every rank needs the same size for a collective: {rule}."
            )
        if set(sizes) == {numel // world} and numel % world:
            return (
                f"{what}: every rank got {numel} // {world} = {numel // world}, so the last "
                f"{numel % world} of the {numel} elements belong to no rank. Round up to "
                f"ceil({numel}/{world}) = {chunk} per rank: {rule}."
            )
        if set(sizes) == {chunk + 1} and numel % world == 0:
            return (
                f"{what}: every rank got {chunk + 1} elements, but {numel} already divides by "
                f"{world}: pad (-numel) % N elements, which is 0 here, not N."
            )
        rank = next(r for r, s in enumerate(sizes) if s != chunk)
        return (
            f"{what}: rank {rank} returned {sizes[rank]} elements; every chunk has "
            f"ceil({numel}/{world}) = {chunk}: {rule}."
        )
    for rank, got in enumerate(outs):
        want = padded[rank * chunk : (rank + 1) * chunk]
        if torch.equal(got, want):
            continue
        real = want != 0
        if torch.equal(got[real], want[real]):
            return (
                f"{what}: rank {rank}'s padding holds {got[~real].tolist()} instead of zeros. "
                "Pad with zeros (torch.zeros, or F.pad): a padded gradient is summed by the "
                "reduce-scatter and would enter the global gradient norm."
            )
        others = [j for j in range(world) if torch.equal(got, padded[j * chunk : (j + 1) * chunk])]
        if others:
            return (
                f"{what}: rank {rank} returned chunk {others[0]} (elements "
                f"{_which_elements(got, numel)}); rank r owns chunk r, elements "
                f"[r·{chunk}, (r+1)·{chunk}) = {_which_elements(want, numel)} for rank {rank}."
            )
        if torch.equal(got, padded[rank::world]):
            return (
                f"{what}: rank {rank} got one element in every {world}, "
                f"{_which_elements(got, numel)}: a strided split. Rank r owns one contiguous "
                f"block, elements [r·{chunk}, "
                f"(r+1)·{chunk}) = {_which_elements(want, numel)}: what a reduce-scatter hands "
                "rank r and an all-gather puts back in rank order."
            )
        front = torch.cat([torch.zeros(chunk * world - numel), padded[:numel]])
        if torch.equal(got, front[rank * chunk : (rank + 1) * chunk]):
            return (
                f"{what}: the padding went in front of the elements (rank {rank} holds "
                f"{_which_elements(got, numel)}); pad at the end, so every parameter keeps its "
                "offset from the start of the flat buffer."
            )
        return (
            f"{what}: rank {rank} holds elements {_which_elements(got, numel)} of the flattened "
            f"tensor (0-based) but owns {_which_elements(want, numel)}: {rule}."
        )
    return None


def check_shard_with_padding(shard_with_padding: Callable) -> None:
    """Run `shard_with_padding(tensor, rank, world_size)` on every rank of worlds of 2, 3, 4."""
    for world, shapes in SHARD_CASES.items():
        try:
            results = run_on_world(_shard_rank, world, shard_with_padding, shapes)
        except RankFailedError as exc:
            if "IndexError" in str(exc):
                fail(
                    f"on {world} ranks rank {exc.rank} asked for a chunk that does not exist: "
                    "torch.chunk(t, N) returns fewer than N chunks when N does not divide the "
                    "size (6 elements in 4 chunks: 3 chunks of 2). Pad with zeros to a "
                    "multiple of N first, then cut N equal chunks."
                )
            raise
        for case, shape in enumerate(shapes):
            problem = _diagnose_shards(world, shape, [r[case]["got"] for r in results])
            if problem:
                fail(problem)
            if any(r[case]["mutated"] for r in results):
                fail(
                    f"the chunks are right but the input tensor of shape {shape} changed: work "
                    "on a flat copy (torch.cat / F.pad make one), the parameter must not change."
                )
    passed(
        "shard_with_padding gives every rank ceil(numel/N) elements, chunk r of the zero-padded "
        f"flat tensor, for N = {_and(SHARD_CASES)} (15 elements on 4 ranks: chunks of 4, one "
        "padding zero)"
    )


# -- exercise 2: reduce-scatter a gradient bucket ---------------------------------------------

BUCKET_NUMEL = 12  # a padded bucket: divisible by 2, 3 and 4
RS_WORLDS = (2, 3, 4)
RS_HANG_HINT = (
    "Every rank must call comm.reduce_scatter once, with the same input size (the whole "
    "bucket) and an output of 1/N of it."
)


def _grad_input(rank: int, numel: int) -> torch.Tensor:
    """Rank r, element i: (i + 1) + 100·2^r. Sums over different sets of ranks all differ."""
    return torch.arange(1, numel + 1, dtype=torch.float32) + 100.0 * 2**rank


def _rs_rank(fn: Callable, numel: int) -> dict:
    rank = dist.get_rank()
    with comm.record() as ledger:
        out = fn(_grad_input(rank, numel))
    out = out.detach().clone() if isinstance(out, torch.Tensor) else type(out).__name__
    return dict(out=out, records=[(r.op, r.ring_bytes) for r in ledger.records])


def _mean_grad(world: int, numel: int) -> torch.Tensor:
    return torch.stack([_grad_input(r, numel) for r in range(world)]).mean(0)


def _diagnose_chunk_values(
    got: torch.Tensor, mean: torch.Tensor, local: torch.Tensor, rank: int, world: int
) -> str | None:
    """What is wrong with rank `rank`'s reduced chunk `got`; `mean` and `local` are the whole
    mean and this rank's whole input. None when it is right."""
    chunk = mean.numel() // world
    want = mean[rank * chunk : (rank + 1) * chunk]
    if close(got, want):
        return None
    if close(got, local[rank * chunk : (rank + 1) * chunk]):
        return (
            f"rank {rank}'s chunk still holds its own gradient: nothing was reduced over the "
            "ranks. comm.reduce_scatter(out, flat_grad) sums chunk r of every rank's input "
            "into rank r's `out`."
        )
    scale = best_scale(got, want)
    if close(got, want * world):
        return (
            f"the chunk is {world}x the mean: reduce-scatter sums over the {world} ranks; you "
            f"forgot to divide by the world size N={world}."
        )
    if close(got, want / world):
        return (
            f"the chunk is {world}x too small: you divided by N={world} twice (before the "
            "reduce-scatter and after it): divide once."
        )
    for j in range(world):
        other = mean[j * chunk : (j + 1) * chunk]
        for factor, how in ((1, ""), (world, f", {world}x too large")):
            if j != rank and close(got, other * factor):
                return (
                    f"rank {rank} holds chunk {j}'s mean{how}: rank r keeps chunk r, elements "
                    f"[r·{chunk}, (r+1)·{chunk}) of the bucket, which is what "
                    "comm.reduce_scatter puts in rank r's output."
                )
    return (
        f"rank {rank}'s chunk is not the mean over ranks of chunk {rank} (best fit {scale:.3g}x "
        f"it; first element {got[0].item():g}, expected {want[0].item():g})."
    )


def check_reduce_scatter_bucket(reduce_scatter_bucket: Callable) -> None:
    """Run `reduce_scatter_bucket(flat_grad) -> chunk` on worlds of 2, 3 and 4."""
    for world in RS_WORLDS:
        try:
            results = run_on_world(
                _rs_rank, world, reduce_scatter_bucket, BUCKET_NUMEL, hang_hint=RS_HANG_HINT
            )
        except RankFailedError as exc:
            if "outputShape" in str(exc) or "output tensor size" in str(exc).lower():
                fail(
                    f"comm.reduce_scatter aborted on {world} ranks: its output must hold 1/N of "
                    f"its input, {BUCKET_NUMEL} // {world} = {BUCKET_NUMEL // world} elements "
                    "here (torch.empty(flat_grad.numel() // N))."
                )
            raise
        mean = _mean_grad(world, BUCKET_NUMEL)
        chunk = BUCKET_NUMEL // world
        full = 4 * BUCKET_NUMEL
        half = theory.bytes_sent_per_step(BUCKET_NUMEL, world, stage=0) / 2
        for rank, res in enumerate(results):
            ops = [op for op, _ in res["records"]]
            sent = sum(b for _, b in res["records"])
            where = f"on {world} ranks"
            all_reduce = (
                f"An all-reduce gives every rank the sum of the whole bucket and sends "
                f"2(N-1)/N·S = {2 * half:.0f} bytes per rank for S = {full} bytes, twice the "
                f"reduce-scatter's (N-1)/N·S = {half:.0f}; rank r only needs chunk r: use "
                "comm.reduce_scatter."
            )
            if not isinstance(res["out"], torch.Tensor):
                fail(f"{where} rank {rank} returned a {res['out']}; return the reduced chunk.")
            out = res["out"].reshape(-1)
            if out.numel() == BUCKET_NUMEL:
                fail(
                    f"{where} rank {rank} returned the whole bucket ({BUCKET_NUMEL} elements): "
                    f"return only its chunk, the {chunk} elements reduce-scatter leaves on it."
                    + (f" {all_reduce}" if "all_reduce" in ops else "")
                )
            if out.numel() != chunk:
                fail(f"{where} rank {rank} returned {out.numel()} elements; its chunk has {chunk}.")
            local = _grad_input(rank, BUCKET_NUMEL)
            problem = _diagnose_chunk_values(out, mean, local, rank, world)
            if problem:
                fail(f"{where}: {problem}")
            if "all_reduce" in ops:
                fail(f"{where} the chunk is right but the ledger shows {ops}. {all_reduce}")
            if "reduce_scatter" not in ops:
                fail(
                    f"{where} the chunk is right but no reduce-scatter went through "
                    f"minidist.comm (the ledger shows {ops}): call comm.reduce_scatter(out, "
                    "flat_grad) so that the ledger sees it."
                )
            if sent != half:
                fail(
                    f"{where} rank {rank} sent {sent:.0f} bytes ({ops}); one reduce-scatter of "
                    f"the {full}-byte bucket sends (N-1)/N·S = {half:.0f}: call it once."
                )
    passed(
        f"reduce_scatter_bucket leaves on rank r the mean of chunk r for N = {_and(RS_WORLDS)}, "
        "with one reduce-scatter: (N-1)/N·S bytes sent, half an all-reduce"
    )


# -- exercise 3: the stage-1 step -------------------------------------------------------------

STAGE1_WORLDS = (2, 3, 4)
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
                records=[(r.op, r.ring_bytes) for r in ledger.records],
            )
        )
    return steps


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
    if (
        got is None
        or got.numel() != chunk
        or close(got, initial[rank * chunk : (rank + 1) * chunk])
    ):
        return None
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
            "self.optimizer holds no state after step(): call self.optimizer.step() (Adam "
            "creates its two moments at the first step)."
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
    others = torch.ones(want.numel(), dtype=torch.bool)
    others[mine] = False
    own_right = close(s["after"][mine], want[mine], atol=PARAM_ATOL)
    others_stale = torch.equal(s["after"][others], s["before"][others])
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
        results = run_on_world(_stage1_rank, world, zero_stage1_cls, hang_hint=STAGE1_HANG_HINT)
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
        f"ZeroStage1 trains like one process with Adam for N = {_and(STAGE1_WORLDS)} "
        f"({STAGE1_STEPS} steps): Adam state for 1/N of the parameters, one reduce-scatter and "
        "one all-gather per step, 2(N-1)/N·S bytes as in DDP"
    )
