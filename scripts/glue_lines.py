"""How many lines of an agent are zincir glue, and which.

Usage: python scripts/glue_lines.py [--show] FILE...

A line is glue when it belongs to a statement that names zincir: an import from zincir, a name
imported from it (``zincir``, ``za``, ``CheckpointState``, ``effect_ledger``, ...), or a variable
that holds one of its objects: a parameter annotated with a zincir type (``run: zincir.Run``,
``pending: PendingToolCall``, ``state: CheckpointState``) or a name bound by ``async with`` from
one (``db``, ``run``). A compound statement (``def``, ``for``, ``if``, ``with``) counts its
header only, and a ``def`` only when its signature names zincir; blank lines, comments and
docstrings never count. The rest is agent logic: prompts, tool schemas, tools, the model client.

docs/adapters.md quotes the counts of the adapter examples; tests/test_adapter_examples.py keeps
them at 40 or less.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable
from pathlib import Path

_BODIES = ("body", "orelse", "finalbody", "handlers")


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def zincir_names(tree: ast.Module) -> set[str]:
    """The names that stand for zincir or its objects in ``tree``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {
                (a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] == "zincir"
            }
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "zincir":
            names |= {a.asname or a.name for a in node.names}
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None and _names(node.annotation) & names:
            names.add(node.arg)
        elif isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                if item.optional_vars is not None and _names(item.context_expr) & names:
                    names |= _names(item.optional_vars)
    return names


def glue_lines(source: str) -> list[int]:
    """The line numbers of ``source`` that are zincir glue, in order."""
    tree = ast.parse(source)
    names = zincir_names(tree)
    found: set[int] = set()

    def visit(statements: Iterable[ast.AST]) -> None:
        for stmt in statements:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue  # a docstring
            if isinstance(stmt, ast.Import | ast.ImportFrom):
                imported = {(a.asname or a.name).split(".")[0] for a in stmt.names}
                if imported & names:
                    found.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
                continue
            if isinstance(stmt, ast.ExceptHandler):
                if stmt.type is not None and _names(stmt.type) & names:
                    found.add(stmt.lineno)
                visit(stmt.body)
                continue
            bodies = [getattr(stmt, f) for f in _BODIES if getattr(stmt, f, None)]
            if not bodies:
                if _names(stmt) & names:
                    found.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
                continue
            first = min(s.lineno for body in bodies for s in body)
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                header: list[ast.AST] = [stmt.args] if not isinstance(stmt, ast.ClassDef) else stmt.bases
                header += [stmt.returns] if not isinstance(stmt, ast.ClassDef) and stmt.returns else []
            else:
                header = [v for f, v in ast.iter_fields(stmt) if f not in _BODIES and isinstance(v, ast.AST)]
                header += [i for f, v in ast.iter_fields(stmt) if f not in _BODIES and isinstance(v, list)
                           for i in v if isinstance(i, ast.AST)]  # fmt: skip
            if any(_names(h) & names for h in header):
                found.update(range(stmt.lineno, first))
            for body in bodies:
                visit(body)

    visit(tree.body)
    lines = source.splitlines()
    return sorted(n for n in found if lines[n - 1].strip() and not lines[n - 1].strip().startswith("#"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/glue_lines.py", description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE")
    parser.add_argument("--show", action="store_true", help="print each glue line")
    args = parser.parse_args(argv)
    for path in args.files:
        source = path.read_text()
        glue = glue_lines(source)
        code = [line for line in source.splitlines() if line.strip()]
        print(f"{path}: {len(glue)} lines of zincir glue ({len(code)} non-blank lines in all)")
        if args.show:
            lines = source.splitlines()
            for number in glue:
                print(f"  {number:4}  {lines[number - 1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
