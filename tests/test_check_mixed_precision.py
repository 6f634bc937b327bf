"""The mixed-precision checkers pass right answers and name the mistake in wrong ones."""

import pytest
import torch
import torch.distributed as dist

from minidist import comm
from minidist.course.check import CheckFailed
from minidist.mixed_precision import divide_factors
from minidist.mixed_precision.check import (
    check_found_inf_agreement,
    check_fp16_mean,
    check_loss_scaler,
    simulate_scales,
)
from minidist.mixed_precision.fixture import grad_scaler_scales

# -- exercise 1: the loss scaler ---------------------------------------------------------------


class ScalerRight:
    """The answer; each variant below changes one thing."""

    def __init__(self, init_scale, growth_factor, backoff_factor, growth_interval):
        self.scale_value = init_scale
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval = growth_interval
        self.good_steps = 0
        self.found_inf = False

    def scale(self, loss):
        return loss * self.scale_value

    def get_scale(self):
        return self.scale_value

    def unscale(self, grad):
        grad.div_(self.scale_value)

    def is_bad(self, grad):
        return bool((~torch.isfinite(grad)).any())

    def step(self, optimizer):
        self.found_inf = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self.unscale(p.grad)
                    self.found_inf |= self.is_bad(p.grad)
        if self.found_inf:
            return False
        optimizer.step()
        return True

    def update(self):
        if self.found_inf:
            self.scale_value *= self.backoff_factor
            self.good_steps = 0
        else:
            self.good_steps += 1
            if self.good_steps == self.growth_interval:
                self.scale_value *= self.growth_factor
                self.good_steps = 0


class ScalerEveryGoodStep(ScalerRight):
    def update(self):
        if self.found_inf:
            self.scale_value *= self.backoff_factor
        else:
            self.scale_value *= self.growth_factor


class ScalerNoResetOnOverflow(ScalerRight):
    def update(self):
        if self.found_inf:
            self.scale_value *= self.backoff_factor
        else:
            super().update()


class ScalerNoResetAfterGrowth(ScalerRight):
    def update(self):
        if self.found_inf:
            self.scale_value *= self.backoff_factor
            self.good_steps = 0
        else:
            self.good_steps += 1
            if self.good_steps == self.growth_interval:
                self.scale_value *= self.growth_factor


class ScalerNoResetAfterGrowthGe(ScalerRight):
    def update(self):
        if self.found_inf:
            self.scale_value *= self.backoff_factor
            self.good_steps = 0
        else:
            self.good_steps += 1
            if self.good_steps >= self.growth_interval:
                self.scale_value *= self.growth_factor


class ScalerNoBackoff(ScalerRight):
    def update(self):
        if self.found_inf:
            self.good_steps = 0
        else:
            super().update()


class ScalerHalvesWithoutSkipping(ScalerRight):
    def step(self, optimizer):
        super().step(optimizer)
        if self.found_inf:
            optimizer.step()
        return True


class ScalerMissesNan(ScalerRight):
    def is_bad(self, grad):
        return bool(torch.isinf(grad).any())


class ScalerNoUnscale(ScalerRight):
    def unscale(self, grad):
        pass


class ScalerUnscalesTwice(ScalerRight):
    def unscale(self, grad):
        grad.div_(self.scale_value * self.scale_value)


class ScalerReturnsNone(ScalerRight):
    def step(self, optimizer):
        super().step(optimizer)


class ScalerOverwritesFoundInf(ScalerRight):
    def step(self, optimizer):
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad.div_(self.scale_value)
                self.found_inf = self.is_bad(p.grad)
        if self.found_inf:
            return False
        optimizer.step()
        return True


class ScalerLooksAt(ScalerRight):
    """Unscales everything, but tests only the gradients `pick` chooses."""

    def pick(self, groups):
        raise NotImplementedError

    def step(self, optimizer):
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad.div_(self.scale_value)
        self.found_inf = any(self.is_bad(p.grad) for p in self.pick(optimizer.param_groups))
        if self.found_inf:
            return False
        optimizer.step()
        return True


class ScalerFirstGroupOnly(ScalerLooksAt):
    def pick(self, groups):
        return groups[0]["params"]


class ScalerFirstParamOfEachGroup(ScalerLooksAt):
    def pick(self, groups):
        return [g["params"][0] for g in groups]


class ScalerFirstParamOnly(ScalerLooksAt):
    def pick(self, groups):
        return [groups[0]["params"][0]]


