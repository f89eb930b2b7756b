"""Every error message that tells the user to do something is on the troubleshooting page.

Which messages count. They are collected from the source of the package (``edgeq/``): every
construction of an error class that carries a hint (a class whose ``__init__`` takes ``hint``:
``EdgeqError``, and the agent's ``ShapeError``, which the host re-raises as one) or a subclass of one,
found by class name, or of ``typer.BadParameter``, that

- carries a hint: the second argument or ``hint=``, not None (``EdgeqError``'s "what to do about it"),
  whether or not its text can be read from the source, or
- gives an instruction in its own text: "give", "use", "add", "pass", "set", "remove", "put", "run",
  "rename", "re-export", "install", "leave", "check", "choose", "fix", "write", "point", "load" opening
  the message or a clause (after ``:``, ``;``, ``,``, ``(``, "or", "and"), or "needs" anywhere
  ("sensitivity needs calibration data (--calib DIR)").

A message's fixed text is its literal parts; an f-string's ``{...}`` and whatever is computed elsewhere
are holes. A name is followed to a module constant of edgeq (``LAYERS_HINT``), to its assignments in the
same function (each one a form the message can take), or, for a call of an edgeq function, to the strings
it returns (``hint_for``); anything else is a hole. A construction with no letter in its fixed text
re-raises another error's text (``GraphError(e.message, hint=e.hint)``): the error it carries is collected
where it is raised, and this one is skipped.

How the page names one. An entry is a block of non-blank lines of ``docs/troubleshooting.md``; a message
is named when one entry holds its fixed parts in order (anything between them: write the holes as
``<placeholders>``) and its hint's fixed parts in order. So an entry may name several messages that share
a cause, and rewording a message fails this test until the page says what the user now sees. On failure
the test prints each missing message as a template (holes as ``…``), ready to paste into the page.
"""

from __future__ import annotations

import ast
import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "troubleshooting.md"
HOLE = "\0"
_VERBS = ("give|use|add|pass|set|remove|put|run|rename|re-export|install|leave|check|choose|fix|write|"
          "point|load")
INSTRUCTION = re.compile(rf"(?:^|[:;,(]\s*|\b(?:or|and)\s+)(?:{_VERBS})\b|\bneeds\b", re.IGNORECASE)


@dataclass(frozen=True)
class Site:
    where: str  # file:line
    message: tuple[str, ...]  # fixed parts, in order
    hint: tuple[str, ...]

    def template(self) -> str:
        msg = " … ".join(self.message) if self.message else "…"
        return msg + (f" ({' … '.join(self.hint)})" if self.hint else "")


def _parts(template: str) -> tuple[str, ...]:
    return tuple(p for p in (" ".join(s.split()) for s in template.split(HOLE)) if p)


