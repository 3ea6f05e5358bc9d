"""The online learner, top to bottom: feedback in the interaction log -> updates -> published
weights the running server swaps in.

    rlcode serve --config configs/online_tiny.py          # the server, one process
    rlcode learn-online --config configs/online_tiny.py   # this loop, another

Sections: mesh -> the policy (online.init_from, what the server starts from) -> the run
(fresh, or the latest checkpoint with the log's cursor and the baseline) -> the update ->
loop: wait for feedback rows after the cursor until a batch's worth of candidates
(online.batch_rows; a feedback row's candidates stay in one batch, the rest padded out of
the loss) -> rewards and advantages (rlcode.train.online_data) -> the decoupled-PPO
correction of every row (rlcode.rl.grpo.make_proximal_fn: each candidate was sampled by
some earlier version, whose per-token log-probs the log holds; weights pi_now / pi_behav
truncated at rl.max_importance_weight, as the async loop's stale rows) -> one clipped
update -> version step + 1 published to workdir/published -> log, checkpoint. Feedback on
candidates more than online.max_lag versions old is skipped, so a learner slower than its
users keeps to what recent policies did.

Re-running the command resumes from the latest checkpoint, wherever the learner was
killed: a fresh run saves a step-0 checkpoint before it writes anything else, so a
workdir with metrics always has a checkpoint to resume from. The checkpoint's meta holds
the log's cursor (and the log's id) beside the state that trained on the feedback up to
it: a restarted learner re-reads the rows after the cursor, those the killed one trained
on after its last checkpoint included, into a state that never saw them, so each
feedback row is in the surviving weights once. It republishes the versions after the
restored step with the new updates; a server that swapped in the killed learner's newer
versions keeps them until the new lineage passes them (their completions are logged with
their own behaviour log-probs, so the correction stays exact). A checkpoint whose log
has been replaced (`rlcode serve --move-log-aside`) restarts the cursor at the new
log's first row.
"""

from __future__ import annotations

import contextlib
import logging
import time

import jax
import numpy as np

from rlcode import optim
from rlcode.config import loader
from rlcode.parallel import sharding
from rlcode.rl import algorithm, correction, grpo, sequences
from rlcode.train import scaffold
from rlcode.serve import log as log_lib
from rlcode.serve import server, weights
from rlcode.train import online_data
from rlcode.policy.training import PolicyTraining

log = logging.getLogger(__name__)


