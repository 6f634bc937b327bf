"""What a rank returns reaches the parent on the CPU (runtime/host.py), and each rank's peak
CUDA memory reaches `cuda_peaks()` (runtime/cuda_memory.py). Checked on CPUs: with tensors
that report a GPU, as an NCCL rank's do, and with the CUDA memory calls replaced."""

import math
from typing import NamedTuple

import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

import minidist
from minidist.runtime import cuda_memory, cuda_peaks, on_host
from minidist.training import TrainTrace


class OnGPU(torch.Tensor):
    """A CPU tensor that reports `cuda:1`, as a tensor an NCCL rank returns does; `.cpu()` and
    `.to()` give the plain tensor, as a copy to the host would."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func == torch.Tensor.device.__get__:
            return torch.device("cuda", 1)
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **(kwargs or {}))
            if func in (torch.Tensor.cpu, torch.Tensor.to):
                return out.as_subclass(torch.Tensor)
        return torch._tensor._convert(out, cls)


class OnGPUParameter(torch.nn.Parameter):
    """A parameter that reports `cuda:1`, as an NCCL rank's model's do."""

    __torch_function__ = OnGPU.__torch_function__


class Run(NamedTuple):  # the shape of the fixtures' results: a trace, params, extras
    trace: TrainTrace
    params: dict
    tied: list


def _on_gpu(values: list[float], requires_grad: bool = False) -> torch.Tensor:
    t = torch.tensor(values, device="cpu", requires_grad=requires_grad)
    return t.as_subclass(OnGPU)


def _returns_gpu_tensors() -> Run:
    r = float(dist.get_rank())
    w = _on_gpu([r, r + 1])
    trace = TrainTrace([1.0, 0.5], {"w": _on_gpu([r])}, {"w": w})
    return Run(trace, {"w": w, "b": _on_gpu([2 * r], requires_grad=True)}, [w, (w, r)])


def _tensors(obj) -> list:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    elif hasattr(obj, "__dict__"):
        obj = list(vars(obj).values())
    if isinstance(obj, list | tuple):
        return [t for item in obj for t in _tensors(item)]
    return []


def test_a_ranks_gpu_tensors_come_back_as_cpu_tensors():
    assert _on_gpu([0.0]).device.type == "cuda"  # the fake says so
    runs = minidist.launch(_returns_gpu_tensors, 2)
    for rank, run in enumerate(runs):
        found = _tensors(run)
        assert len(found) == 6
        for t in found:
            assert type(t) is torch.Tensor and t.device.type == "cpu", (type(t), t.device)
        assert torch.equal(run.params["w"], torch.tensor([rank, rank + 1.0], device="cpu"))
        assert run.params["b"].requires_grad and not run.params["w"].requires_grad
        assert run.tied[0] is run.params["w"]  # one tensor returned twice is one tensor
    model = torch.nn.Linear(2, 2, device="cpu")
    model.weight = OnGPUParameter(torch.ones(2, 2, device="cpu"))
    model.weight.tp_split = 0  # the attributes a wrapper puts on its parameters
    assert model.weight.device.type == "cuda"
    local = on_host({"model": model, "g": _on_gpu([1.0])})
    weight = local["model"].weight
    assert type(weight) is torch.nn.Parameter and weight.device.type == "cpu"
    assert weight.requires_grad and weight.tp_split == 0 and torch.equal(weight, model.weight)
    assert type(local["g"]) is torch.Tensor and local["g"].device.type == "cpu"


_FAKE = {"peak": -1}  # the CUDA allocator's peak counter, as the replaced calls see it


def _allocates() -> int:
    if _FAKE["peak"] == 0:  # counted from a reset before this function ran
        _FAKE["peak"] = 100 * (dist.get_rank() + 1)
    return dist.get_rank()


def test_each_ranks_peak_cuda_memory_reaches_cuda_peaks(monkeypatch):
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: _FAKE.update(peak=0))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: _FAKE["peak"])
    with cuda_peaks() as peaks:  # gloo worlds: nothing measured, nothing recorded
        assert minidist.launch(_allocates, 2) == [0, 1]
    assert peaks == [] and _FAKE["peak"] == -1
    monkeypatch.setattr(cuda_memory, "wanted", lambda backend: bool(cuda_memory._active))
    with cuda_peaks() as outer:
        minidist.launch(_allocates, 2)
        with cuda_peaks() as inner:
            minidist.launch(_allocates, 3)
    assert outer == [[100, 200], [100, 200, 300]] and inner == [[100, 200, 300]]
    minidist.launch(_allocates, 2)  # no block open: nothing asked of the ranks
    assert cuda_memory._active == [] and outer == [[100, 200], [100, 200, 300]]


DTYPES = [
    torch.float32,
    torch.float64,
    torch.bfloat16,
    torch.float16,
    torch.float8_e4m3fn,
    torch.int64,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
]


def _tensors_of_every_kind(rank: int) -> dict:
    """Tensors of every dtype and of shapes 0-d, empty, odd; a Parameter with an attribute;
    a view of a larger storage; a transposed (non-contiguous) one; a sparse one; a lazily
    conjugated and a lazily negated one."""
    g = torch.Generator().manual_seed(rank)
    out = {}
    for i, dtype in enumerate(DTYPES):
        shape = [(), (0, 3), (3, 5), (7,)][i % 4]
        out[str(dtype)] = (torch.randn(shape, generator=g, device="cpu") * 3).to(dtype)
    weight = torch.nn.Parameter(torch.randn(3, 2, generator=g, device="cpu"))
    weight.tp_split = (0, rank)
    base = torch.arange(10.0, device="cpu") + rank
    out.update(
        weight=weight,
        weight_again=weight,  # one Parameter returned twice is still one
        view=base[3:7],
        transposed=torch.randn(3, 5, generator=g, device="cpu").t(),
        transposed_float8=torch.randn(3, 5, generator=g, device="cpu").to(torch.float8_e4m3fn).t(),
        grad_leaf=torch.ones(2, requires_grad=True, device="cpu") * 1,  # not a leaf
        sparse=torch.eye(3, device="cpu").to_sparse(),
        # lazily conjugated or negated: their bytes are not their values
        conjugate=torch.randn(3, dtype=torch.complex64, generator=g, device="cpu").conj(),
        negated=torch._neg_view(torch.randn(4, generator=g, device="cpu")),
    )
    return out


def _gathers_every_kind() -> tuple:
    everyone = [None] * dist.get_world_size()
    minidist.comm.all_gather_object(everyone, _tensors_of_every_kind(dist.get_rank()))
    return everyone, _tensors_of_every_kind(dist.get_rank())


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _same_tensors(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for name, w in want.items():
        g = got[name]
        assert type(g) is type(w) and g.dtype == w.dtype and g.shape == w.shape, name
        assert g.requires_grad == w.requires_grad and g.layout == w.layout, name
        if w.layout == torch.strided:
            w, g = w.resolve_conj().resolve_neg(), g.resolve_conj().resolve_neg()
            assert torch.equal(_bytes(g), _bytes(w)), name  # NaN, float8: exactly
        else:
            assert torch.equal(g.to_dense(), w.to_dense()), name
    assert (
        got["weight"] is got["weight_again"] and got["weight"].tp_split == want["weight"].tp_split
    )
    assert got["view"].untyped_storage().nbytes() == 16  # the view's 4 floats, not the 10
    for g in got.values():
        if g.layout == torch.strided:
            g.detach().zero_()  # writable, not a read-only buffer


def test_tensors_of_every_dtype_and_shape_come_back_and_gather_bit_for_bit():
    ranks = minidist.launch(_gathers_every_kind, 3)
    for rank, (everyone, mine) in enumerate(ranks):
        _same_tensors(mine, _tensors_of_every_kind(rank))
        for other, theirs in enumerate(everyone):
            _same_tensors(theirs, _tensors_of_every_kind(other))


def test_a_plain_cpu_tensor_travels_as_its_bytes_not_as_a_torch_save_file():
    import pickle

    from minidist.runtime import dumps_on_host

    data = dumps_on_host([torch.randn(64, 32, device="cpu") for _ in range(3)])
    assert b"_load_from_bytes" not in data and b"_from_bytes" in data
    assert len(data) < 3 * 64 * 32 * 4 + 1024  # the bytes and little else
    assert b"_load_from_bytes" in pickle.dumps(
        torch.randn(2, device="cpu")
    )  # torch's own way, for contrast


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    shape=st.lists(st.integers(0, 5), min_size=0, max_size=3),
    transpose=st.booleans(),
    offset=st.integers(0, 3),
)
def test_any_dtype_shape_and_layout_comes_back_bit_for_bit(dtype, shape, transpose, offset):
    """`on_host` (the pickling of a rank's result) over sampled dtypes, shapes (0-d, empty,
    sizes 3 and 5), transposed and offset views: each comes back as its own bytes (torch's
    pickling failed on a transposed float8 tensor, found by this test)."""
    g = torch.Generator().manual_seed(len(shape) * 7 + offset)
    numel = offset + math.prod(shape)
    base = (torch.randn(numel, generator=g, device="cpu") * 3).to(dtype)
    t = base[offset:].view(shape)
    if transpose and t.dim() >= 2:
        t = t.transpose(0, 1)
    back = on_host(t)
    assert back.dtype == t.dtype and back.shape == t.shape
    assert torch.equal(_bytes(back), _bytes(t))
    assert back.is_contiguous() and back.untyped_storage().nbytes() == t.nbytes  # its bytes
