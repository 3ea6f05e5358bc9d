"""Metrics writers: JSON lines (the source of truth), TensorBoard and W&B mirrors, resume."""

import json
import os

import ml_collections
import pytest

from rlcode.errors import BadInput
from rlcode.runs.metrics import METRICS_FILE, WANDB_ID_FILE, MetricsWriter, read_metrics


def _logging(**values):
  base = dict(tensorboard=False, wandb=False, wandb_project="rlcode-test", wandb_entity=None,
              wandb_mode="offline")
  return ml_collections.ConfigDict({**base, **values})


def test_rows_resume_and_a_fresh_run_never_overwrites(tmp_path):
  writer = MetricsWriter(str(tmp_path), logging_cfg=_logging())
  for step in (1, 2, 3):
    writer.write(step, {"loss": 1.0 / step, "nan": float("nan")})
  writer.close()
  with pytest.raises(BadInput, match="exists but this run starts fresh"):
    MetricsWriter(str(tmp_path), logging_cfg=_logging())
  MetricsWriter(str(tmp_path), resume_step=2, logging_cfg=_logging()).close()
  assert [r["step"] for r in read_metrics(str(tmp_path))] == [1, 2]
  assert read_metrics(str(tmp_path))[0]["nan"] == "nan"  # JSON has none; kept visible


def test_a_torn_last_line_is_dropped_on_resume_and_named_otherwise(tmp_path):
  path = tmp_path / METRICS_FILE
  path.write_bytes(b'{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.25}\n{"step": 3, "lo')
  with pytest.raises(BadInput, match=f"{METRICS_FILE}:3: not JSON"):
    read_metrics(str(tmp_path))
  with pytest.warns(UserWarning, match="torn last line"):
    MetricsWriter(str(tmp_path), resume_step=3, logging_cfg=_logging()).close()
  assert [r["step"] for r in read_metrics(str(tmp_path))] == [1, 2]
  # A bad line that is not the last is an error, even on resume.
  path.write_bytes(b'{"step": 1}\nnot json\n{"step": 2}\n')
  with pytest.raises(BadInput, match=f"{METRICS_FILE}:2: not JSON"):
    MetricsWriter(str(tmp_path), resume_step=2, logging_cfg=_logging())


def test_tensorboard_mirrors_the_scalars(tmp_path):
  writer = MetricsWriter(str(tmp_path), logging_cfg=_logging(tensorboard=True))
  writer.write(1, {"loss": 0.5, "name": "not a scalar"})
  writer.close()
  events = os.listdir(tmp_path / "tensorboard")
  assert events and all(e.startswith("events.out.tfevents") for e in events)


@pytest.mark.slow
def test_wandb_offline_logs_every_row_and_a_resume_appends_to_the_same_run(tmp_path,
                                                                           monkeypatch):
  pytest.importorskip("wandb")
  monkeypatch.setenv("WANDB_SILENT", "true")
  monkeypatch.delenv("WANDB_API_KEY", raising=False)
  cfg = _logging(wandb=True)
  writer = MetricsWriter(str(tmp_path), logging_cfg=cfg, config={"rl": {"group_size": 8}})
  writer.write(1, {"reward_mean": 0.25, "loss": 0.5})
  writer.write(2, {"reward_mean": 0.5, "loss": 0.25})
  writer.close()
  run_id = (tmp_path / WANDB_ID_FILE).read_text().strip()
  MetricsWriter(str(tmp_path), resume_step=2, logging_cfg=cfg).close()
  assert (tmp_path / WANDB_ID_FILE).read_text().strip() == run_id
  runs = [d for d in os.listdir(tmp_path / "wandb") if d.startswith("offline-run-")]
  assert runs and all(run_id in d for d in runs)  # offline segments of one run id
  logged = b"".join(open(os.path.join(tmp_path, "wandb", d, f), "rb").read()
                    for d in runs for f in os.listdir(tmp_path / "wandb" / d)
                    if f.endswith(".wandb"))
  assert b"reward_mean" in logged and b"group_size" in logged
  assert json.loads((tmp_path / METRICS_FILE).read_text().splitlines()[0])["step"] == 1
