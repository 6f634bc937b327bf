"""Memory accounting: storages counted once, model state split into its three terms."""

import torch
import torch.nn as nn

from minidist.memory import SavedActivations, model_state_bytes, tensor_bytes
from minidist.models import GPT, GPTConfig


def test_tensor_bytes_counts_each_storage_once():
    a = torch.zeros(100)
    assert tensor_bytes([a, a[:10], a.view(10, 10)]) == 400
    assert tensor_bytes([a, torch.zeros(5, dtype=torch.float16)]) == 410
    assert tensor_bytes([a, torch.zeros(3)], exclude=[a[5:]]) == 12


def test_model_state_with_adam_is_params_grads_and_two_moments():
    model = nn.Linear(10, 5)  # 55 parameters
    opt = torch.optim.Adam(model.parameters())
    assert model_state_bytes(model, opt).total == 55 * 4
    model(torch.randn(3, 10)).sum().backward()
    opt.step()
    state = model_state_bytes(model, opt)
    assert (state.params, state.grads) == (55 * 4, 55 * 4)
    # exp_avg and exp_avg_sq, plus one scalar `step` tensor per parameter tensor
    assert state.optimizer == 2 * 55 * 4 + 2 * 4


def test_tied_weights_count_once():
    model = GPT(GPTConfig())
    assert model_state_bytes(model).params == sum(p.numel() for p in model.parameters()) * 4


def test_gradients_living_in_a_flat_buffer_count_once():
    model = nn.Linear(4, 4)
    flat = torch.zeros(20)
    model.weight.grad = flat[:16].view(4, 4)
    model.bias.grad = flat[16:]
    assert model_state_bytes(model, extra_grads=[flat]).grads == 80


def test_saved_activations_of_a_linear_relu_stack():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(32, 8)
    with SavedActivations(model) as saved:
        model(x).sum()
    # Linear saves its input (x, then the ReLU output); ReLU saves its output (same storage)
    assert saved.bytes == 32 * 8 * 4 + 32 * 16 * 4
    with torch.no_grad(), SavedActivations(model) as nothing:
        model(x)
    assert nothing.bytes == 0


def test_cuda_peak_is_none_without_a_gpu():
    from minidist.memory import cuda_peak_bytes

    assert (cuda_peak_bytes() is None) == (not torch.cuda.is_available())
