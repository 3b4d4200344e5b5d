"""The translation service under load, and its page in a browser.

    python -m benchmarks.serve load --export EXPORT --data DATA --out OUT/serve_load.json
    python -m benchmarks.serve page --export EXPORT --out docs/serve_page.png --text "A dog runs on the beach."

``load``: the service (``python -m fairseq_insertion.serve``, one process on loopback) with and without batching
across requests (``--max-batch-size 32`` / ``1``), C concurrent clients (1, 8, 32, 128) each sending R requests of
one line of test_2016_flickr, one after another; throughput (lines a second) and latency percentiles of each,
every answer checked against ``translate_batch`` of its line; and, as the floor, ``translate_batch`` of one line
called directly in this process. Bounded: C x R requests a setting, every request with a timeout.

``page``: the page (``GET /``) in headless Chromium (``apt install chromium``), driven over the DevTools protocol:
the sentence typed, Translate clicked, the passes waited for; a screenshot.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import gzip
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parent.parent
CLIENTS = (1, 8, 32, 128)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server(export: Path, *flags: str, threads: int = 1, wait_s: float = 120) -> Iterator[str]:
    """``python -m fairseq_insertion.serve export`` on a free loopback port, its URL while the block runs; then
    stopped by SIGTERM (the requests in flight answered) and waited for."""
    port = free_port()
    cmd = [sys.executable, "-m", "fairseq_insertion.serve", str(export), "--port", str(port), "--threads",
           str(threads), *flags]
    log = tempfile.TemporaryFile("w+")  # its log (one line a request): a pipe nobody reads would fill and stop it
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + wait_s
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"the service exited ({proc.returncode}): {log.read()[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the service did not start in {wait_s} s")
            time.sleep(0.1)
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()


async def post(session: Any, url: str, body: Any, timeout: float = 120) -> Any:
    """POST ``body`` (an object, sent as JSON; bytes as they are) to ``url``/translate: (status, the JSON answer)."""
    import aiohttp

    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with session.post(f"{url}/translate", data=data, headers={"Content-Type": "application/json"},
                            timeout=aiohttp.ClientTimeout(total=timeout)) as r:
        return r.status, await r.json()


async def clients(url: str, lines: Sequence[str], n: int, each: int) -> Dict[str, Any]:
    """``n`` concurrent clients, each sending ``each`` requests of one line (line i of client c: ``lines[(c * each +
    i) % len(lines)]``) one after another: every answer as (line index, text), each request's latency, the wall
    time."""
    import aiohttp

    answers: List[Tuple[int, str]] = []
    latencies: List[float] = []

    async def client(c: int, session: Any) -> None:
        for i in range(each):
            k = (c * each + i) % len(lines)
            start = time.perf_counter()
            status, answer = await post(session, url, {"text": [lines[k]]})
            latencies.append(time.perf_counter() - start)
            if status != 200:
                raise RuntimeError(f"line {k}: {status} {answer}")
            answers.append((k, answer["translations"][0]["text"]))

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.perf_counter()
        await asyncio.gather(*(client(c, session) for c in range(n)))
        wall = time.perf_counter() - start
    return {"answers": answers, "latencies": latencies, "wall_s": wall}


def percentiles(latencies: Sequence[float]) -> Dict[str, float]:
    import numpy as np

    ms = np.asarray(latencies) * 1000
    return {f"p{q}_ms": round(float(np.percentile(ms, q)), 2) for q in (50, 90, 99)}


def load(args: argparse.Namespace) -> Dict[str, Any]:
    from fairseq_insertion.runtime import Translator

    path = Path(args.data) / "test_2016_flickr.en"
    text = path.read_text(encoding="utf-8") if path.exists() else gzip.decompress(
        path.with_suffix(".en.gz").read_bytes()).decode("utf-8")
    lines = text.splitlines()
    logging.getLogger("asyncio").setLevel(logging.WARNING)
    translator = Translator(args.export, intra_threads=args.threads)
    expected = translator.translate_text(lines, 128)  # every line's translation, as the runtime gives it
    direct = []
    for line in lines[:args.direct]:  # the floor: one line a call, in this process
        start = time.perf_counter()
        translator.translate_text([line])
        direct.append(time.perf_counter() - start)
    out: Dict[str, Any] = {"direct_one_line": {"calls": len(direct), **percentiles(direct)}, "settings": []}
    for batched in (True, False)[:2 - args.batched_only]:
        flags = ("--max-batch-size", str(args.max_batch_size) if batched else "1", "--max-wait-ms",
                 str(args.max_wait_ms), "--workers", str(args.workers))
        with server(Path(args.export), *flags, threads=args.threads) as url:
            asyncio.run(clients(url, lines, 8, 4))  # warm-up, not measured
            for n in args.clients:
                each = max(1, args.requests // n)
                calls = asyncio.run(_health(url))["translate_batch_calls"]
                got = asyncio.run(clients(url, lines, n, each))
                wrong = [k for k, text in got["answers"] if text != expected[k]]
                row = {"batching": batched, "clients": n, "requests": n * each,
                       "lines_per_s": round(n * each / got["wall_s"], 2), **percentiles(got["latencies"]),
                       "answers_unlike_translate_batch": len(wrong),
                       "translate_batch_calls": asyncio.run(_health(url))["translate_batch_calls"] - calls}
                out["settings"].append(row)
                print(json.dumps(row), flush=True)
    return out


async def _health(url: str) -> Dict[str, Any]:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.get(f"{url}/health") as r:
        return await r.json()


# ------------------------------------------------------------------ the page in a browser
class Browser:
    """Headless Chromium driven over the DevTools protocol (aiohttp's websocket client): one page."""

    def __init__(self, chromium: str = "chromium") -> None:
        self.chromium, self.port, self.proc, self.ws, self.session, self.next_id = chromium, free_port(), None, \
            None, None, 0
        self.profile = tempfile.TemporaryDirectory(prefix="chromium-")

    async def __aenter__(self) -> "Browser":
        import aiohttp

        self.proc = subprocess.Popen([self.chromium, "--headless=new", "--no-sandbox", "--disable-gpu",
                                      f"--remote-debugging-port={self.port}", "--window-size=1000,800",
                                      f"--user-data-dir={self.profile.name}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.session = aiohttp.ClientSession()
        for _ in range(300):
            with contextlib.suppress(aiohttp.ClientError):
                async with self.session.get(f"http://127.0.0.1:{self.port}/json/list") as r:
                    pages = [p for p in await r.json() if p["type"] == "page"]
                    if pages:
                        break
            await asyncio.sleep(0.1)
        else:
            raise RuntimeError("Chromium did not start")
        self.ws = await self.session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self.ws is not None:
            await self.ws.close()
        await self.session.close()
        self.proc.terminate()
        self.proc.wait(30)
        self.profile.cleanup()

    async def call(self, method: str, **params: Any) -> Dict[str, Any]:
        self.next_id += 1
        await self.ws.send_json({"id": self.next_id, "method": method, "params": params})
        while True:
            message = await self.ws.receive_json(timeout=60)
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return result["result"].get("value")

    async def translate(self, url: str, text: str, forced: Sequence[str] = (), timeout: float = 60) -> Dict[str, Any]:
        """Open the page at ``url``, type ``text`` (and the ``forced`` phrases), click Translate and wait for the
        passes: the translation shown and each pass's pieces, those it inserted marked."""
        await self.call("Page.enable")
        await self.call("Page.navigate", url=url)
        for _ in range(int(timeout * 10)):
            if await self.evaluate("document.readyState === 'complete' && !!document.getElementById('go')"):
                break
            await asyncio.sleep(0.1)
        for field, value in (("source", text), ("forced", "\n".join(forced))):
            if value:
                await self.evaluate(f"document.getElementById({json.dumps(field)}).focus()")
                await self.call("Input.insertText", text=value)  # typed, as a keyboard would
        await self.evaluate("document.getElementById('go').click()")
        for _ in range(int(timeout * 10)):
            shown = await self.evaluate(
                "({text: document.getElementById('translation').textContent, error: document.getElementById("
                "'error').textContent, passes: [...document.querySelectorAll('#passes tr')].map(tr => [...tr."
                "querySelectorAll('span.piece')].map(s => [s.textContent, s.classList.contains('new')]))})")
            if shown["text"] or shown["error"]:
                return shown
            await asyncio.sleep(0.1)
        raise RuntimeError("the page showed no translation")

    async def screenshot(self, path: Path) -> None:
        shot = await self.call("Page.captureScreenshot", format="png")
        Path(path).write_bytes(base64.b64decode(shot["data"]))


def page(args: argparse.Namespace) -> Dict[str, Any]:
    async def run(url: str) -> Dict[str, Any]:
        async with Browser(args.chromium) as browser:
            shown = await browser.translate(url + "/", args.text, args.forced)
            await browser.screenshot(args.out)
            return shown

    with server(Path(args.export), threads=args.threads) as url:
        return asyncio.run(run(url))


def machine() -> str:
    """The recipe's machine description (:func:`examples.steps.run_info`), with the CPU's widest int8 instructions."""
    from examples.steps import run_info

    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return f"{run_info('cpu')['machine']}, {'AVX512-VNNI' if 'avx512_vnni' in info else 'AVX2'}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    lp = sub.add_parser("load", help="throughput and latency under concurrent clients")
    lp.add_argument("--export", required=True)
    lp.add_argument("--data", required=True, help="raw Multi30k (test_2016_flickr.en or .en.gz)")
    lp.add_argument("--out", required=True)
    lp.add_argument("--clients", type=int, nargs="+", default=list(CLIENTS))
    lp.add_argument("--requests", type=int, default=512, help="requests a setting, shared by its clients")
    lp.add_argument("--direct", type=int, default=512, help="direct one-line calls (the lines the one client sends)")
    lp.add_argument("--max-wait-ms", type=float, default=0.0)
    lp.add_argument("--threads", type=int, default=1, help="onnxruntime's threads a decode")
    lp.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)), help="the service's decodes at once")
    lp.add_argument("--max-batch-size", type=int, default=32)
    lp.add_argument("--batched-only", action="store_true", help="leave out the service without batching")
    pp = sub.add_parser("page", help="a screenshot of the page with a sentence translated")
    pp.add_argument("--export", required=True)
    pp.add_argument("--out", required=True)
    pp.add_argument("--text", required=True)
    pp.add_argument("--forced", nargs="*", default=[])
    pp.add_argument("--chromium", default="chromium")
    pp.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    if args.command == "load":
        result = {"machine": machine(), "threads": args.threads, "workers": args.workers,
                  "max_batch_size": args.max_batch_size, "max_wait_ms": args.max_wait_ms,
                  "command": "python -m benchmarks.serve load --export EXPORT --data DATA --out OUT", **load(args)}
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    else:
        print(json.dumps(page(args), ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
