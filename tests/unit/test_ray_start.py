"""`ray_connect._start_local_ray`: a local Ray start that times out on a busy machine (Ray waits a
fixed 30 s for its raylet), or whose GCS port another Ray took first, is tried again, after stopping
what it had started; any other failure, or the last try's, is raised. Ray's own start is replaced by a scripted one (the real one cannot
be made to time out on demand); what is tested is the product's retry around it."""

import pytest
import ray

from dapo_ablate.ablation.runtime import ray_connect

TIMEOUT = Exception("The current node timed out during startup. This could happen because some of the raylet "
                    "failed to startup or the GCS has become overloaded.")

PORT_TAKEN = RuntimeError("Failed to start GCS.  Last 0 lines of error files:\n\n.Please check /tmp/ray/session_x/logs/"
                          "gcs_server.out for details. Last connection error: ray.exceptions.AuthenticationError: RPC "
                          "error: InvalidAuthToken: Authentication token is missing or incorrect.")
"""What Ray raised in CI when another test's token-authenticated Ray held the GCS port it had picked."""


def scripted(monkeypatch, outcomes: list) -> list:
    calls, stopped = [], []
    monkeypatch.setattr(ray_connect, "_stop_interrupted_ray", lambda before: stopped.append(before))

    def init(**kwargs):
        calls.append(kwargs)
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    monkeypatch.setattr(ray, "init", init)
    return [calls, stopped]


def test_a_start_that_timed_out_is_tried_again_after_stopping_what_it_started(monkeypatch):
    calls, stopped = scripted(monkeypatch, [TIMEOUT, TIMEOUT, None])
    ray_connect._start_local_ray(num_cpus=2, include_dashboard=False)
    assert len(calls) == 3 and len(stopped) == 2
    assert all(call["address"] == "local" and call["num_cpus"] == 2 for call in calls)


def test_the_last_timeout_and_any_other_failure_are_raised(monkeypatch):
    calls, stopped = scripted(monkeypatch, [TIMEOUT] * ray_connect.LOCAL_START_TRIES)
    with pytest.raises(Exception, match="timed out during startup"):
        ray_connect._start_local_ray(num_cpus=2)
    assert len(calls) == ray_connect.LOCAL_START_TRIES == len(stopped)
    calls, stopped = scripted(monkeypatch, [RuntimeError("port in use")])
    with pytest.raises(RuntimeError, match="port in use"):
        ray_connect._start_local_ray(num_cpus=2)
    assert len(calls) == 1 and len(stopped) == 1


def test_a_gcs_port_another_ray_took_is_tried_again(monkeypatch):
    calls, stopped = scripted(monkeypatch, [PORT_TAKEN, None])
    ray_connect._start_local_ray(num_cpus=2)
    assert len(calls) == 2 and len(stopped) == 1
