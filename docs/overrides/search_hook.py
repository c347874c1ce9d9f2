"""MkDocs hook: the search index shows text, and a public name finds its entry first.

Runs after the search plugin has written `search/search_index.json`, and rewrites it:

- Maths is written as text (`\\(\\beta_1\\)` -> `β_1`): the search results show the
  indexed text as it is, and MathJax does not typeset them.
- A query equal to a public name puts that name's API entry first. The theme's search
  (lunr) appends `*` to every query word, so `Adam` also matches `Adamax`, `AdamW`
  and `ScheduleFreeAdamW`, and ranks rare words highest. Each API entry gets a
  `keywords` field, weighted far above titles and text, holding the words of its name
  (and of its aliases), each made unique to the entry so every keyword weighs the
  same; the entry with most of the query's words in its name wins, and between equals
  the shorter name (the exact one) wins through a slightly larger document boost.
  Guides add keywords with front matter (`search: keywords: [bf16, bfloat16]`), so
  that a common word reaches them rather than an entry whose name contains it.
"""

import inspect
import json
import pathlib
import re
import unicodedata


KEYWORDS_BOOST = 1e8  # titles weigh 1e3, text 1
# A guide's keywords. The theme multiplies a page's score by 5 and a section's by 2
# when every word of the query is found, so an entry scores about 2 * 1.07e8 per word
# of its name found and a guide 5 * TOPICS_BOOST = 1.75e8 per keyword found: a guide
# with one query word more than an entry's name comes first ("learning rate schedule"
# over `ScaleByLearningRate`), one with as many does not (up to 5 words).
TOPICS_BOOST = 3.5e7
ALIASES_BOOST = 1e4
_ENTRY = re.compile(r"#(eqxopt(?:\.schedules)?)\.(\w+)$")
_page_keywords: dict[str, list[str]] = {}


def on_page_markdown(markdown, page, **kwargs):
    keywords = (page.meta.get("search") or {}).get("keywords")
    if keywords:
        _page_keywords[page.url] = [str(k) for k in keywords]
    return markdown


# --- Maths as text --------------------------------------------------------------------

_GREEK = (
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi pi rho "
    "sigma tau upsilon phi chi psi omega"
).split()


def _letter(case: str, name: str) -> str:
    name = name.upper().replace("LAMBDA", "LAMDA")  # Unicode's spelling
    return unicodedata.lookup(f"GREEK {case} LETTER {name}")


_SYMBOLS = {
    **{g: _letter("SMALL", g) for g in _GREEK},
    **{g.capitalize(): _letter("CAPITAL", g) for g in _GREEK},
    "varepsilon": "ε",
    "varphi": "φ",
    "ell": "ℓ",
    "cdot": "·",
    "times": "×",
    "odot": "⊙",
    "otimes": "⊗",
    "le": "≤",
    "leq": "≤",
    "ge": "≥",
    "geq": "≥",
    "ne": "≠",
    "neq": "≠",
    "approx": "≈",
    "sim": "~",
    "infty": "∞",
    "sum": "∑",
    "prod": "∏",
    "sqrt": "√",
    "partial": "∂",
    "nabla": "∇",
    "to": "→",
    "rightarrow": "→",
    "leftarrow": "←",
    "gets": "←",
    "mapsto": "↦",
    "in": "∈",
    "top": "⊤",
    "star": "⋆",
    "lVert": "‖",
    "rVert": "‖",
    "|": "‖",
    "lvert": "|",
    "Vert": "‖",
    "vert": "|",
    "rvert": "|",
    "ldots": "…",
    "dots": "…",
    "cdots": "…",
    "pm": "±",
    "circ": "∘",
}
# Commands that only style or size their argument.
_DROP = set(
    "left right big Big bigl bigr Bigl Bigr hat bar tilde widehat widetilde vec dot "
    "mathbf mathrm mathit mathcal mathbb mathsf boldsymbol text texttt textrm textit "
    "operatorname displaystyle quad qquad limits".split()
)
_MATH = re.compile(r"\\\((.*?)\\\)|\\\[(.*?)\\\]", re.DOTALL)
_COMMAND = re.compile(r"\\([A-Za-z]+|[|,;:! _%#{}])")
_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")


