"""Run a schedule on paper: when each step starts and ends, the bubble, micro-batches alive.

Each stage executes its steps in order; a step also waits for what it depends on:
F(i) on stage s for F(i) on stage s-1 (plus the link latency), B(i) on stage s for B(i) on
stage s+1 (the last stage for its own F(i)), W(i) for B(i) on the same stage. With
interleaved chunks, stage s of chunk c is virtual stage c·p + s; DualPipe's two directions
(`placement="dual"`) are two chains of p stages, chunk d of rank s being stage s of the
forward copy (d = 0) or p-1-s of the reverse one (d = 1). A forward marked as overlapped
(DualPipeV, DualPipe) runs with the backward steps after it as one block of `paired` time,
both results ready at its end. The bubble is the idle share of the stages' time until the
last step ends (Huang et al. 2019; Narayanan et al. 2021): (p-1)/(m+p-1) for GPipe and
1F1B with equal forward and backward times.
"""

from __future__ import annotations

from dataclasses import dataclass

from .schedules import steps_together, virtual_stage


@dataclass
class Timeline:
    """Per stage, (step, start, end) in execution order; plus what they add up to."""

    stages: list[list[tuple[tuple, float, float]]]

    @property
    def makespan(self) -> float:
        return max(end for steps in self.stages for _, _, end in steps)

    @property
    def bubble(self) -> float:
        """Idle time of all stages over stages × makespan."""
        busy = sum(end - start for steps in self.stages for _, start, end in steps)
        return 1 - busy / (len(self.stages) * self.makespan)

    def peak_in_flight(self) -> list[int]:
        """Per stage, the most micro-batches (× chunks) forwarded and not yet backwarded."""
        peaks = []
        for steps in self.stages:
            alive = peak = 0
            for step, _, _ in steps:
                alive += {"F": 1, "B": -1}.get(step[0], 0)
                peak = max(peak, alive)
            peaks.append(peak)
        return peaks

    def peak_held(self) -> list[int]:
        """Per stage, the most micro-batches (× chunks) whose activations it holds: from F to
        the last step that needs them, W where backward is split, B otherwise."""
        peaks = []
        for steps in self.stages:
            frees = "W" if any(step[0] == "W" for step, _, _ in steps) else "B"
            alive = peak = 0
            for step, _, _ in steps:
                alive += 1 if step[0] == "F" else -1 if step[0] == frees else 0
                peak = max(peak, alive)
            peaks.append(peak)
        return peaks


def simulate(
    steps: list[list[tuple]],
    forward: float = 1.0,
    backward: float = 1.0,
    weight: float = 0.0,
    latency: float = 0.0,
    placement: str = "loop",
    paired: float | None = None,
) -> Timeline:
    """Times of every step. With split backward (W steps), `backward` is B's and `weight` W's.
    `placement`: how chunks map to virtual stages, "loop" (interleaved: chunk c of stage s is
    c·p + s), "v" (ZB-V, DualPipeV: chunk 1 of stage s is 2p-1-s) or "dual" (DualPipe); a
    message between two virtual stages of one rank has no latency. `paired`: the time of an
    overlapped forward and backward (F&B), by default the sum of their steps' times."""
    if placement not in ("loop", "v", "dual"):
        raise ValueError(f"simulate: placement must be 'loop', 'v' or 'dual', got {placement!r}")
    p = len(steps)
    v = 1 + max((s[2] for stage in steps for s in stage if len(s) > 2), default=0)
    kind = "zb-v" if placement == "v" else "interleaved"

    def locate(s: int, step: tuple) -> tuple:
        """(micro-batch key, its stage in its chain, the chain's length, rank of a stage)."""
        c = step[2] if len(step) > 2 else 0
        if placement == "dual":  # stage k of direction c: rank k, or p-1-k going back

            def rank(k: int) -> int:
                return k if c == 0 else p - 1 - k

            return (c, step[1]), rank(s), p, rank
        return step[1], virtual_stage(kind, s, c, p), p * v, rank_of

    def rank_of(vs: int) -> int:
        return vs % p if placement == "loop" else min(vs, 2 * p - 1 - vs)

    cost = {"F": forward, "B": backward, "W": weight}
    done: dict[tuple, float] = {}  # (op, microbatch, virtual stage) -> end time
    position, clock = [0] * p, [0.0] * p
    out: list[list] = [[] for _ in range(p)]
    while any(position[s] < len(steps[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            if position[s] == len(steps[s]):
                continue
            block = steps[s][position[s] : position[s] + steps_together(steps[s], position[s])]
            keys, ready = [], 0.0
            for step in block:
                i, vs, total, ranks = locate(s, step)
                keys.append((step[0], i, vs))
                need = _ready(step[0], i, vs, total, done, latency, ranks)
                if need is None and step[0] == "W" and len(block) > 1:
                    need = 0.0  # the W of the pair's own B: the block's last part
                if need is None:
                    break
                ready = max(ready, need)
            else:
                start = max(clock[s], ready)
                work = sum(cost[step[0]] for step in block)
                scale = 1.0 if paired is None or len(block) == 1 else paired / work
                for step in block:
                    end = start + cost[step[0]] * scale
                    out[s].append((step, start, end))
                    start = end
                for key in keys:
                    done[key] = end
                clock[s] = end
                position[s] += len(block)
                progressed = True
        if not progressed:
            raise ValueError("simulate: the schedule deadlocks (a step waits for one never run)")
    return Timeline(out)


def _ready(
    op: str, i: int, vs: int, total: int, done: dict, latency: float, rank_of
) -> float | None:
    """When the step's dependency is met, or None if it has not run yet."""
    if op == "F":
        need = None if vs == 0 else ("F", i, vs - 1)
    elif op == "B":
        need = ("F", i, vs) if vs == total - 1 else ("B", i, vs + 1)
    else:
        need = ("B", i, vs)
    if need is None:
        return 0.0
    if need not in done:
        return None
    same_rank = rank_of(need[2]) == rank_of(vs)
    return done[need] + (0.0 if same_rank else latency)


def from_timestamps(timings: list[list[tuple[str, int, float, float]]]) -> Timeline:
    """A measured Timeline: per stage, the (op, microbatch, start, end) that
    `PipelineParallel.timings` recorded (perf_counter seconds, one clock for the forked ranks
    of one machine), shifted so that the earliest start is 0."""
    t0 = min(start for steps in timings for _, _, start, _ in steps)
    return Timeline([[((op, i), s - t0, e - t0) for op, i, s, e in steps] for steps in timings])
