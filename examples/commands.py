"""fairseq command lines, built in one place: ``fairseq-train``, ``fairseq-generate``,
``fairseq-interactive`` and ``fairseq-preprocess`` with the plugin's flags, for the plugin's
insertion models (``insertion``), fairseq's Transformer (``transformer``) and fairseq's own
non-autoregressive models: its NAT insertion model (``fairseq_nat``), mask-predict (``fairseq_cmlm``)
and the Levenshtein Transformer (``fairseq_levenshtein``); and running one with its log.

The recipes (``examples/warm_start.py``, ``examples/multi30k/recipe.py``) and the benchmark build
every command here; ``examples/steps.py`` runs them and reads their output back."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PLUGIN = REPO / "fairseq_insertion"
SAFE_LOAD = REPO / "examples" / "multi30k" / "fairseq_safe_load"  # plain fairseq checkpoints, weights_only
# fairseq's non-autoregressive models (task translation_lev, criterion nat_loss): arch, training noise and the
# model-specific flags of fairseq's examples/nonautoregressive_translation scripts
FAIRSEQ_NAT = {
    "fairseq_nat": ("insertion_transformer", "random_delete", ()),
    "fairseq_cmlm": ("cmlm_transformer", "random_mask",
                     ("--apply-bert-init", "--encoder-learned-pos", "--decoder-learned-pos")),
    "fairseq_levenshtein": ("levenshtein_transformer", "random_delete",
                            ("--apply-bert-init", "--encoder-learned-pos", "--decoder-learned-pos")),
}
MODELS = ("insertion", "transformer", *FAIRSEQ_NAT)


class RecipeError(RuntimeError):
    """A user-facing error of a recipe: bad input, or a fairseq command that failed."""


def fairseq_cli(name: str) -> list[str]:
    """``fairseq-<name>`` next to the running interpreter, on PATH, or ``python -m fairseq_cli.<name>``."""
    local = Path(sys.executable).parent / f"fairseq-{name}"
    if local.is_file():
        return [str(local)]
    found = shutil.which(f"fairseq-{name}")
    return [found] if found else [sys.executable, "-m", f"fairseq_cli.{name}"]


@dataclass(frozen=True)
class Size:
    """Encoder and decoder size (the same on both sides) and how the embeddings are shared."""

    layers: int = 3
    dim: int = 256
    heads: int = 4
    ffn: int = 1024
    share_all: bool = True  # --share-all-embeddings (else --share-decoder-input-output-embed if share_output)
    share_output: bool = True

    def args(self) -> list[str]:
        sizes = [
            "--encoder-layers", str(self.layers), "--decoder-layers", str(self.layers),
            "--encoder-embed-dim", str(self.dim), "--decoder-embed-dim", str(self.dim),
            "--encoder-ffn-embed-dim", str(self.ffn), "--decoder-ffn-embed-dim", str(self.ffn),
            "--encoder-attention-heads", str(self.heads), "--decoder-attention-heads", str(self.heads),
        ]  # fmt: skip
        if self.share_all:
            return sizes + ["--share-all-embeddings"]
        return sizes + (["--share-decoder-input-output-embed"] if self.share_output else [])

    def describe(self) -> str:
        shared = "shared embeddings" if self.share_all else "separate embeddings"
        return f"{self.layers}+{self.layers} layers, d={self.dim}, {self.heads} heads, FFN {self.ffn}, {shared}"

    @classmethod
    def from_checkpoint(cls, path: Path) -> Size:
        """The size of a fairseq Transformer checkpoint, from its saved config (raises RecipeError
        naming the file when it is not one, or when its encoder and decoder differ)."""
        import torch

        import examples.multi30k.fairseq_safe_load  # noqa: F401  argparse.Namespace on torch's safe list

        if not path.is_file():
            raise RecipeError(f"{path}: no such checkpoint")
        state = torch.load(path, map_location="cpu", weights_only=True)
        cfg = (state.get("cfg") or {}).get("model") or state.get("args")
        if cfg is None:
            raise RecipeError(f"{path}: no model config (cfg or args): not a fairseq checkpoint")
        get = cfg.get if isinstance(cfg, dict) else lambda k: getattr(cfg, k, None)
        sides = [tuple(get(f"{side}_{k}") for k in ("layers", "embed_dim", "attention_heads", "ffn_embed_dim"))
                 for side in ("encoder", "decoder")]
        if None in sides[0] or sides[0] != sides[1]:
            raise RecipeError(f"{path}: encoder {sides[0]} and decoder {sides[1]} (layers, dim, heads, ffn) must "
                              "be given and equal for the insertion model's --arch insertion_transformer")
        return cls(*map(int, sides[0]), share_all=bool(get("share_all_embeddings")),
                   share_output=bool(get("share_decoder_input_output_embed")))


def default_device() -> str:
    """cuda when torch sees a GPU, else cpu."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def device_args(device: str) -> list[str]:
    return ["--cpu"] if device == "cpu" else []


