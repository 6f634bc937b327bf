"""How many micro-batches a composed test runs: the fewest that still run all of its layout."""


def lean_micro_batch(dims: dict, global_batch: int = 8) -> int:
    """The micro-batch size that leaves a layout the fewest micro-batches that still run
    everything it composes: 2 without a pipeline (gradients accumulated across
    micro-batches, each with its own valid tokens), 2·pp with one (1F1B's warm-up, steady
    phase and cool-down all run; DualPipeV's minimum; a multiple of pp, as the interleaved
    schedule needs). Fewer rows per data rank than that: micro-batches of one row.

    Every micro-batch repeats each tp, cp and pipeline collective, and on a 2-core machine
    gloo's small collectives are most of an 8-rank test's time: the Llama at tp 4 · cp 2
    took 20 core-s with 8 micro-batches of one row and 6 with 2 of four."""
    pp, rows = dims.get("pp", 1), _rows(dims, global_batch)
    want = 2 * pp if pp > 1 else 2
    for size in range(rows, 0, -1):
        if rows % size == 0 and rows // size >= want:
            return size
    return 1


def lean_microbatches(dims: dict, global_batch: int = 8) -> int:
    """How many micro-batches each data rank runs at `lean_micro_batch`."""
    return _rows(dims, global_batch) // lean_micro_batch(dims, global_batch)


def _rows(dims: dict, global_batch: int) -> int:
    """The rows of the global batch each data rank trains on."""
    return global_batch // (dims.get("dp_replicate", 1) * dims.get("dp_shard", 1))


def lean_runs(layouts: list[tuple[str, dict, dict]]) -> list[dict]:
    """On every rank: lesson 17's `run_rank` of each (model, dims, options), one after the
    other on one world, at `lean_micro_batch` unless the options name a micro-batch."""
    from minidist.compose.fixture import run_rank

    return [
        run_rank(name, dims, **{"micro_batch": lean_micro_batch(dims), **kw})
        for name, dims, kw in layouts
    ]
