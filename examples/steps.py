"""The steps every recipe is made of, for any fairseq data-bin: train, distil, decode and score,
choose an EOS penalty on valid, plot iterations against length. Commands come from
:mod:`examples.commands`, outputs are read by :mod:`examples.generate_output`."""

from __future__ import annotations

import json
import math
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from sacrebleu.metrics import BLEU

from fairseq_insertion.canvas import log2_bound

from .commands import FAIRSEQ_NAT, RecipeError, generate_command, preprocess_command, run
from .generate_output import ScoreError, read_generate_output, remove_bpe, score


def language_pair(data_bin: Path, source_lang: str | None = None, target_lang: str | None = None) -> tuple[str, str]:
    """The (source, target) languages of a fairseq-preprocess directory: the given ones, else the one
    pair its files name (``test.src-tgt.src.idx``)."""
    if source_lang and target_lang:
        return source_lang, target_lang
    pairs = {tuple(p.name.split(".")[1].split("-", 1)) for p in data_bin.glob("*.*-*.*.idx")}
    if len(pairs) != 1:
        raise RecipeError(f"{data_bin}: {'no' if not pairs else 'several'} language pairs in its files "
                          f"{sorted(pairs)}; give --source-lang and --target-lang")
    return pairs.pop()  # type: ignore[return-value]


def train(cmd: Sequence[str], save_dir: Path) -> dict:
    """Run one ``fairseq-train`` command into ``save_dir``: its command, seconds and training speed. A process
    killed by a signal after fairseq logged the end of training and saved ``checkpoint_last.pt`` (seen once: an
    abort while the interpreter exited) is kept, with a warning naming the exit status; any other failure raises."""
    log = save_dir / "train.log"
    start = time.perf_counter()
    try:
        wall = run(cmd, log)
    except RecipeError as exc:
        finished = log.is_file() and "| done training in " in log.read_text(errors="replace")
        if not (finished and (save_dir / "checkpoint_last.pt").is_file() and "(exit -" in str(exc)):
            raise
        wall = time.perf_counter() - start
        print(f"warning: {str(exc).splitlines()[0].split(';')[0]} after it finished training and saved "
              f"{save_dir / 'checkpoint_last.pt'}: kept", file=sys.stderr, flush=True)
    if not (save_dir / "checkpoint_last.pt").is_file():
        raise RecipeError(f"training wrote no {save_dir / 'checkpoint_last.pt'}; log {log}")
    return {"command": shlex.join(cmd), "wall_seconds": wall, **training_speed(log), **training_losses(log)}


def training_speed(log: Path) -> dict:
    """Target tokens per second over the whole run, from fairseq's json epoch summaries:
    sum of target tokens (wpb x updates) over sum of training wall time."""
    tokens = wall = 0.0
    last = None
    for line in log.read_text(errors="replace").splitlines():
        if "{" not in line or '"train_wps"' not in line:
            continue
        stats = json.loads(line[line.index("{"):])
        updates = float(stats["train_num_updates"]) - (float(last["train_num_updates"]) if last else 0.0)
        tokens += float(stats["train_wpb"]) * updates
        wall += updates * float(stats["train_wpb"]) / max(float(stats["train_wps"]), 1e-9)
        last = stats
    if not wall:
        raise RecipeError(f"no training summary (train_wps) in {log}")
    return {"train_target_tokens_per_s": tokens / wall, "train_target_tokens": tokens,
            "train_updates": int(float(last["train_num_updates"]))}


def training_losses(log: Path) -> dict:
    """The losses in fairseq's json log lines: how many, whether every one is finite, the last one; with
    ``--fp16``, the updates skipped for a gradient overflow and the smallest loss scale."""
    losses, scales, overflows = [], [], 0
    for line in log.read_text(errors="replace").splitlines():
        overflows += "gradient overflow detected" in line
        if "{" not in line:
            continue
        try:
            stats = json.loads(line[line.index("{"):])
        except ValueError:
            continue
        losses += [float(stats[k]) for k in ("loss", "train_loss") if k in stats]
        scales += [float(stats[k]) for k in ("loss_scale", "train_loss_scale") if k in stats]
    return {"losses_logged": len(losses), "losses_finite": bool(losses) and all(map(math.isfinite, losses)),
            "last_loss": losses[-1] if losses else None, "gradient_overflows": overflows,
            **({"min_loss_scale": min(scales)} if scales else {})}


DISTILL_SELECT = ("top", "closest")


def closest_candidates(candidates: dict[int, list[str]], references: dict[int, str]) -> dict[int, str]:
    """Sequence-level interpolation (Kim and Rush, 2016): per sentence, the candidate (best first) with the
    highest sentence BLEU against the reference, on the text with BPE removed; ties go to the earlier one."""
    bleu = BLEU(effective_order=True)

    def closeness(hyp: str, ref: str) -> float:
        return bleu.sentence_score(remove_bpe(hyp), [remove_bpe(ref)]).score

    return {i: max(c, key=lambda h, r=references[i]: closeness(h, r)) for i, c in candidates.items()}


