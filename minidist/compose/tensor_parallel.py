"""Step 2 of `parallelize` for any decoder model: tensor and sequence parallelism, in place.

Lesson 07's layers replace the model's projections, found by their names (the names every
Hugging Face decoder uses; torchtitan writes the same plan for its Llama):

| module (pattern)                                   | style                              |
|----------------------------------------------------|------------------------------------|
| `q_proj`, `gate_proj`, `up_proj`, `c_fc`           | column-parallel                    |
| `k_proj`, `v_proj`                                 | column-parallel, or whole (t ∤ KV) |
| `qkv_proj`, `c_attn` (fused Q, K, V)               | column-parallel per section        |
| `q_b_proj`, `kv_b_proj` (latent attention's heads) | column-parallel; its latents whole |
| `gate_up_proj` (fused gate and up)                 | column-parallel per half           |
| `o_proj`, `down_proj`, `c_proj`                    | row-parallel                       |
| the course GPT's `attn.qkv`; `mlp.0`               | column-parallel (per section)      |
| its `attn.proj`, `mlp.2`                           | row-parallel                       |
| the token embedding / the head                     | vocab-parallel                     |

Communication happens where Megatron-LM puts it (Shoeybi et al. 2019 §3; Korthikanti et al.
2022 §4.2.2), **once per input**: the module holding the column-parallel projections (the
attention, the MLP) receives its input through f (sequence parallelism: one all-gather of
the sequence), its projections then run on it without communication, and each row-parallel
output is all-reduced (g; or reduce-scattered to this rank's sequence block). Under sequence
parallelism the final norm's output is gathered; a transformers model's first layer cuts its
input to this rank's block (the embedding all-reduced: the model builds its masks from the
embedding's length), a course model's embedding reduce-scatters (Korthikanti's ḡ) and its
learned positions keep the block's rows. The attention module keeps its own forward: its
head counts (`num_heads`, `num_key_value_heads`, `num_key_value_groups`, GPT-2's
`split_size`, its config's) are set to the rank's (the course attentions read theirs from
the projections' width). GPT-2's Conv1D projections become `nn.Linear` (the weight
transposed), so one set of layers serves both; `transposed` names them for the edges
(export, comparison).

Gradients of replicated parameters that see only part of the work are summed over tp: under
sequence parallelism everything the layers, the final norm and learned positions hold whole
(norms, row biases); K/V kept whole because t does not divide the KV heads (each rank uses
the heads its queries need). They are marked (`tp_summed`) and summed in one all-reduce of
their concatenation (`sum_partial_gradients`): once per step, after the last micro-batch
(Megatron-LM's `finalize_model_grads`), or, where ZeRO-2/FSDP reduces a layer's gradients
after each micro-batch, just before that reduction, one all-reduce per layer.

Not composed (refused in one line): a fused Q, K, V with fewer KV heads than query heads
(sections of unequal size); a transformers model's experts under tp (the course MoE's stay
whole on every tp rank).
"""

from __future__ import annotations

import copy
import weakref
from fnmatch import fnmatchcase

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ..megatron.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    VocabParallelHead,
)
from ..megatron.ops import copy_to_tp
from ..megatron.sequence import gather_from_sequence, scatter_to_sequence
from ..model_parts import is_hf
from ..parallel import all_reduce_flat
from ..pipeline.stages import Stage, _hidden_arg, _with_hidden

HF_PLAN = {
    "*.q_proj": "colwise",
    "*.q_b_proj": "colwise",  # latent attention: by heads, after the latents
    "*.kv_b_proj": "colwise",
    "*.[kv]_proj": "colwise_kv",
    "*.qkv_proj": "colwise_qkv",
    "*.c_attn": "colwise_qkv",
    "*.gate_up_proj": "colwise_2",
    "*.gate_proj": "colwise",
    "*.up_proj": "colwise",
    "*.c_fc": "colwise",
    "*.o_proj": "rowwise",
    "*.down_proj": "rowwise",
    "*.c_proj": "rowwise",
    "*.attn.qkv": "colwise_qkv",  # the course GPT (`minidist.models`): fused Q, K, V
    "*.attn.proj": "rowwise",
    "*.mlp.0": "colwise",  # its MLP, an nn.Sequential (Linear, GELU, Linear)
    "*.mlp.2": "rowwise",
}
HEAD_COUNTS = ("num_heads", "num_attention_heads", "num_key_value_heads")
# latent attention's projections to its latents, kept whole on every tp rank (DeepSeek-V2
# §2.1: c_Q, c_KV and the shared rotary key are not per head)
LATENT_PARTS = ("q_a_proj", "q_a_layernorm", "kv_a_proj_with_mqa", "kv_a_layernorm")


def conv1d_to_linear(model: nn.Module) -> list[str]:
    """GPT-2's Conv1D (y = x W + b, W [in, out]) as nn.Linear (W transposed), in place; the
    names of the transposed weights."""
    out = []
    for name, module in list(model.named_modules()):
        if type(module).__name__ == "Conv1D":
            w = module.weight
            linear = nn.Linear(
                w.shape[0], w.shape[1], bias=module.bias is not None, device=w.device, dtype=w.dtype
            )
            with torch.no_grad():
                linear.weight.copy_(w.t())
                if module.bias is not None:
                    linear.bias.copy_(module.bias)
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent), attr, linear)
            out.append(f"{name}.weight")
    return out


