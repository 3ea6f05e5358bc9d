"""`rlcode serve` and `rlcode learn-online` refuse bad invocations in one line, exit 2."""

import os

import pytest

from rlcode import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ONLINE = os.path.join(ROOT, "configs", "online_tiny.py") + ":test"
GRPO = os.path.join(ROOT, "configs", "grpo_tiny.py")


@pytest.mark.parametrize("argv,says", [
    (["serve"], "serve needs --config or --checkpoint"),
    (["serve", "--config", ONLINE, "--port", "70000"], "--port 70000"),
    (["serve", "--config", ONLINE, "--api-key-file", "/nonexistent/key"], "no such file"),
    (["serve", "--checkpoint", "/nonexistent/run"], "/nonexistent/run"),
    (["serve", "--config", ONLINE, "--config.serve.batching=fast"], "serve.batching"),
    (["serve", "--config", ONLINE, "--config.serve.slots=0"], "serve.slots"),
    (["learn-online", "--config", GRPO], "trainer is 'online'"),
    (["learn-online", "--config", ONLINE, "--config.online.reward=likes"], "online.reward"),
])
def test_bad_invocations(argv, says, capsys):
  with pytest.raises(SystemExit) as exit_info:
    code = cli.main(argv)
    raise SystemExit(code)
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip()
  assert says in err and "\n" not in err and "Traceback" not in err


def test_empty_api_key_file(tmp_path, capsys):
  key = tmp_path / "key"
  key.write_text("\n")
  assert cli.main(["serve", "--config", ONLINE, "--api-key-file", str(key)]) == 2
  assert "is empty" in capsys.readouterr().err
