"""Starts real `hypura serve` processes for the client tests.

HYPURA_BIN names the binary (default: target/release/hypura of this checkout),
HYPURA_TEST_MODEL the GGUF (default: models/SmolLM2-135M-Instruct.Q4_1.gguf).
"""
import os
import pathlib
import queue
import subprocess
import threading

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
PROFILE = str(ROOT / "config" / "profiles" / "h200.json")
BIN = os.environ.get("HYPURA_BIN") or str(ROOT / "target" / "release" / "hypura")
MODEL_PATH = os.environ.get("HYPURA_TEST_MODEL") or str(
    ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
)
MODEL = "SmolLM2-135M-Instruct.Q4_1:latest"
GERMANY = "The capital of Germany is Berlin."


class Server:
    """`hypura serve MODEL --port 0 ARGS...`; `base` is its http://host:port."""

    def __init__(self, *args):
        assert os.path.isfile(BIN), f"{BIN} is missing: cargo build --release -p hypura"
        assert os.path.isfile(MODEL_PATH), f"{MODEL_PATH} is missing: scripts/fetch-models.sh"
        self.proc = subprocess.Popen(
            # A saved profile: no background measurement of this machine.
            [BIN, "serve", MODEL_PATH, "--port", "0", "--profile", PROFILE, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.log = []
        found = queue.Queue()

        def read():
            for line in self.proc.stderr:
                self.log.append(line)
                if "listening on " in line:
                    found.put(line.split("listening on ", 1)[1].strip())
            found.put(None)

        threading.Thread(target=read, daemon=True).start()
        try:
            self.base = found.get(timeout=120)
        except queue.Empty:
            self.base = None
        if self.base is None:
            self.stop()
            raise RuntimeError("hypura serve did not start:\n" + "".join(self.log))

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="session")
def server():
    """Eight slots, so eight requests run together."""
    s = Server("--parallel", "8", "--context", "1024")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def solo():
    """One slot and no queue: a second request is refused (503) while the first runs."""
    s = Server("--parallel", "1", "--queue-limit", "0", "--context", "4096")
    yield s
    s.stop()
