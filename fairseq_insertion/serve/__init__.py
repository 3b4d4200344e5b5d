"""A translation service over the runtime: ``python -m fairseq_insertion.serve EXPORT_DIR`` (``pip install -e
".[serve]"``: aiohttp, which is both the server and the client the tests and the load benchmark use); docs/deploy.md
describes its requests (``POST /translate``, ``GET /health``, ``GET /``) and options.

Concurrent requests are decoded together: a :class:`Batcher` gathers them into one ``translate_batch`` call of at
most ``max_batch_size`` lines, waiting at most ``max_wait_ms`` after the first. Every request is checked before it
waits (a bad one is answered 400 naming its field, and takes no part in a batch); a batch that fails all the same
is decoded again request by request, so that only the request at fault fails. A stop signal (SIGINT, SIGTERM)
stops taking connections, answers the requests in flight, then exits.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import export_format as F
from ..errors import InsertionError
from ..preprocess import PreprocessError, detokenize, prepare_constraint, prepare_line
from ..visualize import align

FIELDS = ("text", "tokens", "constraints", "num_hypotheses", "passes")
MAX_CHARS = 10_000  # a raw line's characters, checked before it is prepared
PAGE = Path(__file__).with_name("page.html")
logger = logging.getLogger(__name__)


class RequestError(InsertionError):
    """A request the service refuses (400): the message names the field."""


@dataclass(eq=False)
class Job:
    """One checked request: its lines as pieces, their constraints as pieces (None: none), what to answer."""

    source: List[List[str]]
    constraints: Optional[List[List[List[str]]]]
    num_hypotheses: int
    passes: bool
    text: bool  # answer detokenised text (the request gave text)
    starts: List[List[str]] = field(default_factory=list)  # each line's start canvas (its constraints' pieces)
    arrived: float = field(default_factory=time.monotonic)
    done: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    @property
    def key(self) -> Tuple[int, bool, bool]:
        """Requests that can share a ``translate_batch`` call have the same key."""
        return self.num_hypotheses, self.passes, self.constraints is not None


class Batcher:
    """Gathers checked requests (:class:`Job`) into ``translate_batch`` calls of ``translator`` on ``workers``
    threads: a call takes the queued requests of the first one's kind, up to ``max_batch_size`` lines, once
    ``max_wait_ms`` have passed since the first arrived or the lines fill it."""

    def __init__(self, translator: Any, max_batch_size: int, max_wait_ms: float, workers: int = 1) -> None:
        self.translator, self.max_batch_size, self.max_wait = translator, max_batch_size, max_wait_ms / 1000
        self.pending: List[Job] = []
        self.arrival = asyncio.Event()
        self.executor = ThreadPoolExecutor(workers, thread_name_prefix="translate")
        self.slots = asyncio.Semaphore(workers)
        self.calls = self.requests = self.retried = 0  # translate_batch calls; requests; batches retried
        self.task: Optional[asyncio.Task] = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """After the requests in flight: no more calls."""
        if self.task is not None:
            self.task.cancel()
        self.executor.shutdown(wait=True)

    async def submit(self, job: Job) -> List[Any]:
        """``job``'s results (one ``TranslationResult`` a line), decoded with those of other requests."""
        self.pending.append(job)
        self.requests += 1
        self.arrival.set()
        return await asyncio.shield(job.done)  # a client that goes away leaves its lines to finish in the batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self.pending:
                self.arrival.clear()
                await self.arrival.wait()
            await self.slots.acquire()
            first = self.pending[0]
            while sum(len(job.source) for job in self.pending if job.key == first.key) < self.max_batch_size:
                left = first.arrived + self.max_wait - time.monotonic()
                if left <= 0:
                    break
                self.arrival.clear()
                try:
                    await asyncio.wait_for(self.arrival.wait(), left)
                except asyncio.TimeoutError:
                    break
            batch, lines = [], 0  # the first request and those of its kind behind it, up to max_batch_size lines
            for job in self.pending:
                if job.key == first.key and (not batch or lines + len(job.source) <= self.max_batch_size):
                    batch.append(job)
                    lines += len(job.source)
            self.pending = [job for job in self.pending if job not in batch]
            loop.run_in_executor(self.executor, self._translate, batch).add_done_callback(
                lambda _: self.slots.release())

    def _translate(self, batch: List[Job]) -> None:
        """On a worker thread: one call for the batch; where it fails, one a request."""
        try:
            results = self._call(batch)
        except Exception:  # noqa: BLE001  the request at fault is found below
            if len(batch) > 1:
                self.retried += 1
                logger.exception("a decode of %d requests failed; each is decoded alone", len(batch))
            for job in batch:
                try:
                    self._answer(job, self._call([job]))
                except Exception as e:  # noqa: BLE001  answered to its request alone
                    self._answer(job, e)
            return
        start = 0
        for job in batch:
            self._answer(job, results[start:start + len(job.source)])
            start += len(job.source)

    def _call(self, batch: List[Job]) -> List[Any]:
        self.calls += 1
        first = batch[0]
        source = [line for job in batch for line in job.source]
        constraints = None if first.constraints is None else [c for job in batch for c in job.constraints]
        return self.translator.translate_batch(source, self.max_batch_size, constraints=constraints,
                                               num_hypotheses=first.num_hypotheses, return_passes=first.passes)

    def _answer(self, job: Job, value: Any) -> None:
        def settle() -> None:
            if not job.done.done():
                (job.done.set_exception if isinstance(value, Exception) else job.done.set_result)(value)
        job.done.get_loop().call_soon_threadsafe(settle)


