"""The examples run as a user would run them, against the live server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(name: str, server: dict) -> str:
    env = {**os.environ, "SPACE_URL": server["url"], "SPACE_API_KEY": server["key"]}
    done = subprocess.run([sys.executable, str(EXAMPLES / name)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{name} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_agent_loop_example(server):
    out = run_example("agent_loop.py", server)
    assert "step failed (exit 1); restoring" in out
    assert "best: 95 of 3" in out, out


def test_the_async_fanout_example(server):
    out = run_example("async_fanout.py", server)
    assert "sort -n          -> 1" in out and "sort -rn         -> 9" in out, out
