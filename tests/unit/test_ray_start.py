"""`ray_connect._start_local_ray`: a local Ray start that times out on a busy machine (Ray waits a
fixed 30 s for its raylet, and the raylet a fixed time for its dashboard agent), or whose GCS port
another Ray took first, is tried again, after stopping what it had started and a pause that grows
with each try; any other failure is raised, and the last try's becomes one sentence. Ray's own start is replaced by a scripted one (the real one cannot
be made to time out on demand); what is tested is the product's retry around it."""

import pytest
import ray

from dapo_ablate.ablation.runtime import ray_connect
from dapo_ablate.ablation.store.errors import ExecutorError

TIMEOUT = Exception("The current node timed out during startup. This could happen because some of the raylet "
                    "failed to startup or the GCS has become overloaded.")

PORT_TAKEN = RuntimeError("Failed to start GCS.  Last 0 lines of error files:\n\n.Please check /tmp/ray/session_x/logs/"
                          "gcs_server.out for details. Last connection error: ray.exceptions.AuthenticationError: RPC "
                          "error: InvalidAuthToken: Authentication token is missing or incorrect.")
"""What Ray raised in CI when another test's token-authenticated Ray held the GCS port it had picked."""


def scripted(monkeypatch, outcomes: list) -> list:
    calls, stopped, pauses = [], [], []
    monkeypatch.setattr(ray_connect, "_stop_interrupted_ray", lambda before: stopped.append(before))
    monkeypatch.setattr(ray_connect.time, "sleep", pauses.append)  # only the retry loop sleeps here

    def init(**kwargs):
        calls.append(kwargs)
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    monkeypatch.setattr(ray, "init", init)
    return [calls, stopped, pauses]


def test_a_start_that_timed_out_is_tried_again_after_stopping_what_it_started(monkeypatch):
    calls, stopped, pauses = scripted(monkeypatch, [TIMEOUT, TIMEOUT, None])
    ray_connect._start_local_ray(num_cpus=2, include_dashboard=False)
    assert len(calls) == 3 and len(stopped) == 2
    assert pauses == list(ray_connect.LOCAL_START_PAUSES_S[:2])  # none after the start that worked
    assert list(ray_connect.LOCAL_START_PAUSES_S) == sorted(ray_connect.LOCAL_START_PAUSES_S)  # growing
    assert all(call["address"] == "local" and call["num_cpus"] == 2 for call in calls)


def test_the_last_timeout_is_one_sentence_and_any_other_failure_is_raised(monkeypatch):
    tries = len(ray_connect.LOCAL_START_PAUSES_S) + 1
    calls, stopped, pauses = scripted(monkeypatch, [TIMEOUT] * tries)
    with pytest.raises(ExecutorError) as refused:
        ray_connect._start_local_ray(num_cpus=2)
    assert str(refused.value).startswith(f"this machine's local Ray failed to start {tries} times (The current node "
                                         "timed out during startup.")  # fmt: skip
    assert "--address" in str(refused.value) and "\n" not in str(refused.value)
    assert len(calls) == tries == len(stopped) and pauses == list(ray_connect.LOCAL_START_PAUSES_S)
    calls, stopped, pauses = scripted(monkeypatch, [RuntimeError("port in use")])
    with pytest.raises(RuntimeError, match="port in use"):
        ray_connect._start_local_ray(num_cpus=2)
    assert len(calls) == 1 and len(stopped) == 1 and pauses == []


def test_a_gcs_port_another_ray_took_is_tried_again(monkeypatch):
    calls, stopped, _ = scripted(monkeypatch, [PORT_TAKEN, None])
    ray_connect._start_local_ray(num_cpus=2)
    assert len(calls) == 2 and len(stopped) == 1
