"""The documentation site as a reader sees it: every page opened in headless Chromium.

The site is built once (`mkdocs build --strict`), served on 127.0.0.1 and every page
is loaded at 1280x900 in one browser session. The tests below read what the browser
reported: console errors, the maths as drawn, the visible text, the layout, the links,
and what the search box shows for every public name.

Needs Debian's `chromium` and `chromium-driver` (`.ci/run` installs them) and
`selenium` (the `dev` extra). Without them the tests are skipped, except in CI
(`CI=true`), where they fail.
"""

import functools
import http.server
import os
import pathlib
import re
import shutil
import threading
import urllib.parse

import pytest


ROOT = pathlib.Path(__file__).resolve().parents[1]
WIDTH, HEIGHT = 1280, 900
# Maths left as TeX, seen by a reader: `$...$`, `\(...\)`, `\[...\]`, `\beta`, `\|`.
RAW_TEX = re.compile(r"\$|\\[()\[\]|]|\\[A-Za-z]+")
# Words a reader searches for, and the guide (page or section) that must come first.
GUIDE_QUERIES = {
    "bf16": "mixed_precision/",
    "bfloat16": "mixed_precision/",
    "gradient accumulation": "accumulation/",
    "learning rate schedule": "schedules/",
}


def _browser_tools() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing = "selenium (pip install -e '.[dev]')"
    else:
        missing = None if chromium and driver else "chromium and chromium-driver"
    if missing is not None:
        reason = f"{missing} not installed: apt-get install -y chromium chromium-driver"
        if os.environ.get("CI") == "true":
            pytest.fail(f"the browser test must run in CI, but {reason}")
        pytest.skip(reason)
    assert chromium is not None and driver is not None
    return chromium, driver


# --- In the page ----------------------------------------------------------------------
#
# Each script is run with `execute_async_script`: its last argument is the callback.

# Waits until the page has loaded and MathJax has typeset it with its fonts, then
# reports what a reader would see.
_INSPECT = r"""
const done = arguments[arguments.length - 1];
(async () => {
  if (document.readyState !== "complete")
    await new Promise(r => addEventListener("load", r, { once: true }));
  for (let i = 0; i < 2; i++) {  // a second typeset may be queued behind the first
    if (window.MathJax && MathJax.startup && MathJax.startup.promise)
      await MathJax.startup.promise;
    await document.fonts.ready;
    await new Promise(r => setTimeout(r, 50));
  }
  const where = el => {
    const text = (el.textContent || "").trim().replace(/\s+/g, " ").slice(0, 60);
    return `<${el.tagName.toLowerCase()}${el.id ? "#" + el.id : ""}> "${text}"`;
  };

  // Every MathJax character is drawn by a CSS rule on its `::before`.
  const glyphs = [...document.querySelectorAll("mjx-c")];
  const blank = glyphs.filter(c => {
    const content = getComputedStyle(c, "::before").content;
    return !content || content === "none" || content === "normal";
  });
  const errors = [...document.querySelectorAll("mjx-merror")].map(where);

  // Visible text outside code and typeset maths.
  const tex = new RegExp(arguments[0]);
  const raw = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const node = walker.currentNode, el = node.parentElement;
    if (!el || !tex.test(node.data)) continue;
    if (el.closest("pre, code, kbd, script, style, mjx-container, .md-search"))
      continue;
    if (!el.checkVisibility()) continue;
    raw.push(node.data.trim().replace(/\s+/g, " ").slice(0, 100));
  }

  // Layout: nothing outside the content column, and nothing hidden behind a
  // horizontal scroll except code blocks and displayed formulas.
  const column = document.querySelector(".md-content");
  const box = column.getBoundingClientRect();
  const scrolls = el => /auto|scroll|hidden|clip/.test(getComputedStyle(el).overflowX);
  const mayScroll = "pre, div.arithmatex";
  const wide = [];
  for (const el of column.querySelectorAll("*")) {
    const r = el.getBoundingClientRect();
    const hides = el.scrollWidth > el.clientWidth + 1;
    if (!hides && r.left >= box.left - 1 && r.right <= box.right + 1) continue;
    if (r.width === 0 || el.parentElement.closest(`${mayScroll}, mjx-container`))
      continue;
    if (el.closest("mjx-assistive-mml") || !el.checkVisibility()) continue;
    if (hides && scrolls(el)) {
      const hidden = el.scrollWidth - el.clientWidth;
      if (!el.matches(mayScroll))
        wide.push(`${where(el)} hides ${hidden} px in a scroll`);
      continue;
    }
    if (r.left >= box.left - 1 && r.right <= box.right + 1) continue;
    let clip = el.parentElement;
    while (clip !== column && !scrolls(clip)) clip = clip.parentElement;
    if (clip === column)
      wide.push(`${where(el)} spans ${Math.round(r.left)}-${Math.round(r.right)} px, ` +
                `the column ${Math.round(box.left)}-${Math.round(box.right)} px`);
  }

  const ids = [...document.querySelectorAll("[id]")].map(e => e.id);
  ids.push(...[...document.querySelectorAll("a[name]")].map(e => e.name));
  const links = [...document.querySelectorAll("a[href]")]
    .map(a => a.href)
    .filter(href => href.startsWith(location.origin));
  done({ glyphs: glyphs.length, blank: blank.length, errors, raw, wide, ids, links,
         width: innerWidth, height: innerHeight });
})().catch(e => done({ failed: String(e && e.stack || e) }));
"""

