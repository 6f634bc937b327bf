"""Pipeline schedules as data: for each stage, the ordered list of its compute steps.

A step is a tuple: ("F", i) forward of micro-batch i, ("B", i) its backward, and for the
schedules that split backward, ("B", i) computes only the input gradient and ("W", i) the
weight gradient; interleaved schedules add the model chunk: ("F", i, c). One list drives
the engine, the simulator, the Gantt charts and the tests.

- GPipe (Huang et al. 2019, section 2.2): every forward, then every backward: m
  micro-batches alive on every stage.
- 1F1B (PipeDream's one-forward-one-backward order, Narayanan et al. 2019, "PipeDream:
  Generalized Pipeline Parallelism for DNN Training", SOSP), flushed at the end of each batch
  as PipeDream-Flush (Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN
  Training", section 3.2): stage r runs min(p-r-1, m) warm-up forwards, then alternates one
  forward and one backward, then drains: at most min(p-r, m) micro-batches alive. The same
  bubble, (p-1)/(m+p-1), far less memory.
- Interleaved 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
  GPU Clusters", section 2.2): v model chunks per rank (stage r holds chunks r, r+p, ...),
  bubble (p-1)/(v·m); m must be a multiple of p. Stage r warms up with (v-1)·p + 2(p-1-r)
  forwards, then alternates, also when m = p: today's rule in megatron-core
  (`get_pp_rank_microbatches` in megatron/core/pipeline_parallel/schedules.py, with
  `microbatch_group_size_per_vp_stage` = p) and torch 2.13's `ScheduleInterleaved1F1B`
  (`_get_warmup_ops`). The megatron-core wheels 0.5.0 to 0.9.0 ran every forward first when
  m = p (the rule is gone from 0.10.0): the same bubble, but every stage then holds all v·m
  chunk activations.
- ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", section 2.1): 1F1B with
  backward split into B (input gradient, on the critical path) and W (weight gradient, free
  to move); stage r runs its W steps r backward steps late, in arrival order (W_i after
  B_(i+r), the last r after the last B), so the backward chain never waits behind a weight
  gradient: bubble (p-1)(F + B - W) instead of (p-1)(F + B + W). The order is torch 2.13's
  `ScheduleInterleavedZeroBubble` with one chunk per rank and the authors' `WeightGradStore`
  queue (first in, first out): stage 3 of 4 at m = 8 runs ... B3 W0 F4 B4 W1 ...
- ZB-V (Qi et al. 2024, arXiv:2401.10241, the ZB-V schedule; torch's
  `ScheduleZBVZeroBubble`): 2 chunks per rank placed in a V, rank r holding virtual stages
  r and 2p-1-r, so the first and the last virtual stage share rank 0 and the turn at rank
  p-1 needs no message. Backward split as in ZB-H1; with F = B = W the only idle time
  left is the fill, p-1 chunk forwards per rank (`theory.bubble_fraction`), and no rank
  holds more than 1F1B's first stage does.
- DualPipeV (DeepSeek-AI 2024, arXiv:2412.19437, section 3.2.1, cut in half into a V by Sea
  AI Lab; torch's `ScheduleDualPipeV`): ZB-V's placement, and in the steady state each
  chunk's forward runs overlapped with the other chunk's full backward, so that one's
  all-to-all hides behind the other's compute. A full backward is ("B", i, c) followed by
  ("W", i, c); an overlapped pair is a forward marked `OVERLAP`, ("F", i, c, "&"), then the
  backward (B and W) it overlaps with, as the next steps: an engine without overlap runs
  them one after the other, the simulator as one block. It needs m >= 2p.
"""

from __future__ import annotations

KINDS = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipev")
V_SHAPED = ("zb-v", "dualpipev")  # two chunks per rank, rank r holding r and 2p-1-r
SPLIT_BACKWARD = ("zb-h1", "zb-v", "dualpipev")  # B: the input gradient only, W apart
OVERLAP = "&"  # the 4th field of a forward that overlaps with the backward after it


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
    if kind == "dualpipev" and microbatches < 2 * stages:
        raise ValueError(
            f"schedule: dualpipev needs microbatches={microbatches} >= 2 × stages = "
            f"{2 * stages} (both chunks' pipelines full before the overlapped pairs)"
        )
    build = {
        "gpipe": _gpipe,
        "1f1b": _one_f_one_b,
        "zb-h1": _zb_h1,
        "zb-v": _zb_v,
        "dualpipev": dualpipe_v,
    }[kind]
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
    # the later the stage, the sooner its backward must pass on: stage r runs each W r
    # backward steps late, in arrival order (the W of B_i after B_(i+r)), so B steps reach
    # the stages before it without waiting behind weight gradients; the last r at the end
    lag, pending, steps = min(r, m), [], []
    for step in _one_f_one_b(r, p, m):
        steps.append(step)
        if step[0] == "B":
            pending.append(step[1])
            if len(pending) > lag:
                steps.append(("W", pending.pop(0)))
    return steps + [("W", i) for i in pending]


