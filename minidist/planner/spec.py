"""What the planner is asked about: a model (`ModelSpec`) and a layout (`Layout`).

A `ModelSpec` is either a GPT configuration (layers, hidden, heads, vocabulary, sequence;
the course's `minidist.models.GPT`, tied embeddings, learned positions) or only a parameter
count (`ModelSpec(params=P)`: then only model states and data-parallel traffic can be
planned). With a configuration the planner builds the model on the `meta` device, which
allocates nothing whatever its size, so bucket plans, FSDP units and frozen parameters are
those of the real module, exactly.

A `Layout` names every choice of lessons 01-10 and 14-16: dp × tp × pp × cp, the ZeRO stage
(3 = FSDP, hybrid or not), micro-batches and schedule, precision, recomputation, offload, sp,
and ep (the experts' ranks, carved out of dp as Megatron-core does).
Each technique is one field, refused by name (`__post_init__`, `check`) where the course does
not run it, and one branch of `predict` / `activations` calling its lesson's theory.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..pipeline.schedules import KINDS as SCHEDULES
from ..pipeline.schedules import V_SHAPED
from .model_spec import MAX_LAYERS, ModelSpec, _whole  # noqa: F401 (importable from here)

OPTIMIZERS = ("sgd", "adam")  # sgd: with momentum (one fp32 buffer), adam: two
PRECISIONS = ("fp32", "mixed")  # mixed: 16-bit compute copies, fp32 masters (ZeRO 3.1)
OFFLOAD = ("device", "cpu", "disk")


@dataclass(frozen=True)
class Layout:
    """dp × tp × pp × cp ranks and how each lesson's technique is configured.

    `zero`: 0 (DDP), 1 and 2 (ZeRO stages, optimizer states and gradients sharded over
    dp), 3 (FSDP: parameters too; `shard_size` F < dp shards over groups of F and
    replicates across them, hybrid sharding). `microbatches` and `schedule` (one of the
    pipeline lesson's) for pp; `virtual` chunks per rank for "interleaved".
    `global_batch` sequences per step, split over dp replicas, then into micro-batches.
    `sp`: sequence parallelism in tp (lesson 14; Korthikanti et al. 2022, section 4.2.2).
    `cp`: ranks sharing each sequence, zig-zag split (lesson 15; Liu et al. 2023), with DDP
    across (Megatron-LM reduces the gradients over the data × context ranks).
    `ep`: ranks each MoE layer's experts are spread over (lesson 16; Lepikhin et al. 2020),
    a divisor of dp: blocks of ep consecutive data-parallel ranks exchange tokens, and the
    dp/ep ranks holding the same experts reduce their gradients. The world stays dp·tp·pp·cp.
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
    sp: bool = False
    cp: int = 1
    ep: int = 1

    def __post_init__(self):
        for name in ("dp", "tp", "pp", "cp", "ep", "microbatches", "virtual", "global_batch"):
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
        if self.schedule == "dualpipev" and self.pp > 1 and self.microbatches < 2 * self.pp:
            raise ValueError(
                f"Layout: dualpipev needs microbatches={self.microbatches} >= 2 × pp = "
                f"{2 * self.pp} (both chunks' pipelines full before the overlapped pairs)"
            )
        if self.schedule == "interleaved" and self.microbatches % self.pp:
            raise ValueError(
                f"Layout: the interleaved schedule needs microbatches={self.microbatches} to be "
                f"a multiple of pp={self.pp}"
            )
        if not self.bucket_cap_mb > 0 or self.bucket_cap_mb == float("inf"):
            raise ValueError(f"Layout: bucket_cap_mb={self.bucket_cap_mb} must be finite and > 0")
        self._check_sequence_splits()
        self._check_experts()

    def _check_experts(self) -> None:
        """ep: the combination lesson 16 runs (`ExpertParallelGPT`: EP × DP), else refused."""
        if self.ep == 1:
            return
        if self.dp % self.ep:
            raise ValueError(
                f"Layout: ep={self.ep} must divide dp={self.dp} (the experts' "
                "ranks are carved out of the data-parallel ones)"
            )
        _moe_layout_only(self, f"ep={self.ep}")

    def _check_sequence_splits(self) -> None:
        """sp and cp: the combinations lessons 14 and 15 run, refused by name otherwise."""
        if not isinstance(self.sp, bool):
            raise ValueError(f"Layout: sp={self.sp!r} must be True or False")
        if self.sp and (self.tp == 1 or self.pp > 1):
            raise ValueError(
                f"Layout: sp=True needs tp > 1 and pp=1, not tp={self.tp}, pp={self.pp}: lesson "
                "14 splits the tensor-parallel group's replicated parts of a whole model; "
                "lesson 17 plans such "
                "layouts composed (python -m minidist plan --model ...)"
            )
        if self.cp > 1 and (self.tp > 1 or self.pp > 1 or self.zero != 0):
            raise ValueError(
                f"Layout: cp={self.cp} with tp={self.tp}, pp={self.pp}, zero={self.zero}: "
                "lesson 15 composes context parallelism with DDP (zero=0) only; "
                "lesson 17 plans such "
                "layouts composed (python -m minidist plan --model ...)"
            )

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

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
        self._check_model(model, world)
        if model.arch == "llama" and (self.sp or self.cp > 1):
            raise ValueError(
                f"Layout: sp={self.sp}, cp={self.cp} with arch='llama': the planner "
                "plans the Llama with dp, tp, pp and ZeRO"
            )
        if self.zero and self.optimizer != "adam" and self.tp == self.pp == 1 and not model.experts:
            raise ValueError(
                f"Layout: zero={self.zero} with optimizer={self.optimizer!r}: the course's "
                "ZeRO and FSDP step Adam (K = 12 bytes of state per parameter in ZeRO's count)"
            )
        if model.experts:
            _moe_layout_only(self, f"a model with experts={model.experts}")
            if model.experts % self.ep:
                raise ValueError(
                    f"Layout: ep={self.ep} must divide experts={model.experts} "
                    "(E/ep experts per rank)"
                )
        elif self.ep > 1:
            raise ValueError(
                f"Layout: ep={self.ep} needs a model with experts (ModelSpec("
                "..., experts=E)): a dense GPT has none to place"
            )

    def _check_model(self, model: ModelSpec, world: int | None) -> None:
        """Raise (naming the values) if this layout cannot run `model` on `world` ranks."""
        if world is not None and self.world != world:
            raise ValueError(
                f"Layout: dp={self.dp} × tp={self.tp} × pp={self.pp} × cp={self.cp} = "
                f"{self.world} ranks, not the world of {world}"
            )
        if (self.tp > 1 or self.pp > 1 or self.cp > 1) and not model.has_config:
            raise ValueError(
                f"Layout: tp={self.tp}, pp={self.pp}, cp={self.cp} need a model configuration, "
                f"not only params={model.params}"
            )
        if not model.has_config:
            return
        if model.heads % self.tp or model.hidden % self.tp:
            raise ValueError(
                f"Layout: tp={self.tp} must divide heads={model.heads} and hidden={model.hidden}"
            )
        if self.sp and model.seq % self.tp:
            raise ValueError(
                f"Layout: sp=True needs seq={model.seq} divisible by tp={self.tp} (each tp "
                "rank keeps one block of the sequence)"
            )
        if self.cp > 1 and model.seq % (2 * self.cp):
            raise ValueError(
                f"Layout: cp={self.cp} needs seq={model.seq} divisible by 2·cp={2 * self.cp} "
                "(the zig-zag split: two chunks per rank)"
            )
        if self.pp > model.layers:
            raise ValueError(f"Layout: pp={self.pp} exceeds layers={model.layers}")
        if self.pp > 1 and self.schedule in V_SHAPED:
            self._check_v_shaped(model)
        if (self.tp > 1 or self.pp > 1) and self.zero > 1:
            raise ValueError(
                f"Layout: with tp={self.tp} or pp={self.pp} the course composes ZeRO-1 at most "
                f"(lesson 10), not zero={self.zero}"
            )

    def _check_v_shaped(self, model: ModelSpec) -> None:
        """ZB-V and DualPipeV: 2p chunks of the dense GPT, as lesson 09's engine runs them."""
        if 2 * self.pp > model.layers:
            raise ValueError(
                f"Layout: {self.schedule} needs layers={model.layers} >= 2 × pp = "
                f"{2 * self.pp} (two chunks per rank, placed in a V)"
            )
        bad = {}
        if self.tp > 1:
            bad["tp"] = self.tp
        if self.recompute:
            bad["recompute"] = True
        if model.arch != "gpt":
            bad["arch"] = model.arch
        _refuse(
            f"schedule={self.schedule!r}",
            bad,
            "lesson 09 runs the V schedules on the dense GPT (tp=1, no recompute)",
        )


def _moe_layout_only(layout: Layout, what: str) -> None:
    """Refuse, naming `what`, what lesson 16 does not run with experts: it trains the MoE GPT
    with data and expert parallelism only, one micro-batch (a capacity per step)."""
    others = dict(
        tp=layout.tp, pp=layout.pp, cp=layout.cp, zero=layout.zero, microbatches=layout.microbatches
    )
    bad = {k: v for k, v in others.items() if v != (0 if k == "zero" else 1)}
    if layout.recompute:
        bad["recompute"] = True
    _refuse(
        what,
        bad,
        "lesson 16 runs experts with data and expert parallelism only "
        "(tp=pp=cp=1, zero=0, microbatches=1, no recompute)",
    )


def _refuse(what: str, bad: dict, which_lesson_runs: str) -> None:
    """One line naming each setting of `bad` the lesson that runs `what` does not, and where
    such a layout is planned instead."""
    if bad:
        named = ", ".join(f"{k}={v!r}" for k, v in bad.items())
        raise ValueError(
            f"Layout: {what} with {named}: {which_lesson_runs}; lesson 17 plans "
            "such layouts composed (python -m minidist plan --model ...)"
        )
