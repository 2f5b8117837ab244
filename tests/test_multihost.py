"""Multi-process verification: two local processes joined by `jax.distributed` (CPU
collectives over gloo), each holding half of a (2, 4) mesh."""

import pathlib
import socket
import subprocess
import sys


WORKER = pathlib.Path(__file__).with_name("multihost_worker.py")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def test_two_processes_match_one_device():
    port = str(_free_port())
    workers = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(rank), port],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [worker.communicate(timeout=300) for worker in workers]
    for worker, (out, err) in zip(workers, outputs):
        assert worker.returncode == 0, err[-3000:]
        assert "standard equal: True" in out
        assert "block equal: True" in out
        # Both processes raise the same clear error, none hangs.
        assert (
            "bad input: `target_probs` holds a NaN or infinite value in row 5 (the first such"
            in out
        ), out
