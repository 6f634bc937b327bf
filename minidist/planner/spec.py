"""What the planner is asked about: a model (`ModelSpec`) and a layout (`Layout`).

A `ModelSpec` is either a GPT configuration (layers, hidden, heads, vocabulary, sequence;
the course's `minidist.models.GPT`, tied embeddings, learned positions) or only a parameter
count (`ModelSpec(params=P)`: then only model states and data-parallel traffic can be
planned). With a configuration the planner builds the model on the `meta` device, which
allocates nothing whatever its size, so bucket plans, FSDP units and frozen parameters are
those of the real module, exactly.

A `Layout` names every choice of lessons 01-10: the degrees dp × tp × pp, the ZeRO stage
(3 = FSDP, with an optional hybrid shard group), micro-batches and the pipeline schedule,
the precision, recomputation and where the optimizer lives (device, cpu, disk).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..models import GPT, Block, GPTConfig
from ..pipeline.schedules import KINDS as SCHEDULES

OPTIMIZERS = ("sgd", "adam")  # sgd: with momentum (one fp32 buffer), adam: two
PRECISIONS = ("fp32", "mixed")  # mixed: 16-bit compute copies, fp32 masters (ZeRO 3.1)
OFFLOAD = ("device", "cpu", "disk")
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

    def __post_init__(self):
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

    @classmethod
    def gpt(cls, cfg: GPTConfig, frozen: tuple[str, ...] = ()) -> ModelSpec:
        return cls(cfg.layers, cfg.hidden, cfg.heads, cfg.vocab_size, cfg.seq_len, tuple(frozen))

    @classmethod
    def of(cls, model: GPT) -> ModelSpec:
        """The spec of a built course GPT, its frozen parameters included."""
        frozen = tuple(n for n, p in model.named_parameters() if not p.requires_grad)
        return cls.gpt(model.cfg, frozen)

    @property
    def has_config(self) -> bool:
        return self.params is None

    def config(self) -> GPTConfig:
        self._need_config("config")
        return GPTConfig(self.vocab, self.seq, self.layers, self.heads, self.hidden)

    def meta_model(self) -> GPT:
        """The model on the `meta` device (shapes only), frozen parameters marked."""
        self._need_config("meta_model")
        return _meta_gpt(self.layers, self.hidden, self.heads, self.vocab, self.seq, self.frozen)

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
def _meta_gpt(layers, hidden, heads, vocab, seq, frozen) -> GPT:
    with torch.device("meta"):
        model = GPT(GPTConfig(vocab, seq, layers, heads, hidden))
    names = dict(model.named_parameters())
    for name in frozen:
        if name not in names:
            raise ValueError(f"ModelSpec: frozen={name!r} is not a parameter of the GPT")
        names[name].requires_grad_(False)
    return model


@dataclass(frozen=True)
class Layout:
    """dp × tp × pp ranks and how each lesson's technique is configured.

    `zero`: 0 (DDP), 1 and 2 (ZeRO stages, optimizer states and gradients sharded over
    dp), 3 (FSDP: parameters too; `shard_size` F < dp shards over groups of F and
    replicates across them, hybrid sharding). `microbatches` and `schedule` (one of the
    pipeline lesson's) for pp; `virtual` chunks per rank for "interleaved".
    `global_batch` sequences per step, split over dp replicas, then into micro-batches.
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 0
    shard_size: int | None = None
    microbatches: int = 1
    schedule: str = "1f1b"
    virtual: int = 1
    precision: str = "fp32"
    reduce_in_fp32: bool = True  # mixed precision: gradients reduced in fp32 (the course's
    # `MixedPrecision(reduce_dtype=torch.float32)` default) or in the 16-bit compute type
    optimizer: str = "adam"
    recompute: bool = False
    offload: str = "device"
    global_batch: int = 8
    bucket_cap_mb: float = 25.0

    def __post_init__(self):
        for name in ("dp", "tp", "pp", "microbatches", "virtual", "global_batch"):
            if not _whole(getattr(self, name)):
                raise ValueError(f"Layout: {name}={getattr(self, name)!r} must be an int")
            if getattr(self, name) < 1:
                raise ValueError(f"Layout: {name}={getattr(self, name)} must be >= 1")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"Layout: zero={self.zero} must be 0, 1, 2 or 3 (3 = FSDP)")
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"Layout: schedule={self.schedule!r} is not one the pipeline lesson knows "
                f"{SCHEDULES}"
            )
        if self.precision not in PRECISIONS:
            raise ValueError(f"Layout: precision={self.precision!r} must be one of {PRECISIONS}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"Layout: optimizer={self.optimizer!r} must be one of {OPTIMIZERS}")
        if self.offload not in OFFLOAD:
            raise ValueError(f"Layout: offload={self.offload!r} must be one of {OFFLOAD}")
        if self.offload != "device" and self.zero != 3:
            raise ValueError(
                f"Layout: offload={self.offload!r} needs zero=3 (lesson 05 offloads FSDP's "
                f"shards), not zero={self.zero}"
            )
        if self.shard_size is not None:
            if self.zero != 3 or self.dp % self.shard_size:
                raise ValueError(
                    f"Layout: shard_size={self.shard_size} needs zero=3 and must divide "
                    f"dp={self.dp} (hybrid sharding)"
                )
        if self.global_batch % (self.dp * self.microbatches):
            raise ValueError(
                f"Layout: global_batch={self.global_batch} must divide by dp={self.dp} × "
                f"microbatches={self.microbatches}"
            )
        if self.virtual != 1 and self.schedule != "interleaved":
            raise ValueError(
                f"Layout: virtual={self.virtual} chunks per rank need schedule='interleaved', "
                f"not {self.schedule!r} (which runs one chunk per rank)"
            )
        if self.schedule == "interleaved" and self.microbatches % self.pp:
            raise ValueError(
                f"Layout: the interleaved schedule needs microbatches={self.microbatches} to be "
                f"a multiple of pp={self.pp}"
            )
        if not self.bucket_cap_mb > 0 or self.bucket_cap_mb == float("inf"):
            raise ValueError(f"Layout: bucket_cap_mb={self.bucket_cap_mb} must be finite and > 0")

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def micro_batch(self) -> int:
        """Sequences per micro-batch on one replica."""
        return self.global_batch // (self.dp * self.microbatches)

    @property
    def element_bytes(self) -> int:
        """Bytes of a compute element: parameters, gradients and activations."""
        return 4 if self.precision == "fp32" else 2

    @property
    def reduce_bytes(self) -> int:
        """Bytes of a gradient element as the data-parallel collectives send it."""
        return 4 if self.reduce_in_fp32 else self.element_bytes

    def check(self, model: ModelSpec, world: int | None = None) -> None:
        """Raise (naming the values) if this layout cannot run `model` on `world` ranks."""
        if world is not None and self.world != world:
            raise ValueError(
                f"Layout: dp={self.dp} × tp={self.tp} × pp={self.pp} = {self.world} ranks, "
                f"not the world of {world}"
            )
        if (self.tp > 1 or self.pp > 1) and not model.has_config:
            raise ValueError(
                f"Layout: tp={self.tp}, pp={self.pp} need a model configuration, not only "
                f"params={model.params}"
            )
        if not model.has_config:
            return
        if model.heads % self.tp or model.hidden % self.tp:
            raise ValueError(
                f"Layout: tp={self.tp} must divide heads={model.heads} and hidden={model.hidden}"
            )
        if self.pp > model.layers:
            raise ValueError(f"Layout: pp={self.pp} exceeds layers={model.layers}")
        if (self.tp > 1 or self.pp > 1) and self.zero > 1:
            raise ValueError(
                f"Layout: with tp={self.tp} or pp={self.pp} the course composes ZeRO-1 at most "
                f"(lesson 10), not zero={self.zero}"
            )
