"""The one harness: systems (a checkpoint that exists, an engine, its options) decoded in this process on
the same subword pieces and batches (longest source first), taking turns round by round after a burn-in
batch; seconds: the median of the rounds, each kept. Engines: ``fairseq``, the generator the checkpoint's task
builds from fairseq's generation options (a Transformer's sequence generator, with ``constraints`` its
constrained beam search; the iterative refinement generator of fairseq's non-autoregressive models; the
plugin's generator); ``runtime``, the insertion model exported for :class:`fairseq_insertion.runtime.Translator`;
``ctranslate2``, the Transformer converted, greedy. ``profiled``: a decode under torch's profiler."""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

import torch
from fairseq import checkpoint_utils, tasks
from fairseq.data import Dictionary, data_utils
from fairseq.models.nat.insertion_transformer import InsertionTransformerModel as FairseqNAT
from fairseq.token_generation_constraints import pack_constraints

import fairseq_insertion  # noqa: F401  the plugin's task, model and torch's safe globals
from examples.generate_output import GenerateOutput, read_reference, score
from examples.steps import choose_eos_penalty, language_pair
from fairseq_insertion.config import DecodingConfig
from fairseq_insertion.export import export
from fairseq_insertion.runtime import Translator

REPETITION = {"block_neighbour_copies": True, "no_repeat_ngram_size": 3}  # the recipes' rules for insertion models


@dataclass(frozen=True)
class System:
    """A checkpoint, an engine of :data:`ENGINES`, its options and the EOS penalties tried on valid."""
    name: str
    checkpoint: Path
    engine: str = "fairseq"
    options: dict = field(default_factory=dict)
    sweep: tuple[float, ...] = ()


class Where(NamedTuple):
    """The data-bin (dictionaries), a directory for exports, the output limit (a x source + b), the device."""
    data_bin: Path
    work: Path
    max_len: tuple[float, int] = (1.2, 10)
    device: str = "cpu"


class Inputs(NamedTuple):
    """Sentences as subword pieces, their raw references and their constraints (pieces, or empty)."""
    sources: list[list[str]]
    references: list[str]
    constraints: list[list[str]] | None = None

    def head(self, n: int) -> Inputs:
        return Inputs(self.sources[:n], self.references[:n], self.constraints and self.constraints[:n])


@dataclass
class Output:
    tokens: list[str]
    iterations: int | None = None


def pieces(data_bin: Path, split: str, side: int = 0, n: int = 0) -> list[list[str]]:
    """One side (0 source, 1 target) of ``split`` as subword pieces, in line order; the first ``n``."""
    pair = language_pair(data_bin)
    d = Dictionary.load(str(data_bin / f"dict.{pair[side]}.txt"))
    ds = data_utils.load_indexed_dataset(str(data_bin / f"{split}.{pair[0]}-{pair[1]}.{pair[side]}"), d)
    return [[d[i] for i in ds[k].tolist() if i != d.eos()] for k in range(min(n or len(ds), len(ds)))]


def inputs(data_bin: Path, split: str, references: Path | None = None, n: int = 0) -> Inputs:
    """The first ``n`` sentences (0: all) of ``split`` and their raw references (none: empty lines)."""
    sources = pieces(data_bin, split, 0, n)
    return Inputs(sources, read_reference(references)[:len(sources)] if references else [""] * len(sources))


def agreement(a: list[str], b: list[str]) -> dict:
    """How many hypotheses of ``a`` equal ``b``'s, of how many sentences, and the rate."""
    same = sum(map(str.__eq__, a, b))
    return {"identical": same, "sentences": len(a), "rate": round(same / max(len(a), 1), 4)}


def schedule(sources: list[list[str]], batch: int) -> list[list[int]]:
    """The sentence indices, longest source first (ties in line order), cut into batches of ``batch``."""
    order = sorted(range(len(sources)), key=lambda i: (-len(sources[i]), i))
    return [order[k:k + batch] for k in range(0, len(order), batch)]


