"""How far a reader walks with the config from `rlcode train` to the jitted GRPO update.

    python tools/config_walk.py [--trace] [--whole]

A static walk over rlcode's source (ast; nothing is imported or run):

- It starts in `rlcode.cli._train(config, args)`, where `rlcode train` hands over the
  loaded config, and reads each function's body in source order.
- A *config value* is the whole config or one of its sections: a parameter that received
  one, a name assigned from one (`rl = config.rl`), `config.<section>` written out, or
  `self.<attr>` assigned from one in a class's `__init__`. A field read (`rl.group_size`)
  is a plain value, not a config value.
- A call that passes a config value to a function or class of rlcode (resolved through the
  module's imports, deferred ones included) is a *stop*: the reader opens that function and
  reads it the same way (depth first, each function once).
- A *climb* is a return to a file left before: the next stop is read from a caller in
  another file than the stop read last (back to the loop from a helper module, say),
  however many levels that goes up.
- The walk ends at the first call of the target, `rlcode.rl.grpo.make_update_step`
  (the function that builds the jitted update), wherever that call is read; the target
  counts as the last stop.

Prints the stops, files and climbs up to the target. With --whole, the same walk, run to
its end from every command of rlcode.cli and every function that makes a config
(`loader.load_config`, a run's recorded config), lists every function outside the commands and loops
(rlcode/cli.py, rlcode/train/, rlcode/config/, and COMMANDS: the bodies of the other
commands) that receives the whole config. --trace
prints the walk.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START = ("rlcode.cli", "_train", {"config": "whole"})
TARGET = ("rlcode.rl.grpo", "make_update_step")
LOOPS = ("rlcode.train.", "rlcode.cli", "rlcode.config.")
# What makes a whole config; the --whole walk starts from every command in rlcode.cli.
MAKERS = ("load_config", "recorded_config")
# The bodies of commands that rlcode.cli calls with their config, as it calls the loops:
# they sit at the loops' level (each reads its config top to bottom).
COMMANDS = {
    "rlcode.plan.analysis.analyse",  # rlcode plan
    "rlcode.policy.policy_eval.evaluate_checkpoint",  # rlcode eval --checkpoint
    "rlcode.policy.policy_eval.sample_and_select",  # rlcode eval --checkpoint --select
    "rlcode.sampling.job.sample",  # rlcode sample
    "rlcode.serve.server.serve",  # rlcode serve, and its stages (the in-process server's)
    "rlcode.serve.server.build",
    "rlcode.serve.server.load",
}


@dataclass
class Module:
  name: str
  path: str
  tree: ast.Module
  functions: dict = field(default_factory=dict)  # name -> FunctionDef (and "Class.method")
  classes: dict = field(default_factory=dict)  # name -> ClassDef
  names: dict = field(default_factory=dict)  # local name -> (module, attribute or None)


def load_modules(root: str = ROOT) -> dict[str, Module]:
  """Every module of the rlcode package under `root`, parsed, by dotted name."""
  modules = {}
  for folder, _, files in os.walk(os.path.join(root, "rlcode")):
    for file in sorted(files):
      if not file.endswith(".py"):
        continue
      path = os.path.join(folder, file)
      rel = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
      name = rel[:-len(".__init__")] if rel.endswith(".__init__") else rel
      with open(path) as f:
        modules[name] = Module(name, path, ast.parse(f.read(), path))
  for module in modules.values():
    for node in module.tree.body:
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        module.functions[node.name] = node
      elif isinstance(node, ast.ClassDef):
        module.classes[node.name] = node
        for item in node.body:
          if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            module.functions[f"{node.name}.{item.name}"] = item
    # Every import of the module, those inside functions too (the loops defer theirs).
    package = module.name if module.path.endswith("__init__.py") else module.name.rpartition(".")[0]
    for node in ast.walk(module.tree):
      if isinstance(node, ast.Import):
        for alias in node.names:
          if alias.asname:
            module.names[alias.asname] = (alias.name, None)
          else:
            module.names[alias.name.split(".")[0]] = (alias.name.split(".")[0], None)
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          parts = package.split(".")
          base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
        for alias in node.names:
          target = f"{base}.{alias.name}"
          module.names[alias.asname or alias.name] = ((target, None) if target in modules
                                                      else (base, alias.name))
  return modules


class Walk:

  def __init__(self, modules, stop_at_target=True):
    self.modules = modules
    self.stop_at_target = stop_at_target
    self.seen = set()
    self.stops = []  # (depth, module, function, {param: kind})
    self.reached = None  # the stop count when the target's call was read

  def resolve(self, module, func, cls):
    """(module, function key) of rlcode that a call's func expression names, or None."""
    if isinstance(func, ast.Name):
      if func.id in module.functions:
        return module.name, func.id
      if func.id in module.classes:
        return module.name, f"{func.id}.__init__"
      if func.id in module.names:
        mod, attr = module.names[func.id]
        return self._in(mod, attr)
    elif isinstance(func, ast.Attribute):
      owner = func.value
      if isinstance(owner, ast.Name) and owner.id == "self" and cls:
        return module.name, f"{cls}.{func.attr}"
      if isinstance(owner, ast.Name):
        if owner.id in module.classes:
          return module.name, f"{owner.id}.{func.attr}"
        if owner.id in module.names:
          mod, attr = module.names[owner.id]
          if attr is None:
            return self._in(mod, func.attr)
          if mod in self.modules and attr in self.modules[mod].classes:
            return mod, f"{attr}.{func.attr}"
          return self._in(f"{mod}.{attr}", func.attr)
      if (isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Name)
          and owner.value.id in module.names):  # module.Class.method
        mod, attr = module.names[owner.value.id]
        if attr is None and mod in self.modules and owner.attr in self.modules[mod].classes:
          return mod, f"{owner.attr}.{func.attr}"
    return None

  def _in(self, mod, attr):
    if mod not in self.modules or attr is None:
      return None
    target = self.modules[mod]
    if attr in target.functions:
      return mod, attr
    if attr in target.classes:
      return mod, f"{attr}.__init__"
    if attr in target.names:  # re-exported from a package's __init__
      inner, inner_attr = target.names[attr]
      return self._in(inner, inner_attr) if inner_attr else None
    return None

  def run(self):
    self.visit(START[0], START[1], dict(START[2]), 0)
    return self

  def visit(self, mod, key, tainted, depth, parent=None):
    if (mod, key) in self.seen or self.done():
      return
    node = self.modules[mod].functions.get(key)
    if node is None:
      return
    self.seen.add((mod, key))
    self.stops.append((depth, mod, key, dict(tainted), parent))
    cls = key.split(".")[0] if "." in key else None
    module = self.modules[mod]
    env = dict(tainted)
    if cls:  # a method reads the config values its class's __init__ kept
      env.update(self._kept(module, cls))
    _bind(node, env)
    for call in _calls(node):
      if self.done():
        return
      callee = self.resolve(module, call.func, cls)
      if callee == TARGET:
        if self.reached is None:
          self.stops.append((depth + 1, *TARGET, {}, mod))
          self.reached = len(self.stops)
      elif callee is not None:
        passed = self._passed(call, callee, env)
        if passed:
          self.visit(*callee, passed, depth + 1, mod)

  def done(self):
    return self.reached is not None and self.stop_at_target

  def climbs(self, stops):
    """Returns to a file left before, among the first `stops` stops: each next stop read
    from a caller in another file than the stop read last."""
    walked = self.stops[:stops]
    return sum(b[0] <= a[0] and b[4] != a[1] for a, b in zip(walked, walked[1:]))

  def _kept(self, module, cls):
    init = module.functions.get(f"{cls}.__init__")
    if init is None:
      return {}
    params = {a.arg for a in init.args.args}
    env = {p: "whole" for p in params if p == "config"}
    kept = {}
    for stmt in ast.walk(init):
      if isinstance(stmt, ast.Assign):
        kind = _kind(stmt.value, env)
        for target in stmt.targets:
          if kind and isinstance(target, ast.Attribute) and _dotted(target.value) == "self":
            kept[f"self.{target.attr}"] = kind
    return kept

  def _passed(self, call, callee, env):
    """{callee parameter: kind} for the config values a call passes."""
    mod, key = callee
    node = self.modules[mod].functions.get(key)
    if node is None:
      return {}
    params = [a.arg for a in node.args.posonlyargs + node.args.args]
    if params and params[0] in ("self", "cls"):
      params = params[1:]
    out = {}
    for i, arg in enumerate(call.args):
      kind = _kind(arg, env)
      if kind and i < len(params):
        out[params[i]] = kind
    for kw in call.keywords:
      kind = _kind(kw.value, env)
      if kind and kw.arg:
        out[kw.arg] = kind
    return out


