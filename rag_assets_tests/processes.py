"""Helpers for the real server processes the tests start (uvicorn, llama.cpp)."""

from __future__ import annotations

import subprocess


def stop_process(proc: subprocess.Popen, timeout: float = 20) -> None:
    """Terminate a server the tests started; kill it if it has not exited after ``timeout``."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