def train(config, stop=None) -> list[dict]:
  """Runs config.train.steps online updates; returns the metrics rows. `stop()` (when
  given) is asked while waiting for feedback: True ends the loop early."""
  config = loader.resolve(config)
  rl, on = config.rl, config.online

  # ══════════════════════════════════════════════════════════════ 1. mesh and policy
  mesh = sharding.mesh_from_config(config.mesh)
  rows = on.batch_rows
  if rows % sharding.batch_shards(mesh):
    raise ValueError(f"online.batch_rows={rows} does not split over the "
                     f"{sharding.batch_shards(mesh)} data-parallel devices of the mesh")
  model, tokenizer, _ = server.initial_policy(config.online.init_from, config.model,
                                             config.seed, mesh)
  trained = PolicyTraining(model, config.optimizer, mesh, keeps_reference=False,
                           base_reloads=bool(config.model.hf_path))
  store = log_lib.InteractionLog(
      config.serve.log_url or log_lib.default_url(config.workdir),
      server.model_identity(config.serve.model_name or "rlcode", config.model, config.seed,
                            config.online.init_from))
  publish_dir = server.published_dir(config.workdir)

  with contextlib.closing(store), scaffold.Run(config, desc="online") as run:
    # ════════════════════════════════════════════════════════════ 2. fresh or resumed
    if run.fresh:
      state, _ = trained.fresh(trained.params)
      cursor, baseline = 0, online_data.Baseline(on.baseline_decay)
      # Saved before the first metrics row: a learner killed from here on resumes.
      run.save(0, trained.bundle(state, {}), _meta(cursor, baseline, store, config, 0))
      run.ckpt.wait()
      run.log(0, {"version": 0})
    else:
      restored, meta = run.restore(trained.abstract_bundle())
      state, _ = trained.from_bundle(restored)
      cursor = meta["cursor"]
      if meta.get("log_id", store.log_id) != store.log_id:
        log.warning("%s is another log than the one checkpoint %d read to row %d: reading "
                    "it from its first row", store.where, run.start_step, cursor)
        cursor = 0
      baseline = online_data.Baseline(on.baseline_decay, meta["baseline"])
      if (weights.newest(publish_dir) or 0) < run.start_step:
        weights.publish(publish_dir, run.start_step, state.params)

    # ════════════════════════════════════════════════════════════ 3. the update
    loss_cfg = algorithm.loss(rl, on.max_tokens)
    example = sequences.SequenceBatch.abstract(rows)
    batch_sh = optim.batch_shardings(mesh, example)
    update = grpo.make_update_step(trained.graphdef, trained.optimizer, loss_cfg, mesh, state,
                                   example, trainable=trained.trainable, offload=trained.offload)
    proximal = grpo.make_proximal_fn(trained.graphdef, mesh, rl.temperature,
                                     correction.Correction.decoupled(rl.max_importance_weight),
                                     rows)
    pending: list = []  # feedback rows read, not yet trained on

    # ════════════════════════════════════════════════════════════ 4. loop
    for step in run.steps():
      wait_start = time.perf_counter()
      counts: dict = {}
      batch_rows, taken = [], 0
      # Whole feedback rows until the next would overflow the batch (then it is padded).
      while len(batch_rows) < rows:
        if not pending:
          pending = store.feedback_after(cursor, 256)
        if not pending:
          if stop is not None and stop():
            return run.rows
          time.sleep(on.poll_seconds)
          continue
        oldest = 0 if on.max_lag is None else step - on.max_lag
        got = online_data.rows_of(pending[0], kind=on.reward, max_tokens=on.max_tokens,
                                  counts=counts, oldest_version=oldest)[:rows]
        if len(batch_rows) + len(got) > rows:
          break
        batch_rows += online_data.with_advantages(got, baseline, on.baseline)
        cursor = pending.pop(0)["seq"]
        taken += 1
      wait_s = time.perf_counter() - wait_start

      batch = _batch(batch_rows, rows, tokenizer.pad_id)
      batch = jax.device_put(batch, batch_sh)
      start = time.perf_counter()
      stale = jax.device_put(np.arange(rows) < len(batch_rows), batch_sh.adv)
      batch.old_logp, batch.weight, batch.mask, iw = proximal(state.params, batch, stale)
      state, m, update_s = optim.run_passes(update, state, batch, rl.num_passes, step=step,
                                            on_nonfinite=config.train.on_nonfinite)
      publish_start = time.perf_counter()
      weights.publish(publish_dir, step + 1, state.params)
      published_at = time.time()
      rewards = np.array([r.reward for r in batch_rows])
      lag = np.array([step - r.policy_version for r in batch_rows])
      row = {k: float(v) for k, v in m.items()}
      row.update({k: float(v) for k, v in jax.device_get(iw).items()})
      row.update(version=step + 1, reward_mean=float(rewards.mean()),
                 rows=len(batch_rows), feedback=taken, cursor=cursor,
                 baseline=float(baseline.value), lag_mean=float(lag.mean()),
                 lag_max=int(lag.max()), wait_seconds=wait_s, update_seconds=update_s,
                 publish_seconds=time.perf_counter() - publish_start,
                 published_at=published_at, step_seconds=time.perf_counter() - start,
                 **{k: float(v) for k, v in counts.items()})
      run.log(step + 1, row)
      run.postfix(reward=row["reward_mean"], loss=row["loss"])
      if run.save_due(step + 1):
        run.save(step + 1, trained.bundle(state, {}),
                 _meta(cursor, baseline, store, config, step + 1))
  return run.rows


def _meta(cursor: int, baseline, store, config, step: int) -> dict:
  """What a checkpoint holds beside the state: the feedback it has trained on (the log's
  rows up to `cursor`, of this log) and the baseline after them."""
  return {"cursor": cursor, "log_id": store.log_id, "baseline": baseline.value,
          "seed": config.seed, "step": step}


def _batch(batch_rows, rows: int, pad_id: int) -> sequences.SequenceBatch:
  """The rows as a SequenceBatch of exactly `rows` rows (the rest padding, out of the loss)."""
  prompts = [r.prompt for r in batch_rows] + [[pad_id]] * (rows - len(batch_rows))
  completions = [r.tokens for r in batch_rows] + [[pad_id]] * (rows - len(batch_rows))
  behaviour = [np.asarray(r.logprobs, np.float32) for r in batch_rows] + [
      np.zeros(1, np.float32)] * (rows - len(batch_rows))
  adv = [r.advantage for r in batch_rows] + [0.0] * (rows - len(batch_rows))
  batch = sequences.sequence_batch(prompts, completions, range(rows), pad_id=pad_id,
                                   old_logp=behaviour, adv=adv)
  batch.mask[len(batch_rows):] = 0.0
  return batch
