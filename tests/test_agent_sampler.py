"""Multi-turn sampling: the kept KV cache against a from-scratch prefill, budgets, masks,
and the GRPO batch of trajectories.

The environments here hold their workspace in an in-memory stand-in for a sandbox
session (sessions themselves are tested in tests/test_sandbox_session.py); the
policy is a random tiny decoder, so its turns are mostly malformed calls, each
answered by an error observation: episodes of several turns and varied lengths.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlcode.parallel import sharding
from rlcode.rl import shared_prefix
from rlcode import optim
from rlcode.rl import objective
from rlcode.rl import sequences
from rlcode.agent import env as env_lib, episodes as rollout, expert, sampler, tools
from rlcode.agent.chat import ChatFormat
from rlcode.data.tasks import Task
from rlcode.models import Decoder, ModelConfig
from rlcode.models.tokenizer import load_tokenizer
from rlcode.sandbox.session import ExecResult, SessionError

TOK = load_tokenizer("bytes+tools")
CHAT = ChatFormat("compact", TOK)
CFG = ModelConfig(vocab_size=264, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=2, num_kv_heads=1, head_dim=16, max_seq_len=1024)


class MemorySession:
  """Files in a dict; commands echo themselves."""

  def __init__(self, limits=None):
    self.fs, self.alive = {}, True

  def read(self, path):
    if path not in self.fs:
      raise SessionError(f"{path}: no such file")
    return self.fs[path]

  def write(self, path, text):
    self.fs[path] = text

  def files(self):
    return sorted(self.fs)

  def exec(self, command, timeout=None):
    return ExecResult(f"ran {command}", 0, False, False)

  def close(self):
    self.alive = False


class CountingScorer:
  """Reward 1 when the solution file is non-empty."""

  def reward(self, task, program):
    return float(bool(program.strip())), {}

  def run_tests(self, task, program):
    raise AssertionError("not used")


def make_envs(n, max_turns=4):
  return [env_lib.ToolEnv(tools.make_tools(("editor", "think", "finish")), CountingScorer(),
                          max_turns=max_turns, open_session=MemorySession)
          for _ in range(n)]


TASKS = [Task(id=f"t{i}", prompt=f"write solution.py number {i}" + " please" * i,
              extra={"files": {"notes.txt": f"K = {i}\n"}}) for i in range(3)]


BUDGETS = sampler.Budgets(max_total_tokens=300, max_turn_tokens=40, max_observation_tokens=32)
KW = dict(group_size=2, budgets=BUDGETS, temperature=1.0, seed=3)


@pytest.fixture(scope="module")
def model():
  return Decoder(CFG, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def episodes(model):
  """One batch of episodes (3 tasks x 2), with its timing."""
  timing = sampler.Timing()
  trajs = sampler.run_episodes(model, CHAT, make_envs(6, max_turns=4), TASKS,
                               timing=timing, **KW)
  return trajs, timing


@pytest.fixture(scope="module")
def forward(model):
  """Log-probabilities of every token of a trajectory from one prefill of all of it
  (padded to one length, so that it compiles once; causal attention ignores the pad)."""
  run = jax.jit(lambda x: jax.nn.log_softmax(model(x)[0].astype(jnp.float32), -1))

  def logprobs(traj):
    full = np.array(traj.prompt + traj.tokens)
    padded = np.full((1, BUDGETS.max_total_tokens), TOK.pad_id, np.int32)
    padded[0, :len(full)] = full
    lp = np.asarray(run(jnp.asarray(padded)))
    pos = np.arange(len(traj.prompt) - 1, len(full) - 1)
    return lp[pos, full[len(traj.prompt):]]
  return logprobs


@pytest.mark.slow
def test_kept_kv_logprobs_equal_a_prefill_of_the_whole_trajectory(episodes, forward):
  trajs, timing = episodes
  assert timing.turns >= 3  # several turns
  # Later turns read the episode's kept pages: at least the prompts' full pages came from
  # the cache, and fewer tokens were prefilled than the turns' contexts hold.
  assert timing.cached_tokens >= sum(len(t.prompt) // sampler.PAGE_SIZE * sampler.PAGE_SIZE
                                     for t in trajs if len(t.turns) >= 2)
  assert sum(len(t.turns) >= 2 for t in trajs) >= 3
  for t in trajs:
    m = np.array(t.mask, bool)
    np.testing.assert_allclose(np.array(t.logprobs)[m], forward(t)[m], atol=2e-5)
    np.testing.assert_array_equal(np.array(t.logprobs)[~m], 0.0)


@pytest.mark.slow
def test_resending_the_context_each_turn_gives_the_same_episodes(model, episodes):
  kept = episodes[0]
  timing = sampler.Timing()
  resent = sampler.run_episodes(model, CHAT, make_envs(6, max_turns=4), TASKS,
                                reuse_kv=False, timing=timing, **KW)
  assert timing.cached_tokens == 0 and timing.prefill_tokens > episodes[1].prefill_tokens
  for a, b in zip(kept, resent):
    assert a.tokens == b.tokens and a.mask == b.mask and a.status == b.status
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=2e-5)


@pytest.mark.slow
def test_sampler_on_a_mesh_plays_the_same_episodes(model, episodes):
  """On a data=2, tensor=2 mesh (the policy sharded over it: two engines, each on its
  shard's two devices, in threads) the episodes are the unsharded run's."""
  mesh = sharding.make_mesh(2, 1, 2)
  sharded = sharding.shard_module(nnx.merge(*nnx.split(model)), mesh)
  trajs = sampler.run_episodes(sharded, CHAT, make_envs(6, max_turns=4), TASKS, mesh=mesh,
                               **KW)
  for a, b in zip(episodes[0], trajs):
    assert a.tokens == b.tokens and a.status == b.status
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=2e-5)


def test_budgets_bound_every_trajectory(episodes):
  trajs = episodes[0]
  statuses = {t.status for t in trajs}
  assert statuses <= set(env_lib.STATUSES) and statuses & {"max_tokens", "max_turns"}
  for t in trajs:
    assert t.context_tokens <= BUDGETS.max_total_tokens
    assert len(t.turns) <= 4
    assert len(t.tokens) == len(t.mask) == len(t.logprobs)
    for turn in t.turns:
      assert turn["turn_tokens"] <= BUDGETS.max_turn_tokens
      # The observation's own text is cut to its budget; the two tags come on top.
      assert turn.get("observation_tokens", 0) <= BUDGETS.max_observation_tokens + 2
    # Observations are exactly the appended <tool_response>...</tool_response> spans.
    obs = [tok for tok, m in zip(t.tokens, t.mask) if not m]
    assert TOK.decode(obs).count("<tool_response>") == sum(
        "observation_tokens" in turn for turn in t.turns)
    if t.status == "max_tokens":
      # The next turn or observation would not have fit.
      assert t.cut and t.context_tokens > BUDGETS.max_total_tokens - (
          BUDGETS.max_observation_tokens + 3)


def test_grpo_batch_masks_observations_and_cut_trajectories(episodes):
  trajs = episodes[0]
  adv = np.linspace(-1, 1, 6).astype(np.float32)
  for mask_cut in (False, True):
    batch = rollout.grpo_batch(trajs, 2, adv, pad_id=TOK.pad_id, max_len=300,
                               mask_cut=mask_cut)
    assert batch.prompt_tokens.shape[0] == 3
    for i, t in enumerate(trajs):
      n = len(t.tokens)
      assert batch.completion_tokens[i, :n].tolist() == t.tokens
      want = [0] * n if (mask_cut and t.cut) else t.mask
      assert batch.mask[i, :n].tolist() == want and not batch.mask[i, n:].any()
  assert any(t.cut for t in trajs) and not all(t.cut for t in trajs)


@pytest.mark.slow
def test_grpo_loss_over_trajectories_equals_per_token_numpy(model, episodes, forward):
  """The shared-prompt update's loss on a batch of trajectories, against the clipped
  surrogate computed by hand from a full forward of each trajectory."""
  trajs = [dataclasses.replace(t) for t in episodes[0]]
  # Behaviour log-probs a little off the policy's, so ratios are not all 1.
  rng = np.random.default_rng(0)
  for t in trajs:
    t.logprobs = [lp + (0.3 * rng.standard_normal() if m else 0.0)
                  for lp, m in zip(t.logprobs, t.mask)]
  adv = np.array([1.0, -1.0, 0.5, -0.5, 2.0, -2.0], np.float32)
  batch = rollout.grpo_batch(trajs, 2, adv, pad_id=TOK.pad_id, max_len=300, mask_cut=False)
  cfg = objective.LossConfig(clip_eps_low=0.2, clip_eps_high=0.28, max_completion_len=300)

  @jax.jit
  def loss_of(batch):
    logp, _ = shared_prefix.grouped_logprobs(model, batch, 1.0)
    return objective.policy_loss(logp, batch.old_logp, batch.adv, batch.mask, cfg)[0]
  loss = loss_of(jax.tree.map(jnp.asarray, batch))
  per_seq = []
  for t, a in zip(trajs, adv):
    m = np.array(t.mask, bool)
    ratio = np.exp(forward(t)[m] - np.array(t.logprobs)[m])
    per_seq.append(np.mean(-np.minimum(ratio * a, np.clip(ratio, 0.8, 1.28) * a)))
  np.testing.assert_allclose(float(loss), np.mean(per_seq), rtol=2e-5, atol=2e-6)


def test_sft_batch_targets_the_expert_calls_only():
  t = sampler.Trajectory(TASKS[0], [257, 1, 2], tokens=[5, 6, 7, 8], mask=[1, 1, 0, 1],
                         logprobs=[0.0] * 4)
  batch = rollout.sft_batch([t], TOK.pad_id)
  assert batch.start.tolist() == [2]
  assert batch.tokens[0, :7].tolist() == [257, 1, 2, 5, 6, 7, 8]
  assert batch.mask[0, :5].tolist() == [1, 1, 0, 1, 0]
  assert batch.tokens.shape[1] % rollout.LENGTH_MULTIPLE == 0


def test_prompt_that_leaves_no_room_for_a_turn_is_an_error(model):
  budgets = sampler.Budgets(max_total_tokens=60, max_turn_tokens=40,
                            max_observation_tokens=32)
  with pytest.raises(ValueError, match="leaves less than max_turn_tokens"):
    sampler.run_episodes(model, CHAT, make_envs(1), TASKS[2:], group_size=1,
                         budgets=budgets, temperature=1.0, seed=0)


def test_budgets_are_checked():
  with pytest.raises(ValueError, match="max_observation_tokens=8"):
    sampler.Budgets(max_observation_tokens=8)
  with pytest.raises(ValueError, match="must exceed"):
    sampler.Budgets(max_total_tokens=100, max_turn_tokens=100)
  assert dataclasses.asdict(sampler.Budgets())["max_total_tokens"] == 1024


@pytest.mark.slow
def test_sft_batch_rows_fit_the_longest_prompt_plus_trajectory(model, forward):
  """A long prompt with a short episode and a short prompt with a long one: the rows are
  as long as the longer of the two sums (not the longest prompt plus the longest
  episode), and each row's target log-probabilities are those of its own prefill."""
  rng = np.random.default_rng(0)
  ids = lambda n: rng.integers(1, 250, n).tolist()
  trajs = [sampler.Trajectory(TASKS[0], ids(100), tokens=ids(20), mask=[1] * 20,
                              logprobs=[0.0] * 20),
           sampler.Trajectory(TASKS[1], ids(4), tokens=ids(120), mask=[1, 0] * 60,
                              logprobs=[0.0] * 120)]
  batch = rollout.sft_batch(trajs, TOK.pad_id)
  assert batch.tokens.shape[1] == rollout.LENGTH_MULTIPLE  # 100 + 128 (was 256)
  assert batch.mask.shape[1] == rollout.LENGTH_MULTIPLE
  logp, _ = sequences.sequence_logprobs(model, batch, 1.0)
  logp = np.asarray(logp)
  for i, t in enumerate(trajs):
    m = np.array(t.mask, bool)
    np.testing.assert_allclose(logp[i, :len(t.tokens)][m], forward(t)[m], rtol=1e-5, atol=1e-5)
    assert not batch.mask[i, len(t.tokens):].any()


@pytest.mark.slow
def test_imitate_reports_every_step_to_on_step(model, episodes):
  """The warm start's on_step hook sees steps 1..N, each step's loss and the params
  after it (copied here: the next step donates them): the last call's params are the
  ones returned."""
  from rlcode.agent.demos import imitate
  trajs, _ = episodes
  graphdef, params = nnx.split(model, nnx.Param)
  seen = []
  mesh = sharding.make_mesh()
  params = jax.tree.map(lambda x: x.copy(), params)  # the first step donates them
  out, stats = imitate(graphdef, params, trajs, TOK.pad_id, mesh,
                       optimizer=optim.OptimizerConfig(learning_rate=1e-2, decay_steps=3), batch_size=2,
                       seed=0, steps=3,
                       on_step=lambda step, p, loss: seen.append(
                           (step, [np.asarray(x) for x in jax.tree.leaves(p)], float(loss))))
  assert [s for s, _, _ in seen] == [1, 2, 3]
  assert (seen[0][2], seen[-1][2]) == (stats["loss_first"], stats["loss_last"])
  for a, b in zip(seen[-1][1], jax.tree.leaves(out)):
    np.testing.assert_array_equal(a, np.asarray(b))
  assert not all(np.array_equal(a, np.asarray(b)) for a, b in zip(seen[0][1], jax.tree.leaves(out)))


@pytest.mark.slow
def test_train_on_batches_with_ema_returns_the_moving_average_of_the_steps_params(model,
                                                                                  episodes):
  """ema=0.6 over 3 steps: the first step's params, then avg = 0.6 avg + 0.4 new, from the
  same raw steps as a run without it (numpy on the params each step left)."""
  from rlcode.policy import sft
  from rlcode.parallel import sharding
  trajs, _ = episodes
  graphdef, params = nnx.split(model, nnx.Param)
  mesh = sharding.make_mesh()

  def run(ema, on_step=None):
    rng = np.random.default_rng(0)
    batch = lambda: rollout.sft_batch([trajs[i] for i in rng.choice(len(trajs), 2)],
                                      TOK.pad_id)
    return sft.train_on_batches(  # a copy each run: the first step donates its params
        graphdef, jax.tree.map(lambda x: x.copy(), params), batch, mesh, batch_size=2,
        steps=3, ema=ema, on_step=on_step,
        optimizer=optim.OptimizerConfig(learning_rate=1e-2, decay_steps=3))
  seen = []
  last, _ = run(0.0, lambda step, p, loss: seen.append(
      [np.asarray(x, np.float64) for x in jax.tree.leaves(p)]))
  avg, _ = run(0.6)
  want = seen[0]
  for new in seen[1:]:
    want = [0.6 * a + 0.4 * b for a, b in zip(want, new)]
  for w, got in zip(want, jax.tree.leaves(avg)):
    np.testing.assert_allclose(np.asarray(got), w, rtol=1e-5, atol=1e-6)
  assert not all(np.allclose(np.asarray(a), np.asarray(b))
                 for a, b in zip(jax.tree.leaves(avg), jax.tree.leaves(last)))
  from rlcode.errors import BadInput
  with pytest.raises(BadInput, match="ema must be in"):  # one line from the CLI
    run(1.0)


def test_episode_metrics_count_success_per_task_family():
  def episode(task_id, reward, calls):
    turns = [{"tool": "editor", "turn_tokens": 3}] * calls
    return sampler.Trajectory(Task(id=task_id, prompt="p"), [1], tokens=[2], mask=[1],
                              logprobs=[0.0], turns=turns, status="finished", reward=reward)
  trajs = [episode("agent/search/a/LIMIT", 1.0, 2), episode("agent/search/b/LIMIT", 0.0, 1),
           episode("agent/tests/c", 1.0, 3), episode("flat_id", 1.0, 0)]
  m = rollout.episode_metrics(trajs, success_reward=1.0)
  assert m["success"] == 0.75 and m["tool/editor"] == 6 / 4
  # Families from ids with a path; an id without one counts only in the totals.
  assert m["success/search"] == 0.5 and m["success/tests"] == 1.0
  assert not any(k.startswith("success/") and k not in ("success/search", "success/tests")
                 for k in m)


def test_episode_metrics_count_which_line_a_decoy_task_copied():
  def episode(program, decoy=4):
    hint = {"variant": "file"} if decoy is None else {"variant": "file", "decoy": decoy}
    task = Task(id="agent/file/add/k7/LIMIT", prompt="p",
                reference="def add_limit(x):\n    return x + 7\n", extra={"hint": hint})
    return sampler.Trajectory(task, [1], tokens=[2], mask=[1], logprobs=[0.0],
                              status="finished", reward=float("+ 7" in program),
                              program=program)
  trajs = [episode("def add_limit(x):\n    return x + 7\n"),
           episode("def add_limit(x):\n    return x + 4\n"),
           episode("def add_limit(x):\n    return x + 17\n"), episode(""),
           episode("def add_limit(x):\n    return x + 7\n", decoy=None)]
  m = expert.hint_metrics(trajs)
  assert (m["decoy/live"], m["decoy/decoy"]) == (0.25, 0.25)  # of the 4 with a decoy
  assert expert.written_constant("def f(x):\n    return x * 12\n") == "12"
  assert expert.written_constant("# nothing\n") is None
  assert "decoy/live" not in expert.hint_metrics(trajs[-1:])


def test_episode_metrics_count_the_episodes_that_believed_a_stale_note():
  def episode(program, hint):
    task = Task(id="agent/x/add/k7/LIMIT", prompt="p",
                reference="def add_limit(x):\n    return x + 7\n", extra={"hint": hint})
    return sampler.Trajectory(task, [1], tokens=[2], mask=[1], logprobs=[0.0],
                              status="finished", reward=0.0, program=program)
  file_hint = {"variant": "file", "note": 4}
  tests_hint = {"variant": "tests", "name": "frob3", "note": "frob2"}
  trajs = [episode("def add_limit(x):\n    return x + 4\n", file_hint),
           episode("def add_limit(x):\n    return x + 7\n", file_hint),
           episode("def add_limit(x):\n    return x + 14\n", file_hint),
           episode("def frob2(x):\n    return x + 7\n", tests_hint),
           episode("def frob3(x):\n    return x + 2\n", tests_hint),
           episode("def frob22(x):\n    return x + 7\n", tests_hint),
           episode("def add_limit(x):\n    return x + 4\n", {"variant": "file"})]
  m = expert.hint_metrics(trajs)
  assert m["note/believed"] == pytest.approx(2 / 6)  # of the 6 tasks with a note
  assert "note/believed" not in expert.hint_metrics(trajs[-1:])


def test_turn_seeds_are_32_bit_and_differ_by_seed_and_turn():
  seeds = {sampler.turn_seed(seed, turn) for seed in (0, 1, 2**40, -3) for turn in range(50)}
  assert len(seeds) == 200 and all(0 <= x < 2**32 for x in seeds)
  assert sampler.turn_seed(5, 2) == sampler.turn_seed(5, 2)
