"""The GRPO training loop, top to bottom.

    rlcode train --config configs/grpo_tiny.py          # config.trainer = "grpo"

Sections: mesh -> data -> model and optimiser -> the run (fresh: warm start; resumed:
the latest checkpoint) -> sampler and update -> loop (rollouts, update, log) with
periodic evaluation and checkpoints. Re-running the same command in the same workdir
resumes from the latest checkpoint, and the metrics of the remaining steps equal those
of an uninterrupted run (at rl.max_staleness = 0).

Rollouts (sample, then score in the sandbox) come from a sampler thread
(rlcode.rl.async_rollouts) that works ahead of the update by up to rl.max_staleness
policy versions; at 0 it waits for every update, which is the synchronous loop. With
rl.rollouts = "partial" they come from engines that never stop decoding
(rlcode.rl.partial): a step takes the first groups to finish, and new weights reach
rows mid-flight. With rl.sample_rounds = n > 1 a batch step samples up to n rounds of
tasks and keeps the groups whose rewards differ (DAPO's dynamic sampling,
rlcode.rl.dynamic, shared with the agent loop). Rewards become advantages after DAPO's
overlong shaping (rlcode.rl.overlong: rl.overlong_buffer's penalty, rl.overlong_filter),
for both kinds of rollouts. Stale rows, and every row with rl.rollout_correction, are
recomputed under the trainer's weights and corrected (rlcode.rl.correction) before the
update. With rl.distill_teacher a teacher on the trainer's mesh scores the sampled tokens,
and each token's advantage gains rl.distill_coef times the teacher's log-prob of it minus
the sampler's (on-policy distillation, rlcode.rl.distill; rlcode.policy.teacher loads the
teacher).
config.sampler_mesh puts the sampler on its own devices. The same command runs as N
processes (rlcode.parallel.distributed): each samples its share of the prompts, the
update is one program over all of them, and process 0 writes the files.

Evaluation: every `train.eval_every` steps on `data.eval_split` (rows "eval/...", the
split to tune on). With `data.test_split` set, the first and the last evaluation also
cover that split (rows "test/..."): the held-out result of a configuration once it is
tuned, before and after RL; leave it unset while tuning.
"""

from __future__ import annotations

import functools
import json
import time

import jax
import numpy as np
from flax import nnx

from rlcode import optim
from rlcode.config import loader
from rlcode.data import sources
from rlcode.data.stream import TaskStream
from rlcode.engine import grammar as grammar_lib
from rlcode.policy import policy_eval
from rlcode.models import moe
from rlcode.models.build import build_model
from rlcode.parallel import distributed, sharding
from rlcode.errors import BadInput
from rlcode.rl import (algorithm, async_rollouts, distill, dynamic, grpo, packing, partial,
                       rollout, sequences, shared_prefix)
from rlcode.sampling import engines
from rlcode.runs import checkpoint
from rlcode.train import scaffold
from rlcode.policy import teacher as teacher_lib
from rlcode.policy import warm_start
from rlcode.policy.training import PolicyTraining


