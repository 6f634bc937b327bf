"""One rank grid for every parallelism at once (lesson 17): `ParallelDims` and its groups.

The names are torchtitan's (`torchtitan/distributed/parallel_dims.py`): `dp_replicate`
(HSDP's replicas), `dp_shard` (the ranks a ZeRO/FSDP state is sharded over), `cp`
(context parallel: each rank holds 1/cp of every sequence), `tp` (tensor parallel, with
`sp` for sequence parallelism between its regions), `pp` (pipeline stages, with the
`schedule` and `virtual` stages per rank) and `ep` (expert parallel).

**The grid.** World rank r is the point (pp, dp_replicate, dp_shard, cp, tp) of a grid in
that order, tp varying fastest (Megatron-LM's `initialize_model_parallel` and torchtitan's
mesh put the same dimension innermost):
- tp innermost: its ranks are consecutive, so a tp group sits inside a node, on the fastest
  links; tensor parallelism all-reduces (or all-gathers and reduce-scatters) activations in
  every layer, forward and backward, the most frequent traffic of all (Narayanan et al.
  2021, "Efficient Large-Scale Language Model Training on GPU Clusters", section 3.3);
- cp next: ring attention passes K/V blocks every layer, less often than tp, more than dp;
- dp_shard, then dp_replicate: gradients and parameters move once per step (FSDP once per
  layer), and HSDP's replication crosses the slowest links only once per step;
- pp outermost: stages only pass one activation per micro-batch point to point, the least
  traffic, so they may span nodes.

**Experts.** `ep` is drawn from dp_shard × cp, as torchtitan does: the ranks that hold the
same dense parameters and different tokens are exactly the ones that can exchange tokens
and hold different experts; dp_shard × cp / ep of them (and every dp_replicate copy) then
hold the same expert and reduce its gradient. The alternative is Megatron-core's separate
expert grid (`expert_tensor_parallel_size`, `expert_model_parallel_size`: an expert-data
group decoupled from the dense one, so experts may use another tp than the attention); it
buys flexibility at the price of a second set of groups, which a course model does not need.

`grid_groups(dims, world)` is pure arithmetic (every group kind's rank lists);
`Grid` makes the groups on a world (every rank must build it, in the same order).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch.distributed as dist

from .. import comm
from ..pipeline.schedules import KINDS as SCHEDULES  # noqa: F401 (the trainer's choices)
from ..pipeline.schedules import V_SHAPED

AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")  # outermost first
# group kinds: one grid axis, or several flattened (the ranks varying along all of them)
KINDS = {
    "pp": ("pp",),
    "dp_replicate": ("dp_replicate",),
    "dp_shard": ("dp_shard",),
    "cp": ("cp",),
    "tp": ("tp",),
    "dp_shard_cp": ("dp_shard", "cp"),  # ZeRO / FSDP shard over these (torchtitan's name)
    "dp_cp": ("dp_replicate", "dp_shard", "cp"),  # every rank with a copy of a dense weight
    "stage": ("dp_replicate", "dp_shard", "cp", "tp"),  # every rank of one pipeline stage
}


@dataclass(frozen=True)
class ParallelDims:
    """Sizes of every dimension; their product (ep excepted: it lies inside dp_shard × cp)
    is the world."""

    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1
    sp: bool = False
    pp: int = 1
    schedule: str = "1f1b"
    virtual: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        for name in ("dp_replicate", "dp_shard", "cp", "tp", "pp", "virtual", "ep"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ParallelDims: {name}={value!r} must be an int >= 1")
        if not isinstance(self.sp, bool):
            raise ValueError(f"ParallelDims: sp={self.sp!r} must be True or False")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"ParallelDims: schedule={self.schedule!r} must be one of {SCHEDULES}")
        if self.virtual != 1 and self.schedule != "interleaved":
            raise ValueError(
                f"ParallelDims: virtual={self.virtual} needs schedule='interleaved' "
                f"(ZB-V and DualPipeV always run 2 chunks per rank; the others 1)"
            )
        if self.sp and self.tp == 1:
            raise ValueError("ParallelDims: sp=True needs tp > 1 (it splits tp's activations)")
        if (self.dp_shard * self.cp) % self.ep:
            raise ValueError(
                f"ParallelDims: ep={self.ep} must divide dp_shard × cp = "
                f"{self.dp_shard} × {self.cp} (experts are placed over those ranks)"
            )

    @property
    def world_size(self) -> int:
        return self.dp_replicate * self.dp_shard * self.cp * self.tp * self.pp

    @property
    def chunks(self) -> int:
        """Model chunks per rank: `virtual` (interleaved), 2 (ZB-V, DualPipeV), else 1."""
        return 2 if self.schedule in V_SHAPED else self.virtual

    def check_world(self, world: int) -> None:
        if self.world_size != world:
            raise ValueError(
                f"ParallelDims: dp_replicate·dp_shard·cp·tp·pp = {self.dp_replicate}·"
                f"{self.dp_shard}·{self.cp}·{self.tp}·{self.pp} = {self.world_size} "
                f"must equal the world size {world}"
            )

    def check_model(self, heads: int, layers: int, seq_len: int, experts: int = 0) -> None:
        """Refuse sizes the model cannot be split into, naming the argument and the rule."""
        if heads % self.tp:
            raise ValueError(f"ParallelDims: tp={self.tp} must divide the heads={heads}")
        if layers < self.pp * self.chunks:  # uneven: `three_d.theory.stage_layers`
            raise ValueError(
                f"ParallelDims: pp × chunks per rank = {self.pp} × {self.chunks} stages need at "
                f"least one layer each, more than the layers={layers}"
            )
        split = 2 * self.cp * (self.tp if self.sp else 1)
        if seq_len % split:
            raise ValueError(
                f"ParallelDims: the sequence length {seq_len} must divide by 2·cp"
                f"{'·tp (sp)' if self.sp else ''} = {split} (zig-zag chunks"
                f"{', then tp blocks' if self.sp else ''})"
            )
        if self.ep > 1 and not experts:
            raise ValueError(f"ParallelDims: ep={self.ep} needs a model with experts")
        if experts and experts % self.ep:
            raise ValueError(f"ParallelDims: ep={self.ep} must divide the experts={experts}")

    def sizes(self) -> dict[str, int]:
        return {a: getattr(self, a) for a in AXES}


def coordinates(dims: ParallelDims, rank: int) -> dict[str, int]:
    """Rank `rank`'s place on every axis of the grid."""
    out, sizes = {}, dims.sizes()
    for axis in reversed(AXES):
        out[axis], rank = rank % sizes[axis], rank // sizes[axis]
    return out


