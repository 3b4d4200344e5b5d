"""``insertion_translation``: fairseq's translation task plus insertion decoding
options; builds the :class:`InsertionGenerator` and never drops a sentence."""


import dataclasses
import logging
import weakref
from dataclasses import field
from typing import Any, List, Optional, Tuple

from fairseq.data import FairseqDataset
from fairseq.dataclass import ChoiceEnum
from fairseq.dataclass.configs import GenerationConfig
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from torch import Tensor

from .checkpoints import check_checkpoint_file, dictionary_files, warm_start
from .config import (
    CONSTRAINT_ORDERS,
    FLAGS,
    INSERTION_ONLY,
    TASK_OPTIONS,
    DecodingConfig,
    DecodingError,
    check_search_options,
)
from .constraints import ConstraintEncoder, ConstraintsFile, TextEncoders
from .fairseq_fixes import (
    EMPTY_SOURCE,
    atomic_checkpoint_copies,
    command_line_checkpoints,
    command_line_root,
    keep_remainder_batch,
    tolerant_interactive_input,
    tolerate_invalid_utf8_stdin,
)
from .generator import InsertionGenerator
from .model import InsertionTransformerModel
from .precision import for_decoding
from .rerank import AutoregressiveScorer

logger = logging.getLogger(__name__)

# fairseq's generation options (--beam, --sampling, ...) for an insertion model. Read: by DecodingConfig, or by
# fairseq's command lines around the generator (--nbest, --print-step, ...); --beam is 1 or fairseq's 5 in the
# hub's calls. Refused: they need what insertion decoding does not give. Any other, away from fairseq's default,
# is named in a warning as ignored (with the plugin's own option for the same thing, where there is one)
GENERATION_READ = ("_name", "nbest", "max_len_a", "max_len_b", "lenpen", "unkpen", "no_repeat_ngram_size",
                   "constraints", "retain_iter_history", "print_step", "sacrebleu", "retain_dropout",
                   "retain_dropout_modules", "no_seed_provided")
GENERATION_REFUSED = {
    "prefix_size": "a target prefix to continue left to right",
    "score_reference": "a model that scores a given target left to right",
    "print_alignment": "attention alignments",
    "replace_unk": "attention alignments",
    "lm_path": "a left-to-right search to fuse a language model into",
}
GENERATION_INSTEAD = {"beam": "--eos-penalties", "iter_decode_eos_penalty": "--eos-penalty",
                      "iter_decode_max_iter": "--max-iterations", "iter_decode_with_beam": "--eos-penalties",
                      "iter_decode_with_external_reranker": "--rerank-with"}


def task_field(option: dataclasses.Field) -> Tuple[str, Any, dataclasses.Field]:
    """A :class:`DecodingConfig` field as a field of the task's config: named after its flag, with its help; a choice is
    a ChoiceEnum, the EOS penalties (comma-separated) and a checkpoint path an optional string (None: not given)."""
    name = option.metadata["flag"][2:].replace("-", "_")
    if option.metadata["choices"]:
        kind: Any = ChoiceEnum(list(option.metadata["choices"]))
    elif option.default is None or isinstance(option.default, tuple):
        kind = Optional[str]
    else:
        kind = type(option.default)
    default = None if kind is Optional[str] else option.default
    return name, kind, field(default=default, metadata={"help": option.metadata["help"]})


# fairseq's translation options, every DecodingConfig option fairseq's generation options lack (TASK_OPTIONS),
# and the constraints of fairseq-generate's test set
InsertionTranslationConfig = dataclasses.make_dataclass(
    "InsertionTranslationConfig",
    [*(task_field(f) for f in dataclasses.fields(DecodingConfig) if f.name in TASK_OPTIONS),
     ("constraints_file", Optional[str], field(default=None, metadata={
         "help": "fairseq-generate: hard constraints for the test set, one line per sentence id, constraints "
         "separated by tabs (___ marks a template gap); they go through --tokenizer/--bpe when given, else must "
         "already be tokenised and BPE'd like the target. Order: --constraints"}))],
    bases=(TranslationConfig,), namespace={"__module__": __name__})


