"""A pipeline stage of any decoder model: a copy of the model that runs its own forward
(Huang et al. 2019, "GPipe", section 2; Narayanan et al. 2021, section 2.2 for the chunks of
interleaving); `GPTStage` / `split_gpt`, the course GPT's.

As torchtitan's `pipeline_module_split`: a stage is a **copy of the whole model** from
which the layers it does not hold are removed (`HeldLayers` keeps the held ones under their
indices in the whole model, so their names stay the one-process names: `blocks.3.ln1.weight`)
and the parts that belong elsewhere are made **absent** (`Absent`: no parameters, returns
zeros of the shape the forward expects):
- a stage that is not the first: the embeddings (token, learned positions); the activation
  it receives enters at its first layer (a forward pre-hook replaces the layer's hidden-state
  argument), so everything the model computes from the input's shape (the causal or
  sliding-window mask, rotary cos/sin, Gemma's embedding scale) is computed as in one
  process, on a zero tensor where it does not matter;
- a stage that is not the last: the final norm and the head; what leaves the stage is its
  last layer's output (a forward hook keeps it). A tied head (the course GPT's, GPT-2's) on
  a last stage without the first keeps its own copy of the embedding as `lm_head`.
`Stage.forward(x)` calls the model with the ids (the first stage: the rank's tokens; the
others: zeros of that shape) and the tokens' **global** `position_ids` (under context
parallelism, lesson 17, a rank holds zig-zag chunks of the sequence; lesson 09's stages
take each sequence from position 0), a transformers model also with `use_cache=False`: the
model's keyword arguments (masks, position embeddings) reach each layer as the model passes
them. No forward of a model is written here.

`Stage.loss`, for a transformers model, is the sum of the valid tokens' cross entropy
(targets -100 ignored) divided by the step's count of valid tokens over the global batch
(`StageContext.tokens`), so the sum over micro-batches and data ranks is the global batch's
token mean, the model's own loss; for the course models (`tokens` None) it is their
`lm_loss`, the micro-batch's mean. Vocab-parallel under tensor parallelism (lesson 07).
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..megatron.layers import vocab_parallel_cross_entropy
from ..model_parts import Parts, find_parts, is_hf, takes_positions
from ..models import GPT


class StageContext:
    """What a stage's hooks share within one forward: this rank's global positions, the
    received activation, the kept output, the step's valid-token count."""

    def __init__(self, positions: torch.Tensor | None, seq: int):
        # positions None: each sequence a stage is given, from position 0 (lesson 09's GPT)
        self.positions, self.seq = positions, seq
        self.received: torch.Tensor | None = None
        self.kept: torch.Tensor | None = None
        self.masks: list[torch.Tensor] | None = None  # per micro-batch, or None
        # valid tokens of the global batch this step (set by the engine); None: the course
        # models' loss, the mean over each micro-batch
        self.tokens: float | None = 1.0
        self.scale = 1.0  # data ranks: the engine averages the ranks' gradients
        self.dtype = torch.float32


class HeldLayers(nn.ModuleList):
    """The layers a stage holds, registered under their indices in the whole model."""

    def __init__(self, layers=None):
        super().__init__()
        if isinstance(layers, dict):
            for i, layer in layers.items():
                self.add_module(str(i), layer)
        elif layers is not None:
            self.extend(layers)

    def __getitem__(self, idx):  # by position, as a list: `layers[0]` is the first held
        if isinstance(idx, int):
            return list(self._modules.values())[idx]
        return super().__getitem__(idx)


class Absent(nn.Module):
    """A part the stage does not hold: zeros [batch, local sequence, width] in the compute
    dtype, whatever it is given (token ids, or a hidden state of a sequence block); given
    positions [s] (the course GPT's learned positions), zeros [local sequence, width]."""

    def __init__(self, ctx: StageContext, width: int):
        super().__init__()
        self.ctx, self.width = ctx, width

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        lead = x.shape[:1] if x.dim() > 1 else ()
        n = self.ctx.positions.numel() if self.ctx.positions is not None else x.shape[x.dim() > 1]
        return torch.zeros(*lead, n, self.width, dtype=self.ctx.dtype, device=x.device)


def _hidden_arg(args, kwargs):
    return args[0] if args else kwargs["hidden_states"]


