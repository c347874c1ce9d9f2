"""Doc snippets are tested: every ```python block in README.md and docs/*.md runs.

Blocks in one page run in order in one namespace (a page reads like a notebook). A
block fenced as ```python {skip} (or any fence other than plain ```python) is not run.
"""

import pathlib
import re

import jax
import pytest


ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_BLOCK = re.compile(r"^```python\s*\n(.*?)^```\s*$", re.DOTALL | re.MULTILINE)


def _blocks(page: pathlib.Path) -> list[str]:
    import textwrap

    out = []
    for match in _BLOCK.finditer(page.read_text()):
        out.append(textwrap.dedent(match.group(1)))
    return out


PAGES_WITH_CODE = [p for p in PAGES if _blocks(p)]


@pytest.mark.parametrize(
    "page", PAGES_WITH_CODE, ids=lambda p: str(p.relative_to(ROOT))
)
def test_doc_snippets_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__doc_snippet__"}
    # Docs are written for users' defaults: standard promotion (x64 stays as the suite
    # has it; snippets that need x64 enable it themselves).
    with jax.numpy_dtype_promotion("standard"):
        for i, code in enumerate(_blocks(page)):
            try:
                exec(compile(code, f"{page.name}[block {i}]", "exec"), namespace)
            except Exception as e:
                raise AssertionError(
                    f"{page.relative_to(ROOT)} block {i} failed:\n{code}"
                ) from e


def test_catalogue_page_is_generated_from_the_registry():
    from .gen_catalogue import main

    page = ROOT / "docs" / "catalogue.md"
    assert page.exists() and page.read_text() == main(), (
        "docs/catalogue.md is stale: run `python -m tests.gen_catalogue > "
        "docs/catalogue.md`"
    )


# --- The built site -------------------------------------------------------------------
#
# Built once per test run (about 20-60 s), shared with test_browser.py; every test
# below reads the built files.

_SEPARATOR = re.compile(r'[\s\-,:!=\[\]()"`/]+|\.(?!\d)|&[lg]t;|(?!\b)(?=[A-Z][a-z])')
# Words that have no place in user documentation: paths of the machine the docs were
# written on, and notes about the project's own work.
_FORBIDDEN = [
    re.compile(r"/work/|/root/|/tmp/|/home/\w"),
    re.compile(r"\bthe issue\b|\bissue note\b|\bAPI\.md\b|hand-written, 20\d\d", re.I),
    re.compile(r"\b20\d\d-\d\d-\d\d\b"),  # dates of work (runs, notes)
]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> pathlib.Path:
    from ._site import build_site

    return build_site(tmp_path_factory)


def _public_names() -> list[str]:
    import eqxopt

    names = [n for n in dir(eqxopt) if not n.startswith("_")]
    names += [n for n in dir(eqxopt.schedules) if not n.startswith("_")]
    return names


def _tokens(text: str) -> set[str]:
    text = re.sub(r"<[^>]+>", " ", text)  # the index keeps some markup (`<code>`)
    return {t.lower() for t in _SEPARATOR.split(text) if t}


def test_search_finds_every_public_name(site):
    import json

    index = json.loads((site / "search" / "search_index.json").read_text())
    assert index["config"]["separator"] == _SEPARATOR.pattern
    entries = [_tokens(e["title"] + " " + e["text"]) for e in index["docs"]]
    titles = {e["title"] for e in index["docs"]}
    missing = []
    for name in _public_names():
        query = _tokens(name)  # the search box splits a query like the index
        if not any(query <= tokens for tokens in entries):
            missing.append(name)
    assert not missing, f"not found by the site's search: {missing}"
    # Readable result titles: classes and functions under their short name, never
    # as `__init__(...)`.
    assert {"Adam", "AdamW", "verify", "StateDriftError", "LBFGS"} <= titles
    assert not [t for t in titles if "__init__" in t or "self" in t]


def test_every_public_name_has_an_api_entry(site):
    import inspect

    import eqxopt

    html = "".join(p.read_text() for p in (site / "api").rglob("*.html"))
    missing = []
    for name in _public_names():
        obj = getattr(eqxopt, name, None)
        if obj is None:
            obj = getattr(eqxopt.schedules, name)
            dotted = f"eqxopt.schedules.{obj.__name__}" if inspect.isclass(obj) else ""
        else:
            dotted = f"eqxopt.{name}"
        if inspect.ismodule(obj):
            continue
        if f'id="{dotted}"' not in html:
            missing.append(dotted)
    assert not missing, f"no API entry for {missing}"


