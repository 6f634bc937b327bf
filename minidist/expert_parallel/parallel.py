"""Experts placed over ranks: dispatch and combine with all-to-all (Lepikhin et al. 2020,
GShard, section 2.2-3.2; Fedus et al. 2022, Switch Transformer, section 2.2 and figure 3).

E experts over the e ranks of `ep_group`, E/e each (rank r holds experts r·E/e ...). Every
rank keeps a copy of the router and routes its own tokens (data parallel over tokens), with
the capacity of its own group of tokens. Then:

1. counts: how many of its kept assignments go to each expert, exchanged with a small
   all-to-all so that every rank knows what it will receive: lesson 11's distributed
   embedding does the same before its lookup (`embedding/distributed.py`, "embedding counts");
2. dispatch: ONE all-to-all of the token rows, sorted by expert and, within an expert, by
   priority (split sizes: the rows for each rank);
3. the local experts run on the rows they received;
4. combine: the reverse all-to-all brings each row home, where it is weighted by its gate
   and summed into the token's output. Backward is the two all-to-alls reversed.

With `pad_to_capacity=True` the shapes are static instead, as GShard runs on TPUs (Lepikhin
et al. 2020, section 3.1, Algorithm 2: a [E, C, h] dispatch tensor) and Megatron-core's
`moe_pad_expert_input_to_capacity`: every rank sends every other rank E/e · C rows, its kept
rows in their slots and zeros in the rest, so there is no counts exchange and the bytes are
(e-1) · E/e · C · h · 4 per direction whatever the routing (`theory.padded_all_to_all_bytes`):
plannable before any token is routed, paid for with the padding's bytes and FLOPs. Every
rank must route the same number of tokens (the same C). A layer checks this at its first
forward and again at each forward whose token count differs from the one last agreed: one
all-gather of the ranks' counts over `ep_group` (tag "ep padded tokens", kept off the ledger by
`comm.unrecorded`: it is no part of the per-step bytes above), and a ValueError naming every
rank's count on every rank when they differ, instead of all-to-alls of different sizes that
abort gloo. What it cannot catch: a count that changes on some ranks and not on the others
after the first forward. Those ranks check while the others are already in the dispatch, so
catching it would take an exchange at every forward, which the static shapes are there to
avoid: every rank must change its count at the same forward (a last, shorter batch on all).

Gradients: the router is replicated over the whole world, so its gradient is all-reduced
over it; an expert's gradient already holds every token of its expert-parallel group (the
all-to-all brought them), and is all-reduced over `dp_group`, the ranks holding the same
expert (EP × DP).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn

from .. import comm
from ..parallel import all_reduce_flat, broadcast_parameters, verify_same_model
from .moe import MoE
from .routing import Routing, capacity, route


class _AllToAll(torch.autograd.Function):
    """Rows of `x` split by `send` go out; rows split by `recv` come in. Backward reverses."""

    @staticmethod
    def forward(ctx, x, recv: list[int], send: list[int], group, tag: str):
        ctx.recv, ctx.send, ctx.group, ctx.tag = recv, send, group, tag
        return _all_to_all(x, recv, send, group, tag)

    @staticmethod
    def backward(ctx, grad):
        out = _all_to_all(grad.contiguous(), ctx.send, ctx.recv, ctx.group, ctx.tag + " grad")
        return out, None, None, None, None


def _all_to_all(x, recv: list[int], send: list[int], group, tag: str) -> torch.Tensor:
    out = x.new_empty((sum(recv), *x.shape[1:]))
    comm.all_to_all(out, x.contiguous(), recv, send, group=group, tag=tag)
    return out


class ExpertParallelMoE(nn.Module):
    """`moe`'s router on every rank, its experts spread over `ep_group`; `forward(x)` on
    this rank's tokens -> (output, this group's aux loss), as `moe(x, groups=1)` would give."""

    def __init__(
        self, moe: MoE, ep_group=None, dp_group=None, pad_to_capacity: bool = False, world=None
    ):
        """`world`: the group of every rank holding this layer (default: the whole world;
        under pipeline parallelism, the ranks of its stage)."""
        super().__init__()
        if not isinstance(pad_to_capacity, bool):
            raise ValueError(
                f"ExpertParallelMoE: pad_to_capacity={pad_to_capacity!r} must be True or False"
            )
        e, r = dist.get_world_size(ep_group), dist.get_rank(ep_group)
        d = dist.get_world_size(dp_group) if dp_group is not None else 1
        n = dist.get_world_size(world)
        if e * d != n:  # else some ranks' copies of an expert would never be reduced together
            where = f"the world of {n} ranks" if world is None else f"the {n} ranks of `world`"
            raise ValueError(
                f"ExpertParallelMoE: ep_group ({e} ranks) × dp_group ({d}) must "
                f"cover {where} (pass the dp_group of the ranks holding the "
                "same experts)"
            )
        if moe.num_experts % e:
            raise ValueError(
                f"ExpertParallelMoE: num_experts={moe.num_experts} must be "
                f"divisible by the expert-parallel group's size {e}"
            )
        check_grid(ep_group, dp_group, world)
        config = {
            "k": moe.k,
            "capacity_factor": moe.capacity_factor,
            "pad_to_capacity": pad_to_capacity,
        }
        verify_same_model(moe, world, "ExpertParallelMoE", config)
        broadcast_parameters(moe, world)  # ranks seeded differently still place one model's experts
        self.per = moe.num_experts // e
        self.first = r * self.per
        self.router = copy.deepcopy(moe.router)
        self.experts = copy.deepcopy(moe.experts[self.first : self.first + self.per])
        self.num_experts, self.k, self.capacity_factor = moe.num_experts, moe.k, moe.capacity_factor
        self.ep_group, self.dp_group, self.e = ep_group, dp_group, e
        self.pad_to_capacity = pad_to_capacity
        self.routing: Routing | None = None
        self.sent_rows: list[int] = []  # kept assignments sent to each rank, last forward
        self.agreed_tokens: int | None = None  # padded: the count every rank last routed

    def expert_names(self) -> dict[str, str]:
        """{local parameter name: the reference MoE's name}."""
        out = {}
        for name, _ in self.experts.named_parameters():
            i, rest = name.split(".", 1)
            out[f"experts.{name}"] = f"experts.{self.first + int(i)}.{rest}"
        return out

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.dim() != 2 or x.shape[1] != self.router.in_features:
            raise ValueError(
                f"ExpertParallelMoE: x must be [tokens, {self.router.in_features}]"
                f" (this rank's tokens); got {tuple(x.shape)}"
            )
        if self.pad_to_capacity and x.shape[0] != self.agreed_tokens:
            self._agree_on_tokens(x)
        logits = self.router(x)
        if not bool(torch.isfinite(logits.detach()).all()):
            self._refuse_non_finite(x, logits)
        r = self.routing = route(logits, self.k, self.capacity_factor)
        t, j = torch.nonzero(r.kept, as_tuple=True)
        ex = r.experts[t, j]
        order = torch.argsort(ex * r.capacity + r.slot[t, j])  # by expert, then priority
        t, j, ex = t[order], j[order], ex[order]
        if self.pad_to_capacity:
            back = self._padded(x, t, ex * r.capacity + r.slot[t, j], r.capacity)
        else:
            back = self._exact(x, t, ex)
        y = torch.zeros_like(x).index_add(0, t, back * r.gates[t, j, None])
        return y, r.aux

    def _agree_on_tokens(self, x) -> None:
        """Padded: every rank's token count, gathered over `ep_group` (off the ledger); a
        ValueError on every rank, naming them, when they differ."""
        dev = comm.group_device(self.ep_group)
        mine = torch.full((1,), x.shape[0], dtype=torch.int64, device=dev)
        everyone = torch.empty(self.e, dtype=torch.int64, device=dev)
        with comm.unrecorded():
            comm.all_gather(everyone, mine, group=self.ep_group, tag="ep padded tokens")
        counts = everyone.tolist()
        if len(set(counts)) > 1:
            ranks = (
                dist.get_process_group_ranks(self.ep_group)
                if self.ep_group is not None
                else list(range(self.e))
            )
            raise ValueError(
                f"ExpertParallelMoE(pad_to_capacity=True): ranks {ranks} of the ep_group routed "
                f"{counts} tokens; padded to capacity, every rank must route the same number "
                "(each sends E/e·C rows to each other rank, with C from its own count)"
            )
        self.agreed_tokens = counts[0]

    def _refuse_non_finite(self, x, logits) -> None:
        """Tell the peers in the exchange they wait in, so they raise too instead of waiting
        for rows that never come, then raise `route`'s error naming the tokens: counts of -1
        (exact), or a dispatch buffer of NaN (padded: no counts travel, and the peers check
        what they receive), its static shape, so the bytes stay the planned ones."""
        if self.pad_to_capacity:
            cap = capacity(x.shape[0], self.num_experts, self.k, self.capacity_factor)
            split = [self.per * cap] * self.e
            _all_to_all(
                x.new_full((self.num_experts * cap, x.shape[1]), float("nan")),
                split,
                split,
                self.ep_group,
                "ep dispatch",
            )
        else:
            bad = torch.full((self.e, self.per), -1, dtype=torch.int64, device=logits.device)
            comm.all_to_all(torch.empty_like(bad), bad, group=self.ep_group, tag="ep counts")
        route(logits, self.k, self.capacity_factor)

    def _exact(self, x, t, ex) -> torch.Tensor:
        """Only the kept rows travel: the counts first (so each rank knows what it receives),
        then the rows sorted by expert and priority, the local experts, and back."""
        counts = torch.bincount(ex, minlength=self.num_experts).view(self.e, self.per)
        got = torch.empty_like(counts)
        comm.all_to_all(got, counts.contiguous(), group=self.ep_group, tag="ep counts")
        if bool((got < 0).any()):
            ranks = torch.nonzero((got < 0).any(1)).flatten().tolist()
            raise ValueError(
                f"ExpertParallelMoE: ranks {ranks} of the ep_group routed tokens "
                "that are not finite (a NaN or inf in their input)"
            )
        send, recv = counts.sum(1).tolist(), got.sum(1).tolist()
        self.sent_rows = send
        rows = _AllToAll.apply(x[t], recv, send, self.ep_group, "ep dispatch")
        # received: by source rank, then local expert, then priority
        local = torch.arange(self.per, device=x.device).repeat(self.e)
        expert_of_row = torch.repeat_interleave(local, got.flatten())
        perm = torch.argsort(expert_of_row, stable=True)
        sizes = torch.bincount(expert_of_row, minlength=self.per).tolist()
        outs = [f(b) for f, b in zip(self.experts, rows[perm].split(sizes))]
        done = torch.cat(outs)[torch.argsort(perm)]  # back to the order they arrived in
        return _AllToAll.apply(done, send, recv, self.ep_group, "ep combine")

    def _padded(self, x, t, where, cap: int) -> torch.Tensor:
        """Static-shape dispatch: kept rows into their (expert, slot) of an [E·C, h] buffer,
        E/e·C rows to each rank, the local experts on e·C rows each, and back; the rows at
        `where` of what returns."""
        num, h = self.num_experts * cap, x.shape[1]
        buf = x.new_zeros(num, h).index_copy(0, where, x[t])
        split = [self.per * cap] * self.e
        self.sent_rows = split
        rows = _AllToAll.apply(buf, split, split, self.ep_group, "ep dispatch")
        rows = rows.view(self.e, self.per, cap, h)  # by source rank, local expert, slot
        sent_nan = rows.detach()[:, 0, 0, 0].isnan()  # a rank that refused its tokens
        if bool(sent_nan.any()):  # sends NaN in every row; a real row of NaN was refused there
            ranks = torch.nonzero(sent_nan).flatten().tolist()
            raise ValueError(
                f"ExpertParallelMoE: ranks {ranks} of the ep_group routed tokens "
                "that are not finite (a NaN or inf in their input)"
            )
        outs = [
            f(rows[:, i].reshape(-1, h)).view(self.e, 1, cap, h) for i, f in enumerate(self.experts)
        ]
        done = torch.cat(outs, dim=1).reshape(num, h)
        return _AllToAll.apply(done, split, split, self.ep_group, "ep combine")[where]

    def finish_gradient_sync(self) -> None:
        """Router gradients summed over every rank; experts' over `dp_group`."""
        for p in self.router.parameters():
            if p.grad is not None:
                comm.all_reduce(p.grad, tag="ep router grads")
        if self.dp_group is None or dist.get_world_size(self.dp_group) == 1:
            return
        grads = [p.grad for p in self.experts.parameters() if p.grad is not None]
        all_reduce_flat(grads, self.dp_group, "ep expert grads")


def check_grid(ep_group, dp_group, world=None) -> None:
    """Refuse, on every rank alike, groups that do not form an e × d grid of `world` (the
    ranks holding the layer; default all of them): each rank's ep_group and dp_group must
    meet in that rank alone, the groups must agree between their members, and a dp_group
    must join ranks at one place of their ep groups (holding the same experts). One small
    all-gather over `world` of every rank's two groups."""
    n, me = dist.get_world_size(), dist.get_rank()
    members = dist.get_process_group_ranks(world) if world is not None else list(range(n))
    dev = comm.group_device(world)
    rows = torch.zeros(2, n, dtype=torch.int64, device=dev)
    for i, group in enumerate((ep_group, dp_group)):
        ranks = (
            dist.get_process_group_ranks(group)
            if group is not None
            else (members if i == 0 else [me])
        )
        rows[i, ranks] = 1
    everyone = torch.empty(len(members) * 2 * n, dtype=torch.int64, device=dev)
    comm.all_gather(everyone, rows.reshape(-1), group=world, tag="ep grid check")
    everyone = everyone.view(len(members), 2, n).cpu()
    sets = {
        r: [frozenset(torch.nonzero(everyone[j, i]).flatten().tolist()) for i in (0, 1)]
        for j, r in enumerate(members)
    }
    for r, (ep, dp) in sets.items():
        problem = None
        if not (ep | dp) <= sets.keys():
            problem = (
                f"its groups reach ranks {sorted((ep | dp) - sets.keys())} outside the layer's"
            )
        elif ep & dp != {r}:
            problem = f"its ep_group {sorted(ep)} and dp_group {sorted(dp)} share {sorted(ep & dp)}"
        elif any(sets[o][0] != ep for o in ep) or any(sets[o][1] != dp for o in dp):
            problem = "its groups differ from what their other members passed"
        elif len({sorted(sets[o][0]).index(o) for o in dp}) > 1:
            problem = f"its dp_group {sorted(dp)} joins different places of their ep groups"
        if problem:
            raise ValueError(
                f"ExpertParallelMoE: ep_group and dp_group do not form a grid of the world: on "
                f"rank {r}, {problem} (each rank's two groups must meet in that rank alone; "
                "dp_group joins the ranks holding the same experts, one per ep group)"
            )