def _rank(dims: ParallelDims, coord: dict[str, int]) -> int:
    r, sizes = 0, dims.sizes()
    for axis in AXES:
        r = r * sizes[axis] + coord[axis]
    return r


def grid_groups(dims: ParallelDims) -> dict[str, list[list[int]]]:
    """{kind: its groups' rank lists}: every kind of `KINDS`, plus `ep` (consecutive blocks
    of dp_shard_cp), `ep_shard` (the ranks of dp_shard_cp holding the same experts), and
    `expert_dp` (those and their dp_replicate copies), and `embedding` (first and last
    stage: the tied embedding's two copies)."""
    sizes, out = dims.sizes(), {}
    for kind, axes in KINDS.items():
        rest = [a for a in AXES if a not in axes]
        groups = []
        for fixed in itertools.product(*(range(sizes[a]) for a in rest)):
            coord = dict(zip(rest, fixed))
            groups.append(
                [
                    _rank(dims, {**coord, **dict(zip(axes, moving))})
                    for moving in itertools.product(*(range(sizes[a]) for a in axes))
                ]
            )
        out[kind] = groups
    e = dims.ep
    out["ep"] = [g[i : i + e] for g in out["dp_shard_cp"] for i in range(0, len(g), e)]
    out["ep_shard"] = [g[i::e] for g in out["dp_shard_cp"] for i in range(e)]
    sc = dims.dp_shard * dims.cp  # every copy of one expert, dp_replicate included:
    out["expert_dp"] = [
        [r for j, r in enumerate(g) if j % sc % e == i] for g in out["dp_cp"] for i in range(e)
    ]
    out["embedding"] = [[g[0], g[-1]] if len(g) > 1 else [g[0]] for g in out["pp"]]
    return out


class Grid:
    """`grid_groups` made on the current world; this rank's groups, coordinates and ranks."""

    def __init__(self, dims: ParallelDims):
        world, self.rank = dist.get_world_size(), dist.get_rank()
        dims.check_world(world)
        self.dims, self.ranks = dims, grid_groups(dims)
        self.coord = coordinates(dims, self.rank)
        self.groups: dict[str, object] = {}
        self.mine: dict[str, list[int]] = {}
        for kind, lists in self.ranks.items():
            for ranks in lists:  # every rank creates every group, in the same order
                group = comm.new_group(ranks, kind) if len(ranks) < world else dist.group.WORLD
                if self.rank in ranks:
                    self.groups[kind], self.mine[kind] = group, ranks

    def group(self, kind: str):
        return self.groups[kind]

    def size(self, kind: str) -> int:
        return len(self.mine[kind])

    def rank_in(self, kind: str) -> int:
        return self.mine[kind].index(self.rank)

    def kind_of(self, ranks: tuple[int, ...]) -> str | None:
        """The group kind with exactly these ranks (for the ledger), axis kinds first."""
        for kind in ("tp", "cp", "pp", "ep", "dp_shard_cp", "dp_replicate", "ep_shard"):
            if list(ranks) == self.mine.get(kind):
                return kind
        for kind in ("embedding", "dp_shard", "dp_cp", "expert_dp", "stage"):
            if list(ranks) == self.mine.get(kind):
                return kind
        return None
