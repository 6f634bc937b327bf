"""The rank functions lesson 14's notebook, tests, checker and tour share.

The model is lesson 07's: the course GPT with 4 heads (sequence 32, hidden 32, 2 layers,
vocabulary 30, tied embedding, frozen `ln_f.bias`), trained with SGD + momentum on the same
global batches, so that tp = 2 and 4 divide the heads, the hidden size and the sequence.

- `train_on_rank`: `TensorParallelGPT(..., sequence_parallel=...)` over the whole world,
  with its ledger (training only) and the replicated parameters' trainable elements.
- `layer_terms_on_rank`: the bytes one block saves for backward, measured per term (its
  layer norms and their statistics, inside the tensor-parallel regions), on a batch of b.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

from .. import comm
from ..megatron.fixture import build_dense, training_records
from ..megatron.model import TensorParallelGPT
from ..megatron.sequence import sequence_block
from ..memory import SavedActivations, _storage_key
from ..training import TrainTrace, make_optimizer, train


class SPRun(NamedTuple):
    trace: TrainTrace
    records: list[comm.CommRecord]  # training only (no contract gathers)
    replicated_trainable: int  # elements of the trainable parameters every tp rank holds


def train_on_rank(sequence_parallel: bool = True, **sizes) -> SPRun:
    """On a rank: the tensor-parallel GPT over the whole world, with or without sequence
    parallelism, trained as lesson 07's reference is."""
    model, batches, _ = build_dense(**sizes)
    tp = TensorParallelGPT(model, None, sequence_parallel=sequence_parallel)
    opt = make_optimizer(tp.parameters())
    with comm.record() as ledger:
        trace = train(tp, batches, tp.loss, opt)
    replicated = sum(
        p.numel() for p in tp.parameters() if p.requires_grad and not hasattr(p, "tp_split")
    )
    return SPRun(trace, training_records(ledger), replicated)


class _TermsSaved:
    """Saved-tensor hooks that file each tensor a block saves under `korthikanti_terms`'
    names: by the part of the block saving it, and by what it is (the region's input; the
    attention's [b, a/t, s] log-sum-exp). Parameters are model state, not counted."""

    def __init__(self, model, heads_per_rank: int):
        self._params = {_storage_key(p) for p in model.parameters()}
        self._heads = heads_per_rank
        self.bytes: dict[str, int] = {}
        self._seen: set = set()
        self.term, self.region_input = "", None

    def _pack(self, t: torch.Tensor):
        key = _storage_key(t)
        if key in self._params or key in self._seen:
            return t
        self._seen.add(key)
        term = self.term
        if self.region_input is not None and key == _storage_key(self.region_input):
            term = "region inputs"
        elif t.dim() == 3 and t.shape[1] == self._heads and self.term == "inside the regions":
            term = "attention scores"
        self.bytes[term] = self.bytes.get(term, 0) + t.untyped_storage().nbytes()
        return t

    def part(self, term: str, region_input=None):
        self.term, self.region_input = term, region_input
        return self


def layer_terms_on_rank(batch: int, sequence_parallel: bool = True) -> dict[str, int]:
    """On a rank: bytes block 0 saves for backward, by term, measured with saved-tensor
    hooks (every saved storage once; their sum is what `SavedActivations` measures)."""
    model = build_dense().model
    s, h = model.cfg.seq_len, model.cfg.hidden
    tp = TensorParallelGPT(model, None, sequence_parallel=sequence_parallel)
    block = tp.module.blocks[0]
    start, stop = sequence_block(s, None) if sequence_parallel else (0, s)
    g = torch.Generator().manual_seed(dist.get_rank() if sequence_parallel else 0)
    x = torch.randn(batch, stop - start, h, device="cpu", generator=g, requires_grad=True)
    terms = _TermsSaved(tp, block.attn.heads)
    with torch.autograd.graph.saved_tensors_hooks(terms._pack, lambda t: t):
        terms.part("layer norm inputs")
        a = block.ln1(x)
        terms.part("inside the regions", region_input=a)
        x = x + block.attn(a)
        terms.part("layer norm inputs")
        m = block.ln2(x)
        terms.part("inside the regions", region_input=m)
        block.mlp(m)
    with SavedActivations(tp) as saved:  # the block as one: the same total
        block(x.detach().requires_grad_())
    return {**terms.bytes, "dropout masks": 0, "total": saved.bytes}
