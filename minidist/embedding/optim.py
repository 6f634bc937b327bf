"""Sparse optimizers for hash-embedding tables: they read (unique rows, row gradients).

HugeCTR's embedding optimizers (NVIDIA Merlin HugeCTR docs, "Optimizers": SGD, MomentumSGD,
Nesterov, AdaGrad, Adam, each with `update_type` Local / Global / LazyGlobal) update the
value table from the per-row gradients of the sort/dedup backward (`backward.py`). The
state (momentum, accumulator, moments) is a tensor shaped like the table, one row per key.

- `SparseSGD`: p[r] -= lr·g[r]. Without momentum it is HugeCTR's "atomic" SGD: every
  occurrence may add into its row (`index_add_`), repeated rows allowed, no sort needed.
  With `momentum` m: buf = m·buf + g, p -= lr·buf, torch's SGD convention (no dampening,
  no Nesterov). `update="global"`: every row's buffer decays and moves its row each step
  (torch.optim.SGD(momentum=m) on the dense table); `update="local"`: only the touched rows
  (torch's SGD run per row, stepping a row only when it has a gradient).
- `SparseAdagrad`: s[r] += g², p[r] -= lr·g / (sqrt(s[r]) + eps), touched rows only (a
  zero gradient changes nothing, so local and global are the same); torch's convention,
  eps added after the root.
- `SparseAdam`, `update="local"`: the moments of the touched rows only, torch.optim.
  SparseAdam's and HugeCTR's convention: one step count t for the optimizer (every step),
  p[r] -= lr·sqrt(1-β2^t)/(1-β1^t) · m[r] / (sqrt(v[r]) + eps), eps added to the
  *uncorrected* root. `update="global"`: every row's moments decay each step (an untouched
  row has g = 0 and still moves), torch.optim.Adam's convention on the dense table:
  p -= lr/(1-β1^t) · m / (sqrt(v)/sqrt(1-β2^t) + eps). The two eps conventions differ by
  the factor sqrt(1-β2^t) on eps; each variant matches the torch optimizer it names.

`step()` reads each parameter's gradient (sparse COO from `HashEmbeddingBag`, or dense: all
rows); `update_rows(p, rows, grads)` applies one step to given rows, as the distributed
layers' owners do. Not done here: weight decay, Nesterov, dampening, LazyGlobal, lr decay.
"""

from __future__ import annotations

import math

import torch

UPDATES = ("local", "global")


def rows_and_values(grad: torch.Tensor, coalesce: bool = True):
    """The touched rows and their gradients, from a sparse (or dense: all rows) gradient."""
    if grad.is_sparse:
        if not coalesce:
            return grad._indices()[0], grad._values()
        grad = grad.coalesce()
        return grad.indices()[0], grad.values()
    return torch.arange(grad.shape[0], device=grad.device), grad


def _positive(who: str, **values) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{who}: {name}={value!r} must be > 0")


class _RowOptimizer(torch.optim.Optimizer):
    """One step per parameter from (rows, grads); subclasses define `_state` and `_update`."""

    STATE: tuple[str, ...] = ()

    def __init__(self, params, defaults):
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p].update(self._state(p, group))

    def _state(self, p, group) -> dict:
        return {name: torch.zeros_like(p) for name in self.STATE}

    def _fit(self, p, group) -> dict:
        """The state of `p`, extended with fresh rows if the table grew (`HashEmbeddingBag.
        grow`): a new row starts as a row that was never touched."""
        state = self.state[p]
        if any(torch.is_tensor(v) and v.shape[0] < p.shape[0] for v in state.values()):
            fresh = self._state(p, group)
            for name, value in state.items():
                if torch.is_tensor(value) and value.shape[0] < p.shape[0]:
                    state[name] = torch.cat([value, fresh[name][value.shape[0] :]])
        return state

    def _group(self, p):
        return next(g for g in self.param_groups if any(q is p for q in g["params"]))

    @torch.no_grad()
    def update_rows(self, p: torch.Tensor, rows: torch.Tensor, grads: torch.Tensor) -> None:
        """One step of `p` with gradient `grads[i]` for row `rows[i]` (distinct rows, except
        for plain SGD) and zero for every other row."""
        group = self._group(p)
        self._update(p, self._fit(p, group), rows, grads, group)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    rows, grads = rows_and_values(p.grad, coalesce=self._needs_unique(group))
                    self._update(p, self._fit(p, group), rows, grads, group)
        return loss

    def _needs_unique(self, group) -> bool:
        return True


