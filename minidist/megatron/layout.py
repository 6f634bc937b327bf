"""Megatron-LM's parallel layout: which ranks form each tensor-, pipeline- and data-parallel group.

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM" (SC), section 3 (and Megatron-LM's `initialize_model_parallel`): a world of
n = t·p·d ranks. Tensor-parallel groups are blocks of t consecutive ranks (on one node, where
the links are fastest: TP all-reduces every layer); pipeline groups take every (n/p)-th rank
(stages across nodes: they only pass activations); data-parallel groups are, inside each
stage's block of n/p ranks, every t-th rank. A model-parallel group is one model replica
(t·p ranks); the embedding group joins the first and last stage of each pipeline, which hold
the tied input and output embeddings.

`parallel_groups` is pure arithmetic; `ParallelLayout` makes the groups on a world and
answers "my tp rank" without any module-level state, so several layouts can coexist.
"""

from __future__ import annotations

import torch.distributed as dist

from .. import comm

KINDS = ("tp", "pp", "dp", "mp", "embedding")


def parallel_groups(world_size: int, tp: int, pp: int) -> dict[str, list[list[int]]]:
    """The rank lists of every group kind for `world_size` = tp · pp · dp ranks."""
    for name, value in (("world_size", world_size), ("tp", tp), ("pp", pp)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"parallel_groups: {name} must be an int >= 1, got {value!r}")
    if world_size % (tp * pp):
        raise ValueError(
            f"parallel_groups: world_size={world_size} is not divisible by tp·pp = {tp}·{pp} "
            f"= {tp * pp}"
        )
    dp = world_size // (tp * pp)
    per_stage = world_size // pp
    tp_groups = [list(range(i, i + tp)) for i in range(0, world_size, tp)]
    pp_groups = [list(range(i, world_size, per_stage)) for i in range(per_stage)]
    dp_groups = [
        [stage * per_stage + j + k * tp for k in range(dp)]
        for stage in range(pp)
        for j in range(tp)
    ]
    mp_groups = [[group[i] for group in dp_groups] for i in range(dp)]
    embedding = [[g[0], g[-1]] if pp > 1 else [g[0]] for g in pp_groups]
    return {
        "tp": tp_groups,
        "pp": pp_groups,
        "dp": dp_groups,
        "mp": mp_groups,
        "embedding": embedding,
    }


class ParallelLayout:
    """The groups of `parallel_groups` made on the current world; this rank's view of them.

    Every rank must construct it (group creation is collective), with the same tp and pp.
    """

    def __init__(self, tp: int, pp: int = 1):
        world, self.rank = dist.get_world_size(), dist.get_rank()
        self.ranks = parallel_groups(world, tp, pp)
        self.tp_size, self.pp_size, self.dp_size = tp, pp, world // (tp * pp)
        self.groups: dict[str, object] = {}
        self.mine: dict[str, list[int]] = {}
        for kind in KINDS:
            for ranks in self.ranks[kind]:
                group = comm.new_group(ranks, kind) if len(ranks) < world else None
                if self.rank in ranks:
                    self.groups[kind], self.mine[kind] = group, ranks

    def group(self, kind: str):
        """The torch.distributed group of `kind` this rank is in (None: the whole world)."""
        return self.groups[kind]

    def rank_in(self, kind: str) -> int:
        return self.mine[kind].index(self.rank)

    @property
    def tp_rank(self) -> int:
        return self.rank_in("tp")

    @property
    def pp_rank(self) -> int:
        return self.rank_in("pp")

    @property
    def dp_rank(self) -> int:
        return self.rank_in("dp")
