"""`rlcode <command> ...`: train, eval, sample, serve, learn-online, plot, mine, plan, config,
export.

    rlcode train  --config configs/grpo_tiny.py [--config.a.b=value ...]
                  [--coordinator HOST:PORT --num-processes N --process-id I]
    rlcode config show configs/grpo_tiny.py [--config.a.b=value ...]
    rlcode config keys [--trainer grpo]
    rlcode eval   --tasks humaneval --completions samples.jsonl [--k 1,10,100]
    rlcode eval   --config configs/grpo_tiny.py --checkpoint workdirs/grpo_tiny
    rlcode eval   ... --select first,majority,rm,oracle --k 1,4,16,64 [--rm workdirs/rm_choices]
    rlcode sample --config configs/sample_tiny.py
    rlcode serve  --checkpoint WORKDIR | --config configs/online_tiny.py [--host H --port P]
                  [--api-key-file F] [--move-log-aside]
    rlcode learn-online --config configs/online_tiny.py
    rlcode plot   workdirs/grpo_tiny
    rlcode mine   data/repos/more-itertools.bundle --out /tmp/tfds [--granularity hunk ...]
    rlcode plan   --config configs/qwen2_7b_plan.py --devices gb200-nvl72 --mesh data=8,fsdp=8
                  [--sampler-mesh data=2,tensor=4] [--hardware h200|gb200] [--prompt-len N]
    rlcode export workdirs/grpo_tiny --out /tmp/policy [--peft] [--max-shard-gb 5]

Each command is a thin shell around an importable function, so notebooks and
experiments call the same code.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from rlcode.config import loader
from rlcode.errors import BadInput, MissingInput, UnknownKey, UserError


class _Parser(argparse.ArgumentParser):
  """argparse, but a usage error is one line on stderr (exit 2), like every user error."""

  def error(self, message):
    self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parse(argv: Sequence[str]):
  parser = _Parser(prog="rlcode", description=__doc__.splitlines()[0])
  commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
  config_help = "configs/NAME.py[:arg]; override keys with --config.a.b=value"
  train = commands.add_parser("train", help="train what the config's trainer says: a policy "
                              "with GRPO (grpo, agent, harness) or a reward model (rm)")
  train.add_argument("--config", required=True, help=config_help)
  # One run over N processes (rlcode.distributed); the JAX_* variables stand in for
  # flags left out, and with neither the run is one process.
  train.add_argument("--coordinator", help="HOST:PORT of process 0 (or $JAX_COORDINATOR_ADDRESS)")
  train.add_argument("--num-processes", type=int,
                     help="processes in the run (or $JAX_NUM_PROCESSES)")
  train.add_argument("--process-id", type=int, help="this process, 0..N-1 (or $JAX_PROCESS_ID)")
  sample = commands.add_parser("sample", help="sample completions from a policy")
  sample.add_argument("--config", required=True, help=config_help)
  ev = commands.add_parser("eval", help="pass@k of a completions file or of a checkpoint")
  ev.add_argument("--tasks", help="humaneval, or a problems file PATH.jsonl[:split]")
  ev.add_argument("--completions", help="JSON lines of {task_id, completion}")
  ev.add_argument("--config", help=config_help + " (with --checkpoint)")
  ev.add_argument("--checkpoint", help="a workdir or its checkpoints/ directory")
  ev.add_argument("--k", default="1,10,100", help="comma-separated k for pass@k")
  ev.add_argument("--out", default="", help="directory for the report (default: beside a "
                  "completions file; printed only otherwise)")
  ev.add_argument("--workers", type=int, default=None, help="sandbox workers (default: CPUs)")
  ev.add_argument("--select", default="", help="selectors among k samples, comma-separated: "
                  "first, majority, rm, oracle (selector@k instead of pass@k)")
  ev.add_argument("--rm", default="", help="the reward model's workdir, for --select rm")
  ev.add_argument("--inputs", default="tests", help="majority vote's inputs: tests or prompt")
  srv = commands.add_parser("serve", help="an OpenAI-compatible HTTP server of a policy, "
                            "logging every completion and its users' feedback")
  srv.add_argument("--config", help=config_help)
  srv.add_argument("--checkpoint", help="a training workdir (or its warm_start/) to serve")
  srv.add_argument("--host", default="127.0.0.1", help="the address to listen on")
  srv.add_argument("--port", type=int, default=8000, help="the port (0: one the OS picks)")
  srv.add_argument("--api-key-file", default=None,
                   help="a file holding the API key clients must send (default: none)")
  srv.add_argument("--move-log-aside", action="store_true",
                   help="when the interaction log is refused (damaged, another model's or "
                        "another schema version's), rename it aside and begin a new one")
  online = commands.add_parser("learn-online", help="update the served policy from the "
                               "feedback in the interaction log, publishing each version")
  online.add_argument("--config", required=True, help=config_help)
  plot = commands.add_parser("plot", help="PNG curves of a workdir's metrics.jsonl")
  plot.add_argument("workdir")
  plan = commands.add_parser("plan", help="per-device memory, FLOPs, collectives and time of a "
                              "config on a mesh of N devices, compiled on fake CPU devices")
  plan.add_argument("--config", required=True, help=config_help)
  plan.add_argument("--devices", required=True,
                    help="a device count, or a system: h200x8, gb200-nvl72")
  plan.add_argument("--mesh", required=True, help="the trainer's mesh, e.g. data=1,fsdp=8,tensor=1")
  plan.add_argument("--sampler-mesh", default=None,
                    help="the sampler's own mesh on the devices after the trainer's "
                         "(default: config.sampler_mesh; empty: the trainer's mesh)")
  plan.add_argument("--hardware", default=None,
                    help="the GPU whose published peaks the estimate uses: h200, gb200 "
                         "(default: the system's, or h200 for a count)")
  plan.add_argument("--prompt-len", type=int, default=0,
                    help="prompt tokens (default: config.plan.prompt_len, else 256)")
  plan.add_argument("--json", default="", help="also write the measurements and estimate here")
  config = commands.add_parser("config", help="the config schema: show a resolved config, "
                               "list every key")
  what = config.add_subparsers(dest="what", required=True, parser_class=_Parser)
  show = what.add_parser("show", help="a config resolved: every key, defaults filled")
  show.add_argument("config", help="configs/NAME.py[:arg]; overrides --config.a.b=value after it")
  keys = what.add_parser("keys", help="every key of the schema: type, default, allowed, doc")
  keys.add_argument("--trainer", default=None, help="only the keys this trainer reads")
  export = commands.add_parser("export", help="a trained policy as a Hugging Face directory "
                               "(or a PEFT adapter) that transformers loads")
  export.add_argument("checkpoint", help="a run's workdir or checkpoint directory")
  export.add_argument("--out", required=True, help="a new directory to write")
  export.add_argument("--peft", action="store_true", help="a LoRA run's adapters alone, as a "
                      "PEFT adapter directory (default: merged weights)")
  export.add_argument("--max-shard-gb", type=float, default=None,
                      help="split the safetensors into shards of at most this size")
  # `main` hands `mine` to rlcode.mine, which parses its options.
  commands.add_parser("mine", help="mine a git history into diff datasets (rlcode mine -h)")
  args, rest = parser.parse_known_args(argv)
  unknown = [a for a in rest if not a.startswith(loader.PREFIX)]
  if unknown or (rest and not getattr(args, "config", None)) or (
      rest and getattr(args, "what", None) == "keys"):
    parser.error(f"unrecognised arguments: {' '.join(unknown or rest)}")
  return parser, args, rest


def _tasks(spec: str):
  # Deferred here and below: each command imports its own (heavy) modules, so one command
  # does not pay for jax, flax or tfds it does not use.
  from rlcode.data import jsonl, sources
  from rlcode.data.humaneval import humaneval_tasks
  if spec == "humaneval":
    return humaneval_tasks()
  path, _, split = spec.partition(":")
  path = sources.resolve(path)
  if not os.path.isfile(path):
    raise MissingInput(f"--tasks {spec!r}: no such file; expected 'humaneval' or "
                       "PATH.jsonl[:split]")
  splits = jsonl.read_jsonl_tasks(path, jsonl.JsonlTasks.HELD_OUT_FRACTION)
  if split:
    if split not in splits:
      raise UnknownKey(f"--tasks {spec!r}: no split {split!r}; splits are {sorted(splits)}")
    return splits[split]
  return [t for name in sorted(splits) for t in splits[name]]


def _ks(text: str) -> list[int]:
  try:
    ks = [int(k) for k in text.split(",") if k.strip()]
  except ValueError:
    ks = []
  if not ks or min(ks) < 1:
    raise BadInput(f"--k {text!r}: expected positive integers separated by commas, "
                   "for example 1,10,100")
  return ks


def _eval(parser, args, overrides) -> None:
  # Deferred: scoring and sampling bring in the sandbox, jax and the models.
  from rlcode.evaluation import scoring, selection, selection_eval
  from rlcode.policy import policy_eval
  from rlcode.rm import scorer
  ks = _ks(args.k)
  selectors = [x.strip() for x in args.select.split(",") if x.strip()]
  select = dict(selectors=selectors, ks=ks,
                rm_scores=scorer.selection_scorer(args.rm) if args.rm else None,
                behaviour_inputs=args.inputs)
  if args.completions:
    if not args.tasks or args.checkpoint:
      parser.error("eval --completions needs --tasks (and no --checkpoint)")
    if selectors:
      tasks = _tasks(args.tasks)
      pairs = scoring.read_completions(args.completions, tasks)
      table = selection_eval.evaluate_selection(tasks, pairs, workers=args.workers, **select)
      print(selection.format_table(table, selectors))
      _write_report(args.out, "selection_report.json", table)
      return
    out = args.out or os.path.dirname(os.path.abspath(args.completions))
    report = scoring.evaluate_completions_file(_tasks(args.tasks), args.completions,
                                                out_dir=out, k=ks, workers=args.workers,
                                                progress=True)
    print(scoring.format_report(report))
    return
  if not (args.config and args.checkpoint):
    parser.error("eval needs --tasks with --completions, or --config with --checkpoint")
  config = loader.load_config(args.config, overrides)
  if selectors:
    table = policy_eval.sample_and_select(config, args.checkpoint, **select)
    print(selection.format_table(table, selectors))
    _write_report(args.out, "selection_report.json", table)
    return
  result = policy_eval.evaluate_checkpoint(config, args.checkpoint, ks=ks)
  print(json.dumps(result, indent=2))
  _write_report(args.out, scoring.REPORT_NAME, result)


def _write_report(out: str, name: str, report) -> None:
  """The report as JSON in directory `out` (every eval mode honours --out)."""
  if not out:
    return
  os.makedirs(out, exist_ok=True)
  path = os.path.join(out, name)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(report, f, indent=2, default=str)
    f.write("\n")
  print(f"wrote {path}")


# XLA's persistent compilation cache, on by default: a run loads the programs an earlier
# run of the same shapes compiled from disk (`make smoke`: 0.69x the cold run's time).
# Where JAX_COMPILATION_CACHE_DIR is set (empty: no cache), JAX's own settings stand.
CACHE_DIR = os.path.join("~", ".cache", "rlcode", "jax")
# Most of a small run's programs compile in 0.2-2 s; JAX caches from 1 s by default.
CACHE_MIN_COMPILE_SECONDS = 0.2


def compilation_cache() -> None:
  """Turns on the persistent compilation cache in CACHE_DIR for this process and the
  processes it starts, unless the environment names a cache directory (or none)."""
  import jax  # already imported by the config loader: the settings go to its config too
  if "JAX_COMPILATION_CACHE_DIR" in os.environ:
    return
  os.environ["JAX_COMPILATION_CACHE_DIR"] = path = os.path.expanduser(CACHE_DIR)
  jax.config.update("jax_compilation_cache_dir", path)
  if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = str(CACHE_MIN_COMPILE_SECONDS)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", CACHE_MIN_COMPILE_SECONDS)


def main(argv: Sequence[str] | None = None) -> int:
  """Runs one command. A UserError (a wrong key, path, flag, file row or repository) is
  printed as one line on stderr and gives exit code 2; anything else is a bug and raises."""
  argv = sys.argv[1:] if argv is None else list(argv)
  compilation_cache()
  command = argv[0] if argv else ""
  try:
    if command == "mine":
      from rlcode import mine  # brings in tfds: only when mining
      return mine.main(argv[1:], parser_class=_Parser)
    parser, args, overrides = _parse(argv)
    _run(parser, args, overrides)
  except UserError as e:
    print(f"rlcode {command}: error: {' '.join(e.message.split())}", file=sys.stderr)
    return 2
  return 0


def _run(parser, args, overrides) -> None:
  if args.command == "eval":
    _eval(parser, args, overrides)
  elif args.command == "plot":
    from rlcode.runs import plot  # deferred: matplotlib
    print(plot.plot(args.workdir))
  elif args.command == "plan":
    from rlcode import plan  # deferred: jax, the models and the compiler's analysis
    result, hw, est = plan.plan(args.config, overrides, args.devices, args.mesh,
                                args.sampler_mesh, args.hardware, args.prompt_len)
    print(plan.format_table(result, hw, est))
    if args.json:
      with open(args.json, "w") as f:
        json.dump({"hardware": hw.name, "result": result, "estimate": est}, f, indent=1)
  elif args.command == "config":
    from rlcode.config import describe, schema  # deferred: the whole schema's sections
    if args.what == "show":
      print(describe.show(loader.load_config(args.config, overrides)))
    else:
      if args.trainer is not None and args.trainer not in schema.TRAINERS:
        raise BadInput(f"--trainer {args.trainer!r}: one of {', '.join(schema.TRAINERS)}")
      print(describe.format_keys(describe.keys(args.trainer)))
  elif args.command == "train":
    config = loader.load_config(args.config, overrides)
    _train(config, args)
  elif args.command == "export":
    from rlcode.policy import export  # deferred: jax, the models and safetensors
    print(export.export(args.checkpoint, args.out, peft=args.peft,
                        max_shard_gb=args.max_shard_gb))
  elif args.command == "serve":
    _serve(parser, args, overrides)
  elif args.command == "learn-online":
    config = loader.load_config(args.config, overrides)
    if config.trainer != "online":
      raise BadInput(f"rlcode learn-online runs configs whose trainer is 'online'; "
                     f"{args.config} has trainer {config.trainer!r}")
    from rlcode.train import online_loop  # deferred: jax, the models and the server's log
    online_loop.train(config)
  else:
    config = loader.load_config(args.config, overrides)
    if config.trainer != "sample":
      raise BadInput(f"rlcode sample runs configs whose trainer is 'sample'; {args.config} "
                     f"has trainer {config.trainer!r} (rlcode train runs it)")
    from rlcode.sampling import job  # deferred: jax and the models
    job.sample(config)


def _serve(parser, args, overrides) -> None:
  if not (args.config or args.checkpoint):
    parser.error("serve needs --config or --checkpoint")
  if not 0 <= args.port <= 65535:
    raise BadInput(f"--port {args.port}: expected 0 (the OS picks) to 65535")
  config = loader.load_config(args.config, overrides) if args.config else None
  from rlcode.serve import server  # deferred: jax, the models and the web stack
  server.serve(config, checkpoint=args.checkpoint, host=args.host, port=args.port,
               api_key_file=args.api_key_file, move_log_aside=args.move_log_aside)


# The configs `rlcode train` runs (config.trainer); their loops are in _train.
TRAINERS = ("grpo", "agent", "rm", "harness")


def _train(config, args) -> None:
  if config.trainer not in TRAINERS:
    raise BadInput(f"{args.config}: trainer {config.trainer!r} is not trained (rlcode "
                   f"{config.trainer} runs it); rlcode train runs {', '.join(TRAINERS)}")
  multi = args.coordinator or args.num_processes
  if multi and config.trainer != "grpo":
    raise BadInput(f"--coordinator/--num-processes: the {config.trainer!r} trainer runs in one "
                   "process (multi-process runs are the grpo trainer's)")
  # The loops are imported only for the run (jax, the models); the grpo loop after the
  # processes have joined, as jax.distributed must start before jax's backends.
  if config.trainer == "grpo":
    from rlcode.parallel import distributed  # deferred: jax
    distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    from rlcode.train import grpo_loop  # deferred: after the processes join
    grpo_loop.train(config)
  elif config.trainer == "agent":
    from rlcode.train import agent_loop  # deferred: jax and the models
    agent_loop.train(config)
  elif config.trainer == "harness":
    from rlcode.train import harness_loop  # deferred: jax, the models and the web stack
    harness_loop.train(config)
  else:
    from rlcode.train import rm_loop  # deferred: jax and the models
    rm_loop.train(config)


if __name__ == "__main__":
  sys.exit(main())
