"""Candidates and choosers: how much of the candidates' quality a chooser finds.

``collect`` decodes every sentence of a split under a grid of EOS penalties in one batch (the PyTorch
generator, the recipes' repetition rules) and keeps every candidate: its pieces, the model's log-probability
and length, and the teacher's log-probability of it (one teacher-forced pass, ``--teacher``). ``choose``
reads the collections of valid and test, makes the candidate sets (subsets of the grid; several models'
candidates pooled), tries every chooser with its settings chosen on valid, and writes one row per candidate
set and chooser with its valid and test BLEU and the oracle of the set (the candidate nearest each reference
by sentence BLEU: a ceiling, not a decode).

    python -m benchmarks.candidates collect --insertion INS/checkpoint.pt --teacher KIT/checkpoint.pt \\
        --data-bin KIT/data-bin --split valid --out OUT/NAME.valid.json [--betas 1,1.5,...,5.5]
    python -m benchmarks.candidates choose --collected NAME=OUT/NAME --valid-ref DATA/raw/valid.tgt \\
        --test-ref DATA/raw/test.tgt --out OUT/candidates [--pool NAME+NAME ...]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
from pathlib import Path
from typing import Callable, NamedTuple

import torch
from sacrebleu.metrics import BLEU, CHRF

from examples.generate_output import GenerateOutput, detokenized, read_reference
from examples.steps import closest_candidates

from . import harness as H
from . import report as T

GRID = tuple(1.0 + 0.5 * i for i in range(10))  # 1 .. 5.5
# candidate sets: the EOS penalties of each (+ 100 j: from the j-th best first insertion, collect --branch)
SETS = {"1": (3.5,), "3": (2.5, 3.5, 4.5), "5": (1.0, 2.0, 3.0, 4.0, 5.0), "5n": (2.5, 3.0, 3.5, 4.0, 4.5),
        "10": GRID, **{f"K{k}": tuple(3.5 + 100 * j for j in range(k)) for k in (2, 3, 4, 5)},
        "K3x3": tuple(b + 100 * j for j in range(3) for b in (2.5, 3.5, 4.5)),
        "K5x3": tuple(b + 100 * j for j in range(5) for b in (2.5, 3.5, 4.5))}


def collect(insertion: Path, teacher: Path, data_bin: Path, split: str, betas: tuple[float, ...],
            batch: int = 32, branch: int = 1) -> dict:
    """Every sentence of ``split`` decoded under each beta (and from each of its ``branch`` best first
    insertions: ``--first-insertions``): per sentence, a list of candidates ``[beta + 100 x first insertion,
    pieces, model log-prob, teacher log-prob, iterations]`` (log-probs summed, end included)."""
    where = H.Where(data_bin, Path("."))
    system = H.System("insertion", insertion, "fairseq", {
        "decoding": "parallel", "eos_penalties": ",".join(map(str, betas)), "first_insertions": branch,
        "lenpen": 0.0, "rerank_with": str(teacher), **H.REPETITION})
    engine = H.Fairseq(system, where)
    sources = H.pieces(data_bin, split)
    out: list[list] = [[] for _ in sources]
    for idx in H.schedule(sources, batch):
        with torch.no_grad():
            hypos = engine.generator.generate([engine.model], engine.sample([sources[i] for i in idx]))
        for i, cands in zip(idx, hypos, strict=True):
            out[i] = sorted([[h["eos_penalty"] + 100 * h.get("first_insertion", 0),
                              " ".join(engine.tgt[t] for t in h["tokens"][:-1].tolist()),
                              round(float(h["positional_scores"].sum()), 4), round(float(h["teacher_score"]), 4),
                              int(h["steps"])] for h in cands])
        print(f"{split}: {sum(1 for o in out if o)}/{len(out)}", file=sys.stderr, flush=True)
    return {"insertion": str(insertion), "teacher": str(teacher), "split": split, "betas": list(betas),
            "candidates": out}


class Candidate(NamedTuple):
    beta: float
    text: str  # detokenised
    length: int  # pieces + end
    model: float  # log-probability, summed
    teacher: float


Sentences = list[list[Candidate]]  # per sentence, its candidates (one per beta; equal texts kept: their weight)


def load(path: Path, lang: str) -> Sentences:
    """A collection's candidates, their text detokenised as the references are (``lang``; ``none``: the words
    joined by spaces)."""
    data = json.loads(path.read_text())
    pieces = sorted({p for cs in data["candidates"] for _, p, *_ in cs})  # each text detokenised once
    texts = dict(zip(pieces, detokenized(GenerateOutput(hypotheses=dict(enumerate(pieces))),
                                         None if lang == "none" else lang)))
    return [[Candidate(b, texts[p], len(p.split()) + 1, m, t) for b, p, m, t, _ in cs] for cs in data["candidates"]]


def subset(sentences: Sentences, betas: tuple[float, ...]) -> Sentences:
    return [[c for c in cs if c.beta in betas] for cs in sentences]


def pooled(*collections: Sentences) -> Sentences:
    return [[c for cs in group for c in cs] for group in zip(*collections, strict=True)]


Chooser = Callable[[list[Candidate]], int]
Utility = Callable[[str, str], float]  # agreement of a hypothesis with a reference, 0-1


def by_score(key: Callable[[Candidate], float]) -> Chooser:
    return lambda cs: max(range(len(cs)), key=lambda i: key(cs[i]))


def normalised(lenpen: float, teacher: float, model: float) -> Callable[[Candidate], float]:
    return lambda c: (teacher * c.teacher + model * c.model) / c.length ** lenpen


def utility(metric: str) -> Utility:
    """Sentence-level agreement of two texts (sacreBLEU's chrF or BLEU), cached."""
    scorer = CHRF() if metric == "chrf" else BLEU(effective_order=True)
    return functools.cache(lambda hyp, ref: scorer.sentence_score(hyp, [ref]).score / 100 if hyp != ref else 1.0)


def mbr(utility: Utility, weight: float = 0.0, lenpen: float = 1.0, temperature: float = 0.0) -> Chooser:
    """Minimum Bayes risk: the candidate of the highest expected utility against the others (each candidate
    row counts once: a text decoded under several betas weighs more; ``temperature`` > 0: rows weighted by
    the teacher's normalised score / temperature, softmax), plus ``weight`` x the teacher's normalised score."""
    def choose(cs: list[Candidate]) -> int:
        texts = sorted({c.text for c in cs})
        if temperature > 0:
            s = torch.tensor([c.teacher / c.length ** lenpen for c in cs]) / temperature
            w = torch.softmax(s, 0).tolist()
        else:
            w = [1.0 / len(cs)] * len(cs)
        gain = {t: sum(wi * utility(t, c.text) for wi, c in zip(w, cs)) for t in texts}
        return max(range(len(cs)), key=lambda i: gain[cs[i].text] + weight * cs[i].teacher / cs[i].length ** lenpen)
    return choose


def corpus_bleu(sentences: Sentences, chooser: Chooser, refs: list[str]) -> float:
    return BLEU().corpus_score([cs[chooser(cs)].text if cs else "" for cs in sentences], [refs]).score


def oracle(sentences: Sentences, refs: list[str]) -> float:
    """Corpus BLEU of each sentence's candidate nearest its reference by sentence BLEU (ties: the earlier one)."""
    texts = {i: [c.text for c in cs] or [""] for i, cs in enumerate(sentences)}
    best = closest_candidates(texts, dict(enumerate(refs)))
    return BLEU().corpus_score([best[i] for i in range(len(refs))], [refs]).score


def choosers() -> dict[str, dict[str, Chooser]]:
    """Each chooser's settings, by name: the setting is chosen on valid."""
    chrf, bleu = utility("chrf"), utility("bleu")
    lenpens = (0.5, 1.0, 1.5, 2.0, 3.0)
    return {
        "model": {f"lenpen {lp}": by_score(normalised(lp, 0.0, 1.0)) for lp in lenpens},
        "teacher": {f"lenpen {lp}, lambda {lam}": by_score(normalised(lp, 1.0, lam))
                    for lp, lam in itertools.product(lenpens, (0.0, 0.25, 0.5, 1.0))},
        "mbr chrF": {"uniform": mbr(chrf)},
        "mbr BLEU": {"uniform": mbr(bleu)},
        "mbr chrF, teacher-weighted": {f"lenpen {lp}, T {t}": mbr(chrf, lenpen=lp, temperature=t)
                                        for lp, t in itertools.product((1.0, 2.0), (0.05, 0.1, 0.2, 0.5))},
        "mbr chrF + teacher": {f"lenpen {lp}, mu {mu}": mbr(chrf, weight=mu, lenpen=lp)
                               for lp, mu in itertools.product((1.0, 2.0), (0.05, 0.1, 0.2, 0.5, 1.0))},
    }


def choose(valid: dict[str, Sentences], test: dict[str, Sentences], valid_refs: list[str], test_refs: list[str],
           only: list[str] | None = None, reuse: list[dict] | None = None) -> list[dict]:
    """Rows: every candidate set x chooser, its setting chosen on valid (and on each half of valid, to see
    whether the choice holds on the other half). ``reuse``: rows of an earlier run on the same collections,
    kept for the candidate sets they cover."""
    rows = []
    half = len(valid_refs) // 2
    for name in valid:
        earlier = [r for r in reuse or [] if r["candidates"] == name and (not only or r["chooser"] in only)]
        if earlier:
            rows += earlier
            continue
        v, t = valid[name], test[name]
        row = {"candidates": name, "per_sentence": round(sum(len(cs) for cs in t) / len(t), 2),
               "distinct": round(sum(len({c.text for c in cs}) for cs in t) / len(t), 2),
               "oracle_valid": round(oracle(v, valid_refs), 2), "oracle_test": round(oracle(t, test_refs), 2)}
        for chooser, settings in choosers().items():
            if only and chooser not in only:
                continue
            by = {k: corpus_bleu(v, c, valid_refs) for k, c in settings.items()}
            best = max(by, key=by.get)
            first = {k: corpus_bleu(v[:half], c, valid_refs[:half]) for k, c in settings.items()}
            pick1 = max(first, key=first.get)
            rows.append({**row, "chooser": chooser, "setting": best, "valid": round(by[best], 2),
                         "test": round(corpus_bleu(t, settings[best], test_refs), 2),
                         "valid_by_setting": {k: round(x, 2) for k, x in by.items()},
                         "held_out_half": {"chosen_on_first_half": pick1,
                                           "second_half": round(corpus_bleu(v[half:], settings[pick1],
                                                                            valid_refs[half:]), 2)}})
            print(json.dumps({k: rows[-1][k] for k in ("candidates", "chooser", "setting", "valid", "test",
                                                       "oracle_valid", "oracle_test")}), file=sys.stderr, flush=True)
    return rows


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.candidates", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    needed = {"required": True}
    c = T.flags(sub.add_parser("collect"), insertion=needed, teacher=needed, data_bin=needed)
    c.add_argument("--split", default="valid")
    c.add_argument("--betas", default=",".join(map(str, GRID)))
    c.add_argument("--batch", type=int, default=32)
    T.flags(c, threads=1)
    c.add_argument("--branch", type=int, default=1, help="decode from each of the K best first insertions too "
                   "(--first-insertions K; beta recorded + 100 x the first insertion's rank)")
    c.add_argument("--out", type=Path, required=True)
    h = sub.add_parser("choose")
    h.add_argument("--collected", nargs="+", required=True, metavar="NAME=PREFIX",
                   help="PREFIX.valid.json and PREFIX.test.json of collect")
    h.add_argument("--sets", nargs="+", default=list(SETS), help=f"subsets of the grid, of {list(SETS)}")
    h.add_argument("--pool", nargs="*", default=[], metavar="NAME+NAME[:SET]",
                   help="collections pooled, each restricted to SET (default 5)")
    h.add_argument("--choosers", nargs="*", default=None)
    h.add_argument("--valid-ref", type=Path, required=True)
    h.add_argument("--test-ref", type=Path, required=True)
    T.flags(h, lang="de")
    h.add_argument("--teacher-greedy", type=float, default=34.72, help="the teacher's greedy test BLEU")
    h.add_argument("--reuse", type=Path, help="an earlier choose's JSON on the same collections: its rows are "
                   "kept for the candidate sets it has")
    h.add_argument("--seeds", nargs="*", default=[], metavar="NAME",
                   help="collections of one recipe's models of other seeds: a table of their means")
    h.add_argument("--out", type=Path, required=True, help="OUT/NAME: writes NAME.json and NAME.md")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "collect":
        torch.set_num_threads(args.threads)
        betas = tuple(float(b) for b in args.betas.split(","))
        result = collect(args.insertion, args.teacher, args.data_bin, args.split, betas, args.batch, args.branch)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result) + "\n")
        return 0
    prefixes = dict(item.split("=", 1) for item in args.collected)
    loaded = {name: [load(Path(f"{prefix}.{split}.json"), args.lang) for split in ("valid", "test")]
              for name, prefix in prefixes.items()}
    sets = {f"{name} {s}": [subset(x, SETS[s]) for x in both] for name, both in loaded.items() for s in args.sets
            if set(SETS[s]) <= {c.beta for cs in both[1] for c in cs}}  # the sets each collection holds
    for names, _, s in (item.partition(":") for item in args.pool):
        sets[f"{names} {s or '5'}"] = [pooled(*(subset(loaded[n][k], SETS[s or "5"]) for n in names.split("+")))
                                       for k in (0, 1)]
    reuse = json.loads(args.reuse.read_text())["rows"] if args.reuse else None
    rows = choose({k: v for k, (v, _) in sets.items()}, {k: t for k, (_, t) in sets.items()},
                  read_reference(args.valid_ref), read_reference(args.test_ref), args.choosers, reuse)
    names = T.placeholders({"OUT": args.out.parent, "DATA": args.valid_ref.parent,
                            "COLLECTED": Path(next(iter(prefixes.values()))).parent})
    made = {name: json.loads(Path(prefix + ".test.json").read_text())["insertion"] for name, prefix in prefixes.items()}
    results = {**T.record("benchmarks.candidates", sys.argv[1:] if argv is None else argv),
               "teacher_greedy_test": args.teacher_greedy, "sets": {k: list(v) for k, v in SETS.items()},
               "collections": {name: "MODELS/" + "/".join(Path(p).parts[-2:]) for name, p in made.items()},  # the kit's
               "seeds": args.seeds, "rows": rows}
    T.save(args.out.with_suffix(".json"), results, markdown, names)
    return 0


