"""A verl run resumes only from checkpoints its own jobs wrote (ablation/runtime/backends/verl_seal.py):
the task that watches a run's job seals the run's ``checkpoints/`` as verl fills it, and before
each submission moves aside what the seal does not vouch for (a folder planted, copied from another
run or edited, a tracker naming a step that is not a sealed save, links), so that verl's
``resume_mode=auto`` finds only sealed state. Here on folders laid out as verl 0.9.1 writes them;
through `dapo-ablate run` and a Ray cluster in tests/e2e/test_verl_seal_e2e.py."""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

import pytest

from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.ablation.runtime.backends import verl_seal
from dapo_ablate.ablation.runtime.backends.verl_checkpoints import prune_checkpoints, resumed_entrypoint
from dapo_ablate.ablation.runtime.backends.verl_seal import SEAL_FILE, SET_ASIDE_PREFIX, TRACKER, CheckpointSeal
from dapo_ablate.ablation.runtime.jobs import SEAL_ENV, checkpoint_seal
from dapo_ablate.core.config import build_trainer_config

from support import ROOT

KEY = bytes(range(32))
EXAMPLE = ROOT / "examples" / "paper_verl.yaml"


def save(folder: Path, step: int, weights: bytes = b"w" * 4096, tracker: bool = True) -> Path:
    """One verl save: global_step_<n>/actor/... and data.pt, then the tracker (verl writes it last)."""
    actor = folder / f"global_step_{step}" / "actor"
    (actor / "huggingface").mkdir(parents=True, exist_ok=True)
    (actor / "model_world_size_1_rank_0.pt").write_bytes(weights)
    (actor / "optim_world_size_1_rank_0.pt").write_bytes(b"adam" * 1024)
    (actor / "huggingface" / "config.json").write_text('{"model_type": "qwen2"}')
    (folder / f"global_step_{step}" / "data.pt").write_bytes(b"dataloader state")
    if tracker:
        (folder / TRACKER).write_text(str(step))
    return folder / f"global_step_{step}"


def run_seal(run_dir: Path, run_id: str | None = None, key: bytes = KEY) -> CheckpointSeal:
    return CheckpointSeal(run_dir / "checkpoints", run_id or run_dir.name, "digest-of-the-config", key)


def set_aside(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob(f"{SET_ASIDE_PREFIX}*"))


def test_a_checkpoint_folder_planted_before_the_first_job_is_set_aside_and_verl_starts_from_step_0(tmp_path: Path):
    run = expand(load_spec(EXAMPLE)).runs[0]
    run_dir = tmp_path / "exp" / run.run_id
    save(run_dir / "checkpoints", 30)  # hand-made, or copied from another run: never sealed for this one
    note = run_seal(run_dir).secure()
    assert note is not None and "global_step_30: not sealed for this run" in note
    assert f"moved to {SET_ASIDE_PREFIX}" in note and "starts from step 0" in note
    assert sorted(os.listdir(run_dir / "checkpoints")) == []  # nothing left for resume_mode=auto
    [aside] = set_aside(run_dir)
    assert (aside / "global_step_30" / "actor" / "model_world_size_1_rank_0.pt").read_bytes() == b"w" * 4096  # kept, not deleted
    assert (aside / TRACKER).read_text() == "30"
    entrypoint = resumed_entrypoint("python3 -m verl.trainer.main_ppo", run.config, run_dir)
    assert "trainer.val_before_train=false" not in shlex.split(entrypoint)  # a fresh start validates step 0


def test_what_the_runs_own_job_wrote_is_kept_and_resumed(tmp_path: Path):
    run = expand(load_spec(EXAMPLE)).runs[0]
    run_dir = tmp_path / "exp" / run.run_id
    seal = run_seal(run_dir)
    seen = seal.observe()  # the job's first poll: nothing saved yet
    save(run_dir / "checkpoints", 10)
    seen = seal.observe(seen)
    save(run_dir / "checkpoints", 20)
    seal.observe(seen)
    assert seal.secure() is None
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["global_step_10", "global_step_20", TRACKER]
    assert not set_aside(run_dir)
    assert resumed_entrypoint("main_ppo", run.config, run_dir) == "main_ppo trainer.val_before_train=false"
    document = json.loads((run_dir / SEAL_FILE).read_text())
    assert document["run_id"] == run.run_id and sorted(document["steps"]) == ["10", "20"]
    assert document["tracker"]["step"] == 20