def train(config) -> list[dict]:
  """Runs config.train.steps GRPO steps; returns the rows written to metrics.jsonl."""
  config = loader.resolve(config)
  rl = config.rl
  # What the run's scoring and update do (a bad setting fails here, before any model).
  algo = algorithm.Algorithm.of(rl, config.rewards, config.reward_options)

  # ══════════════════════════════════════════════════════════════ 1. mesh
  # The trainer's mesh spans every process; the sampler's is this process's own.
  mesh, sampler_mesh = distributed.meshes(config.mesh, config.sampler_mesh)
  n_rows = rl.prompts_per_step * rl.group_size
  dp = sharding.batch_shards(mesh)
  if n_rows % dp:
    raise ValueError(f"rl.prompts_per_step * rl.group_size = {n_rows} rows do not split "
                     f"over the {dp} data-parallel devices of the mesh")
  share = distributed.Share.of(rl.prompts_per_step, rl.group_size, dp)
  if rl.sample_rounds > 1 and jax.process_count() > 1:
    raise BadInput(f"rl.sample_rounds={rl.sample_rounds} runs in one process: processes "
                   "would draw different numbers of rounds from the task stream")

  # ══════════════════════════════════════════════════════════════ 2. data
  # Every process reads the tasks; the first prepares them on disk when that is needed.
  data = config.data
  with distributed.main_first("rlcode data"):
    train_tasks, eval_tasks, test_tasks = sources.load_splits(data)

  # ══════════════════════════════════════════════════════════════ 3. model and optimiser
  # With a shared warm start (warmstart.seed) the initial weights are the warm start's.
  warm = warm_start.Job.of(config.warmstart, seed=config.seed, model=config.model,
                           data=config.data, rl=rl, progress=config.train.progress_bar)
  init_seed = warm.seed if config.warmstart.steps else config.seed
  model, tokenizer = build_model(config.model, mesh, init_seed)
  fit = lambda tasks, split, budget: rollout.fit_tasks(
      tasks, tokenizer, split=split, max_seq_len=model.cfg.max_seq_len,
      max_new_tokens=budget, drop_too_long=data.drop_too_long, prompt_format=data.prompt_format)
  train_tasks, fit_train = fit(train_tasks, "train", rl.max_new_tokens)
  eval_tasks, fit_eval = fit(eval_tasks, "eval", config.eval.max_new_tokens)
  test_tasks, fit_test = (fit(test_tasks, "test", config.eval.max_new_tokens)
                          if test_tasks else ([], {}))
  loss_cfg = algo.loss
  keeps_reference = loss_cfg.uses_reference
  replayed = _replayed_experts(rl, model.cfg)  # (moe layers, top_k) or None
  # The longest training prompt: packing's check, and the engine's pool for every step.
  longest_prompt = max(len(p) for p in rollout.encode_prompts(tokenizer, train_tasks))
  _check_packing(rl, model.cfg, longest_prompt)
  grammar = _grammar(rl.grammar, tokenizer, model.cfg.vocab_size)  # None without rl.grammar
  allow_words = None if grammar is None else grammar_lib.words(model.cfg.vocab_size)
  trained = PolicyTraining(model, config.optimizer, mesh, keeps_reference=keeps_reference,
                           base_reloads=bool(config.model.hf_path))
  graphdef, params, policy = trained.graphdef, trained.params, trained.model
  score = _scorer(algo)
  grpo.check_micro_batch_rows(rl.micro_batch_rows, dp)
  # None without rl.distill_teacher
  teacher_model = teacher_lib.load(rl.distill_teacher, config.model, mesh, tokenizer, config.seed)
  if teacher_model is not None:  # its forward reads the batch in the update's layout
    _check_packing(rl, nnx.merge(*teacher_model).cfg, 0, "the teacher")

  with scaffold.Run(config, desc="grpo", main=distributed.is_main()) as run:
    # ════════════════════════════════════════════════════════════ 4. fresh or resumed
    position = 0
    if run.fresh:
      fit_warm = {}
      if config.warmstart.steps:
        with distributed.main_first("rlcode warm-start data"):
          warm_tasks, fit_warm = warm_start.warm_start_tasks(warm, tokenizer,
                                                             model.cfg.max_seq_len, train_tasks)
        params = warm_start.warm_start(warm, graphdef, params, warm_tasks, tokenizer, mesh,
                                       run.log)
      if data.drop_too_long:
        run.log(0, {**fit_train, **fit_eval, **fit_test, **fit_warm})
      state, ref_params = trained.fresh(params)
      if config.warmstart.steps:
        # The warm-started policy, kept for evaluation and controls (rlcode eval
        # --checkpoint WORKDIR/warm_start); the run's own checkpoints rotate.
        run.save_once(checkpoint.WARM_START, trained.bundle(state, ref_params),
                      {"data_position": 0, "seed": config.seed, "step": 0})
    else:
      restored, meta = run.restore(trained.abstract_bundle())
      (state, ref_params), position = trained.from_bundle(restored), meta["data_position"]

    # ════════════════════════════════════════════════════════════ 5. sampler and update
    stream = TaskStream(train_tasks, rl.prompts_per_step, config.seed, position)
    # rl.shared_prefix: each group's prompt runs once in the update.
    micro_batches = None
    if rl.pack_tokens:
      # rl.pack_tokens: each group's completions packed into fixed token budgets.
      logprob_fn = packing.logprob_fn(rl.temperature)
      example = packing.PackedBatch.abstract(rl.prompts_per_step, n_rows, allow_words)
      make_batch = functools.partial(packing.rl_batch, pack_tokens=rl.pack_tokens,
                                     shared=rl.shared_prefix)
      if rl.micro_batch_tokens:
        micro_batches = lambda b: packing.micro_count(b, rl.micro_batch_tokens, dp)
    elif rl.shared_prefix:
      logprob_fn = shared_prefix.logprob_fn(rl.temperature)
      example = shared_prefix.GroupedBatch.abstract(rl.prompts_per_step, n_rows, replayed,
                                                    allow_words)
      make_batch = shared_prefix.rl_batch
    else:
      logprob_fn = None
      example = sequences.SequenceBatch.abstract(n_rows, replayed, allow_words)
      make_batch = sequences.rl_batch
    batch_sh = optim.batch_shardings(mesh, example)
    update = grpo.make_update_step(graphdef, trained.optimizer, loss_cfg, mesh, state, example,
                                   logprob_fn=logprob_fn, micro_batch_rows=rl.micro_batch_rows,
                                   micro_batches=micro_batches,
                                   trainable=trained.trainable, dropout_seed=config.seed,
                                   offload=trained.offload)
    ref_logprobs = (grpo.make_logprob_fn(graphdef, mesh, rl.temperature, logprob_fn, n_rows)
                    if keeps_reference else None)
    # Rows sampled with an older policy version than the trainer's get the decoupled
    # PPO correction (clip against the trainer's policy, truncated importance weight);
    # with rl.rollout_correction every row is recomputed and corrected.
    fix = algo.correction
    proximal = grpo.make_proximal_fn(graphdef, mesh, rl.temperature, fix, n_rows, logprob_fn)
    teacher = (distill.Teacher(*teacher_model, mesh, rl.temperature, n_rows,
                               algo.distill, logprob_fn)
               if teacher_model is not None else None)
    sync = async_rollouts.WeightSync(mesh, sampler_mesh, state.params)
    store = async_rollouts.WeightStore(rl.max_staleness, rl.sample_version)
    store.publish(run.start_step, sync(state.params)[0])

    # One engine pool for rollouts and evaluations: their programs compile once.
    ev, eval_prompts = config.eval, rollout.encode_prompts(tokenizer, eval_tasks + test_tasks)
    pool = engines.shared_pool(
        [(share.stop - share.start, longest_prompt, rl.group_size, rl.max_new_tokens),
         (min(ev.batch_prompts, max(len(eval_tasks), len(test_tasks))),
          max(map(len, eval_prompts), default=0), ev.num_samples, ev.max_new_tokens)],
        sampler_mesh)
    evaluation = policy_eval.Evaluation(ev, config.rewards, config.reward_options,
                                        config.seed, config.train.progress_bar, pool)

    def run_eval(step, test=False):
      """The validation split (and the test split, with `test`) with the trainer's newest
      params, on the sampler's devices."""
      _, weights = store.latest()
      row = {}
      for prefix, tasks in (("eval", eval_tasks), ("test", test_tasks if test else [])):
        if tasks:
          result = evaluation(policy(weights), tokenizer, tasks, sampler_mesh)
          row.update({f"{prefix}/{k}": v for k, v in result.items()})
      run.log(step, row)

    def produce(step, version, weights):
      """In the sampler thread: this process's share of step `step`'s rollouts, scored; in
      rounds until its groups carry a signal with rl.sample_rounds > 1 (rlcode.rl.dynamic:
      round r draws from (seed, step, r); one round is the plain loop's sample)."""
      def sample_round(r):
        ro = rollout.sample(policy(weights), tokenizer, share.take(stream.next()),
                            group_size=rl.group_size, max_new_tokens=rl.max_new_tokens,
                            temperature=rl.temperature,
                            seed=dynamic.round_seed(config.seed, step, r), mesh=sampler_mesh,
                            row_offset=share.row_offset, experts=rl.routing_replay,
                            grammar=grammar, min_prompt_len=longest_prompt,
                            num_pages=pool)
        return (ro, *score(ro))
      ro, adv, reward_s, rounds = dynamic.fill_rollouts(
          sample_round, rl.group_size, share.stop - share.start, rl.sample_rounds)
      return ro, adv, reward_s, stream.position, rounds

    # ════════════════════════════════════════════════════════════ 6. loop
    if run.eval_at_start():
      run_eval(0, test=True)
    if rl.rollouts == "partial":
      rollouts_cm = _partial(config, policy(store.latest()[1]), tokenizer, stream, share,
                             longest_prompt, sampler_mesh, score, run.start_step)
    else:
      rollouts_cm = async_rollouts.AsyncRollouts(produce, store, start=run.start_step,
                                                 stop=config.train.steps)
    with rollouts_cm as rollouts:
      for step in run.steps():
        step_start = time.perf_counter()
        got, trainer_idle_s = rollouts.next()
        ro, adv, _, position, rounds = got.value
        seen = distributed.gather(_row_stats(got))
        widths = tuple(int(w) for w in seen["widths"].reshape(-1, 2).max(0))
        host = make_batch(ro, adv, tokenizer.pad_id, rl.max_new_tokens, rl.length_multiple,
                          widths)
        # Summed over the processes' parts of the batch.
        padded = packing.padding_of(distributed.gather(
            {"counts": packing.counts(host)[None]})["counts"].sum(0))
        batch = distributed.global_batch(host, batch_sh)
        lag = step - seen["version"]

        start, distilled = time.perf_counter(), {}
        if teacher is not None:  # while old_logp holds the sampler's log-probs
          batch.adv, _, dm = teacher(batch)
          distilled = {**{k: float(v) for k, v in jax.device_get(dm).items()},
                       "distill_seconds": time.perf_counter() - start}

        start = time.perf_counter()
        iw = {"iw_clip_frac": 0.0, "iw_mean": 1.0}
        if fix.every_row or lag.any():
          rows = distributed.put_global(fix.every_row | (lag > 0), batch_sh.adv)
          batch.old_logp, batch.weight, batch.mask, iw = proximal(state.params, batch, rows)
        if ref_logprobs is not None:
          batch.ref_logp = ref_logprobs(trained.reference_params(ref_params, state), batch)
        jax.block_until_ready((batch.old_logp, batch.ref_logp))
        proximal_s = time.perf_counter() - start

        state, m, update_s = optim.run_passes(update, state, batch, rl.num_passes, step=step,
                                              on_nonfinite=config.train.on_nonfinite)
        weights, sync_s = sync(state.params)
        store.publish(step + 1, weights)
        if rl.rollouts == "partial":
          rollouts.publish(step + 1, nnx.state(policy(weights).for_sampling()))

        row = _step_row(m, seen, lag, iw, ro, batch, rl, algo.overlong, update_s=update_s,
                        proximal_s=proximal_s, sync_s=sync_s, trainer_idle_s=trainer_idle_s,
                        step_s=time.perf_counter() - step_start)
        row.update(rounds, **distilled, **padded)
        if rl.rollouts == "partial":
          row.update(rollouts.stats())
        run.log(step + 1, row)
        run.postfix(reward=row["reward_mean"], loss=row["loss"])

        done = step + 1
        if run.eval_due(done):
          run_eval(done, test=run.is_last(done))
        if run.save_due(done):
          run.save(done, trained.bundle(state, ref_params),
                   {"data_position": position, "seed": config.seed, "step": done})
  return run.rows


