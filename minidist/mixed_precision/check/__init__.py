"""Checkers for the mixed-precision exercises of lesson 04.

Micikevicius et al. 2018, "Mixed Precision Training" (ICLR), section 3.2 (loss scaling);
`torch.amp.GradScaler` (the dynamic rule); PyTorch FSDP's pre/post gradient divide factors.

1. `check_loss_scaler(LossScaler)`: in one process, `LossScaler(init_scale, growth_factor,
   backoff_factor, growth_interval)` with `scale(loss)` and `get_scale()` given, and the
   learner's `step(optimizer)` (unscale every gradient, step unless one is inf or NaN,
   return whether it stepped) and `update()` (halve the scale after an overflow and reset
   the count of good steps; double it after `growth_interval` good steps in a row and reset
   the count). SGD on three parameters in two param groups (other learning rates) for 18
   steps, overflows injected in each parameter at several elements (inf at step 2 in the
   last parameter, at step 6 in a middle one, -inf at step 7 and a NaN at step 11 in the
   first), compared with `torch.amp.GradScaler`'s scales and with the parameters a right
   scaler gives. Named, each from the set of overflowed steps it steps on: found_inf
   overwritten per gradient, only the first group / the first parameter of each group / the
   first parameter looked at, NaN or -inf missed, halves without skipping; then found_inf
   never reset, optimizer.step() before unscaling, some or all gradients not unscaled (or
   divided twice); then the scale rules:
   grows after every good step, one step late or early, no reset of the count on an
   overflow or after growing, skips without halving.
2. `check_found_inf_agreement(found_inf_on_any_rank)`: on worlds of 2, 3 and 4, lesson 03's
   FSDP trains the MLP; after backward each rank holds its three flat gradients (44, 352
   and 171 elements), and the checker puts an inf (step 1, last rank, last gradient, last
   element), a NaN (step 3, rank 0, middle gradient and element), -inf on every rank (step
   4, first gradient, first element) and an inf (step 6, rank N // 2, first gradient, last
   element). `found_inf_on_any_rank(grads)` must return the same answer on every rank, True
   when any rank's gradients hold an inf or NaN; the step is skipped where it says so. The
   same run with a right answer is the reference. Named, each from the steps it misses:
   only grads[0] tested, the flag overwritten per gradient, NaN or -inf missed, MIN instead
   of MAX; then not all-reduced (one rank skips, another steps: their shards go out of
   step, shown), no collective through `minidist.comm`, the gradients all-reduced instead
   of one flag, one all-reduce per gradient, gradients changed.
3. `check_fp16_mean(mean_in_fp16)`: on worlds of 2 and 4, `mean_in_fp16(grad)` returns the
   mean over ranks of an fp16 gradient, in fp16, with one all-reduce *in fp16*, dividing by
   N partly before (pre) and partly after (post). Rank r's gradient holds 30000 - 2000·r
   (their sum passes fp16's max 65504 on 4 ranks), 2^-23 (a quarter of it is below fp16's
   smallest subnormal) and r + 1. Named, first from the ordinary element on both worlds:
   forgot to divide, divided twice, by N - 1, by pre twice or post twice, MAX or MIN
   instead of SUM, nothing reduced; then the sum overflowed (all divided after), the small
   values underflowed (all divided before), factors that are not powers of two (√N),
   reduced in fp32 or bf16, returned in fp32, more than one all-reduce.
"""

from ._shared import INF, NAN
from .found_inf import (
    AGREE_HANG_HINT,
    AGREE_STEPS,
    AGREE_WORLDS,
    INJECT,
    check_found_inf_agreement,
    right_found_inf,
)
from .fp16_mean import FP16_HANG_HINT, FP16_WORLDS, TINY, check_fp16_mean, fp16_input
from .loss_scaler import check_loss_scaler
from .scale_rules import (
    COEF,
    LR,
    OVERFLOWS,
    SCALER_ARGS,
    SCALER_STEPS,
    START,
    simulate_scales,
)

__all__ = [
    "INF",
    "NAN",
    "FP16_WORLDS",
    "FP16_HANG_HINT",
    "TINY",
    "fp16_input",
    "check_fp16_mean",
    "AGREE_WORLDS",
    "AGREE_STEPS",
    "INJECT",
    "AGREE_HANG_HINT",
    "right_found_inf",
    "check_found_inf_agreement",
    "SCALER_ARGS",
    "SCALER_STEPS",
    "OVERFLOWS",
    "LR",
    "START",
    "COEF",
    "simulate_scales",
    "check_loss_scaler",
]
