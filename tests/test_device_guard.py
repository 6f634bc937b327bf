"""The CPU-only device guard: minidist's code names the device of every tensor it makes."""

import ast
from pathlib import Path

import pytest
import torch

import minidist
from minidist.device_guard import ImplicitDeviceError, no_implicit_device

PACKAGE = Path(minidist.__file__).parent
FACTORIES = {
    "empty",
    "zeros",
    "ones",
    "full",
    "tensor",
    "arange",
    "linspace",
    "logspace",
    "eye",
    "rand",
    "randn",
    "randint",
    "randperm",
    "empty_strided",
    "scalar_tensor",
}


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
    from torch.overrides import _get_current_function_mode_stack

    return [type(mode).__name__ for mode in _get_current_function_mode_stack()]


def test_a_rank_forked_from_a_guarded_process_runs_under_one_guard(monkeypatch):
    """The rank inherits this process's guard (conftest.py) and asks for one: one, not two
    (each would run every torch call of the rank through Python)."""
    monkeypatch.setenv("MINIDIST_DEVICE_GUARD", "1")
    with no_implicit_device(), no_implicit_device():
        assert guards_on_this_rank() == ["_NoImplicitDevice"]
        assert (
            minidist.launch(guards_on_this_rank, 2, start_method="fork")
            == [["_NoImplicitDevice"]] * 2
        )


def test_no_factory_call_in_minidist_omits_its_device():
    """Also the paths no test runs: every torch factory call names `device=`."""
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in FACTORIES
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "torch"
                and not any(k.arg in ("device", None) for k in node.keywords)
            ):
                missing.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert missing == []
