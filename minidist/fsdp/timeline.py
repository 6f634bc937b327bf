"""What FSDP did, unit by unit, during one step: the numbers behind the timeline and the peak.

`record_step(fsdp, batch, loss_fn, optimizer)` runs one training step of a
`FullyShardedDataParallel` and returns, for every unit, when its parameters were gathered
(forward and backward, prefetched or not), when it computed, when its full parameter was
freed, when its gradient was reduce-scattered (and, with hybrid sharding, all-reduced across
the replicas), and the most bytes of gathered flat parameters alive at once. Zhao et al.
2023, "PyTorch FSDP", sections 3.2-3.4 (unshard / reshard around each unit, backward and
forward prefetching, the rate limiter that bounds the all-gathers in flight).

It only observes: collectives come from the ledger (`comm.record()`, tags `unit{i}-params`,
`unit{i}-grads`, `unit{i}-replicas`), compute from module hooks registered around FSDP's
own (`prepend=True` fires before them, a plain hook after them) and from tensor hooks on
each unit's output. Where FSDP acts between two observations the time is taken from the
ledger: a unit's backward ends, and its full parameter and gradient are freed, right before
its reduce-scatter is launched. The root unit's own compute is what runs before the first
nested unit starts and after the last one ends (embeddings; final norm and head); the gaps
between two blocks (autograd finishing a block's input gradient after its parameters'
gradients) are drawn for no unit. Gloo's reduce-scatter has no completion future: its end
is stamped when it is waited for, at the end of backward, an upper bound.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from .. import comm
from ..data import shard_batch
from ..data_parallel.fixture import build
from ..memory import tensor_bytes
from ..policy import tree_tensors
from ..zero.fixture import ADAM
from .fixture import UNITS
from .fully_sharded import FullyShardedDataParallel, _contains

Interval = tuple[float, float]


@dataclass
class UnitEvents:
    """One unit's step, in seconds from the start of forward."""

    index: int
    name: str  # the wrapped module's name in the model ("root" for the root unit)
    numel: int  # elements of its parameters (without padding)
    padded: int  # elements of its flat parameter (with padding)
    gathers: list[tuple[float, float, str, bool]] = field(default_factory=list)
    # (start, end, "forward" | "backward", prefetched: issued before the unit asked for it)
    forward: list[Interval] = field(default_factory=list)  # compute
    backward: list[Interval] = field(default_factory=list)  # compute
    frees: list[float] = field(default_factory=list)  # full parameter freed
    reduce_scatters: list[Interval] = field(default_factory=list)
    replica_reduces: list[Interval] = field(default_factory=list)  # hybrid sharding only


@dataclass
class StepTimeline:
    units: list[UnitEvents]  # in forward order (the root first)
    forward_end: float
    backward_end: float
    step_end: float
    shard_bytes: int  # every unit's chunk on this rank: Σ padded / F · 4
    peak_gathered_bytes: int  # the most bytes of full flat parameters alive at once
    most_units_gathered: int  # the most units whose full flat parameter was alive at once

    @property
    def peak_param_bytes(self) -> int:
        return self.shard_bytes + self.peak_gathered_bytes

    @property
    def max_gathers_in_flight(self) -> int:
        """The most parameter all-gathers whose [start, end] overlap at one instant."""
        edges = [(s, 1) for u in self.units for s, _, _, _ in u.gathers]
        edges += [(e, -1) for u in self.units for _, e, _, _ in u.gathers]
        most = running = 0
        for _, step in sorted(edges, key=lambda x: (x[0], x[1])):
            running += step
            most = max(most, running)
        return most


def gathered_bytes(fsdp: FullyShardedDataParallel) -> int:
    """Bytes of full flat parameters allocated now (a freed unit's storage has 0 bytes)."""
    return sum(u.full.untyped_storage().nbytes() for u in fsdp.units)


