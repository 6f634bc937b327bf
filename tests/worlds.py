"""The limits of the tests' long worlds (a grid of layouts, a trainer's run)."""

# A world whose ranks all sit in collectives this long is hung (a wrong group, a missing
# send): `launch(idle_s=)` stops it and names where each rank waits. Its `timeout_s` (300-900 s,
# a whole grid on two loaded cores) would wait a hang out, and a planted bug was caught
# only after 900 s. A healthy world always has a rank that computes or waits for a CPU.
HUNG_S = 60.0