def distill(data_bin: Path, teacher: Path, out: Path, device: str = "cpu", beam: int = 5, max_tokens: int = 8192,
            max_len_a: float = 1.2, max_len_b: int = 10, pair: tuple[str, str] | None = None,
            select: str = "top") -> dict:
    """Sequence-level knowledge distillation: the teacher's beam-``beam`` translations replace the
    training targets (a sentence the teacher skips as too long is left out); valid and test keep
    their references. ``select``: ``top``, the teacher's best candidate, or ``closest``, of its
    ``beam`` candidates the one nearest the reference (:func:`closest_candidates`). Writes the data-bin
    ``out`` (same dictionaries) and its work files beside it."""
    if select not in DISTILL_SELECT:
        raise RecipeError(f"select must be one of {DISTILL_SELECT}, got {select!r}")
    src, tgt = pair or language_pair(data_bin)
    work = out.parent / (out.name + ".work")
    gen_out = work / "train.generate"
    nbest = ["--nbest", str(beam)] if select == "closest" else []
    cmd = generate_command(data_bin, teacher, "transformer", subset="train", batch_size=None, device=device,
                           max_len_a=max_len_a, max_len_b=max_len_b, post_process=None, beam=beam,
                           extra=["--max-tokens", max_tokens, "--skip-invalid-size-inputs-valid-test",
                                  "--source-lang", src, "--target-lang", tgt, *nbest])
    wall = run(cmd, work / "train.generate.log", stdout=gen_out)
    gen = read_generate_output(gen_out)  # S-, T- and H- lines keep the BPE: no --post-process
    ids = sorted(gen.hypotheses)
    if not ids:
        raise RecipeError(f"the teacher translated no training sentence; see {gen_out}")
    targets = closest_candidates(gen.candidates, gen.targets) if select == "closest" else gen.hypotheses
    (work / f"train.{src}").write_text("".join(gen.sources[i] + "\n" for i in ids), encoding="utf-8")
    (work / f"train.{tgt}").write_text("".join(targets[i] + "\n" for i in ids), encoding="utf-8")
    if out.exists():
        shutil.rmtree(out)
    pre = preprocess_command(out, src, tgt, trainpref=work / "train", srcdict=data_bin / f"dict.{src}.txt",
                             tgtdict=data_bin / f"dict.{tgt}.txt", workers=2)
    run(pre, work / "preprocess.log")
    for split in [*data_bin.glob("valid*.*-*.*"), *data_bin.glob("test*.*-*.*")]:
        shutil.copy(split, out / split.name)
    skipped = dataset_size(data_bin, "train", (src, tgt)) - len(ids)
    if skipped:
        print(f"distill: {skipped} training sentences left out (the teacher skipped them)", file=sys.stderr)
    changed = sum(targets[i] != gen.hypotheses[i] for i in ids)
    return {"command": shlex.join(cmd), "preprocess": shlex.join(pre), "decode_seconds": wall,
            "sentences": len(ids), "skipped": skipped, "select": select, "not_the_top_candidate": changed}


def dataset_size(data_bin: Path, subset: str, pair: tuple[str, str]) -> int:
    """The number of sentences of ``subset`` in a fairseq-preprocess directory."""
    from fairseq.data import indexed_dataset

    prefix = str(data_bin / f"{subset}.{pair[0]}-{pair[1]}.{pair[0]}")
    data = indexed_dataset.make_dataset(prefix, impl=indexed_dataset.infer_dataset_impl(prefix))
    if data is None:
        raise RecipeError(f"{prefix}.bin: no such dataset")
    return len(data)


def head_subset(data_bin: Path, subset: str, n: int, dest: Path, pair: tuple[str, str] | None = None) -> Path:
    """A data-bin ``dest`` whose ``subset`` is the first ``n`` sentences of ``data_bin``'s (same
    dictionaries), sliced with fairseq's indexed datasets; reused when there."""
    from fairseq.data import indexed_dataset

    src, tgt = pair or language_pair(data_bin)
    done = dest / f"{subset}.{src}-{tgt}.{tgt}.idx"
    if done.is_file():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    for lang in (src, tgt):
        shutil.copy(data_bin / f"dict.{lang}.txt", dest / f"dict.{lang}.txt")
        name = f"{subset}.{src}-{tgt}.{lang}"
        impl = indexed_dataset.infer_dataset_impl(str(data_bin / name))
        data = indexed_dataset.make_dataset(str(data_bin / name), impl=impl)
        if data is None:
            raise RecipeError(f"{data_bin / name}.bin: no such dataset")
        builder = indexed_dataset.make_builder(str(dest / f"{name}.bin"), impl=impl)
        for i in range(min(n, len(data))):
            builder.add_item(data[i])
        builder.finalize(str(dest / f"{name}.idx"))
    return dest


