"""Deployment engines side by side: the teacher through CTranslate2 and fairseq, the insertion model
through the ONNX runtime and PyTorch, on one machine, one run.

From the repository root, with the teacher kit, an insertion model warm-started from it and the raw
Multi30k files::

    python -m benchmarks.engines --kit KIT --insertion INS/checkpoint.pt --raw-dir DATA --out OUT \\
        [--eos-penalty 3] [--threads 1 2] [--batches 1 8 128] [--rounds 3] [--sentences N]
    python -m benchmarks.engines --out OUT --render      # the table again from OUT/engines.json
    python -m benchmarks.engines --render benchmarks/results/engines_cpu_d256.json   # its .md beside it

Every engine gets the same pre-tokenised input: the source side of the data-bin's test split, read back
as subword pieces with the dictionary, through its own Python API (no fairseq-generate on either side):

* the teacher, greedy: CTranslate2 (``FairseqConverter``, fp32 and int8), and fairseq's
  ``SequenceGenerator`` (beam 1, fp32); outputs of at most 1.2 x source + 10 tokens (fairseq's rule:
  the batch's source width with its end-of-sentence marker, the same limit given to CTranslate2);
* the insertion model: :class:`fairseq_insertion.runtime.Translator` on its export
  (``python -m fairseq_insertion.export``, fp32 and ``--int8``) and :class:`InsertionGenerator`
  (PyTorch, fp32), both parallel, ``--eos-penalty``, the repetition rules on (neighbour copies blocked,
  no repeated trigram), at most 1.2 x source + 10 tokens; and both greedy, for parity.

The sentences are sorted by source length (longest first) and cut into batches of 1, 8 and 128
(``--batches``); every engine decodes the same batches in the same order, each at every thread count
of ``--threads`` (CTranslate2's and onnxruntime's intra-op threads, ``torch.set_num_threads``), after
one untimed warm-up batch. The engines take turns, batch size by batch size, for ``--rounds`` rounds
(A, B, C, A, B, C ...): a row's seconds are the median of its rounds, every round's seconds are kept,
and each speed ratio has the ratios of the single rounds beside it (its spread: a machine whose speed
drifts moves every engine of a round alike). Per engine, precision, decoding, threads and batch: the seconds for all
sentences (input tokens to output tokens), detokenised BLEU (``@@ `` removed, Moses-detokenised,
sacreBLEU against the raw references), the batched decoder passes (the runtime's and the generator's
counts; for the teacher, the longest output of each batch + 1), passes per sentence and ms per pass.

Each engine's best thread count is the one with the fewest seconds at that batch; the targets compare
engines at their best. Also recorded: how many hypotheses are the same for the runtime and PyTorch (the
fp32 parity), for CTranslate2 fp32 and fairseq, and for each engine at its smallest and largest batch.
Writes ``OUT/engines.json``, ``OUT/engines.md`` and every hypothesis in ``OUT/hyps/``; paths in the
JSON are written as REPO, OUT, KIT (the teacher's directory), INS (the insertion model's), DATA (the
references') and DATA-BIN (a data-bin outside KIT). ``ctranslate2`` is needed by this benchmark only;
without it its rows are left out, with a note.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from examples.commands import REPO, RecipeError
from examples.generate_output import GenerateOutput, read_reference, score
from examples.multi30k.prepare import find_raw_file, read_lines
from examples.steps import run_info

# engine key: (model, engine, precision, decoding)
ENGINES = {
    "teacher_ctranslate2_fp32": ("teacher", "ctranslate2", "fp32", "greedy"),
    "teacher_ctranslate2_int8": ("teacher", "ctranslate2", "int8", "greedy"),
    "teacher_fairseq_fp32": ("teacher", "fairseq", "fp32", "greedy"),
    "insertion_runtime_fp32": ("insertion", "runtime", "fp32", "parallel"),
    "insertion_runtime_int8": ("insertion", "runtime", "int8", "parallel"),
    "insertion_pytorch_fp32": ("insertion", "pytorch", "fp32", "parallel"),
    "insertion_runtime_fp32_greedy": ("insertion", "runtime", "fp32", "greedy"),
    "insertion_pytorch_fp32_greedy": ("insertion", "pytorch", "fp32", "greedy"),
}
CT2_QUANTIZATION = {"fp32": "float32", "int8": "int8"}
# the insertion model's decoding, the same for the runtime and PyTorch (the recipes' repetition rules)
REPETITION = {"block_neighbour_copies": True, "no_repeat_ngram_size": 3}
# comparisons: name, engine a, engine b (same threads and batch), what is compared, goal
PARITY = [
    ("runtime fp32 = PyTorch, parallel", "insertion_runtime_fp32", "insertion_pytorch_fp32", 0.995, 0.05),
    ("runtime fp32 = PyTorch, greedy", "insertion_runtime_fp32_greedy", "insertion_pytorch_fp32_greedy", 0.995, 0.05),
    ("CTranslate2 fp32 = fairseq (teacher)", "teacher_ctranslate2_fp32", "teacher_fairseq_fp32", None, None),
]
INT8 = [("runtime int8 - fp32 BLEU, parallel", "insertion_runtime_int8", "insertion_runtime_fp32", 0.3),
        ("CTranslate2 int8 - fp32 BLEU (teacher)", "teacher_ctranslate2_int8", "teacher_ctranslate2_fp32", None)]
SPEED = [("runtime / CTranslate2 seconds, fp32", "insertion_runtime_fp32", "teacher_ctranslate2_fp32"),
         ("runtime / CTranslate2 seconds, int8", "insertion_runtime_int8", "teacher_ctranslate2_int8"),
         ("runtime / fairseq teacher seconds, fp32", "insertion_runtime_fp32", "teacher_fairseq_fp32"),
         ("PyTorch insertion / fairseq teacher seconds, fp32", "insertion_pytorch_fp32", "teacher_fairseq_fp32")]
SPEED_GOAL_BATCH = 1  # the speed goal (<= 1.0) is for batch 1; the other batches are reported


class EnginesError(RuntimeError):
    """Input the benchmark cannot take; the message names it."""


@dataclass
class Setup:
    """The run's settings, fixed once the arguments are read."""

    out: Path
    teacher: Path
    data_bin: Path
    insertion: Path
    reference: Path
    lang: str | None = "de"
    eos_penalty: float = 3.0
    threads: tuple[int, ...] = (1, 2)
    batches: tuple[int, ...] = (1, 8, 128)
    sentences: int = 0  # 0: all
    engines: tuple[str, ...] = tuple(ENGINES)
    split: str = "test"
    max_len: tuple[float, int] = (1.2, 10)
    rounds: int = 3  # timed rounds per engine and batch, the engines taking turns
    placeholders: dict[str, str] = field(default_factory=dict)  # path -> its name in the JSON

    def decoding(self, decoding: str) -> dict:
        """The insertion model's options (DecodingConfig's fields), the same for the runtime and PyTorch."""
        return {"decoding": decoding, "eos_penalty": self.eos_penalty, "max_len_a": self.max_len[0],
                "max_len_b": self.max_len[1], **REPETITION}

    def portable(self, text: str) -> str:
        """``text`` with this machine's paths (absolute) written as their placeholders."""
        for path, name in sorted(self.placeholders.items(), key=lambda kv: -len(kv[0])):
            text = text.replace(path, name)
        return text

    def command(self, argv: Sequence[str]) -> str:
        """This benchmark's command line, its paths (relative or absolute) as placeholders."""
        words = [str(Path(w).resolve()) if not w.startswith("-") and Path(w).exists() else w for w in map(str, argv)]
        words = [self.portable(w) for w in words]
        return shlex.join(["python", "-m", "benchmarks.engines", *words])