def test_no_page_mentions_paths_dates_or_internal_notes(site):
    offenders = []
    for page in site.rglob("*.html"):
        text = re.sub(r"<[^>]+>", " ", page.read_text())
        for pattern in _FORBIDDEN:
            for match in pattern.finditer(text):
                context = text[max(0, match.start() - 60) : match.end() + 60]
                offenders.append(f"{page.relative_to(site)}: ...{context.strip()}...")
    assert not offenders, "\n".join(offenders[:30])


def test_every_image_exists_and_nothing_loads_from_a_cdn(site):
    import urllib.parse

    missing, external = [], []
    for page in site.rglob("*.html"):
        html = page.read_text()
        for src in re.findall(r'<img[^>]*\ssrc="([^"]+)"', html):
            if src.startswith(("http:", "https:", "//")):
                external.append(f"{page.relative_to(site)}: {src}")
            elif not src.startswith("data:"):
                path = urllib.parse.unquote(src.split("#")[0])
                if not (page.parent / path).resolve().is_file():
                    missing.append(f"{page.relative_to(site)}: {src}")
        for tag in re.findall(r"<(?:script|link)\b[^>]*>", html):
            url = re.search(r'\s(?:src|href)="((?:https?:)?//[^"]+)"', tag)
            if url and ("<script" in tag or 'rel="stylesheet"' in tag):
                external.append(f"{page.relative_to(site)}: {url.group(1)}")
    assert not missing, f"missing images: {missing}"
    assert not external, f"loaded from the network: {external[:10]}"


def test_maths_is_served_with_its_fonts_and_text_macros(site):
    mathjax = site / "javascripts" / "mathjax" / "es5"
    assert (mathjax / "tex-chtml.js").is_file()
    assert (mathjax / "input" / "tex" / "extensions" / "textmacros.js").is_file()
    assert list((mathjax / "output" / "chtml" / "fonts" / "woff-v2").glob("*.woff"))
    # `\texttt{ns\_steps}` renders only with the textmacros package loaded.
    config = (site / "_static" / "mathjax.js").read_text()
    assert "textmacros" in config


def test_api_pages_have_a_summary_table_and_list_every_field(site):
    import dataclasses

    import equinox as eqx

    import eqxopt

    for page in sorted((ROOT / "docs" / "api").glob("*.md")):
        names = re.findall(r"^\s*:::\s+(eqxopt[\w.]+)", page.read_text(), re.M)
        html = (site / "api" / page.stem / "index.html").read_text()
        first_table = html[html.find("<table") : html.find("</table>")]
        for dotted in names:
            assert f'href="#{dotted}"' in first_table, (page.name, dotted)
    states = (site / "api" / "core" / "index.html").read_text()
    minimize = (site / "api" / "minimize" / "index.html").read_text()
    for cls, html in [
        (eqxopt.StateReport, states),
        (eqxopt.StateLeaf, states),
        (eqxopt.Solution, minimize),
    ]:
        for field in dataclasses.fields(cls):
            assert f"<code>{field.name}</code>" in html, (cls.__name__, field.name)
    for enum, html in [(eqxopt.LineSearchResult, minimize), (eqxopt.RESULTS, minimize)]:
        assert isinstance(enum, type(eqx.Enumeration))
        for value in enum._name_to_item:  # pyright: ignore[reportAttributeAccessIssue]
            assert f"<code>{enum.__name__}.{value}</code>" in html, value


def test_sidebar_labels_are_unique():
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    # mkdocs.yml may use `!!python/name` tags; none are in the nav.
    _Loader.add_multi_constructor("", lambda loader, suffix, node: None)
    nav = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)["nav"]

    labels: list[str] = []

    def walk(items):
        for item in items:
            if isinstance(item, dict):
                for label, value in item.items():
                    labels.append(label)
                    if isinstance(value, list):
                        walk(value)

    walk(nav)
    assert len(labels) == len(set(labels)), sorted(
        {x for x in labels if labels.count(x) > 1}
    )