class Engine:
    """``load(threads)`` once per thread count, then ``translate(batch, constraints)`` batches of pieces;
    ``passes()``: the batched decoder passes so far (else the longest output or iterations + 1 per batch).
    ``whole_file``: the engine takes every batch in one ``translate(..., max_batch_size=)`` call, as a user
    translates a file (it sorts by length and cuts its batches itself)."""

    whole_file = False

    def __init__(self, system: System, where: Where):
        self.system, self.where, self.counted = system, where, 0

    def load(self, threads: int) -> None:
        torch.set_num_threads(threads)

    def passes(self) -> int:
        return self.counted

    def count(self, outputs: list[Output], size: int = 0) -> list[Output]:
        """``outputs`` of batches of ``size`` (0: one batch) in order: their passes counted."""
        size = size or len(outputs)
        for k in range(0, len(outputs), size):
            self.counted += max(len(o.tokens) if o.iterations is None else o.iterations
                                for o in outputs[k:k + size]) + 1
        return outputs


class Fairseq(Engine):
    """fairseq's generator of the checkpoint's task (the plugin's, for an insertion model)."""

    def __init__(self, system: System, where: Where):
        super().__init__(system, where)
        state = checkpoint_utils.load_checkpoint_to_cpu(str(system.checkpoint), {"data": str(where.data_bin)})
        cfg = state["cfg"]
        self.task = tasks.setup_task(cfg.task)
        nat = cfg.task._name == "translation_lev"
        if nat and getattr(cfg.model, "arch", None) == "insertion_transformer":  # the plugin holds fairseq's name
            model = FairseqNAT.build_model(cfg.model, self.task)
        else:
            model = self.task.build_model(cfg.model, from_checkpoint=True)
        model.load_state_dict(state["model"], strict=True, model_cfg=cfg.model)
        options = {"max_len_a": where.max_len[0], "max_len_b": where.max_len[1], **system.options}
        self.model = model.float().eval().to(where.device)
        if options.pop("half", False):
            self.model.half()
        if nat and "eos_penalty" in options:
            options["iter_decode_eos_penalty"] = options.pop("eos_penalty")
        self.generator = self.task.build_generator([self.model], argparse.Namespace(**options))
        self.src, self.tgt = self.task.source_dictionary, self.task.target_dictionary

    def sample(self, batch: list[list[str]]) -> dict:
        src = self.src
        ids = [torch.tensor([src.index(t) for t in tokens] + [src.eos()]) for tokens in batch]
        left = bool(getattr(self.task.cfg, "left_pad_source", True))
        net = {"src_tokens": data_utils.collate_tokens(ids, src.pad(), left_pad=left),
               "src_lengths": torch.tensor([len(x) for x in ids])}
        return {"id": torch.arange(len(batch)), "net_input": {k: v.to(self.where.device) for k, v in net.items()}}

    def translate(self, batch: list[list[str]], constraints: list[list[str]] | None = None) -> list[Output]:
        packed = constraints and pack_constraints([[torch.tensor([self.tgt.index(t) for t in c.split()])
                                                    for c in cs] for cs in constraints]).to(self.where.device)
        with torch.no_grad():
            hypos = self.generator.generate([self.model], self.sample(batch), constraints=packed)
        outputs = [Output([self.tgt[i] for i in h[0]["tokens"].tolist() if i != self.tgt.eos()],
                          h[0].get("steps")) for h in hypos]
        return outputs if hasattr(self.generator, "stats") else self.count(outputs)

    def passes(self) -> int:  # the plugin's generator counts its own
        return self.generator.stats["passes"] if hasattr(self.generator, "stats") else self.counted


