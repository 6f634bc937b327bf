"""The composed model's training state as `Piece`s (lesson 18's contract), and the
comparison contract rebuilt from them.

What a rank holds of a parameter `w` (one-process name, e.g. `blocks.1.attn.qkv.weight`):
- a **box** from tensor parallelism (its rows or columns; the fused Q, K, V weight is three
  boxes, one per section; vocabulary padding is outside every box);
- of each box, the **flat range** that falls in this rank's ZeRO chunk (the dense
  parameters' flat buffer over dp_shard × cp, the experts' over their ep_shard group).

`state_pieces()` lists, for every such part, the float32 master weights (`w`), the Adam
states (`optim.w.exp_avg`, `optim.w.exp_avg_sq`: slices of the chunk's state) and the step
count (`optim.w.step`, a 0-d tensor); each `tensor` is a view of the live storage, so a
loader writes into them and then calls `finish_state_load()` (which gathers the master
weights into the model's parameters, as after an optimizer step). Owners: dp_replicate
rank 0, and for what tensor parallelism replicates, tp rank 0; the tied embedding's copy on
the last stage never owns (the first stage's does).
"""

from __future__ import annotations

import torch

from .. import comm
from ..pieces import Piece


class StatePieces:
    """Mixed into `ComposedParallel` (needs `optimizers`, `_named`, `grid`, `chunks`)."""

    def _tied_copies(self) -> dict[str, str]:
        """{the last stage's copy of a tied embedding: the embedding's name}."""
        return self.tied_copy

    def _param_pieces(self, which: str) -> list[Piece]:
        named, out = self._named(), []
        tp_rank = self.grid.coord["tp"]
        replica0 = self.grid.coord["dp_replicate"] == 0
        tied_copy = self._tied_copies()
        for names, opt in self.optimizers:
            lay, state = opt.layout, opt.inner.state[opt.shard]
            source = {
                "param": opt.shard.detach(),
                "grad": opt.shard.grad,
                "exp_avg": state["exp_avg"],
                "exp_avg_sq": state["exp_avg_sq"],
            }[which]
            if source is None:
                continue
            for i, n in enumerate(names):
                p, off = named[n], lay.offsets[i]
                name = tied_copy.get(n, n)
                split = getattr(p, "tp_split", None)
                owner = replica0 and n not in tied_copy and (split is not None or tp_rank == 0)
                for a, cnt, offsets, sizes, shape in _sections(p, split, tp_rank):
                    if hasattr(p, "ep_box"):  # this rank's experts of the stacked tensor
                        start, experts = p.ep_box
                        offsets = (start, *offsets[1:])
                        shape = (experts, *shape[1:])
                    lo = max(off + a, lay.start)
                    hi = min(off + a + cnt, lay.start + lay.chunk)
                    if lo >= hi:
                        continue
                    key = name if which in ("param", "grad") else f"optim.{name}.{which}"
                    out.append(
                        Piece(
                            key,
                            shape,
                            offsets,
                            sizes,
                            (lo - off - a, hi - off - a),
                            source[lo - lay.start : hi - lay.start],
                            owner,
                        )
                    )
        return out

    def _step_pieces(self) -> list[Piece]:
        out = []
        tp_rank = self.grid.coord["tp"]
        replica0 = self.grid.coord["dp_replicate"] == 0
        for names, opt in self.optimizers:
            lay, step = opt.layout, opt.inner.state[opt.shard]["step"]
            for i, n in enumerate(names):
                off, numel = lay.offsets[i], lay.numels[i]
                if off + numel <= lay.start or off >= lay.start + lay.chunk:
                    continue
                tied_copy = self._tied_copies()
                first_here = lay.start <= off < lay.start + lay.chunk
                owner = replica0 and n not in tied_copy and first_here and tp_rank == 0
                name = tied_copy.get(n, n)
                out.append(Piece(f"optim.{name}.step", (), (), (), None, step, owner))
        return out

    def _buffer_pieces(self) -> list[Piece]:
        """A transformers model's persistent buffers (state the model trains without a
        gradient, e.g. DeepSeek-V3's routing bias), whole on every rank of the stage that
        holds them; owned by the stage's first rank."""
        if not self.hf:
            return []
        owner, out = self.grid.rank_in("stage") == 0, []
        for chunk in self.chunks:
            for name, module in chunk.named_modules():
                for b, t in module.named_buffers(recurse=False):
                    if b not in module._non_persistent_buffers_set:
                        key = self._reference_name(chunk, f"{name}.{b}")
                        shape = tuple(t.shape)
                        out.append(Piece(key, shape, (0,) * len(shape), shape, None, t, owner))
        return out

    def state_pieces(self) -> list[Piece]:
        """Parameters (float32 master), Adam states and a transformers model's persistent
        buffers, as this rank's `Piece`s."""
        out = self._param_pieces("param")
        for which in ("exp_avg", "exp_avg_sq"):
            out += self._param_pieces(which)
        return out + self._step_pieces() + self._buffer_pieces()

    @torch.no_grad()
    def finish_state_load(self) -> None:
        """After writing into `state_pieces()`' tensors: the parameters from the masters."""
        for _, opt in self.optimizers:
            opt.gather()

    def _assemble(self, pieces: list[Piece]) -> dict[str, torch.Tensor]:
        mine = [
            (
                q.name,
                q.global_shape,
                q.box_offsets,
                q.box_sizes,
                q.flat,
                q.tensor.detach().float().cpu().clone(),
            )
            for q in pieces
            if q.owner
        ]
        everyone = [None] * self.grid.dims.world_size
        comm.all_gather_object(everyone, mine, tag="full-state")
        return assemble([p for part in everyone for p in part])

    def full_parameters(self) -> dict[str, torch.Tensor]:
        return self._assemble(self._param_pieces("param"))

    def full_buffers(self) -> dict[str, torch.Tensor]:
        """A transformers model's persistent buffers, whole, from the stage that holds each
        (as the checkpoint gathers them); float32."""
        return self._assemble(self._buffer_pieces())

    def grad_pieces(self) -> list[Piece]:
        """The reduced gradients (after `finish_gradient_sync`) as this rank's `Piece`s."""
        return self._param_pieces("grad")

    def full_grads(self) -> dict[str, torch.Tensor]:
        """The reduced gradients (after `finish_gradient_sync`), whole."""
        return self._assemble(self.grad_pieces())

    def full_optimizer_state(self) -> dict[str, torch.Tensor]:
        """{"optim.<name>.exp_avg" | ".exp_avg_sq" | ".step": the whole tensor}."""
        pieces = self._param_pieces("exp_avg") + self._param_pieces("exp_avg_sq")
        return self._assemble(pieces + self._step_pieces())