class _Source:
    """Every module of the host package, parsed once: error classes, constants and functions by name."""

    def __init__(self) -> None:
        files = sorted((ROOT / "edgeq").rglob("*.py"))
        self.trees = {p: ast.parse(p.read_text(encoding="utf-8"), str(p)) for p in files}
        self.constants: dict[str, list[ast.expr]] = {}
        self.functions: dict[str, list[ast.FunctionDef]] = {}
        for tree in self.trees.values():
            for node in tree.body:
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                    self.constants.setdefault(node.targets[0].id, []).append(node.value)
                elif isinstance(node, ast.FunctionDef):
                    self.functions.setdefault(node.name, []).append(node)
        self.errors = self._error_classes()

    def _error_classes(self) -> set[str]:
        classes = [n for t in self.trees.values() for n in ast.walk(t) if isinstance(n, ast.ClassDef)]
        inits = [(c, f) for c in classes for f in c.body
                 if isinstance(f, ast.FunctionDef) and f.name == "__init__"]  # fmt: skip
        names = {c.name for c, f in inits if any(a.arg == "hint" for a in f.args.args + f.args.kwonlyargs)}
        grew = True
        while grew:
            grew = False
            for c in classes:
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in c.bases}
                if c.name not in names and bases & names:
                    names.add(c.name)
                    grew = True
        return names

    def forms(self, node: Optional[ast.expr], scope: Optional[list[ast.FunctionDef]], depth: int = 0
              ) -> list[str]:
        """The texts ``node`` can be, holes as HOLE; [""] for no text (None)."""
        if node is None or depth > 4:
            return [""] if node is None else [HOLE]
        if isinstance(node, ast.Constant):
            return [node.value] if isinstance(node.value, str) else [""] if node.value is None else [HOLE]
        if isinstance(node, ast.JoinedStr):
            return ["".join(v.value if isinstance(v, ast.Constant) else HOLE for v in node.values)]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):  # the agent's "%s" formatting
            spec = r"%[-#0 +]*\d*(?:\.\d+)?[sdrifgx]"
            return [re.sub(spec, HOLE, f) for f in self.forms(node.left, scope, depth + 1)]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.forms(node.left, scope, depth + 1), self.forms(node.right, scope, depth + 1)
            pairs = itertools.product(left, right)
            return [a + b for a, b in pairs] if len(left) * len(right) <= 8 else [HOLE]
        if isinstance(node, ast.BoolOp):  # `e.hint or "see ..."`: either
            return [f for v in node.values for f in self.forms(v, scope, depth + 1)]
        if isinstance(node, ast.Subscript):  # f"..."[:200]
            return self.forms(node.value, scope, depth + 1)
        if isinstance(node, ast.IfExp):  # `a if near else b`: either
            return self.forms(node.body, scope, depth + 1) + self.forms(node.orelse, scope, depth + 1)
        if isinstance(node, ast.Name):
            values = next((v for v in map(lambda fn: _bound(fn, node.id), scope or []) if v is not None),
                          self.constants.get(node.id, []))  # innermost enclosing function first
            return [f for v in values for f in self.forms(v, None, depth + 1)] or [HOLE]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in self.functions:
            found = [f for fn in self.functions[node.func.id] for r in ast.walk(fn)
                     if isinstance(r, ast.Return) and r.value is not None
                     for f in self.forms(r.value, [fn], depth + 1)]  # fmt: skip
            return [f for f in found if f] or [HOLE]
        return [HOLE]

    def sites(self) -> list[Site]:
        out: dict[tuple[tuple[str, ...], tuple[str, ...]], Site] = {}
        for path, tree in self.trees.items():
            scopes: dict[int, list[ast.FunctionDef]] = {}  # node -> its enclosing functions, innermost first
            for fn in ast.walk(tree):  # outer functions come first, so inner ones are prepended later
                if isinstance(fn, ast.FunctionDef):
                    for n in ast.walk(fn):
                        scopes[id(n)] = [fn, *scopes.get(id(n), [])]
            for call in ast.walk(tree):
                if not isinstance(call, ast.Call):
                    continue
                name = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", "")
                if name not in self.errors and name != "BadParameter":
                    continue
                scope = scopes.get(id(call))
                msg_node = call.args[0] if call.args else next(
                    (k.value for k in call.keywords if k.arg in ("message", "msg")), None)
                hint_node = None if name == "BadParameter" else call.args[1] if len(call.args) > 1 else next(
                    (k.value for k in call.keywords if k.arg == "hint"), None)
                hints = self.forms(hint_node, scope)
                for message, hint in itertools.product(self.forms(msg_node, scope), hints):
                    instructs = any(hints) or INSTRUCTION.search(message.replace(HOLE, "…"))
                    site = Site(f"{path.relative_to(ROOT)}:{call.lineno}", _parts(message), _parts(hint))
                    if instructs and re.search("[A-Za-z]", "".join(site.message + site.hint)):
                        out.setdefault((site.message, site.hint), site)
        return list(out.values())