def _dotted(node):
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  if isinstance(node, ast.Name):
    return ".".join([node.id, *reversed(parts)])
  return None


def _sections():
  """The schema's section fields: (the config's, any section's), from rlcode/config/schema.py
  (a field whose annotation names a class is a section)."""
  path = os.path.join(ROOT, "rlcode", "config", "schema.py")
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  top, inner = set(), set()
  for node in tree.body:
    if isinstance(node, ast.ClassDef):
      for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
          names = {n.id for n in ast.walk(item.annotation) if isinstance(n, ast.Name)}
          if any(n[0].isupper() and n != "None" for n in names):
            (top if node.name == "Config" else inner).add(item.target.id)
  return top, inner


SECTIONS, SUBSECTIONS = _sections()


def _kind(expr, env):
  """"whole" or "section" where `expr` is a config value under env, else None."""
  if isinstance(expr, ast.IfExp):  # `config if config is not None else recorded`
    return _kind(expr.body, env) or _kind(expr.orelse, env)
  if isinstance(expr, ast.BoolOp):  # `config or recorded`
    return next(filter(None, (_kind(v, env) for v in expr.values)), None)
  dotted = _dotted(expr)
  if dotted is None:
    return None
  if dotted in env:
    return env[dotted]
  head, _, attr = dotted.rpartition(".")
  if head in env and attr in (SECTIONS if env[head] == "whole" else SUBSECTIONS):
    return "section"
  return None