# ---------------------------------------------------------------- the input
def language_pair(data_bin: Path, split: str) -> tuple[str, str]:
    """(source, target) of the binarised ``split`` in ``data_bin`` (``split.src-tgt.src.bin``)."""
    for path in sorted(data_bin.glob(f"{split}.*-*.*.bin")):
        pair, lang = path.name[len(split) + 1:-len(".bin")].rsplit(".", 1)
        src, _, tgt = pair.partition("-")
        if lang == src:
            return src, tgt
    raise EnginesError(f"{data_bin}: no binarised {split} split ({split}.SRC-TGT.SRC.bin)")


def source_tokens(data_bin: Path, split: str, n: int = 0) -> list[list[str]]:
    """The source side of ``split`` as subword pieces (the dictionary's symbols, no end-of-sentence
    marker), in line order; its first ``n`` lines when n > 0."""
    from fairseq.data import Dictionary, data_utils

    src, tgt = language_pair(data_bin, split)
    d = Dictionary.load(str(data_bin / f"dict.{src}.txt"))
    ds = data_utils.load_indexed_dataset(str(data_bin / f"{split}.{src}-{tgt}.{src}"), d)
    count = len(ds) if n <= 0 else min(n, len(ds))
    return [[d[i] for i in ds[k].tolist() if i != d.eos()] for k in range(count)]


def schedule(sources: list[list[str]], batch: int) -> list[list[int]]:
    """The sentence indices, longest source first (ties in line order), cut into batches of ``batch``."""
    order = sorted(range(len(sources)), key=lambda i: (-len(sources[i]), i))
    return [order[k:k + batch] for k in range(0, len(order), batch)]