class ReplicatedKV(nn.Module):
    """K or V kept whole on every tp rank (t ∤ KV heads): the projection, then the KV head
    each of this rank's query heads reads (so the attention sees one KV head per query
    head); its gradient covers this rank's query heads only, summed over tp."""

    def __init__(self, dense: nn.Linear, head_dim: int, index: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(dense.weight.detach().clone())
        self.bias = None if dense.bias is None else nn.Parameter(dense.bias.detach().clone())
        for p in self.parameters():
            p.tp_partial = True
        self.head_dim = head_dim
        self.register_buffer("index", index, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        heads = y.view(*y.shape[:-1], -1, self.head_dim).index_select(-2, self.index)
        return heads.flatten(-2)


class ScaledVocabParallelEmbedding(VocabParallelEmbedding):
    """An embedding that multiplies by `embed_scale` in its own forward (Gemma 3's)."""

    def __init__(self, dense: nn.Embedding, group):
        super().__init__(dense, group)
        self.embed_scale = dense.embed_scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = super().forward(ids)
        return out * torch.as_tensor(self.embed_scale, dtype=out.dtype, device=out.device)


class _Region:
    """The tp entry of a module's input (f, or under sequence parallelism the all-gather of
    the sequence), once per call of the module; its column-parallel projections then run on
    it without communication. A projection called while the module is not running (a
    layer that calls its MLP's projections itself) enters its own input, once for the
    projections that share that input tensor (weak references: nothing outlives the step)."""

    def __init__(self, group, sp: bool):
        self.enter, self.group = gather_from_sequence if sp else copy_to_tp, group
        self.running = 0
        self.last = (lambda: None, lambda: None)

    def attach(self, module: nn.Module, projections: list[nn.Module]) -> None:
        module.register_forward_pre_hook(self._module_in, with_kwargs=True)
        module.register_forward_hook(self._module_out, always_call=True)
        for p in projections:
            p.register_forward_pre_hook(self._projection_in)

    def _module_in(self, module, args, kwargs):
        self.running += 1
        return _with_hidden(args, kwargs, self.enter(_hidden_arg(args, kwargs), self.group))

    def _module_out(self, module, args, out):
        self.running -= 1

    def _projection_in(self, module, args):
        if self.running:
            return None
        x, (seen, out) = args[0], (r() for r in self.last)
        if seen is not x or out is None:
            out = self.enter(x, self.group)
            self.last = (weakref.ref(x), weakref.ref(out))
        return (out, *args[1:])


def _localize(attn: nn.Module, sizes: dict, t: int, kv_whole: bool) -> None:
    """The attention module's head counts, as this rank's (its forward reads them)."""
    q, kv = sizes["heads"] // t, (sizes["kv_heads"] // t if not kv_whole else sizes["heads"] // t)
    local = {"num_heads": q, "num_attention_heads": q, "num_key_value_heads": kv}
    for name in HEAD_COUNTS:
        if name in vars(attn):
            setattr(attn, name, local[name])
    if "num_key_value_groups" in vars(attn):
        attn.num_key_value_groups = q // kv
    if "split_size" in vars(attn):  # GPT-2: q, k, v split from the fused output by width
        attn.split_size = q * sizes["head_dim"]
    config = getattr(attn, "config", None)
    if config is not None:
        config = copy.copy(config)
        config.num_attention_heads = q
        if hasattr(config, "num_key_value_heads"):
            config.num_key_value_heads = kv
        attn.config = config


def routed_expert(name: str, parent: nn.Module) -> bool:
    """Whether projection `name` belongs to a routed expert (kept whole per tp rank, or
    refused as an `nn.Linear`); a shared expert (DeepSeek-V3's `shared_experts`, Qwen-MoE's
    `shared_expert`) sees every token and is split like a dense MLP."""
    if "shared_expert" in name:
        return False
    moe_block = type(parent).__name__.endswith(("MoeBlock", "MoE", "SparseMoeBlock"))
    return moe_block or "expert" in name


def apply_tensor_parallel(stage: Stage, group, sp: bool, sizes: dict) -> dict[str, list[str]]:
    """`stage`'s model made tensor parallel over `group` (sequence parallel if `sp`), in
    place; {style: module names}."""
    t, r = dist.get_world_size(group), dist.get_rank(group)
    heads, kv, hd = sizes["heads"], sizes["kv_heads"], sizes["head_dim"]
    kv_whole = kv % t != 0
    model, parts = stage.model, stage.parts
    layers = getattr(parts.base, parts.layers_name)
    matched: dict[str, list[str]] = {}
    regions: dict[nn.Module, list[nn.Module]] = {}  # a module: its projections entered once
    attentions = set()
    for lname, layer in layers.named_children():
        for name, module in list(layer.named_modules()):
            styles = [s for p, s in HF_PLAN.items() if fnmatchcase(f".{name}", p)]
            if not styles or not isinstance(module, nn.Linear):
                continue
            style = styles[0]
            parent_name, _, attr = name.rpartition(".")
            parent = layer.get_submodule(parent_name)
            if routed_expert(name, parent):
                raise ValueError(
                    f"parallelize: experts with tp={t} are not composed here (use ep, or tp = 1)"
                )
            matched.setdefault(style, []).append(f"{lname}.{name}")
            if style == "rowwise":
                new = RowParallelLinear(module, group)
                new.sequence_parallel = sp
            elif style == "colwise_kv" and kv_whole:
                mine = torch.arange(
                    r * (heads // t), (r + 1) * (heads // t), device=module.weight.device
                )
                new = ReplicatedKV(module, hd, mine // (heads // kv))
            else:
                if style == "colwise_qkv" and kv != heads and attr == "qkv_proj":
                    raise ValueError(
                        f"parallelize: a fused qkv_proj with {kv} KV heads for "
                        f"{heads} query heads is not split over tp={t} here "
                        "(its sections differ in size)"
                    )
                blocks = {"colwise_qkv": 3, "colwise_2": 2}.get(style, 1)
                new = ColumnParallelLinear(module, group, blocks=blocks)
                new.entered = True
            setattr(parent, attr, new)
            regions.setdefault(parent, []).extend([] if style == "rowwise" else [new])
            if style in ("colwise_qkv", "colwise_kv") or attr in ("q_proj", "q_b_proj"):
                attentions.add(parent)
            if attr == "kv_b_proj":  # the latents and the shared rotary key: whole per rank
                for part in LATENT_PARTS:
                    whole = getattr(parent, part, None)
                    for p in whole.parameters() if whole is not None else ():
                        p.tp_partial = True  # each rank's heads' share of the gradient
    if not matched:
        raise ValueError(
            f"parallelize: tp={t} found no projection of {type(model).__name__} "
            f"to split (patterns: {sorted(HF_PLAN)})"
        )
    for module, projections in regions.items():
        _Region(group, sp).attach(module, projections)
    for attn in attentions:
        _localize(attn, sizes, t, kv_whole)
    emb = _vocab(stage, group)
    positions = []  # under sp, learned position embeddings kept at this rank's block
    if sp and stage.first and is_hf(model):
        # transformers builds its masks and cache positions from the embedding output's
        # length: the whole sequence (the embedding all-reduced) enters the first layer,
        # which keeps this rank's block (no communication; its gradient all-gathered)
        next(iter(layers)).register_forward_pre_hook(
            lambda m, a, k: _with_hidden(a, k, scatter_to_sequence(_hidden_arg(a, k), group)),
            with_kwargs=True,
        )
    elif sp and stage.first:
        # a course model reads the length from its ids: the embedding reduce-scatters into
        # this rank's block (Korthikanti's ḡ, half an all-reduce's bytes), and a learned
        # position embedding (replicated) keeps its rows of the block
        emb.sequence_parallel = True
        positions = [getattr(parts.base, n) for n in parts.embeddings if n != parts.token]
        for module in positions:
            module.register_forward_hook(lambda m, a, out: out.chunk(t, dim=-2)[r])
    if stage.last and parts.norm is not None:
        leave = gather_from_sequence if sp else copy_to_tp
        getattr(parts.base, parts.norm).register_forward_hook(lambda m, a, out: leave(out, group))
    region = [layers] + ([getattr(parts.base, parts.norm)] if stage.last and parts.norm else [])
    region += positions
    for part in region:
        for p in part.parameters():
            if p.requires_grad and not hasattr(p, "tp_split") and not hasattr(p, "tp_whole"):
                if sp or getattr(p, "tp_partial", False):
                    p.tp_summed = True  # a partial sum: `sum_partial_gradients`
    stage.tp_group = group
    return matched


def _vocab(stage: Stage, group) -> VocabParallelEmbedding | None:
    """The token embedding and the head split over the vocabulary (tied: one slice); the
    embedding (None where the stage does not hold it)."""
    model, parts = stage.model, stage.parts
    emb = None
    if stage.first:
        dense = getattr(parts.base, parts.token)
        kind = (
            ScaledVocabParallelEmbedding
            if hasattr(dense, "embed_scale")
            else VocabParallelEmbedding
        )
        emb = kind(dense, group)
        setattr(parts.base, parts.token, emb)
    if stage.last and parts.head is not None:
        dense = getattr(model, parts.head)
        head = VocabParallelHead(dense, group, emb.weight if parts.tied and emb else None)
        head.entered = True  # its input, the final norm's output, entered above
        setattr(model, parts.head, head)
        stage.vocab_start, stage.vocab_size = head.start, head.vocab_size
    return emb


def sum_partial_gradients(params, group) -> None:
    """The gradients of `params` marked `tp_summed` (partial sums, one per tp rank) summed
    over the tp `group`, in one all-reduce of their concatenation; a sum is linear, so once
    over what the micro-batches accumulated equals once per micro-batch."""
    grads = [p.grad for p in params if getattr(p, "tp_summed", False) and p.grad is not None]
    all_reduce_flat(grads, group, "sp-replicated-grad")