def decode(data_bin: Path, checkpoint: Path, out: Path, references: list[str], lang: str | None,
           model: str = "insertion", subset: str = "test", head: int | None = None,
           **generate) -> dict:
    """Translate ``subset`` (its first ``head`` sentences when given) into ``out`` and score it
    against ``references`` (raw lines; ``lang``: the Moses detokeniser's language, None for none).
    Returns BLEU, lengths, iterations, fairseq's generation seconds and the command."""
    if head is not None and head < len(references):
        data_bin = head_subset(data_bin, subset, head, out.parent / f"{subset}-head{head}")
        references = references[:head]
    cmd = generate_command(data_bin, checkpoint, model, subset=subset, **generate)
    run(cmd, out.with_suffix(".log"), stdout=out)
    gen = read_generate_output(out, out.with_suffix(".log"))
    try:
        result = score(gen, references, lang, p_specials=2 if model in FAIRSEQ_NAT else 1)
    except ScoreError as exc:
        raise RecipeError(f"{out}: {exc}") from exc
    if model == "transformer":  # one token per step: iterations = output length
        result["mean_iterations"] = result["mean_length"]
    if gen.insertion_summary:
        result["forward_passes"] = int(gen.insertion_summary["forward_passes"])
        result["passes_per_batch"] = gen.insertion_summary["passes_per_batch"]
    if gen.decode_seconds is None:
        raise RecipeError(f"no 'Translated ... sentences' line from fairseq-generate in {out.with_suffix('.log')}")
    return {**result, "decode_seconds": gen.decode_seconds, "command": shlex.join(cmd)}


# BLEU: betas whose valid scores lie this close to the best are equal within noise, and a larger beta lengthens
# every output (on test sets nobody tuned on, valid's maximum cost up to 1.3 BLEU against the smaller beta)
BETA_TOLERANCE = 0.1


def choose_eos_penalty(betas: Sequence[float], bleu_at: Callable[[float], float],
                       tolerance: float = BETA_TOLERANCE) -> tuple[float, dict[str, float]]:
    """The EOS penalty (paper: beta, swept 0-7) on valid: the smallest whose ``bleu_at(beta)`` lies within
    ``tolerance`` BLEU of the best, and every BLEU."""
    bleu = {f"{b:g}": bleu_at(float(b)) for b in betas}
    floor = max(bleu.values()) - tolerance - 1e-9
    return float(min(b for b in betas if bleu[f"{b:g}"] >= floor)), bleu


def plot_iterations(generate_output: Path, png: Path, title: str = "") -> dict:
    """Decoding iterations against output length n per sentence, with the lines n and
    floor(log2 n)+1 (the paper's iterations-vs-length figure)."""
    import logging

    import matplotlib

    matplotlib.use("Agg")
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib.pyplot as plt

    gen = read_generate_output(generate_output)
    if not gen.iterations:
        raise RecipeError(f"{generate_output} has no I- lines (run fairseq-generate with --print-step)")
    ids = sorted(gen.iterations)
    n = [max(0, gen.positional_scores[i] - 1) for i in ids]
    it = [gen.iterations[i] for i in ids]
    grid = list(range(1, max(n + [1]) + 1))
    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.scatter(n, it, s=8, alpha=0.35, label="sentences")
    ax.plot(grid, grid, "k--", lw=1, label="n (left to right)")
    ax.step(grid, [log2_bound(g) for g in grid], "r-", where="post", lw=1.2, label="floor(log2 n)+1")
    ax.set_xlabel("output length n (subword tokens)")
    ax.set_ylabel("decoding iterations")
    ax.set_ylim(0, max(it + [1]) + 2)
    ax.set_title(title or generate_output.name, fontsize=8)
    ax.legend(loc="upper left")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)
    over = sum(i - log2_bound(x) for i, x in zip(it, n)) / len(ids)
    return {"png": str(png), "sentences": len(ids), "mean_iterations_minus_bound": over}


def run_info(device: str) -> dict:
    """What a results file records about where it ran: the machine, the library versions and the threads."""
    import os
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines()
                      if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        cpu = fields.get("model name", cpu)
        if "cpu family" in fields:  # AMD's 25 is Zen 3/4, 26 Zen 5: kernels' speeds differ between them
            cpu += f" (cpu family {fields['cpu family']}, model {fields.get('model', '?')})"
    except OSError:
        pass
    machine = f"{cpu}, {os.cpu_count()} cores"
    if device == "cuda":
        import torch

        machine = f"{torch.cuda.get_device_name(0)}; {machine}"
    versions = {"python": platform.python_version()}
    for mod in ("torch", "fairseq", "sacrebleu"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:  # reported, not fatal
            versions[mod] = None
    return {"machine": machine, "versions": versions,
            "threads": os.environ.get("OMP_NUM_THREADS", str(os.cpu_count()))}