def test_a_sealed_file_edited_with_its_size_and_time_restored_sets_its_step_aside(tmp_path: Path):
    run_dir = tmp_path / "run"
    seal = run_seal(run_dir)
    save(run_dir / "checkpoints", 10)
    seal.refresh()
    weights = save(run_dir / "checkpoints", 20) / "actor" / "model_world_size_1_rank_0.pt"
    seal.refresh()
    before = weights.stat()
    weights.write_bytes(b"x" + b"w" * 4095)  # same size
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))  # same mtime
    note = seal.secure()
    assert note is not None
    assert "global_step_20: the content of actor/model_world_size_1_rank_0.pt changed since it was sealed" in note
    assert f"{TRACKER}: names step 20, not this run's last sealed save (step 10; rewritten)" in note
    assert "resumes from its sealed step 10" in note
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["global_step_10", TRACKER]
    assert (run_dir / "checkpoints" / TRACKER).read_text() == "10"
    assert (set_aside(run_dir)[0] / "global_step_20" / "actor" / "model_world_size_1_rank_0.pt").read_bytes()[:1] == b"x"
    assert seal.secure() is None  # the rewritten tracker and the seal agree now


def test_a_file_added_to_a_sealed_step_or_its_time_changed_sets_it_aside(tmp_path: Path):
    run_dir = tmp_path / "run"
    seal = run_seal(run_dir)
    save(run_dir / "checkpoints", 10)
    save(run_dir / "checkpoints", 20)
    seal.refresh()
    (run_dir / "checkpoints" / "global_step_10" / "actor" / "extra.pt").write_bytes(b"pickled code")
    os.utime(run_dir / "checkpoints" / "global_step_20" / "data.pt", ns=(1, 1))
    note = seal.secure()
    assert note is not None and note.count("its files changed since they were sealed") == 2
    assert "starts from step 0" in note and not (run_dir / "checkpoints" / TRACKER).exists()


def test_large_files_are_digested_from_keyed_samples_and_a_changed_sample_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(verl_seal, "FULL_DIGEST_BYTES", 1024)
    monkeypatch.setattr(verl_seal, "SAMPLE_BYTES", 64)
    run_dir = tmp_path / "run"
    seal = run_seal(run_dir)
    weights = save(run_dir / "checkpoints", 10, weights=bytes(range(256)) * 256) / "actor" / "model_world_size_1_rank_0.pt"
    seal.refresh()
    files = json.loads((run_dir / SEAL_FILE).read_text())["steps"]["10"]["files"]
    assert dict((name, digest.split(":")[0]) for name, _, _, digest in files) == {
        "actor/huggingface/config.json": "sha256", "actor/model_world_size_1_rank_0.pt": "sampled",
        "actor/optim_world_size_1_rank_0.pt": "sampled", "data.pt": "sha256"}
    assert seal.secure() is None
    offsets = verl_seal._sample_offsets(KEY, weights.stat().st_size)
    assert offsets[0] == 0 and offsets[1] == weights.stat().st_size - 64 and len(set(offsets)) > 2
    assert offsets != verl_seal._sample_offsets(b"another experiment's key", weights.stat().st_size)
    data, before = bytearray(weights.read_bytes()), weights.stat()
    data[offsets[5] + 3] ^= 0xFF  # one byte inside a sampled block
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    note = seal.secure()
    assert note is not None and "the content of actor/model_world_size_1_rank_0.pt changed" in note


def test_a_tracker_naming_another_runs_step_is_set_aside_with_that_step_and_rewritten(tmp_path: Path):
    ours, theirs = tmp_path / "exp" / "run-a", tmp_path / "exp" / "run-b"
    save(ours / "checkpoints", 2)
    run_seal(ours).refresh()
    save(theirs / "checkpoints", 6)
    run_seal(theirs).refresh()  # sealed, for run b under the same key
    shutil.copytree(theirs / "checkpoints" / "global_step_6", ours / "checkpoints" / "global_step_6")
    (ours / "checkpoints" / TRACKER).write_text("6")
    note = run_seal(ours).secure()
    assert note is not None and "global_step_6: not sealed for this run" in note
    assert f"{TRACKER}: names step 6, not this run's last sealed save (step 2; rewritten)" in note
    assert sorted(os.listdir(ours / "checkpoints")) == ["global_step_2", TRACKER]
    assert (ours / "checkpoints" / TRACKER).read_text() == "2"


def test_another_runs_whole_folder_and_seal_copied_in_are_not_this_runs(tmp_path: Path):
    ours, theirs = tmp_path / "exp" / "run-a", tmp_path / "exp" / "run-b"
    save(theirs / "checkpoints", 6)
    run_seal(theirs).refresh()
    shutil.copytree(theirs / "checkpoints", ours / "checkpoints")
    shutil.copy2(theirs / SEAL_FILE, ours / SEAL_FILE)  # its seal names run b: it seals nothing of run a
    note = run_seal(ours).secure()
    assert note is not None and "global_step_6: not sealed for this run" in note
    assert os.listdir(ours / "checkpoints") == []
    save(theirs / "checkpoints", 8)
    other_experiment = run_seal(theirs, key=b"another experiment's key 32 byte")
    assert "global_step_6: not sealed for this run" in (other_experiment.secure() or "")  # a seal under another key


