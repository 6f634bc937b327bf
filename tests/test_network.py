"""2D-mesh and hierarchical all-reduce equal a flat all-reduce; the ledger's bytes per link
class equal `minidist.network.theory`; the α-β model puts the heavy share on the fast links."""

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

import minidist
from minidist import comm
from minidist.network import (
    Mesh2D,
    Nodes,
    bytes_by_link_class,
    hierarchical_all_reduce,
    mesh_groups,
    node_groups,
    theory,
    torus_all_reduce,
)

LENGTHS = (1, 7, 13, 64)  # 1 and 7, 13: fewer than and not a multiple of R·C (padding)


def _input(rank: int, length: int, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + length)
    return torch.randn(length, generator=g).to(dtype)


def _shapes_on_rank(grids: list[tuple[int, int]], node_sizes: list[int]):
    """Every shape on every length and dtype: (name, length, dtype, max diff, bytes by class)."""
    rank = dist.get_rank()
    layouts = [
        (f"mesh{r}x{c}-{inner}", Mesh2D(r, c), inner)
        for r, c in grids
        for inner in ("row", "column")
    ]
    layouts += [(f"nodes{g}", Nodes(g), "intra") for g in node_sizes]
    out = []
    for dtype in (torch.float32, torch.float64):
        for length in LENGTHS:
            expected = _input(rank, length, dtype)
            comm.all_reduce(expected)
            for name, layout, inner in layouts:
                x = _input(rank, length, dtype)
                with comm.record() as ledger:
                    if isinstance(layout, Nodes):
                        hierarchical_all_reduce(x, layout)
                    else:
                        torus_all_reduce(x, layout, inner=inner)
                diff = float((x - expected).abs().max())
                out.append((name, length, dtype, diff, bytes_by_link_class(ledger, layout)))
    return out


@pytest.mark.parametrize(
    "world, grids, node_sizes", [(4, [(2, 2)], [2]), (8, [(2, 4), (4, 2)], [2, 4])]
)
def test_two_level_all_reduce_equals_flat_and_theory(world, grids, node_sizes):
    results = minidist.launch(_shapes_on_rank, world, grids, node_sizes, timeout_s=60)
    for rank, rows in enumerate(results):
        for name, length, dtype, diff, sent in rows:
            # float32: the sum is taken in another order (chunks by row, then by column):
            # a few ulps of values of order sqrt(N); float64 the same at 1e-12.
            tol = 1e-5 if dtype == torch.float32 else 1e-12
            assert diff < tol, (rank, name, length, dtype, diff)
            size = dtype.itemsize
            if name.startswith("mesh"):
                r, c = map(int, name[4:].split("-")[0].split("x"))
                inner = name.split("-")[1]
                outer = "column" if inner == "row" else "row"
                n_in, n_out = (c, r) if inner == "row" else (r, c)
            else:
                inner, outer = "intra", "inter"
                n_in = int(name[5:])
                n_out = world // n_in
            expect = theory.two_level_bytes(length, n_in, n_out, size)
            assert sent == {inner: expect["inner"], outer: expect["outer"]}, (rank, name)
            # same total as a flat ring on the padded tensor
            padded = sum(expect.values())
            flat = theory.flat_bytes(length, world, size)
            assert padded >= flat
            if length % world == 0:
                assert padded == pytest.approx(flat, rel=1e-12)


def test_link_class_bytes_formulas():
    # 4 rows × 8 columns, row-inner, 4096 float32: row links carry 2·7/8, columns 2·3/4 / 8
    b = theory.two_level_bytes(4096, inner_size=8, outer_size=4)
    assert b == {"inner": 2 * 7 / 8 * 4096 * 4, "outer": 2 * 3 / 4 * 4096 * 4 / 8}
    assert b["inner"] + b["outer"] == pytest.approx(theory.flat_bytes(4096, 32))
    assert b["inner"] > b["outer"]  # the inner direction carries the heavy share


def test_heavy_traffic_goes_on_the_faster_direction():
    fast, slow = theory.Link(1e-6, 100e9), theory.Link(1e-6, 25e9)
    for rows, cols in ((4, 8), (8, 4), (4, 4)):
        for numel in (10**6, 10**8):
            times = theory.predict_times(numel, rows, cols, row=fast, column=slow)
            assert theory.fastest(times) == "row-inner", (rows, cols, numel, times)
            times = theory.predict_times(numel, rows, cols, row=slow, column=fast)
            assert theory.fastest(times) == "column-inner", (rows, cols, numel, times)
    # small messages, equal links: latency decides, 2(C-1)+2(R-1) steps beat 2(N-1)
    same = theory.Link(5e-6, 50e9)
    times = theory.predict_times(16, 4, 4, row=same, column=same)
    assert times["row-inner"] < times["flat"]
    # huge messages on equal links: the bandwidth terms are the same bytes at the same speed
    times = theory.predict_times(10**9, 4, 4, row=same, column=same)
    assert times["row-inner"] == pytest.approx(times["flat"], rel=1e-3)


