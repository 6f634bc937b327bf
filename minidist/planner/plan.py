"""`plan(model, layout, cluster)`: memory, bytes, bubble and step time of one layout, and
`sweep` / `best` over every layout of a world.

Step time (Williams et al. 2009's roofline per device, Hockney's α-β per link):

    compute   = max(FLOPs / FLOP rate, HBM bytes / memory bandwidth)   (which one: the bound)
    exposed   = tp all-reduces + pp sends + cp ring sends + ep all-to-alls (critical path)
              + max(0, dp-group collectives - the compute they overlap)
                (backward for ZeRO 0-2's gradient reductions, all of it for FSDP's
                 prefetched gathers)
    step      = (compute + tp + pp + cp + ep) / (1 - bubble) + exposed dp

HBM bytes per step are a lower bound: parameters read in forward and backward, gradients
written, the optimizer reading and writing its states once, activations written once and
read once. Collectives are counted per call (α each) with lesson 00's ring bytes.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from ..collectives.cost_model import CostModel
from ..sequence_parallel import theory as sp_theory
from . import activations, experts, predict
from .divisors import divisors
from .hardware import Cluster
from .spec import Layout, ModelSpec


@dataclass(frozen=True)
class StepTime:
    compute_s: float
    memory_s: float
    tp_s: float
    pp_s: float
    dp_s: float
    bubble: float
    total_s: float
    bound: str  # "communication" when it outlasts the compute it should hide behind, else
    # "bubble" when idle time exceeds compute, else the larger roofline term: "compute"/"memory"
    cp_s: float = 0.0  # context parallelism's ring (lesson 15), on the critical path as tp's
    ep_s: float = 0.0  # expert parallelism's all-to-alls (lesson 16), on it too


@dataclass
class Plan:
    model: ModelSpec
    layout: Layout
    memory: dict[str, float]  # bytes per rank on the device, by kind (`predict.KINDS`)
    traffic: dict[tuple[str, str], float]  # (collective, group) -> bytes sent per step
    bubble: float
    flops: float  # per rank per step
    time: StepTime | None = None
    bus: dict[str, float] = field(default_factory=dict)  # device <-> host (<-> disk) bytes
    by_link: dict[str, float] = field(default_factory=dict)  # link class -> bytes (a cluster)

    @property
    def memory_per_rank(self) -> float:
        return sum(self.memory.values())

    @property
    def model_state_bytes(self) -> float:
        return sum(v for k, v in self.memory.items() if k != "activations")

    @property
    def bytes_sent(self) -> float:
        return sum(self.traffic.values())

    @property
    def activations_planned(self) -> bool:
        """False for a `ModelSpec(params=P)`: without layers, hidden size and sequence there
        are no activations to plan (`memory["activations"]` is 0, not a prediction). For MoE
        blocks they are an upper bound (`activations_bound`)."""
        return self.model.has_config

    @property
    def activations_bound(self) -> bool:
        """True where `memory["activations"]` is an upper bound, not an equality: MoE blocks,
        whose kept assignments depend on the routing (every slot counted filled)."""
        return bool(self.model.experts)

    def fits(self, memory_bytes: float) -> bool:
        """Model states and activations within `memory_bytes` per rank (with MoE blocks the
        activations' upper bound: a fit for any routing). A plan without activations cannot
        say (`fits_model_states` says whether the states alone do)."""
        if not self.activations_planned:
            raise ValueError(
                f"Plan.fits: a ModelSpec(params={self.model.params}) plans no activations, so "
                "whether the layout fits is unknown; give the GPT's configuration, or ask "
                "fits_model_states (a necessary condition only)"
            )
        return self.memory_per_rank <= memory_bytes

    def fits_model_states(self, memory_bytes: float) -> bool:
        """Whether the model states alone fit: necessary, not sufficient."""
        return self.model_state_bytes <= memory_bytes

    def lines(self) -> list[str]:
        """`name=value` lines, as the benches print them (activations "not_planned" for a
        spec with only a parameter count)."""
        out = [f"model_state_bytes_per_rank={int(round(self.model_state_bytes))}"]
        for kind, value in self.memory.items():
            planned = kind != "activations" or self.activations_planned
            out.append(f"{kind}_bytes_per_rank={int(round(value)) if planned else 'not_planned'}")
        if self.activations_bound:
            out.append("activations_bound=upper")  # MoE: every expert slot counted filled
        out.append(f"bytes_sent_per_rank_per_step={int(round(self.bytes_sent))}")
        for (op, group), value in self.traffic.items():
            out.append(f"bytes_sent[{op}@{group}]={int(round(value))}")
        for link, value in self.by_link.items():
            out.append(f"bytes_sent[{link}]={int(round(value))}")
        for direction, value in self.bus.items():
            out.append(f"bus_bytes[{direction}]={int(round(value))}")
        if self.model.has_config:
            out.append(f"bubble={self.bubble:.4f}")
        if self.time is not None:
            out.append(f"step_time_s={self.time.total_s:.6g}")
            out.append(f"bound={self.time.bound}")
        return out


def plan(
    model: ModelSpec, layout: Layout, cluster: Cluster | None = None, world: int | None = None
) -> Plan:
    """What rank 0 of `layout` holds, sends and (with a `cluster`) how long a step takes."""
    layout.check(model, world)
    memory = predict.model_states(model, layout)
    memory["activations"] = activations.activations(model, layout)
    result = Plan(
        model,
        layout,
        memory,
        predict.traffic(model, layout),
        predict.bubble(layout),
        predict.flops_per_step(model, layout),
        bus=predict.bus_traffic(model, layout),
    )
    if cluster is not None:
        result.time = step_time(result, cluster)
        result.by_link = bytes_by_link_class(result, cluster)
    return result


def calls_per_step(model: ModelSpec, layout: Layout) -> dict[str, int]:
    """Collective calls rank 0 makes per step on each group kind (each pays α once). On tp,
    per micro-batch: the g of each attention and MLP in forward (again when recomputed),
    their f in backward, the embedding's g; on the last stage also the head's f and the
    cross entropy's three (Shoeybi et al. 2019, section 3)."""
    m = layout.microbatches
    tp = 0
    if layout.tp > 1:
        layers = activations.stage_layers(model, layout)
        per_layer = 6 if layout.recompute else 4  # recomputation repeats the forward's two
        last = layout.pp == 1  # rank 0 is the last stage too: head's f, the loss's three
        tp = (per_layer * layers + 1 + 4 * last) * m
    if layout.sp:  # lesson 14's collectives per micro-batch, and the replicated gradients'
        ops = sp_theory.collectives_per_step(model.layers, 1, model.seq, model.hidden)
        tp = sum(count for _, _, count, _ in ops) * m + 1
    pp = 2 * m if layout.pp > 1 else 0
    # the ring: c-1 sends of K, V forward, c-1 backward and c of their gradients, per layer
    cp = (3 * layout.cp - 2) * model.layers * m if layout.cp > 1 else 0
    if model.experts:
        return {"tp": tp, "pp": pp, "cp": cp, **experts.calls(model, layout)}
    if layout.zero == 3:
        dp = 3 * len(model.fsdp_units())
    else:
        dp = len(predict.zero_buckets(model, layout)) * (1 if layout.zero == 0 else 2)
    return {"tp": tp, "pp": pp, "cp": cp, "ep": 0, "dp": dp if layout.dp * layout.cp > 1 else 0}


def _group_link(cluster: Cluster, layout: Layout, group: str) -> CostModel:
    """The ranks a group spans, (stride, size), in Megatron-LM's order: tp innermost, then
    cp, dp, pp ("dp-cp": the data × context ranks that reduce gradients together; "ep": a
    block of ep data-parallel ranks, "edp": the dp/ep ranks holding the same experts)."""
    t, c, d = layout.tp, layout.cp, layout.dp
    f = predict.shard_group(layout)
    span = {
        "tp": (1, t),
        "cp": (t, c),
        "dp": (t * c, d),
        "dp-cp": (t, c * d),
        "shard": (t * c, f),
        "replicate": (t * c * f, d // f),
        "pp": (t * c * d, layout.pp),
        "ep": (t * c, layout.ep),
        "edp": (t * c * layout.ep, d // layout.ep),
    }[group]
    return cluster.link(*span)


def bytes_by_link_class(p: Plan, cluster: Cluster) -> dict[str, float]:
    """{"intra-node": bytes, "inter-node": bytes} rank 0 sends per step: each group's traffic
    on the links its ranks span (`Cluster.link`; a torus's one level counts as intra)."""
    out = {"intra-node": 0.0, "inter-node": 0.0}
    for (_, group), sent in p.traffic.items():
        inside = _group_link(cluster, p.layout, group) is cluster.intra
        out["intra-node" if inside else "inter-node"] += sent
    return out


def step_time(p: Plan, cluster: Cluster) -> StepTime:
    """The module docstring's model, for plan `p` on `cluster`."""
    dev = cluster.device
    compute = p.flops / dev.flops
    mem = p.memory
    hbm = 4 * mem["params"] + 2 * mem["grads"] + 2 * mem["optimizer"] + 2 * mem["activations"]
    memory_s = hbm / dev.memory_bandwidth
    calls = calls_per_step(p.model, p.layout)
    by_kind = {"tp": 0.0, "pp": 0.0, "cp": 0.0, "ep": 0.0, "dp": 0.0}
    sends = set()
    for (_, group), sent in p.traffic.items():
        kind = group if group in ("tp", "pp", "cp", "ep") else "dp"
        link = _group_link(cluster, p.layout, group)
        by_kind[kind] += sent / link.bandwidth_bytes_per_s
        if sent > 0:
            sends.add(kind)
    for kind in sends:  # α once per call
        group = "dp-cp" if kind == "dp" and p.layout.cp > 1 else kind
        by_kind[kind] += calls[kind] * _group_link(cluster, p.layout, group).alpha_s
    busy = max(compute, memory_s)
    # the ring waits for its blocks, the experts for their tokens
    critical = by_kind["tp"] + by_kind["pp"] + by_kind["cp"] + by_kind["ep"]
    pipelined = (busy + critical) / (1 - p.bubble)
    # ZeRO 0-2 reduce gradients while backward (2/3 of the FLOPs) runs; FSDP also gathers
    # each unit's parameters while the previous one computes, forward included.
    hidden_by = busy if p.layout.zero == 3 else busy * 2 / 3
    exposed_dp = max(0.0, by_kind["dp"] - hidden_by)
    total = pipelined + exposed_dp
    if by_kind["dp"] > hidden_by or critical > busy:
        bound = "communication"  # "How to Scale Your Model"'s test: T_comm > T_math
    elif pipelined * p.bubble > busy:
        bound = "bubble"
    else:
        bound = "compute" if compute >= memory_s else "memory"
    return StepTime(
        compute,
        memory_s,
        by_kind["tp"],
        by_kind["pp"],
        by_kind["dp"],
        p.bubble,
        total,
        bound,
        by_kind["cp"],
        by_kind["ep"],
    )


def layouts(model: ModelSpec, world: int, **fixed) -> list[Layout]:
    """Every dp × tp × pp of `world` with ZeRO 0-3 (0-1 with tp or pp) the model allows;
    `fixed` sets the other fields (global_batch, microbatches, precision, ...). A fixed
    `cp=c` leaves world / c ranks to the sweep; a fixed `sp=True` keeps the tp > 1 ones; a
    model with experts gets data parallelism with every ep dividing dp and E (or a fixed
    `ep`)."""
    out = []
    cp = fixed.get("cp", 1)
    if not isinstance(cp, int) or cp < 1 or world % cp:
        return out
    world //= cp  # the others split what context parallelism leaves
    sizes = divisors(world)
    tps, pps = [1], [1]  # a spec without configuration: data parallelism only
    if model.has_config and not model.experts:  # what `Layout.check` allows, up front
        tps = divisors(math.gcd(world, model.heads, model.hidden))
        pps = [p for p in sizes if p <= model.layers]
    for tp, pp in itertools.product(tps, pps):
        if world % (tp * pp):
            continue
        dp = world // (tp * pp)
        zeros = (0,) if model.experts else (0, 1) if tp > 1 or pp > 1 else (0, 1, 2, 3)
        eps = [1]
        if model.experts and "ep" not in fixed:  # every placement of the experts
            eps = divisors(math.gcd(dp, model.experts))
        for zero, ep in itertools.product(zeros, eps):
            try:
                extra = {} if ep == 1 else {"ep": ep}
                layout = Layout(dp=dp, tp=tp, pp=pp, zero=zero, **fixed, **extra)
                layout.check(model, world * cp)
            except ValueError:
                continue
            out.append(layout)
    return out


def sweep(model: ModelSpec, world: int, cluster: Cluster, **fixed) -> list[Plan]:
    """`plan` of every layout of `layouts(model, world, **fixed)` on `cluster`."""
    return [plan(model, layout, cluster) for layout in layouts(model, world, **fixed)]


def best(plans: list[Plan], memory_bytes: float) -> list[Plan]:
    """The plans that fit in `memory_bytes` per rank, fastest first."""
    fitting = [p for p in plans if p.fits(memory_bytes)]
    return sorted(fitting, key=lambda p: p.time.total_s if p.time else 0.0)


def frontier(plans: list[Plan]) -> list[Plan]:
    """Pareto-optimal plans: none other is both smaller per rank and faster."""
    ranked = sorted(plans, key=lambda p: (p.memory_per_rank, p.time.total_s))
    out, fastest = [], float("inf")
    for p in ranked:
        if p.time.total_s < fastest:
            out.append(p)
            fastest = p.time.total_s
    return out