class Runtime(Engine):
    """The insertion model exported (``precision``: fp32 or int8, ``quantization``: int8's scheme, per-row unless
    given), run by the plugin's runtime; ``scorer``: an
    autoregressive checkpoint exported beside it that orders the ``eos_penalties`` candidates; ``shortlist``: a
    lexical shortlist table exported with it."""

    whole_file = True

    def __init__(self, system: System, where: Where):
        super().__init__(system, where)
        self.options = {k: v for k, v in system.options.items()
                        if k not in ("precision", "quantization", "constraints", "scorer", "shortlist")}
        self.options.update(max_len_a=where.max_len[0], max_len_b=where.max_len[1])
        self.dir, self.translator = where.work / "export" / system.name, None
        scorer, shortlist = system.options.get("scorer"), system.options.get("shortlist")
        int8 = system.options.get("quantization", "per-row") if system.options.get("precision") == "int8" else None
        export(system.checkpoint, where.data_bin, self.dir, int8=int8, config=DecodingConfig(**self.options),
               scorer=Path(scorer) if scorer else None, shortlist=Path(shortlist) if shortlist else None)

    def load(self, threads: int) -> None:
        self.translator = None
        self.translator = Translator(self.dir, intra_threads=threads)

    def translate(self, batch: list[list[str]], constraints: list[list[str]] | None = None,
                  max_batch_size: int = 0) -> list[Output]:
        before = self.translator.stats["passes"]
        given = constraints and [[c.split() for c in cs] for cs in constraints]  # ordered, as the system's options
        results = self.translator.translate_batch(batch, max_batch_size=max_batch_size or len(batch),
                                                  constraints=given, **self.options)
        self.counted += self.translator.stats["passes"] - before
        return [Output(r.hypotheses[0], r.iterations[0]) for r in results]


class CTranslate2(Engine):
    """The Transformer converted by CTranslate2 (``precision``: fp32 or int8), greedy (``beam``: beam search)."""

    whole_file = True

    def __init__(self, system: System, where: Where):
        from ctranslate2.converters import FairseqConverter  # a benchmark dependency only
        super().__init__(system, where)
        self.dir, self.translator = where.work / "ctranslate2" / system.name, None
        src, tgt = language_pair(where.data_bin)
        quantization = {"fp32": "float32", "int8": "int8"}[system.options.get("precision", "fp32")]
        FairseqConverter(str(system.checkpoint), str(where.data_bin), source_lang=src, target_lang=tgt).convert(
            str(self.dir), quantization=quantization, force=True)

    def load(self, threads: int) -> None:
        import ctranslate2
        self.translator = None
        self.translator = ctranslate2.Translator(str(self.dir), device="cpu", intra_threads=threads, inter_threads=1)

    def translate(self, batch: list[list[str]], constraints: list[list[str]] | None = None,
                  max_batch_size: int = 0) -> list[Output]:
        a, b = self.where.max_len  # fairseq's limit: a x (the longest source + the end marker) + b
        limit = min(int(a * (max(map(len, batch)) + 1) + b), 1023, self.system.options.get("max_steps", 1023))
        results = self.translator.translate_batch(batch, beam_size=self.system.options.get("beam", 1),
                                                  max_batch_size=max_batch_size or len(batch),
                                                  max_decoding_length=limit)
        return self.count([Output(list(r.hypotheses[0])) for r in results], max_batch_size)


ENGINES: dict[str, type[Engine]] = {"fairseq": Fairseq, "runtime": Runtime, "ctranslate2": CTranslate2}


class Timed(NamedTuple):
    outputs: list[Output]  # of the first round
    seconds: list[float]  # of every round
    passes: int


def decode(engine: Engine, inputs: Inputs, batches: list[list[int]], burn_in: bool = True
           ) -> tuple[list[Output], float, int]:
    """(outputs in line order, seconds, passes) of one decode of every batch, after a burn-in batch; an engine
    that takes a whole file (``whole_file``) decodes them in one call."""
    pick = (lambda idx: [inputs.constraints[i] for i in idx]) if inputs.constraints else (lambda idx: None)
    if burn_in:
        engine.translate([inputs.sources[i] for i in batches[0]], pick(batches[0]))
    gc.collect()
    outputs: list[Output] = [Output([])] * len(inputs.sources)
    passes, start = engine.passes(), time.perf_counter()
    if engine.whole_file and len(batches) > 1:  # one call, longest source first, cut by the engine
        order = [i for idx in batches for i in idx]
        got = engine.translate([inputs.sources[i] for i in order], pick(order), max_batch_size=len(batches[0]))
        for i, out in zip(order, got, strict=True):
            outputs[i] = out
    else:
        for idx in batches:
            for i, out in zip(idx, engine.translate([inputs.sources[i] for i in idx], pick(idx)), strict=True):
                outputs[i] = out
    return outputs, time.perf_counter() - start, engine.passes() - passes


