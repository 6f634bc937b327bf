"""Pipeline schedules as data: for each stage, the ordered list of its compute steps.

A step is a tuple: ("F", i) forward of micro-batch i, ("B", i) its backward, and for the
schedules that split backward, ("B", i) computes only the input gradient and ("W", i) the
weight gradient; interleaved schedules add the model chunk: ("F", i, c). One list drives
the engine, the simulator, the Gantt charts and the tests.

- GPipe (Huang et al. 2019, section 2.2): every forward, then every backward: m
  micro-batches alive on every stage.
- 1F1B / PipeDream-Flush (Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN
  Training", section 3.2): stage r runs min(p-r-1, m) warm-up forwards, then alternates one
  forward and one backward, then drains: at most min(p-r, m) micro-batches alive. The same
  bubble, (p-1)/(m+p-1), far less memory.
- Interleaved 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
  GPU Clusters", section 2.2): v model chunks per rank (stage r holds chunks r, r+p, ...),
  bubble (p-1)/(v·m); m must be a multiple of p.
- ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", section 3): 1F1B with backward
  split into B (input gradient, on the critical path) and W (weight gradient, free to move);
  stage r postpones its first r W steps to the end, so the backward chain never waits
  behind a weight gradient: bubble (p-1)(F + B - W) instead of (p-1)(F + B + W).
"""

from __future__ import annotations

KINDS = ("gpipe", "1f1b", "interleaved", "zb-h1")


def schedule(kind: str, stages: int, microbatches: int, virtual: int = 1) -> list[list[tuple]]:
    """The steps of every stage, stage 0 first."""
    if kind not in KINDS:
        raise ValueError(f"schedule: kind must be one of {KINDS}, got {kind!r}")
    for name, value in (("stages", stages), ("microbatches", microbatches), ("virtual", virtual)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"schedule: {name}={value!r} must be an int >= 1")
    if virtual != 1 and kind != "interleaved":
        raise ValueError(
            f"schedule: virtual={virtual} (model chunks per stage) needs kind='interleaved'; "
            f"{kind!r} runs one chunk per stage (virtual=1)"
        )
    if kind == "interleaved":
        if virtual < 1 or microbatches % stages:
            raise ValueError(
                f"schedule: interleaved needs virtual >= 1 and microbatches={microbatches} a "
                f"multiple of stages={stages}"
            )
        return [_interleaved(r, stages, microbatches, virtual) for r in range(stages)]
    build = {"gpipe": _gpipe, "1f1b": _one_f_one_b, "zb-h1": _zb_h1}[kind]
    return [build(r, stages, microbatches) for r in range(stages)]


def _gpipe(r: int, p: int, m: int) -> list[tuple]:
    return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]


def _one_f_one_b(r: int, p: int, m: int) -> list[tuple]:
    warmup = min(p - r - 1, m)
    steps = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):  # steady state: one forward, one backward
        steps += [("F", warmup + i), ("B", i)]
    return steps + [("B", i) for i in range(m - warmup, m)]


def _zb_h1(r: int, p: int, m: int) -> list[tuple]:
    # the later the stage, the sooner its backward must pass on: stage r keeps r W steps
    # back, so B steps reach the stages before it without waiting behind weight gradients
    postponed = min(r, m)
    steps = []
    for step in _one_f_one_b(r, p, m):
        steps.append(step)
        if step[0] == "B" and step[1] >= postponed:
            steps.append(("W", step[1]))
    return steps + [("W", i) for i in range(postponed)]


def _interleaved(r: int, p: int, m: int, v: int) -> list[tuple]:
    total = m * v

    def forward(k: int) -> tuple:  # the k-th forward of this rank: groups of p micro-batches
        chunk = (k // p) % v
        return ("F", (k // (p * v)) * p + k % p, chunk)

    def backward(k: int) -> tuple:
        chunk = v - 1 - (k // p) % v
        return ("B", (k // (p * v)) * p + k % p, chunk)

    # Megatron-LM's rule: with m == p every step of a rank is a warm-up forward
    warmup = total if m == p else min((p - r - 1) * 2 + (v - 1) * p, total)
    steps = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        steps += [forward(warmup + k), backward(k)]
    return steps + [backward(k) for k in range(total - warmup, total)]
