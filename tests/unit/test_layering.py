"""Imports follow the stages: every module of exporter/ imports only from its own group or from a lower
layer, read from the source with ast (imports inside functions and under TYPE_CHECKING included).

The layers, lowest first (docs/architecture.md, "Imports follow the same direction"):

    model                      the data model: imports nothing of the exporter
    base                       settings, logging, threads, safe YAML, the simulator (a stand-in for
                               the hardware: config parses its fleet and scenario flags)
    sources | attribution      the readers: devices, the host, who uses each device
    pipeline                   poll, counters, health, snapshot, enrich (publish is its own layer)
    exposition                 the metric table, /metrics rendering, the shared view model
    alerting                   rules over the snapshot, watching values the metric table declares
    publish                    pipeline/publish.py: the stages after the poller, in order
    web | operator             the HTTP server, the snapshot/doctor commands
    configcheck                check-config (it loads the web config file as serve does), SIGHUP
    daemon                     wiring: imported by the command line only
    cli                        the command line

Groups side by side in one layer (web and operator) never import each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "exporter"

LAYERS: tuple[tuple[tuple[str, ...], ...], ...] = (
    # with the kernel's gpu_metrics struct tables: data that imports nothing, written by the simulator
    (("exporter.model", "exporter.sources.gpu_metrics.layouts", "exporter.sources.gpu_metrics.board_layouts"),),
    (("exporter", "exporter.config", "exporter.log", "exporter.safeyaml", "exporter.threads", "exporter.simulator"),),
    (("exporter.sources",), ("exporter.attribution",)),
    (("exporter.pipeline",),),
    (("exporter.exposition",),),
    (("exporter.alerting",),),
    (("exporter.pipeline.publish",),),
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
        if module == prefix or module.startswith(prefix + "."):
            return where
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(path: Path) -> set[str]:
    """Every exporter module `path` imports (`from exporter.web import routes` is exporter.web.routes)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if is_module(sub) else node.module)
    return {name for name in found if name == "exporter" or name.startswith("exporter.")}


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
    assert place("exporter.pipeline.publish") > place("exporter.pipeline.poller")