def _with_hidden(args, kwargs, h):
    if args:
        return (h, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": h}


def _first_output(out):
    return out[0] if isinstance(out, (tuple, list)) else out


class Stage(nn.Module):
    """Layers `held` of `model` (edited in place: call it on a copy), the embeddings if
    `first`, the final norm and head if `last`."""

    def __init__(
        self,
        model: nn.Module,
        held: range,
        first: bool,
        last: bool,
        ctx: StageContext,
        parts: Parts | None = None,
    ):
        super().__init__()
        self.first, self.last, self.ctx, self.held = first, last, ctx, held
        self.parts = parts = parts or find_parts(model)
        self.hf, self.takes_positions = is_hf(model), takes_positions(model)
        self.tp_group, self.vocab_start, self.vocab_size = None, 0, None
        self.seen = 0  # micro-batches run this step (they run in order on every stage)
        layers = getattr(parts.base, parts.layers_name)
        kept = HeldLayers({i: layers[i] for i in held})
        setattr(parts.base, parts.layers_name, kept)
        hidden = getattr(parts.base, parts.token).embedding_dim
        if not first:
            for name in parts.embeddings:
                setattr(parts.base, name, Absent(ctx, hidden))
            kept[0].register_forward_pre_hook(self._enter, with_kwargs=True)
        if not last:
            if parts.norm is not None:
                setattr(parts.base, parts.norm, Absent(ctx, hidden))
            if parts.head is not None:
                setattr(model, parts.head, nn.Identity())
            list(kept)[-1].register_forward_hook(self._keep)
        self.model = model
        self.tied = parts.tied

    def _enter(self, module, args, kwargs):
        return _with_hidden(args, kwargs, self.ctx.received.to(_hidden_arg(args, kwargs).dtype))

    def _keep(self, module, args, out):
        self.ctx.kept = _first_output(out)

    @property
    def embedding(self) -> nn.Module | None:
        """The token embedding (the first stage's), else None."""
        return getattr(self.parts.base, self.parts.token) if self.first else None

    @property
    def head(self) -> nn.Module | None:
        """The output head (the last stage's), else None."""
        return getattr(self.model, self.parts.head) if self.last and self.parts.head else None

    def layers(self) -> list[nn.Module]:
        return list(getattr(self.parts.base, self.parts.layers_name))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ctx = self.ctx
        local = ctx.positions
        if local is None:  # the sequence given, from position 0
            local = torch.arange(x.shape[1], device=x.device)
        n = local.numel()
        if self.first:
            ids = x
        else:
            ids = torch.zeros(x.shape[0], n, dtype=torch.long, device=x.device)
            ctx.received = x
        positions = local.to(ids.device).unsqueeze(0).expand(ids.shape[0], -1)
        extra = {"use_cache": False} if self.hf else {}
        if self.takes_positions:  # a forward without them numbers its tokens itself (cp = 1 only)
            extra["position_ids"] = positions
        if ctx.masks is not None:  # the schedule runs each stage's micro-batches in order
            extra["attention_mask"] = ctx.masks[self.seen % len(ctx.masks)]
            self.seen += 1
        out = self.model(ids, **extra)
        ctx.received = None
        if not self.last:
            h, ctx.kept = ctx.kept, None
            return h.float()
        return (out.logits if hasattr(out, "logits") else _first_output(out)).float()

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """This micro-batch's share of the global batch's mean over valid tokens (the course
        models: the micro-batch's mean, their `lm_loss`)."""
        mean = self.ctx.tokens is None
        reduction = "mean" if mean else "sum"
        if self.vocab_size is None:  # the whole vocabulary (no tensor parallelism)
            total = F.cross_entropy(
                logits.flatten(0, 1), targets.flatten(), ignore_index=-100, reduction=reduction
            )
        else:
            total = vocab_parallel_cross_entropy(
                logits, targets, self.tp_group, self.vocab_start, self.vocab_size, reduction
            )
        return total if mean else total * (self.ctx.scale / self.ctx.tokens)


class GPTStage(Stage):
    """Blocks `blocks` of a copy of `dense`, the embeddings on the first stage and the final
    norm and (tied) head on the last: the GPT's own forward runs (`Stage.forward`)."""

    def __init__(self, dense: GPT, blocks: range, first: bool, last: bool):
        ctx = StageContext(None, dense.cfg.seq_len)
        ctx.tokens = None  # its loss (`Stage.loss`): `lm_loss`, the micro-batch's mean
        super().__init__(copy.deepcopy(dense), blocks, first, last, ctx)


def gpt_blocks(layers: int, stages: int, stage: int) -> range:
    """The blocks of stage `stage` of `stages`, dealt out as evenly as possible."""
    if not 1 <= stages <= layers:
        raise ValueError(f"split_gpt: stages={stages} must be between 1 and layers={layers}")
    bounds = [round(k * layers / stages) for k in range(stages + 1)]
    return range(bounds[stage], bounds[stage + 1])


def split_gpt(dense: GPT, stages: int, stage: int) -> GPTStage:
    """Stage `stage` of `stages` (`gpt_blocks`)."""
    held = gpt_blocks(dense.cfg.layers, stages, stage)
    return GPTStage(dense, held, stage == 0, stage == stages - 1)