# ---------------------------------------------------------------- the engines
@dataclass
class Output:
    tokens: list[str]
    iterations: int | None = None


class Engine:
    """One engine: ``load(threads)`` once per thread count, then ``translate`` batches of token lists;
    ``passes()``: the batched decoder passes so far."""

    def load(self, threads: int) -> None:
        raise NotImplementedError

    def translate(self, batch: list[list[str]]) -> list[Output]:
        raise NotImplementedError

    def passes(self) -> int:
        raise NotImplementedError


class AutoregressiveEngine(Engine):
    """Counts a greedy decoder's steps: each batch runs until its longest output and its end marker."""

    def __init__(self):
        self.steps = 0

    def passes(self) -> int:
        return self.steps

    def count(self, outputs: list[Output]) -> list[Output]:
        self.steps += max(len(o.tokens) for o in outputs) + 1
        return outputs


def output_limit(width: int, max_len: tuple[float, int], cap: int) -> int:
    """fairseq's greedy limit: ``int(a x (the batch's source width with its end marker) + b)``, at most cap."""
    return min(int(max_len[0] * (width + 1) + max_len[1]), cap)


class CTranslate2Teacher(AutoregressiveEngine):
    def __init__(self, model_dir: Path, max_len: tuple[float, int], cap: int):
        super().__init__()
        self.model_dir, self.max_len, self.cap, self.translator = model_dir, max_len, cap, None

    def load(self, threads: int) -> None:
        import ctranslate2

        self.translator = None
        self.translator = ctranslate2.Translator(str(self.model_dir), device="cpu", intra_threads=threads,
                                                 inter_threads=1)

    def translate(self, batch: list[list[str]]) -> list[Output]:
        limit = output_limit(max(map(len, batch)), self.max_len, self.cap)
        results = self.translator.translate_batch(batch, beam_size=1, max_batch_size=len(batch),
                                                  max_decoding_length=limit)
        return self.count([Output(list(r.hypotheses[0])) for r in results])


class FairseqModel:
    """A fairseq checkpoint loaded with ``data_bin``'s dictionaries, and its batches built from token lists."""

    def __init__(self, checkpoint: Path, data_bin: Path):
        import torch
        from fairseq import checkpoint_utils

        import fairseq_insertion  # noqa: F401  the plugin's task and the safe globals of the loader

        models, _, self.task = checkpoint_utils.load_model_ensemble_and_task(
            [str(checkpoint)], arg_overrides={"data": str(data_bin)})
        self.model = models[0].float().eval()
        self.src, self.tgt = self.task.source_dictionary, self.task.target_dictionary
        self.left_pad = bool(getattr(self.task.cfg, "left_pad_source", True))
        self.torch = torch

    def sample(self, batch: list[list[str]]) -> dict:
        from fairseq.data import data_utils

        torch = self.torch
        ids = [torch.tensor([self.src.index(t) for t in tokens] + [self.src.eos()]) for tokens in batch]
        return {"id": torch.arange(len(batch)),
                "net_input": {"src_tokens": data_utils.collate_tokens(ids, self.src.pad(), left_pad=self.left_pad),
                              "src_lengths": torch.tensor([len(x) for x in ids])}}

    def words(self, tokens) -> list[str]:
        return [self.tgt[i] for i in tokens.tolist() if i != self.tgt.eos()]


class FairseqTeacher(AutoregressiveEngine):
    def __init__(self, loaded: FairseqModel, max_len: tuple[float, int]):
        from fairseq.dataclass.configs import GenerationConfig

        super().__init__()
        self.m = loaded
        self.generator = loaded.task.build_generator(
            [loaded.model], GenerationConfig(beam=1, max_len_a=max_len[0], max_len_b=max_len[1]))

    def load(self, threads: int) -> None:
        self.m.torch.set_num_threads(threads)

    def translate(self, batch: list[list[str]]) -> list[Output]:
        with self.m.torch.no_grad():
            hypos = self.generator.generate([self.m.model], self.m.sample(batch))
        return self.count([Output(self.m.words(h[0]["tokens"])) for h in hypos])


class PyTorchInsertion(Engine):
    def __init__(self, loaded: FairseqModel, options: dict):
        from fairseq_insertion.decoding import DecodingConfig
        from fairseq_insertion.generator import InsertionGenerator

        self.m = loaded
        self.generator = InsertionGenerator(loaded.tgt, DecodingConfig(**options), src_dict=loaded.src)

    def load(self, threads: int) -> None:
        self.m.torch.set_num_threads(threads)

    def translate(self, batch: list[list[str]]) -> list[Output]:
        hypos = self.generator.generate([self.m.model], self.m.sample(batch))
        return [Output(self.m.words(h[0]["tokens"]), h[0]["steps"]) for h in hypos]

    def passes(self) -> int:
        return self.generator.stats["forward_passes"]