def _replayed_experts(rl, cfg) -> tuple[int, int] | None:
  """(MoE layers, top_k) of the experts a batch records under rl.routing_replay, else None;
  one line where the run cannot record them."""
  if not rl.routing_replay:
    return None
  layers = len(moe.moe_layer_index(cfg)) if cfg.moe is not None else 0
  if not layers:
    raise BadInput("rl.routing_replay=true: the model has no MoE layers to replay")
  if rl.rollouts == "partial":
    raise BadInput("rl.routing_replay=true records the experts in the batch rollouts; "
                   "rl.rollouts='partial' does not record them")
  if "nsa" in cfg.layer_kinds:
    raise BadInput("rl.routing_replay=true: models with NSA layers sample outside the "
                   "engine, which records the experts")
  return layers, cfg.moe.top_k


def _grammar(path: str | None, tokenizer, vocab_size: int):
  """rl.grammar's file compiled for the tokenizer (rlcode.engine.grammar), or None; one
  line where it cannot be read or is not a grammar."""
  if path is None:
    return None
  try:
    with open(path) as f:
      text = f.read()
    if path.endswith(".json"):
      return grammar_lib.Grammar.json_schema(tokenizer, vocab_size, json.loads(text))
    return grammar_lib.Grammar.lark(tokenizer, vocab_size, text)
  except (OSError, ValueError) as e:
    raise BadInput(f"rl.grammar={path!r}: {e}") from None


