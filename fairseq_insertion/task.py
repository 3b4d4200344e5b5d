"""``insertion_translation``: fairseq's translation task plus insertion decoding
options; builds the :class:`InsertionGenerator` and never drops a sentence."""


import io
import logging
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any, Optional, Tuple

import numpy as np
from fairseq.data import FairseqDataset
from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from torch import Tensor

from .checkpoints import dictionary_files, warm_start
from .constraints import ConstraintEncoder, ConstraintsFile, TextEncoders
from .generator import CONSTRAINT_ORDERS, DECODINGS, InsertionGenerator
from .model import InsertionTransformerModel
from .precision import PRECISIONS, for_decoding
from .rerank import AutoregressiveScorer

logger = logging.getLogger(__name__)


# repeated n-grams blocked by default: on Multi30k (the kit's warm-started model, 600 updates, valid, beta 2)
# n = 3 removed every sentence over 2 x its floor(log2 n)+1 + 2 iterations at no cost in BLEU
DEFAULT_REPEAT_NGRAM = 3


@dataclass
class InsertionTranslationConfig(TranslationConfig):
    decoding: ChoiceEnum(list(DECODINGS)) = field(  # type: ignore[valid-type]
        default="parallel",
        metadata={"help": "parallel: insert into every slot whose argmax is not end-of-slot; greedy: one "
                  "insertion per step (paper: Inference)"},
    )
    eos_penalty: float = field(
        default=0.0,
        metadata={"help": "beta, subtracted from the end-of-slot/sequence log-probability when decoding"},
    )
    max_iterations: int = field(
        default=0,
        metadata={"help": "stop a sentence after this many insertion iterations (0: its length limit, "
                  "min(max_len_a * src_len + max_len_b, max target positions - 2); fairseq's defaults 0 and 200 "
                  "become 2 x src_len + 10)"},
    )
    eos_penalties: Optional[str] = field(
        default=None,
        metadata={"help": "comma-separated betas, e.g. 0,1,2,3,4: decode every sentence under each in one batch "
                  "and output its candidates best first (--nbest k prints k), by the model's "
                  "length-normalised score or --rerank-with's; replaces --eos-penalty"},
    )
    rerank_with: Optional[str] = field(
        default=None,
        metadata={"help": "a fairseq transformer checkpoint trained on the same dictionaries (e.g. the "
                  "distillation teacher): choose among the --eos-penalties candidates by its length-normalised "
                  "log p(y | x), one teacher-forced batch per batch of sentences"},
    )
    allow_neighbour_copies: bool = field(
        default=False,
        metadata={"help": "let a slot insert a copy of either neighbour token; by default it may not (parallel "
                  "decoding otherwise grows runs like 'vor vor vor ...')"},
    )
    repeat_ngram_block: int = field(
        default=DEFAULT_REPEAT_NGRAM,
        metadata={"help": "no insertion may make an n-gram of the canvas of this size occur twice (0: off); "
                  "fairseq's --no-repeat-ngram-size, when given, takes precedence"},
    )
    close_ended_slots: bool = field(
        default=False,
        metadata={"help": "a slot whose best token is end-of-slot stays closed for the rest of the decode, so "
                  "later passes score only the open slots (models trained with slot finalization; can change "
                  "the output)"},
    )
    decode_precision: ChoiceEnum(list(PRECISIONS)) = field(  # type: ignore[valid-type]
        default="fp32",
        metadata={"help": "convert the models for decoding: bf16 (bfloat16 weights and activations; CPUs with "
                  "AVX512-BF16/AMX, GPUs with bf16), int8 (CPU: dynamic quantization of the linear layers); the "
                  "same conversion applies to --rerank-with's model and to an autoregressive transformer decoded "
                  "through this task (fairseq's beam search), so speeds compare like with like"},
    )
    constraints_file: Optional[str] = field(
        default=None,
        metadata={"help": "fairseq-generate: hard constraints for the test set, one line per sentence id, "
                  "constraints separated by tabs (___ marks a template gap); they go through --tokenizer/--bpe "
                  "when given, else must already be tokenised and BPE'd like the target. Order: --constraints"},
    )


