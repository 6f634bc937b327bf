"""A pipeline stage of the course GPT whose blocks are tensor parallel (lessons 07 and 09).

`TensorParallelStage` is lesson 09's `GPTStage` (a copy of the GPT holding consecutive
blocks, the embeddings on the first stage, the final norm and the head on the last, its own
forward running) edited in place by lesson 07's `tensor_parallel_gpt` (attention heads and
MLP split over the tp group, the embedding and the head vocab-parallel; the last stage's
head a split copy of the embedding, kept equal to it through the embedding group).
Parameter names are the dense model's (`blocks.3.attn.qkv.weight`), so the comparison
contract can rebuild the dense state.
"""

from __future__ import annotations

from ..megatron.model import tensor_parallel_gpt
from ..models import GPT
from ..parallel import broadcast_parameters, verify_same_model
from ..pipeline.stages import GPTStage, gpt_blocks


class TensorParallelStage(GPTStage):
    """Blocks `blocks` of a copy of `dense`, split over `tp_group`; its loss the
    vocab-parallel cross entropy (`Stage.loss`)."""

    def __init__(self, dense: GPT, blocks: range, first: bool, last: bool, tp_group):
        super().__init__(dense, blocks, first, last)
        tensor_parallel_gpt(self.model, tp_group)
        self.tp_group = tp_group
        if last:
            self.vocab_start, self.vocab_size = self.head.start, self.head.vocab_size


def split_tensor_parallel_gpt(dense: GPT, layout) -> TensorParallelStage:
    """This rank's stage: blocks dealt out over `layout.pp_size` stages, split over its tp group."""
    layers, p = dense.cfg.layers, layout.pp_size
    if not 1 <= p <= layers:
        raise ValueError(
            f"split_tensor_parallel_gpt: stages={p} must be between 1 and layers={layers}"
        )
    verify_same_model(dense, None, "split_tensor_parallel_gpt")
    broadcast_parameters(dense)  # every rank cuts its stage from one model
    r = layout.pp_rank
    held = gpt_blocks(layers, p, r)
    return TensorParallelStage(dense, held, r == 0, r == p - 1, layout.group("tp"))
