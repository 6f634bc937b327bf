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
the bytes each tier holds (`resident_bytes`) and moves (`moved`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref

import torch

TIERS = ("cpu", "disk")
DISK_OPTIMIZERS = (torch.optim.Adam, torch.optim.AdamW)


class OffloadOptimizer:
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
        pin = torch.cuda.is_available() and any(p.is_cuda for p in params)
        self.masters = [
            torch.empty(p.shape, dtype=torch.float32, pin_memory=pin).copy_(p.detach())
            for p in params
        ]
        for m in self.masters:
            m.grad = torch.zeros_like(m)
        self.inner = optimizer_class(self.masters, **defaults)
        self.directory = None
        if tier == "disk":  # a fresh directory per run: never another run's (or model's) files
            self.directory = tempfile.mkdtemp(prefix="minidist-offload-", dir=path)
            self._finalizer = weakref.finalize(self, shutil.rmtree, self.directory, True)
            for i, m in enumerate(self.masters):
                self.inner.state[m] = {
                    "step": torch.tensor(0.0),
                    "exp_avg": self._file(f"{i}.exp_avg", m.numel()).view(m.shape),
                    "exp_avg_sq": self._file(f"{i}.exp_avg_sq", m.numel()).view(m.shape),
                }
        self.moved = {"device_to_host": 0, "host_to_device": 0}

    def _file(self, name: str, numel: int) -> torch.Tensor:
        """A zero-filled float32 tensor whose storage is a memory-mapped file."""
        filename = os.path.join(self.directory, name)
        return torch.from_file(filename, shared=True, size=numel, dtype=torch.float32)

    @property
    def param_groups(self) -> list[dict]:
        return self.inner.param_groups

    @property
    def state(self):
        return self.inner.state

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
                m.grad = torch.zeros_like(m)
            m.grad.copy_(p.grad, non_blocking=True)
            self.moved["device_to_host"] += p.grad.numel() * p.grad.element_size()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.inner.step()
        for p, m in zip(self.params, self.masters):
            p.copy_(m, non_blocking=True)
            self.moved["host_to_device"] += p.numel() * p.element_size()

    def resident_bytes(self) -> dict[str, int]:
        """Bytes each tier holds: the device's parameters and gradients, the host's masters,
        gradient copies and (cpu tier) optimizer state, the disk's state files."""
        device = sum(p.numel() * p.element_size() for p in self.params)
        device += sum(
            p.grad.numel() * p.grad.element_size() for p in self.params if p.grad is not None
        )
        host = sum(2 * m.numel() * 4 for m in self.masters)  # masters + their gradients
        states = sum(
            v.numel() * v.element_size()
            for s in self.inner.state.values()
            for v in s.values()
            if torch.is_tensor(v)
        )
        disk = 0
        if self.directory is not None:
            disk = sum(e.stat().st_size for e in os.scandir(self.directory))
            states -= disk  # the moments live in the files, only the step counters in RAM
        return {"device": device, "host": host + states, "disk": disk}

    def close(self) -> None:
        """Remove the disk tier's files now (they are removed at exit in any case)."""
        if self.directory is not None:
            self._finalizer()
