"""The reward of the verl CPU test jobs: did the response use one of the prompt's target characters?

verl loads this file by path (``reward.custom_reward_function.path``/``.name=compute_score``) and
the ``dapo`` reward manager calls :func:`compute_score` once per response with the decoded text.

Why this task: a random policy never solves a real problem, so a correctness reward is always -1,
every group is all-same and GRPO's advantages vanish. Here a random policy (near-uniform over ~50
characters, ~20 characters a response) hits a target set of k characters with probability roughly
0.3 (k=1) to 0.75 (k=4): most groups of 4 are mixed (non-zero advantages) and 10-30% are all-same
(Dynamic Sampling evicts them). The score depends only on the response text and the ground truth.
No imports: verl runs this file in its reward workers.
"""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """+1 (acc True) when ``solution_str`` contains any character of ``ground_truth``, else -1."""
    hit = any(char in solution_str for char in ground_truth)
    return {"score": 1.0 if hit else -1.0, "acc": hit}