class ScalerMissesNegInf(ScalerRight):
    def is_bad(self, grad):
        return bool((grad == float("inf")).any() | grad.isnan().any())


class ScalerUnscalesFirstParamOnly(ScalerRight):
    def step(self, optimizer):
        self.found_inf = False
        first = optimizer.param_groups[0]["params"][0]
        first.grad.div_(self.scale_value)
        for group in optimizer.param_groups:
            for p in group["params"]:
                self.found_inf |= self.is_bad(p.grad)
        if self.found_inf:
            return False
        optimizer.step()
        return True


class ScalerUnscalesFirstGroupOnly(ScalerRight):
    def step(self, optimizer):
        self.found_inf = False
        for p in optimizer.param_groups[0]["params"]:
            p.grad.div_(self.scale_value)
        for group in optimizer.param_groups:
            for p in group["params"]:
                self.found_inf |= self.is_bad(p.grad)
        if self.found_inf:
            return False
        optimizer.step()
        return True


class ScalerNeverResetsFoundInf(ScalerRight):
    def step(self, optimizer):
        for group in optimizer.param_groups:
            for p in group["params"]:
                self.unscale(p.grad)
                self.found_inf |= self.is_bad(p.grad)
        if self.found_inf:
            return False
        optimizer.step()
        return True


class ScalerGrowsOneLate(ScalerRight):
    def update(self):
        if self.found_inf:
            self.scale_value *= self.backoff_factor
            self.good_steps = 0
        else:
            if self.good_steps == self.growth_interval:
                self.scale_value *= self.growth_factor
                self.good_steps = 0
            self.good_steps += 1


class ScalerGrowsOneEarly(ScalerRight):
    def update(self):
        if self.found_inf:
            self.scale_value *= self.backoff_factor
            self.good_steps = 0
        else:
            self.good_steps += 1
            if self.good_steps == self.growth_interval - 1:
                self.scale_value *= self.growth_factor
                self.good_steps = 0


class ScalerStepsFirst(ScalerRight):
    def step(self, optimizer):
        optimizer.step()
        super().step(_NoStep(optimizer))
        return not self.found_inf


class _NoStep:
    """The optimizer's param groups, without a step (the step already ran)."""

    def __init__(self, optimizer):
        self.param_groups = optimizer.param_groups

    def step(self):
        pass


class ScalerStub(ScalerRight):
    def step(self, optimizer):
        raise NotImplementedError("exercise: replace this line with your code")


def test_scale_rules_are_told_apart_and_the_right_one_is_grad_scalers():
    from minidist.mixed_precision.check import OVERFLOWS, SCALER_ARGS, SCALER_STEPS

    right = grad_scaler_scales(SCALER_STEPS, tuple(OVERFLOWS), **SCALER_ARGS)
    assert simulate_scales("right") == right
    rules = ["every_good_step", "no_reset_on_overflow", "no_reset_after_growth"]
    rules += ["no_reset_after_growth_ge", "no_backoff", "one_late", "one_early"]
    sequences = [tuple(simulate_scales(r)) for r in rules]
    assert len(set(sequences)) == len(rules) and tuple(right) not in sequences