def record_step(
    fsdp: FullyShardedDataParallel,
    batch: tuple[torch.Tensor, torch.Tensor],
    loss_fn: Callable,
    optimizer: torch.optim.Optimizer,
) -> StepTimeline:
    """One step (zero_grad, forward, backward, step) of `fsdp`, observed unit by unit.

    Run a step before this one: FSDP learns the forward order in a step's forward and
    prefetches along it from the next one.
    """
    now = time.perf_counter
    names = {m: n or "root" for n, m in fsdp.module.named_modules()}
    marks: dict[int, dict[str, float]] = {u.index: {} for u in fsdp.units}
    peak = [0, 0]  # bytes, units

    def mark(unit, key: str) -> None:
        marks[unit.index].setdefault(key, now())
        peak[0] = max(peak[0], gathered_bytes(fsdp))
        peak[1] = max(peak[1], sum(u.full.untyped_storage().nbytes() > 0 for u in fsdp.units))

    def on_output(unit, out, key: str) -> None:
        if torch.is_grad_enabled():
            for t in tree_tensors(out):
                if t.requires_grad:
                    t.register_hook(lambda g, u=unit: mark(u, key))

    def stop(unit, out) -> None:
        mark(unit, "stop")
        on_output(unit, out, "bwd_enter")  # fires before FSDP's pre-backward (gather) hook

    def freed(unit, out) -> None:
        mark(unit, "freed")
        on_output(unit, out, "bwd_start")  # fires after it: the gather is done

    handles = []
    for u in fsdp.units:
        m = u.module
        handles += [
            m.register_forward_pre_hook(lambda m, a, u=u: mark(u, "enter"), prepend=True),
            m.register_forward_pre_hook(lambda m, a, u=u: mark(u, "start")),
            m.register_forward_hook(lambda m, a, o, u=u: stop(u, o), prepend=True),
            m.register_forward_hook(lambda m, a, o, u=u: freed(u, o)),
        ]
    try:
        optimizer.zero_grad()
        with comm.record() as ledger:
            t0 = now()
            loss = loss_fn(fsdp(batch[0]), batch[1])
            forward_end = now()
            loss.backward()
            backward_end = now()
            fsdp.finish_gradient_sync()
            optimizer.step()
            step_end = now()
    finally:
        for h in handles:
            h.remove()
    units = _unit_events(fsdp, names, marks, ledger, t0, forward_end, step_end)
    return StepTimeline(
        units=units,
        forward_end=forward_end - t0,
        backward_end=backward_end - t0,
        step_end=step_end - t0,
        shard_bytes=tensor_bytes(u.shard for u in fsdp.units),
        peak_gathered_bytes=peak[0],
        most_units_gathered=peak[1],
    )


def _unit_events(fsdp, names, marks, ledger, t0, forward_end, step_end) -> list[UnitEvents]:
    rel = lambda t: t - t0
    events = {}
    for u in fsdp.units:
        events[u.index] = UnitEvents(u.index, names[u.module], u.numel, u.layout.padded)
    for r in ledger.records:
        if not r.tag.startswith("unit"):
            continue
        index, kind = r.tag[4:].split("-")
        e = events[int(index)]
        span = (rel(r.start), rel(r.end if r.end is not None else step_end))
        if kind == "params":
            phase = "forward" if r.start < forward_end else "backward"
            asked = marks[e.index].get("enter" if phase == "forward" else "bwd_enter")
            e.gathers.append((*span, phase, asked is not None and r.start < asked))
        elif kind == "grads":
            e.reduce_scatters.append(span)
            e.frees.append(span[0])  # _post_backward frees, then launches the reduce-scatter
        elif kind == "replicas":
            e.replica_reduces.append(span)
    windows = {}  # the time each unit's module was running, gathers and waits included
    for u in fsdp.units:
        m, e = marks[u.index], events[u.index]
        fwd = (rel(m["enter"]), rel(m["freed"])) if "freed" in m else None
        end = e.reduce_scatters[0][0] if e.reduce_scatters else rel(step_end)
        bwd = (rel(m["bwd_enter"]), end) if "bwd_enter" in m else None
        windows[u.index] = (fwd, bwd)
        if "stop" in m:
            e.forward = [(rel(m["start"]), rel(m["stop"]))]
        if m.get("freed") is not None and u is not fsdp.root and fsdp.reshard_after_forward:
            e.frees.insert(0, rel(m["freed"]))
        if "bwd_start" in m:
            e.backward = [(rel(m["bwd_start"]), end)]
    for u in fsdp.units:  # a unit's own compute: before its nested units start, after they end
        inner = [v.index for v in fsdp.units if v is not u and _contains(u.module, v.module)]
        e = events[u.index]
        for phase, attr in ((0, "forward"), (1, "backward")):
            spans = [windows[i][phase] for i in inner if windows[i][phase] is not None]
            if spans:  # the time between two nested units is theirs (autograd finishing one)
                hull = (min(s for s, _ in spans), max(end for _, end in spans))
                setattr(e, attr, [p for iv in getattr(e, attr) for p in _subtract(iv, [hull])])
    order = sorted(events.values(), key=lambda e: marks[e.index].get("enter", float("inf")))
    return order