def markdown(results: dict) -> str:
    g = results["teacher_greedy_test"]
    columns = [*T.keyed("candidates", "per_sentence", "distinct", "chooser", "setting", "valid", "test"),
               T.Column("test x teacher greedy", lambda r: r["test"] / g, 3),
               T.Column("valid, 2nd half (setting chosen on the 1st)", lambda r: r["held_out_half"]["second_half"]),
               *T.keyed("oracle_valid", "oracle_test")]
    lines = [f"# Candidates and choosers ({results['date'][:10]})", "", f"`{results['command']}`", "",
             *T.table(columns, results["rows"])]
    means = seed_means(results["rows"], results.get("seeds", []))
    if means:
        lines += ["", f"Mean of the seeds' models ({', '.join(results['seeds'])}):", "",
                  *T.table([*T.keyed("candidates", "chooser", "valid", "test"),
                            T.Column("test x teacher greedy", lambda r: r["test"] / g, 3),
                            T.Column("test by seed", lambda r: " / ".join(f"{x:.2f}" for x in r["tests"])),
                            *T.keyed("oracle_test")], means)]
    return "\n".join(lines) + "\n"


def seed_means(rows: list[dict], seeds: list[str]) -> list[dict]:
    """For every candidate set and chooser that each of the ``seeds`` collections has: the mean of their
    valid and test BLEU (each seed's setting chosen on its own valid)."""
    if len(seeds) < 2:
        return []
    by = {(r["candidates"].split(" ", 1)[0], r["candidates"].split(" ", 1)[1], r["chooser"]): r for r in rows}
    out = []
    for (name, subset_, chooser), _ in by.items():
        if name != seeds[0] or not all((s, subset_, chooser) in by for s in seeds):
            continue
        group = [by[s, subset_, chooser] for s in seeds]
        mean = {key: round(sum(r[key] for r in group) / len(group), 2) for key in ("valid", "test", "oracle_test")}
        out.append({"candidates": subset_, "chooser": chooser, **mean, "tests": [r["test"] for r in group]})
    return out


if __name__ == "__main__":
    sys.exit(main())
