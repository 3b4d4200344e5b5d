"""The translation service (``python -m fairseq_insertion.serve``) on a tiny export, through a real HTTP client:
answers equal to ``translate_batch`` at 1 and 32 concurrent clients, batching across requests observed, every
bad input answered 400 naming its field while good requests beside it succeed, a client that goes away, a stop
with requests in flight, a damaged export refused; the runtime's per-pass canvases; the page in Chromium."""

import asyncio
import shutil
import signal
import subprocess
import sys

import pytest

from fairseq_insertion.config import DecodingConfig
from fairseq_insertion.preprocess import Preprocessing
from tests.utils import REPO, trained_reverse_model

pytest.importorskip("onnxruntime")
aiohttp = pytest.importorskip("aiohttp")

from benchmarks.serve import Browser, clients, post, server  # noqa: E402


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    from fairseq_insertion.export import export_model
    from fairseq_insertion.runtime import Translator

    root, model, task = trained_reverse_model(tmp_path_factory, "serve", 24)
    out = export_model(model, task.source_dictionary, task.target_dictionary, root / "export",
                       config=DecodingConfig(eos_penalty=0.5), preprocessing=Preprocessing(tokenizer="none"))
    lines = (root / "raw" / "test.src").read_text().splitlines()
    return out, Translator(out, intra_threads=1), lines


def expected(translator, lines):
    """Each line translated alone by translate_batch, detokenised as the service answers."""
    return [" ".join(r.hypotheses[0]) for r in (translator.translate_batch([line.split()])[0] for line in lines)]


async def _health(session, url):
    async with session.get(f"{url}/health") as r:
        return await r.json()


@pytest.mark.parametrize("n", [1, 32])
def test_answers_are_translate_batchs_and_requests_share_decodes(export, n):
    out, translator, lines = export
    want = expected(translator, lines)
    assert any(want)

    async def go(url):
        async with aiohttp.ClientSession() as session:
            before = await _health(session, url)
            got = await clients(url, lines, n, 3 if n > 1 else len(lines))
            after = await _health(session, url)
        assert after["batches_retried"] == 0
        return got, after["requests"] - before["requests"], after["translate_batch_calls"] - before[
            "translate_batch_calls"]

    with server(out, "--max-batch-size", "32", "--max-wait-ms", "20") as url:
        got, requests, calls = asyncio.run(go(url))
    assert len(got["answers"]) == len(got["latencies"]) >= len(lines)
    assert {k for k, _ in got["answers"]} == set(range(len(lines)))
    assert all(text == want[k] for k, text in got["answers"])  # every answer, not one a line
    assert requests == len(got["latencies"])
    assert calls == requests if n == 1 else calls < requests / 2  # one client: one call a request


BAD = [
    (b'{"text": ["w1 w2"', "the body is not JSON"),
    ([1, 2], "the request must be a JSON object"),
    ({"text": "w1 w2"}, "text: expected a non-empty list of lines"),
    ({"text": [3]}, "text[0]: expected a string"),
    ({"tokens": [["w1", "w 2"]]}, "tokens[0]: expected pieces"),
    ({"text": ["w1 w2"], "num_hypotheses": "2"}, "num_hypotheses: expected an integer"),
    ({"text": ["w1 w2"], "num_hypotheses": 3}, "num_hypotheses: 3, but the export makes 1"),
    ({"text": ["w1", "  "]}, "text[1]: an empty line"),
    ({"text": [" ".join(["w1"] * 2000)]}, "text[0]: 2001 source pieces, over the model's"),
    ({"text": ["w1"] * 65}, "text: 65 lines, over the service's --max-lines 64"),
    ({"text": ["w1 w2"], "beam": 5}, "beam: unknown field"),
    ({"text": ["w1 w2"], "tokens": [["w1"]]}, "text or tokens: give one of them"),
    ({"text": ["w1 w2"], "constraints": [[" ".join(["w3"] * 40)]]}, "constraints[0]: 40 pieces, over the line's "
                                                                      "length limit"),
    ({"text": ["w1 w2"], "constraints": [["w3"], ["w4"]]}, "constraints: expected a list of 1 lists"),
    ({"text": ["w1 w2"], "passes": "yes"}, "passes: expected true or false"),
]


