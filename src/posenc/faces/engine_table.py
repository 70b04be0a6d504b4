"""The cross-engine table: every case of the RoPE config list, run by every engine.

:func:`measure` runs each engine of :data:`~posenc.integration.analysis.engines.ENGINES`
on every config of :data:`~posenc.integration.analysis.engine_cases.CASES` (one child
process per engine, :func:`~posenc.integration.analysis.engines.run_cases`) and returns
the document :func:`write` saves; ``make engine-table`` writes it to the bundled
``data/rope-engines.json``. :func:`markdown` is the guide's table of it and :func:`html`
the report's view (a config chooser and, for the config chosen, which engines agree).
"""

from __future__ import annotations

import html as _html
import json
import platform
import time
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from posenc.core.files import atomic_write
from posenc.faces import bundle

#: The table lies between these two lines of :data:`GUIDE` (``make engine-table`` rewrites it).
README_MARKERS = ("<!-- engine-table -->", "<!-- /engine-table -->")
#: The page, relative to the repository, that shows the table (the patching guide).
GUIDE = "docs/guides/patching.md"

#: The bundled table's file name in ``posenc/faces/data``.
BUNDLED = "rope-engines.json"
_MARK = {"same": "same", "different": "**different**", "refused": "refused",
         "error": "error", "not installed": "not installed"}  # fmt: skip


