"""Which ranks share a link class: the rows and columns of an R×C mesh, the nodes of a cluster.

Rank r of an R×C mesh sits at row r // C, column r % C (row-major, as a TPU slice or
`torch.arange(world).view(R, C)` numbers it). A row group holds the C ranks of one row and
talks over row links; a column group holds the R ranks of one column and talks over column
links. A cluster of nodes of G ranks is the same grid read differently: a node is a row of
G consecutive ranks (intra-node links, NVLink), and the ranks with the same local index on
every node form an inter-node group (the network between nodes).

`mesh_groups` and `node_groups` are pure arithmetic; `Mesh2D` and `Nodes` make the groups
on a world (every rank must construct them, with the same arguments: group creation is
collective) and say which link class a ledger record travelled on. The native equivalent is
`torch.distributed.device_mesh.init_device_mesh("cpu", (R, C))`.
"""

from __future__ import annotations

import torch.distributed as dist

from .. import comm
from ..comm import Ledger


def _check_grid(who: str, world_size: int, rows: int, cols: int, names: tuple[str, str]):
    for name, value in zip(("world_size", *names), (world_size, rows, cols)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{who}: {name} must be an int >= 1, got {value!r}")
    if rows * cols != world_size:
        raise ValueError(
            f"{who}: a grid of {names[0]}={rows} × {names[1]}={cols} = {rows * cols} ranks "
            f"is not the world of world_size={world_size} ranks"
        )


def mesh_groups(world_size: int, rows: int, cols: int) -> dict[str, list[list[int]]]:
    """{"row": the R row groups (C ranks each), "column": the C column groups (R ranks each)}."""
    _check_grid("mesh_groups", world_size, rows, cols, ("rows", "cols"))
    return {
        "row": [list(range(r * cols, (r + 1) * cols)) for r in range(rows)],
        "column": [list(range(c, world_size, cols)) for c in range(cols)],
    }


def node_groups(world_size: int, node_size: int) -> dict[str, list[list[int]]]:
    """{"intra": one group per node of `node_size` consecutive ranks, "inter": one group per
    local index, the ranks holding it on every node}."""
    if not isinstance(node_size, int) or node_size < 1 or world_size % node_size:
        raise ValueError(
            f"node_groups: node_size must be an int >= 1 dividing world_size={world_size}, "
            f"got node_size={node_size!r}"
        )
    groups = mesh_groups(world_size, world_size // node_size, node_size)
    return {"intra": groups["row"], "inter": groups["column"]}


class TwoLevelLayout:
    """Groups of two link classes made on the current world; this rank's pair of them."""

    inner_class: str
    outer_class: str

    def __init__(self, groups: dict[str, list[list[int]]]):
        world, rank = dist.get_world_size(), dist.get_rank()
        self.ranks = groups
        self.groups: dict[str, object] = {}
        self.mine: dict[str, list[int]] = {}
        self._class_of: dict[tuple[int, ...], str] = {}
        for kind, lists in groups.items():
            for ranks in lists:
                group = comm.new_group(ranks, kind) if len(ranks) < world else None
                self._class_of[tuple(ranks)] = kind
                if rank in ranks:
                    self.groups[kind], self.mine[kind] = group, ranks

    def group(self, kind: str):
        """The torch.distributed group of `kind` this rank is in (None: the whole world)."""
        return self.groups[kind]

    def size(self, kind: str) -> int:
        return len(self.mine[kind])

    def link_class(self, group_ranks: tuple[int, ...]) -> str:
        """The link class a collective on `group_ranks` travels on ("world" for any other)."""
        return self._class_of.get(tuple(group_ranks), "world")


class Mesh2D(TwoLevelLayout):
    """An R×C mesh (or torus) of ranks: `group("row")` and `group("column")` for this rank."""

    inner_class, outer_class = "row", "column"

    def __init__(self, rows: int, cols: int):
        _check_grid("Mesh2D", dist.get_world_size(), rows, cols, ("rows", "cols"))
        self.rows, self.cols = rows, cols
        super().__init__(mesh_groups(dist.get_world_size(), rows, cols))

    @property
    def coords(self) -> tuple[int, int]:
        """(row, column) of this rank."""
        return divmod(dist.get_rank(), self.cols)


class Nodes(TwoLevelLayout):
    """Nodes of `node_size` ranks: `group("intra")` (this node), `group("inter")` (this local
    index on every node)."""

    inner_class, outer_class = "intra", "inter"

    def __init__(self, node_size: int):
        self.node_size = node_size
        super().__init__(node_groups(dist.get_world_size(), node_size))
        self.nodes = dist.get_world_size() // node_size


def bytes_by_link_class(ledger: Ledger, layout: TwoLevelLayout) -> dict[str, float]:
    """Ring bytes this rank sent per link class (the layout's two, plus "world" for others)."""
    out = {layout.inner_class: 0.0, layout.outer_class: 0.0}
    for rec in ledger.records:
        kind = layout.link_class(rec.group_ranks)
        out[kind] = out.get(kind, 0.0) + rec.ring_bytes
    return out