def tex_to_text(tex: str) -> str:
    """`\\hat{m}_t / (\\sqrt{\\hat{v}_t} + \\epsilon)` -> `m_t / (√v_t + ε)`."""
    text = _FRAC.sub(r"(\1)/(\2)", tex)

    def command(match):
        name = match.group(1)
        if name in ",;:! ":
            return " "
        if name in "_%#":
            return name
        if name in "{}":
            return "\x01" if name == "{" else "\x02"  # a literal brace, kept below
        return _SYMBOLS.get(name, " " if name in _DROP else name)

    text = _COMMAND.sub(command, text)
    text = re.sub(r"[{}]|&amp;|\\\\", "", text)
    text = " ".join(text.split())
    return re.sub(r"(?<=[(\[√]) | (?=[)\]_^])", "", text).translate({1: "{", 2: "}"})


def maths_as_text(html: str) -> str:
    return _MATH.sub(lambda m: tex_to_text(m.group(1) or m.group(2) or ""), html)


# --- Keywords -------------------------------------------------------------------------


def _names() -> dict[str, list[str]]:
    """The dotted path of each documented public object -> the names it is found by
    (its own, then its aliases: `eqxopt.schedules.CosineDecay` is also
    `cosine_decay_schedule`)."""
    import eqxopt

    out: dict[str, list[str]] = {}
    for module in (eqxopt, eqxopt.schedules):
        for name in dir(module):
            obj = getattr(module, name)
            if name.startswith("_") or inspect.ismodule(obj):
                continue
            own = obj.__name__ if inspect.isclass(obj) else name
            out.setdefault(f"{module.__name__}.{own}", [own])
            if own != name:
                out[f"{module.__name__}.{own}"].append(name)
    return out


def on_post_build(config, **kwargs):
    path = pathlib.Path(config["site_dir"]) / "search" / "search_index.json"
    if not path.exists():
        return
    index = json.loads(path.read_text())
    separator = re.compile(index["config"]["separator"])
    index["config"]["fields"]["keywords"] = {"boost": KEYWORDS_BOOST}
    index["config"]["fields"]["topics"] = {"boost": TOPICS_BOOST}
    index["config"]["fields"]["aliases"] = {"boost": ALIASES_BOOST}
    names = _names()
    counter = 0

    def unique(words: list[str]) -> str:
        # `adam~bq`: still found by `adam*`, and in no other document. The suffix is
        # letters: lunr's index of words mixes up digits with its own node numbers.
        nonlocal counter
        out = []
        for word in words:
            counter, n, suffix = counter + 1, counter, ""
            while True:
                n, digit = divmod(n, 26)
                suffix = chr(ord("a") + digit) + suffix
                if n == 0:
                    break
            out.append(f"{word.lower()}~{suffix}")
        return " ".join(out)

    def split(name: str) -> list[str]:
        return [w for w in separator.split(name) if w]

    modules: dict[str, str] = {}  # module -> the page of its entries
    for doc in index["docs"]:
        doc["title"] = maths_as_text(doc["title"])
        doc["text"] = maths_as_text(doc["text"])
        match = _ENTRY.search(doc["location"])
        dotted = match and f"{match.group(1)}.{match.group(2)}"
        if dotted in names:
            own, *aliases = names[dotted]
            doc["keywords"] = unique(split(own))
            if aliases:
                doc["aliases"] = unique(aliases)
            # Between names with the same words, the shorter one first.
            doc["boost"] = doc.get("boost", 1) * (1 + (64 - len(own)) / 640)
            modules.setdefault(match.group(1), doc["location"].split("#")[0])
        elif doc["location"] in _page_keywords:
            words = [w for k in _page_keywords[doc["location"]] for w in split(k)]
            doc["topics"] = unique(words)
    for module, page in modules.items():
        if module != "eqxopt":  # `eqxopt.schedules`: its page is found as `schedules`
            doc = next(d for d in index["docs"] if d["location"] == page)
            doc["aliases"] = unique([module.rsplit(".", 1)[1]])
    path.write_text(json.dumps(index, separators=(",", ":"), ensure_ascii=False))