# Types each query into the search box, as a reader would, and reports the links of
# the first result (its page, then its best sections) and the text of all results.
_SEARCH = r"""
const [queries, done] = [arguments[0], arguments[arguments.length - 1]];
(async () => {
  const input = document.querySelector("input.md-search__input");
  const meta = document.querySelector(".md-search-result__meta");
  const list = document.querySelector(".md-search-result__list");
  const textOf = el => {  // prose only: code in a result is shown as written
    const copy = el.cloneNode(true);
    copy.querySelectorAll("pre, code").forEach(c => c.remove());
    return copy.textContent;
  };
  input.focus();
  for (let i = 0; /Initializing/i.test(meta.textContent); i++) {
    if (i > 600) throw new Error("the search index did not load: " + meta.textContent);
    await new Promise(r => setTimeout(r, 50));
  }
  const out = {};
  for (const query of queries) {
    // The result metadata ("N matching documents") is rewritten for every answer.
    const answered = new Promise(resolve => {
      const observer = new MutationObserver(() => {
        observer.disconnect();
        resolve(true);
      });
      observer.observe(meta, { childList: true, characterData: true, subtree: true });
      setTimeout(() => { observer.disconnect(); resolve(false); }, 10000);
    });
    input.value = query;
    input.dispatchEvent(new KeyboardEvent("keyup", { bubbles: true }));
    const ok = await answered;
    const first = list.querySelector("li.md-search-result__item");
    out[query] = {
      answered: ok,
      // Its page, then the sections shown (not those folded under "N more").
      first: first ? [...first.querySelectorAll("a.md-search-result__link")]
        .filter(a => !a.closest("details"))
        .map(a => a.getAttribute("href")) : [],
      text: textOf(list),
    };
  }
  done(out);
})().catch(e => done({ failed: String(e && e.stack || e) }));
"""


# --- The site, served and opened ------------------------------------------------------


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


def _public_names() -> dict[str, str]:
    """Every public name -> the id of its API entry (an alias: its class's entry; a
    module: the module's name)."""
    import inspect

    import eqxopt

    out = {}
    for module, prefix in [(eqxopt, "eqxopt"), (eqxopt.schedules, "eqxopt.schedules")]:
        for name in dir(module):
            if name.startswith("_"):
                continue
            obj = getattr(module, name)
            if inspect.ismodule(obj) and not obj.__name__.startswith("eqxopt."):
                continue  # `jaxtyping`, which the suite's import hook adds
            if inspect.ismodule(obj):
                out[name] = name  # no dot: found as its API page
            elif inspect.isclass(obj) and obj.__name__ != name:
                out[name] = f"{prefix}.{obj.__name__}"
            else:
                out[name] = f"{prefix}.{name}"
    return out


def _open(site: pathlib.Path) -> dict:
    """Serves the built `site`, opens every page and runs every search."""
    chromium, driver_path = _browser_tools()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    pages = sorted(
        str(p.parent.relative_to(site)) + "/"
        for p in site.rglob("index.html")
        if not p.parent.is_relative_to(site / "javascripts")
    )
    pages = ["" if p == "./" else p for p in pages]

    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage"]:
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    metrics = {
        "width": WIDTH,
        "height": HEIGHT,
        "deviceScaleFactor": 1,
        "mobile": False,
    }
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)

    def console() -> list[str]:
        return [
            e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"
        ]

    try:
        driver.set_script_timeout(120)
        reports = {}
        for page in pages:
            driver.get(base + page)
            report = driver.execute_async_script(_INSPECT, RAW_TEX.pattern)
            assert "failed" not in report, (page, report["failed"])
            report["console"] = console()
            reports[page] = report
        driver.get(base)
        names = _public_names()
        searches = driver.execute_async_script(_SEARCH, [*names, *GUIDE_QUERIES])
        assert "failed" not in searches, searches["failed"]
        search_console = console()
    finally:
        driver.quit()
        server.shutdown()
        server.server_close()
    return {
        "site": site,
        "base": base,
        "pages": reports,
        "searches": searches,
        "names": names,
        "search_console": search_console,
    }


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from ._site import build_site

    _browser_tools()
    return _open(build_site(tmp_path_factory))


