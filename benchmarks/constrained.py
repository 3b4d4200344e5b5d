"""Constrained benchmark: terminology constraints at the default size, the plugin against fairseq's
lexically constrained beam search on the autoregressive teacher.

From the repository root, with trained models (the kit's teacher and an insertion model warm-started
from it) and the raw Multi30k files::

    python -m benchmarks.constrained --out OUT --raw-dir RAW --teacher KIT/checkpoint.pt \\
        --data-bin KIT/data-bin --bpe-codes KIT/bpe.codes --insertion INS/checkpoint.pt [--quality-only]

What it does, one step after the other (each decode writes its file in OUT, reused by a later run into
the same OUT when its command is the same):

* the valid and test_2016_flickr sets, Moses-tokenised and BPE'd with ``--bpe-codes`` (checked token
  for token against the binarised test set of ``--data-bin``);
* the constraints: 1-2 reference n-grams of 1-3 whole words per sentence, drawn by
  ``examples/multi30k/constraints.py draw`` (seed 1), for valid (to choose settings) and test;
* the smallest beam fairseq's constrained beam search accepts (beams 1-5 tried on the first test lines);
* the settings of each insertion system chosen on valid with the valid constraints: the EOS penalty of
  the single decode, the candidate EOS penalties and ``--lenpen`` of the reranked decode;
* every system decoded on test with ``fairseq-interactive`` (the one interface that takes constraints
  for both models: ``source<TAB>constraint<TAB>...`` lines, ``--constraints ordered``), at batch 128 and
  at batch 1.

Systems: the teacher with fairseq's beam search, greedy and beam 5 unconstrained, beam 5 and the smallest
accepted beam constrained; per insertion model, parallel decoding (repetition rules on) and candidates
reranked by the teacher, each unconstrained and constrained. Reported per system: detokenised BLEU, the
constraints found as whole words (``constraints.py usage``), decode seconds at batch 1 and 128
(fairseq-interactive's translation time, without start-up), the batch-1 time against the teacher's
constrained beam 5, and how many outputs are the same at batch 1 and 128. ``--quality-only`` leaves the
seconds out (for a machine that is busy with something else); a later run without it into the same OUT
decodes the test set again and times it (the valid decodes are reused).

Writes ``OUT/constrained.json`` and ``OUT/constrained.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from examples.commands import REPETITION_RULES, REPO, RecipeError, fairseq_cli, interactive_command, run
from examples.generate_output import GenerateOutput, read_generate_output, read_reference, score
from examples.multi30k.constraints import draw, usage, write_constraints
from examples.multi30k.prepare import apply_bpe, find_raw_file, read_lines, tokenize, write_lines
from examples.steps import run_info

from .run import cached

SPLITS = (("val", "valid"), ("test_2016_flickr", "test"))
TIME_RE = re.compile(r"Total time: [\d.]+ seconds; translation time: ([\d.]+)")
CONSTRAINED_BEAM = 5  # fairseq's constrained beam search, as its documentation runs it
PROBE_LINES = 32  # test lines the beam probe decodes


@dataclass(frozen=True)
class Setup:
    """The run's settings, fixed once the arguments are read."""

    out: Path
    raw_dir: Path
    teacher: Path
    data_bin: Path
    bpe_codes: Path
    insertion: tuple[Path, ...]
    timed: bool = True
    lang: str = "de"
    seed: int = 1
    max_n: int = 3
    betas: tuple[float, ...] = (2.0, 3.0, 4.0, 5.0)
    candidate_sets: tuple[tuple[float, ...], ...] = ((2.0, 3.0, 4.0), (1.0, 2.0, 3.0, 4.0, 5.0),
                                                     (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0))
    lenpens: tuple[float, ...] = (1.0, 2.0)
    max_len: tuple[float, int] = (1.2, 10)  # the insertion model's length limit (the benchmark's)
    teacher_max_len: tuple[float, int] = (2.0, 50)  # fairseq's constrained beam search needs room
    batch: int = 128

    @property
    def data(self) -> Path:
        return self.out / "data"


