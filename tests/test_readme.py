"""The README, the guides in docs/ and bench/README.md say commands that must run as written.

Every command a reader may copy is checked against what it names: the files, modules and
handlers exist; each `zincir` subcommand exists and knows every option given to it (and its
`--help` works); each `python -m` module accepts `--help` and lists the options given to it;
each `pip install -e '.[extra]'` names a real extra; each Python snippet compiles. The README's
quick start is run for real: it prints its run id, is SIGKILLed mid-tool, and a resume with
ZINCIR_RESUME=1 finishes the same run; then the README's "see what happened" commands run as
written against that database. And every guide in docs/ is linked from the README and from
docs/README.md.
"""

from __future__ import annotations

import ast
import concurrent.futures
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from click.testing import CliRunner

from zincir._cli import main as zincir_main

from .helpers import REPO

DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "bench" / "README.md"]
VENV_BIN = Path(sys.executable).parent
TOP_LEVEL = ("examples", "scripts", "bench", "tests", "zincir", "docs", "migrations")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`([^`\n]+)`")
PROGRAM = re.compile(r"(?<![\w/.-])(\.venv(?:-bench)?/bin/[\w.-]+|bash(?= ))")
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


@attrs.frozen
class Command:
    """One program invocation a document shows: where, the program, and its arguments."""

    where: str
    program: str
    args: tuple[str, ...]


def _relative(path: Path) -> str:
    return str(path.relative_to(REPO))


def _outside_fences(text: str) -> str:
    return FENCE.sub("", text)


def _shell_lines(document: Path) -> Iterator[tuple[str, str]]:
    """(where, line) for every command line of the document's bash and console blocks, and
    every inline code span that names a `.venv/bin/` program."""
    text = document.read_text()
    for match in FENCE.finditer(text):
        language, body = match.groups()
        line_number = text.count("\n", 0, match.start()) + 2
        body = body.replace("\\\n", " ")  # continued lines are one command
        for offset, line in enumerate(body.splitlines()):
            where = f"{_relative(document)}:{line_number + offset}"
            if language == "bash":
                yield where, line
            elif language == "console" and line.startswith("$ "):
                yield where, line[2:]
    for match in INLINE.finditer(_outside_fences(text)):
        if ".venv/bin/" in match.group(1):
            yield _relative(document), match.group(1)


def _cut(line: str) -> str:
    """The first simple command of ``line``: up to an unquoted |, &, ;, ), <, > or # comment."""
    quote = None
    for index, char in enumerate(line):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char in "|&;)<>" or (char == "#" and (index == 0 or line[index - 1].isspace())):
            return line[:index]
    return line


def _commands(where: str, line: str) -> Iterator[Command]:
    for match in PROGRAM.finditer(line):
        if match.start() > 0 and line[match.start() - 1] == "=":
            continue  # PYTHON=.venv/bin/python: a value handed to the next program, not a run
        rest = _cut(line[match.end() :])
        try:
            args = tuple(shlex.split(rest))
        except ValueError as exc:
            raise AssertionError(f"{where}: cannot split {line!r}: {exc}") from None
        yield Command(where, match.group(1).rsplit("/", 1)[-1], args)


def all_commands() -> list[Command]:
    return [
        command
        for document in DOCUMENTS
        for where, line in _shell_lines(document)
        for command in _commands(where, line)
    ]


def synopses() -> list[tuple[str, list[str]]]:
    """(where, words) of every `zincir SUBCOMMAND ...` written in prose or in a synopsis block,
    where options may stand in brackets and placeholders in capitals."""
    found = []
    for document in DOCUMENTS:
        text = document.read_text()
        spans = [m.group(1) for m in INLINE.finditer(_outside_fences(text))]
        for match in FENCE.finditer(text):
            if match.group(1) == "text":
                spans += match.group(2).splitlines()
        for span in spans:
            if re.match(r"zincir [a-z]", span):
                found.append((_relative(document), span.split()))
    return found


# -- what the commands name -----------------------------------------------------------------------


def _paths_in(command: Command) -> list[str]:
    paths = []
    for arg in command.args:
        candidate = arg.split("::")[0]
        if re.match(rf"^({'|'.join(TOP_LEVEL)})(/|$)", candidate) and "$" not in candidate:
            paths.append(candidate)
    return paths


def test_every_file_a_command_names_exists() -> None:
    missing = [
        f"{command.where}: {path}"
        for command in all_commands()
        for path in _paths_in(command)
        if not (REPO / path).exists()
    ]
    assert not missing, "\n".join(missing)


def test_the_documents_show_commands_at_all() -> None:
    # The checks below pass vacuously if extraction finds nothing: it must find the README's.
    programs = {(c.program, c.args[:1]) for c in all_commands() if c.where.startswith("README.md")}
    assert ("python", ("examples/durable_agent.py",)) in programs
    assert ("python", ("examples/quickstart.py",)) in programs
    assert ("zincir", ("show",)) in programs
    assert ("bash", ("scripts/test.sh",)) in programs


def test_only_programs_of_the_repository_environment_are_run() -> None:
    # Every command must run with no virtual environment activated: `.venv/bin/zincir`, never
    # a bare `zincir` (or `python`, `pip`) that only an activated environment would find.
    bare = re.compile(r"(?:^|[;&|(]\s*|\$\(\s*)(zincir|python|pip|pytest|mypy|ruff)\s")
    offenders = [
        f"{where}: {line}"
        for document in DOCUMENTS
        for where, line in _shell_lines(document)
        if bare.search(line)
    ]
    assert not offenders, "\n".join(offenders)


def _subcommand_options(name: str) -> set[str]:
    command = zincir_main.commands[name]
    return {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)} | {"--help"}


def _option_names(words: list[str] | tuple[str, ...]) -> list[str]:
    return [re.sub(r"[\[\]]", "", word).split("=")[0] for word in words if re.match(r"^\[?-{1,2}[a-z]", word)]


def _check_zincir(where: str, words: list[str] | tuple[str, ...], problems: list[str]) -> str | None:
    if not words or words[0] in ("--help", "--version"):
        return None
    name = words[0]
    if name not in zincir_main.commands:
        problems.append(f"{where}: zincir has no subcommand {name!r}")
        return None
    known = _subcommand_options(name)
    for option in _option_names(words[1:]):
        for alternative in option.split("|"):
            if alternative not in known:
                problems.append(f"{where}: zincir {name} has no option {alternative!r}")
    return name


def _handler_exists(spec: str) -> bool:
    module, _, attribute = spec.partition(":")
    path = REPO / (module.replace(".", "/") + ".py")
    if not path.is_file():
        return False
    tree = ast.parse(path.read_text())
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == attribute
        for node in tree.body
    )


def test_every_zincir_command_names_a_subcommand_with_those_options() -> None:
    problems: list[str] = []
    used = set()
    for command in all_commands():
        if command.program != "zincir":
            continue
        name = _check_zincir(command.where, command.args, problems)
        used.add(name)
        if name == "worker":
            [spec] = [a for a in command.args[1:] if ":" in a and not a.startswith("-")]
            if not _handler_exists(spec):
                problems.append(f"{command.where}: no handler {spec!r} in the repository")
    for where, words in synopses():
        _check_zincir(where, words[1:], problems)
    assert not problems, "\n".join(problems)
    assert {"runs", "show", "ui", "worker"} <= used


def test_the_console_script_lists_every_subcommand_and_each_has_help() -> None:
    listed = subprocess.run(
        [str(VENV_BIN / "zincir"), "--help"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    mentioned = {
        c.args[0] for c in all_commands() if c.program == "zincir" and c.args and c.args[0][0] != "-"
    }
    mentioned |= {words[1] for _, words in synopses()}
    for name in sorted(mentioned):
        assert re.search(rf"^  {re.escape(name)}\s", listed, re.MULTILINE), f"`zincir --help` lists no {name}"
        result = CliRunner().invoke(zincir_main, [name, "--help"], prog_name="zincir")
        assert result.exit_code == 0, result.output
        assert f"Usage: zincir {name}" in result.output


def _module_help(module: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_every_python_module_run_with_dash_m_accepts_help_and_the_options_given() -> None:
    # `.venv-bench/bin/python -m bench...` too: the modules' --help needs none of the peers.
    wanted: dict[str, set[str]] = {}
    for command in all_commands():
        if command.program in ("python", "python3") and command.args[:1] == ("-m",):
            module = command.args[1]
            if module in ("venv", "pip"):
                continue
            wanted.setdefault(module, set()).update(_option_names(command.args[2:]))
    assert any(m.startswith("bench") for m in wanted), "the performance guide runs no benchmark module"
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        helps = dict(zip(wanted, pool.map(_module_help, wanted), strict=True))
    problems = []
    for module, result in helps.items():
        if result.returncode != 0:
            problems.append(f"python -m {module} --help failed: {result.stderr[-500:]}")
            continue
        problems += [
            f"python -m {module} has no option {option}"
            for option in wanted[module]
            if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", result.stdout)
        ]
    assert not problems, "\n".join(problems)


def test_every_script_run_with_python_exists() -> None:
    scripts = {
        command.args[0]
        for command in all_commands()
        if command.program in ("python", "python3") and command.args and command.args[0].endswith(".py")
    }
    assert scripts, "no script found"
    assert not [s for s in scripts if not (REPO / s).is_file()]


def test_every_pip_extra_exists() -> None:
    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    named = {
        extra
        for command in all_commands()
        if command.program == "pip"
        for arg in command.args
        if (match := re.fullmatch(r"\.\[([\w,-]+)\]", arg))
        for extra in match.group(1).split(",")
    }
    assert named, "no pip extra found"
    assert named <= extras, named - extras


def test_every_python_snippet_compiles() -> None:
    count = 0
    for document in DOCUMENTS:
        text = document.read_text()
        for match in FENCE.finditer(text):
            if match.group(1) == "python":
                line = text.count("\n", 0, match.start()) + 2
                compile(match.group(2), f"{_relative(document)}:{line}", "exec")
                count += 1
    assert count >= 10


# -- the quick start, for real --------------------------------------------------------------------


def _readme_section(title: str) -> str:
    text = (REPO / "README.md").read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_the_readme_shows_examples_quickstart_py_whole() -> None:
    [snippet] = [
        m.group(2) for m in FENCE.finditer(_readme_section("Your loop with zincir")) if m.group(1) == "python"
    ]
    assert snippet == (REPO / "examples" / "quickstart.py").read_text()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A directory that looks like the repository root to the README's relative commands
    (`.venv/bin/...`, `examples/...`), with a database of its own."""
    (tmp_path / ".venv").symlink_to(VENV_BIN.parent)
    (tmp_path / "examples").symlink_to(REPO / "examples")
    return tmp_path


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZINCIR_")}
    return {**env, **extra}


def test_the_quick_start_prints_its_run_id_survives_sigkill_and_resumes(workdir: Path) -> None:
    first = subprocess.Popen(
        [".venv/bin/python", "examples/quickstart.py"],
        cwd=workdir,
        env=_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout is not None
        run_line = first.stdout.readline()
        assert re.fullmatch(rf"run ({UUID})\n", run_line), run_line
        run_id = run_line.split()[1]
        # Kill it once its second tool call is under way (the first one's result recorded).
        while (line := first.stdout.readline()) != "tool call-1\n":
            assert line, "the quick start ended before its second tool call"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)  # reaped: a zombie would still look alive to the takeover check
        if first.stdout is not None:
            first.stdout.close()
    assert first.returncode == -signal.SIGKILL

    resumed = subprocess.run(
        [".venv/bin/python", "examples/quickstart.py"],
        cwd=workdir,
        env=_env(ZINCIR_RESUME="1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines() == [f"run {run_id}", "tool call-1", "tool call-2"]

    conn = sqlite3.connect(workdir / "zincir.db")
    try:
        (status,) = conn.execute("SELECT status FROM agent_runs WHERE id = ?", (run_id,)).fetchone()
        kinds = [
            row[0] for row in conn.execute("SELECT type FROM events WHERE run_id = ? ORDER BY seq", (run_id,))
        ]
    finally:
        conn.close()
    assert status == "completed"
    assert kinds.count("llm_call") == 3 and kinds.count("tool_call") == 3 and kinds.count("tool_result") == 3
    assert "lease_taken_over" in kinds

    # "See what happened", as written (the long-running `zincir ui` aside): its blocks in order.
    section = _readme_section("See what happened")
    blocks = [m.group(2) for m in FENCE.finditer(section) if m.group(1) == "bash"]
    script = "set -euo pipefail\n" + "\n".join(
        line for block in blocks for line in block.splitlines() if "/zincir ui" not in line
    )
    shown = subprocess.run(
        ["bash", "-c", script], cwd=workdir, env=_env(), capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count(run_id) >= 2  # listed by `runs`, then shown by `show`
    assert "completed" in shown.stdout and "tool_result" in shown.stdout
    assert len(blocks) == 2 and "fork" in blocks[1]  # the fork, then its diff against the run
    assert f"forked from {run_id} at seq 5" in shown.stdout


def test_every_guide_is_linked_from_the_readme_and_the_index() -> None:
    readme = (REPO / "README.md").read_text()
    index = (REPO / "docs" / "README.md").read_text()
    guides = [p.name for p in DOCUMENTS if p.parent.name == "docs" and p.name != "README.md"]
    assert guides
    unlinked = [g for g in guides if f"(docs/{g})" not in readme]
    assert not unlinked, f"the README links no {unlinked}"
    unindexed = [g for g in guides if f"({g})" not in index]
    assert not unindexed, f"docs/README.md links no {unindexed}"