def check_request(body: Any, translator: Any, max_lines: int) -> Job:
    """A request's JSON ``body`` as a :class:`Job`, or a :class:`RequestError` naming the field at fault."""
    if not isinstance(body, dict):
        raise RequestError(f"the request must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise RequestError(f"{unknown[0]}: unknown field; the fields are {', '.join(FIELDS)}")
    if ("text" in body) == ("tokens" in body):
        raise RequestError("text or tokens: give one of them (raw lines, or lines of pieces)")
    name = "text" if "text" in body else "tokens"
    lines = body[name]
    if not isinstance(lines, list) or not lines:
        raise RequestError(f"{name}: expected a non-empty list of lines")
    if len(lines) > max_lines:
        raise RequestError(f"{name}: {len(lines)} lines, over the service's --max-lines {max_lines}")
    k = body.get("num_hypotheses", 1)
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise RequestError(f"num_hypotheses: expected an integer >= 1, got {json.dumps(k)}")
    passes = body.get("passes", False)
    if not isinstance(passes, bool):
        raise RequestError(f"passes: expected true or false, got {json.dumps(passes)}")
    settings = translator.preprocessing
    if name == "text" and settings is None:
        raise RequestError(f"text: the export ({F.SETTINGS}) records no preprocessing; send tokens")
    source = [_line(line, f"{name}[{i}]", settings if name == "text" else None) for i, line in enumerate(lines)]
    constraints = body.get("constraints")
    if constraints is not None:
        if not isinstance(constraints, list) or len(constraints) != len(lines):
            raise RequestError(f"constraints: expected a list of {len(lines)} lists of phrases, one a line")
        constraints = [[_phrase(p, f"constraints[{i}][{j}]", settings if name == "text" else None)
                        for j, p in enumerate(_list(phrases, f"constraints[{i}]"))]
                       for i, phrases in enumerate(constraints)]
    opts = translator.options()
    if k > opts.candidates:
        raise RequestError(f"num_hypotheses: {k}, but the export makes {opts.candidates} candidate(s) a sentence")
    try:
        ids = [translator.encode(line) for line in source]
        given = None if constraints is None else translator.encode_constraints(constraints, len(source))
        p, too_long = translator.prepare(ids, opts, given), translator.too_long(ids)
    except (InsertionError, ValueError, TypeError) as e:
        raise RequestError(str(e).splitlines()[0]) from None
    for i in range(len(source)):
        if too_long[i]:
            raise RequestError(f"{name}[{i}]: {len(ids[i])} source pieces, over the model's "
                               f"{translator.max_source_positions}")
        if p.unfit[i]:
            raise RequestError(f"constraints[{i}]: {p.held[i]} pieces, over the line's length limit {p.limit[i]}")
    symbols = translator.target_symbols
    starts = [[symbols[t] for c in cs for t in c.tolist() if t != translator.pad] for cs in given] if given else []
    return Job(source, constraints, k, passes, name == "text", starts)


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise RequestError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _line(value: Any, where: str, settings: Any) -> List[str]:
    """A line's pieces: raw text prepared with ``settings``, or a list of pieces (``settings`` None)."""
    try:
        if settings is not None:
            if not isinstance(value, str):
                raise RequestError(f"{where}: expected a string, got {type(value).__name__}")
            if len(value) > MAX_CHARS:
                raise RequestError(f"{where}: {len(value)} characters, over the service's {MAX_CHARS}")
            pieces = prepare_line(value, settings).split()
        else:
            pieces = _list(value, where)
            if not all(isinstance(p, str) and len(p.split()) == 1 and p.split()[0] == p for p in pieces):
                raise RequestError(f"{where}: expected pieces (non-empty strings without whitespace)")
    except PreprocessError as e:
        raise RequestError(f"{where}: {e}") from None
    if not pieces:
        raise RequestError(f"{where}: an empty line")
    return pieces


def _phrase(value: Any, where: str, settings: Any) -> List[str]:
    if settings is not None:
        if not isinstance(value, str):
            raise RequestError(f"{where}: expected a string, got {type(value).__name__}")
        value = prepare_constraint(value, settings).split()
    if not isinstance(value, list) or not value or not all(isinstance(p, str) and p for p in value):
        raise RequestError(f"{where}: expected a non-empty phrase")
    return value


def answer(job: Job, results: Sequence[Any], settings: Any) -> List[Dict[str, Any]]:
    """Each line's translation as the service answers it: the best hypothesis (``text`` or ``tokens``) and its
    score; the others with num_hypotheses > 1; its canvas after each pass with passes."""
    show = (lambda pieces: detokenize(pieces, settings)) if job.text else list
    out = []
    for i, r in enumerate(results):
        line: Dict[str, Any] = {("text" if job.text else "tokens"): show(r.hypotheses[0]), "score": r.scores[0]}
        if job.num_hypotheses > 1:
            line["hypotheses"] = [{"text" if job.text else "tokens": show(h), "score": s}
                                  for h, s in zip(r.hypotheses, r.scores)]
        if job.passes:  # the start canvas (the constraints' pieces), then each pass's: its pieces, those it inserted
            previous = list(job.starts[i] if job.starts else [])
            line["passes"] = [{"tokens": list(previous), "inserted": [False] * len(previous)}]
            for canvas in r.passes[0] if r.passes else []:
                kept = set(align(previous, canvas))
                line["passes"].append({"tokens": list(canvas), "inserted": [j not in kept for j in range(len(canvas))]})
                previous = canvas
        out.append(line)
    return out
