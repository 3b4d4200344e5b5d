"""Profile insertion decoding: the current loop, and with ``--reference MODULE:CLASS`` another
generator class (the tests' frozen copy of the loop before the per-pass work,
``tests.reference_generator:ReferenceInsertionGenerator``), on the same checkpoint, sentences and
settings, one after the other in one process.

    python -m benchmarks.profile_decode --checkpoint CKPT --data DATA-BIN --sentences 100 \\
        --batch-size 1 --eos-penalty 2 --max-len-a 1.2 --max-len-b 10 --out profile.json \\
        --reference tests.reference_generator:ReferenceInsertionGenerator

Reports per loop: seconds, forward passes, aten ops per pass, the share of CPU time spent in
the vocabulary projection (``decoder.output_layer``) and the top ops by self CPU time, all under
the profiler; and from a second, unprofiled run: milliseconds per sentence, per pass (the whole
loop, encoder excluded) and per model pass (``decode_slots`` alone), and in the encoder.
``--precision`` converts the model first (``--decode-precision``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import fairseq_insertion  # noqa: F401  registers the model, task and safe globals
from fairseq_insertion.generator import InsertionGenerator
from fairseq_insertion.precision import PRECISIONS, for_decoding


def load(checkpoint: str, data: str):
    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": data})
    task.load_dataset("test")
    return models[0].eval(), task


def batches(task, n: int, batch_size: int) -> list[dict]:
    itr = task.get_batch_iterator(task.dataset("test"), max_sentences=batch_size, required_batch_size_multiple=1,
                                  disable_iterator_cache=True)
    out, seen = [], 0
    for sample in itr.next_epoch_itr(shuffle=False):
        if seen >= n:
            break
        out.append(sample)
        seen += sample["nsentences"]
    return out


def traced_projection(model) -> None:
    """Mark the vocabulary projection in the profile (both loops call decoder.output_layer)."""
    project = model.decoder.output_layer

    def marked(x):
        with record_function("vocabulary_projection"):
            return project(x)

    model.decoder.output_layer = marked


class Stopwatch:
    """Seconds and calls of a wrapped function (an attribute of ``owner``), while ``on``."""

    def __init__(self, owner, name: str):
        self.seconds, self.calls, self.on = 0.0, 0, False
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            if not self.on:
                return inner(*args, **kwargs)
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1

        setattr(owner, name, timed)


def timed(generator, model, samples: list[dict], encoder: Stopwatch, passes: Stopwatch) -> dict:
    """An unprofiled decode of ``samples``: ms per sentence, per pass and in the encoder."""
    for watch in (encoder, passes):
        watch.seconds, watch.calls, watch.on = 0.0, 0, True
    sync = torch.cuda.synchronize if next(model.parameters()).is_cuda else (lambda: None)
    with torch.no_grad():
        sync()
        start = time.perf_counter()
        n = sum(len(generator.generate([model], s)) for s in samples)
        sync()
        seconds = time.perf_counter() - start
    encoder.on = passes.on = False
    p = max(passes.calls, 1)
    return {"ms_per_sentence": round(seconds / n * 1e3, 3), "ms_per_pass": round((seconds - encoder.seconds) / p * 1e3,
                                                                                 3),
            "ms_per_model_pass": round(passes.seconds / p * 1e3, 3),
            "encoder_ms_per_sentence": round(encoder.seconds / n * 1e3, 3), "passes_per_sentence": round(p / n, 3)}


def run(generator, model, samples: list[dict], top: int) -> dict:
    with torch.no_grad():
        generator.generate([model], samples[0])  # warm-up
    passes0 = generator.stats["forward_passes"]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        with torch.no_grad():
            hyps = [h for s in samples for h in generator.generate([model], s)]
        seconds = time.perf_counter() - start
    passes = generator.stats["forward_passes"] - passes0
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    aten_ops = sum(e.count for e in events if e.key.startswith("aten::"))
    projection = next((e.cpu_time_total for e in events if e.key == "vocabulary_projection"), 0.0)
    ranked = sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]
    return {
        "seconds": round(seconds, 3),
        "sentences": len(hyps),
        "forward_passes": passes,
        "aten_ops_per_pass": round(aten_ops / max(passes, 1), 1),
        "vocabulary_projection_share": round(projection / max(total, 1), 3),
        "mean_iterations": sum(h[0]["steps"] for h in hyps) / max(len(hyps), 1),
        "top_ops": [{"op": e.key, "count": e.count, "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 1),
                     "share": round(e.self_cpu_time_total / max(total, 1), 3)} for e in ranked],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="an insertion_transformer checkpoint")
    parser.add_argument("--data", required=True, help="its data-bin directory (the test split is decoded)")
    parser.add_argument("--sentences", type=int, default=100,
                        help="decode the first N test sentences in fairseq's batch order (the shortest first)")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--eos-penalty", type=float, default=0.0)
    parser.add_argument("--max-len-a", type=float, default=1.2)
    parser.add_argument("--max-len-b", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32", help="as --decode-precision")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--top", type=int, default=10, help="how many ops to list")
    parser.add_argument("--reference", default=None, metavar="MODULE:CLASS",
                        help="also profile this generator class (importable from the working directory), e.g. "
                             "tests.reference_generator:ReferenceInsertionGenerator, the loop before the per-pass work")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here too")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, task = load(args.checkpoint, args.data)
    if args.device == "cuda":
        model.cuda()
    for_decoding(model, args.precision)
    traced_projection(model)
    samples = batches(task, args.sentences, args.batch_size)
    if args.device == "cuda":
        from fairseq import utils

        samples = [utils.move_to_cuda(s) for s in samples]
    kwargs = dict(decoding="parallel", eos_penalty=args.eos_penalty, max_len_a=args.max_len_a,
                  max_len_b=args.max_len_b, src_dict=task.source_dictionary,
                  block_neighbour_copies=True, no_repeat_ngram_size=3)  # the rules the results were timed with
    encoder, passes = Stopwatch(model.encoder, "forward"), Stopwatch(model, "decode_slots")
    generator = InsertionGenerator(task.target_dictionary, **kwargs)
    result = {"checkpoint": args.checkpoint, "batch_size": args.batch_size, "threads": torch.get_num_threads(),
              "precision": args.precision, "device": args.device,
              "current": run(generator, model, samples, args.top)}
    result["current"]["unprofiled"] = timed(generator, model, samples, encoder, passes)
    if args.reference:
        module, _, name = args.reference.partition(":")
        reference_class = getattr(importlib.import_module(module), name)
        kwargs.update(block_neighbour_copies=False, no_repeat_ngram_size=0)  # the reference loop has no such rules
        reference = reference_class(task.target_dictionary, **kwargs)
        result["reference"] = run(reference, model, samples, args.top)
        result["reference"]["unprofiled"] = timed(reference, model, samples, encoder, passes)
        result["speedup"] = round(result["reference"]["seconds"] / result["current"]["seconds"], 3)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
