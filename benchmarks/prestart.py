"""fairseq commands run in processes started ahead of time, for the benchmark's timed decodes.

A timed decode is timed by fairseq itself (``Translated N sentences ... in X s``: generation only, without
start-up), but each ``fairseq-generate`` still spends seconds importing torch and fairseq before that. With
many short decodes run one after the other, that start-up is most of the wall time. :class:`Prestarted`
keeps one process waiting with torch and fairseq imported (and its CUDA context made, on a GPU): a command
given to it runs there (the same argv, its module run as ``__main__``, as the console script would), and the
next process starts while it runs. What fairseq times (model loading excluded) runs as in a fresh process,
and the command line recorded is the plain one.

    python -m benchmarks.prestart    # a waiting process: reads one JSON job line on standard input
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parent.parent


def fairseq_module(cmd: list[str]) -> tuple[str, list[str]] | None:
    """(module, arguments) of a fairseq console command (``fairseq-generate ...`` or ``python -m
    fairseq_cli.generate ...``), else None."""
    name = Path(cmd[0]).name
    if name.startswith("fairseq-"):
        return "fairseq_cli." + name[len("fairseq-"):], cmd[1:]
    if len(cmd) > 2 and cmd[1] == "-m" and cmd[2].startswith("fairseq_cli."):
        return cmd[2], cmd[3:]
    return None


class Prestarted:
    """A launcher for :func:`examples.commands.run`: fairseq commands run in a process that already
    imported torch and fairseq; anything else runs as a plain subprocess. ``close()`` ends the waiting one."""

    def __init__(self) -> None:
        self.waiting: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        return subprocess.Popen([sys.executable, "-m", "benchmarks.prestart"], stdin=subprocess.PIPE, text=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=os.getcwd())

    def __call__(self, cmd: list[str], stdin: IO, stdout: IO, stderr: IO) -> int:
        found = fairseq_module(cmd)
        if found is None:
            return subprocess.run(cmd, stdin=stdin, stdout=stdout, stderr=stderr, check=False).returncode
        worker = self.waiting if self.waiting is not None and self.waiting.poll() is None else self._start()
        self.waiting = None
        module, args = found
        job = {"module": module, "argv0": cmd[0], "args": args, "stdin": stdin.name, "stdout": stdout.name,
               "stderr": stderr.name, "cwd": os.getcwd()}
        stdout.flush()
        stderr.flush()
        assert worker.stdin is not None
        worker.stdin.write(json.dumps(job) + "\n")
        worker.stdin.close()
        self.waiting = self._start()  # imports while this command runs
        return worker.wait()

    def close(self) -> None:
        """End the waiting process (it holds no job)."""
        if self.waiting is not None:
            self.waiting.kill()
            self.waiting.wait()
        self.waiting = None

    def __enter__(self) -> Prestarted:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _redirect(fd: int, path: str, mode: int) -> None:
    target = os.open(path, mode)
    os.dup2(target, fd)
    os.close(target)


def serve() -> int:
    """Import what a fairseq command imports first, wait for one job line, run it as ``__main__``."""
    import fairseq  # noqa: F401  its tasks, models and criteria are registered on import
    import torch

    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")  # the context; cuBLAS and the kernels still load in the command's first batch
    line = sys.stdin.readline()
    if not line.strip():
        return 0
    job = json.loads(line)
    os.chdir(job["cwd"])
    _redirect(0, job["stdin"], os.O_RDONLY)
    # the run's files are opened by the parent (truncated, or the log when stdout shares it): append
    _redirect(1, job["stdout"], os.O_WRONLY | os.O_APPEND)
    _redirect(2, job["stderr"], os.O_WRONLY | os.O_APPEND)
    sys.argv = [job["argv0"], *job["args"]]
    try:
        runpy.run_module(job["module"], run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return 0


if __name__ == "__main__":
    sys.exit(serve())
