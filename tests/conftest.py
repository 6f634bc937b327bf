import os

# Triton's interpreter must be chosen before torch or triton is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")
