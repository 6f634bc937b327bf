"""`python -m minidist.three_d` (a local world of 8) or, on a cluster or one machine,
`torchrun --nproc-per-node 8 -m minidist.three_d`: the 3D run, its loss curve next to one
process's."""

import minidist
from minidist.runtime import under_torchrun
from minidist.three_d.run import reference_losses, train_3d

results = minidist.launch(train_3d, None if under_torchrun() else 8, timeout_s=600)
if not under_torchrun() or int(__import__("os").environ["RANK"]) == 0:
    ref = reference_losses()
    print(f"{'step':>4} {'3D (t=2, p=2, d=2)':>20} {'one process':>12}")
    for step, (a, b) in enumerate(zip(results[0]["losses"], ref)):
        print(f"{step:>4} {a:>20.6f} {b:>12.6f}")
    print(f"largest difference: {max(abs(a - b) for a, b in zip(results[0]['losses'], ref)):.2e}")
