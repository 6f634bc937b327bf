"""The picture of a run's JSONL log (`python -m minidist plot-run LOG`): the training and
held-out loss by step, tokens/s by step, and what each rank holds by kind at the last step.
A resumed run's log holds a step twice or more (the steps after the last save, done again):
the last of each is drawn."""

from __future__ import annotations

import json
from pathlib import Path

from matplotlib.figure import Figure


def read_log(path: str | Path) -> list[dict]:
    """The log's lines, the last one of each step, in step order. ValueError naming the line
    and the field where a line is not a step's record (what `plot_run` draws: `step`,
    `loss`, `tokens_per_s`; `eval_loss` and `memory_per_rank` where present)."""
    records = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                records.append(_record(json.loads(line)))
            except ValueError as e:
                raise ValueError(f"line {n}: {e}") from None
    return sorted({r["step"]: r for r in records}.values(), key=lambda r: r["step"])


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _record(r) -> dict:
    if not isinstance(r, dict):
        raise ValueError(f"{json.dumps(r)[:40]} is not a step's record (a JSON object)")
    if not isinstance(r.get("step"), int) or isinstance(r["step"], bool) or r["step"] < 0:
        raise ValueError(f"step={r.get('step')!r} is not a step number (an integer >= 0)")
    for key in ("loss", "tokens_per_s", "eval_loss"):
        if (key in r or key != "eval_loss") and not _number(r.get(key)):
            raise ValueError(f"{key}={r.get(key)!r} is not a number")
    ranks = r.get("memory_per_rank", [])
    if not (
        isinstance(ranks, list)
        and all(isinstance(m, dict) and all(map(_number, m.values())) for m in ranks)
        and len({tuple(m) for m in ranks}) <= 1
    ):
        raise ValueError("memory_per_rank is not a list of {kind: bytes}, one per rank")
    return r


def loss_panel(ax, records: list[dict], label: str = "") -> None:
    """The training loss by step and the held-out loss where evaluated, on `ax` (`label`
    names the run when several share the panel)."""
    steps, losses = [r["step"] for r in records], [r["loss"] for r in records]
    (line,) = ax.plot(steps, losses, lw=1, label=f"{label} train".strip())
    held = [r for r in records if "eval_loss" in r]
    if held:
        ax.plot(
            [r["step"] for r in held],
            [r["eval_loss"] for r in held],
            "o-",
            ms=3,
            color=line.get_color(),
            alpha=0.6,
            label=f"{label} held out".strip(),
        )
    ax.set(xlabel="step", ylabel="loss (nats per token)", title="loss")
    ax.legend()


def plot_run(records: list[dict]) -> Figure:
    """Three panels: loss (and eval loss), tokens/s, memory per rank by kind (last step)."""
    fig = Figure(figsize=(12, 3.4))
    loss, rate, memory = fig.subplots(1, 3)
    steps = [r["step"] for r in records]
    loss_panel(loss, records)
    rate.plot(steps, [r["tokens_per_s"] for r in records], lw=1)
    rate.set(xlabel="step", ylabel="tokens/s", title="throughput")
    per_rank = records[-1].get("memory_per_rank", [])
    bottom = [0.0] * len(per_rank)
    for kind in per_rank[0] if per_rank else []:
        values = [m[kind] / 2**20 for m in per_rank]
        memory.bar(range(len(per_rank)), values, bottom=bottom, label=kind)
        bottom = [b + v for b, v in zip(bottom, values)]
    memory.set(xlabel="rank", ylabel="MiB", title=f"held per rank, step {steps[-1]}")
    if per_rank:
        memory.legend(fontsize=7)
    fig.tight_layout()
    return fig
