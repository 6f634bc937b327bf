"""Lesson 12's entries in the tour (both packages: `minidist.parameter_server` and
`minidist.network` form one lesson; its course files live here).

- "parameter server (BSP)": S = 1 server and W = world - 1 workers (S = 1, W = 3 on the
  tour's 4 ranks) train the data-parallel fixture's MLP under BSP, against one process on the
  same global batches. Memory: the server's shard state (values, averaged gradient, momentum)
  against `theory.server_state_bytes`. Bytes: what the first worker pushes and pulls per step
  (gradients out, parameters in; headers, versions and the final pull left out) against
  `theory.worker_bytes_per_step`.
- "2D torus all-reduce": a 2×2 mesh on 4 ranks (R×C = the world), `torus_all_reduce` with
  row links inner, against `comm.all_reduce` of the same tensors. Bytes: rank 0's ring bytes
  on row plus column links, each class checked against `network.theory.two_level_bytes`.
  Memory: none. The bytes per link class go to `torus_bytes_per_link_class.png`.
- "hierarchical all-reduce": nodes of 2 ranks (`mesh_shape`'s columns), reduce-scatter inside
  the node, all-reduce across nodes, all-gather inside, against `comm.all_reduce`. Bytes:
  rank 0's intra- plus inter-node ring bytes, each class checked against `two_level_bytes`.
- "GeePS cache": the BSP row's workers compute through GeePS's parameter cache (`cache.py`,
  one layer prefetched), against one process. Memory: the device tier's peak resident bytes
  (measured from its buffers) against `theory.cache_peak_resident_bytes`, with every
  (phase, layer) of the walk checked against `theory.cache_resident_trace`. Bytes: host to
  device bytes per step against `theory.cache_bytes_moved_per_step`. The resident bytes per
  layer of one step go to `geeps_cache_resident_bytes.png`.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from .. import comm
from ..network import Mesh2D, bytes_by_link_class, torus_all_reduce
from ..network import theory as net_theory
from ..registry import TourRow, tour_row
from ..runtime import launch
from ..training import max_abs_diff
from . import keys, theory
from .fixture import ServerResult, WorkerResult, reference, train_on_rank

# float32: the server averages W slice gradients where one process takes one mean over the
# batch: a few ulps per step through 5 momentum steps (as tests/test_parameter_server.py).
PARAM_TOL, LOSS_TOL = 1e-5, 1e-5
TORUS_NUMEL = 1030  # not a multiple of R·C = 4: the padding is in the formula too
TORUS_TOL = 1e-5  # float32, the sum taken chunk by chunk in another order


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def worker_bytes_measured(result: WorkerResult, servers: int, steps: int) -> dict[str, float]:
    """{"pushed", "pulled"} per step from a worker's ledger: gradient and parameter values
    only (the pulls' versions and the final pull taken out, headers not counted)."""
    recs = result.ledger.records
    pushed = sum(r.payload_bytes for r in recs if r.op == "send" and r.tag == "push")
    pulled = sum(r.payload_bytes for r in recs if r.op == "recv" and r.tag == "pull")
    pulls = steps + 1  # one per clock and the final one
    return {
        "pushed": pushed / steps,
        "pulled": (pulled - pulls * servers * theory.VERSION_BYTES) / pulls,
    }


@tour_row("parameter server (BSP)", lesson=12)
def parameter_server_row(world_size: int, out_dir: Path) -> TourRow:
    from .plots import plot_ps_vs_all_reduce

    servers, workers = 1, max(1, world_size - 1)
    batch = 4 * workers  # an equal slice per worker
    results = launch(train_on_rank, servers + workers, servers, workers, "bsp", global_batch=batch)
    ref = reference(global_batch=batch)
    served = [r for r in results if isinstance(r, ServerResult)]
    trained = [r for r in results if isinstance(r, WorkerResult)]
    diff = max(max_abs_diff(w.params, ref.params) for w in trained)
    mean_losses = torch.tensor([w.losses for w in trained], device="cpu").mean(0)
    losses_ok = bool((mean_losses - torch.tensor(ref.losses, device="cpu")).abs().max() < LOSS_TOL)
    psi = sum(p.numel() for p in keys.trainable(_model()))
    steps = len(ref.losses)
    sent = worker_bytes_measured(trained[0], servers, steps)
    expect = theory.worker_bytes_per_step(psi)
    _save(plot_ps_vs_all_reduce(psi, workers), out_dir / "ps_vs_all_reduce_bytes.png")
    return TourRow(
        f"PS BSP S={servers} W={workers}",
        losses_ok and diff < PARAM_TOL and all(a.staleness == 0 for a in served[0].applied),
        diff,
        memory_per_rank=served[0].state_bytes,
        memory_theory=theory.server_state_bytes(psi, servers, 0),
        bytes_per_rank=sent["pushed"] + sent["pulled"],
        bytes_theory=float(expect["pushed"] + expect["pulled"]),
    )


def _model():
    from ..data_parallel.fixture import build

    return build("mlp").model


def _torus_input(rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1200 + rank)
    return torch.randn(TORUS_NUMEL, device="cpu", generator=g)


def torus_on_rank(rows: int, cols: int, inner: str = "row") -> tuple[float, dict[str, float]]:
    """(max |2D - flat all-reduce|, this rank's ring bytes per link class) on an R×C mesh."""
    mesh = Mesh2D(rows, cols)
    expected = _torus_input(dist.get_rank())
    comm.all_reduce(expected)
    x = _torus_input(dist.get_rank())
    with comm.record() as ledger:
        torus_all_reduce(x, mesh, inner=inner)
    return float((x - expected).abs().max()), bytes_by_link_class(ledger, mesh)


def mesh_shape(world_size: int) -> tuple[int, int]:
    """The squarest R×C = world (R <= C): 2×2 on 4 ranks, 2×4 on 8."""
    rows = max(r for r in range(1, int(world_size**0.5) + 1) if world_size % r == 0)
    return rows, world_size // rows


@tour_row("2D torus all-reduce", lesson=12)
def torus_row(world_size: int, out_dir: Path) -> TourRow:
    from .plots import plot_link_class_bytes

    rows, cols = mesh_shape(world_size)
    results = launch(torus_on_rank, world_size, rows, cols, "row")
    diff = max(d for d, _ in results)
    expect = net_theory.two_level_bytes(TORUS_NUMEL, cols, rows)
    theory_by_class = {"row": expect["inner"], "column": expect["outer"]}
    per_class_ok = all(
        {k: sent[k] for k in ("row", "column")} == theory_by_class and sent.get("world", 0) == 0
        for _, sent in results
    )
    sent = results[0][1]
    _save(
        plot_link_class_bytes({"row-inner": sent}, {"row-inner": theory_by_class}),
        out_dir / "torus_bytes_per_link_class.png",
    )
    return TourRow(
        f"torus {rows}x{cols} all-reduce",
        diff < TORUS_TOL and per_class_ok,
        diff,
        memory_per_rank=None,
        memory_theory=None,
        bytes_per_rank=sent["row"] + sent["column"],
        bytes_theory=expect["inner"] + expect["outer"],
    )


def all_reduce_shapes_on_rank(rows: int, cols: int, numel: int) -> dict[str, tuple]:
    """{shape: (max |shape - flat|, ring bytes per link class)} for the flat ring, row-inner
    and column-inner 2D all-reduce on an R×C mesh, and the hierarchical all-reduce with nodes
    of C ranks (the rows), all on the same inputs (notebook 12)."""
    from ..network import Nodes, hierarchical_all_reduce

    mesh, nodes = Mesh2D(rows, cols), Nodes(cols)
    g = torch.Generator().manual_seed(1200 + dist.get_rank())
    data = torch.randn(numel, device="cpu", generator=g)
    out = {}
    expected = data.clone()
    with comm.record() as ledger:
        comm.all_reduce(expected)
    out["flat"] = (0.0, {"world": ledger.total_ring_bytes()})
    for inner in ("row", "column"):
        x = data.clone()
        with comm.record() as ledger:
            torus_all_reduce(x, mesh, inner=inner)
        out[f"{inner}-inner"] = (
            float((x - expected).abs().max()),
            bytes_by_link_class(ledger, mesh),
        )
    x = data.clone()
    with comm.record() as ledger:
        hierarchical_all_reduce(x, nodes)
    out["hierarchical"] = (float((x - expected).abs().max()), bytes_by_link_class(ledger, nodes))
    return out


def hierarchical_on_rank(node_size: int) -> tuple[float, dict[str, float]]:
    """(max |hierarchical - flat all-reduce|, this rank's ring bytes per link class)."""
    from ..network import Nodes, hierarchical_all_reduce

    nodes = Nodes(node_size)
    expected = _torus_input(dist.get_rank())
    comm.all_reduce(expected)
    x = _torus_input(dist.get_rank())
    with comm.record() as ledger:
        hierarchical_all_reduce(x, nodes)
    return float((x - expected).abs().max()), bytes_by_link_class(ledger, nodes)


@tour_row("hierarchical all-reduce", lesson=12)
def hierarchical_row(world_size: int, out_dir: Path) -> TourRow:
    nodes, per_node = mesh_shape(world_size)
    results = launch(hierarchical_on_rank, world_size, per_node)
    diff = max(d for d, _ in results)
    expect = net_theory.two_level_bytes(TORUS_NUMEL, per_node, nodes)
    by_class = {"intra": expect["inner"], "inter": expect["outer"]}
    per_class_ok = all(
        {k: sent[k] for k in by_class} == by_class and sent.get("world", 0) == 0
        for _, sent in results
    )
    sent = results[0][1]
    return TourRow(
        f"hierarchical {nodes} nodes x {per_node}",
        diff < TORUS_TOL and per_class_ok,
        diff,
        memory_per_rank=None,
        memory_theory=None,
        bytes_per_rank=sent["intra"] + sent["inter"],
        bytes_theory=expect["inner"] + expect["outer"],
    )


CACHE_PREFETCH = 1  # layers prefetched by the tour's GeePS cache


@tour_row("GeePS cache", lesson=12)
def geeps_cache_row(world_size: int, out_dir: Path) -> TourRow:
    from .cache import layer_bytes
    from .plots import plot_cache_resident_bytes

    servers, workers = 1, max(1, world_size - 1)
    batch = 4 * workers
    results = launch(
        train_on_rank,
        servers + workers,
        servers,
        workers,
        "bsp",
        global_batch=batch,
        cache_prefetch=CACHE_PREFETCH,
    )
    ref = reference(global_batch=batch)
    trained = [r for r in results if isinstance(r, WorkerResult)]
    diff = max(max_abs_diff(w.params, ref.params) for w in trained)
    model = _model()
    per_layer = [layer_bytes(m) for m in model.layers]
    steps = len(ref.losses)
    trace = theory.cache_resident_trace(per_layer, CACHE_PREFETCH)
    walk_ok = all([e.__dict__ for e in w.cache_events] == trace * steps for w in trained)
    events = trained[0].cache_events
    psi_bytes = 4 * sum(p.numel() for p in keys.trainable(model))
    moved = theory.cache_bytes_moved_per_step(per_layer, psi_bytes)
    grads_ok = all(w.cache_moved_out == steps * moved["device_to_host"] for w in trained)
    _save(
        plot_cache_resident_bytes(events[: len(trace)], per_layer, CACHE_PREFETCH),
        out_dir / "geeps_cache_resident_bytes.png",
    )
    return TourRow(
        f"GeePS cache p={CACHE_PREFETCH} W={workers}",
        diff < PARAM_TOL and walk_ok and grads_ok,
        diff,
        memory_per_rank=max(e.resident_bytes for e in events),
        memory_theory=theory.cache_peak_resident_bytes(per_layer, CACHE_PREFETCH),
        bytes_per_rank=sum(e.moved_in for e in events) / steps,
        bytes_theory=float(moved["host_to_device"]),
    )
