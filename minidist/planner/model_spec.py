"""The model the planner is asked about: a GPT configuration or only a parameter count.

With a configuration the planner builds the course's `minidist.models.GPT` on the `meta`
device, which allocates nothing whatever its size, so bucket plans, FSDP units and frozen
parameters are those of the real module, exactly; with only a count (`ModelSpec(params=P)`)
only model states and data-parallel traffic can be planned. `experts=E` makes every block's
MLP a mixture of E experts, top-`top_k`, capacity factor `capacity_factor` (lesson 16's
`moe_gpt`; Fedus et al. 2021, section 2).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..models import GPT, Block, GPTConfig

MAX_LAYERS = 1024  # the meta model is built block by block (Narayanan et al.'s 1 T: 128)


@dataclass(frozen=True)
class ModelSpec:
    """A GPT by its configuration, or only a parameter count (`params`)."""

    layers: int = 0
    hidden: int = 0
    heads: int = 0
    vocab: int = 0
    seq: int = 0
    frozen: tuple[str, ...] = ()  # parameter names without gradient, e.g. ("ln_f.bias",)
    params: int | None = None
    experts: int = 0  # 0: dense MLPs; E: every MLP an MoE of E experts (lesson 16)
    top_k: int = 1
    capacity_factor: float = 1.0

    def __post_init__(self):
        self._check_experts()
        if self.params is not None:
            if not _whole(self.params) or self.params < 1:
                raise ValueError(f"ModelSpec: params={self.params!r} must be an int >= 1")
            return
        for name in ("layers", "hidden", "heads", "vocab", "seq"):
            if not _whole(getattr(self, name)):
                raise ValueError(
                    f"ModelSpec: {name}={getattr(self, name)!r} must be an int (or give params=)"
                )
            if getattr(self, name) < 1:
                raise ValueError(
                    f"ModelSpec: {name}={getattr(self, name)} must be >= 1 (or give params=)"
                )
        if self.hidden % self.heads:
            raise ValueError(
                f"ModelSpec: hidden={self.hidden} must be divisible by heads={self.heads}"
            )
        if self.layers > MAX_LAYERS:
            raise ValueError(
                f"ModelSpec: layers={self.layers} must be at most {MAX_LAYERS}: the planner "
                "builds every block on the meta device (about 10 ms each)"
            )
        largest = max(4 * self.hidden, self.vocab, self.seq) * self.hidden
        if 4 * largest >= 2**63:
            raise ValueError(
                f"ModelSpec: hidden={self.hidden}, vocab={self.vocab}, seq={self.seq}: the "
                f"largest weight (4h×h, V×h or s×h) would hold {largest:.3g} elements, more "
                "than a tensor's byte count (a 64-bit integer) can address"
            )

    def _check_experts(self) -> None:
        if not _whole(self.experts) or self.experts < 0:
            raise ValueError(f"ModelSpec: experts={self.experts!r} must be an int >= 0 (0: dense)")
        if not self.experts:
            return
        if self.params is not None:
            raise ValueError(f"ModelSpec: experts={self.experts} needs a GPT configuration "
                             f"(layers, hidden, ...), not only params={self.params}")  # fmt: skip
        if not _whole(self.top_k) or not 1 <= self.top_k <= self.experts:
            raise ValueError(f"ModelSpec: top_k={self.top_k!r} must be an int in 1..experts="
                             f"{self.experts}")  # fmt: skip
        cf = self.capacity_factor
        if isinstance(cf, bool) or not isinstance(cf, (int, float)) or not 0 < cf < float("inf"):
            raise ValueError(f"ModelSpec: capacity_factor={cf!r} must be a finite number > 0")

    @classmethod
    def gpt(cls, cfg: GPTConfig, frozen: tuple[str, ...] = (), **moe) -> ModelSpec:
        return cls(cfg.layers, cfg.hidden, cfg.heads, cfg.vocab_size, cfg.seq_len, tuple(frozen),
                   **moe)  # fmt: skip

    @classmethod
    def of(cls, model: GPT) -> ModelSpec:
        """The spec of a built course GPT, its frozen parameters and MoE layers included."""
        frozen = tuple(n for n, p in model.named_parameters() if not p.requires_grad)
        moe = getattr(model.blocks[0].mlp, "moe", None) if len(model.blocks) else None
        if moe is None:
            return cls.gpt(model.cfg, frozen)
        return cls.gpt(model.cfg, frozen, experts=moe.num_experts, top_k=moe.k,
                       capacity_factor=moe.capacity_factor)  # fmt: skip

    @property
    def has_config(self) -> bool:
        return self.params is None

    def config(self) -> GPTConfig:
        self._need_config("config")
        return GPTConfig(self.vocab, self.seq, self.layers, self.heads, self.hidden)

    def meta_model(self) -> GPT:
        """The model on the `meta` device (shapes only), frozen parameters marked."""
        self._need_config("meta_model")
        moe = (self.experts, self.top_k, self.capacity_factor)
        return _meta_gpt(self.layers, self.hidden, self.heads, self.vocab, self.seq, self.frozen,
                         moe)  # fmt: skip

    def tensors(self) -> list[torch.Tensor]:
        """Every parameter (a tied one once) in `named_parameters` order, on `meta`."""
        return list(self.meta_model().parameters())

    @property
    def num_params(self) -> int:
        if not self.has_config:
            return self.params
        return sum(p.numel() for p in self.tensors())

    @property
    def frozen_numel(self) -> int:
        if not self.has_config:
            return 0
        return sum(p.numel() for p in self.tensors() if not p.requires_grad)

    @property
    def trainable(self) -> int:
        """Ψ: elements that get a gradient."""
        return self.num_params - self.frozen_numel

    def expert_numel(self) -> int:
        """Elements of every layer's experts (0 for a dense GPT)."""
        if not self.experts:
            return 0
        from ..expert_parallel.gpt import is_expert

        return sum(p.numel() for n, p in self.meta_model().named_parameters() if is_expert(n))

    def fsdp_units(self) -> list[int]:
        """Trainable elements of each FSDP unit, one per block, the root (the rest) last:
        the course's wrap policy (`minidist.fsdp.fixture.UNITS["gpt"]`). A spec with only a
        parameter count is one unit of them all."""
        if not self.has_config:
            return [self.trainable]
        model = self.meta_model()
        blocks = [m for m in model.modules() if isinstance(m, Block)]
        numels = [sum(p.numel() for p in b.parameters() if p.requires_grad) for b in blocks]
        return [*numels, self.trainable - sum(numels)]

    def _need_config(self, what: str) -> None:
        if not self.has_config:
            raise ValueError(
                f"ModelSpec.{what}: this spec has only params={self.params}; give the layers, "
                "hidden, heads, vocab and seq of a GPT to plan activations, tp or pp"
            )


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@functools.lru_cache(maxsize=32)
def _meta_gpt(layers, hidden, heads, vocab, seq, frozen, moe=(0, 1, 1.0)) -> GPT:
    cfg = GPTConfig(vocab, seq, layers, heads, hidden)
    with torch.device("meta"):
        if moe[0]:  # the planner plans lesson 16's MoE GPT too
            from ..expert_parallel.gpt import moe_gpt

            model = moe_gpt(cfg, *moe)
        else:
            model = GPT(cfg)
    names = dict(model.named_parameters())
    for name in frozen:
        if name not in names:
            raise ValueError(f"ModelSpec: frozen={name!r} is not a parameter of the GPT")
        names[name].requires_grad_(False)
    return model
