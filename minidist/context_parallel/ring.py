"""Ring attention: causal attention over a sequence split across c ranks.

Liu et al. 2023, "Ring Attention with Blockwise Transformers for Near-Infinite Context",
section 3. Each rank keeps its queries and passes its key/value block around a ring: at
step i it holds the block of rank r - i, computes the attention of its queries on it, and
merges the partial result with the online softmax (Milakov & Gimelshein 2018): with m the
log-sum-exp of the scores seen so far and o the attention over them,

    m' = log(e^m + e^m_blk),    o' = o·e^(m - m') + o_blk·e^(m_blk - m').

After c steps every query has seen every key; a rank sent its own block c-1 times, (c-1)/c
of the whole sequence's K and V. The transfer overlaps the computation, as section 3 has it
("fully overlapping the communication"): a step posts the send of the block it holds and the
receive of the next before computing on it, and waits after. Causal masking compares global
positions; a chunk pair whose keys all follow its queries is skipped (no work), which is why
the zig-zag split balances the ranks. Backward (as FlashAttention-2, Dao 2023, section
3.1.2) recomputes each block's probabilities from the saved log-sum-exp; the K/V blocks go
around the ring again, each with its gradient accumulator, which returns to its owner after
c hops. The blocks' transfer overlaps as in forward; the accumulator's does not (it leaves
once this rank has added its share; ring-flash-attention overlaps it with the next block by
accumulating each block's share in a fresh buffer, which changes the order of the sums). Saved for
backward: this rank's q, k, v, output and log-sum-exp, 1/c of the whole sequence's.
"""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

from .. import comm
from .split import check_split, chunks_of, positions, rank_chunks


def hidden(q_pos, k_pos, window: int | None = None) -> torch.Tensor:
    """[queries, keys]: True where a query may not see a key: the key follows it, or (a
    sliding window of w, Beltagy et al. 2020; Mistral's) lies w or more positions before."""
    out = k_pos[None, :] > q_pos[:, None]
    if window is not None:
        out |= q_pos[:, None] - k_pos[None, :] >= window
    return out


