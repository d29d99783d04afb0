"""The adapter examples stay mostly agent logic: at most 40 lines of zincir glue each, counted by
scripts/glue_lines.py (docs/adapters.md quotes the counts)."""

from __future__ import annotations

import importlib.util
from types import ModuleType

import pytest

from .helpers import REPO


def counter() -> ModuleType:
    spec = importlib.util.spec_from_file_location("glue_lines", REPO / "scripts" / "glue_lines.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("example", ["anthropic_agent.py", "openai_agent.py"])
def test_an_adapter_example_has_at_most_40_lines_of_glue(example: str) -> None:
    source = (REPO / "examples" / example).read_text()
    glue = counter().glue_lines(source)
    lines = source.splitlines()
    shown = "\n".join(f"{n:4}  {lines[n - 1]}" for n in glue)
    assert len(glue) <= 40, f"{example}: {len(glue)} lines of glue:\n{shown}"
    # What the count is made of: the adapter's calls are in it; the model's stand-in is not.
    counted = [lines[n - 1] for n in glue]
    assert any("run_tools(run, tools" in line for line in counted)
    assert any(".messages(state" in line for line in counted)
    assert not any("httpx2.Response" in line for line in counted)


def test_the_counter_counts_statements_that_name_zincir_and_nothing_else() -> None:
    source = '''"""A docstring that says zincir."""
import json

import zincir
from zincir.adapters import anthropic as za


def tool(pending: zincir.PendingToolCall) -> str:
    text = json.dumps(pending.call.args)  # reads the call
    return text.upper()


async def loop(path: str) -> None:
    async with zincir.open_database(path) as db:
        for _ in range(3):
            print("agent logic")
            await za.create(
                db,
            )
'''
    assert counter().glue_lines(source) == [4, 5, 8, 9, 14, 17, 18, 19]