def _subtract(interval: Interval, holes: list[Interval]) -> list[Interval]:
    """`interval` minus the union of `holes`, as a list of intervals."""
    pieces = [interval]
    for hs, he in sorted(holes):
        out = []
        for s, e in pieces:
            if he <= s or hs >= e:
                out.append((s, e))
                continue
            if hs > s:
                out.append((s, hs))
            if he < e:
                out.append((he, e))
        pieces = out
    return [(s, e) for s, e in pieces if e > s]


# -- the rank functions notebook 03 and the tour run -------------------------------------------

# A GPT whose blocks compute long enough, next to their gathers, to be seen on a timeline.
TIMELINE_GPT = dict(seq_len=32, layers=4, heads=4, hidden=64)


def timelines_on_rank(
    options: Sequence[dict], sizes: dict | None = None, steps: int = 3
) -> list[StepTimeline]:
    """On a rank: for each of `options` (FullyShardedDataParallel keyword arguments), train
    the GPT (`TIMELINE_GPT` or `sizes`, one unit per block) for `steps` steps and return the
    timeline of the last one (the first ones warm up and teach FSDP the forward order)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for opts in options:
        model, batches, loss_fn = build("gpt", steps=steps, **(sizes or TIMELINE_GPT))
        fsdp = FullyShardedDataParallel(model, wrap=UNITS["gpt"], **opts)
        opt = torch.optim.Adam(fsdp.sharded_parameters(), **ADAM)
        for batch in batches:
            timeline = record_step(fsdp, shard_batch(batch, rank, world), loss_fn, opt)
        out.append(timeline)
    return out


def group_blocks(model: nn.Module, blocks_per_unit: int) -> list[nn.Module]:
    """Regroup a GPT's blocks into `nn.Sequential`s of `blocks_per_unit` consecutive blocks
    (the forward is unchanged); returns the groups, to be wrapped as units."""
    blocks = list(model.blocks)
    groups = [
        nn.Sequential(*blocks[i : i + blocks_per_unit])
        for i in range(0, len(blocks), blocks_per_unit)
    ]
    model.blocks = nn.ModuleList(groups)
    return groups


def peak_on_rank(
    blocks_per_unit: Sequence[int | None], layers: int = 8, prefetch: bool = True
) -> list[dict]:
    """On a rank: the GPT with `layers` blocks, cut into units of k blocks for each k of
    `blocks_per_unit` (None: no unit but the root, which then holds everything); two steps,
    the second observed. Returns, per k, the units' elements (root last), this rank's
    shard bytes and the measured peak of parameter bytes (shards + gathered)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for k in blocks_per_unit:
        model, batches, loss_fn = build("gpt", steps=2, layers=layers)
        groups = group_blocks(model, k) if k else []
        wrap = (lambda m, groups=groups: any(m is g for g in groups)) if groups else None
        fsdp = FullyShardedDataParallel(model, wrap=wrap, prefetch=prefetch)
        opt = torch.optim.Adam(fsdp.sharded_parameters(), **ADAM)
        for batch in batches:
            timeline = record_step(fsdp, shard_batch(batch, rank, world), loss_fn, opt)
        out.append(
            dict(
                blocks_per_unit=k,
                unit_numels=[u.numel for u in fsdp.units],
                shard_bytes=timeline.shard_bytes,
                peak_param_bytes=timeline.peak_param_bytes,
            )
        )
    return out