class RuntimeInsertion(Engine):
    def __init__(self, model_dir: Path, options: dict):
        self.model_dir, self.options, self.translator, self.earlier = model_dir, options, None, 0

    def load(self, threads: int) -> None:
        from fairseq_insertion.runtime import Translator

        self.earlier = self.passes()
        self.translator = None
        self.translator = Translator(self.model_dir, intra_threads=threads)

    def translate(self, batch: list[list[str]]) -> list[Output]:
        results = self.translator.translate_batch(batch, max_batch_size=len(batch), **self.options)
        return [Output(r.hypotheses[0], r.iterations[0]) for r in results]

    def passes(self) -> int:
        return self.earlier + (self.translator.stats["passes"] if self.translator is not None else 0)


# ---------------------------------------------------------------- preparing the engines
def ctranslate2_available() -> bool:
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return False
    return True


def convert_teacher(setup: Setup, precision: str) -> dict:
    """The teacher in CTranslate2's format at ``precision`` (OUT/ctranslate2/PRECISION)."""
    from ctranslate2.converters import FairseqConverter

    import fairseq_insertion  # noqa: F401  torch's safe globals, which the converter's loader needs

    out = setup.out / "ctranslate2" / precision
    src, tgt = language_pair(setup.data_bin, setup.split)
    start = time.perf_counter()
    FairseqConverter(str(setup.teacher), str(setup.data_bin), source_lang=src, target_lang=tgt).convert(
        str(out), quantization=CT2_QUANTIZATION[precision], force=True)
    call = (f"FairseqConverter({str(setup.teacher)!r}, {str(setup.data_bin)!r}, source_lang={src!r}, "
            f"target_lang={tgt!r}).convert({str(out)!r}, quantization={CT2_QUANTIZATION[precision]!r})")
    return {"dir": str(out), "code": call, "seconds": time.perf_counter() - start}


def export_insertion(setup: Setup, precision: str) -> dict:
    """The insertion model exported for the runtime (OUT/export/PRECISION)."""
    from fairseq_insertion.decoding import FLAGS, DecodingConfig
    from fairseq_insertion.export import export

    out = setup.out / "export" / precision
    options = setup.decoding("parallel")
    start = time.perf_counter()
    export(setup.insertion, setup.data_bin, out, int8=precision == "int8", config=DecodingConfig(**options))
    flags = []
    for name, value in options.items():
        if isinstance(value, bool):
            flags += [FLAGS[name]] if value else []
        else:
            flags += [FLAGS[name], f"{value:g}" if isinstance(value, float) else str(value)]
    cmd = ["python", "-m", "fairseq_insertion.export", "--path", str(setup.insertion), "--data",
           str(setup.data_bin), "--out", str(out), *(["--int8"] if precision == "int8" else []), *flags]
    return {"dir": str(out), "command": shlex.join(cmd), "seconds": time.perf_counter() - start}


def build_engines(setup: Setup, results: dict) -> dict[str, Engine]:
    """Every engine of ``setup.engines`` ready to load (converted, exported), the steps recorded in results."""
    wanted = list(setup.engines)
    if any(ENGINES[k][1] == "ctranslate2" for k in wanted) and not ctranslate2_available():
        wanted = [k for k in wanted if ENGINES[k][1] != "ctranslate2"]
        results["notes"].append("ctranslate2 is not installed: its rows are left out")
    engines: dict[str, Engine] = {}
    teacher = FairseqModel(setup.teacher, setup.data_bin) if any(ENGINES[k][0] == "teacher" for k in wanted) \
        else None
    cap = teacher.model.max_decoder_positions() - 1 if teacher else 1023
    insertion = FairseqModel(setup.insertion, setup.data_bin) if "insertion_pytorch_fp32" in wanted or \
        "insertion_pytorch_fp32_greedy" in wanted else None
    prepared: dict[tuple[str, str], dict] = {}
    for key in wanted:
        _, engine, precision, decoding = ENGINES[key]
        if engine in ("ctranslate2", "runtime") and (engine, precision) not in prepared:
            step = convert_teacher if engine == "ctranslate2" else export_insertion
            prepared[engine, precision] = step(setup, precision)
            results["prepared"][f"{engine}_{precision}"] = prepared[engine, precision]
        if engine == "ctranslate2":
            engines[key] = CTranslate2Teacher(Path(prepared[engine, precision]["dir"]), setup.max_len, cap)
        elif engine == "fairseq":
            engines[key] = FairseqTeacher(teacher, setup.max_len)
        elif engine == "runtime":
            engines[key] = RuntimeInsertion(Path(prepared[engine, precision]["dir"]), setup.decoding(decoding))
        else:
            engines[key] = PyTorchInsertion(insertion, setup.decoding(decoding))
    return engines


