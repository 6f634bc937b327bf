"""The simulator against the rules its docstring states, step by step, over ranges of stages,
micro-batches, costs and latencies (issue 27): each step starts when its rank is free and its
dependency has ended, plus the link latency only when the dependency ran on another rank (so
ZB-V's hand-off between the two chunks of rank p-1 costs none)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.pipeline import schedule, simulate
from minidist.pipeline.schedules import virtual_stage

KINDS = [
    ("1f1b", 1, "loop"),
    ("gpipe", 1, "loop"),
    ("interleaved", 2, "loop"),
    ("zb-h1", 1, "loop"),
    ("zb-v", 2, "v"),
]


@settings(max_examples=80, deadline=None)
@given(
    st.sampled_from(KINDS),
    st.integers(1, 4),
    st.integers(1, 6),
    st.floats(0.5, 2.0),
    st.floats(0.5, 2.0),
    st.floats(0.0, 2.0),
    st.floats(0.01, 3.0),
)
def test_every_step_starts_when_its_rank_and_its_input_are_ready(kind, p, m, f, b, w, latency):
    name, v, placement = kind
    if name == "interleaved" and m % p:
        m = p  # interleaving runs micro-batches in groups of p
    steps = schedule(name, p, m, v if name == "interleaved" else 1)
    split = any(s[0] == "W" for stage in steps for s in stage)
    timeline = simulate(steps, f, b, w if split else 0.0, latency, placement)
    total = p * v
    vkind = "zb-v" if placement == "v" else "interleaved"

    def rank_of(vs):
        return vs % p if placement == "loop" else min(vs, 2 * p - 1 - vs)

    ends = {}
    for s, stage in enumerate(timeline.stages):
        for step, _, end in stage:
            c = step[2] if len(step) > 2 else 0
            ends[(step[0], step[1], virtual_stage(vkind, s, c, p))] = end
    for s, stage in enumerate(timeline.stages):
        free = 0.0
        for step, start, end in stage:
            op, i = step[0], step[1]
            vs = virtual_stage(vkind, s, step[2] if len(step) > 2 else 0, p)
            if op == "F":
                need = None if vs == 0 else ("F", i, vs - 1)
            elif op == "B":
                need = ("F", i, vs) if vs == total - 1 else ("B", i, vs + 1)
            else:
                need = ("B", i, vs)
            ready = 0.0
            if need is not None:
                ready = ends[need] + (0.0 if rank_of(need[2]) == rank_of(vs) else latency)
            assert abs(start - max(free, ready)) < 1e-9, (name, p, m, step)
            free = end