def block_attention(q, k, v, q_pos, k_pos, scale, window: int | None = None):
    """(o, lse): causal attention of q on one key block alone; rows that see no key of the
    block get o = 0 and lse = -inf."""
    scores = (q @ k.transpose(-2, -1)) * scale
    scores = scores.masked_fill(hidden(q_pos, k_pos, window), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    safe = lse.masked_fill(lse == float("-inf"), 0.0)
    return torch.exp(scores - safe.unsqueeze(-1)) @ v, lse


def merge(o, lse, o_blk, lse_blk):
    """The online-softmax merge of two partial attentions over disjoint key sets."""
    new = torch.logaddexp(lse, lse_blk)
    safe = new.masked_fill(new == float("-inf"), 0.0)
    out = o * torch.exp(lse - safe).unsqueeze(-1) + o_blk * torch.exp(lse_blk - safe).unsqueeze(-1)
    return out, new


class _Ring:
    """The ring of a group: this rank's place, its neighbours (global ranks), positions."""

    def __init__(self, group, seq: int, layout: str):
        self.group, self.layout = group, layout
        self.c, self.r = dist.get_world_size(group), dist.get_rank(group)
        ranks = dist.get_process_group_ranks(group) if group is not None else range(self.c)
        ranks = list(ranks)
        self.next, self.prev = ranks[(self.r + 1) % self.c], ranks[(self.r - 1) % self.c]
        self.size = check_split(seq, self.c, layout)
        self.seq = seq

    def owner(self, step: int) -> int:
        return (self.r - step) % self.c

    def chunks(self, rank: int, device) -> list[torch.Tensor]:
        """Global positions of rank `rank`'s chunks."""
        pos = positions(self.seq, self.c, rank, self.layout, device)
        return list(pos.split(self.size))

    def post(self, tensor: torch.Tensor, tag: str) -> tuple:
        """Post the send of `tensor` to the next rank and the receive of the previous rank's
        into a new buffer; returns what `wait` needs. Neither tensor may change until then."""
        posted_at = time.perf_counter()
        got = torch.empty_like(tensor)
        works = comm.batch_isend_irecv(
            [("send", tensor.contiguous(), self.next), ("recv", got, self.prev)],
            group=self.group,
            tag=tag,
        )
        return got, works, tag, posted_at

    @staticmethod
    def wait(posted: tuple) -> torch.Tensor:
        """Wait for a `post` to complete; returns what the previous rank sent."""
        got, works, tag, posted_at = posted
        for w in works:
            w.wait()
        _event(tag, posted_at)
        return got

    def pass_on(self, tensor: torch.Tensor, tag: str) -> torch.Tensor:
        """Send `tensor` to the next rank, return what the previous rank sent (no overlap)."""
        return self.wait(self.post(tensor, tag))


_EVENTS: list | None = None  # (what, start, end) while `timeline.ring_timeline_rank` records


def _event(what: str, start: float) -> None:
    """Note that `what` (a transfer's tag, or "compute") ran from `start` until now."""
    if _EVENTS is not None:
        _EVENTS.append((what, start, time.perf_counter()))


def _pairs(ring: _Ring, step: int, device):
    """(query chunk slice, key chunk slice, q positions, k positions) that are not masked
    whole, for the key block held at `step`."""
    q_chunks, k_chunks = ring.chunks(ring.r, device), ring.chunks(ring.owner(step), device)
    for i, qp in enumerate(q_chunks):
        for j, kp in enumerate(k_chunks):
            if int(kp[0]) <= int(qp[-1]):  # some key at or before some query
                yield (
                    slice(i * ring.size, (i + 1) * ring.size),
                    slice(j * ring.size, (j + 1) * ring.size),
                    qp,
                    kp,
                )


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, layout, seq, scale, window):
        ring = _Ring(group, seq, layout)
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        # the blocks' products and their online-softmax merge in float32 at least (as
        # FlashAttention's accumulators: a bf16 merge rounds at every block); K and V travel
        # in their own type, the output is handed back in it
        acc = torch.promote_types(q.dtype, torch.float32)
        o = torch.zeros_like(q, dtype=acc)  # q's strides: a transpose of it is a view
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=acc, device=q.device)
        kv = torch.stack([k, v])
        pairs = 0
        for step in range(ring.c):
            # post this block's transfer first, so that it runs while the block is computed
            nxt = ring.post(kv, "cp-kv-forward") if step < ring.c - 1 else None
            computing = time.perf_counter()
            for qs, ks, qp, kp in _pairs(ring, step, q.device):
                kb, vb = kv[0][..., ks, :].to(acc), kv[1][..., ks, :].to(acc)
                blk, blk_lse = block_attention(q[..., qs, :].to(acc), kb, vb, qp, kp, scale, window)
                o[..., qs, :], lse[..., qs] = merge(o[..., qs, :], lse[..., qs], blk, blk_lse)
                pairs += 1
            _event("compute", computing)
            if nxt is not None:  # kv was only read meanwhile; the new block is a new buffer
                kv = ring.wait(nxt)
        o = o.to(q.dtype)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.ring, ctx.scale, ctx.window = ring, scale, window
        ctx.mark_non_differentiable(lse)
        _WORK.append(pairs)
        return o, lse

    @staticmethod
    def backward(ctx, grad_o, grad_lse):
        q, k, v, o, lse = ctx.saved_tensors
        ring, scale = ctx.ring, ctx.scale
        acc = lse.dtype  # forward's accumulators' type; dK, dV travel in k's
        grad_o = grad_o.to(acc)
        delta = (grad_o * o.to(acc)).sum(-1)
        dq = torch.zeros_like(q, dtype=acc)
        kv, dkv = torch.stack([k, v]), torch.zeros(2, *k.shape, dtype=k.dtype, device=k.device)
        for step in range(ring.c):
            nxt = ring.post(kv, "cp-kv-backward") if step < ring.c - 1 else None
            computing = time.perf_counter()
            for qs, ks, qp, kp in _pairs(ring, step, q.device):
                kb, vb = kv[0][..., ks, :].to(acc), kv[1][..., ks, :].to(acc)
                qb = q[..., qs, :].to(acc)
                scores = (qb @ kb.transpose(-2, -1)) * scale
                scores = scores.masked_fill(hidden(qp, kp, ctx.window), float("-inf"))
                p = torch.exp(scores - lse[..., qs].unsqueeze(-1))
                do = grad_o[..., qs, :]
                dkv[1][..., ks, :] += p.transpose(-2, -1) @ do
                ds = p * (do @ vb.transpose(-2, -1) - delta[..., qs].unsqueeze(-1))
                dq[..., qs, :] += (ds @ kb) * scale
                dkv[0][..., ks, :] += (ds.transpose(-2, -1) @ qb) * scale
            _event("compute", computing)
            if nxt is not None:
                kv = ring.wait(nxt)
            if ring.c > 1:  # the accumulator follows its block; after c hops it is home
                dkv = ring.pass_on(dkv, "cp-dkv-backward")
        return dq.to(q.dtype), dkv[0], dkv[1], None, None, None, None, None