def measure(
    names: Sequence[str] | None = None, overrides: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Run every engine of ``names`` (default: all) on every case; the table's document."""
    from posenc.integration.analysis import engine_logits, engines
    from posenc.integration.analysis.engine_cases import CASES
    from posenc.integration.analysis.engine_logits import LOGIT_CASES

    names = list(engines.ENGINES) if names is None else list(names)
    configs = [case.data() for case in CASES.values()]
    results: dict[str, dict[str, Any]] = {name: {} for name in CASES}
    versions: dict[str, str | None] = {}
    seconds: dict[str, float] = {}
    for engine in names:
        started = time.monotonic()
        python = engines.engine_python(engine, overrides)
        for case, result in zip(CASES, engines.run_cases(engine, configs, python), strict=True):
            doc = result.as_json()
            doc.pop("python", None)
            for w in doc["windows"]:
                w.pop("positions", None)
                w.pop("position_ids", None)
            results[case][engine] = doc
            versions[engine] = versions.get(engine) or result.version
        seconds[engine] = round(time.monotonic() - started, 1)
    logits: dict[str, list[dict[str, Any]]] = {}
    for engine in (n for n in names if engines.ENGINES[n].logits):
        started = time.monotonic()
        python = engines.engine_python(engine, overrides)
        logits[engine] = [r.as_json() for r in engine_logits.run_logits(engine, python=python)]
        seconds[f"{engine} logits"] = round(time.monotonic() - started, 1)
    return {
        "engines": names,
        "versions": versions,
        "seconds": seconds,
        "machine": f"{platform.system()} {platform.machine()}, Python {platform.python_version()}",
        "cases": [
            {"name": c.name, "what": c.what, "config": c.config, "results": results[c.name]}
            for c in CASES.values()
        ],
        "logits": logits,
        "logit_cases": [{"name": c.name, "what": c.what} for c in LOGIT_CASES.values()],
    }


def write(doc: Mapping[str, Any], path: Path) -> None:
    """Write ``doc`` as JSON to ``path`` atomically (:func:`posenc.core.files.atomic_write`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


def readme(text: str, doc: Mapping[str, Any]) -> str:
    """``text`` (a guide's page) with the table between :data:`README_MARKERS` made from ``doc``.

    Raises:
        ValueError: the markers are missing or out of order.
    """
    return bundle.between(text, README_MARKERS, markdown(doc), "engine table")


def bundled() -> dict[str, Any] | None:
    """The table measured when the package was released (None if absent)."""
    return bundle.read(BUNDLED)


def _cell(result: Mapping[str, Any]) -> str:
    return str(result.get("verdict", "-"))


def _why(result: Mapping[str, Any]) -> str:
    """One short phrase: what differs, or what the engine said."""
    verdict = result.get("verdict")
    if verdict == "same":
        return ""
    if verdict in ("refused", "error", "not installed"):
        return str(result.get("note") or "")
    parts = []
    if result.get("cause"):
        parts.append(str(result["cause"]))
    if result.get("note"):
        parts.append(str(result["note"]))
    first = result.get("first_difference") or {}
    if first and not parts:
        parts.append(f"from seq_len {first.get('seq_len')}, position {first.get('position')}, "
                     f"pair {first.get('pair')}")  # fmt: skip
    return "; ".join(parts)


def _short(text: str, limit: int) -> str:
    """``text`` cut at a clause boundary within ``limit`` characters (the report's budget)."""
    if len(text) <= limit:
        return text
    cut = max(text.rfind("; ", 0, limit), text.rfind(", ", 0, limit))
    return (text[:cut] if cut > limit // 2 else text[: limit - 1]) + " ..."


def _brief(result: Mapping[str, Any]) -> str:
    """What differs, in a phrase: the likely cause, else the first window that differs,
    else what the engine said."""
    if result.get("verdict") == "different":
        if result.get("cause"):
            return str(result["cause"])
        for w in result.get("windows") or []:
            if not w.get("same"):
                return str(w.get("summary") or "")
    return _why(result)


def markdown(doc: Mapping[str, Any]) -> str:
    """The guide's table: one row per case, one column per engine."""
    names = list(doc["engines"])
    head = "| case | " + " | ".join(names) + " |"
    rule = "|---|" + "---|" * len(names)
    rows = [head, rule]
    for case in doc["cases"]:
        cells = [_MARK.get(_cell(case["results"].get(n, {})), "-") for n in names]
        rows.append(f"| {case['name']} | " + " | ".join(cells) + " |")
    versions = ", ".join(str(v) for v in doc["versions"].values() if v)
    rows.append("")
    rows.append(f"Measured with {versions}, on {doc['machine']}.")
    switching = switching_rules(doc)
    if switching:
        rows += ["", "When each engine switches LongRoPE's factor sets and dynamic NTK's base "
                 "(from its answer, read from its code):", ""]  # fmt: skip
        rows += [f"- **{n}**: {'; '.join(rules)}" for n, rules in switching.items()]
        silent = [n for n in names if n not in switching]
        if silent:
            rows.append(f"- {', '.join(silent)}: no LongRoPE or dynamic NTK config of the "
                        "table reaches a rotary module that switches (refused, or read "
                        "without the scaling)")  # fmt: skip
    logits = doc.get("logits") or {}
    if logits:
        names = list(logits)
        rows += ["", "End to end: next-token logits of tiny random-weight models, converted by "
                 "each engine's converter and run by its runtime, against transformers' in "
                 "float64 (`posenc engines logits`; *same* within float32's rounding "
                 "through the model; where they differ, the largest difference):", ""]  # fmt: skip
        rows += ["| model | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for case in doc.get("logit_cases", []):
            cells = []
            for n in names:
                r = _logits_of(logits, n, case["name"])
                v = str(r.get("verdict", "-"))
                shown = _MARK.get(v, v)
                if v == "different" and r.get("max_abs_diff") is not None:
                    shown += f" ({r['max_abs_diff']:.2g})"
                cells.append(shown)
            rows.append(f"| {case['name']} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


#: The keys of a case's config the report shows (what a RoPE reads; the guide and
#: ``rope-engines.json`` have the whole config).
_SHOWN = ("model_type", "rope", "max_position", "head_dim", "hidden_size", "attention_heads",
          "partial", "layer_types", "sliding", "mrope", "text_config", "qk_")  # fmt: skip


def _rope_keys(config: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _rope_keys(v) if isinstance(v, Mapping) and k == "text_config" else v
            for k, v in config.items() if any(part in k for part in _SHOWN)}  # fmt: skip


def _logits_of(logits: Mapping[str, Any], engine: str, case: str) -> dict[str, Any]:
    return dict(next((x for x in logits.get(engine, []) if x["case"] == case), {}))


def switching_rules(doc: Mapping[str, Any]) -> dict[str, list[str]]:
    """Each engine's switching rules (LongRoPE, dynamic NTK), as its answers state them."""
    out: dict[str, list[str]] = {}
    for case in doc["cases"]:
        for n, r in case["results"].items():
            rule = r.get("switching")
            if rule and rule not in out.setdefault(n, []):
                out[n].append(str(rule))
    return {n: rules for n, rules in out.items() if rules}


def html(doc: Mapping[str, Any] | None) -> str:
    """The report's cross-engine view: the whole table, and one config's details on choice."""
    if not doc:
        return ""
    esc = _html.escape

    def text(t: str) -> str:  # element content: quotes need no escape (the page's budget)
        return _html.escape(t, quote=False)

    names = list(doc["engines"])
    out = [
        "<h3>Does every engine read the config the same way?</h3>",
        "<p>The same config.json, read by each engine's own code in its own environment "
        "(its rotary module applied to unit vectors, at positions 0, 1, 2, around the "
        "original context length and at the longest), against transformers' reading. "
        "<em>same</em> allows only what float32 angles cost; <em>different</em> says where. "
        "Choose a config to see what each engine does with it.</p>",
        '<table class="numbers engines"><tr><th>config</th>'
        + "".join(f"<th>{esc(n)}</th>" for n in names)
        + "</tr>",
    ]
    for case in doc["cases"]:
        # the why of each cell is in the chosen config's details below (the page's budget)
        cells = "".join(
            f'<td class="v-{esc(_cell(case["results"].get(n, {})).replace(" ", "-"))}">'
            f"{esc(_cell(case['results'].get(n, {})))}</td>"
            for n in names
        )
        out.append(f"<tr><td>{esc(case['name'])}</td>{cells}</tr>")
    out.append("</table>")
    options = "".join(
        f'<option value="{i}">{esc(c["name"])}: {esc(c["what"])}</option>'
        for i, c in enumerate(doc["cases"])
    )
    out.append(f'<p><label>config <select id="engine-case">{options}</select></label></p>')
    for i, case in enumerate(doc["cases"]):
        rows = []
        agree = [n for n in names if _cell(case["results"].get(n, {})) == "same"]
        if agree:
            rows.append(f"<tr><td>{esc(', '.join(agree))}</td><td>same</td>"
                        "<td>agree with transformers</td></tr>")  # fmt: skip
        for n in names:
            r = case["results"].get(n, {})
            if _cell(r) != "same":
                rows.append(f"<tr><td>{esc(n)}</td><td>{esc(_cell(r))}</td>"
                            f"<td>{text(_short(_brief(r), 100))}</td></tr>")  # fmt: skip
        config = json.dumps(_rope_keys(case["config"]), separators=(", ", ": "))
        hidden = "" if i == 0 else " hidden"
        out.append(
            f'<div class="engine-case" data-case="{i}"{hidden}>'
            f'<table class="numbers">{"".join(rows)}</table>'
            f"<details><summary>config.json (its RoPE keys)</summary><pre>{text(config)}</pre>"
            "</details></div>"
        )
    out.append(
        "<script>document.getElementById('engine-case').addEventListener('change',e=>{"
        "document.querySelectorAll('.engine-case').forEach(d=>{"
        "d.hidden=d.dataset.case!==e.target.value})})</script>"
    )
    logits = doc.get("logits") or {}
    if logits:
        lnames = list(logits)
        out.append("<p>And end to end: each engine's converter turns a tiny random-weight "
                   "model into its own format, its runtime runs one prompt of 192 tokens "
                   "(an original context of 64), and its next-token logits are compared "
                   "with transformers' in float64:</p>")  # fmt: skip
        out.append('<table class="numbers engines"><tr><th>model</th>'
                   + "".join(f"<th>{esc(n)}</th>" for n in lnames) + "</tr>")  # fmt: skip
        for case in doc.get("logit_cases", []):
            cells = ""
            for n in lnames:
                r = _logits_of(logits, n, case["name"])
                v = str(r.get("verdict", "-"))
                cells += (f'<td class="v-{esc(v.replace(" ", "-"))}" '
                          f'title="{esc(_short(str(r.get("note") or ""), 160))}">'
                          f"{esc(v)}</td>")  # fmt: skip
            out.append(f'<tr><td title="{esc(case["what"])}">{esc(case["name"])}</td>{cells}</tr>')
        out.append("</table>")
    versions = ", ".join(str(v) for v in doc["versions"].values() if v)
    out.append(f'<p class="lead">Measured with {esc(versions)}; rerun with '
               "<code>posenc rope CONFIG --engines all</code> after "
               "<code>posenc engines build all</code>.</p>")  # fmt: skip
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m posenc.faces.engine_table [OUT]``: measure, write, print the guide's table."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    out = Path(args[0]) if args else Path(str(resources.files("posenc.faces"))) / "data" / BUNDLED
    doc = measure()
    write(doc, out)
    print(markdown(doc))
    readme_path = Path(__file__).resolve().parents[3] / GUIDE
    if not args and readme_path.is_file():  # the repository's guide, beside the package
        text = readme(readme_path.read_text(), doc)
        with atomic_write(readme_path, "w") as f:
            f.write(text)
        print(f"updated {readme_path}'s engine table")
    print(f"\nwrote {out} ({', '.join(f'{k} {v} s' for k, v in doc['seconds'].items())})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