@register_task("insertion_translation", dataclass=InsertionTranslationConfig)
class InsertionTranslationTask(TranslationTask):
    """Translation with an Insertion Transformer."""

    cfg: InsertionTranslationConfig

    def __init__(self, cfg: InsertionTranslationConfig, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        atomic_checkpoint_copies()  # fairseq-train's checkpoint_last.pt: never left half copied
        # a decoding option that means nothing is refused before any work (fairseq's command lines: one line,
        # `prog: error: ...`, status 2: see the package's __init__)
        root = command_line_root(cfg)  # fairseq's generation options (--beam, --nbest, ...), before any model loads
        generation = root.get("generation") if root is not None else None
        DecodingConfig.from_options(cfg, generation)
        check_search_options(generation)
        for path in command_line_checkpoints(cfg):  # fairseq-generate/-interactive --path, loaded next
            check_checkpoint_file(path, "--path")
        # --constraints-file, read here; build_generator checks it against the test set
        self.constraints_file = ConstraintsFile(cfg.constraints_file) if cfg.constraints_file else None
        self.text_encoders = TextEncoders()  # filled by build_tokenizer/build_bpe
        # datasets loaded for training: fairseq's size rule (see filter_indices_by_size)
        self._training_datasets: "weakref.WeakSet[FairseqDataset]" = weakref.WeakSet()
        self._interactive_lines_read = 0  # fairseq-interactive numbers its lines per buffer; the task counts them

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
        """For a dataset loaded for training (:meth:`load_dataset`), fairseq's rule (raise, or skip with
        --skip-invalid-size-inputs-valid-test); for any other, a line too long for the model is skipped with an error
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
        """The insertion generator for ``args`` (fairseq's generation options, or the hub's keywords) and this task's
        options, through one :class:`DecodingConfig`; an autoregressive transformer gets fairseq's own generator."""
        tolerate_invalid_utf8_stdin()
        tolerant_interactive_input(self.cfg)  # and standard input's lines of constraints alone
        constraint_order = getattr(args, "constraints", None)
        if constraint_order is not None and str(constraint_order) not in CONSTRAINT_ORDERS:
            # e.g. a plain GeneratorHubInterface.translate(..., constraints=["word"])
            raise ValueError("--constraints is ordered or unordered; constraints as text need the insertion hub "
                             "interface, fairseq_insertion.hub.from_pretrained(...) or "
                             f"InsertionHubInterface.from_hub(hub); got constraints={constraint_order!r}")
        config = DecodingConfig.from_options(self.cfg, args)
        check_search_options(args)
        for model in models:  # (fairseq's make_generation_fast_ makes model.eval() return None: no chaining)
            model.eval()
            for_decoding(model, config.precision)
        if not all(isinstance(m, InsertionTransformerModel) for m in models):
            if any(isinstance(m, InsertionTransformerModel) for m in models):
                raise ValueError("an ensemble of insertion and autoregressive models cannot be decoded together")
            # an autoregressive transformer (e.g. the teacher, timed beside the insertion model at the same
            # --decode-precision): fairseq's own generator, which the insertion decoding options do not reach
            defaults = DecodingConfig()  # every decoding default lives there
            unused = [FLAGS[f] for f in INSERTION_ONLY if getattr(config, f) != getattr(defaults, f)]
            if unused:
                logger.warning("an autoregressive model is decoded by fairseq's beam search: %s apply to "
                               "insertion models only and are not used", ", ".join(unused))
            return super().build_generator(models, args, seq_gen_cls, extra_gen_cls_kwargs, prefix_allowed_tokens_fn)
        # fairseq's generation options: each read, refused naming it (GENERATION_REFUSED), or named as ignored
        ignored = []
        for f in dataclasses.fields(GenerationConfig):
            value = getattr(args, f.name, f.default)
            flag, keyword = "--" + f.name.replace("_", "-"), f.name
            if (f.name in GENERATION_READ or value == f.default or str(value) == str(f.default)
                    or f.name == "beam" and value == 1):
                continue
            if f.name in GENERATION_REFUSED:
                raise DecodingError(f"{flag} ({keyword}=) needs {GENERATION_REFUSED[f.name]}, which insertion "
                                    f"decoding does not have; got {value!r}")
            instead = f" (insertion decoding: {GENERATION_INSTEAD[f.name]})" if f.name in GENERATION_INSTEAD else ""
            ignored.append(f"{flag}{'' if value is True else f' {value}'}{instead}")
        if ignored:
            logger.warning("insertion decoding does not read %s: ignored", ", ".join(ignored))
        nbest = getattr(args, "nbest", 1) or 1
        if nbest > len(config.betas):
            logger.warning("--nbest %d: insertion decoding gives one hypothesis per EOS penalty, %d here (give "
                           "several with --eos-penalties B1,B2,...)", nbest, len(config.betas))
        if self.constraints_file is not None:
            self.constraints_file.check_sentences({split: len(ds) for split, ds in self.datasets.items()})
        rerank = None
        if config.rerank_with:
            device = next(models[0].parameters()).device if models else "cpu"
            rerank = AutoregressiveScorer.load(config.rerank_with, self.source_dictionary, self.target_dictionary,
                                               device, lenpen=config.lenpen, dictionaries=dictionary_files(self.cfg))
            for_decoding(rerank.model, config.precision)
        return InsertionGenerator(self.target_dictionary, config, src_dict=self.source_dictionary, rerank=rerank)

    # --- constraints: fairseq-interactive's tab-separated ones, --constraints-file, the hub (hub.py)
    def build_tokenizer(self, args) -> ConstraintEncoder:
        """The tokenizer as fairseq-interactive's encoder of ``--constraints`` (decode: the tokenizer's); the
        raw one goes to :attr:`text_encoders`."""
        self.text_encoders.tokenizer = super().build_tokenizer(args)
        return ConstraintEncoder(self.text_encoders.tokenizer, self.target_dictionary, last=False)

    def build_bpe(self, args) -> ConstraintEncoder:
        """The BPE as fairseq-interactive's encoder of ``--constraints``; the raw one goes to :attr:`text_encoders`."""
        self.text_encoders.bpe = super().build_bpe(args)
        return ConstraintEncoder(self.text_encoders.bpe, self.target_dictionary, last=True)

    def get_interactive_tokens_and_lengths(self, lines, encode_fn):
        """fairseq-interactive's source lines. ``encode_fn`` is built from the constraint encoders
        :meth:`build_tokenizer`/:meth:`build_bpe` return, so sources go through the raw ones instead."""
        lines = ["" if x == EMPTY_SOURCE else x for x in lines]  # only constraints (fairseq_fixes.ConstraintLines)
        tokens, lengths = super().get_interactive_tokens_and_lengths(lines, self.text_encoders.encode)
        numbered = InputLines(tokens, first_line=self._interactive_lines_read + 1)
        self._interactive_lines_read += len(lines)
        return numbered, lengths

    def over_long(self, src_tokens: List[Tensor]) -> List[int]:
        """The indices of the sources longer than ``--max-source-positions``: not translated."""
        return [i for i, t in enumerate(src_tokens) if t.numel() > self.cfg.max_source_positions]

    def build_dataset_for_inference(self, src_tokens, src_lengths, constraints=None):
        """fairseq's, with one output per input: a line longer than ``--max-source-positions`` becomes an empty
        source without constraints (an empty output), with an error naming it (its input line number, from
        :class:`InputLines`, or the hub's index), where fairseq would drop it and shift the later outputs."""
        limit = self.cfg.max_source_positions
        over = self.over_long(src_tokens)
        if over:
            first_line = getattr(src_tokens, "first_line", None)
            src_tokens, src_lengths = list(src_tokens), [int(n) for n in src_lengths]
            for i in over:
                logger.error("%s (%r ...): %d source tokens exceed the model's limit (--max-source-positions %d); "
                             "not translated, its output is empty",
                             f"input line {first_line + i}" if first_line is not None else f"sentence {i}",
                             self.source_dictionary.string(src_tokens[i][:6]), src_lengths[i], limit)
                src_tokens[i], src_lengths[i] = src_tokens[i].new_tensor([self.source_dictionary.eos()]), 1
            if constraints is not None:
                constraints = constraints.clone()
                constraints[over] = 0  # packed: no constraints
        return super().build_dataset_for_inference(src_tokens, src_lengths, constraints=constraints)

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


class InputLines(list):
    """One buffer of fairseq-interactive's tokenised lines, and the input line number (from 1) of the first."""

    def __init__(self, tokens: List[Tensor], first_line: int):
        super().__init__(tokens)
        self.first_line = first_line
