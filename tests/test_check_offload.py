"""The offload checkers pass right answers and name the mistake in wrong ones."""

import os

import pytest
import torch

from minidist.course.check import CheckFailed
from minidist.offload.check import check_offloaded_step, check_state_file

# -- exercise 1: the offloaded step -------------------------------------------------------------


def step_right(params, masters, host_optimizer):
    for p, m in zip(params, masters):
        m.grad.copy_(p.grad)
    host_optimizer.step()
    with torch.no_grad():
        for p, m in zip(params, masters):
            p.copy_(m)


def step_non_blocking(params, masters, host_optimizer):  # what a GPU version writes
    for p, m in zip(params, masters):
        m.grad.copy_(p.grad, non_blocking=True)
    host_optimizer.step()
    with torch.no_grad():
        for p, m in zip(params, masters):
            p.copy_(m, non_blocking=True)


def step_through_data(params, masters, host_optimizer):
    for p, m in zip(params, masters):
        m.grad[:] = p.grad
    host_optimizer.step()
    for p, m in zip(params, masters):
        p.data.copy_(m)


_DEVICE_ADAM = {}


def step_on_device(params, masters, host_optimizer):
    key = id(params[0])
    if key not in _DEVICE_ADAM:
        _DEVICE_ADAM[key] = torch.optim.Adam(params, lr=1e-2)
    _DEVICE_ADAM[key].step()


def step_forgets_gradients(params, masters, host_optimizer):
    host_optimizer.step()
    with torch.no_grad():
        for p, m in zip(params, masters):
            p.copy_(m)


def step_aliases_gradient(params, masters, host_optimizer):
    for p, m in zip(params, masters):
        m.grad = p.grad.cpu()  # on a CPU: p.grad itself
    host_optimizer.step()
    with torch.no_grad():
        for p, m in zip(params, masters):
            p.copy_(m)


def step_zero_grad_after(params, masters, host_optimizer):
    for p, m in zip(params, masters):
        m.grad.copy_(p.grad)
    host_optimizer.step()
    host_optimizer.zero_grad()  # sets m.grad to None: the next copy fails
    with torch.no_grad():
        for p, m in zip(params, masters):
            p.copy_(m)


def step_forgets_copy_back(params, masters, host_optimizer):
    for p, m in zip(params, masters):
        m.grad.copy_(p.grad)
    host_optimizer.step()


def step_copies_back_first(params, masters, host_optimizer):
    for p, m in zip(params, masters):
        m.grad.copy_(p.grad)
    with torch.no_grad():
        for p, m in zip(params, masters):
            p.copy_(m)
    host_optimizer.step()


def step_rebinds(params, masters, host_optimizer):
    for p, m in zip(params, masters):
        m.grad.copy_(p.grad)
    host_optimizer.step()
    for p, m in zip(params, masters):
        p.data = m.detach().clone()


def step_without_no_grad(params, masters, host_optimizer):
    for p, m in zip(params, masters):
        m.grad.copy_(p.grad)
    host_optimizer.step()
    for p, m in zip(params, masters):
        p.copy_(m)


def step_copies_params_down(params, masters, host_optimizer):
    with torch.no_grad():
        for p, m in zip(params, masters):
            m.copy_(p)  # unnecessary: the masters already hold these values
            m.grad.copy_(p.grad)
    host_optimizer.step()
    with torch.no_grad():
        for p, m in zip(params, masters):
            p.copy_(m)


def step_copies_back_twice(params, masters, host_optimizer):
    for p, m in zip(params, masters):
        m.grad.copy_(p.grad)
    host_optimizer.step()
    with torch.no_grad():
        for p, m in zip(params, masters):
            p.copy_(m)
            p.grad.copy_(m.grad)  # the gradients back up: nobody needs them
            p.copy_(m)


def step_stub(params, masters, host_optimizer):
    raise NotImplementedError("exercise: replace this line with your code")


