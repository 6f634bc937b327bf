"""The CPU-only device guard: minidist's code names the device of every tensor it makes."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import minidist
from minidist.device_guard import FACTORIES, ImplicitDeviceError, no_implicit_device

PACKAGE = Path(minidist.__file__).parent


def run_as_minidist_code(source: str):
    """Run `source` as if it were a line of a module inside the minidist package."""
    code = compile(source, str(PACKAGE / "made_up_module.py"), "exec")
    scope = {"torch": torch}
    exec(code, scope)
    return scope.get("out")


def test_a_tensor_without_a_device_from_minidist_code_is_refused():
    with no_implicit_device():
        with pytest.raises(ImplicitDeviceError, match=r"minidist/made_up_module.py:1: torch.zeros"):
            run_as_minidist_code("out = torch.zeros(3)")
        with pytest.raises(ImplicitDeviceError, match="torch.tensor"):
            run_as_minidist_code("out = torch.tensor([1, 2])")
        with pytest.raises(ImplicitDeviceError, match="torch.arange"):  # named, but None
            run_as_minidist_code("out = torch.arange(3, device=None)")
        assert run_as_minidist_code("out = torch.zeros(3, device='cpu')").shape == (3,)
        torch.zeros(3)  # not minidist's code: left alone
        p = torch.nn.Parameter(torch.ones(2, device="cpu"))
        opt = torch.optim.Adam([p])  # torch's own step counters: left alone
        p.sum().backward()
        opt.step()


def guarded_rank():
    return run_as_minidist_code("out = torch.zeros(3)")


def test_ranks_run_under_the_guard_when_asked(monkeypatch):
    """Spawned, so that nothing is inherited from this (guarded) process: the variable alone."""
    monkeypatch.setenv("MINIDIST_DEVICE_GUARD", "1")
    with pytest.raises(minidist.RankFailedError, match="ImplicitDeviceError"):
        minidist.launch(guarded_rank, 1, timeout_s=120, start_method="spawn")


def guards_on_this_rank():
    from minidist import device_guard

    # the factory a rank calls: the guard's wrapper, wrapping torch's own, not a wrapper
    return device_guard.guarded(), torch.zeros.__wrapped__ is torch._C._VariableFunctions.zeros


def test_a_rank_forked_from_a_guarded_process_runs_under_one_guard(monkeypatch):
    """The rank inherits this process's guard (conftest.py) and asks for one: the factories
    are wrapped once, not twice."""
    monkeypatch.setenv("MINIDIST_DEVICE_GUARD", "1")
    with no_implicit_device(), no_implicit_device():
        assert guards_on_this_rank() == (True, True)
        assert minidist.launch(guards_on_this_rank, 2, start_method="fork") == [(True, True)] * 2


UNGUARDED = """
import torch
from minidist import device_guard
original = torch.zeros
with device_guard.no_implicit_device():
    with torch.device("meta"):  # the first use of torch's cached set of factories
        assert torch.zeros(2**40).is_meta and torch.nn.Linear(2**20, 2**20).weight.is_meta
    import torch.distributed.optim  # TorchScript compiles torch's calls of the factories
    with device_guard.no_implicit_device():
        assert torch.zeros is not original and torch.zeros.__wrapped__ is original
        assert torch.matmul is torch._C._VariableFunctions.matmul
    assert device_guard.guarded() and torch.zeros is not original
assert not device_guard.guarded()
assert all(getattr(torch, n) is f for n, f in device_guard._ORIGINAL.items())
print("ok")
"""


def test_the_guard_wraps_only_factories_and_leaves_torch_as_it_was():
    """Only the factories are wrapped (a guard over every torch call made a small model's
    step 1.4x as long), once however deep the guards nest, and the outermost guard's exit
    gives torch its own back. In a process of its own: this one runs under conftest's."""
    env = {k: v for k, v in os.environ.items() if k != "MINIDIST_DEVICE_GUARD"}
    out = subprocess.run(
        [sys.executable, "-c", UNGUARDED], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.strip() == "ok", out.stderr


def test_a_device_context_names_the_device_and_meta_stays_meta():
    """`with torch.device("meta")` names the device of a factory inside it, and still makes
    meta tensors while the factories are wrapped (torch caches its factories' set)."""
    with no_implicit_device(), torch.device("meta"):
        assert run_as_minidist_code("out = torch.zeros(2 ** 40)").device.type == "meta"
        assert torch.nn.Linear(2**20, 2**20).weight.device.type == "meta"


def test_no_factory_call_in_minidist_omits_its_device():
    """Also the paths no test runs: every torch factory call names `device=`."""
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and (
                    isinstance(node.func, ast.Attribute)
                    and node.func.attr in FACTORIES
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "torch"
                    or isinstance(node.func, ast.Name)
                    and node.func.id in FACTORIES  # `from torch import zeros`: no guard sees it
                )
                and not any(k.arg in ("device", None) for k in node.keywords)
            ):
                missing.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert missing == []
