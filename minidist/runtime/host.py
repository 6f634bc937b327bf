"""Results come back on the host: what a rank returns is pickled with its tensors on the CPU.

Under NCCL rank r computes on `cuda:r`, so what its function returns (final parameters,
gradients, the tensors a ledger kept) may hold CUDA tensors. Pickled as they are, they would
be rebuilt in the parent on that rank's GPU: the parent would initialise CUDA (and from then
on start its worlds with spawn), hold each rank's tensors on a different GPU, and fail to
compare them with its own CPU reference ("Expected all tensors to be on the same device").
So a rank's result is pickled by `dumps_on_host`: cloudpickle, with every tensor that is not
on the CPU replaced by a CPU copy (an `nn.Parameter` stays a Parameter; `requires_grad` and
the tensor's Python attributes are kept). The parent gets CPU tensors whichever device a rank
computed on. Two tensors that are views of one storage come back as separate copies (one
tensor returned twice is still one tensor). `on_host(obj)` is the same round trip in one
process, for the results a torchrun world gathers; `comm.all_gather_object` pickles so too.

A dense CPU tensor travels as its raw bytes, in its logical order (a transposed one comes back
contiguous): torch's own pickling saves and loads each storage as a small `torch.save` file,
8 times slower for the hundreds of small tensors a model's state is (a 32 × 64 float32
tensor there and back: 135 µs against 16 µs), sends a view's whole storage, and fails on a
float8 tensor's. Other tensors (subclasses such as DTensor, sparse, quantized, lazily
conjugated or negated) keep torch's pickling.
"""

from __future__ import annotations

import io
import pickle

import cloudpickle
import torch


def _rebuild(host: torch.Tensor, parameter: bool, requires_grad: bool, attrs: dict):
    """The CPU copy as the parent gets it: a Parameter if it was one, the same
    `requires_grad`, the Python attributes it carried (`tp_split`, ...)."""
    out = torch.nn.Parameter(host, requires_grad) if parameter else host
    out.requires_grad_(requires_grad)
    out.__dict__.update(attrs)
    return out


def _from_bytes(data: bytearray, dtype, shape, parameter: bool, requires_grad: bool, attrs):
    """A tensor `_HostPickler` sent as its bytes (a writable bytearray: no copy here)."""
    if len(data):
        host = torch.frombuffer(data, dtype=torch.uint8).view(dtype).view(shape)
    else:
        host = torch.empty(shape, dtype=dtype, device="cpu")
    return _rebuild(host, parameter, requires_grad, attrs)


def _plain(t: torch.Tensor) -> bool:
    """A dense CPU tensor or Parameter (no subclass, no lazy conjugate)."""
    return (
        type(t) in (torch.Tensor, torch.nn.Parameter)
        and t.device.type == "cpu"
        and t.layout == torch.strided
        and not t.is_quantized
        and not (t.is_conj() or t.is_neg())
    )


class _HostPickler(cloudpickle.Pickler):
    """cloudpickle, with every tensor off the CPU pickled as its CPU copy, and a plain CPU
    tensor as its bytes."""

    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor):
            parameter = isinstance(obj, torch.nn.Parameter)
            meta = (parameter, obj.requires_grad, dict(obj.__dict__))
            if obj.device.type not in ("cpu", "meta"):
                return _rebuild, (obj.detach().cpu(), *meta)
            if _plain(obj):
                # protocol 5 pickles a writable buffer as a bytearray, which loads writable
                flat = obj.detach().contiguous().reshape(-1)
                data = pickle.PickleBuffer(flat.view(torch.uint8).numpy())
                return _from_bytes, (data, obj.dtype, tuple(obj.shape), *meta)
        return super().reducer_override(obj)


def dumps_on_host(obj) -> bytes:
    """`cloudpickle.dumps(obj)`, with the tensors `obj` holds off the CPU pickled as CPU
    copies (`cloudpickle.loads` reads it back)."""
    with io.BytesIO() as buffer:
        _HostPickler(buffer, protocol=cloudpickle.DEFAULT_PROTOCOL).dump(obj)
        return buffer.getvalue()


def on_host(obj):
    """A copy of `obj` whose tensors are all on the CPU."""
    return cloudpickle.loads(dumps_on_host(obj))