def _failures(browser, key) -> dict[str, list]:
    return {p: r[key] for p, r in browser["pages"].items() if r[key]}


# --- What a reader sees ---------------------------------------------------------------


def test_every_page_is_opened_at_the_reader_size(browser):
    assert len(browser["pages"]) > 20
    sizes = {(r["width"], r["height"]) for r in browser["pages"].values()}
    assert sizes == {(WIDTH, HEIGHT)}


def test_no_console_errors(browser):
    errors = _failures(browser, "console")
    assert not errors, errors
    assert not browser["search_console"], browser["search_console"]


def test_every_maths_character_is_drawn(browser):
    pages = browser["pages"]
    assert sum(r["glyphs"] for r in pages.values()) > 1000, "no maths was typeset"
    blank = {
        p: f"{r['blank']} of {r['glyphs']}" for p, r in pages.items() if r["blank"]
    }
    assert not blank, f"MathJax characters drawn blank (page: blank of all): {blank}"
    errors = _failures(browser, "errors")
    assert not errors, f"TeX errors shown in red: {errors}"


def test_no_raw_tex_in_visible_text(browser):
    raw = _failures(browser, "raw")
    assert not raw, f"TeX a reader sees as typed: {raw}"


def test_nothing_is_wider_than_the_content_column(browser):
    wide = _failures(browser, "wide")
    assert not wide, f"at {WIDTH}x{HEIGHT}: {wide}"


def test_every_internal_link_and_anchor_exists(browser):
    base, site, reports = browser["base"], browser["site"], browser["pages"]
    broken = []
    for page, report in reports.items():
        for href in set(report["links"]):
            url = urllib.parse.urlsplit(href)
            path = urllib.parse.unquote(url.path)[1:]
            if path in reports or path + "/" in reports:
                target = reports.get(path, reports.get(path + "/"))
                fragment = urllib.parse.unquote(url.fragment)
                if fragment and fragment not in target["ids"]:
                    broken.append(
                        f"{page or '/'} -> {href[len(base) :]} (no such anchor)"
                    )
            elif not (site / path).is_file():
                broken.append(f"{page or '/'} -> {href[len(base) :]} (no such page)")
    assert not broken, "\n".join(sorted(broken))


# --- The search box -------------------------------------------------------------------


def _entry_pages(browser) -> dict[str, str]:
    """Anchor id -> the page that holds it."""
    return {i: p for p, r in browser["pages"].items() for i in r["ids"]}


def _target(href: str) -> str:
    url = urllib.parse.urlsplit(href)
    return url.path.lstrip("/") + (f"#{url.fragment}" if url.fragment else "")


def test_search_puts_each_public_name_s_entry_first(browser):
    where = _entry_pages(browser)
    wrong = []
    for name, anchor in browser["names"].items():
        result = browser["searches"][name]
        first = [_target(h) for h in result["first"]]
        if "." not in anchor:  # a module: its API page
            pages = {where[i] for i in where if i.startswith(f"eqxopt.{anchor}.")}
            ok = bool(first) and first[0] in pages
        else:
            ok = len(first) > 1 and first[1] == f"{where.get(anchor)}#{anchor}"
        if not (result["answered"] and ok):
            wrong.append(f"{name}: first result {first[:2]}")
    assert not wrong, "\n".join(wrong)


def test_search_finds_the_guide_for_common_words(browser):
    wrong = []
    for query, expected in GUIDE_QUERIES.items():
        first = [_target(h) for h in browser["searches"][query]["first"]]
        if first[:1] != [expected]:
            wrong.append(f"{query!r}: first result {first[:2]}, expected {expected}")
    assert not wrong, "\n".join(wrong)


def test_search_results_show_no_raw_tex(browser):
    raw = {
        q: RAW_TEX.findall(r["text"])[:5]
        for q, r in browser["searches"].items()
        if RAW_TEX.search(r["text"])
    }
    assert not raw, f"TeX in the text of search results: {raw}"
