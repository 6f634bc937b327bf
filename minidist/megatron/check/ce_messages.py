"""Lesson 07, exercise 2: what each catalogued mistake of the vocab-parallel cross entropy
is told, keyed by the name of the mistake whose prediction `_ce_variants` computes."""

from __future__ import annotations

CE_OVERFLOW = (
    "exp of logits around {offset:g} overflows float32 (exp(89) is already inf). Subtract "
    "each row's maximum over the WHOLE vocabulary before exp: the local row maxima, "
    "all-reduced with op=comm.ReduceOp.MAX; log-sum-exp = max + log Σ exp(logit - max)."
)
CE_MESSAGES = {
    "padding_off_by_one": (
        "the padding mask is off by one: column vocab_size (= {vocab}, the first padding "
        "column) took part in the maximum and the sum of exp. Padding is every column >= "
        "vocab_size: masked_fill(column >= vocab_size, float('-inf')), not > vocab_size."
    ),
    "unshifted_target": (
        "the loss is off by the row maximum M: you subtracted the target logit itself from "
        "log Σ exp(logit - M). Subtract the shifted one, target logit - M (both terms shifted "
        "by the same M), or add M back to the log-sum-exp."
    ),
    "range_lower": (
        "targets in the first column of a rank's range (target == start) lost their logit: "
        "the range test is off by one at the start. A target is this rank's when start <= "
        "target < start + columns: inside = (local >= 0) & (local < columns)."
    ),
    "no_max": "the loss is {value}: " + CE_OVERFLOW,
    "sum_not_mean": (
        "the loss is {tokens}x the cross entropy: you summed over the {tokens} tokens; return the "
        "mean over tokens, as F.cross_entropy does."
    ),
    "local_max": (
        "the row maximum was not all-reduced: each rank subtracted its OWN row maximum before "
        "exp: then rank r's exps are scaled by "
        "e^(-max_r), a different factor on every rank, and their sum over ranks means nothing. "
        "All-reduce the row maxima with op=comm.ReduceOp.MAX first and subtract that global "
        "maximum everywhere."
    ),
    "unmasked_zero": (
        "the target logit is summed over ranks, but the ranks that do not hold a token's target "
        "added a logit too (the one at the index you replaced the target by): after gathering, "
        "zero the target logit where the target is outside [start, start + columns) "
        "(masked_fill(~inside, 0)), so only the owner contributes to the SUM all-reduce."
    ),
    "unmasked_clamp": (
        "the target index was clamped into this rank's range instead of masked: the target "
        "logit is summed over ranks, but the ranks that do not hold a token's target added a "
        "logit too (clamping the index picks a real column: its first one for a target below "
        "its range, its last for one above). Clamping keeps the gather in bounds; then zero "
        "the picked logit where the target is outside [start, start + columns) "
        "(torch.where(inside, picked, 0)), so only the owner contributes."
    ),
    "local_sum": (
        "the ranks return different losses: each used the sum of exp over its own columns only. "
        "The softmax's denominator runs over the whole vocabulary: all-reduce (SUM) each row's "
        "sum of exp over the group."
    ),
    "no_target_reduce": (
        "the ranks return different losses: each used the target logit only where it holds the "
        "target (0 elsewhere). Every rank needs every token's target logit: all-reduce (SUM) "
        "the masked target logits."
    ),
    "no_padding_mask": (
        "the vocabulary padding took part: columns >= vocab_size (here the last {pad} of "
        "{padded}, on the last rank) are not words, but their exp entered the sum and their "
        "value the maximum. Mask them to -inf before the maximum "
        "(logits.masked_fill(column >= vocab_size, float('-inf')), column = start + "
        "arange(columns))."
    ),
}
# Named by probing the answer on crafted rows (`ce_probe.py`), whatever its formulation.
CE_PROBE_MESSAGES = {
    "no_offset": (
        "the target was compared with the local column indices 0..{last} without subtracting "
        "the rank's vocabulary start: every rank took targets 0..{last} as its own (one logit "
        "per rank was added) and no rank took a target >= {per}. Rank r holds the columns "
        "[start, start + columns): local = target - start, inside = (local >= 0) & (local < "
        "columns), and gather at local where inside."
    ),
    "end_included": (
        "the range test includes its end (<= instead of <): a target at the first column of a "
        "rank's range, target == start + columns of the rank before it, was also counted by "
        "that rank. A rank holds [start, start + columns), the end excluded: inside = (local "
        ">= 0) & (local < columns), not <=."
    ),
    "lower_end_unmasked": (
        "ranks whose columns lie above the target (target - start < 0) added the logit of "
        "their first column: the mask misses the lower end of the range (an index clamped or "
        "replaced by 0 there, and not masked). inside = (local >= 0) & (local < columns); "
        "zero the picked logit where not inside."
    ),
    "upper_end_unmasked": (
        "ranks whose columns lie below the target (target >= start + columns) added the logit "
        "of their last column: the mask misses the upper end of the range (an index clamped "
        "there, and not masked). inside = (local >= 0) & (local < columns); zero the picked "
        "logit where not inside."
    ),
    "wrong_column": (
        "the rank that holds the target counted it, but at another of its columns: the column "
        "index into this rank's logits is local = target - start (not the target itself, "
        "nor a clamped value)."
    ),
    "miscounted": (
        "the target logit must be counted once, from the rank whose columns [start, start + "
        "columns) hold it, and 0 from every other rank: inside = (local >= 0) & (local < "
        "columns) with local = target - start; gather at local where inside, zero elsewhere, "
        "then all-reduce (SUM). Target {target} is column {target} only."
    ),
}