@dataclass(frozen=True)
class System:
    """One decoding setup: model kind and checkpoint, constrained or not, its decoding flags."""

    name: str
    model: str  # "transformer" or "insertion"
    checkpoint: Path
    constrained: bool
    decoding: dict = field(default_factory=dict)  # examples.commands.decoding_args keywords
    extra: tuple[str, ...] = ()  # further flags (--lenpen)


# ------------------------------------------------------------------ data and constraints
def prepare_data(setup: Setup) -> dict:
    """valid and test, raw and tokenised + BPE'd with the kit's codes (the prepare.py layout), the
    data-bin linked; the BPE'd test target must be the binarised one, token for token."""
    data = setup.data
    for stem, split in SPLITS:
        for side, lang in (("src", "en"), ("tgt", setup.lang)):
            raw = read_lines(find_raw_file(setup.raw_dir, stem, lang))
            write_lines(data / "raw" / f"{split}.{side}", raw)
            write_lines(data / "tok" / f"{split}.{side}", apply_bpe(tokenize(raw, lang), setup.bpe_codes))
    link = data / "data-bin"
    if not link.exists():
        link.symlink_to(setup.data_bin.resolve(), target_is_directory=True)
    mismatched = check_bpe(setup.data_bin, data / "tok" / "test.tgt")
    if mismatched:
        raise RecipeError(f"{setup.bpe_codes} does not make {setup.data_bin}'s test set: lines {mismatched[:10]} "
                          "differ (give the codes the data-bin was made with)")
    return {"sentences": {split: len(read_reference(data / "raw" / f"{split}.src")) for _, split in SPLITS}}


def check_bpe(data_bin: Path, tok_tgt: Path) -> list[int]:
    """The test lines (0-based) whose BPE'd text does not encode to the binarised test target."""
    from fairseq.data import Dictionary, indexed_dataset

    d = Dictionary.load(str(data_bin / "dict.tgt.txt"))
    prefix = str(data_bin / "test.src-tgt.tgt")
    binarised = indexed_dataset.make_dataset(prefix, impl=indexed_dataset.infer_dataset_impl(prefix))
    lines = read_reference(tok_tgt)
    if binarised is None or len(binarised) != len(lines):
        return list(range(len(lines)))
    return [i for i, line in enumerate(lines)
            if d.encode_line(line, add_if_not_exist=False).tolist() != binarised[i].tolist()]


def draw_constraints(setup: Setup) -> dict:
    """The constraints of valid and test, and the inputs of fairseq-interactive with and without them."""
    counts = {}
    for _, split in SPLITS:
        drawn = draw(read_reference(setup.data / "tok" / f"{split}.tgt"), setup.seed, setup.max_n)
        write_constraints(setup.out / "constraints" / f"{split}.txt", drawn)
        sources = read_reference(setup.data / "tok" / f"{split}.src")
        write_lines(input_file(setup, split, False), sources)
        write_lines(input_file(setup, split, True), [s + "".join(f"\t{c}" for c in cs)
                                                    for s, cs in zip(sources, drawn)])
        counts[split] = {"constraints": sum(map(len, drawn)), "sentences_with_constraints": sum(map(bool, drawn))}
    return {"seed": setup.seed, "max_n": setup.max_n, **counts,
            "command": f"python examples/multi30k/constraints.py draw --data DATA --out OUT/constraints/test.txt "
                       f"--seed {setup.seed} --max-n {setup.max_n}"}


def input_file(setup: Setup, split: str, constrained: bool) -> Path:
    return setup.out / "inputs" / f"{split}.{'constrained' if constrained else 'plain'}.txt"


def read_constraints_of(setup: Setup, split: str) -> list[list[str]]:
    return [[c for c in line.split("\t") if c.strip()]
            for line in read_reference(setup.out / "constraints" / f"{split}.txt")]


