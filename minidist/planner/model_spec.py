"""The model the planner is asked about: a GPT or Llama configuration, or only a parameter count.

With a configuration the planner builds the course's `minidist.models.GPT` on the `meta`
device, which allocates nothing whatever its size, so bucket plans, FSDP units and frozen
parameters are those of the real module, exactly; with only a count (`ModelSpec(params=P)`)
only model states and data-parallel traffic can be planned. `experts=E` makes every block's
MLP a mixture of E experts, top-`top_k`, capacity factor `capacity_factor` (lesson 16's
`moe_gpt`; Fedus et al. 2022, section 2). `arch="llama"` plans lesson 17's Llama-style model
instead (`minidist.models_llama`: RMSNorm, rotary positions, SwiGLU with `ffn` hidden units,
`kv_heads` key/value heads, untied embeddings; Touvron et al. 2023, section 2.2).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..models import GPT, Block, GPTConfig
from ..models_llama import LlamaConfig, LlamaDecoderLayer, LlamaForCausalLM

ARCHS = ("gpt", "llama")
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
    arch: str = "gpt"  # "gpt": the course GPT; "llama": lesson 17's Llama-style model
    kv_heads: int = 0  # llama: key/value heads (grouped-query attention); 0: as many as heads
    ffn: int = 0  # llama: the SwiGLU's hidden units (the GPT's MLP is always 4·hidden)

    def __post_init__(self):
        self._check_experts()
        self._check_arch()
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
            raise ValueError(
                f"ModelSpec: experts={self.experts} needs a GPT configuration "
                f"(layers, hidden, ...), not only params={self.params}"
            )
        if not _whole(self.top_k) or not 1 <= self.top_k <= self.experts:
            raise ValueError(
                f"ModelSpec: top_k={self.top_k!r} must be an int in 1..experts={self.experts}"
            )
        cf = self.capacity_factor
        if isinstance(cf, bool) or not isinstance(cf, (int, float)) or not 0 < cf < float("inf"):
            raise ValueError(f"ModelSpec: capacity_factor={cf!r} must be a finite number > 0")

    def _check_arch(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"ModelSpec: arch={self.arch!r} must be one of {ARCHS}")
        if self.arch == "gpt":
            if self.kv_heads or self.ffn:
                raise ValueError(
                    f"ModelSpec: kv_heads={self.kv_heads}, ffn={self.ffn} describe "
                    "arch='llama'; the GPT has heads K/V heads, 4·hidden"
                )
            return
        if self.params is not None or self.experts:
            raise ValueError(
                "ModelSpec: arch='llama' needs its configuration (layers, hidden, "
                "heads, vocab, seq, ffn) and no experts"
            )
        for name in ("kv_heads", "ffn"):
            if not _whole(getattr(self, name)) or getattr(self, name) < 1:
                raise ValueError(
                    f"ModelSpec: arch='llama' needs {name}="
                    f"{getattr(self, name)!r} to be an int >= 1"
                )
        if _whole(self.heads) and self.heads % self.kv_heads:
            raise ValueError(
                f"ModelSpec: heads={self.heads} must be a multiple of kv_heads="
                f"{self.kv_heads} (each K/V head serves heads/kv_heads)"
            )

    @classmethod
    def llama(cls, cfg, frozen: tuple[str, ...] = ()) -> ModelSpec:
        """The spec of a `minidist.models_llama.LlamaConfig`."""
        return cls(
            cfg.layers,
            cfg.hidden,
            cfg.heads,
            cfg.vocab_size,
            cfg.seq_len,
            tuple(frozen),
            arch="llama",
            kv_heads=cfg.kv_heads,
            ffn=cfg.ffn,
        )

    @classmethod
    def gpt(cls, cfg: GPTConfig, frozen: tuple[str, ...] = (), **moe) -> ModelSpec:
        return cls(
            cfg.layers, cfg.hidden, cfg.heads, cfg.vocab_size, cfg.seq_len, tuple(frozen), **moe
        )

    @classmethod
    def of(cls, model: GPT) -> ModelSpec:
        """The spec of a built course GPT, its frozen parameters and MoE layers included."""
        frozen = tuple(n for n, p in model.named_parameters() if not p.requires_grad)
        if isinstance(model, LlamaForCausalLM):
            return cls.llama(model.cfg, frozen)
        moe = getattr(model.blocks[0].mlp, "moe", None) if len(model.blocks) else None
        if moe is None:
            return cls.gpt(model.cfg, frozen)
        return cls.gpt(
            model.cfg,
            frozen,
            experts=moe.num_experts,
            top_k=moe.k,
            capacity_factor=moe.capacity_factor,
        )

    @property
    def has_config(self) -> bool:
        return self.params is None

    @property
    def ffn_size(self) -> int:
        """Hidden units of a block's MLP: 4·hidden in the GPT, `ffn` in the Llama."""
        return self.ffn or 4 * self.hidden

    def config(self) -> GPTConfig | LlamaConfig:
        self._need_config("config")
        if self.arch == "llama":
            return LlamaConfig(
                self.vocab, self.seq, self.layers, self.heads, self.kv_heads, self.hidden, self.ffn
            )
        return GPTConfig(self.vocab, self.seq, self.layers, self.heads, self.hidden)

    def meta_model(self) -> GPT | LlamaForCausalLM:
        """The model on the `meta` device (shapes only), frozen parameters marked."""
        self._need_config("meta_model")
        moe = (self.experts, self.top_k, self.capacity_factor)
        llama = (self.kv_heads, self.ffn) if self.arch == "llama" else None
        return _meta_gpt(
            self.layers, self.hidden, self.heads, self.vocab, self.seq, self.frozen, moe, llama
        )

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
        blocks = [m for m in model.modules() if isinstance(m, (Block, LlamaDecoderLayer))]
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
def _meta_gpt(layers, hidden, heads, vocab, seq, frozen, moe=(0, 1, 1.0), llama=None) -> GPT:
    cfg = GPTConfig(vocab, seq, layers, heads, hidden)
    with torch.device("meta"):
        if llama is not None:
            model = LlamaForCausalLM(
                LlamaConfig(vocab, seq, layers, heads, *llama[:1], hidden, llama[1])
            )
        elif moe[0]:  # the planner plans lesson 16's MoE GPT too
            from ..expert_parallel.gpt import moe_gpt

            model = moe_gpt(cfg, *moe)
        else:
            model = GPT(cfg)
    names = dict(model.named_parameters())
    for name in frozen:
        if name not in names:
            raise ValueError(f"ModelSpec: frozen={name!r} is not a parameter of the model")
        names[name].requires_grad_(False)
    return model