_WORK: list[int] = []  # chunk pairs computed by each forward on this rank (for the lesson)


def ring_attention(
    q,
    k,
    v,
    group=None,
    layout: str = "zigzag",
    seq: int | None = None,
    scale: float | None = None,
    window: int | None = None,
):
    """Causal attention of this rank's queries over the whole sequence split across `group`.

    q, k, v: [batch, heads, s/c, head_dim], this rank's tokens in the `layout`'s order
    (`split.positions`); `seq` is the whole sequence's length (default c · s/c, after one
    small all-gather checks that every rank holds as many positions). Returns this rank's
    rows of softmax(QKᵀ·scale + causal mask)·V (`scale` default 1/√d; `window`: keys
    `window` or more positions before a query are hidden from it too).
    """
    c = dist.get_world_size(group)
    _check_qkv(q, k, v)
    chunks_of(layout, c)
    if seq is None:  # every rank's length, so that a mismatch is an error, not a gloo abort
        seq = _same_length(q.shape[-2], group) * c
    if q.shape[-2] * c != seq:
        raise ValueError(f"ring_attention: {q.shape[-2]} local positions × c={c} != seq={seq}")
    return _RingAttention.apply(q, k, v, group, layout, seq, scale, window)[0]


def _check_qkv(q, k, v) -> None:
    """q, k and v: tensors of one shape, dtype and device, [batch, heads, s/c, head_dim]."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(
                f"ring_attention: {name} must be a [batch, heads, s/c, head_dim] tensor; got {got}"
            )
    for name, t in (("k", k), ("v", v)):
        if (t.shape, t.dtype, t.device) != (q.shape, q.dtype, q.device):
            raise ValueError(
                f"ring_attention: {name} {tuple(t.shape)} {t.dtype} on {t.device} differs from "
                f"q {tuple(q.shape)} {q.dtype} on {q.device}: q, k and v must have one shape, "
                "dtype and device"
            )


def _same_length(length: int, group) -> int:
    """`length`, after checking with one all-gather that every rank of `group` has it."""
    n = dist.get_world_size(group)
    mine = torch.tensor([length], dtype=torch.int64, device=comm.group_device(group))
    everyone = torch.empty(n, dtype=torch.int64, device=mine.device)
    comm.all_gather(everyone, mine, group=group, tag="cp-length-check")
    lengths = everyone.tolist()
    if len(set(lengths)) > 1:
        raise ValueError(
            f"ring_attention: the ranks hold different numbers of positions {lengths} (by "
            "rank of the group): every rank must hold s/c positions of the sequence"
        )
    return length


def work_per_forward() -> list[int]:
    """Chunk pairs this rank computed in each ring-attention forward since the last call."""
    out = list(_WORK)
    _WORK.clear()
    return out


__all__ = ["ring_attention", "block_attention", "merge", "rank_chunks", "work_per_forward"]