def test_bad_requests_get_400_naming_the_field_and_good_ones_beside_them_succeed(export):
    out, translator, lines = export
    want = expected(translator, lines)

    async def go(url):
        async with aiohttp.ClientSession() as session:
            good = [post(session, url, {"text": [line]}) for line in lines]
            bad = [post(session, url, body) for body, _ in BAD]
            return await asyncio.gather(*good, *bad)

    with server(out, "--max-wait-ms", "50") as url:
        answers = asyncio.run(go(url))
    for (status, answer), text in zip(answers, want):
        assert status == 200 and answer["translations"][0]["text"] == text
    for (status, answer), (body, message) in zip(answers[len(lines):], BAD):
        assert status == 400, (body, answer)
        assert answer["error"].startswith(message), (body, answer["error"])
        assert "\n" not in answer["error"]


def test_tokens_constraints_hypotheses_and_passes(export):
    out, translator, lines = export
    source = lines[3].split()
    phrase = [lines[3].split()[-1]]  # the first word of the reversal
    direct = translator.translate_batch([source], constraints=[[phrase]], return_passes=True)[0]
    with server(out) as url:
        async def go():
            async with aiohttp.ClientSession() as session:
                return await post(session, url, {"tokens": [source], "constraints": [[phrase]], "passes": True})
        status, answer = asyncio.run(go())
    assert status == 200
    line = answer["translations"][0]
    assert line["tokens"] == direct.hypotheses[0] and phrase[0] in line["tokens"]
    passes = line["passes"]
    assert passes[0] == {"tokens": phrase, "inserted": [False]}  # the given canvas
    assert [p["tokens"] for p in passes[1:]] == direct.passes[0] and passes[-1]["tokens"] == line["tokens"]
    for before, after in zip(passes, passes[1:]):  # what a pass did not insert, the canvas before it held
        assert [t for t, new in zip(after["tokens"], after["inserted"]) if not new] == before["tokens"]
        assert any(after["inserted"])


def test_the_runtimes_passes_end_at_each_hypothesis(export):
    _, translator, lines = export
    plain = translator.translate_batch([line.split() for line in lines], 8)
    results = translator.translate_batch([line.split() for line in lines], 8, return_passes=True)
    assert [r.hypotheses for r in results] == [r.hypotheses for r in plain]
    assert max(len(r.passes[0]) for r in results) >= 2
    for r in results:
        canvases = r.passes[0]
        assert len(canvases) == r.iterations[0] and (canvases[-1] if canvases else []) == r.hypotheses[0]
        for before, after in zip(canvases, canvases[1:]):
            assert len(after) > len(before)
    assert plain[0].passes == []


def test_a_client_that_goes_away_and_a_stop_with_requests_in_flight_lose_nothing(export):
    out, translator, lines = export
    want = expected(translator, lines)
    port_flags = ("--max-wait-ms", "400", "--max-batch-size", "64")
    with server(out, *port_flags) as url:
        async def go():
            async with aiohttp.ClientSession() as session:
                with pytest.raises(asyncio.TimeoutError):  # gone before its answer
                    await post(session, url, {"text": lines[:2]}, timeout=0.1)
                return await post(session, url, {"text": lines})
        status, answer = asyncio.run(go())
        assert status == 200 and [t["text"] for t in answer["translations"]] == want
    # a stop while requests wait for their batch: every one answered, then the process ends
    from benchmarks.serve import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "fairseq_insertion.serve", str(out), "--port", str(port),
                             "--threads", "1", *port_flags], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    async def stopped():
        async with aiohttp.ClientSession() as session:
            for _ in range(600):
                try:
                    await _health(session, url)
                    break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.1)
            flight = [asyncio.ensure_future(post(session, url, {"text": [line]})) for line in lines]
            await asyncio.sleep(0.2)  # sent, waiting for the batch to fill
            proc.send_signal(signal.SIGTERM)
            return await asyncio.gather(*flight)

    try:
        answers = asyncio.run(stopped())
        assert proc.wait(60) == 0
    finally:
        proc.kill()
    assert [(s, a["translations"][0]["text"]) for s, a in answers] == [(200, text) for text in want]


