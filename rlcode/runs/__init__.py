"""What every run writes: Orbax checkpoints, metrics (JSON lines, TensorBoard, W&B), plots.
The run scaffold the loops share, which writes them, is rlcode.train.scaffold.
"""
