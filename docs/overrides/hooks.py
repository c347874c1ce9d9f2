"""MkDocs hooks for the eqxopt site.

- The build fails, saying how to fix it, if the local MathJax is missing.
- Every API page (`api/*.md`) gets a summary table of the names it documents (each
  `::: eqxopt.X` on the page), linked to their entries, with the first sentence of
  each docstring.
- `names.md` gets the index of every public name (`<!-- names:table -->`).
- The raw benchmark results (`benchmarks/results/*.json`) are served at the same
  paths, so the benchmark pages can link them for download.

The tables are built from the package at build time, so they cannot go stale.
"""

import importlib
import inspect
import pathlib
import re

from mkdocs.exceptions import PluginError


MATHJAX = pathlib.Path("javascripts/mathjax/es5/tex-chtml.js")
MATHJAX_COMMAND = (
    "mkdir -p docs/javascripts/mathjax && npm pack --silent mathjax@3.2.2 "
    "--pack-destination docs/javascripts/mathjax >/dev/null && tar -xzf "
    "docs/javascripts/mathjax/mathjax-3.2.2.tgz -C docs/javascripts/mathjax "
    "--strip-components=1 package/LICENSE package/es5/tex-chtml.js "
    "package/es5/input/tex/extensions package/es5/output/chtml/fonts/woff-v2 && rm "
    "docs/javascripts/mathjax/mathjax-3.2.2.tgz"
)

_DIRECTIVE = re.compile(r"^\s*:::\s+(eqxopt(?:\.\w+)+)\s*$", re.MULTILINE)
# A full stop that ends a sentence: not the one of "e.g.", "i.e.", "etc." or "et al.".
_SENTENCE_END = re.compile(
    r"(?<!\be\.g)(?<!\bi\.e)(?<!\betc)(?<!\bet al)(?<!\bcf)(?<!\bvs)\.(?=\s|$)"
)
_INLINE_MATHS = re.compile(r"(?<!\\)\$(?!\$)(.+?)(?<!\\)\$")


def on_config(config, **kwargs):
    if not (pathlib.Path(config["docs_dir"]) / MATHJAX).exists():
        raise PluginError(
            f"docs/{MATHJAX} is missing: the site serves MathJax itself. From the "
            f"repository root, run:\n    {MATHJAX_COMMAND}"
        )
    return config


def resolve(dotted: str):
    """`eqxopt.schedules.CosineDecay` -> the object."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def _is_documented_object(obj) -> bool:
    return inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj)


def constant_doc(name: str) -> str:
    """The docstring written under a module-level constant `name` in `eqxopt/`."""
    import ast

    import eqxopt

    root = pathlib.Path(eqxopt.__file__).parent
    for path in sorted(root.rglob("*.py")):
        body = ast.parse(path.read_text()).body
        for stmt, following in zip(body, body[1:]):
            target = getattr(stmt, "target", None) or next(
                iter(getattr(stmt, "targets", [])), None
            )
            if (
                isinstance(target, ast.Name)
                and target.id == name
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                return inspect.cleandoc(following.value.value)
    return ""


def first_sentence(doc: str) -> str:
    """The first sentence of a docstring, on one line, ready for a table cell."""
    paragraph = " ".join(doc.strip().split("\n\n", 1)[0].split())
    if paragraph.startswith(("$$", "!!!", "???", "```")):
        return ""
    match = _SENTENCE_END.search(paragraph)
    sentence = paragraph[: match.end()] if match else paragraph
    if sentence.endswith(":"):  # introduces a formula or a list: ends the sentence
        sentence = sentence[:-1].rstrip() + "."
    return table_cell(sentence)


def table_cell(text: str) -> str:
    """`text` with every `|` written so that it does not split a table cell: inside
    maths a norm `\\|x\\|` is `\\Vert x\\Vert` and `|x|` is `\\vert x\\vert`."""

    def maths(match):
        tex = re.sub(r"\\\|(?=[A-Za-z])", r"\\Vert ", match.group(1))
        tex = re.sub(r"(?<!\\)\|(?=[A-Za-z])", r"\\vert ", tex)
        return "$" + tex.replace("\\|", "\\Vert").replace("|", "\\vert") + "$"

    text = _INLINE_MATHS.sub(maths, text)
    return text.replace("|", "\\|")


def summary(obj, name: str = "") -> str:
    """The first sentence of `obj`'s docstring, on one line."""
    if _is_documented_object(obj):
        doc = inspect.getdoc(obj) or ""
    else:  # a constant: its own docstring, or its type's if that is eqxopt's own
        doc = constant_doc(name)
        if not doc and type(obj).__module__.startswith("eqxopt."):
            doc = inspect.getdoc(type(obj)) or ""
    return first_sentence(doc)