def test_loss_scaler_passes(capsys):
    check_loss_scaler(ScalerRight)
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.parametrize(
    "impl, hint",
    [
        (ScalerEveryGoodStep, "doubled after step 0, a single good step"),
        (ScalerNoResetOnOverflow, "overflow restarts the count of good steps"),
        (ScalerNoResetAfterGrowth, "never grew again"),
        (ScalerNoResetAfterGrowthGe, "grew again after the very next good step"),
        (ScalerNoBackoff, "skipped but the scale stayed"),
        (ScalerHalvesWithoutSkipping, "the scale was halved, but the optimizer still stepped"),
        (ScalerMissesNan, "torch.isinf finds inf but not NaN"),
        (ScalerNoUnscale, "1024 is the loss scale"),
        (ScalerUnscalesTwice, "divided by the scale twice"),
        (ScalerReturnsNone, "step\\(\\) returned None"),
        (ScalerOverwritesFoundInf, "overwritten by each gradient"),
        (ScalerFirstGroupOnly, r"only optimizer.param_groups\[0\] was looked at"),
        (ScalerFirstParamOfEachGroup, "only the first parameter of each group"),
        (ScalerFirstParamOnly, "only the first parameter of the first group"),
        (ScalerMissesNegInf, "-inf went unnoticed"),
        (ScalerUnscalesFirstParamOnly, r"parameters \['b', 'c'\] moved 1024x .* only some"),
        (ScalerUnscalesFirstGroupOnly, r"parameters \['c'\] moved 1024x .* only some"),
        (ScalerNeverResetsFoundInf, "set self.found_inf = False at the start"),
        (ScalerGrowsOneLate, "grows one step late"),
        (ScalerGrowsOneEarly, "grows one step early"),
        (ScalerStepsFirst, "optimizer.step\\(\\) ran before the gradients were unscaled"),
    ],
)
def test_loss_scaler_names_the_mistake(impl, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_loss_scaler(impl)


def test_loss_scaler_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_loss_scaler(ScalerStub)


# -- exercise 2: found-inf agreed on by every rank ---------------------------------------------


def local_flag(grads):
    found = torch.zeros(())
    for g in grads:
        found = torch.maximum(found, (~torch.isfinite(g)).any().float())
    return found


def found_right(grads):
    found = local_flag(grads)
    comm.all_reduce(found, op=comm.ReduceOp.MAX)
    return bool(found)


def found_sum(grads):  # also right: SUM of 0/1 flags, tested > 0
    found = local_flag(grads)
    comm.all_reduce(found)
    return bool(found > 0)


def found_local_only(grads):
    return bool(local_flag(grads))


def found_min(grads):
    found = local_flag(grads)
    comm.all_reduce(found, op=comm.ReduceOp.MIN)
    return bool(found)


def found_misses_nan(grads):
    found = torch.zeros(())
    for g in grads:
        found = torch.maximum(found, torch.isinf(g).any().float())
    comm.all_reduce(found, op=comm.ReduceOp.MAX)
    return bool(found)


def found_with_dist(grads):
    found = local_flag(grads)
    dist.all_reduce(found, op=dist.ReduceOp.MAX)
    return bool(found)


def found_reduces_grads(grads):
    for g in grads:
        comm.all_reduce(g)
    return any(bool((~torch.isfinite(g)).any()) for g in grads)


def found_per_tensor(grads):
    found = False
    for g in grads:
        flag = (~torch.isfinite(g)).any().float()
        comm.all_reduce(flag, op=comm.ReduceOp.MAX)
        found |= bool(flag)
    return found


def found_zeroes_infs(grads):
    found = found_right(grads)
    for g in grads:
        g.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
    return found


def found_returns_tensor(grads):
    found = local_flag(grads).repeat(2)
    comm.all_reduce(found, op=comm.ReduceOp.MAX)
    return found


def found_only_when_local(grads):  # a rank that found nothing never joins: a hang
    found = local_flag(grads)
    if found:
        comm.all_reduce(found, op=comm.ReduceOp.MAX)
    return bool(found)


def found_first_only(grads):
    found = (~torch.isfinite(grads[0])).any().float()
    comm.all_reduce(found, op=comm.ReduceOp.MAX)
    return bool(found)


def found_overwritten(grads):
    found = torch.zeros(())
    for g in grads:
        found = (~torch.isfinite(g)).any().float()
    comm.all_reduce(found, op=comm.ReduceOp.MAX)
    return bool(found)


def found_misses_neg_inf(grads):
    found = torch.zeros(())
    for g in grads:
        found = torch.maximum(found, ((g == float("inf")) | g.isnan()).any().float())
    comm.all_reduce(found, op=comm.ReduceOp.MAX)
    return bool(found)


def found_stub(grads):
    raise NotImplementedError("exercise: replace this line with your code")


@pytest.mark.parametrize("impl", [found_right, found_sum])
def test_found_inf_agreement_passes(impl, capsys):
    check_found_inf_agreement(impl)
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.parametrize(
    "impl, hint",
    [
        (found_local_only, r"step 1: rank 1 found an inf .* skipped .* rank 0 found none"),
        (found_min, "True only when \\*every\\* rank overflowed"),
        (found_first_only, r"only grads\[0\] was tested"),
        (found_overwritten, "only the last gradient's answer survived"),
        (found_misses_neg_inf, "-inf went unnoticed"),
        (found_misses_nan, "torch.isinf misses NaN"),
        (found_with_dist, "no collective went through minidist.comm"),
        (found_reduces_grads, "you reduced the gradients themselves"),
        (found_per_tensor, "one all-reduce per step is enough"),
        (found_zeroes_infs, "changed the gradients"),
        (found_returns_tensor, "returned a Tensor: return a bool"),
        (found_only_when_local, "call the all-reduce unconditionally"),
    ],
)
def test_found_inf_agreement_names_the_mistake(impl, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_found_inf_agreement(impl)


def test_found_inf_disagreement_shows_the_shards_out_of_step():
    with pytest.raises(CheckFailed, match=r"rank 0 skipped \[3, 4\]; rank 1 skipped \[1, 4, 6\]"):
        check_found_inf_agreement(found_local_only)


def test_found_inf_agreement_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_found_inf_agreement(found_stub)


# -- exercise 3: a mean in fp16 ----------------------------------------------------------------


def mean_right(grad):
    pre, post = divide_factors(dist.get_world_size())
    grad = grad / pre
    comm.all_reduce(grad)
    return grad / post


def mean_all_after(grad):
    grad = grad.clone()
    comm.all_reduce(grad)
    return grad / dist.get_world_size()


def mean_all_before(grad):
    grad = grad / dist.get_world_size()
    comm.all_reduce(grad)
    return grad


def mean_no_divide(grad):
    comm.all_reduce(grad)
    return grad


def mean_divide_twice(grad):
    world = dist.get_world_size()
    pre, post = divide_factors(world)
    grad = grad / (pre * world)
    comm.all_reduce(grad)
    return grad / post


def mean_in_fp32(grad):
    grad = grad.float()
    comm.all_reduce(grad)
    return (grad / dist.get_world_size()).half()


def mean_with_dist(grad):
    pre, post = divide_factors(dist.get_world_size())
    grad = grad / pre
    dist.all_reduce(grad)
    return grad / post


def mean_sqrt_both(grad):
    factor = dist.get_world_size() ** 0.5
    grad = grad / factor
    comm.all_reduce(grad)
    return grad / factor


def mean_returns_fp32(grad):
    pre, post = divide_factors(dist.get_world_size())
    grad = grad / pre
    comm.all_reduce(grad)
    return grad.float() / post


def mean_n_minus_1(grad):
    world = dist.get_world_size()
    pre, _ = divide_factors(world)
    grad = grad / pre
    comm.all_reduce(grad)
    return grad / ((world - 1) / pre)


def mean_pre_twice(grad):
    pre, _ = divide_factors(dist.get_world_size())
    grad = grad / pre
    comm.all_reduce(grad)
    return grad / pre


def mean_post_twice(grad):
    _, post = divide_factors(dist.get_world_size())
    grad = grad / post
    comm.all_reduce(grad)
    return grad / post


def mean_max(grad):
    pre, post = divide_factors(dist.get_world_size())
    grad = grad / pre
    comm.all_reduce(grad, op=comm.ReduceOp.MAX)
    return grad / post


def mean_own(grad):
    return grad / dist.get_world_size()


def mean_in_bf16(grad):
    pre, post = divide_factors(dist.get_world_size())
    grad = grad.bfloat16() / pre
    comm.all_reduce(grad)
    return (grad / post).half()


def mean_two_reduces(grad):
    pre, post = divide_factors(dist.get_world_size())
    grad = grad / pre
    comm.all_reduce(grad)
    comm.all_reduce(grad.clone())
    return grad / post


def mean_stub(grad):
    raise NotImplementedError("exercise: replace this line with your code")


def test_fp16_mean_passes(capsys):
    check_fp16_mean(mean_right)
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.parametrize(
    "impl, hint",
    [
        (mean_all_after, "add up to 108000, beyond fp16's max 65504"),
        (
            mean_all_before,
            r"2\^-23 / 4 = 2\^-25 is no more than half of fp16's\s+smallest subnormal",
        ),
        (mean_no_divide, "you forgot to divide"),
        (mean_divide_twice, "you divided by N twice"),
        (mean_sqrt_both, "not a power of two"),
        (mean_returns_fp32, "the result is torch.float32"),
        (mean_n_minus_1, "divided by N - 1"),
        (mean_pre_twice, "by pre again after"),
        (mean_post_twice, "by post again after"),
        (mean_max, r"took the maximum \(ReduceOp.MAX\)"),
        (mean_own, "nothing was all-reduced"),
        (mean_in_bf16, r"\[\('all_reduce', torch.bfloat16\)\]"),
        (mean_two_reduces, "one all-reduce is enough"),
        (mean_in_fp32, "the reduction ran in another dtype than fp16"),
        (mean_with_dist, "no collective went through minidist.comm"),
    ],
)
def test_fp16_mean_names_the_mistake(impl, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_fp16_mean(impl)


def test_fp16_mean_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_fp16_mean(mean_stub)