# ---------------------------------------------------------------- measuring
def measure(engine: Engine, sources: list[list[str]], batches: list[list[int]]) -> tuple[list[Output], float, int]:
    """(outputs in line order, seconds, batched decoder passes) of one decode of every batch, after an
    untimed warm-up on the first batch."""
    engine.translate([sources[i] for i in batches[0]])
    gc.collect()
    outputs: list[Output | None] = [None] * len(sources)
    passes = engine.passes()
    start = time.perf_counter()
    for idx in batches:
        for i, out in zip(idx, engine.translate([sources[i] for i in idx]), strict=True):
            outputs[i] = out
    seconds = time.perf_counter() - start
    return outputs, seconds, engine.passes() - passes


def scored(outputs: list[Output], references: list[str], lang: str | None) -> dict:
    """BLEU, the mean output length in pieces (and the iterations against floor(log2 n)+1, when the engine
    gives them) with the benchmark's scoring."""
    # lengths in subword pieces (one "positional score" per piece and the end marker), as fairseq counts them
    gen = GenerateOutput(hypotheses={i: " ".join(o.tokens) for i, o in enumerate(outputs)},
                         positional_scores={i: len(o.tokens) + 1 for i, o in enumerate(outputs)})
    if all(o.iterations is not None for o in outputs):
        gen.iterations = {i: o.iterations for i, o in enumerate(outputs)}
    s = score(gen, references, lang)
    return {"bleu": s["bleu"], "brevity_penalty": s["brevity_penalty"], "signature": s["signature"],
            "mean_length": s["mean_length"], "mean_iterations": s["mean_iterations"],
            "mean_log2_bound": s["mean_log2_bound"] if s["mean_iterations"] is not None else None}


def row_name(key: str, threads: int, batch: int) -> str:
    return f"{key}.threads{threads}.batch{batch}"


def run_all(setup: Setup, engines: dict[str, Engine], sources: list[list[str]], references: list[str],
            results: dict) -> dict[str, list[str]]:
    """Every engine at every thread count and batch: the rows of ``results``; the hypotheses by row. The
    engines take turns (A, B, A, B ...) for ``setup.rounds`` rounds per batch; a row's seconds are the
    median of its rounds, and each round's seconds are kept, so that every ratio has a spread."""
    hyps: dict[str, list[str]] = {}
    rows: dict[str, dict] = {}
    plans = {b: schedule(sources, b) for b in setup.batches}
    for threads in setup.threads:
        for engine in engines.values():
            engine.load(threads)
        for batch in setup.batches:
            timed: dict[str, list[float]] = {key: [] for key in engines}
            for _ in range(setup.rounds):
                for key, engine in engines.items():
                    outputs, seconds, passes = measure(engine, sources, plans[batch])
                    timed[key].append(seconds)
                    name_ = row_name(key, threads, batch)
                    if name_ not in hyps:  # scored on the first round
                        hyps[name_] = [" ".join(o.tokens) for o in outputs]
                        rows[name_] = row_of(key, threads, batch, sources, outputs, passes, references, setup)
                        results["rows"].append(rows[name_])
                    set_seconds(rows[name_], timed[key])
                    print(f"{name_}: {seconds:.2f} s, BLEU {rows[name_]['bleu']:.2f}, {passes} passes",
                          file=sys.stderr, flush=True)
    return hyps


def row_of(key: str, threads: int, batch: int, sources: list[list[str]], outputs: list[Output], passes: int,
           references: list[str], setup: Setup) -> dict:
    """One engine's row at ``threads`` and ``batch``, scored on ``outputs``."""
    model, name, precision, decoding = ENGINES[key]
    return {"name": row_name(key, threads, batch), "engine_key": key, "model": model, "engine": name,
            "precision": precision, "decoding": decoding, "threads": threads, "batch": batch,
            "sentences": len(sources), "passes": passes, "passes_per_sentence": passes / len(sources),
            **scored(outputs, references, setup.lang)}


def set_seconds(row: dict, rounds: list[float]) -> None:
    """A row's timing: the median of its rounds' seconds, and every round's."""
    seconds = statistics.median(rounds)
    row.update({"seconds": seconds, "seconds_by_round": list(rounds), "sentences_per_s": row["sentences"] / seconds,
                "ms_per_pass": 1000 * seconds / row["passes"]})


# ---------------------------------------------------------------- comparing
def best_rows(rows: list[dict]) -> dict[tuple[str, int], dict]:
    """(engine key, batch) -> its row at the thread count with the fewest seconds."""
    best: dict[tuple[str, int], dict] = {}
    for r in rows:
        k = (r["engine_key"], r["batch"])
        if k not in best or r["seconds"] < best[k]["seconds"]:
            best[k] = r
    return best