def test_links_planted_as_the_checkpoint_folder_or_a_step_are_moved_never_followed(tmp_path: Path):
    elsewhere = tmp_path / "elsewhere"
    save(elsewhere, 5)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "checkpoints").symlink_to(elsewhere)
    note = run_seal(run_dir).secure()
    assert note is not None and "checkpoints: a link, not a folder" in note
    assert not os.path.lexists(run_dir / "checkpoints")
    assert (set_aside(run_dir)[0] / "checkpoints").is_symlink()
    assert sorted(os.listdir(elsewhere)) == ["global_step_5", TRACKER]  # what it pointed to is untouched

    run_dir = tmp_path / "run2"
    save(run_dir / "checkpoints", 2)
    seal = run_seal(run_dir)
    seal.refresh()
    (run_dir / "checkpoints" / "global_step_5").symlink_to(elsewhere / "global_step_5")
    (run_dir / "checkpoints" / TRACKER).write_text("5")
    note = seal.secure()
    assert note is not None and "global_step_5: a link, not a folder" in note
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["global_step_2", TRACKER]
    assert (elsewhere / "global_step_5" / "data.pt").read_bytes() == b"dataloader state"


def test_a_link_inside_a_step_folder_is_never_sealed_nor_resumed(tmp_path: Path):
    elsewhere = tmp_path / "elsewhere.pt"
    elsewhere.write_bytes(b"not ours")
    run_dir = tmp_path / "run"
    step = save(run_dir / "checkpoints", 4)
    (step / "actor" / "model_world_size_1_rank_0.pt").unlink()
    (step / "actor" / "model_world_size_1_rank_0.pt").symlink_to(elsewhere)
    seal = run_seal(run_dir)
    seal.refresh()
    assert not (run_dir / SEAL_FILE).exists()  # nothing sealed
    note = seal.secure()
    assert note is not None and "global_step_4: not sealed for this run" in note
    assert elsewhere.read_bytes() == b"not ours"


def test_a_link_planted_as_the_seal_file_is_replaced_not_written_through(tmp_path: Path):
    target = tmp_path / "outside.json"
    target.write_text("a file outside the run folder")
    run_dir = tmp_path / "run"
    save(run_dir / "checkpoints", 2)
    (run_dir / SEAL_FILE).symlink_to(target)
    seal = run_seal(run_dir)
    seal.refresh()
    assert target.read_text() == "a file outside the run folder"
    assert not (run_dir / SEAL_FILE).is_symlink() and seal.secure() is None


def test_pruning_drops_the_pruned_steps_from_the_seal(tmp_path: Path):
    run_dir = tmp_path / "run"
    for step in (2, 4, 6):
        save(run_dir / "checkpoints", step)
    seal = run_seal(run_dir)
    seal.refresh()
    kept_copy = tmp_path / "copy-of-step-2"
    shutil.copytree(run_dir / "checkpoints" / "global_step_2", kept_copy, copy_function=shutil.copy2)
    prune_checkpoints(run_dir / "checkpoints", "final")
    document = json.loads((run_dir / SEAL_FILE).read_text())
    assert sorted(document["steps"]) == ["6"] and document["tracker"]["step"] == 6
    assert seal.secure() is None
    shutil.copytree(kept_copy, run_dir / "checkpoints" / "global_step_2", copy_function=shutil.copy2)  # brought back
    assert "global_step_2: not sealed for this run" in (seal.secure() or "")
    prune_checkpoints(run_dir / "checkpoints", "none")
    assert json.loads((run_dir / SEAL_FILE).read_text())["steps"] == {}


def test_a_checkpoint_folder_a_user_override_names_is_not_sealed_nor_touched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(SEAL_ENV, KEY.hex())
    config = expand(load_spec(EXAMPLE)).runs[0].config.to_dict()
    run_dir = tmp_path / "exp" / "run"
    seal = checkpoint_seal(config, str(run_dir))
    assert seal is not None and seal.folder == run_dir / "checkpoints" and seal.key == KEY  # the task's worker key
    assert seal.config_digest == build_trainer_config(config).digest() and seal.run_id == "run"
    config["verl"]["overrides"] = [f"trainer.default_local_dir={tmp_path / 'shared'}"]
    assert checkpoint_seal(config, str(run_dir)) is None


