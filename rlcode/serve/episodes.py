"""The server's side of harness episodes: the header a call names its episode by, the
call's record, and the episode routes.

    X-Episode-Id: ID                  on a chat completions or completions call: the call
                                      is appended to episode ID (n = 1 and one prompt, else
                                      a 400 naming the field)
    GET    /v1/episodes/{id}          the episode: its calls, segments (token ids, masks,
                                      log-probs, versions) and split counts; 404 if unknown
    DELETE /v1/episodes/{id}          drops it

A bad id, in the header or the path, is a 400 naming where it was. The routes sit behind
the server's API key like every /v1 route. A call is recorded with the interaction log,
before its response (or its stream's last event) is sent.
"""

from __future__ import annotations

from rlcode.harness.recorder import HEADER, Recorder, Sample, check_id
from rlcode.serve.protocol import APIError


def episode_of(headers, n: int, prompts: int = 1) -> str | None:
  """The episode a request's headers name (None when none), checked with the request's n
  and number of prompts."""
  values = headers.getlist(HEADER)
  if not values:
    return None
  if len(values) > 1:
    raise APIError(400, f"{HEADER}: the header is given {len(values)} times; an episode "
                   "call names one episode", param=HEADER, code="invalid_episode_id")
  try:
    episode = check_id(values[0])
  except ValueError as e:
    raise APIError(400, f"{HEADER}: {e}", param=HEADER, code="invalid_episode_id") from None
  if n != 1:
    raise APIError(400, f"n: an episode's call ({HEADER}) samples one candidate; got n={n}",
                   param="n", code="invalid_value")
  if prompts != 1:
    raise APIError(400, f"prompt: an episode's call ({HEADER}) has one prompt; got "
                   f"{prompts}", param="prompt", code="invalid_value")
  return episode


def record(recorder: Recorder, episode: str, call_id: str, requests, results) -> None:
  """The call's one prompt and its candidates, as the engine saw and sampled them."""
  (request,), (result,) = requests, results
  recorder.record(episode, call_id, list(request.prompt), [
      Sample(tuple(c.tokens), tuple(c.logprobs), tuple(c.versions), c.finish_reason)
      for c in result.candidates])


def _path_id(episode_id: str) -> str:
  try:
    return check_id(episode_id)
  except ValueError as e:
    raise APIError(400, f"episode id: {e}", param="id", code="invalid_episode_id") from None


def _unknown(episode_id: str) -> APIError:
  return APIError(404, f"no episode {episode_id!r} is held", param="id",
                  code="episode_not_found")


def add_routes(app, recorder: Recorder, count) -> None:
  """GET and DELETE /v1/episodes/{id} on `app`; `count(key)` counts each request."""

  @app.get("/v1/episodes/{episode_id}")
  async def get_episode(episode_id: str):
    count("requests_episodes")
    out = recorder.to_json(_path_id(episode_id))
    if out is None:
      raise _unknown(episode_id)
    return out

  @app.delete("/v1/episodes/{episode_id}")
  async def drop_episode(episode_id: str):
    count("requests_episodes")
    if not recorder.drop(_path_id(episode_id)):
      raise _unknown(episode_id)
    return {"id": episode_id, "object": "episode.deleted", "deleted": True}