def same(a: list[str], b: list[str]) -> int:
    return sum(x == y for x, y in zip(a, b, strict=True))


def compare(results: dict, hyps: dict[str, list[str]]) -> None:
    """Parity, int8 and speed comparisons and batch agreement, into ``results``."""
    rows = {r["name"]: r for r in results["rows"]}
    best = best_rows(results["rows"])
    threads = sorted({r["threads"] for r in results["rows"]})
    batches = sorted({r["batch"] for r in results["rows"]})
    parity, targets = [], []
    for metric, a, b, goal_same, goal_bleu in PARITY:
        pairs = [(t, n, row_name(a, t, n), row_name(b, t, n)) for t in threads for n in batches]
        pairs = [p for p in pairs if p[2] in rows and p[3] in rows]
        for t, n, ra, rb in pairs:
            k = same(hyps[ra], hyps[rb])
            parity.append({"comparison": metric, "threads": t, "batch": n, "identical": k,
                           "sentences": len(hyps[ra]), "bleu_a": rows[ra]["bleu"], "bleu_b": rows[rb]["bleu"]})
        if pairs:
            mine = [p for p in parity if p["comparison"] == metric]
            worst = min(p["identical"] / p["sentences"] for p in mine)
            gap = max(abs(p["bleu_a"] - p["bleu_b"]) for p in mine)
            targets.append(target(f"{metric}: identical hypotheses (worst of {len(mine)} thread/batch settings)",
                                  worst, goal_same, ">="))
            targets.append(target(f"{metric}: |BLEU difference| (largest)", gap, goal_bleu, "<="))
    for metric, a, b, goal in INT8:
        gaps = [rows[row_name(a, t, n)]["bleu"] - rows[row_name(b, t, n)]["bleu"] for t in threads for n in batches
                if row_name(a, t, n) in rows and row_name(b, t, n) in rows]
        if gaps:
            worst = max(gaps, key=abs)
            targets.append(target(f"{metric} (largest |difference|)", worst, goal, "abs<="))
    for metric, a, b in SPEED:
        for n in batches:
            if (a, n) in best and (b, n) in best:
                ra, rb = best[a, n], best[b, n]
                goal = 1.0 if n == SPEED_GOAL_BATCH else None
                by_round = [x / y for x, y in zip(ra["seconds_by_round"], rb["seconds_by_round"], strict=True)]
                targets.append({**target(f"{metric}, batch {n} (each at its best threads: {ra['threads']} / "
                                         f"{rb['threads']})", ra["seconds"] / rb["seconds"], goal, "<="),
                                "by_round": by_round})
    agreement = []
    if len(batches) > 1:
        lo, hi = batches[0], batches[-1]
        for key in dict.fromkeys(r["engine_key"] for r in results["rows"]):
            for t in threads:
                ra, rb = row_name(key, t, lo), row_name(key, t, hi)
                if ra in hyps and rb in hyps:
                    agreement.append({"engine_key": key, "threads": t, "batches": [lo, hi],
                                      "identical": same(hyps[ra], hyps[rb]), "sentences": len(hyps[ra])})
    results["best_threads"] = [{"engine_key": k, "batch": n, "threads": r["threads"], "seconds": r["seconds"]}
                               for (k, n), r in best.items()]
    results["parity"], results["batch_agreement"], results["targets"] = parity, agreement, targets


def target(metric: str, value: float, goal: float | None, direction: str) -> dict:
    if goal is None:
        return {"metric": metric, "target": "reported", "value": value, "met": None}
    met = {">=": value >= goal, "<=": value <= goal, "abs<=": abs(value) <= goal}[direction]
    shown = {">=": ">=", "<=": "<=", "abs<=": "|x| <="}[direction]
    return {"metric": metric, "target": f"{shown} {goal:g}", "value": value, "met": bool(met)}


