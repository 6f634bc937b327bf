"""The pipeline bubble and the activation memory of each schedule, as functions.

Huang et al. 2019 (GPipe) and Narayanan et al. 2021: with p stages, m micro-batches and
equal forward/backward times the idle share is (p-1)/(m+p-1) for GPipe and 1F1B alike;
interleaving v chunks per rank divides the bubble by v, (p-1)/(v·m) of the ideal time;
ZB-H1 (Qi et al. 2024, section 2.1) leaves (p-1)(F + B - W) of idle time instead of
(p-1)(F + B + W); ZB-V (the same paper's V-shaped schedule) only the fill of p-1 chunk
forwards. Every `bubble_fraction` is the idle share of the stages' time: idle / (p × makespan).
GPipe keeps the activations of m micro-batches on every stage; 1F1B at most min(p-r, m)
on stage r.
"""

from __future__ import annotations


def bubble_fraction(stages: int, microbatches: int, kind: str = "1f1b", virtual: int = 1) -> float:
    """Idle share of the pipeline's time (equal forward and backward times)."""
    p, m = stages, microbatches
    if kind in ("gpipe", "1f1b"):
        return (p - 1) / (m + p - 1)
    if kind == "interleaved":
        ideal = m  # forward + backward of m micro-batches, in chunk-sized units: v·m
        return (p - 1) / virtual / (ideal + (p - 1) / virtual)
    if kind == "zb-h1":  # F = B = W = 1
        # m >= p: m(F + B + W) of work and (p-1)(F + B - W) idle per stage; m < p: the
        # pipeline never fills, the last micro-batch's forward through p stages, its
        # backward back, the m-1 before it on the way: p(F + B) + (m-1)(F + B) + W
        makespan = max(3 * m + p - 1, 2 * m + 2 * p - 1)
        return 1 - 3 * m / makespan
    if kind == "zb-v":  # 2 chunks per rank, each chunk's F = B = W = 1 (half a stage's)
        # 6m of work per rank; m large: the fill, p-1 chunk forwards; m small: the V's
        # length, forwards down and up and input gradients back, 4p-2, plus 4 per micro-batch
        makespan = max(6 * m + p - 1, 4 * m + 4 * p - 2)
        return 1 - 6 * m / makespan
    raise ValueError(f"bubble_fraction: no closed form for kind={kind!r}")


def peak_microbatches(
    stage: int, stages: int, microbatches: int, kind: str = "1f1b", virtual: int = 1
) -> int:
    """Micro-batches whose activations stage `stage` holds at most at once (with interleaving:
    chunk activations, each 1/v of a stage's layers).

    Interleaved 1F1B: the warm-up forwards (v-1)·p + 2(p-1-r) and the first steady-state
    forward, at most all v·m (megatron-core's and torch's rule, `schedules.py`).

    ZB-H1 holds a micro-batch until its W (the weight gradient needs the layers' inputs):
    stage r keeps min(p-r, m) between F and B, as 1F1B, plus the W steps it keeps waiting
    (`postponed_weight_steps`), min(p, m) in all, the first stage's 1F1B peak (Qi et al.
    2024, section 2.1: ZB-H1 keeps 1F1B's peak memory)."""
    if kind == "gpipe":
        return microbatches
    if kind == "1f1b":
        return min(stages - stage, microbatches)
    if kind == "zb-h1":
        return min(stages, microbatches)
    if kind == "interleaved":
        warmup = (virtual - 1) * stages + 2 * (stages - 1 - stage)
        return min(warmup + 1, virtual * microbatches)
    raise ValueError(f"peak_microbatches: no closed form for kind={kind!r}")


def peak_held(steps: list[tuple], chunk_bytes: list[float]) -> float:
    """The most bytes one rank holds while it walks `steps` (its list from
    `schedules.schedule`): a forward adds its chunk's `chunk_bytes` (chunk 0 where a step
    names none), the step that last needs them frees them, the backward or, where the
    schedule splits it out (ZB-H1, ZB-V, DualPipeV), the W step. Lessons 13 and 17 plan
    activations with it; the engine counts the same way."""
    frees = "W" if any(step[0] == "W" for step in steps) else "B"
    alive = peak = 0
    for op, _, *chunk in steps:
        c = chunk[0] if chunk else 0
        if op == "F":
            alive += chunk_bytes[c]
            peak = max(peak, alive)
        elif op == frees:
            alive -= chunk_bytes[c]
    return peak


def postponed_weight_steps(stage: int, stages: int, microbatches: int) -> int:
    """ZB-H1: how many backward steps late stage `stage` runs each W, and so how many W
    steps it runs after its last B (Qi et al. 2024, section 2.1): r on stage r (all m if
    m <= r), so that the B chain passing back through the stages never waits behind a
    weight gradient. The W run in arrival order (torch's `ScheduleInterleavedZeroBubble`):
    W_i after B_(i+r). Each waiting W keeps its micro-batch's activations alive longer
    (`peak_microbatches(..., "zb-h1")`)."""
    if not 0 <= stage < stages:
        raise ValueError(f"postponed_weight_steps: stage={stage} must be in [0, {stages})")
    return min(stage, microbatches)


def p2p_bytes_sent_per_step(
    stage: int, stages: int, batch: int, seq: int, hidden: int, vocab: int, element_bytes: int = 4
) -> float:
    """Bytes stage `stage` sends per step, whatever the schedule (GPipe, 1F1B, ZB-H1).

    Forward: each micro-batch's output activation, b/m·s·h elements, to the next stage (all
    but the last), m of them: b·s·h. Backward: the gradient of each micro-batch's input, the
    same size, to the previous stage (all but the first). After the last micro-batch the
    first and last stages all-reduce the tied embedding's gradient (V·h) over their group of
    two, 2(2-1)/2·V·h on a ring (Narayanan et al. 2021, section 3; Megatron-LM's embedding
    group). The broadcast of the loss and the comparison contract's gathers are not counted.
    """
    from ..comm import ring_bytes

    activations = batch * seq * hidden * element_bytes  # m micro-batches of b/m·s·h
    sent = activations * (stage < stages - 1) + activations * (stage > 0)
    if stages > 1 and stage in (0, stages - 1):
        sent += ring_bytes("all_reduce", vocab * hidden * element_bytes, 2)
    return sent
