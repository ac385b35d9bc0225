"""Joining a token-authenticated Ray head (benchmarks/README.md, same title): time to an answer, with and without
the token, through dapo-ablate's ray_connect against Ray's own ``ray.init(address=...)``.

Starts ``ray start --head --block`` on 127.0.0.1 with token authentication (a token file, private
RAY_TMPDIR), then times, each in a fresh process:

- raw_no_token: ``ray.init(address=head)`` with no token settings (what dapo-ablate did before);
- ours_no_token / ours_wrong_token: ``ray_connect.join_cluster`` with none / a wrong one;
- ours_token: ``join_cluster`` with the head's token through RAY_AUTH_TOKEN_PATH.

Prints one line per case: seconds and the first line of the outcome.

    .venv/bin/python benchmarks/ray_token_join.py
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dapo_ablate.ablation.runtime.reaper import kill_session

BIN = Path(sys.executable).parent
RAW = "import ray, sys\ntry:\n    ray.init(address=sys.argv[1], include_dashboard=False, log_to_driver=False); print('joined')\nexcept Exception as e:\n    print(type(e).__name__, str(e).splitlines()[0])\n"
OURS = (
    "import sys\nfrom dapo_ablate.ablation.runtime.ray_connect import RayConnectError, join_cluster\n"
    "try:\n    join_cluster(sys.argv[1], sys.argv[2] or None); print('joined')\n"
    "except RayConnectError as e:\n    print('RayConnectError', e)\n"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]




def timed(code: str, args: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    return time.perf_counter() - start, (lines[-1] if lines else out.stderr.strip().splitlines()[-1])[:160]


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="rtj", dir="/tmp"))
    token = root / "head_token"
    token.write_text(secrets.token_hex(32))
    wrong = root / "wrong_token"
    wrong.write_text(secrets.token_hex(32))
    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}
    base["RAY_TMPDIR"] = str(root)
    head_env = {**base, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    head = subprocess.Popen([str(BIN / "ray"), "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1",
                             "--num-cpus=1", "--include-dashboard=false", "--disable-usage-stats"],
                            env=head_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        while not (root / "ray" / "ray_current_cluster").is_file():
            time.sleep(0.2)
        address = f"127.0.0.1:{port}"
        empty_home = root / "home"
        empty_home.mkdir()
        no_token = {**base, "HOME": str(empty_home)}
        cases = [
            ("raw_no_token", RAW, [address], no_token),
            ("ours_no_token", OURS, [address, ""], no_token),
            ("ours_wrong_token", OURS, [address, str(wrong)], base),
            ("ours_token", OURS, [address, ""], {**base, "RAY_AUTH_TOKEN_PATH": str(token)}),
        ]
        for name, code, args, env in cases:
            seconds, outcome = timed(code, args, env)
            print(f"{name} s={seconds:.1f} outcome={outcome}")
    finally:
        kill_session(head.pid)
        head.wait()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