# ---------------------------------------------------------------- the report
def fmt(x, digits: int = 2) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def markdown(results: dict) -> str:
    """The results as markdown: one row per engine and batch (seconds at every thread count, the rest at
    the best), the targets, the parity and batch agreement."""
    threads = sorted({r["threads"] for r in results["rows"]})
    best = best_rows(results["rows"])
    by_name = {r["name"]: r for r in results["rows"]}
    rounds = results.get("rounds", 1)
    lines = [f"{results['machine']}; {results['sentences']} sentences of {results['test_set']}; "
             f"insertion EOS penalty {results['eos_penalty']:g}; "
             + (f"seconds: the median of {rounds} rounds, the engines taking turns." if rounds > 1 else
                "one timed round.")
             + "", "",
             "| engine | model | precision | decoding | batch | BLEU | "
             + " | ".join(f"s, {t} thread{'s' if t > 1 else ''}" for t in threads)
             + " | best threads | ms per pass | passes per sentence | mean iterations |",
             "| --- " * (10 + len(threads)) + "|"]
    for (key, batch), r in best.items():
        seconds = [fmt(by_name.get(row_name(key, t, batch), {}).get("seconds")) for t in threads]
        lines.append(f"| {r['engine']} | {r['model']} | {r['precision']} | {r['decoding']} | {batch} | "
                     f"{fmt(r['bleu'])} | " + " | ".join(seconds) + f" | {r['threads']} | {fmt(r['ms_per_pass'])} | "
                     f"{fmt(r['passes_per_sentence'])} | {fmt(r['mean_iterations'])} |")
    lines += ["", "| comparison | goal | measured (median of rounds) | rounds: lowest - highest | met |",
              "| --- | --- | --- | --- | --- |"]
    for t in results["targets"]:
        met = "-" if t["met"] is None else ("yes" if t["met"] else "**no**")
        spread = f"{fmt(min(t['by_round']), 3)} - {fmt(max(t['by_round']), 3)}" if t.get("by_round") else ""
        lines.append(f"| {t['metric']} | {t['target']} | {fmt(t['value'], 3)} | {spread} | {met} |")
    if results["parity"]:
        lines += ["", "| same hypotheses | threads | batch | identical | BLEU a / b |",
                  "| --- | --- | --- | --- | --- |"]
        for p in results["parity"]:
            lines.append(f"| {p['comparison']} | {p['threads']} | {p['batch']} | {p['identical']} of "
                         f"{p['sentences']} | {fmt(p['bleu_a'])} / {fmt(p['bleu_b'])} |")
    if results["batch_agreement"]:
        lines += ["", "| engine | threads | batch a / b | identical |", "| --- | --- | --- | --- |"]
        for a in results["batch_agreement"]:
            lines.append(f"| {a['engine_key']} | {a['threads']} | {a['batches'][0]} / {a['batches'][1]} | "
                         f"{a['identical']} of {a['sentences']} |")
    return "\n".join(lines) + "\n"


def save(path: Path, results: dict) -> str:
    """Write ``results`` to ``path`` (JSON) and its table beside it (``.md``); return the table."""
    path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    table = markdown(results)
    path.with_suffix(".md").write_text(table, encoding="utf-8")
    return table