# ------------------------------------------------------------------ decoding
def command(setup: Setup, system: System, batch: int) -> list[str]:
    """The fairseq-interactive command of ``system`` at ``batch`` sentences per batch (and buffer)."""
    a, b = setup.teacher_max_len if system.model == "transformer" else setup.max_len
    extra = ["--batch-size", batch, "--buffer-size", batch, "--max-len-a", f"{a:g}", "--max-len-b", b,
             *(["--constraints", "ordered"] if system.constrained else []),
             *(["--print-step"] if system.model == "insertion" else []), *system.extra]
    return interactive_command(setup.data_bin, system.checkpoint, system.model, "cpu", "src", "tgt",
                               extra=[str(x) for x in extra], **system.decoding)


def decode(setup: Setup, system: System, split: str, batch: int, out: Path, head: int | None = None) -> dict:
    """Translate ``split`` (its first ``head`` lines) into ``out``: BLEU, whole-word constraint usage,
    iterations, fairseq-interactive's translation seconds and the command."""
    src = input_file(setup, split, system.constrained)
    if head is not None:
        src = out.with_suffix(".input")
        write_lines(src, read_reference(input_file(setup, split, system.constrained))[:head])
    cmd = command(setup, system, batch)
    run(cmd, out.with_suffix(".log"), stdout=out, stdin=src)
    gen = read_generate_output(out, out.with_suffix(".log"))
    refs = read_reference(setup.data / "raw" / f"{split}.tgt")[:head]
    constraints = read_constraints_of(setup, split)[:head]
    found = TIME_RE.search(out.with_suffix(".log").read_text(errors="replace"))
    return {**score(gen, refs, setup.lang), **usage(constraints, gen.hypotheses),
            "translation_seconds": float(found.group(1)) if found else None, "command": shlex.join(cmd)}


def hypotheses(path: Path) -> GenerateOutput:
    return read_generate_output(path)


# ------------------------------------------------------------------ steps
def probe_beams(setup: Setup) -> dict:
    """The smallest beam (1-5) fairseq's constrained beam search decodes the first test lines with,
    and the error of each smaller one."""
    tried = {}
    for beam in range(1, CONSTRAINED_BEAM + 1):
        system = System(f"ar_beam{beam}_constrained", "transformer", setup.teacher, True, {"beam": beam})
        try:
            decode(setup, system, "test", PROBE_LINES, setup.out / "probe" / f"beam{beam}.out", head=PROBE_LINES)
        except Exception as exc:  # fairseq's own failure: recorded, the next beam tried
            tried[str(beam)] = last_error(str(exc))
            continue
        return {"smallest_beam": beam, "failed_beams": tried, "lines": PROBE_LINES}
    return {"smallest_beam": None, "failed_beams": tried, "lines": PROBE_LINES}


def last_error(text: str) -> str:
    errors = [ln.strip() for ln in text.splitlines() if "Error" in ln]
    return errors[-1] if errors else text.strip().splitlines()[0]


def insertion_systems(setup: Setup, checkpoint: Path, choices: dict) -> list[System]:
    """The four systems of one insertion model, with the settings chosen on valid (``choices``)."""
    name = model_name(checkpoint)
    out = []
    for constrained in (False, True):
        tag = "_constrained" if constrained else ""
        single, rerank = choices[f"parallel{tag}"], choices[f"rerank{tag}"]
        out += [System(f"{name}_parallel{tag}", "insertion", checkpoint, constrained,
                       {"decoding": "parallel", "eos_penalty": single["eos_penalty"]}),
                System(f"{name}_rerank{tag}", "insertion", checkpoint, constrained,
                       {"decoding": "parallel", "eos_penalties": tuple(rerank["eos_penalties"]),
                        "rerank_with": setup.teacher}, ("--lenpen", f"{rerank['lenpen']:g}"))]
    return out


def model_name(checkpoint: Path) -> str:
    """A system name prefix: the checkpoint's directory name (``multi30k-en-de-insertion-d256``)."""
    return checkpoint.resolve().parent.name