def test_a_damaged_export_refuses_to_start_naming_the_file(export, tmp_path):
    out, _, _ = export
    damaged = tmp_path / "damaged"
    shutil.copytree(out, damaged)
    data = bytearray((damaged / "pass.onnx").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (damaged / "pass.onnx").write_bytes(bytes(data))
    proc = subprocess.run([sys.executable, "-m", "fairseq_insertion.serve", str(damaged), "--port", "1"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    last = proc.stderr.splitlines()[-1]
    assert last.startswith("serve: ") and "pass.onnx" in last and "sha256" in last


def test_the_service_runs_without_torch_or_fairseq(export):
    out, _, _ = export
    code = ("import sys\nfor m in ('torch', 'fairseq'): sys.modules[m] = None\n"
            "from fairseq_insertion.serve.__main__ import make_app\n"
            "from fairseq_insertion.runtime import Translator\n"
            f"make_app(Translator({str(out)!r}, intra_threads=1), __import__('pathlib').Path({str(out)!r}))\n"
            "assert 'torch' not in [m for m, v in sys.modules.items() if v is not None]\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_health_names_the_exports_settings(export):
    import hashlib

    out, _, _ = export

    async def go(url):
        async with aiohttp.ClientSession() as session:
            return await _health(session, url)

    with server(out, "--max-batch-size", "16") as url:
        health = asyncio.run(go(url))
    assert health["settings_sha256"] == hashlib.sha256((out / "settings.json").read_bytes()).hexdigest()
    assert health["max_batch_size"] == 16 and health["status"] == "ok"


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Chromium (Debian: apt install chromium)")
def test_the_page_in_a_browser_shows_the_translation_and_its_passes(export):
    out, translator, lines = export
    line = max(lines, key=len)
    want = expected(translator, [line])[0]
    direct = translator.translate_batch([line.split()], return_passes=True)[0].passes[0]

    async def go(url):
        async with Browser() as browser:
            return await browser.translate(url + "/", line)

    with server(out) as url:
        shown = asyncio.run(go(url))
    assert shown["error"] == "" and shown["text"] == want and want
    assert len(shown["passes"]) >= 2
    assert [[t for t, _ in row] for row in shown["passes"]] == direct
    assert all(any(new for _, new in row) for row in shown["passes"])


class StubTranslator:
    """translate_batch's interface: each line's hypothesis its pieces reversed; a line ["boom"] fails its call."""

    def __init__(self):
        self.calls = []

    def translate_batch(self, source, max_batch_size, constraints=None, num_hypotheses=1, return_passes=False):
        from types import SimpleNamespace

        from fairseq_insertion.runtime import TranslatorError

        self.calls.append((len(source), num_hypotheses, return_passes, constraints is not None))
        if ["boom"] in source:
            raise TranslatorError("boom: refused")
        return [SimpleNamespace(hypotheses=[line[::-1]] * num_hypotheses, scores=[0.0] * num_hypotheses, passes=[])
                for line in source]


def test_the_batcher_keeps_kinds_apart_answers_each_its_own_lines_and_fails_only_the_bad_request():
    from fairseq_insertion.serve import Batcher, Job

    stub = StubTranslator()

    async def go():
        batcher = Batcher(stub, max_batch_size=16, max_wait_ms=50, workers=1)
        batcher.start()
        jobs = [Job([[f"a{i}", f"b{i}"], [f"c{i}"]], None, 1 + i % 2, i % 3 == 0, False) for i in range(12)]
        jobs.append(Job([["boom"]], None, 1, False, False))
        answers = await asyncio.gather(*(batcher.submit(job) for job in jobs), return_exceptions=True)
        await batcher.stop()
        return jobs, answers, batcher

    jobs, answers, batcher = asyncio.run(go())
    for job, got in zip(jobs[:-1], answers):
        assert [r.hypotheses[0] for r in got] == [line[::-1] for line in job.source]
        assert len(got[0].hypotheses) == job.num_hypotheses
    assert isinstance(answers[-1], ValueError) and "boom" in str(answers[-1])
    assert batcher.retried == 1 and batcher.calls == len(stub.calls)
    assert len(stub.calls) < len(jobs)  # shared
    assert all(lines <= 16 for lines, *_ in stub.calls)
    kinds = {(k, p) for _, k, p, _ in stub.calls}
    assert kinds == {(1 + i % 2, i % 3 == 0) for i in range(12)} | {(1, False)}


def test_passes_with_a_constraint_piece_the_vocabulary_lacks(export):
    out, translator, lines = export
    with server(out) as url:
        async def go():
            async with aiohttp.ClientSession() as session:
                return await post(session, url, {"tokens": [lines[0].split()], "constraints": [[["zzz"]]],
                                                 "passes": True})
        status, answer = asyncio.run(go())
    assert status == 200, answer
    passes = answer["translations"][0]["passes"]
    assert passes[0]["tokens"] == ["<unk>"] and "<unk>" in passes[-1]["tokens"]
