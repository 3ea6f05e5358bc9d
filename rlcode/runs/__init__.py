"""What every run writes: Orbax checkpoints, metrics (JSON lines, TensorBoard, W&B), the
run scaffold the loops share.
"""