def choose_on_valid(setup: Setup, checkpoint: Path) -> dict:
    """For one insertion model, with and without the valid constraints: the best single EOS penalty
    and the best candidate set x --lenpen of the reranked decode, by valid BLEU."""
    choices = {}
    for constrained in (False, True):
        tag = "_constrained" if constrained else ""
        by_beta = {f"{b:g}": valid_bleu(setup, checkpoint, constrained, {"eos_penalty": b}, (), f"beta{b:g}")
                   for b in setup.betas}
        best = max(setup.betas, key=lambda b: by_beta[f"{b:g}"])
        choices[f"parallel{tag}"] = {"eos_penalty": best, "valid_bleu": by_beta}
        grid = {(cands, lenpen): valid_bleu(setup, checkpoint, constrained,
                                            {"eos_penalties": cands, "rerank_with": setup.teacher},
                                            ("--lenpen", f"{lenpen:g}"), f"rerank{_betas(cands, '-')}.lenpen{lenpen:g}")
                for cands in setup.candidate_sets for lenpen in setup.lenpens}
        cands, lenpen = max(grid, key=grid.get)
        choices[f"rerank{tag}"] = {"eos_penalties": list(cands), "lenpen": lenpen,
                                   "valid_bleu": {f"{_betas(c, ',')} lenpen {lp:g}": v for (c, lp), v in grid.items()}}
    return choices


def valid_bleu(setup: Setup, checkpoint: Path, constrained: bool, decoding: dict, extra: tuple[str, ...],
               file: str) -> float:
    """Valid BLEU of one insertion setting (its decode reused when there)."""
    work = setup.out / "valid" / model_name(checkpoint)
    name = f"{file}{'_constrained' if constrained else ''}"
    system = System("valid", "insertion", checkpoint, constrained, {"decoding": "parallel", **decoding}, extra)
    out = work / f"{name}.out"
    return cached(out.with_suffix(".json"), lambda: decode(setup, system, "valid", setup.batch, out))["bleu"]


def _betas(betas, sep: str) -> str:
    return sep.join(f"{b:g}" for b in betas)


def test_decode(setup: Setup, system: System, batch: int) -> dict:
    """``system`` on the whole test set at ``batch``; its seconds kept only in a timed run."""
    out = setup.out / "decode" / system.name / f"test.batch{batch}.out"
    result = decode(setup, system, "test", batch, out)
    seconds = result.pop("translation_seconds")
    return {**result, "timed": setup.timed, "decode_seconds": seconds if setup.timed else None}


# ------------------------------------------------------------------ report
def same_outputs(setup: Setup, name: str) -> dict:
    """How many test outputs are the same at batch 1 and at batch ``setup.batch``."""
    a, b = (hypotheses(setup.out / "decode" / name / f"test.batch{n}.out").hypotheses for n in (1, setup.batch))
    same = sum(a.get(i) == b.get(i) for i in b)
    return {"same": same, "sentences": len(b), "all_same": same == len(b) == len(a)}


def row(setup: Setup, system: System, done: dict, choice: dict | None) -> dict:
    t128, t1 = done.get(f"{system.name}:{setup.batch}", {}), done.get(f"{system.name}:1", {})
    return {
        "name": system.name, "model": system.model, "checkpoint": str(system.checkpoint),
        "constrained": system.constrained,
        "settings": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in system.decoding.items()},
                     **({"flags": list(system.extra)} if system.extra else {}),
                     **({"repetition_rules": list(REPETITION_RULES)} if system.model == "insertion" else {})},
        "chosen_on_valid": choice, "bleu": t128.get("bleu"), "bleu_signature": t128.get("signature"),
        "whole_word_constraints": t128.get("used"), "constraints": t128.get("constraints"),
        "whole_word_rate": t128.get("usage_rate"), "missed_ids": t128.get("missed_ids"),
        "mean_iterations": t128.get("mean_iterations"), "mean_log2_bound": t128.get("mean_log2_bound"),
        "mean_length": t128.get("mean_length"),
        "decode_seconds_batch1": t1.get("decode_seconds"),
        f"decode_seconds_batch{setup.batch}": t128.get("decode_seconds"),
        "same_outputs_batch1_batch128": (same_outputs(setup, system.name) if t1 and t128 else None),
        "command": t128.get("command"), "command_batch1": t1.get("command"),
    }