def _made(expr):
  """"whole" where `expr` calls a function that makes a config (`loader.load_config(...)`,
  a run's recorded config)."""
  if isinstance(expr, ast.IfExp):
    return _made(expr.body) or _made(expr.orelse)
  if isinstance(expr, ast.BoolOp):
    return next(filter(None, (_made(v) for v in expr.values)), None)
  if isinstance(expr, ast.Call):
    name = _dotted(expr.func) or ""
    if name.rpartition(".")[2] in MAKERS:
      return "whole"
  return None


def _calls(func):
  """The calls in a function's body, in source order."""
  calls = [n for n in ast.walk(func) if isinstance(n, ast.Call)]
  return sorted(calls, key=lambda n: (n.lineno, n.col_offset))


def _bind(func, env):
  """Adds to env the names a function binds from config values (`rl = config.rl`), or
  from a call that makes a config (MAKERS), in source order."""
  assigns = [n for n in ast.walk(func) if isinstance(n, (ast.Assign, ast.AnnAssign))]
  for stmt in sorted(assigns, key=lambda n: n.lineno):
    kind = stmt.value is not None and (_kind(stmt.value, env) or _made(stmt.value))
    for target in stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]:
      if kind and isinstance(target, ast.Name):
        env.setdefault(target.id, kind)


def walk_to_update(modules) -> dict:
  """{"stops", "files", "climbs", "trace"} of the walk from `rlcode train` to TARGET (None
  when it never gets there)."""
  walk = Walk(modules).run()
  if walk.reached is None:
    return None
  walked = walk.stops[:walk.reached]
  return {"stops": walk.reached, "files": len({stop[1] for stop in walked}),
          "climbs": walk.climbs(walk.reached),
          "trace": [f"{'  ' * depth}{mod}.{key}("
                    + ", ".join(f"{p}={k}" for p, k in tainted.items()) + ")"
                    for depth, mod, key, tainted, _ in walked]}


def whole_config_functions(modules) -> list[str]:
  """The functions outside the commands and loops that receive the whole config, on the
  walk from every command and every function that makes a config."""
  full = Walk(modules, stop_at_target=False)
  for name, module in modules.items():  # the commands, then whatever makes a config
    for key, node in module.functions.items():
      if name == "rlcode.cli" or any(_made(n) for n in ast.walk(node)):
        full.visit(name, key, {}, 0)
  return sorted({f"{mod}.{key}" for _, mod, key, tainted, _ in full.stops
                 if "whole" in tainted.values() and not mod.startswith(LOOPS)
                 and f"{mod}.{key}" not in COMMANDS})


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--trace", action="store_true", help="print every stop")
  parser.add_argument("--whole", action="store_true",
                      help="list the functions below the loops that take the whole config")
  args = parser.parse_args(argv)
  modules = load_modules()
  found = walk_to_update(modules)
  if found is None:
    print(f"the walk from {START[0]}.{START[1]} never reaches {'.'.join(TARGET)}")
    return 1
  if args.trace:
    print("\n".join(found["trace"]))
  print(f"to {'.'.join(TARGET)}: {found['stops']} stops in {found['files']} files, "
        f"{found['climbs']} climbs back up")
  if args.whole:
    below = whole_config_functions(modules)
    print(f"{len(below)} functions below the commands and loops take the whole config:")
    for name in below:
      print(f"  {name}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
