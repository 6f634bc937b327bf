"""DualPipe as data (DeepSeek-AI 2024, arXiv:2412.19437, section 3.2.1, Figure 5).

Two copies of the model run through the same p ranks in opposite directions: rank r holds
stage r of the forward copy (direction 0, fed at rank 0) and stage p-1-r of the reverse
copy (direction 1, fed at rank p-1), m/2 micro-batches each. A step is lesson 09's
("F" | "B" | "W", micro-batch of its direction, direction[, OVERLAP]), a full backward a B
then its W, an overlapped forward-and-backward pair a marked forward then that backward.

Rank r and rank p-1-r run the same order with the directions swapped, and that order is
DualPipeV's (`pipeline.schedules.dualpipe_v`) on p/2 ranks with m/2 micro-batches: fold
DualPipe's two pipelines in the middle and each half is DualPipeV's V (the "cut in half"
the reference's README credits to Sea AI Lab). The simulator runs it with
`placement="dual"`. `overlapped_pair` lays out Figure 4: inside one pair, one chunk's
all-to-all runs while the other chunk computes. Nothing here executes a model: lesson 17's
engine runs DualPipeV, the steps of a pair one after the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from ..pipeline.schedules import OVERLAP, dualpipe_v, virtual_stage


def dualpipe(stages: int, microbatches: int) -> list[list[tuple]]:
    """The steps of every rank, rank 0 first: p even, m even and m >= 2p."""
    p, m = stages, microbatches
    for name, value in (("stages", p), ("microbatches", m)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 2 or value % 2:
            raise ValueError(
                f"dualpipe: {name}={value!r} must be an even int >= 2 (two directions: "
                "half the ranks and half the micro-batches each)"
            )
    if m < 2 * p:
        raise ValueError(f"dualpipe: microbatches={m} must be >= 2 × stages = {2 * p}")
    return [_rank(r, p, m) for r in range(p)]


def _rank(r: int, p: int, m: int) -> list[tuple]:
    half = min(r, p - 1 - r)  # the distance to the nearer end: where the V's rank sits
    flip = r >= p // 2  # the second half of the ranks meets the reverse direction first
    return [(op, i, c ^ flip, *rest) for op, i, c, *rest in dualpipe_v(half, p // 2, m // 2)]


@dataclass(frozen=True)
class Segment:
    """One piece of an overlapped pair on one stream: `part` is "attention", "dispatch",
    "mlp", "combine" or "pp" (the send to the next rank), `op` "F", "B" or "W"."""

    stream: str  # "compute" or "communication"
    part: str
    op: str
    start: float
    end: float


# Figure 4's order on each stream. The backward chunk starts from the gradient of its last
# combine (an all-to-all), so communication opens with it while the forward chunk's
# attention computes; each all-to-all of one chunk then runs beside the other's compute.
_COMPUTE = (
    ("attention", "F"),
    ("mlp", "B"),
    ("mlp", "W"),
    ("mlp", "F"),
    ("attention", "B"),
    ("attention", "W"),
)
_COMMUNICATION = (
    ("combine", "B"),
    ("dispatch", "F"),
    ("dispatch", "B"),
    ("combine", "F"),
    ("pp", "B"),
    ("pp", "F"),
)
WAITS_FOR = {  # what each piece waits for: the chunk's previous piece
    ("dispatch", "F"): ("attention", "F"),
    ("mlp", "F"): ("dispatch", "F"),
    ("combine", "F"): ("mlp", "F"),
    ("pp", "F"): ("combine", "F"),
    ("mlp", "B"): ("combine", "B"),
    ("mlp", "W"): ("mlp", "B"),
    ("dispatch", "B"): ("mlp", "B"),
    ("attention", "B"): ("dispatch", "B"),
    ("attention", "W"): ("attention", "B"),
    ("pp", "B"): ("attention", "B"),
}


def overlapped_pair(
    attention: float = 1.0,
    mlp: float = 1.0,
    dispatch: float = 1.0,
    combine: float = 1.0,
    pp: float = 0.25,
) -> list[Segment]:
    """One forward chunk (attention, dispatch, MLP, combine) overlapped with one backward
    chunk (the same in reverse, each compute split into B and W, as long as its forward: a
    full backward is twice a forward), on a compute and a communication stream: each piece
    starts when its stream is free and its chunk's previous piece has ended."""
    times = {"attention": attention, "mlp": mlp, "dispatch": dispatch, "combine": combine, "pp": pp}
    ends: dict[tuple[str, str], float] = {}
    out, free = [], {"compute": 0.0, "communication": 0.0}
    queues = {"compute": list(_COMPUTE), "communication": list(_COMMUNICATION)}
    while any(queues.values()):
        before_round = len(out)
        for stream, queue in queues.items():
            while queue and (WAITS_FOR.get(queue[0]) is None or WAITS_FOR[queue[0]] in ends):
                part, op = queue.pop(0)
                before = WAITS_FOR.get((part, op))
                start = max(free[stream], ends[before] if before else 0.0)
                ends[part, op] = free[stream] = start + times[part]
                out.append(Segment(stream, part, op, start, start + times[part]))
        if len(out) == before_round:
            raise ValueError("overlapped_pair: the streams' orders wait on each other")
    return sorted(out, key=lambda s: (s.stream, s.start))


def serial_time(segments: list[Segment]) -> float:
    """The pair's time without overlap: every piece one after the other."""
    return sum(s.end - s.start for s in segments)


def torch_dualpipev_order(p: int, m: int, r: int) -> list[tuple]:
    """Rank r's actions of torch's `ScheduleDualPipeV` (computed without a process group) in
    lesson 09's form: an OVERLAP_F_B flattened as its forward (marked) then its backward, a
    FULL_BACKWARD as B then W."""
    from torch.distributed.pipelining.schedules import ScheduleDualPipeV
    from torch.distributed.pipelining.schedules import _ComputationType as T

    names = {T.FORWARD: "F", T.BACKWARD_INPUT: "B", T.BACKWARD_WEIGHT: "W"}
    chunk = {virtual_stage("dualpipev", r, c, p): c for c in (0, 1)}

    def flat(action) -> list[tuple]:
        if action.computation_type == T.OVERLAP_F_B:
            f, b = action.sub_actions
            return [("F", f.microbatch_index, chunk[f.stage_index], OVERLAP), *flat(b)]
        i, c = action.microbatch_index, chunk[action.stage_index]
        if action.computation_type == T.FULL_BACKWARD:
            return [("B", i, c), ("W", i, c)]
        return [(names[action.computation_type], i, c)]

    actions = ScheduleDualPipeV._calculate_single_rank_operations(
        SimpleNamespace(pp_group_size=p, _n_microbatches=m), r
    )
    return [step for a in actions if a is not None for step in flat(a)]