def train_command(
    data_bin: Path,
    save_dir: Path,
    model: str = "insertion",
    size: Size | None = None,
    updates: int = 1800,
    device: str = "cpu",
    order: str = "binary_tree",
    tau: float = 1.0,
    termination: str = "slot",
    max_tokens: int = 4096,
    seed: int = 1,
    lr: float = 1e-3,
    warmup: int = 400,
    linear_decay: bool = False,
    dropout: float = 0.1,
    label_smoothing: float = 0.1,
    clip_norm: float | None = 1.0,
    arch: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """One ``fairseq-train`` command. The schedule is inverse square root after ``warmup`` updates
    (from lr 1e-7), or with ``linear_decay`` a linear decay to 0 at ``updates``. ``arch``: a registered
    arch, whose own sizes then replace ``size``. ``extra``: further arguments, last."""
    sizes = (size or Size()).args() if arch is None else ["--share-all-embeddings"]
    arch = arch or {"insertion": "insertion_transformer", "transformer": "transformer",
                    **{m: a for m, (a, _, _) in FAIRSEQ_NAT.items()}}.get(model, "")
    if linear_decay:
        schedule = ["--lr-scheduler", "polynomial_decay", "--warmup-updates", str(warmup), "--total-num-update",
                    str(updates), "--end-learning-rate", "0", "--power", "1"]
    else:
        schedule = ["--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(warmup), "--warmup-init-lr", "1e-7"]
    common = [
        str(data_bin), "--save-dir", str(save_dir), "--arch", arch, *sizes,
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", f"{lr:g}", *schedule,
        *(["--clip-norm", f"{clip_norm:g}"] if clip_norm is not None else []), "--dropout", f"{dropout:g}",
        "--weight-decay", "0.0001", "--label-smoothing", f"{label_smoothing:g}", "--max-tokens", str(max_tokens),
        "--max-update", str(updates), "--seed", str(seed), "--no-epoch-checkpoints", "--disable-validation",
        "--log-format", "json", "--log-interval", "50", *device_args(device),
    ]  # fmt: skip
    if model == "insertion":
        specific = ["--user-dir", str(PLUGIN), "--task", "insertion_translation", "--criterion", "insertion_loss",
                    "--order", order, "--tau", f"{tau:g}", "--termination", termination]
    elif model == "transformer":
        specific = ["--task", "translation", "--criterion", "label_smoothed_cross_entropy"]
    elif model in FAIRSEQ_NAT:
        # fairseq's own models (no --user-dir: the plugin would replace fairseq's NAT insertion_transformer);
        # the NAT insertion model's --label-tau crashes on current torch, so it trains with uniform targets
        _, noise, flags = FAIRSEQ_NAT[model]
        specific = ["--task", "translation_lev", "--noise", noise, "--criterion", "nat_loss",
                    "--ddp-backend", "legacy_ddp", *flags]
    else:
        raise RecipeError(f"model must be one of {MODELS}, got {model!r}")
    return [*fairseq_cli("train"), *specific, *common, *map(str, extra)]


# The repetition rules the recipes decode with (off in the plugin by default, since they make outputs that
# repeat a token next to itself impossible). Multi30k en-de, the kit's warm-started model after 600 updates,
# valid, beta 2: 26.85 BLEU without them, 27.31 with them, and no sentence over 2 x floor(log2 n)+1 + 2
# iterations (4 without).
REPETITION_RULES = ("--block-neighbour-copies", "--no-repeat-ngram-size", "3")


def decoding_args(model: str, decoding: str = "parallel", beam: int = 1, eos_penalty: float = 0.0,
                  eos_penalties: Sequence[float] = (), rerank_with: Path | None = None,
                  precision: str | None = None, repetition_rules: bool = True, iterations: int = 10,
                  length_beam: int = 1) -> list[str]:
    """The task and decoding flags of ``model``, the same for fairseq-generate and fairseq-interactive.
    Insertion models: ``eos_penalties`` decodes every sentence under each (candidates), ``rerank_with``
    chooses among them with that Transformer, ``repetition_rules`` adds :data:`REPETITION_RULES`.
    ``precision``: the plugin's ``--decode-precision`` (fp32, bf16, int8), for a Transformer too (then
    decoded through the plugin's task by fairseq's generator). fairseq's non-autoregressive models: at most
    ``iterations`` refinement passes (mask-predict's T), ``length_beam`` length candidates
    (``--iter-decode-with-beam``), ``eos_penalty`` as ``--iter-decode-eos-penalty``."""
    if model == "insertion":
        args = ["--user-dir", str(PLUGIN), "--task", "insertion_translation", "--decoding", decoding,
                "--eos-penalty", f"{eos_penalty:g}", *(REPETITION_RULES if repetition_rules else ())]
        if eos_penalties:
            args += ["--eos-penalties", ",".join(f"{b:g}" for b in eos_penalties)]
        if rerank_with is not None:
            args += ["--rerank-with", str(rerank_with)]
    elif model == "transformer":
        task = ["--user-dir", str(PLUGIN), "--task", "insertion_translation"] if precision else [
            "--user-dir", str(SAFE_LOAD), "--task", "translation"]
        args = [*task, "--beam", str(beam)]
    elif model in FAIRSEQ_NAT:
        if iterations < 1 or length_beam < 1:
            raise RecipeError(f"iterations and length_beam must be >= 1, got {iterations} and {length_beam}")
        # fairseq runs --iter-decode-max-iter + 1 decoder passes
        args = ["--user-dir", str(SAFE_LOAD), "--task", "translation_lev", "--iter-decode-max-iter",
                str(iterations - 1), "--iter-decode-eos-penalty", f"{eos_penalty:g}", "--beam", "1",
                *(["--iter-decode-with-beam", str(length_beam)] if length_beam > 1 else [])]
    else:
        raise RecipeError(f"model must be one of {MODELS}, got {model!r}")
    if precision is not None:
        if model in FAIRSEQ_NAT:
            raise RecipeError(f"precision: insertion and transformer models only, not {model}")
        args += ["--decode-precision", precision]
    return args


def generate_command(
    data_bin: Path,
    checkpoint: Path,
    model: str = "insertion",
    subset: str = "test",
    batch_size: int | None = 128,
    device: str = "cpu",
    max_len_a: float = 0.0,
    max_len_b: int = 200,
    post_process: str | None = "subword_nmt",
    extra: Sequence[str] = (),
    **decoding,
) -> list[str]:
    """One ``fairseq-generate`` command: outputs of at most ``max_len_a`` x source length +
    ``max_len_b`` tokens (the same limit for every model), I- lines (decoding iterations) for the
    non-autoregressive models. ``decoding``: :func:`decoding_args`'s keyword arguments."""
    cmd = [
        *fairseq_cli("generate"), str(data_bin), "--path", str(checkpoint), "--gen-subset", subset,
        "--required-batch-size-multiple", "1", "--max-len-a", f"{max_len_a:g}", "--max-len-b", str(max_len_b),
        *device_args(device), *decoding_args(model, **decoding),
    ]  # fmt: skip
    if batch_size is not None:
        cmd += ["--batch-size", str(batch_size)]
    if post_process:
        cmd += ["--post-process", post_process]
    if model != "transformer":  # fairseq's sequence generator has no iterations to print
        cmd.append("--print-step")
    return cmd + [str(x) for x in extra]


def interactive_command(data_bin: Path, checkpoint: Path, model: str = "insertion", device: str = "cpu",
                        source_lang: str | None = None, target_lang: str | None = None,
                        extra: Sequence[str] = (), **decoding) -> list[str]:
    """One ``fairseq-interactive`` command (sentences on standard input, one per line)."""
    langs = [*(["--source-lang", source_lang] if source_lang else []),
             *(["--target-lang", target_lang] if target_lang else [])]
    return [*fairseq_cli("interactive"), str(data_bin), "--path", str(checkpoint), *langs, *device_args(device),
            *decoding_args(model, **decoding), *map(str, extra)]


def preprocess_command(destdir: Path, source_lang: str = "src", target_lang: str = "tgt",
                       trainpref: Path | None = None, validpref: Path | None = None, testpref: Path | None = None,
                       srcdict: Path | None = None, tgtdict: Path | None = None, joined: bool = False,
                       workers: int = 1) -> list[str]:
    """One ``fairseq-preprocess`` command: the given splits, with the given dictionaries (or a
    joined one learnt from the training set)."""
    given = [("--trainpref", trainpref), ("--validpref", validpref), ("--testpref", testpref),
             ("--srcdict", srcdict), ("--tgtdict", tgtdict)]
    return [*fairseq_cli("preprocess"), "--source-lang", source_lang, "--target-lang", target_lang,
            *[x for flag, path in given if path is not None for x in (flag, str(path))],
            "--destdir", str(destdir), *(["--joined-dictionary"] if joined else []), "--workers", str(workers)]


def run(cmd: Sequence[str], log: Path, stdout: Path | None = None, stdin: Path | None = None,
        codes: Sequence[int] = (0,)) -> float:
    """Run ``cmd`` with its output in ``log`` (stdout in ``stdout`` when given, standard input from
    ``stdin``); return its wall seconds. Raises RecipeError with the log's tail when it fails (an exit status
    not in ``codes``)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"+ {shlex.join(cmd)}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    with log.open("w") as err, (stdout.open("w") if stdout else log.open("a")) as out, \
            (stdin or Path(os.devnull)).open() as inp:
        rc = subprocess.run(list(cmd), stdin=inp, stdout=out, stderr=err, check=False).returncode
    if rc not in codes:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-15:])
        raise RecipeError(f"command failed (exit {rc}); log {log}:\n{tail}")
    return time.perf_counter() - start