# ---------------------------------------------------------------- the command line
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.engines", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--out", type=Path, help="where the results, exports and hypotheses go")
    p.add_argument("--render", nargs="?", const="", metavar="JSON",
                   help="write the table again from JSON (default OUT/engines.json), beside it; run nothing")
    p.add_argument("--kit", type=Path, help="the teacher kit: KIT/checkpoint.pt and KIT/data-bin")
    p.add_argument("--teacher", type=Path, help="the teacher checkpoint (default: KIT/checkpoint.pt)")
    p.add_argument("--data-bin", type=Path, help="its data-bin, with the test split (default: KIT/data-bin)")
    p.add_argument("--insertion", type=Path, help="the insertion model's checkpoint (same dictionaries)")
    p.add_argument("--raw-dir", type=Path, help="the raw Multi30k files: the references are TEST_NAME.LANG(.gz)")
    p.add_argument("--ref", type=Path, help="the raw references instead of --raw-dir (one line per test sentence)")
    p.add_argument("--test-name", default="test_2016_flickr", help="the references' stem in --raw-dir")
    p.add_argument("--lang", default="de", help="target language: the references and Moses detokeniser; "
                                                "'none': no detokeniser")
    p.add_argument("--split", default="test", help="the data-bin split to decode (default test)")
    p.add_argument("--eos-penalty", type=float, default=3.0, help="the insertion model's EOS penalty (default 3)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts (default 1 2)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 128], help="batch sizes (default 1 8 128)")
    p.add_argument("--rounds", type=int, default=3,
                   help="timed rounds per batch, the engines taking turns (A, B, A, B ...); a row's seconds are their "
                   "median (default 3)")
    p.add_argument("--sentences", type=int, default=0, help="the first N sentences only (default 0: all)")
    p.add_argument("--engines", nargs="+", choices=list(ENGINES), default=list(ENGINES),
                   help="the engines to run (default all)")
    return p


def setup_from(args: argparse.Namespace) -> Setup:
    teacher = args.teacher or (args.kit / "checkpoint.pt" if args.kit else None)
    data_bin = args.data_bin or (args.kit / "data-bin" if args.kit else None)
    if teacher is None or data_bin is None or args.insertion is None:
        raise EnginesError("give --kit (or --teacher and --data-bin) and --insertion")
    lang = None if args.lang == "none" else args.lang
    if args.ref is not None:
        reference = args.ref
    elif args.raw_dir is not None:
        reference = find_raw_file(args.raw_dir, args.test_name, args.lang)
    else:
        raise EnginesError("give --raw-dir or --ref (the raw references)")
    for flag, path in (("--teacher", teacher), ("--data-bin", data_bin), ("--insertion", args.insertion),
                       ("--ref", reference)):
        if not path.exists():
            raise EnginesError(f"{flag} {path}: not found")
    if min(args.threads) < 1 or min(args.batches) < 1 or args.rounds < 1:
        raise EnginesError("--threads, --batches and --rounds take numbers >= 1")
    kit = (args.kit or teacher.parent).resolve()
    names = {args.out: "OUT", kit: "KIT", args.insertion.parent: "INS", reference.parent: "DATA", REPO: "REPO"}
    if not data_bin.resolve().is_relative_to(kit):
        names[data_bin] = "DATA-BIN"
    placeholders = {str(path.resolve()): name for path, name in names.items()}
    return Setup(out=args.out.resolve(), teacher=teacher.resolve(), data_bin=data_bin.resolve(),
                 insertion=args.insertion.resolve(), reference=reference.resolve(),
                 lang=lang, eos_penalty=args.eos_penalty, threads=tuple(args.threads),
                 batches=tuple(sorted(set(args.batches))), sentences=args.sentences, engines=tuple(args.engines),
                 rounds=args.rounds,
                 split=args.split, placeholders=placeholders)


def references_of(path: Path) -> list[str]:
    return read_lines(path) if path.suffix == ".gz" else read_reference(path)


def run(setup: Setup, argv: Sequence[str]) -> dict:
    setup.out.mkdir(parents=True, exist_ok=True)
    sources = source_tokens(setup.data_bin, setup.split, setup.sentences)
    references = references_of(setup.reference)
    if len(references) < len(sources):
        raise EnginesError(f"{setup.reference}: {len(references)} lines, but the {setup.split} split has "
                           f"{len(sources)} sentences")
    references = references[:len(sources)]
    info = run_info("cpu")
    info["omp_num_threads"] = info.pop("threads")
    for mod in ("ctranslate2", "onnxruntime", "onnx", "numpy", "sacremoses"):
        try:
            info["versions"][mod] = __import__(mod).__version__
        except Exception:  # reported, not fatal
            info["versions"][mod] = None
    results = {
        "date": datetime.date.today().isoformat(), **info, "thread_counts": list(setup.threads),
        "batches": list(setup.batches), "rounds": setup.rounds,
        "test_set": f"{setup.reference.name} ({setup.split} split of the data-bin)",
        "sentences": len(sources), "eos_penalty": setup.eos_penalty,
        "decoding": {"teacher": f"greedy (beam 1), at most {setup.max_len[0]:g} x source + {setup.max_len[1]}",
                     "insertion": setup.decoding("parallel"), "insertion_greedy": setup.decoding("greedy")},
        "command": setup.command(argv),
        "prepared": {}, "rows": [], "notes": [
            "pre-tokenised input (the data-bin's source pieces) through each engine's Python API; sentences "
            "sorted by source length, longest first, the same batches for every engine; one untimed warm-up "
            "batch before each timed decode",
            "passes: batched decoder passes (the encoder not counted); the teacher's: the longest output of each "
            "batch + 1; ms per pass = seconds / passes"]}
    engines = build_engines(setup, results)
    hyps = run_all(setup, engines, sources, references, results)
    compare(results, hyps)
    (setup.out / "hyps").mkdir(exist_ok=True)
    for name, lines in hyps.items():
        (setup.out / "hyps" / f"{name}.txt").write_text("".join(f"{h}\n" for h in lines), encoding="utf-8")
    return json.loads(setup.portable(json.dumps(results)))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if args.render is not None:
        path = Path(args.render) if args.render else (args.out / "engines.json" if args.out else None)
        if path is None or not path.is_file():
            print(f"python -m benchmarks.engines: error: {path or '--render JSON or --out OUT'}: no such file",
                  file=sys.stderr)
            return 2
        print(save(path, json.loads(path.read_text(encoding="utf-8"))), end="")
        return 0
    if args.out is None:
        print("python -m benchmarks.engines: error: --out is required", file=sys.stderr)
        return 2
    try:
        setup = setup_from(args)
        results = run(setup, argv)
    except (EnginesError, RecipeError) as exc:
        print(f"python -m benchmarks.engines: error: {exc}", file=sys.stderr)
        return 2
    print(save(setup.out / "engines.json", results), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
