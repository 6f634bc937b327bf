"""Where a decoder model keeps its parts, found from its structure and config, not its class.

Lesson 09's pipeline stage and lesson 17's composition steps edit a model in place and then
let its own forward run, so they only need to know which modules are which (torchtitan's
`parallelize_llama` reads them from its own model; here any Hugging Face causal LM,
`transformers` 4.x or 5.x, and the course's GPT, its MoE form and Llama):
- the **layers**: the `nn.ModuleList` holding most of the parameters (`model.layers`,
  GPT-2's `transformer.h`); its parent is the base model;
- the **embeddings**: the base model's `nn.Embedding` children (tokens; GPT-2's positions);
- the **final norm**: the base model's child whose name or class says norm (`norm`, `ln_f`);
- the **head**: `get_output_embeddings()` (else an `nn.Linear` named `lm_head`), tied when
  its weight is the token embedding's;
- the **sizes** from the config: heads, KV heads, head_dim (explicit or hidden/heads),
  layers, hidden, vocabulary, routed experts.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch.nn as nn

NORM_NAMES = ("norm", "ln_f", "final_layernorm", "final_layer_norm", "norm_f")


@dataclass
class Parts:
    base: nn.Module  # the module whose forward loops over the layers
    layers_name: str  # the layer list's attribute on `base`
    embeddings: list[str]  # the base's embedding children, by attribute name
    token: str | None  # the token embedding among them
    norm: str | None  # the base's final norm, by attribute name
    head: str | None  # the head's attribute on the model (the root)
    tied: bool  # the head's weight is the token embedding's


def find_parts(model: nn.Module) -> Parts:
    """The parts of `model` (refused in one line if it has no layer list)."""
    lists = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m)]
    if not lists:
        raise ValueError(f"parallelize: {type(model).__name__} has no nn.ModuleList of layers")
    name, _ = max(lists, key=lambda nm: sum(p.numel() for p in nm[1].parameters()))
    base_name, _, layers_name = name.rpartition(".")
    base = model.get_submodule(base_name)
    embeddings = [n for n, m in base.named_children() if isinstance(m, nn.Embedding)]
    norms = [
        n for n, m in base.named_children() if n in NORM_NAMES or "norm" in type(m).__name__.lower()
    ]
    head = "lm_head" if isinstance(getattr(model, "lm_head", None), nn.Linear) else None
    if hasattr(model, "get_output_embeddings") and model.get_output_embeddings() is not None:
        out = model.get_output_embeddings()
        head = next((n for n, m in model.named_children() if m is out), None)
        if head is None:
            raise ValueError(
                f"parallelize: {type(model).__name__}'s output embeddings are not a child of "
                "the model (a causal LM's head is its lm_head)"
            )
    tok = getattr(base, embeddings[0]) if embeddings else None
    if hasattr(model, "get_input_embeddings"):
        tok = model.get_input_embeddings()
    tied = head is not None and tok is not None and getattr(model, head).weight is tok.weight
    token = next((n for n in embeddings if getattr(base, n) is tok), None)
    norm = norms[-1] if norms else None
    return Parts(base, layers_name, embeddings, token, norm, head, tied)


def hf_sizes(config) -> dict:
    """heads, kv_heads, head_dim, layers, hidden, vocab, experts of a transformers config
    (4.x and 5.x names; GPT-2's n_head / n_embd through the config's attribute map)."""
    heads = config.num_attention_heads
    hidden = config.hidden_size
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    experts = (
        getattr(config, "num_local_experts", None)
        or getattr(config, "n_routed_experts", None)
        or getattr(config, "num_experts", None)
        or 0
    )
    return dict(
        heads=heads,
        kv_heads=kv,
        head_dim=head_dim,
        layers=config.num_hidden_layers,
        hidden=hidden,
        vocab=config.vocab_size,
        experts=experts,
    )


def family(model: nn.Module) -> str:
    """ "gpt" (the course GPT and its MoE form), "llama" (the course Llama, in Hugging Face's
    layout) or "hf" (a transformers model); anything else is refused in one line."""
    if is_hf(model):
        return "hf"
    if hasattr(model, "blocks") and hasattr(model, "tok_emb"):
        return "gpt"
    if hasattr(model, "model") and hasattr(model.model, "layers") and hasattr(model, "lm_head"):
        return "llama"
    raise ValueError(
        f"parallelize: {type(model).__name__} is neither the course GPT (tok_emb, blocks, "
        "ln_f) nor in Hugging Face's Llama layout (model.embed_tokens, model.layers, "
        "model.norm, lm_head)"
    )


def takes_positions(model: nn.Module) -> bool:
    """Whether `model`'s forward takes `position_ids` (by name, or any keyword)."""
    params = inspect.signature(model.forward).parameters.values()
    return any(p.name == "position_ids" or p.kind is p.VAR_KEYWORD for p in params)


def is_hf(model: nn.Module) -> bool:
    """A transformers model (its config has the attention implementation it dispatches on)."""
    return hasattr(getattr(model, "config", None), "_attn_implementation")