def test_groups_and_bad_grids():
    assert mesh_groups(8, 2, 4) == {
        "row": [[0, 1, 2, 3], [4, 5, 6, 7]],
        "column": [[0, 4], [1, 5], [2, 6], [3, 7]],
    }
    assert node_groups(8, 4) == {
        "intra": [[0, 1, 2, 3], [4, 5, 6, 7]],
        "inter": mesh_groups(8, 2, 4)["column"],
    }
    with pytest.raises(ValueError, match=r"rows=3 × cols=2 = 6 ranks .* world_size=8"):
        mesh_groups(8, 3, 2)
    with pytest.raises(ValueError, match="rows must be an int >= 1, got 0"):
        mesh_groups(8, 0, 2)
    with pytest.raises(ValueError, match="node_size=3"):
        node_groups(8, 3)


def _bad_mesh():
    Mesh2D(3, 2)


def test_bad_mesh_on_a_world_is_named():
    with pytest.raises(minidist.RankFailedError, match="rows=3 × cols=2"):
        minidist.launch(_bad_mesh, 4, timeout_s=30)


# -- worked examples with published link figures (minidist.network.published) ---------------

SIZES = [10.0**k for k in range(3, 11)]  # 1 kB .. 10 GB
ALPHAS = (0.5e-6, 1e-6, 5e-6, 10e-6)  # α is assumed, not published: the choices must hold


def test_published_figures():
    from minidist.network import published as pub

    tpu, a100, h100 = pub.tpu_v3_slice(), pub.dgx_cluster("A100"), pub.dgx_cluster("H100")
    assert tpu.rows * tpu.cols == 512 and tpu.row == tpu.column
    assert tpu.row.bandwidth_bytes_per_s == 82e9  # 656 Gbit/s
    assert (a100.row.bandwidth_bytes_per_s, a100.column.bandwidth_bytes_per_s) == (300e9, 25e9)
    assert (h100.row.bandwidth_bytes_per_s, h100.column.bandwidth_bytes_per_s) == (450e9, 50e9)
    # the pod's published all-reduce bandwidth, 340 TB/s, is 1024 chips × 4 links × ~83 GB/s
    assert 1024 * 4 * tpu.row.bandwidth_bytes_per_s == pytest.approx(340e12, rel=0.02)
    with pytest.raises(ValueError, match="generation must be one of"):
        pub.dgx_cluster("V100")


@pytest.mark.parametrize("generation", ["A100", "H100"])
@pytest.mark.parametrize("alpha", ALPHAS)
def test_dgx_hierarchical_wins_and_tensor_parallel_goes_inside_the_node(generation, alpha):
    from minidist.network import published as pub

    for nodes in (2, 4, 16):
        system = pub.dgx_cluster(generation, nodes, nvlink_alpha_s=alpha, ib_alpha_s=alpha)
        for size in SIZES:
            times = pub.shape_times(system, size)
            assert theory.fastest(times) == "row-inner", (nodes, size, times)  # hierarchical
        # tensor parallelism (8 ranks, a layer's activations) on NVLink, not InfiniBand
        assert pub.tensor_parallel_direction(system, 8, 16e6) == "row"
        # large messages: the flat ring moves its 2(N-1)/N·S over InfiniBand, the hierarchical
        # one 1/8 of it: at least 4x slower on either generation
        times = pub.shape_times(system, 1e10)
        assert times["flat"] > 4 * times["row-inner"]


@pytest.mark.parametrize("alpha", ALPHAS)
def test_tpu_two_dimensions_win_on_latency_and_tie_on_bandwidth(alpha):
    from minidist.network import published as pub

    tpu = pub.tpu_v3_slice(alpha_s=alpha)
    n, steps_2d = tpu.rows * tpu.cols, 2 * (tpu.rows - 1) + 2 * (tpu.cols - 1)
    crossover = pub.latency_bandwidth_crossover(tpu)
    assert crossover == n * alpha * 82e9
    for size in SIZES:
        times = pub.shape_times(tpu, size)
        assert theory.fastest(times) != "flat"
        # equal links: the two orders move the same bytes at the same speed (to the padding)
        assert times["row-inner"] == pytest.approx(times["column-inner"], rel=1e-3)
        if size <= crossover / 100:  # latency-bound: the ratio of the step counts
            assert times["flat"] / times["row-inner"] == pytest.approx(
                2 * (n - 1) / steps_2d, rel=0.05
            )
        if size >= crossover * 100:  # bandwidth-bound: the same bytes per rank
            assert times["flat"] / times["row-inner"] == pytest.approx(1.0, rel=0.05)
    assert pub.tensor_parallel_direction(tpu, 16, 16e6) == "either"


@settings(max_examples=100, deadline=None)
@given(numel=st.integers(1, 10_000), inner=st.integers(1, 8), outer=st.integers(1, 8))
def test_padding_is_to_the_next_multiple_of_the_whole_world(numel, inner, outer):
    """Every rank's chunk of the outer all-reduce must be equal: the tensor is padded to a
    multiple of I·O (not of I alone), by less than I·O elements."""
    from minidist.network.all_reduce import padded_numel

    padded = padded_numel(numel, inner, outer)
    assert padded % (inner * outer) == 0
    assert numel <= padded < numel + inner * outer