@register_task("insertion_translation", dataclass=InsertionTranslationConfig)
class InsertionTranslationTask(TranslationTask):
    """Translation with an Insertion Transformer."""

    cfg: InsertionTranslationConfig

    def __init__(self, cfg: InsertionTranslationConfig, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        # --constraints-file, read here; build_generator checks it against the test set
        self.constraints_file = ConstraintsFile(cfg.constraints_file) if cfg.constraints_file else None
        self.text_encoders = TextEncoders()  # filled by build_tokenizer/build_bpe
        # datasets loaded for training: fairseq's size rule (see filter_indices_by_size)
        self._training_datasets: "weakref.WeakSet[FairseqDataset]" = weakref.WeakSet()

    def load_dataset(self, split: str, epoch: int = 1, combine: bool = False, **kwargs: Any) -> None:
        """fairseq-generate (and -validate) pass the checkpoint's saved task config as ``task_cfg``;
        fairseq-train does not: its splits are the training datasets."""
        super().load_dataset(split, epoch, combine, **kwargs)
        if kwargs.get("task_cfg") is None:
            self._training_datasets.add(self.datasets[split])

    def build_model(self, cfg, from_checkpoint: bool = False):
        model = super().build_model(cfg, from_checkpoint)
        if not from_checkpoint:  # a trained checkpoint never needs --init-from-transformer's file again
            warm_start(model, cfg, dictionary_files(self.cfg))
        return model

    def filter_indices_by_size(self, indices, dataset, max_positions=None, ignore_invalid_inputs=False):
        """For a dataset loaded for training (:meth:`load_dataset` without a
        saved task config: fairseq-train's train and valid splits), fairseq's
        rule (raise, or skip with --skip-invalid-size-inputs-valid-test). For
        any other (fairseq-generate's test set, fairseq-interactive's and the
        hub's lines), a line too long for the model is skipped with an error
        naming it, and every other line is translated."""
        if dataset in self._training_datasets:
            return super().filter_indices_by_size(indices, dataset, max_positions, ignore_invalid_inputs)
        indices, ignored = dataset.filter_indices_by_size(indices, max_positions)
        for i in ignored:
            start = self.source_dictionary.string(dataset.src[i][:6])
            logger.error("sentence %d (%r ...): %d source tokens exceed the model's limit (max positions %s); "
                         "skipped, not translated", i, start, dataset.src_sizes[i], max_positions)
        if len(ignored):
            logger.error("skipped %d over-long sentence(s): ids %s", len(ignored), list(map(int, ignored)))
        return indices

    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None,
                        prefix_allowed_tokens_fn=None):
        _tolerate_invalid_utf8_stdin()
        precision = str(self.cfg.decode_precision)
        for model in models:  # (fairseq's make_generation_fast_ makes model.eval() return None: no chaining)
            model.eval()
            for_decoding(model, precision)
        if not all(isinstance(m, InsertionTransformerModel) for m in models):
            if any(isinstance(m, InsertionTransformerModel) for m in models):
                raise ValueError("an ensemble of insertion and autoregressive models cannot be decoded together")
            # an autoregressive transformer (e.g. the teacher, timed beside the insertion model at the same
            # --decode-precision): fairseq's own generator
            return super().build_generator(models, args, seq_gen_cls, extra_gen_cls_kwargs,
                                           prefix_allowed_tokens_fn)
        constraint_order = getattr(args, "constraints", None)
        if constraint_order is not None and str(constraint_order) not in CONSTRAINT_ORDERS:
            # e.g. a plain GeneratorHubInterface.translate(..., constraints=["word"])
            raise ValueError("--constraints is ordered or unordered; constraints as text need the insertion hub "
                             "interface, fairseq_insertion.hub."
                             "from_pretrained(...) or InsertionHubInterface.from_hub(hub); "
                             f"got constraints={constraint_order!r}")
        if self.constraints_file is not None:
            self.constraints_file.check_sentences({split: len(ds) for split, ds in self.datasets.items()})
        betas = parse_eos_penalties(self.cfg.eos_penalties)
        rerank = None
        if self.cfg.rerank_with:
            if len(betas or ()) < 2:
                raise ValueError(f"--rerank-with {self.cfg.rerank_with} chooses among candidates: give several "
                                 "with --eos-penalties (e.g. 0,1,2,3,4)")
            device = next(models[0].parameters()).device if models else "cpu"
            rerank = AutoregressiveScorer.load(self.cfg.rerank_with, self.source_dictionary, self.target_dictionary,
                                               device, lenpen=getattr(args, "lenpen", 1.0),
                                               dictionaries=dictionary_files(self.cfg))
            for_decoding(rerank.model, precision)
        max_len_a, max_len_b = length_limit(getattr(args, "max_len_a", 0.0), getattr(args, "max_len_b", 200))
        return InsertionGenerator(
            self.target_dictionary,
            decoding=str(self.cfg.decoding),
            eos_penalty=self.cfg.eos_penalty,
            max_len_a=max_len_a,
            max_len_b=max_len_b,
            max_iterations=self.cfg.max_iterations,
            retain_history=getattr(args, "retain_iter_history", False),
            src_dict=self.source_dictionary,
            constraint_order=constraint_order,
            close_ended_slots=self.cfg.close_ended_slots,
            eos_penalties=betas,
            rerank=rerank,
            block_neighbour_copies=not self.cfg.allow_neighbour_copies,
            no_repeat_ngram_size=getattr(args, "no_repeat_ngram_size", 0) or self.cfg.repeat_ngram_block,
            lenpen=getattr(args, "lenpen", 1.0),
        )

    # --- constraints: fairseq-interactive's tab-separated ones, --constraints-file, the hub (hub.py)
    def build_tokenizer(self, args) -> ConstraintEncoder:
        """The tokenizer as fairseq-interactive's encoder of ``--constraints`` (decode: the tokenizer's); the
        raw one goes to :attr:`text_encoders`."""
        self.text_encoders.tokenizer = super().build_tokenizer(args)
        return ConstraintEncoder(self.text_encoders.tokenizer, self.target_dictionary, last=False)

    def build_bpe(self, args) -> ConstraintEncoder:
        """The BPE as fairseq-interactive's encoder of ``--constraints``; the raw one goes to
        :attr:`text_encoders`."""
        self.text_encoders.bpe = super().build_bpe(args)
        return ConstraintEncoder(self.text_encoders.bpe, self.target_dictionary, last=True)

    def get_interactive_tokens_and_lengths(self, lines, encode_fn):
        """fairseq-interactive's source lines. ``encode_fn`` is built from the constraint encoders
        :meth:`build_tokenizer`/:meth:`build_bpe` return, so sources go through the raw ones instead."""
        return super().get_interactive_tokens_and_lengths(lines, self.text_encoders.encode)

    def inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None,
                       constraints_by_id: Optional[Tensor] = None):
        """``constraints``: packed (B, C), fairseq-interactive's. Else ``constraints_by_id``: packed (N, C)
        for every sentence id (the hub's, through ``inference_step_args``), rows taken for the batch's ids;
        else those of ``--constraints-file``."""
        if constraints is None and constraints_by_id is not None:
            constraints = constraints_by_id[sample["id"].cpu()]  # (B, C)
        elif constraints is None and self.constraints_file is not None:
            constraints = self.constraints_file.packed(sample["id"].tolist(), self.text_encoders.encode,
                                                       self.target_dictionary)  # (B, C)
        if constraints is not None:
            constraints = constraints.to(sample["net_input"]["src_tokens"].device)
        return super().inference_step(generator, models, sample, prefix_tokens, constraints)

    def get_batch_iterator(self, dataset, *args: Any, **kwargs: Any):
        keep_remainder_batch(dataset)
        return super().get_batch_iterator(dataset, *args, **kwargs)