def _sections(p: torch.Tensor, split, r: int):
    """(local flat start, element count, box offsets, box sizes, global shape) of each box
    `p` holds: one, or one per fused section; vocabulary padding rows left out."""
    shape = tuple(p.shape)
    if split is None:
        yield 0, p.numel(), (0,) * len(shape), shape, shape
        return
    dim, blocks, full = split
    glob = tuple(full if d == dim else s for d, s in enumerate(shape))
    local = shape[dim] // blocks
    inner = p.numel() // shape[0] if dim == 0 else None
    for b in range(blocks):
        start = b * (full // blocks) + r * local
        valid = max(0, min(local, (b + 1) * (full // blocks) - start))
        offsets = tuple(start if d == dim else 0 for d in range(len(shape)))
        sizes = tuple(valid if d == dim else s for d, s in enumerate(shape))
        if dim == 0:
            yield b * local * inner, valid * inner, offsets, sizes, glob
        else:  # a column split: the local tensor is the box
            yield 0, p.numel(), offsets, sizes, glob


def assemble(parts) -> dict[str, torch.Tensor]:
    """Whole tensors from (name, global shape, box offsets, box sizes, flat, tensor) parts."""
    out: dict[str, torch.Tensor] = {}
    for name, shape, offsets, sizes, flat, t in parts:
        full = out.setdefault(name, torch.zeros(shape, dtype=t.dtype, device="cpu"))
        box = full[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))]
        if flat is None:
            box.copy_(t.view(box.shape))
        else:
            values = box.clone().reshape(-1)
            values[flat[0] : flat[1]] = t
            box.copy_(values.view(box.shape))
    return out
