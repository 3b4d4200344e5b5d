"""``python -m fairseq_insertion.serve EXPORT_DIR``: the translation service (:mod:`fairseq_insertion.serve`)."""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from ..errors import InsertionError
from ..export_format import SETTINGS
from . import PAGE, Batcher, RequestError, answer, check_request

logger = logging.getLogger("fairseq_insertion.serve")


def make_app(translator: Any, model_dir: Path, max_batch_size: int = 32, max_wait_ms: float = 0.0,
             max_lines: int = 64, workers: int = 1) -> Any:
    """The aiohttp application over ``translator`` (the runtime's, of the export ``model_dir``)."""
    from aiohttp import web

    batcher = Batcher(translator, max_batch_size, max_wait_ms, workers)
    digest = hashlib.sha256((Path(model_dir) / SETTINGS).read_bytes()).hexdigest()  # of the export's settings.json
    page = PAGE.read_text(encoding="utf-8")

    def refuse(message: str, status: int = 400) -> Any:
        return web.json_response({"error": message}, status=status)

    async def translate(request: Any) -> Any:
        try:
            body = json.loads(await request.text())
        except (json.JSONDecodeError, UnicodeDecodeError, LookupError) as e:
            return refuse(f"the body is not JSON ({e})")
        except RecursionError:
            return refuse("the body is not JSON (nested too deeply)")
        try:
            job = check_request(body, translator, max_lines)
        except RequestError as e:
            return refuse(str(e))
        try:
            results = await batcher.submit(job)
            return web.json_response({"translations": answer(job, results, translator.preprocessing)})
        except InsertionError as e:
            return refuse(str(e).splitlines()[0])
        except Exception as e:  # noqa: BLE001  answered, logged; the other requests go on
            logger.exception("a request failed")
            return refuse(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", 500)

    async def health(_: Any) -> Any:
        return web.json_response({"status": "ok", "model": str(model_dir), "settings_sha256": digest,
                                  "max_batch_size": max_batch_size, "max_wait_ms": max_wait_ms,
                                  "max_lines": max_lines, "workers": workers, "requests": batcher.requests,
                                  "translate_batch_calls": batcher.calls, "batches_retried": batcher.retried})

    async def index(_: Any) -> Any:
        return web.Response(text=page, content_type="text/html")

    async def started(_: Any) -> None:
        batcher.start()

    async def stopped(_: Any) -> None:
        await batcher.stop()

    app = web.Application()
    app.add_routes([web.post("/translate", translate), web.get("/health", health), web.get("/", index)])
    app.on_startup.append(started)
    app.on_cleanup.append(stopped)  # after the requests in flight are answered
    return app


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fairseq_insertion.serve", description=__doc__)
    p.add_argument("model_dir", help="an export's directory (python -m fairseq_insertion.export)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--max-batch-size", type=int, default=32, help="at most this many lines in one decode")
    p.add_argument("--max-wait-ms", type=float, default=0.0,
                   help="how long a request waits for others to share its decode (0: a decode takes the requests "
                   "queued when it starts; --max-batch-size 1: no batching across requests)")
    p.add_argument("--max-lines", type=int, default=64, help="at most this many lines in one request")
    p.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)),
                   help="decodes run at once, each on its own thread (default: one a core)")
    p.add_argument("--threads", type=int, default=1, help="onnxruntime's threads a decode (0: every core)")
    args = p.parse_args(argv)
    for name in ("max_batch_size", "max_lines", "workers"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.max_wait_ms < 0 or args.threads < 0:
        p.error("--max-wait-ms and --threads must be at least 0")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(levelname)s | %(name)s | %(message)s")
    try:
        from aiohttp import web
    except ImportError:
        print("serve: needs aiohttp (pip install -e \".[serve]\")", file=sys.stderr)
        return 2
    from ..preprocess import load
    from ..runtime import Translator

    try:
        translator = Translator(args.model_dir, intra_threads=args.threads)
        if translator.preprocessing is not None:  # its codes or model read now, not at the first request
            load(translator.preprocessing)
    except (InsertionError, OSError, ValueError) as e:
        print(f"serve: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    app = make_app(translator, Path(args.model_dir), args.max_batch_size, args.max_wait_ms, args.max_lines,
                   args.workers)
    web.run_app(app, host=args.host, port=args.port, shutdown_timeout=60, print=lambda m: logger.info(m.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