def _kind(name: str, obj) -> str:
    import equinox as eqx

    import eqxopt

    if inspect.ismodule(obj):
        return "module"
    if not _is_documented_object(obj):
        return "constant"
    if inspect.isclass(obj):
        if isinstance(obj, type(eqx.Enumeration)):
            return "result values"
        if issubclass(obj, BaseException):
            return "exception"
        if issubclass(obj, eqxopt.schedules.AbstractSchedule):
            return "schedule"
        if issubclass(obj, eqxopt.AbstractOptimizer):
            return "abstract base" if name.startswith("Abstract") else "optimizer"
        if issubclass(obj, eqxopt.AbstractLineSearch):
            return "abstract base" if name.startswith("Abstract") else "line search"
        if name.startswith("Abstract"):
            return "abstract base"
        if name.endswith("State"):
            return "state"
        return "class"
    return "function"


def public_names() -> list[tuple[str, object]]:
    """Every public name: `eqxopt.X` and `eqxopt.schedules.X`."""
    import eqxopt

    out = [(f"eqxopt.{n}", getattr(eqxopt, n)) for n in dir(eqxopt)]
    out += [
        (f"eqxopt.schedules.{n}", getattr(eqxopt.schedules, n))
        for n in dir(eqxopt.schedules)
    ]
    return [(d, o) for d, o in out if not d.rsplit(".", 1)[1].startswith("_")]


def _link(dotted: str, obj, short: str) -> str:
    if inspect.ismodule(obj):
        return f"[`{short}`](api/schedules.md)"
    # Optax-named aliases of schedules (`cosine_decay_schedule is CosineDecay`).
    canonical = _canonical(dotted, obj)
    if canonical != dotted:
        return f"[`{short}`][{canonical}]"
    return f"[`{short}`][{dotted}]"


def _canonical(dotted: str, obj) -> str:
    """Where `obj` is documented: aliases point to the class they name."""
    if inspect.isclass(obj):
        return f"{obj.__module__.split('._')[0]}.{obj.__name__}"
    return dotted


def names_table() -> str:
    rows = ["| name | kind | summary |", "| --- | --- | --- |"]
    entries = sorted(public_names(), key=lambda e: e[0].rsplit(".", 1)[1].lower())
    for dotted, obj in entries:
        short = dotted[len("eqxopt.") :]
        canonical = _canonical(dotted, obj)
        if canonical != dotted:
            kind = _kind(canonical.rsplit(".", 1)[1], obj)
            text = (
                f"Optax's name for [`{canonical[len('eqxopt.') :]}`][{canonical}] "
                "(the same class)."
            )
        else:
            kind = _kind(dotted.rsplit(".", 1)[1], obj)
            text = summary(obj, dotted.rsplit(".", 1)[1])
        rows.append(f"| {_link(dotted, obj, short)} | {kind} | {text} |")
    return "\n".join(rows)


def api_summary(markdown: str) -> str:
    names = list(dict.fromkeys(_DIRECTIVE.findall(markdown)))
    if not names:
        return ""
    rows = ["| name | summary |", "| --- | --- |"]
    for dotted in names:
        short = dotted.rsplit(".", 1)[1]
        rows.append(f"| [`{short}`][{dotted}] | {summary(resolve(dotted), short)} |")
    return "\n".join(rows)


def _insert_after_intro(markdown: str, block: str) -> str:
    """Put `block` after the page's title and introduction, before its first entry."""
    lines = markdown.split("\n")
    for i, line in enumerate(lines):
        if i > 0 and re.match(r"^(:::|\?\?\?|---\s*$|## )", line):
            return "\n".join([*lines[:i], block, "", *lines[i:]])
    return markdown + "\n\n" + block + "\n"


def on_page_markdown(markdown, page, config, files, **kwargs):
    src = page.file.src_uri
    if src == "names.md":
        return markdown.replace("<!-- names:table -->", names_table())
    if src.startswith("api/"):
        table = api_summary(markdown)
        if table:
            return _insert_after_intro(markdown, table)
    return markdown


def on_files(files, config, **kwargs):
    from mkdocs.structure.files import File

    results = pathlib.Path(config["docs_dir"]).parent / "benchmarks" / "results"
    for path in sorted(results.glob("*.json")):
        uri = f"benchmarks/results/{path.name}"
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files
