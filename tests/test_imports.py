"""The module graph: no import cycles among minidist's modules, and each lesson package
imports only lessons before it (its docstring's "Lesson NN" orders it)."""

import ast
import re
from pathlib import Path

import minidist

ROOT = Path(minidist.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def imports_of(name: str) -> set[str]:
    """The minidist modules `name` imports, at any depth of its code (lazy imports too); a
    name imported from a package counts as its submodule when one exists."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names
            ]
        else:
            continue
        found |= {t for t in targets if t in MODULES and t != name}
    return found


GRAPH = {name: imports_of(name) for name in MODULES}


def cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                out.append(sorted(scc))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles_among_minidist_modules():
    # A package's __init__ importing its own modules is not a cycle unless one imports back.
    assert cycles() == []


def lesson_of(package: str) -> int | None:
    doc = ast.get_docstring(ast.parse((ROOT / package / "__init__.py").read_text())) or ""
    found = re.match(r"Lessons? (\d+)", doc)
    return int(found.group(1)) if found else None


# The planner (lesson 13) plans every technique of the course, also those taught after it
# (sequence and context parallelism, lessons 14-15): it reads their theory and tour rows.
PLANS_LATER_LESSONS = {"planner"}


def lesson_violations() -> list[str]:
    lessons = {p.name: lesson_of(p.name) for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    lessons = {k: v for k, v in lessons.items() if v is not None}
    assert len(lessons) >= 14, lessons  # every lesson package is numbered
    wrong = []
    for name, imported in GRAPH.items():
        parts = name.split(".")
        if len(parts) < 2 or parts[1] not in lessons:
            continue
        for target in imported:
            other = target.split(".")[1] if target.count(".") else None
            if parts[1] in PLANS_LATER_LESSONS:
                continue
            if other in lessons and lessons[other] > lessons[parts[1]]:
                wrong.append(
                    f"{name} (lesson {lessons[parts[1]]}) imports {target} "
                    f"(lesson {lessons[other]})"
                )
    return wrong


def test_each_lesson_imports_only_earlier_lessons():
    """Lessons 07-08 (megatron) and 12 (parameter_server, network) share a number."""
    assert lesson_violations() == []


def test_the_checks_see_a_cycle_and_a_lesson_importing_a_later_one(monkeypatch):
    """The checks above can fail: made-up edges are found."""
    monkeypatch.setitem(GRAPH, "minidist.comm", GRAPH["minidist.comm"] | {"minidist.parallel"})
    assert ["minidist.comm", "minidist.parallel"] in cycles()
    bucketed = "minidist.data_parallel.bucketed"
    monkeypatch.setitem(GRAPH, bucketed, GRAPH[bucketed] | {"minidist.mixed_precision.policy"})
    assert lesson_violations() == [
        f"{bucketed} (lesson 1) imports minidist.mixed_precision.policy (lesson 4)"
    ]


# Backticked words of the README's package table that are not importable names by design: a
# method of an exported class (`no_sync`, `HashTable.grow`) and bench names (`bench sp`, `cp`).
NOT_NAMES = {"no_sync", "grow", "sp", "cp"}


def test_every_name_the_readme_lists_imports_from_its_package():
    """`from minidist.<package> import <Name>` works for each name the README's table gives
    the package (issue 26: `ExpertParallelGPT` was listed and raised ImportError)."""
    import importlib

    readme = (ROOT.parent / "README.md").read_text()
    missing = []
    for row in re.findall(r"^\| `(minidist\.[a-z_.]+)` \|(.*)$", readme, flags=re.M):
        package, text = importlib.import_module(row[0]), row[1]
        names = re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", text)
        missing += [
            f"{row[0]}.{n}" for n in names if n not in NOT_NAMES and not hasattr(package, n)
        ]
    assert missing == []
