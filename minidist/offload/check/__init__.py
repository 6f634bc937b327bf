"""Checkers for the offload exercises of lesson 05 (Ren et al. 2021, "ZeRO-Offload", sections
3-4; Rajbhandari et al. 2021, "ZeRO-Infinity", the NVMe tier).

1. `check_offloaded_step(offloaded_step)`: `offloaded_step(params, masters, host_optimizer)`
   is one step of an offloaded optimizer: `params` are this rank's FSDP chunks on the
   device, each with its gradient from backward; `masters` their fp32 copies on the host,
   each with a gradient buffer `m.grad`; `host_optimizer` Adam over `masters`. Copy every
   gradient down into `m.grad`, step the host optimizer, copy every master back into its
   device parameter. Run inside FSDP training of lesson 01's MLP on worlds of 2 and 3,
   compared step by step with the same FSDP whose Adam runs on the device (they must be
   identical) and at the end with one process. A dispatch mode watches every copy between a
   device tensor and a host tensor (`_Bus`), and an optimizer hook sees when the step runs
   and what `m.grad` holds then. Named: stepped on the device copy, the gradients not copied
   down, the host gradient aliasing the device's, parameters not copied back (stale: the
   run diverges), copied back before the step (one step behind), the parameter's storage
   replaced instead of copied into, in-place copy into a parameter outside `no_grad`, more
   bytes moved than the theory's 4 + 4 per element.
2. `check_state_file(state_file)`: `state_file(directory, name, like)` returns a zero float32
   tensor shaped like `like` (float32, bf16 or fp16) whose storage is the new file
   `directory/name`, memory-mapped
   and shared, and refuses (FileExistsError) a file that already exists, which would be
   another model's or another run's state. Checked in this process on fresh temporary
   directories: the file's size, the values written through the tensor read back from the
   file with numpy, an existing file left untouched. Named: not shared (writes never reach
   the file; or a copy of the mapping returned), the size in bytes instead of elements, not
   shaped like `like`, like's 16-bit dtype taken, no file mapped at all, another model's
   values reused, another model's file overwritten.
"""

from .offloaded_step import (
    LR,
    PARAM_TOL,
    STEP_HANG_HINT,
    STEP_WORLDS,
    STEPS,
    check_offloaded_step,
    make_host_adam,
)
from .state_file import FILE_SHAPES, check_state_file

__all__ = [
    "FILE_SHAPES",
    "check_state_file",
    "STEP_WORLDS",
    "STEPS",
    "LR",
    "PARAM_TOL",
    "STEP_HANG_HINT",
    "make_host_adam",
    "check_offloaded_step",
]
