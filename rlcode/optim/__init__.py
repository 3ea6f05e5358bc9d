"""The optimiser and the state it updates, shared by every trainer (GRPO, SFT, reward models).

    from rlcode import optim
    tx = optim.make_optimizer(optim.OptimizerConfig.from_config(config.optimizer))
    state = optim.init_state(model, tx, mesh)

adamw.py: OptimizerConfig, the schedules, make_optimizer. state.py: TrainState, its
shardings, `finite_step` (one optimiser step on the trainable params, skipped when not
finite), `run_passes`.
"""

from rlcode.optim.adamw import SCHEDULES, OptimizerConfig, learning_rate_schedule, make_optimizer
from rlcode.optim.state import (TrainState, batch_shardings, finite_step, gradients,
                                init_state, opt_state_shardings, run_passes, split_trainable,
                                state_shardings)

__all__ = ["SCHEDULES", "OptimizerConfig", "TrainState", "batch_shardings", "finite_step",
           "gradients", "init_state", "learning_rate_schedule", "make_optimizer",
           "opt_state_shardings", "run_passes", "split_trainable", "state_shardings"]