def rounds(engines: dict[str, Engine], inputs: Inputs, batch: int, n: int = 3) -> dict[str, Timed]:
    """Every engine at ``batch``, taking turns (A, B, A, B ...) for ``n`` rounds; outputs of the first."""
    batches = schedule(inputs.sources, batch)
    timed: dict[str, Timed] = {}
    for _ in range(n):
        for name, engine in engines.items():
            outputs, seconds, passes = decode(engine, inputs, batches)
            first = timed.get(name, Timed(outputs, [], passes))
            timed[name] = first._replace(seconds=[*first.seconds, seconds])
    return timed


def profiled(engine: Engine, inputs: Inputs, batch: int, top: int = 10) -> dict:
    """One untimed decode under torch's profiler: aten ops per pass and the top ops by self CPU time."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        _, _, passes = decode(engine, inputs, schedule(inputs.sources, batch))
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events) or 1
    ranked = sorted(events, key=lambda e: -e.self_cpu_time_total)
    return {"aten_ops_per_pass": round(sum(e.count for e in events if e.key.startswith("aten::")) / max(passes, 1), 1),
            "top_ops": [{"op": e.key, "count": e.count, "share": round(e.self_cpu_time_total / total, 3)}
                        for e in ranked[:top]]}


def scored(timed: Timed, references: list[str], lang: str | None) -> dict:
    """A system's numbers: BLEU (detokenised sacreBLEU), lengths, iterations against floor(log2 n)+1,
    the median seconds of its rounds (every round kept) and its passes."""
    outs = timed.outputs
    gen = GenerateOutput(hypotheses={i: " ".join(o.tokens) for i, o in enumerate(outs)},
                         positional_scores={i: len(o.tokens) + 1 for i, o in enumerate(outs)})
    if all(o.iterations is not None for o in outs):
        gen.iterations = {i: o.iterations for i, o in enumerate(outs)}
    s, seconds = score(gen, references, lang), statistics.median(timed.seconds)
    return {**{k: s[k] for k in ("bleu", "brevity_penalty", "signature", "mean_length", "mean_iterations")},
            "mean_log2_bound": s["mean_log2_bound"] if s["mean_iterations"] is not None else None,
            "seconds": seconds, "seconds_by_round": list(timed.seconds), "sentences": len(outs),
            "sentences_per_s": len(outs) / seconds, "passes": timed.passes,
            "passes_per_sentence": timed.passes / len(outs), "ms_per_pass": 1000 * seconds / max(timed.passes, 1)}


def bleu(system: System, where: Where, inputs: Inputs, lang: str | None, batch: int = 128) -> float:
    """BLEU of one untimed decode (settings are chosen by it on valid)."""
    engine = ENGINES[system.engine](system, where)
    return scored(rounds({system.name: engine}, inputs, batch, 1)[system.name], inputs.references, lang)["bleu"]


def swept(system: System, where: Where, valid: Inputs, lang: str | None) -> tuple[System, dict]:
    """The system with its EOS penalty chosen by BLEU on ``valid`` (from ``system.sweep``), and every BLEU."""
    with_beta = lambda beta: replace(system, options={**system.options, "eos_penalty": beta}, sweep=())  # noqa: E731
    if len(system.sweep) < 2:
        return (with_beta(system.sweep[0]) if system.sweep else system), {}
    best, by_beta = choose_eos_penalty(system.sweep, lambda beta: bleu(with_beta(beta), where, valid, lang))
    return with_beta(best), by_beta