def _bound(fn: ast.FunctionDef, name: str) -> Optional[list[ast.expr]]:
    """What ``name`` is bound to in ``fn``: its assignments and its parameter default; None when ``fn``
    does not bind it (look further out)."""
    assigned = []
    for a in ast.walk(fn):
        targets = a.targets if isinstance(a, ast.Assign) else (
            [a.target] if isinstance(a, ast.AnnAssign) else [])
        value = getattr(a, "value", None)
        if value is not None and any(isinstance(t, ast.Name) and t.id == name for t in targets):
            assigned.append(value)
    params = fn.args.args + fn.args.kwonlyargs
    positional = [None] * (len(fn.args.args) - len(fn.args.defaults)) + list(fn.args.defaults)
    defaults = positional + list(fn.args.kw_defaults)
    default = [d for a, d in zip(params, defaults) if a.arg == name and d is not None]
    if assigned or default or any(a.arg == name for a in params):
        return assigned + default
    return None


def entries(text: str) -> list[str]:
    """The page's entries: blocks of non-blank lines, whitespace collapsed, table pipes unescaped."""
    return [" ".join(b.replace("\\|", "|").split()) for b in re.split(r"\n\s*\n", text) if b.strip()]


def _in_order(parts: tuple[str, ...], text: str) -> bool:
    at = 0
    for p in parts:
        at = text.find(p, at)
        if at < 0:
            return False
        at += len(p)
    return True


def named(site: Site, page_entries: list[str]) -> bool:
    return any(_in_order(site.message, e) and _in_order(site.hint, e) for e in page_entries)


def test_every_message_that_tells_the_user_to_act_is_on_the_troubleshooting_page():
    sites = _Source().sites()
    page = entries(PAGE.read_text(encoding="utf-8"))
    missing = sorted((s for s in sites if not named(s, page)), key=lambda s: s.where)
    where = PAGE.relative_to(ROOT)
    assert not missing, (f"{len(missing)} of {len(sites)} messages are not on {where}; add an entry (the "
                         "message as printed, its cause and fix) for each:\n"
                         + "\n".join(f"  {s.where}: {s.template()}" for s in missing))  # fmt: skip


def test_the_rule_collects_hints_instructions_and_resolved_names_and_skips_pass_throughs():
    sites = {(s.message, s.hint) for s in _Source().sites()}
    # a hint given inline
    assert ((": not an ONNX model (", ")"), ("give the binary .onnx file",)) in sites
    # an instruction in the message alone, and a typer usage error
    assert any(m == (": mixes arrays (.npy/.npz) and images; use one kind per directory",) for m, _ in sites)
    assert any(m == ("give --engines DIR DIR ... (offline) or MODEL --target T (build)",) for m, _ in sites)
    # a hint held in a module constant (report/parse.py's LAYERS_HINT) and one built by a helper (hint_for)
    assert any(": \"Layers\" must be a list, got" in m and h and "--exportLayerInfo" in " ".join(h)
               for m, h in sites)  # fmt: skip
    assert any("failed at stage '" in " ".join(m) and "backend: trtexec" in " ".join(h) for m, h in sites)
    # plain statements of fact are not collected; re-raised text (GraphError(e.message, hint=hint)) has no
    # fixed text of its own and is skipped
    assert not any(m == (": the .npz file holds no arrays",) for m, _ in sites)
    assert all(re.search("[A-Za-z]", "".join(m + h)) for m, h in sites)
    assert len(sites) > 150


def test_an_entry_names_a_message_only_with_its_fixed_parts_in_order_and_its_hint():
    site = Site("x.py:1", (": not an ONNX model (", ")"), ("give the binary .onnx file",))
    good = entries("`<path>: not an ONNX model (<why>) (give the binary .onnx file)`\n: Cause: ...\n")
    assert named(site, good)
    assert not named(site, entries("`<path>: not an ONNX model (<why>)`\n: Cause: ...\n"))  # no hint
    assert not named(site, entries("`<path>: not an ONNX model`\n\n(give the binary .onnx file)\n"))  # split
    assert not named(site, entries(") give the binary .onnx file : not an ONNX model (\n"))  # out of order