def _interleaved(r: int, p: int, m: int, v: int) -> list[tuple]:
    total = m * v

    def forward(k: int) -> tuple:  # the k-th forward of this rank: groups of p micro-batches
        chunk = (k // p) % v
        return ("F", (k // (p * v)) * p + k % p, chunk)

    def backward(k: int) -> tuple:
        chunk = v - 1 - (k // p) % v
        return ("B", (k // (p * v)) * p + k % p, chunk)

    # the later stages start alternating sooner: two forwards fewer per stage towards the end
    warmup = min((v - 1) * p + 2 * (p - 1 - r), total)
    steps = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        steps += [forward(warmup + k), backward(k)]
    return steps + [backward(k) for k in range(total - warmup, total)]


def forward_only(kind: str, stages: int, microbatches: int, virtual: int = 1) -> list[list[tuple]]:
    """Every stage's steps for an evaluation: no backward, so nothing to interleave. Each
    rank runs ("F", i, c) for micro-batch i = 0, 1, ... and, within one, its chunks in the
    order of their virtual stages (c = 0 first, in a loop as in a V), so the whole pipeline
    runs the micro-batches in the order (i, virtual stage) and a rank's blocking receive
    always waits on a forward that its neighbour runs next (Megatron-LM's schedules with
    `forward_only=True`; torch's `PipelineScheduleSingle.eval`)."""
    chunks = 2 if kind in V_SHAPED else virtual
    schedule(kind, stages, microbatches, virtual)  # the same checks of the sizes
    steps = [("F", i, c) for i in range(microbatches) for c in range(chunks)]
    return [list(steps) for _ in range(stages)]


def virtual_stage(kind: str, stage: int, chunk: int, stages: int) -> int:
    """Which of the v·p virtual stages chunk `chunk` of stage `stage` is: a loop (chunk c
    holds c·p + r, interleaved) or, for ZB-V and DualPipeV, a V (chunk 0 holds r, chunk 1
    2p-1-r)."""
    if kind in V_SHAPED:
        return stage if chunk == 0 else 2 * stages - 1 - stage
    return chunk * stages + stage


def _zb_v(r: int, p: int, m: int) -> list[tuple]:
    """Stage r of ZB-V: ("F" | "B" | "W", micro-batch, chunk). The rule fills the V with at
    least 2p-1 micro-batches; with fewer, the missing ones' steps are left out."""
    n = max(2 * p - 1, m)
    done = {(op, c): 0 for op in "FBW" for c in (0, 1)}
    steps = []

    def run(*ops):
        for op, c in ops:
            steps.append((op, done[op, c], c))
            done[op, c] += 1

    # warm-up: down the V on chunk 0, then chunk 1 comes back up to meet it
    run(*[("F", 0)] * (2 * (p - r) - 1))
    for _ in range(r):
        run(("F", 1), ("F", 0))
    for _ in range(p - r):
        run(("F", 1), ("B", 1), ("W", 1))
    # steady state: a forward, an input gradient and a weight gradient of each chunk
    while done["F", 1] < done["F", 0] or done["F", 0] < n:
        if done["F", 0] < n:
            run(("F", 0))
        run(("B", 0), ("W", 0), ("F", 1), ("B", 1), ("W", 1))
    # cool-down: input gradients first (the critical path), the weight gradients last
    for _ in range(r):
        run(("B", 0), ("B", 1))
    for _ in range(p - r):
        run(("B", 0), ("W", 0))
    run(*[("W", 1)] * (done["B", 1] - done["W", 1]))
    run(*[("W", 0)] * (done["B", 0] - done["W", 0]))
    return [step for step in steps if step[1] < m]


def steps_together(steps: list[tuple], at: int) -> int:
    """How many steps from `at` run as one: 1, or an overlapped pair's forward, its B and,
    for a full backward, that B's W (2 or 3)."""
    step = steps[at]
    if len(step) < 4 or step[3] != OVERLAP:
        return 1
    after = steps[at + 2] if at + 2 < len(steps) else None
    full = after is not None and after[0] == "W" and after[1:3] == steps[at + 1][1:3]
    return 3 if full else 2


def dualpipe_v(r: int, p: int, m: int) -> list[tuple]:
    """Rank r of DualPipeV (m >= 2p): ("F" | "B" | "W", micro-batch, chunk[, OVERLAP])."""
    done = {(op, c): 0 for op in "FBW" for c in (0, 1)}
    steps: list[tuple] = []
    weights: list[tuple] = []  # input gradients whose weight gradient waits, oldest first

    def forward(c: int, overlap: bool = False) -> None:
        steps.append(("F", done["F", c], c) + ((OVERLAP,) if overlap else ()))
        done["F", c] += 1

    def backward(c: int, full: bool = True) -> None:
        i = done["B", c]
        steps.append(("B", i, c))
        done["B", c] += 1
        (steps if full else weights).append(("W", i, c))

    def weight() -> None:
        if weights:
            steps.append(weights.pop(0))

    def pair(f: int, b: int) -> None:  # chunk f's forward overlapped with chunk b's backward
        forward(f, overlap=True)
        backward(b)

    # warm-up: down the V on chunk 0, then chunk 1 comes back up beside it
    for _ in range(2 * (p - r - 1)):
        forward(0)
    for _ in range(r + 1):
        forward(0)
        forward(1)
    for _ in range(p - r - 1):  # the first chunk-1 backwards, zero-bubble style
        backward(1, full=False)
        weight()
        forward(1)
    # steady state: two overlapped pairs, F0 with B1 and F1 with B0; the turn of the V
    # (rank p-1) runs its first F0 and B1 apart, B1 waiting on that very F0's F1
    for k in range(m - 2 * p + r + 1):
        if k == 0 and r == p - 1:
            forward(0)
            backward(1)
        else:
            pair(0, 1)
        pair(1, 0)
    for _ in range(p - r - 1):  # chunk 0's forwards are done
        backward(1)
        pair(1, 0)
    # cool-down: the remaining backwards, their weight gradients deferred from halfway on
    # (odd ranks defer one step sooner) to fill the wait for the next input gradient
    deferred = False
    for k in range(r + 1):
        deferred = deferred or (k == (r + 1) // 2 and r % 2 == 1)
        backward(1, full=not deferred)
        deferred = deferred or (k == (r + 1) // 2 and r % 2 == 0)
        backward(0, full=not deferred)
    for _ in range(p - r - 1):
        weight()
        backward(0, full=False)
    for _ in range(r + 1):
        weight()
    return steps