def _check_packing(rl, cfg, longest_prompt: int, model: str = "this model") -> None:
  """One line where rl.pack_tokens cannot pack this run's batches for a model of `cfg`
  (the config's own checks are rlcode.config.rl's); longest_prompt: the training
  prompts' longest."""
  if not rl.pack_tokens:
    return
  if not rl.shared_prefix and rl.pack_tokens < longest_prompt + rl.max_new_tokens:
    raise BadInput(f"rl.pack_tokens={rl.pack_tokens} cannot hold the longest training "
                   f"prompt ({longest_prompt} tokens) and rl.max_new_tokens="
                   f"{rl.max_new_tokens} in one pack (rl.shared_prefix=false packs each "
                   "completion after its own prompt)")
  if jax.process_count() > 1:
    raise BadInput("rl.pack_tokens runs in one process: processes would pack different "
                   "numbers of rows a group")
  kinds = sorted(set(cfg.layer_kinds) - {"dense"})
  if kinds:
    raise BadInput(f"rl.pack_tokens needs dense attention layers, and {model} has "
                   f"{', '.join(kinds)} layers")


def _scorer(algo: algorithm.Algorithm):
  """(Rollout) -> (advantages, reward seconds): the algorithm's scoring of a step's
  completions (rewards, DAPO's overlong shaping, group advantages), timed; for batch and
  partial rollouts alike."""

  def score(ro):
    start = time.perf_counter()
    adv = algo.score(ro)
    return adv, time.perf_counter() - start
  return score