class SparseSGD(_RowOptimizer):
    """SGD on the rows of a sparse gradient, optionally with momentum (module docstring)."""

    def __init__(self, params, lr: float, momentum: float = 0.0, update: str = "local"):
        _positive("SparseSGD", lr=lr)
        if not 0 <= momentum < 1:
            raise ValueError(f"SparseSGD: momentum={momentum!r} must be in [0, 1)")
        if update not in UPDATES:
            raise ValueError(f"SparseSGD: update={update!r} must be one of {UPDATES}")
        self.STATE = ("momentum_buffer",) if momentum else ()
        super().__init__(params, dict(lr=lr, momentum=momentum, update=update))

    def _needs_unique(self, group) -> bool:
        return group["momentum"] != 0  # plain SGD: the atomic path, repeated rows allowed

    def _update(self, p, state, rows, g, group):
        lr, m = group["lr"], group["momentum"]
        if not m:
            p.index_add_(0, rows, g, alpha=-lr)
            return
        buf = state["momentum_buffer"]
        if group["update"] == "global":
            buf.mul_(m)
            buf.index_add_(0, rows, g)
            p.add_(buf, alpha=-lr)
        else:
            buf[rows] = buf[rows] * m + g
            p.index_add_(0, rows, buf[rows], alpha=-lr)


class SparseAdagrad(_RowOptimizer):
    """Adagrad on the touched rows: s[r] += g², p[r] -= lr·g / (sqrt(s[r]) + eps)."""

    STATE = ("sum",)

    def __init__(self, params, lr: float = 0.01, eps: float = 1e-10, initial_accumulator_value=0.0):
        _positive("SparseAdagrad", lr=lr, eps=eps)
        super().__init__(
            params, dict(lr=lr, eps=eps, initial_accumulator_value=initial_accumulator_value)
        )

    def _state(self, p, group) -> dict:
        return {"sum": torch.full_like(p, group["initial_accumulator_value"])}

    def _update(self, p, state, rows, g, group):
        acc = state["sum"]
        acc.index_add_(0, rows, g * g)
        p.index_add_(0, rows, g / (acc[rows].sqrt() + group["eps"]), alpha=-group["lr"])


class SparseAdam(_RowOptimizer):
    """Adam, local (touched rows, torch.optim.SparseAdam) or global (every row decays,
    torch.optim.Adam); the eps conventions are in the module docstring."""

    STATE = ("exp_avg", "exp_avg_sq")

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        update: str = "local",
    ):
        _positive("SparseAdam", lr=lr, eps=eps)
        if not all(0 <= b < 1 for b in betas) or len(betas) != 2:
            raise ValueError(f"SparseAdam: betas={betas!r} must be two numbers in [0, 1)")
        if update not in UPDATES:
            raise ValueError(f"SparseAdam: update={update!r} must be one of {UPDATES}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, update=update))

    def _state(self, p, group) -> dict:
        return {"step": 0, **super()._state(p, group)}

    def _update(self, p, state, rows, g, group):
        (b1, b2), eps, lr = group["betas"], group["eps"], group["lr"]
        state["step"] += 1
        t = state["step"]
        m, v = state["exp_avg"], state["exp_avg_sq"]
        bc1, bc2 = 1 - b1**t, 1 - b2**t
        if group["update"] == "global":
            m.mul_(b1).index_add_(0, rows, g, alpha=1 - b1)
            v.mul_(b2).index_add_(0, rows, g * g, alpha=1 - b2)
            p.addcdiv_(m, (v.sqrt() / math.sqrt(bc2)).add_(eps), value=-lr / bc1)
            return
        if rows.numel() == 0:
            return
        m_old, v_old = m[rows], v[rows]
        m_new = m_old + (g - m_old) * (1 - b1)
        v_new = v_old + (g * g - v_old) * (1 - b2)
        m[rows], v[rows] = m_new, v_new
        step_size = lr * math.sqrt(bc2) / bc1
        p.index_add_(0, rows, m_new / (v_new.sqrt() + eps), alpha=-step_size)
