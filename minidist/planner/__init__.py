"""Lesson 13, planning a layout (notebook `notebooks/13_planner.ipynb`): predict what a layout
costs, check the prediction against a run, then extrapolate with published figures.

Memory per rank = model states (ZeRO, Rajbhandari et al. 2020, sections 3 and 5, per stage
and precision) + activations (Korthikanti et al. 2022, section 4) + nothing else the course
allocates between steps; bytes per step by collective and group (lessons 00-10, sequence
parallelism's (14), ring attention's (15) and the experts' all-to-alls padded to capacity
(16); Korthikanti et al. 2022, Liu et al. 2023, Lepikhin et al. 2020); the
pipeline bubble (Narayanan et al. 2021); a step time from a roofline per device (Williams
et al. 2009) and an α-β model per link (Hockney 1994).

- `spec.py`: `Layout`; `model_spec.py`: `ModelSpec` (a GPT configuration, or only a parameter count)
- `predict.py`: model states, bytes, bubble and FLOPs of rank 0, by calling each lesson's
  theory; `activations.py`: its activations at the peak of its pipeline schedule;
  `experts.py`: the MoE GPT's terms under `Layout(ep=e)` (lesson 16's theory)
- `hardware.py`: `Device`, `Cluster`, published figures, and the measurements of this machine
- `plan.py`: `plan`, `step_time`, `bytes_by_link_class`, `sweep`, `best`, `frontier`
- `published.py`: the published tables the planner reproduces
- `course.py`: the course's tour layouts as plans (checked against their runs in the tests)
- `measure.py`: this machine's FLOP rate, bandwidth and links fitted; `bench plan`
- `cli.py`: `python -m minidist plan`, its options checked at parse time in `cli_args.py`;
  `divisors.py`: a world's divisors from its prime factors (sweeps of any world size)
- `plots.py`, `lesson_plots.py`: the pictures
- `fixture.py`, `lesson.py`, `check/`: lesson 13's notebook model, tour row and checkers

A technique joins the planner as sp, cp and ep did: a `Layout` field refused by name where the
course does not run it (`spec.py`), a branch of `predict.traffic` / `activations` calling its
lesson's theory, its group's span and calls in `plan.py`, and its tour row in `course.py`,
planned = measured in `tests/test_planner.py`.
"""

from .hardware import CLUSTERS, Cluster, Device
from .plan import Plan, StepTime, best, frontier, layouts, plan, step_time, sweep
from .spec import Layout, ModelSpec

__all__ = [
    "ModelSpec",
    "Layout",
    "Plan",
    "StepTime",
    "Device",
    "Cluster",
    "CLUSTERS",
    "plan",
    "step_time",
    "layouts",
    "sweep",
    "best",
    "frontier",
]
