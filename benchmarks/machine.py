"""What the results were measured on: the machine and the library versions."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def machine_info(device: str) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    desc = f"{cpu}, {os.cpu_count()} cores"
    if device == "cuda":
        import torch

        desc = f"{torch.cuda.get_device_name(0)}; {desc}"
    return desc


def versions() -> dict:
    out = {"python": platform.python_version()}
    for mod in ("torch", "fairseq", "sacrebleu"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # pragma: no cover - reported, not fatal
            out[mod] = None
    return out


def run_info(device: str) -> dict:
    """What a results file records about where it ran: the machine, the versions and the threads."""
    return {"machine": machine_info(device), "versions": versions(),
            "threads": os.environ.get("OMP_NUM_THREADS", str(os.cpu_count()))}
