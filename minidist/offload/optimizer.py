"""Optimizer state off the compute device: in host memory, or in files on disk.

Ren et al. 2021, "ZeRO-Offload: Democratizing Billion-Scale Model Training" (USENIX ATC),
section 4: the fp32 master parameters, the gradients and the optimizer state live in CPU
memory and the CPU runs the optimizer; per step the device sends its gradients down and
gets the updated parameters back, at least 4Ψ bytes over the bus in mixed precision (2Ψ
each way), the minimum any placement that leaves the update on the CPU can move.
Rajbhandari et al. 2021, "ZeRO-Infinity" (SC), section 5: the same states one tier lower,
on NVMe; here, memory-mapped files (`torch.from_file`), so the disk tier is real and its
bytes measurable on any machine.

`OffloadOptimizer` wraps the parameters a technique steps (e.g. FSDP's or ZeRO's chunks):
each `step()` copies their gradients to the host masters (non-blocking from a GPU into
pinned memory), steps the inner optimizer there, and copies the masters back. It counts
the bytes each tier holds (`tier_bytes`, measured per storage and, for the disk tier, per
file; `resident_bytes` sums them) and the bytes it moves (`moved`, counted at every copy).
The formulas are in `theory.py`. Not here: overlapping the copies with backward
(ZeRO-Offload streams gradients bucket by bucket), its vectorised CPU Adam and one-step
delayed parameter update, asynchronous NVMe I/O (ZeRO-Infinity). The torch-native
equivalent is FSDP2's `CPUOffloadPolicy` (`fully_shard(..., offload_policy=...)`), which
offloads the sharded parameters as well and steps the optimizer on the CPU.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import weakref

import torch

from ..memory import tensor_bytes
from ..runtime.parent import remember_folder
from ..training import OptimizerWrapper

TIERS = ("cpu", "disk")
DISK_OPTIMIZERS = (torch.optim.Adam, torch.optim.AdamW)


def _remove(directory: str, marker: str | None) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    if marker is not None:
        with contextlib.suppress(OSError):
            os.remove(marker)


class OffloadOptimizer(OptimizerWrapper):
    """`optimizer_class` stepping host copies of `params`; states in RAM or on disk."""

    def __init__(
        self,
        params,
        optimizer_class: type[torch.optim.Optimizer] = torch.optim.Adam,
        tier: str = "cpu",
        path: str | None = None,
        **defaults,
    ):
        params = [p for p in params if p.requires_grad]
        if tier not in TIERS:
            raise ValueError(f"OffloadOptimizer: tier must be one of {TIERS}, got {tier!r}")
        if tier == "disk" and optimizer_class not in DISK_OPTIMIZERS:
            raise ValueError(
                f"OffloadOptimizer: the disk tier lays out Adam's state (exp_avg, exp_avg_sq); "
                f"{optimizer_class.__name__} is not supported there"
            )
        if tier == "disk":
            base = path or tempfile.gettempdir()
            if not (os.path.isdir(base) and os.access(base, os.W_OK)):
                raise ValueError(f"OffloadOptimizer: path={base!r} is not a writable directory")
        self.params, self.tier = params, tier
        # On a GPU the host buffers are pinned (page-locked): copies to and from them are DMA
        # transfers that `non_blocking=True` really overlaps. On a CPU nothing is pinned.
        self.on_cuda = any(p.is_cuda for p in params)
        self.pinned = self.on_cuda
        self.masters = [
            torch.empty(p.shape, dtype=torch.float32, device="cpu", pin_memory=self.pinned).copy_(
                p.detach()
            )
            for p in params
        ]
        for m in self.masters:
            m.grad = self._host_zeros(m)
        self.inner = optimizer_class(self.masters, **defaults)
        self.directory = None
        self.files: dict[str, torch.Tensor] = {}  # name -> the tensor mapping that file
        if tier == "disk":  # a fresh directory per run: never another run's (or model's) files
            # named after this process: a launch after it was killed sweeps it (runtime)
            self.directory = tempfile.mkdtemp(prefix=f"minidist-offload-{os.getpid()}-", dir=path)
            marker = None  # outside the temporary folder: a marker there names it
            if os.path.realpath(os.path.dirname(self.directory)) != os.path.realpath(
                tempfile.gettempdir()
            ):
                marker = remember_folder(self.directory)
            self._finalizer = weakref.finalize(self, _remove, self.directory, marker)
            for i, m in enumerate(self.masters):
                self.inner.state[m] = {
                    "step": torch.tensor(0.0, device="cpu"),  # the host tier's step
                    "exp_avg": self._file(f"{i}.exp_avg", m),
                    "exp_avg_sq": self._file(f"{i}.exp_avg_sq", m),
                }
        self.moved = {"device_to_host": 0, "host_to_device": 0}

    def _host_zeros(self, like: torch.Tensor) -> torch.Tensor:
        return torch.zeros(like.shape, dtype=torch.float32, device="cpu", pin_memory=self.pinned)

    def _file(self, name: str, like: torch.Tensor) -> torch.Tensor:
        """A zero-filled float32 tensor shaped like `like` whose storage is a new file,
        memory-mapped and shared (writes go to the file). An existing file is refused."""
        filename = os.path.join(self.directory, name)
        open(filename, "xb").close()  # FileExistsError rather than map another run's state
        t = torch.from_file(filename, shared=True, size=like.numel(), dtype=torch.float32)
        self.files[name] = t.view(like.shape)
        return self.files[name]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None if set_to_none else (p.grad.zero_() if p.grad is not None else None)

    @torch.no_grad()
    def step(self) -> None:
        """Gradients down, the update on the host, parameters back up."""
        for p, m in zip(self.params, self.masters):
            if p.grad is None:
                m.grad = None
                continue
            if m.grad is None:
                m.grad = self._host_zeros(m)
            m.grad.copy_(p.grad, non_blocking=True)
            self.moved["device_to_host"] += p.grad.numel() * p.grad.element_size()
        if self.on_cuda:  # the host reads the gradients next: wait for the copies
            torch.cuda.synchronize()
        self.inner.step()
        for p, m in zip(self.params, self.masters):
            p.copy_(m, non_blocking=True)
            self.moved["host_to_device"] += p.numel() * p.element_size()

    def tier_bytes(self) -> dict[str, dict[str, int]]:
        """Bytes each tier holds, by kind of state, measured: storages counted once
        (`minidist.memory.tensor_bytes`), files by their size on disk.

        device: the stepped parameters and their gradients. host: the fp32 masters, their
        gradients, the optimizer state held in memory (everything on the cpu tier, the step
        counters on the disk tier). disk: the files of the disk tier.
        """
        grads = [p.grad for p in self.params if p.grad is not None]
        master_grads = [m.grad for m in self.masters if m.grad is not None]
        state = [v for s in self.inner.state.values() for v in s.values() if torch.is_tensor(v)]
        in_files = list(self.files.values())
        disk = 0
        if self.directory is not None:
            disk = sum(e.stat().st_size for e in os.scandir(self.directory))
        return {
            "device": {
                "params": tensor_bytes(self.params),
                "grads": tensor_bytes(grads, exclude=self.params),
                "optimizer": 0,
            },
            "host": {
                "params": tensor_bytes(self.masters),
                "grads": tensor_bytes(master_grads, exclude=self.masters),
                "optimizer": tensor_bytes(state, exclude=[*self.masters, *in_files]),
            },
            "disk": {"params": 0, "grads": 0, "optimizer": disk},
        }

    def resident_bytes(self) -> dict[str, int]:
        """Bytes each tier holds: `tier_bytes` summed per tier."""
        return {tier: sum(states.values()) for tier, states in self.tier_bytes().items()}

    def file_sizes(self) -> dict[str, int]:
        """The disk tier's files and their sizes in bytes, as the file system reports them."""
        if self.directory is None:
            return {}
        return {
            e.name: e.stat().st_size
            for e in sorted(os.scandir(self.directory), key=lambda e: e.name)
        }

    def close(self) -> None:
        """Remove the disk tier's files now (they are removed at exit in any case)."""
        if self.directory is not None:
            self._finalizer()
