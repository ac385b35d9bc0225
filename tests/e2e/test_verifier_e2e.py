"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_verifier.py
describes; its docstring says what they check."""

import pickle

import pytest

from dapo_ablate.core.verifier import (
    Verifier,
    verify,
)

from test_verifier import ADVERSARIAL, BOUND_S  # noqa: F401, F811 - shared with the fast part


def test_works_after_a_timeout():
    assert verify("Answer: 9^{9^{9^{9}}}", "1", method="math_verify", timeout_s=BOUND_S) is False
    assert verify("Answer: \\frac{1}{2}", "0.5", method="math_verify")


def test_verifier_batch_and_pickle():
    verifier = pickle.loads(pickle.dumps(Verifier(method="auto")))
    responses = ["Answer: 42", "Answer: 41", "Answer: \\frac{1}{2}", "Answer: \\frac{1}{3}", "junk",
                 "Answer: 9^{9^{9^{9}}}"]
    answers = ["42", "42", "0.5", "0.5", "1", "1"]
    assert verifier(responses, answers) == [True, False, True, False, False, False]


def test_verify_in_a_ray_worker():
    ray = pytest.importorskip("ray")
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        remote = ray.remote(lambda v, r, a: v(r, a))
        verdicts = ray.get(
            remote.remote(Verifier(), ["Answer: \\frac{1}{2}", "Answer: 9^{9^{9^{9}}}"], ["0.5", "1"])
        )
        assert verdicts == [True, False]
    finally:
        if started_here:
            ray.shutdown()


@pytest.mark.parametrize("method", ["auto", "math_verify"])
@pytest.mark.parametrize("response", ADVERSARIAL, ids=range(len(ADVERSARIAL)))
def test_adversarial_inputs_return_false_without_raising(response, method):
    assert verify(response, "1", method=method, timeout_s=BOUND_S) is False


def test_recovers_when_an_idle_worker_died():
    import dapo_ablate.core.verifier as verifier_module

    assert verify("Answer: \\frac{1}{2}", "0.5", method="math_verify")
    for worker in list(verifier_module._get_pool()._idle):
        worker._proc.kill()
        worker._proc.wait()
    assert verify("Answer: \\frac{1}{2}", "0.5", method="math_verify")