def _partial(config, model, tokenizer, stream, share, longest_prompt, sampler_mesh, score,
             start):
  """Partial rollouts (rl.rollouts = "partial"): this process's groups on running engines;
  score: `_scorer`'s."""
  rl = config.rl
  if rl.max_staleness < 1:
    raise ValueError("rl.rollouts=partial needs rl.max_staleness >= 1: a step trains on "
                     "groups that were decoding while the update before it ran")
  return partial.PartialRollouts(
      model, next_tasks=lambda: share.take(stream.next()), position=lambda: stream.position,
      tokenizer=tokenizer, group_size=rl.group_size, max_new_tokens=rl.max_new_tokens,
      temperature=rl.temperature, seed=engines.derived_seed(config.seed, jax.process_index()),
      prompts_per_step=share.stop - share.start, max_staleness=rl.max_staleness,
      score=score, mesh=sampler_mesh, start=start, in_flight=rl.in_flight_groups,
      max_prompt_tokens=longest_prompt, engine_processes=rl.engine_processes)


def _step_row(m, seen, lag, iw, ro, batch, rl, shaping, *, update_s, proximal_s, sync_s,
              trainer_idle_s, step_s) -> dict:
  """One step's metrics row: the update's, the rollouts' (over every process), timings."""
  n_tokens = int(seen["lengths"].sum())
  rollout_s = float(seen["rollout_seconds"].max())
  row = {k: float(v) for k, v in m.items()}
  row.update(
      reward_mean=float(seen["scores"].mean()), reward_std=float(seen["scores"].std()),
      pass_rate=float(np.mean(seen["passed"])),
      groups_with_signal=float(np.mean(
          np.abs(seen["adv"].reshape(-1, rl.group_size)).max(1) > 0)),
      completion_len=float(seen["lengths"].mean()),
      truncated_frac=float(seen["truncated"].mean()),
      trained_len=float(seen["loss_lengths"].mean()),
      rollout_tokens_per_s=n_tokens / rollout_s,
      update_tokens_per_s=_batch_tokens(batch) * rl.num_passes / update_s,
      tokens_per_s=n_tokens / (rollout_s + update_s),
      rollout_seconds=rollout_s, reward_seconds=float(seen["reward_seconds"].max()),
      update_seconds=update_s, proximal_seconds=proximal_s, sync_seconds=sync_s,
      sampler_idle_seconds=float(seen["sampler_idle_seconds"].max()),
      trainer_idle_seconds=trainer_idle_s, step_seconds=step_s,
      **{k: float(v) for k, v in jax.device_get(iw).items()},
      **{f"staleness/{k}": int((lag == k).sum()) for k in range(rl.max_staleness + 1)},
      **{f"reward/{k}": v
         for k, v in distributed.mean_over_processes(ro.reward.metrics).items()})
  if rl.overlong_buffer:
    row["overlong_penalty"] = float(shaping.penalty(seen["lengths"]).mean())
  return row


