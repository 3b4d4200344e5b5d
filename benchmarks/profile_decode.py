"""Profile insertion decoding: the current loop, and with ``--reference`` the frozen copy of
the loop before the per-pass work (``tests/reference_generator.py``), on the same checkpoint,
sentences and settings, one after the other in one process.

    python -m benchmarks.profile_decode --checkpoint CKPT --data DATA-BIN --sentences 100 \\
        --batch-size 1 --eos-penalty 2 --max-len-a 1.2 --max-len-b 10 --reference --out profile.json

Reports per loop: seconds, forward passes, aten ops per pass, the share of CPU time spent in
the vocabulary projection (``decoder.output_layer``) and the top ops by self CPU time.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import fairseq_insertion  # noqa: F401  registers the model, task and safe globals
from fairseq_insertion.generator import InsertionGenerator


def load(checkpoint: str, data: str):
    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": data})
    task.load_dataset("test")
    return models[0].eval(), task


def batches(task, n: int, batch_size: int) -> list[dict]:
    itr = task.get_batch_iterator(task.dataset("test"), max_sentences=batch_size, required_batch_size_multiple=1)
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
    parser.add_argument("--sentences", type=int, default=100, help="decode the first N test sentences")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--eos-penalty", type=float, default=0.0)
    parser.add_argument("--max-len-a", type=float, default=1.2)
    parser.add_argument("--max-len-b", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--top", type=int, default=10, help="how many ops to list")
    parser.add_argument("--reference", action="store_true",
                        help="also profile tests/reference_generator.py, the loop before the per-pass work")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here too")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, task = load(args.checkpoint, args.data)
    traced_projection(model)
    samples = batches(task, args.sentences, args.batch_size)
    kwargs = dict(decoding="parallel", eos_penalty=args.eos_penalty, max_len_a=args.max_len_a,
                  max_len_b=args.max_len_b, src_dict=task.source_dictionary)
    result = {"checkpoint": args.checkpoint, "batch_size": args.batch_size, "threads": torch.get_num_threads(),
              "current": run(InsertionGenerator(task.target_dictionary, **kwargs), model, samples, args.top)}
    if args.reference:
        from tests.reference_generator import ReferenceInsertionGenerator

        result["reference"] = run(ReferenceInsertionGenerator(task.target_dictionary, **kwargs), model, samples,
                                  args.top)
        result["speedup"] = round(result["reference"]["seconds"] / result["current"]["seconds"], 3)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
