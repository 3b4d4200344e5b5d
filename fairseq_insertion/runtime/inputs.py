"""The checks of what a caller gives the :class:`~fairseq_insertion.runtime.Translator`: each refusal a
:class:`~fairseq_insertion.export_format.TranslatorError` naming the argument."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np

from ..export_format import TranslatorError


def count(value: Any, name: str, minimum: int) -> int:
    """An integer argument >= minimum (not a bool, a float or a string)."""
    if (type(value) is not int and not isinstance(value, np.integer)) or value < minimum:
        raise TranslatorError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return int(value)


def check_providers(providers: Optional[Sequence[str]], available: Sequence[str]) -> List[str]:
    """onnxruntime's execution providers to use (default: CPU), each one this onnxruntime has."""
    if providers is None:
        return ["CPUExecutionProvider"]
    if isinstance(providers, str) or not isinstance(providers, (list, tuple)) or not providers:
        raise TranslatorError(f"providers: expected a non-empty list of provider names, got {providers!r}")
    unknown = [p for p in providers if p not in available]
    if unknown:
        raise TranslatorError(f"providers: {unknown} not available; this onnxruntime has {list(available)}")
    return list(providers)


def check_source(source: Any) -> None:
    """translate_batch's source: a list (or tuple) of token lists of non-empty str without whitespace."""
    if not isinstance(source, (list, tuple)):
        raise TranslatorError(f"source: expected a list of token lists, got {type(source).__name__}")
    for i, tokens in enumerate(source):
        check_tokens(tokens, f"source[{i}]")


def check_tokens(tokens: Any, name: str) -> None:
    """A list (or tuple) of non-empty str tokens without whitespace, called ``name``."""
    if isinstance(tokens, str):
        raise TranslatorError(f"{name}: expected a list of str tokens, got a str {tokens[:40]!r} "
                              "(split it into the model's pieces first)")
    if not isinstance(tokens, (list, tuple)):
        raise TranslatorError(f"{name}: expected a list of str tokens, got {type(tokens).__name__}")
    for j, token in enumerate(tokens):
        problem = token_problem(token)
        if problem:
            raise TranslatorError(f"{name}[{j}]: {problem}")


def check_rows(constraints: Any, n: int) -> None:
    """``constraints``: a list (or tuple) of one entry per input, ``n`` of them."""
    if isinstance(constraints, str) or not isinstance(constraints, (list, tuple)):
        raise TranslatorError(f"constraints: expected a list with one list of constraints per input, got "
                              f"{type(constraints).__name__}")
    if len(constraints) != n:
        raise TranslatorError(f"constraints: {len(constraints)} lists for {n} inputs; give one per input "
                              "(an empty list: none)")


def check_lines(lines: Any, name: str) -> None:
    """A list (or tuple) of str lines, called ``name``."""
    if isinstance(lines, str) or not isinstance(lines, (list, tuple)) or not all(isinstance(x, str) for x in lines):
        raise TranslatorError(f"{name}: expected a list of str lines, got {type(lines).__name__}"
                              + (f" {lines[:40]!r}" if isinstance(lines, str) else ""))


def token_problem(token: Any) -> str:
    if not isinstance(token, str):
        return f"expected a str token, got {type(token).__name__}"
    if not token:
        return "an empty token"
    if token.split() != [token]:
        return f"a token with whitespace {token[:40]!r} (one subword piece per token)"
    return ""