# fairseq's generation defaults (--max-len-a 0 --max-len-b 200) let a model that never
# chooses end-of-slot insert up to 200 tokens, one pass after another; an insertion
# decode's length is tied to the source instead (Multi30k en-de, BPE: no training
# target exceeds 2 x source + 10, 15 of 29,000 exceed 1.2 x source + 10)
DEFAULT_MAX_LEN_A, DEFAULT_MAX_LEN_B = 2.0, 10


def parse_eos_penalties(text: Optional[str]) -> Optional[Tuple[float, ...]]:
    """``--eos-penalties 0,1,2``: the betas, each a number (the option is named in the error)."""
    if text is None or not str(text).strip():
        return None
    try:
        return tuple(float(b) for b in str(text).split(","))
    except ValueError:
        raise ValueError(f"--eos-penalties takes comma-separated numbers, e.g. 0,1,2,3,4; got {text!r}") from None


def length_limit(max_len_a: float, max_len_b: int) -> Tuple[float, int]:
    """The insertion length limit a x source length + b: the given values, or 2 x source + 10
    in place of fairseq's defaults (0, 200)."""
    if (float(max_len_a), int(max_len_b)) == (0.0, 200):
        logger.info("insertion decoding: outputs of at most %g x source length + %d tokens (in place of fairseq's "
                    "--max-len-a 0 --max-len-b 200; set either to choose another limit)",
                    DEFAULT_MAX_LEN_A, DEFAULT_MAX_LEN_B)
        return DEFAULT_MAX_LEN_A, DEFAULT_MAX_LEN_B
    return float(max_len_a), int(max_len_b)


def keep_remainder_batch(dataset: FairseqDataset) -> None:
    """Make ``dataset.batch_by_size`` keep every sentence.

    fairseq drops the final batch when its size is not a multiple of
    ``--required-batch-size-multiple``; in training, validation and
    inference that silently loses sentences. Batches are consecutive runs
    of ``indices``, so whatever is missing is the tail: batch it on its own.
    """
    batch_by_size = dataset.batch_by_size
    if getattr(batch_by_size, "keeps_remainder", False):
        return

    def batch_all(indices, max_tokens=None, max_sentences=None, required_batch_size_multiple=1):
        batches = batch_by_size(indices, max_tokens=max_tokens, max_sentences=max_sentences,
                                required_batch_size_multiple=required_batch_size_multiple)
        covered = sum(len(b) for b in batches)
        if covered < len(indices):
            tail = np.asarray(indices[covered:], dtype=np.int64)
            logger.info("kept a final batch of %d sentences that fairseq would drop", len(tail))
            batches = list(batches) + [tail]
        return batches

    batch_all.keeps_remainder = True  # type: ignore[attr-defined]
    dataset.batch_by_size = batch_all


def _tolerate_invalid_utf8_stdin() -> None:
    """fairseq-interactive decodes standard input strictly: one invalid UTF-8
    byte would end the run. Replace such bytes with U+FFFD instead; the word
    holding it is then unknown, and the generator names its line."""
    stdin = sys.stdin
    if isinstance(stdin, io.TextIOWrapper) and stdin.errors == "strict":
        stdin.reconfigure(errors="replace")
        logger.info("invalid UTF-8 bytes in standard input are read as U+FFFD (reported as unknown words)")
