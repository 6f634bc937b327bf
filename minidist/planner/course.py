"""The course's own layouts as the planner describes them: for each tour row of lessons
01-10 and 14-16 the model, the layout, and which of the plan's numbers the row measures.

`course_plan("ZeRO-1", 4)` is the plan of what `minidist tour` runs under that name on 4
ranks; `tests/test_planner.py` asserts each prediction equals the row's measurement.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .plan import Plan, plan
from .spec import Layout, ModelSpec


@dataclass(frozen=True)
class CoursePlan:
    plan: Plan
    memory: float  # what the row's memory_per_rank measures, as predicted
    bytes: float  # what the row's bytes_per_rank measures, as predicted


def _gpt(**sizes) -> ModelSpec:
    from ..data_parallel.fixture import build

    return ModelSpec.of(build("gpt", **sizes).model)


def _states(model: ModelSpec, layout: Layout) -> CoursePlan:
    p = plan(model, layout)
    return CoursePlan(p, p.model_state_bytes, p.bytes_sent)


def _bus(model: ModelSpec, layout: Layout) -> CoursePlan:
    """Offload rows: device-tier states, and bytes over the bus (device <-> host)."""
    p = plan(model, layout)
    return CoursePlan(p, p.model_state_bytes, p.bus["device_to_host"] + p.bus["host_to_device"])


def _ddp(n: int) -> CoursePlan:
    from ..data_parallel.lesson import TOUR_MODEL

    sizes = {k: v for k, v in TOUR_MODEL.items() if k not in ("steps", "global_batch")}
    layout = Layout(dp=n, optimizer="sgd", global_batch=TOUR_MODEL["global_batch"])
    return _states(_gpt(**sizes), layout)


def _zero(stage: int, precision: str = "fp32") -> Callable[[int], CoursePlan]:
    from ..zero.lesson import TOUR_BUCKET_MB

    def course(n: int) -> CoursePlan:
        layout = Layout(dp=n, zero=stage, bucket_cap_mb=TOUR_BUCKET_MB, precision=precision)
        return _states(_gpt(), layout)

    return course


def _fsdp(hybrid: bool = False, precision: str = "fp32", offload: str = "device"):
    def course(n: int) -> CoursePlan:
        from ..fsdp.lesson import hybrid_shard_size

        shard = hybrid_shard_size(n) if hybrid else None
        layout = Layout(dp=n, zero=3, shard_size=shard, precision=precision, offload=offload)
        return (_bus if offload != "device" else _states)(_gpt(), layout)

    return course


def _forward_kept(model: ModelSpec, layout: Layout) -> tuple[Plan, float]:
    """The plan, and what forward keeps with every block recomputed: the plan's peak less
    the block rebuilt in backward (what lesson 06's rows measure)."""
    from .activations import recompute_working_bytes

    p = plan(model, layout)
    return p, p.memory["activations"] - recompute_working_bytes(model, layout)


def _recompute(n: int) -> CoursePlan:
    """The recompute row: lesson 06's GPT (4 blocks, dropout on) in one process, every block
    recomputed. Dropout does not enter: a recomputed block keeps only its input (its masks
    are drawn again when it re-runs)."""
    from ..recompute.fixture import DROPOUT_GPT

    p, kept = _forward_kept(_gpt(**DROPOUT_GPT), Layout(recompute=True))
    return CoursePlan(p, kept, 0.0)


def _fsdp_recompute(n: int) -> CoursePlan:
    """The FSDP + recompute row (each block's input, the embedding's indices, the head's).
    The course's ranks slice their batch out of the global one (`shard_batch` returns views),
    so the token ids and the targets autograd keeps are the global batch's storage, 8·s bytes
    more per sequence of the other ranks, each: a rank that loaded only its slice saves less."""
    model, layout = _gpt(), Layout(dp=n, zero=3, recompute=True)
    p, kept = _forward_kept(model, layout)
    views = 2 * 8 * model.seq * (layout.global_batch - layout.global_batch // n)
    return CoursePlan(p, kept + views, p.bytes_sent)


def _tensor_parallel(n: int) -> CoursePlan:
    from ..megatron.fixture import TP_GPT
    from ..megatron.lesson import tour_tp

    return _states(_gpt(**TP_GPT), Layout(tp=tour_tp(n), optimizer="sgd"))


def _parallel_layout(n: int) -> CoursePlan:
    from ..megatron.fixture import TP_GPT
    from ..megatron.lesson import layout_shape

    tp, dp = layout_shape(n)
    return _states(_gpt(**TP_GPT), Layout(tp=tp, dp=dp, optimizer="sgd"))


def _pipeline(n: int) -> CoursePlan:
    """The 1F1B row measures activations (stage 0's peak) and p2p bytes."""
    from ..pipeline.fixture import PP_GPT
    from ..pipeline.lesson import TOUR_M

    model = _gpt(**PP_GPT)
    p = plan(model, Layout(pp=min(n, model.layers), microbatches=TOUR_M, optimizer="sgd"))
    return CoursePlan(p, p.memory["activations"], p.bytes_sent)


def _three_d(n: int) -> CoursePlan:
    from ..three_d.lesson import tour_shape
    from ..three_d.run import GPT_3D, MICROBATCHES

    tp, pp, dp = tour_shape(n)
    sizes = {k: v for k, v in GPT_3D.items() if k not in ("steps", "global_batch")}
    layout = Layout(
        dp=dp,
        tp=tp,
        pp=pp,
        zero=1,
        optimizer="sgd",
        microbatches=MICROBATCHES,
        global_batch=GPT_3D["global_batch"],
    )
    return _states(_gpt(**sizes), layout)


def _split_sequences(model: ModelSpec, batch: int, **switch) -> CoursePlan:
    """Lessons 14 and 15's rows: trained with SGD + momentum on the global batches of 8,
    bytes per step; the memory column is one block's saved activations per rank for
    `batch` sequences (`activations.layer_bytes`)."""
    from .activations import layer_bytes

    p = plan(model, Layout(optimizer="sgd", **switch))
    return CoursePlan(p, layer_bytes(model, Layout(global_batch=batch, **switch)), p.bytes_sent)


def _sequence_parallel(n: int) -> CoursePlan:
    """Lesson 07's GPT (4 heads), `TensorParallelGPT(..., sequence_parallel=True)`."""
    from ..megatron.fixture import TP_GPT
    from ..megatron.lesson import tour_tp
    from ..sequence_parallel.lesson import ACT_BATCH

    return _split_sequences(_gpt(**TP_GPT), ACT_BATCH, tp=tour_tp(n), sp=True)


def _context_parallel(n: int) -> CoursePlan:
    """Lesson 07's GPT (4 heads), `ContextParallelGPT` (zig-zag), the activations measured
    on `layer_activations_rank`'s default batch."""
    import inspect

    from ..context_parallel.fixture import layer_activations_rank
    from ..context_parallel.lesson import tour_cp
    from ..megatron.fixture import TP_GPT

    batch = inspect.signature(layer_activations_rank).parameters["batch"].default
    return _split_sequences(_gpt(**TP_GPT), batch, cp=tour_cp(n))


def _expert_parallel_gpt(n: int) -> CoursePlan:
    """Lesson 16's MoE GPT, `ExpertParallelGPT` padded to capacity, e = 2 × d = n/2, SGD with
    momentum on global batches of GPT_BATCH: model states and bytes per step."""
    from ..expert_parallel.fixture import GPT_BATCH, build_gpt

    e = 2 if n % 2 == 0 else 1
    model = ModelSpec.of(build_gpt(n, steps=0)[0])
    return _states(model, Layout(dp=n, ep=e, optimizer="sgd", global_batch=GPT_BATCH))


COURSE_LAYOUTS: dict[str, Callable[[int], CoursePlan]] = {
    "bucketed DDP": _ddp,
    "ZeRO-1": _zero(1),
    "ZeRO-2": _zero(2),
    "FSDP (ZeRO-3)": _fsdp(),
    "FSDP hybrid": _fsdp(hybrid=True),
    "FSDP + bf16": _fsdp(precision="mixed"),
    "ZeRO-2 + bf16": _zero(2, "mixed"),
    "FSDP + CPU offload": _fsdp(offload="cpu"),
    "FSDP + disk offload": _fsdp(offload="disk"),
    "recompute": _recompute,
    "FSDP + recompute": _fsdp_recompute,
    "tensor parallel": _tensor_parallel,
    "parallel layout": _parallel_layout,
    "pipeline 1F1B": _pipeline,
    "3D (TP x PP x DP)": _three_d,
    "sequence parallel": _sequence_parallel,
    "context parallel": _context_parallel,
    "expert parallel GPT": _expert_parallel_gpt,
}


def course_plan(row: str, world_size: int) -> CoursePlan:
    """The planner's prediction for tour row `row` on `world_size` ranks."""
    if row not in COURSE_LAYOUTS:
        raise ValueError(f"course_plan: row={row!r} is not one of {sorted(COURSE_LAYOUTS)}")
    return COURSE_LAYOUTS[row](world_size)
