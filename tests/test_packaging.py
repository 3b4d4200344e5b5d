"""The package's metadata agrees with itself: LICENSE, setup.py's license and version, CITATION.cff,
README's BibTeX, and setup.py's python_requires against the syntax the code uses and docs/install.md."""

import ast
import re
from pathlib import Path
from typing import Dict, List

import yaml

from tests.test_repo_hygiene import tracked_files
from tests.utils import REPO


def setup_keywords() -> Dict[str, object]:
    """The literal keyword arguments of setup.py's ``setup(...)`` call."""
    tree = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    out = {}
    for kw in call.keywords:
        try:
            out[kw.arg] = ast.literal_eval(kw.value)
        except ValueError:
            continue  # computed (long_description, packages)
    return out


def bibtex_entries(text: str) -> Dict[str, Dict[str, str]]:
    """key -> fields of every BibTeX entry in README's fenced ``bibtex`` blocks."""
    entries = {}
    for block in re.findall(r"```bibtex\n(.*?)```", text, re.S):
        for key, body in re.findall(r"@\w+\{([^,]+),(.*?)\n\}", block, re.S):
            entries[key] = {k.lower(): v.strip() for k, v in re.findall(r"(\w+)\s*=\s*\{(.*?)\},?\s*$", body, re.M)}
    return entries


def citation() -> dict:
    return yaml.safe_load((REPO / "CITATION.cff").read_text(encoding="utf-8"))


def test_license_is_mit_everywhere():
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License") and "Permission is hereby granted, free of charge" in text
    assert re.search(r"Copyright \(c\) \d{4} fairseq_insertion contributors", text)
    assert setup_keywords()["license"] == "MIT" == citation()["license"]


def test_citation_file_names_this_package_and_the_paper():
    cff, setup = citation(), setup_keywords()
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software"
    assert str(cff["version"]) == setup["version"]
    assert cff["authors"] == [{"name": "fairseq_insertion contributors"}]
    [paper] = [r for r in cff["references"] if "Insertion Transformer" in r["title"]]
    assert [a["family-names"] for a in paper["authors"]] == ["Stern", "Chan", "Kiros", "Uszkoreit"]
    assert paper["year"] == 2019 and "Machine Learning" in paper["collection-title"]


def test_readme_bibtex_matches_the_citation_file():
    cff = citation()
    [paper] = [r for r in cff["references"] if "Insertion Transformer" in r["title"]]
    entries = bibtex_entries((REPO / "README.md").read_text(encoding="utf-8"))
    assert len(entries) == 2, sorted(entries)
    by_title = {e["title"].strip("{}"): e for e in entries.values()}
    cited = by_title[paper["title"]]
    assert cited["author"] == " and ".join(f"{a['family-names']}, {a['given-names']}" for a in paper["authors"])
    assert cited["year"] == str(paper["year"]) and str(paper["volume"]) == cited["volume"]
    assert cited["pages"] == f"{paper['start']}--{paper['end']}"
    software = by_title[cff["title"].replace("_", r"\_")]
    assert software["version"] == str(cff["version"]) and "fairseq\\_insertion contributors" in software["author"]


def minimum_python() -> tuple:
    m = re.fullmatch(r">=\s*3\.(\d+)", str(setup_keywords()["python_requires"]))
    assert m, f"python_requires {setup_keywords()['python_requires']!r}: expected '>=3.N'"
    return (3, int(m.group(1)))


def tracked_python_files() -> List[Path]:
    return [p for p in tracked_files() if p.suffix == ".py"]


def test_no_syntax_newer_than_python_requires():
    version = minimum_python()
    newer = []
    for path in tracked_python_files():
        try:
            ast.parse(path.read_text(encoding="utf-8"), feature_version=version)
        except SyntaxError as e:
            newer.append(f"{path.relative_to(REPO)}:{e.lineno}: {e.msg}")
    assert newer == [], f"syntax newer than python_requires {version}"


def test_python_requires_covers_zip_strict():
    """zip(..., strict=True) is Python 3.10."""
    uses = [str(p.relative_to(REPO)) for p in tracked_python_files()
            if re.search(r"\bzip\(.*strict=True", p.read_text(encoding="utf-8"))]
    assert not uses or minimum_python() >= (3, 10), uses


def test_install_docs_state_python_requires():
    major, minor = minimum_python()
    assert f"Python {major}.{minor} or newer" in (REPO / "docs" / "install.md").read_text(encoding="utf-8")
