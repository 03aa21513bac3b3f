"""Imports follow the stages: every module of exporter/ imports only from its own group or from a lower
floor, read from the source with ast (imports inside functions and under TYPE_CHECKING included), and
no import circle exists between modules.

The floors, lowest first (docs/architecture.md, "Imports follow the same direction"); a folder is a
group, and the base modules are named one by one so that a new top-level module must be placed:

    base                       model, the kernel's struct tables (abi/), logging, threads, safe YAML,
                               bounded file reads
    sources | simulator        the readers of devices and the host; the stand-in for the hardware
    config                     the settings (parses the simulator's fleet and scenario flags)
    attribution | exposition | demo
                               who uses each device; the metric table and rendering; the --demo tree
    alerting | accounting | actions
                               rules and the health verdict over the snapshot; what each job used;
                               acting on the verdict (the Slurm action mode)
    pipeline                   poll, sampler, counters, readiness, enrich
    cycle                      the stages after the poller, in order
    web | operator             the HTTP server, the snapshot/doctor commands
    configcheck                check-config (it loads the web config file as serve does), SIGHUP
    daemon                     wiring: imported by the command line only
    cli                        the command line

Groups side by side on one floor never import each other.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "exporter"

LAYERS: tuple[tuple[tuple[str, ...], ...], ...] = (
    (
        (
            "exporter",
            "exporter.model",
            "exporter.abi",
            "exporter.log",
            "exporter.threads",
            "exporter.safeyaml",
            "exporter.boundedfile",
            "exporter.grpcproto",
        ),
    ),
    (("exporter.sources",), ("exporter.simulator",)),
    (("exporter.config",),),
    (("exporter.attribution",), ("exporter.exposition",), ("exporter.demo",)),
    (("exporter.alerting",), ("exporter.accounting",), ("exporter.actions",)),
    (("exporter.pipeline",),),
    (("exporter.cycle",),),
    (("exporter.web",), ("exporter.operator",)),
    (("exporter.configcheck",),),
    (("exporter.daemon",),),
    (("exporter.cli",),),
)
# prefix -> (layer, group), longest prefix first
_PLACES = sorted(
    ((prefix, (rank, group[0])) for rank, groups in enumerate(LAYERS) for group in groups for prefix in group),
    key=lambda item: -len(item[0]),
)


def place(module: str) -> tuple[int, str]:
    for prefix, where in _PLACES:
        # "exporter" is the package's own __init__ only, never a catch-all for its modules
        if module == prefix or (prefix != "exporter" and module.startswith(prefix + ".")):
            return where
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


@functools.cache  # each module parsed once per process, not once per test that reads it
def imports(path: Path) -> frozenset[str]:
    """Every exporter module `path` imports (`from exporter.web import routes` is exporter.web.routes)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if is_module(sub) else node.module)
    return frozenset(name for name in found if name == "exporter" or name.startswith("exporter."))


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer() -> None:
    assert len(MODULES) > 50
    for path in MODULES:
        place(module_name(path))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_go_down_or_stay_in_their_group(path: Path) -> None:
    importer = module_name(path)
    rank, group = place(importer)
    wrong = []
    for imported in sorted(imports(path)):
        their_rank, their_group = place(imported)
        if their_rank > rank or (their_rank == rank and their_group != group):
            wrong.append(imported)
    assert not wrong, f"{importer} ({group}) imports from a higher or sibling layer: {wrong}"


def test_the_model_imports_nothing_of_the_exporter() -> None:
    assert imports(PACKAGE / "model.py") == set()


def test_the_daemon_is_imported_by_the_command_line_only() -> None:
    importers = {module_name(path) for path in MODULES if "exporter.daemon" in imports(path)}
    assert importers == {"exporter.cli"}


def test_a_wrong_import_is_caught(tmp_path: Path) -> None:
    """The checks above can fail: an import of the web layer from a source is seen as one."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from exporter.web import routes\n", encoding="utf-8")
    assert imports(probe) == {"exporter.web.routes"}
    assert place("exporter.sources.sysfs.source")[0] < place("exporter.web.routes")[0]
    assert place("exporter.cycle") > place("exporter.pipeline.poller")
    with pytest.raises(AssertionError, match="in no layer"):
        place("exporter.newmodule")


def test_no_import_circle() -> None:
    """No module reaches itself through the imports (a circle inside one folder counts too)."""
    graph = {module_name(path): {name for name in imports(path) if is_module(name)} for path in MODULES}
    done: set[str] = set()
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(module: str) -> None:
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph.get(module, ())):
            assert imported not in on_stack, "import circle: " + " -> ".join(
                [*stack[stack.index(imported) :], imported]
            )
            if imported not in done:
                visit(imported)
        stack.pop()
        on_stack.discard(module)
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module)