def add_targets(results: dict) -> None:
    """Batch-1 time against the teacher's constrained beam 5, and the targets."""
    rows = {r["name"]: r for r in results["systems"]}
    base = rows.get(f"ar_beam{CONSTRAINED_BEAM}_constrained", {})
    for r in results["systems"]:
        a, b = r.get("decode_seconds_batch1"), base.get("decode_seconds_batch1")
        r["batch1_time_vs_ar_beam5_constrained"] = round(a / b, 3) if a and b else None
    plugin = [r for r in results["systems"] if r["model"] == "insertion" and r["constrained"]]
    whole = [r["whole_word_rate"] for r in plugin if r["whole_word_rate"] is not None]
    targets = [{"metric": "constraints found as whole words, every constrained plugin system", "goal": "100%",
                "value": min(whole) if whole else None, "met": (min(whole) == 1.0) if whole else None}]
    for limit in (0.5, 0.25):
        fast = [r for r in plugin if r["batch1_time_vs_ar_beam5_constrained"] is not None
                and r["batch1_time_vs_ar_beam5_constrained"] <= limit and r["bleu"] is not None]
        best = max(fast, key=lambda r: r["bleu"]) if fast else None
        value = round(best["bleu"] - base["bleu"], 2) if best and base.get("bleu") is not None else None
        targets.append({"metric": f"best constrained plugin BLEU at <= {limit}x the batch-1 time of fairseq's "
                                  f"constrained beam {CONSTRAINED_BEAM}, minus its BLEU"
                                  + (f" ({best['name']})" if best else ""),
                        "goal": ">= 0", "value": value, "met": None if value is None else value >= 0})
    results["targets"] = targets


def fmt(x, digits: int = 2) -> str:
    return "n/a" if x is None else (f"{x:.{digits}f}" if isinstance(x, float) else str(x))


