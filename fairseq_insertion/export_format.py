"""The export format in one place: the file names, each graph's inputs and outputs, ``settings.json``'s keys, and
the checked reading of an exported directory, each refusal naming the file and the key. No torch or onnx."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .config import RUNTIME_OPTIONS, TERMINATIONS, DecodingConfig, DecodingError, offered
from .errors import InsertionError
from .loop.rules import FEEDS
from .preprocess import PreprocessError, Preprocessing

# 2: the pass takes the word-edge rule (constraints) and each layer's keys and values; 3: candidates' options
# (eos_penalties, rerank_weight) and an optional scorer graph; 4: one key, model.precision, names the int8 scheme
FORMAT_VERSION = 4
ENCODER, PASS, SETTINGS = "encoder.onnx", "pass.onnx", "settings.json"
SCORER = "scorer.onnx"  # an autoregressive model that chooses among candidates (export --rerank-with), optional
SHORTLIST = "shortlist.npz"  # the lexical shortlist table (export --shortlist), optional: the graphs then take lists
VOCABS = {"source": "source_vocab.txt", "target": "target_vocab.txt"}
CHECKED = (ENCODER, PASS, *VOCABS.values())  # the files settings.json records the size and sha256 of
BPE_CODES = "bpe.codes"  # the subword-nmt codes of a recorded preprocessing, also recorded in files
SPM_MODEL = "spm.model"  # or its SentencePiece model, the same way
SPECIAL_IDS = ("bos", "eos", "pad", "unk")
JSON_TYPES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", tuple: "a list of numbers"}


def source_names(layers: int) -> Tuple[str, ...]:
    """The encoder's outputs, which every pass takes: each decoder layer's encoder-attention keys, then values."""
    return (*(f"keys_{i}" for i in range(layers)), *(f"values_{i}" for i in range(layers)))


def cache_names(prefix: str, layers: int) -> Tuple[str, ...]:
    """A cached decoder's keys and values of its cached ``layers``, as its graphs name them: ``prefix`` (``start``:
    the encoder's outputs, ``past``: a pass's inputs, ``new``: its outputs) ``_keys_i``, then ``_values_i``."""
    return (*(f"{prefix}_keys_{i}" for i in range(layers)), *(f"{prefix}_values_{i}" for i in range(layers)))


def graph_io(name: str, layers: int, shortlisted: bool = False, cached: Optional[int] = None
             ) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """The inputs and outputs of a graph of a model with ``layers`` decoder layers; ``shortlisted``: with a
    shortlist (each sentence's list (B, L) and its rows of the projection (B, L, C), gathered by the encoder);
    ``cached``: the cached decoder's layers kept between passes (None: a plain decoder), whose cache the encoder
    starts and a pass takes and returns."""
    listed = ("shortlist",) if shortlisted else ()
    start = () if cached is None else (*cache_names("start", cached), "start_positions", "start_states")
    if name == ENCODER:
        return ("src_tokens", *listed), (*source_names(layers), *(("shortlist_weights",) if shortlisted else ()),
                                         *start)
    if name == SCORER:
        return ("src_tokens", "rows", "target", "prev_tokens"), ("log_probs",)
    past = () if cached is None else ("fresh_tokens", "left_positions", "right_positions", *cache_names("past", cached),
                                      "past_mask", "past_states", "index")
    new = () if cached is None else (*cache_names("new", cached), "new_positions", "new_states")
    return (("framed", *source_names(layers), "src_mask", "open_slots", *(f.name for f in FEEDS), "k",
             *(("shortlist", "shortlist_weights") if shortlisted else ()), *past),
            ("tokens", "log_probs", "eos_log_probs", "location", *new))


# the pass graph's outputs after location when its model has a look-ahead closure (slots.ending_graph)
LOOKAHEAD_OUTPUTS = ("ends", "end_log_probs")


class TranslatorError(InsertionError):
    """An exported directory, an input or an option the runtime cannot take; the message names it."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_digests(model_dir: Path, names: Sequence[str] = CHECKED) -> Dict[str, Dict[str, Any]]:
    """The size in bytes and the sha256 of every file settings.json records (``files``)."""
    return {name: {"bytes": (model_dir / name).stat().st_size, "sha256": sha256(model_dir / name)} for name in names}


# ---------------------------------------------------------------- files
def check_present(model_dir: Path) -> None:
    """Every file of an export is there and not empty."""
    missing = [n for n in (ENCODER, PASS, SETTINGS, *VOCABS.values()) if not (model_dir / n).is_file()]
    if missing:
        raise TranslatorError(f"{model_dir}: not an exported insertion model (missing {', '.join(missing)}; "
                              "python -m fairseq_insertion.export writes them)")
    for name in (SETTINGS, *CHECKED):
        if (model_dir / name).stat().st_size == 0:
            raise TranslatorError(f"{model_dir / name}: empty (a failed or interrupted export: export again)")


def read_settings(model_dir: Path) -> Dict[str, Any]:
    """settings.json, a JSON object of the format this runtime reads."""
    path = model_dir / SETTINGS
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise TranslatorError(f"{path}: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise TranslatorError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(values, dict):
        raise TranslatorError(f"{path}: a JSON object expected, got {type(values).__name__}")
    version = values.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:
        raise TranslatorError(f"{path}: format version {version!r}, this runtime reads {FORMAT_VERSION}: "
                              "export the model again")
    return values


def check_digests(model_dir: Path, settings: Mapping[str, Any], extra: Sequence[str] = ()) -> None:
    """Each file's size and sha256 against ``files`` in settings.json, if recorded (``extra``: the optional files)."""
    files = settings.get("files")
    if files is None:
        return
    where = Where(model_dir / SETTINGS)
    names = (*CHECKED, *extra)
    where.expect(isinstance(files, dict), "files", "must be an object")
    where.expect(set(files) == set(names), "files", f"must name {list(names)}, got {sorted(files)}")
    for name in names:
        record = files[name]
        where.expect(isinstance(record, dict), f"files.{name}", "must be an object")
        size, digest = record.get("bytes"), record.get("sha256")
        where.expect(type(size) is int and size > 0, f"files.{name}.bytes", f"must be a positive integer, got {size!r}")
        where.expect(isinstance(digest, str), f"files.{name}.sha256", f"must be a string, got {digest!r}")
        have = (model_dir / name).stat().st_size
        if have != size:
            raise TranslatorError(f"{model_dir / name}: {have} bytes, the export wrote {size} (truncated or "
                                  "replaced: export again)")
        if sha256(model_dir / name) != digest:
            raise TranslatorError(f"{model_dir / name}: its sha256 differs from the export's (changed or "
                                  "corrupt: export again)")


def check_preprocessing(settings: Mapping[str, Any], model_dir: Path) -> Optional[Preprocessing]:
    """``preprocessing`` (None when absent), checked, its codes a non-empty file of the export, under ``model_dir``."""
    if settings.get("preprocessing") is None:
        return None
    path = model_dir / SETTINGS
    try:
        record = Preprocessing.from_record(settings["preprocessing"], str(path), "preprocessing.")
    except PreprocessError as exc:
        raise TranslatorError(str(exc)) from None
    codes = record.bpe_codes
    if codes is not None:
        Where(path).expect(Path(codes).name == codes and codes not in ("", ".", ".."), "preprocessing.bpe_codes",
                           f"must name a file of the export, got {codes!r}")
        if not (model_dir / codes).is_file() or (model_dir / codes).stat().st_size == 0:
            raise TranslatorError(f"{model_dir / codes}: missing or empty ({path} records it as "
                                  "preprocessing.bpe_codes: export again)")
    return record.under(model_dir)


def optional_file(settings: Mapping[str, Any], model_dir: Path, key: str, expected: str) -> Optional[Path]:
    """The non-empty file settings' ``key`` names (``scorer``, ``shortlist``; None when the key is absent)."""
    name = settings.get(key)
    if name is None:
        return None
    Where(model_dir / SETTINGS).expect(name == expected, key, f"must be {expected!r}, got {name!r}")
    if not (model_dir / name).is_file() or (model_dir / name).stat().st_size == 0:
        raise TranslatorError(f"{model_dir / name}: missing or empty ({model_dir / SETTINGS} records a {key}: "
                              "export again)")
    return model_dir / name


def check_scorer_graph(path: Path, session: Any, target_size: int) -> None:
    """The scorer's inputs and outputs are the export's and its vocabulary the target's."""
    check_graph_io(path, session, 0)
    recorded = session.get_modelmeta().custom_metadata_map.get("vocab_size")
    if recorded is not None and recorded != str(target_size):
        raise TranslatorError(f"{path}: a target vocabulary of {recorded} symbols, {path.parent / VOCABS['target']} "
                              f"has {target_size}: the files come from different exports")


def read_vocab(path: Path) -> List[str]:
    """One symbol per line, line i = id i; the file ends with a line end."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TranslatorError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    if not text.endswith("\n"):
        raise TranslatorError(f"{path}: its last line has no line end (cut short: export again)")
    return text.split("\n")[:-1]


# ---------------------------------------------------------------- settings.json
class Where:
    """Errors about the keys of one JSON file: ``PATH: KEY must be ...``."""

    def __init__(self, path: Path):
        self.path = path

    def expect(self, ok: bool, key: str, text: str) -> None:
        if not ok:
            raise TranslatorError(f"{self.path}: {key} {text}")

    def get(self, values: Mapping[str, Any], key: str, prefix: str = "") -> Any:
        self.expect(key in values, prefix + key, "is missing")
        return values[key]

    def integer(self, values: Mapping[str, Any], key: str, prefix: str = "", minimum: int = 0,
                below: int | None = None) -> int:
        value = self.get(values, key, prefix)
        ok = type(value) is int and value >= minimum and (below is None or value < below)
        bound = f"in [{minimum}, {below})" if below is not None else f">= {minimum}"
        self.expect(ok, prefix + key, f"must be an integer {bound}, got {value!r}")
        return value

    def choice(self, values: Mapping[str, Any], key: str, choices: Sequence[str], prefix: str = "") -> str:
        value = self.get(values, key, prefix)
        self.expect(isinstance(value, str) and value in choices, prefix + key,
                    f"must be one of {list(choices)}, got {value!r}")
        return value

    def section(self, values: Mapping[str, Any], key: str, prefix: str = "") -> Dict[str, Any]:
        value = self.get(values, key, prefix)
        self.expect(isinstance(value, dict), prefix + key, f"must be an object, got {type(value).__name__}")
        return value


def check_model(settings: Mapping[str, Any], path: Path, source_size: int, target_size: int) -> Dict[str, Any]:
    """``model``'s keys: ids within their vocabulary, positive sizes, the known termination and precision."""
    where = Where(path)
    model = where.section(settings, "model")
    checked = {key: where.integer(model, key, "model.", below=target_size) for key in SPECIAL_IDS}
    source = where.section(model, "source", "model.")
    checked["source"] = {key: where.integer(source, key, "model.source.", below=source_size) for key in SPECIAL_IDS}
    for key in ("max_source_positions", "max_target_positions", "decoder_layers"):
        checked[key] = where.integer(model, key, "model.", minimum=1)
    checked["termination"] = where.choice(model, "termination", TERMINATIONS, "model.")
    checked["precision"] = where.choice(model, "precision", offered("exported"), "model.")
    if "cached_layers" in model:  # the cached decoder's (--cached-decoder)
        checked["cached_layers"] = where.integer(model, "cached_layers", "model.", minimum=0)
    return checked


def check_decoding(settings: Mapping[str, Any], path: Path) -> Dict[str, Any]:
    """``decoding``: each key of its field's JSON type and checked by DecodingConfig (missing: the default)."""
    where = Where(path)
    values = where.section(settings, "decoding")
    unknown = sorted(set(values) - set(RUNTIME_OPTIONS))
    where.expect(not unknown, "decoding", f"has unknown key(s) {unknown}; its keys are {list(RUNTIME_OPTIONS)}")
    defaults = DecodingConfig()
    for key, value in values.items():  # of its field's JSON type: an integer is a number; true is not an integer
        kind, number = type(getattr(defaults, key)), (int, float)
        ok = {float: type(value) in number, tuple: type(value) is list and all(type(v) in number for v in value)}
        where.expect(ok.get(kind, type(value) is kind), f"decoding.{key}", f"must be {JSON_TYPES[kind]}, got {value!r}")
    try:
        config = DecodingConfig(**values)
    except DecodingError as exc:
        raise TranslatorError(f"{path}: {exc.keyed('decoding.')}") from None
    return {key: getattr(config, key) for key in RUNTIME_OPTIONS}


# ---------------------------------------------------------------- the graphs
def check_graph_io(path: Path, session: Any, layers: int, shortlisted: bool = False, cached: Optional[int] = None
                   ) -> None:
    """The graph's input and output names are the export's."""
    inputs, outputs = graph_io(path.name, layers, shortlisted, cached)
    have = (tuple(i.name for i in session.get_inputs()), tuple(o.name for o in session.get_outputs()))
    if path.name == PASS and have[1] == outputs + LOOKAHEAD_OUTPUTS:  # a model with a look-ahead closure
        outputs = have[1]
    if have != (inputs, outputs):
        raise TranslatorError(f"{path}: inputs {list(have[0])} and outputs {list(have[1])}, the export's "
                              f"{path.name} has {list(inputs)} and {list(outputs)}")


def check_graphs(model_dir: Path, encoder: Any, decoder_pass: Any, layers: int, vocab_sizes: Tuple[int, int],
                 shortlisted: bool = False, cached: Optional[int] = None) -> None:
    """Both graphs against each other, settings.json's decoder layers and shortlist and the vocabulary files."""
    keyed = sum(o.name.startswith("keys_") for o in encoder.get_outputs())
    if keyed and keyed != layers:
        raise TranslatorError(f"{model_dir / ENCODER}: keys for {keyed} decoder layers, {model_dir / SETTINGS} "
                              f"says model.decoder_layers {layers}")
    check_graph_io(model_dir / ENCODER, encoder, layers, shortlisted, cached)
    check_graph_io(model_dir / PASS, decoder_pass, layers, shortlisted, cached)
    given = {o.name: o.shape for o in encoder.get_outputs()}  # (batch, heads, source, head dim) each
    for node in decoder_pass.get_inputs()[1:1 + 2 * layers]:
        if [node.shape[i] for i in (1, 3)] != [given[node.name][i] for i in (1, 3)]:
            raise TranslatorError(f"{model_dir / PASS}: takes {node.name} of shape {node.shape}, "
                                  f"{model_dir / ENCODER} gives {given[node.name]}: the graphs come from different "
                                  "models")
    for (side, name), session, size in zip(VOCABS.items(), (encoder, decoder_pass), vocab_sizes):
        recorded = session.get_modelmeta().custom_metadata_map.get("vocab_size")
        if recorded is not None and recorded != str(size):
            graph = ENCODER if side == "source" else PASS
            raise TranslatorError(f"{model_dir / graph}: a {side} vocabulary of {recorded} symbols, "
                                  f"{model_dir / name} has {size}: the files come from different exports")
