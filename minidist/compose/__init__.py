"""Lesson 17, every parallelism at once (notebook `notebooks/17_every_parallelism.ipynb`).

- `torch_native.py`: torch's own composition of a layout (FSDP2, DTensor TP/SP, pipelining),
  the other side of `bench compose`
"""