def markdown(results: dict) -> str:
    batch = results["batch"]
    timed = "" if results["timed"] else " Not timed (--quality-only): the seconds are left out."
    drawn = results.get("constraints") or {}
    lines = [f"Machine: {results['machine']}; {results['test_set']}; {fmt(drawn.get('test', {}).get('constraints'))} "
             f"constraints (seed {drawn.get('seed')}); fairseq-interactive, batch 1 and {batch}.{timed}",
             "", f"| system | constraints | BLEU | whole words | batch 1 s | vs AR beam {CONSTRAINED_BEAM} constrained "
             f"| batch {batch} s | same outputs at batch 1 and {batch} | settings |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results["systems"]:
        words = (f"{100 * r['whole_word_rate']:.1f}% ({r['whole_word_constraints']:,})"
                 if r["whole_word_rate"] is not None else "n/a")
        same = r["same_outputs_batch1_batch128"]
        same = "n/a" if same is None else f"{same['same']:,} / {same['sentences']:,}"
        settings = ", ".join(f"{k} {v}" for k, v in r["settings"].items() if k not in ("rerank_with",
                                                                                         "repetition_rules"))
        lines.append(f"| {r['name']} | {'yes' if r['constrained'] else 'no'} | {fmt(r['bleu'])} | {words} "
                     f"| {fmt(r['decode_seconds_batch1'], 1)} | {fmt(r['batch1_time_vs_ar_beam5_constrained'])} "
                     f"| {fmt(r[f'decode_seconds_batch{batch}'], 1)} "
                     f"| {same} | {settings} |")
    lines += ["", "| target | goal | measured | met |", "| --- | --- | --- | --- |"]
    for t in results.get("targets", []):
        met = "not measured" if t["met"] is None else ("yes" if t["met"] else "**no**")
        lines.append(f"| {t['metric']} | {t['goal']} | {fmt(t['value'], 3)} | {met} |")
    probe = results.get("beam_probe", {})
    if probe:
        lines += ["", f"fairseq's constrained beam search: smallest beam accepted {probe.get('smallest_beam')} "
                  f"(tried on the first {probe.get('lines')} test lines); "
                  + ("; ".join(f"beam {b}: {e}" for b, e in probe.get("failed_beams", {}).items()) or "no failures")]
    if results.get("failed"):
        lines += ["", "Failed steps: " + "; ".join(f"{k}: {v.splitlines()[0]}" for k, v in results["failed"].items())]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ the run
class Run:
    """One run: the steps done and failed, and ``OUT/constrained.json``."""

    def __init__(self, setup: Setup, results: dict):
        self.setup, self.results, self.done = setup, results, {}

    def step(self, key: str, fn: Callable[[], dict], path: Path | None = None) -> dict | None:
        """Run a step (or read its finished file); a failure is recorded and the run goes on."""
        print(f"[constrained] {key}", file=sys.stderr, flush=True)
        try:
            self.done[key] = cached(path, fn) if path is not None else fn()
            return self.done[key]
        except Exception as exc:  # recorded; the rest goes on
            self.results["failed"][key] = f"{type(exc).__name__}: {exc}"
            return None

    def test(self, system: System) -> None:
        """``system`` at batch ``setup.batch`` and 1; a finished decode is reused when it ran the same
        command, and, in a timed run, was timed."""
        for batch in (self.setup.batch, 1):
            path = self.setup.out / "decode" / system.name / f"test.batch{batch}.json"
            if path.is_file():
                before = json.loads(path.read_text())
                if (before.get("command") != shlex.join(command(self.setup, system, batch))
                        or (self.setup.timed and not before.get("timed"))):
                    path.unlink()
            self.step(f"{system.name}:{batch}", lambda b=batch: test_decode(self.setup, system, b), path)

    def all(self) -> int:
        s, out = self.setup, self.setup.out
        data = self.step("data", lambda: prepare_data(s), out / "data" / "data.json")
        if data is None:
            return self.write(1)
        self.results["test_set"] = f"test_2016_flickr ({data['sentences']['test']:,} sentences)"
        self.results["constraints"] = self.step("constraints", lambda: draw_constraints(s),
                                                out / "constraints" / "constraints.json")
        probe = self.step("beam probe", lambda: probe_beams(s), out / "probe" / "probe.json") or {}
        self.results["beam_probe"] = probe
        beams = sorted({1, CONSTRAINED_BEAM, *([probe["smallest_beam"]] if probe.get("smallest_beam") else [])})
        teacher = [System("ar_greedy", "transformer", s.teacher, False, {"beam": 1}),
                   System(f"ar_beam{CONSTRAINED_BEAM}", "transformer", s.teacher, False, {"beam": CONSTRAINED_BEAM}),
                   *[System(f"ar_beam{b}_constrained", "transformer", s.teacher, True, {"beam": b})
                     for b in beams if b == CONSTRAINED_BEAM or b == probe.get("smallest_beam")]]
        systems, choices = list(teacher), {}
        for checkpoint in s.insertion:
            chosen = self.step(f"valid:{model_name(checkpoint)}", lambda c=checkpoint: choose_on_valid(s, c))
            if chosen:
                for system in insertion_systems(s, checkpoint, chosen):
                    systems.append(system)
                    choices[system.name] = chosen[system.name[len(model_name(checkpoint)) + 1:]]
        for system in systems:
            self.test(system)
        self.results["systems"] = [row(s, system, self.done, choices.get(system.name)) for system in systems]
        return self.write(1 if self.results["failed"] else 0)

    def write(self, code: int) -> int:
        """``constrained.json`` and ``constrained.md``, this machine's paths written as placeholders."""
        add_targets(self.results)
        text, table = json.dumps(self.results, indent=2) + "\n", markdown(self.results)
        names = placeholders(self.setup)
        for path in sorted(names, key=len, reverse=True):
            text, table = text.replace(path, names[path]), table.replace(path, names[path])
        (self.setup.out / "constrained.json").write_text(text)
        (self.setup.out / "constrained.md").write_text(table)
        print(table)
        return code


def placeholders(setup: Setup) -> dict[str, str]:
    """This run's paths and their names in its results: REPO, OUT, RAW, KIT (the teacher's directory),
    MODELS (the directory of the kits, when the insertion models sit beside the teacher's; else INS1, INS2,
    ... for their directories), PYTHON and FAIRSEQ (where the fairseq-* commands are)."""
    names = {REPO: "REPO", setup.out: "OUT", setup.raw_dir: "RAW", setup.teacher.parent: "KIT",
             Path(sys.executable): "PYTHON"}
    for i, checkpoint in enumerate(setup.insertion, 1):
        beside = checkpoint.parent.parent == setup.teacher.parent.parent
        names[checkpoint.parent.parent if beside else checkpoint.parent] = "MODELS" if beside else f"INS{i}"
    cli = fairseq_cli("interactive")
    if len(cli) == 1:  # a fairseq-interactive script, not python -m fairseq_cli.interactive
        names[Path(cli[0]).parent] = "FAIRSEQ"
    return {str(path): name for path, name in names.items() if str(path) not in ("/", ".")}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.constrained", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--out", type=Path, required=True, help="work and results directory (finished steps are reused)")
    p.add_argument("--raw-dir", type=Path, required=True, help="the raw Multi30k files (val, test_2016_flickr)")
    p.add_argument("--teacher", type=Path, required=True, help="the fairseq transformer (constrained beam search, "
                   "and the reranker)")
    p.add_argument("--data-bin", type=Path, required=True, help="the teacher's data-bin (dictionaries, test set)")
    p.add_argument("--bpe-codes", type=Path, required=True, help="the subword-nmt codes the data-bin was made with")
    p.add_argument("--insertion", type=Path, nargs="+", required=True, help="insertion checkpoints (one set of "
                   "rows each, named by the checkpoint's directory)")
    p.add_argument("--quality-only", action="store_true",
                   help="BLEU, whole-word usage and batch-1 / batch-128 agreement, no seconds")
    p.add_argument("--betas", type=float, nargs="+", default=list(Setup.betas),
                   help="EOS penalties tried on valid for the single decode")
    p.add_argument("--candidates", nargs="+", default=[",".join(f"{b:g}" for b in c) for c in Setup.candidate_sets],
                   help="candidate EOS penalty sets tried on valid for the reranked decode, e.g. 1,2,3,4,5")
    p.add_argument("--lenpens", type=float, nargs="+", default=list(Setup.lenpens),
                   help="--lenpen values tried on valid for the reranked decode")
    p.add_argument("--seed", type=int, default=1, help="constraint drawing seed (default 1)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    setup = Setup(out, args.raw_dir.resolve(), args.teacher.resolve(), args.data_bin.resolve(),
                  args.bpe_codes.resolve(), tuple(p.resolve() for p in args.insertion), timed=not args.quality_only,
                  seed=args.seed, betas=tuple(args.betas),
                  candidate_sets=tuple(tuple(float(b) for b in c.split(",")) for c in args.candidates),
                  lenpens=tuple(args.lenpens))
    info = run_info("cpu")
    results = {"machine": info["machine"], "versions": info["versions"], "timed": setup.timed,
               "test_set": "test_2016_flickr", "batch": setup.batch,
               "max_len": {"insertion": list(setup.max_len), "transformer": list(setup.teacher_max_len)},
               "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "command": shlex.join([sys.executable, "-m", "benchmarks.constrained", *argv]),
               "teacher": str(setup.teacher), "insertion": [str(p) for p in setup.insertion], "systems": [],
               "failed": {}}
    return Run(setup, results).all()


if __name__ == "__main__":
    sys.exit(main())