class JobApi:
    """Ray's Job API as `jobs.job_cell` uses it, with a verl job that saves its checkpoints while it
    runs (the first poll) and is then lost (SIGTERM, exit 143): what the task does around it is the
    product's."""

    entrypoints: list[str] = []
    jobs: dict[str, list[str]] = {}

    def __init__(self, address: str) -> None:
        self.address = address

    def get_job_info(self, sid):
        from types import SimpleNamespace

        if sid not in self.jobs:
            raise RuntimeError(f"Job {sid} does not exist")
        return SimpleNamespace(status=self.jobs[sid][0], error_type=None, driver_exit_code=143)

    def submit_job(self, entrypoint, submission_id, metadata, **_):
        self.entrypoints.append(entrypoint)
        self.jobs[submission_id] = ["RUNNING", "FAILED"]
        self.folder = Path(metadata["dapo_ablate_run_dir"]) / "checkpoints"

    def get_job_status(self, sid):
        status = self.jobs[sid][0]
        if status == "RUNNING":  # verl saves step 4 while the task polls
            save(self.folder, 4, weights=b"trained by attempt 1")
            self.jobs[sid].pop(0)
        return status

    def get_job_logs(self, sid):
        return "Terminated"


def test_the_task_sets_aside_a_planted_checkpoint_and_resubmits_from_what_its_own_job_wrote(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import ray.job_submission

    from dapo_ablate.ablation.runtime.backends.job_failures import JobLost
    from dapo_ablate.ablation.runtime.backends.verl_job import JOB_ENV, verl_job
    from dapo_ablate.ablation.runtime.jobs import ADDRESS_ENV, MLFLOW_RUN_ENV, job_cell

    spec = load_spec(EXAMPLE)
    run = expand(spec).runs[0]
    for name, value in ((JOB_ENV, verl_job(spec, run, ship=False).to_json()), (MLFLOW_RUN_ENV, "child"),
                        (SEAL_ENV, KEY.hex()), (ADDRESS_ENV, "http://127.0.0.1:1")):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", JobApi)
    monkeypatch.setattr(JobApi, "entrypoints", [])
    monkeypatch.setattr(JobApi, "jobs", {})
    run_dir = tmp_path / "exp" / run.run_id
    save(run_dir / "checkpoints", 30, weights=b"another run's")
    events = []
    for _ in range(2):
        with pytest.raises(JobLost):
            job_cell(run.config.to_dict(), str(run_dir), None, on_event=lambda *event: events.append(event))
    first, second = JobApi.entrypoints
    assert "trainer.val_before_train=false" not in shlex.split(first)  # the planted step 30 was not resumed
    assert second.endswith(" trainer.val_before_train=false")  # attempt 1's own step 4 is
    notes = [data["message"] for kind, _, data in events if kind == "note"]
    assert len(notes) == 1 and "global_step_30: not sealed for this run" in notes[0]
    assert (set_aside(run_dir)[0] / "global_step_30" / "actor" / "model_world_size_1_rank_0.pt").read_bytes() == b"another run's"
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["global_step_4", TRACKER]


def test_validate_says_a_checkpoint_folder_a_user_override_names_is_neither_sealed_nor_pruned():
    from dataclasses import replace

    from dapo_ablate.ablation.runtime.backends.verl_plan import format_checkpoints

    spec = load_spec(EXAMPLE)
    runs = expand(spec).runs
    assert "neither sealed nor pruned" not in format_checkpoints(spec, runs)
    config = runs[0].config.to_dict()
    config["verl"]["overrides"] = ["trainer.default_local_dir=/shared/all-checkpoints"]
    line = format_checkpoints(spec, [replace(runs[0], config=build_trainer_config(config))])
    assert line.endswith("; trainer.default_local_dir is overridden: that folder is yours, neither sealed nor pruned, "
                         "and verl resumes from whatever it holds")


def test_what_cannot_be_moved_aside_stops_the_submission_with_one_sentence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def read_only(**_):  # the run folder refuses a new folder (read-only storage, a full disk)
        raise PermissionError(13, "Permission denied")

    run_dir = tmp_path / "run"
    save(run_dir / "checkpoints", 3)
    monkeypatch.setattr(verl_seal.tempfile, "mkdtemp", read_only)
    with pytest.raises(verl_seal.CheckpointsNotSetAside, match=r"\(global_step_3, latest_checkpointed_iteration.txt\), "
                       r"and it could not be moved aside \(Permission denied\); move it out of the run folder and run again$"):
        run_seal(run_dir).secure()
    assert (run_dir / "checkpoints" / "global_step_3").is_dir()
