"""Serving the default job's tiny policy and learning online from its simulated users.

    rlcode train --config configs/grpo_tiny.py:references --config.train.steps=0 \
        --config.train.eval_every=0 --config.workdir=workdirs/online_warm   # the warm start
    rlcode serve --config configs/online_tiny.py --port 8000
    rlcode learn-online --config configs/online_tiny.py
    python -m experiments.online.users_learn                   # the experiment (3 seeds)

The server starts from the warm-started policy (online.init_from), logs every completion
to workdir/interactions.sqlite and swaps in each version the learner publishes in
workdir/published. Result: docs/results.md ("users_learn: learning online from simulated users").
"""

import ml_collections

from common import optimizer, tiny_model


def get_config(arg: str | None = None):
  """The online job; arg "test": a random 1-layer policy, no warm start (for the tests)."""
  config = ml_collections.ConfigDict()
  config.trainer = "online"
  config.workdir = "workdirs/online_tiny"
  config.model = tiny_model()
  config.data = ml_collections.ConfigDict(dict(source="jsonl", path="data/tiny_tasks.jsonl"))
  config.rl = ml_collections.ConfigDict(dict(temperature=1.0, clip_eps_high=0.28,
                                             max_importance_weight=2.0))
  config.optimizer = optimizer(lr=3e-4, warmup=5, decay=100_000)
  config.train = ml_collections.ConfigDict(dict(steps=100_000, checkpoint_every=20))
  config.serve = ml_collections.ConfigDict(dict(slots=16, model_name="rlcode-tiny"))
  config.online = ml_collections.ConfigDict(dict(
      init_from="workdirs/online_warm/warm_start", batch_rows=64, max_tokens=40, max_lag=4))
  if arg == "test":
    config.model.arch.update(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                             num_kv_heads=2, head_dim=16, max_seq_len=256)
    config.model.tokenizer = "bytes+tools"
    config.online.update(init_from=None, batch_rows=16)
    config.train.progress_bar = False
    # Tests start many short-lived servers: none compiles shapes it will not meet.
    config.serve.warmup = False
  elif arg is not None:
    raise ValueError(f"configs/online_tiny.py:{arg}: the only argument is 'test'")
  return config