def _row_stats(got: async_rollouts.Produced) -> dict[str, np.ndarray]:
  """What the step's metrics are computed from, for this process's rows (per-row
  arrays) and its timings (one entry each); rlcode.parallel.distributed.gather joins them."""
  ro, adv, reward_s, _, _ = got.value
  reward = ro.reward
  passed = [_passed(d) for d in reward.details] if reward.details else [False] * len(adv)
  # 32-bit types: they cross processes as JAX arrays.
  one = lambda x: np.array([x], np.float32)
  return {
      "scores": reward.scores, "passed": np.array(passed, np.int32), "adv": adv,
      "lengths": ro.generation.lengths, "loss_lengths": ro.loss_lengths,
      "truncated": (~ro.generation.finished).astype(np.int32),
      "version": np.broadcast_to(np.asarray(got.version, np.int32), (len(adv),)).copy(),
      "widths": np.array(rollout.batch_widths(ro), np.int32),
      "rollout_seconds": one(ro.seconds), "reward_seconds": one(reward_s),
      "sampler_idle_seconds": one(got.sampler_idle_seconds)}


def _batch_tokens(batch) -> int:
  """Token positions the update computes (each group's prompt once when shared)."""
  if isinstance(batch, packing.PackedBatch):
    return batch.computed_tokens()
  if isinstance(batch, shared_prefix.GroupedBatch):
    return batch.prompt_tokens.size + batch.completion_tokens.size
  return batch.tokens.size


def _passed(detail: dict) -> bool:
  tests = detail.get("tests")
  return bool(tests and tests.get("status") == "passed")