@pytest.mark.parametrize("impl", [step_right, step_non_blocking, step_through_data])
def test_offloaded_step_passes(impl, capsys):
    check_offloaded_step(impl)
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.parametrize(
    "impl, hint",
    [
        (step_on_device, "you stepped on the device copy"),
        (step_forgets_gradients, "while m.grad held zeros"),
        (step_aliases_gradient, "m.grad is the device gradient itself"),
        (
            step_zero_grad_after,
            "host_optimizer.zero_grad\\(\\) sets the masters' gradients to None",
        ),
        (step_forgets_copy_back, r"forgot to copy the masters back\..*differ from one process"),
        (step_copies_back_first, r"\*before\* host_optimizer.step\(\): the device runs one step"),
        (step_rebinds, "now has a new storage"),
        (step_without_no_grad, "outside torch.no_grad"),
        (step_copies_params_down, "bytes went down the bus this step; only the gradients"),
        (step_copies_back_twice, "bytes went up the bus this step; only the"),
    ],
)
def test_offloaded_step_names_the_mistake(impl, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_offloaded_step(impl)


def test_offloaded_step_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_offloaded_step(step_stub)


# -- exercise 2: a memory-mapped optimizer state ------------------------------------------------


def file_right(directory, name, like):
    path = os.path.join(directory, name)
    open(path, "xb").close()
    return torch.from_file(path, shared=True, size=like.numel(), dtype=torch.float32).view(
        like.shape
    )


def file_checks_exists(directory, name, like):
    path = os.path.join(directory, name)
    if os.path.exists(path):
        raise FileExistsError(path)
    t = torch.from_file(path, shared=True, size=like.numel(), dtype=torch.float32)
    return t.view(like.shape)


def file_not_shared(directory, name, like):
    path = os.path.join(directory, name)
    with open(path, "xb") as f:
        f.write(bytes(4 * like.numel()))
    return torch.from_file(path, shared=False, size=like.numel()).view(like.shape)


def file_not_shared_no_file(directory, name, like):
    path = os.path.join(directory, name)
    return torch.from_file(path, shared=False, size=like.numel()).view(like.shape)


def file_returns_copy(directory, name, like):
    return file_right(directory, name, like).clone()


def file_size_in_bytes(directory, name, like):
    path = os.path.join(directory, name)
    open(path, "xb").close()
    return torch.from_file(path, shared=True, size=4 * like.numel()).view(like.shape)


def file_size_in_bytes_sliced(directory, name, like):
    path = os.path.join(directory, name)
    open(path, "xb").close()
    t = torch.from_file(path, shared=True, size=4 * like.numel())
    return t[: like.numel()].view(like.shape)


def file_flat(directory, name, like):
    path = os.path.join(directory, name)
    open(path, "xb").close()
    return torch.from_file(path, shared=True, size=like.numel())


def file_reuses(directory, name, like):
    path = os.path.join(directory, name)
    return torch.from_file(path, shared=True, size=like.numel()).view(like.shape)


def file_overwrites(directory, name, like):
    path = os.path.join(directory, name)
    open(path, "wb").close()  # truncates whatever was there
    return torch.from_file(path, shared=True, size=like.numel()).view(like.shape)


def file_like_dtype(directory, name, like):
    path = os.path.join(directory, name)
    open(path, "xb").close()
    return torch.from_file(path, shared=True, size=like.numel(), dtype=like.dtype).view(like.shape)


def file_in_memory(directory, name, like):
    return torch.zeros(like.shape)


def file_stub(directory, name, like):
    raise NotImplementedError("exercise: replace this line with your code")


@pytest.mark.parametrize("impl", [file_right, file_checks_exists])
def test_state_file_passes(impl, capsys):
    check_state_file(impl)
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.parametrize(
    "impl, hint",
    [
        (file_not_shared, "not in 0.exp_avg .*copy-on-write"),
        (file_not_shared_no_file, "with shared=False it opens the file read-only"),
        (file_returns_copy, r"a \.clone\(\) or \.to\(\) of the mapping is a copy too"),
        (file_size_in_bytes, "`size` counts elements of `dtype`, not bytes"),
        (file_size_in_bytes_sliced, "`size` counts elements of `dtype`, not bytes"),
        (file_flat, r"has shape \(15,\); Adam needs it shaped like the parameter"),
        (file_reuses, "you mapped it: your Adam would start from another model's moments"),
        (file_overwrites, "you overwrote it"),
        (file_like_dtype, r"2 per element: the state is torch.bfloat16 .* took like's dtype"),
        (file_in_memory, "there is no file 0.exp_avg in the directory"),
    ],
)
def test_state_file_names_the_mistake(impl, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_state_file(impl)


def test_state_file_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_state_file(file_stub)


def test_state_file_checker_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    check_state_file(file_right)
    assert os.listdir(tmp_path) == []


def file_raises_own_value_error(directory, name, like):
    if like.dtype != torch.float32:  # a learner's own guard
        raise ValueError(f"state_file: like must be float32, got {like.dtype}")
    return file_right(directory, name, like)


def file_raises_own_runtime_error(directory, name, like):
    raise RuntimeError("my own check failed")


def file_refuses_fresh_file(directory, name, like):
    raise FileExistsError(os.path.join(directory, name))


@pytest.mark.parametrize(
    "impl, hint",
    [
        (file_raises_own_value_error, r"raised ValueError: state_file: like must be float32"),
        (file_raises_own_runtime_error, r"raised RuntimeError: my own check failed"),
        (file_refuses_fresh_file, r"raised FileExistsError"),
    ],
)
def test_state_file_learners_own_exception_is_a_message(impl, hint):
    with pytest.raises(CheckFailed, match=hint) as info:
        check_state_file(impl)
    assert "Traceback" not in str(info.value)
