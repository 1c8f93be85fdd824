"""The layout's rules, read from the source (no imports run): who may import Ray, DeepSpeed and vLLM,
which package may import which, no import cycles, and modules and functions a reader can take in.

    algo, rewards, envs, types, config, errors, user_code, chat_template, child_processes: neither ray,
         deepspeed nor vllm (pure, tested on hand-worked data)
    actors: never deepspeed and vllm in one module; never ray (the cluster layer makes them actors)
    ray: only in cluster/ and the run loop (training/loop.py); actor calls (`.remote(`) only in cluster/,
         the loop's few Ray names listed in LOOP_RAY_NAMES
    layers: each package (or top-level module) imports only the grpo_ray packages MAY_IMPORT lists for it
         (a "package.module" entry allows that module alone); a package not in the table is refused
    the rollout kind: nothing outside cluster/ imports its rollout kinds (rollout_kinds, streams,
         whole_shares) nor reads a recipe's `groups_per_chunk` (config/ declares it)
    packages: no cycle in the graph of grpo_ray's subpackages, nor between the modules of one package
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "grpo_ray"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
PURE = ("algo", "rewards", "envs", "types", "config", "errors", "user_code", "chat_template", "child_processes")
RAY_ALLOWED = ("cluster", "training.loop")
# What the run loop may read from `ray` itself: Ray's errors.
LOOP_RAY_NAMES = {"exceptions"}

# Which grpo_ray packages (or top-level modules) each may import, read downward: the entry points,
# the run, the Ray plumbing, the actors, the pure and model packages, the ground. An arrow not listed
# here fails test_every_import_follows_the_layers; add one only where it runs down (the table has no
# cycle: tested) and the code is better for it, never to let a wrong arrow through.
MAY_IMPORT: dict[str, set[str]] = {
    "__init__": {"api"},  # the package's face: train, validate and load, imported on first use
    "api": set("commands config quiet training".split()),
    "cli": set("cluster commands config data envs errors models quiet rewards training".split()),
    "commands": set("actors algo cluster config data errors models quiet rewards tracking training types".split()),
    "training": set("algo cluster config data envs errors models quiet rewards tracking transport types".split()),
    "cluster": set("actors config errors quiet transport types".split()),
    # Actors take typed settings (cluster/settings.py), never the recipe: of config/, only the check
    # of rollout.vllm.engine_args that the engine shares with the driver's preflight.
    "actors": set("algo chat_template config.vllm_args envs errors models quiet rewards transport types".split()),
    "data": set("builtin_names errors models types".split()),
    "config": set("algo builtin_names errors".split()),
    "models": set("algo builtin_names chat_template errors quiet types".split()),
    "envs": set("chat_template child_processes errors types user_code".split()),
    "rewards": set("child_processes errors user_code".split()),
    "transport": set("errors types".split()),
    "child_processes": {"quiet"},
    "user_code": {"errors"},
    **{ground: set() for ground in ("tracking", "algo", "chat_template", "builtin_names", "errors", "quiet", "types")},
}
# The rollout kind (whole shares, streamed) is cluster/'s: what a package above it may not import.
ROLLOUT_KIND_MODULES = ("cluster.rollout_kinds", "cluster.streams", "cluster.whole_shares")


def modules() -> dict[str, Path]:
    """'train.loop' -> its path, for every module of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name or "__init__"] = path
    return found


def imported(path: Path) -> set[str]:
    """Every module name imported anywhere in the file (function-level imports included)."""
    return import_names(ast.walk(ast.parse(path.read_text())))


def import_names(nodes) -> set[str]:
    """The modules (and `from` names) the import statements among `nodes` name."""
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def third_party(names: set[str]) -> set[str]:
    return {name.split(".")[0] for name in names} & {"ray", "deepspeed", "vllm"}


def within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


MODULES = modules()


@pytest.mark.parametrize("module", [m for m in MODULES if within(m, PURE)])
def test_pure_code_imports_no_ray_deepspeed_or_vllm(module):
    assert not third_party(imported(MODULES[module])), f"grpo_ray.{module} must stay pure"


@pytest.mark.parametrize("module", [m for m in MODULES if within(m, ("actors",))])
def test_actors_never_import_deepspeed_and_vllm_together_nor_ray(module):
    heavy = third_party(imported(MODULES[module]))
    assert heavy != {"deepspeed", "vllm"} and not heavy >= {"deepspeed", "vllm"}, module
    assert "ray" not in heavy, f"grpo_ray.{module}: actors are plain classes; cluster/ makes them actors"


def test_ray_only_in_cluster_and_the_run_loop():
    offenders = [
        m for m, path in MODULES.items() if "ray" in third_party(imported(path)) and not within(m, RAY_ALLOWED)
    ]
    assert offenders == [], f"these import ray outside cluster/ and training/loop.py: {offenders}"


def package_of(module: str) -> str:
    return module.split(".")[0]


def package_graph() -> dict[str, set[str]]:
    """Subpackage (or top-level module) -> the others it imports."""
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        source = package_of(module)
        targets = {package_of(n[len("grpo_ray.") :]) for n in imported(path) if n.startswith("grpo_ray.")}
        targets &= {package_of(m) for m in MODULES}
        graph.setdefault(source, set()).update(targets - {source})
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph as a path (first node repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt, path + [nxt])):
                return cycle
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return None


def import_targets(path: Path) -> set[str]:
    """The grpo_ray modules (or names in them) a file imports, relative to grpo_ray: `from grpo_ray.config
    import vllm_args` is "config.vllm_args", `import grpo_ray.algo.kl` is "algo.kl" (anywhere in the file)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name[len("grpo_ray.") :] for name in names if name.startswith("grpo_ray.")}


def layer_violations(imports: dict[str, set[str]], table: dict[str, set[str]], packages: set[str]) -> list[str]:
    """One line per import that `table` does not allow: `imports` maps a module ("models.tiny_tools")
    to its targets (import_targets); only targets in one of `packages` count."""
    found = []
    for module, targets in sorted(imports.items()):
        source = package_of(module)
        if source not in table:
            found.append(f"grpo_ray.{module}: its package {source!r} has no row in MAY_IMPORT; add one")
            continue
        allowed = table[source]
        for target in sorted(targets):
            if package_of(target) in (packages - {source}) and not within_any(target, allowed):
                found.append(f"grpo_ray.{module} imports grpo_ray.{target}: {source} may import only {sorted(allowed)}")
    return found


def within_any(target: str, allowed: set[str]) -> bool:
    """A package entry allows all of it; a "package.module" entry that module (and names in it)."""
    return package_of(target) in allowed or within(target, tuple(a for a in allowed if "." in a))


def test_every_import_follows_the_layers():
    imports = {module: import_targets(path) for module, path in MODULES.items()}
    found = layer_violations(imports, MAY_IMPORT, {package_of(m) for m in MODULES})
    assert found == [], "imports that MAY_IMPORT does not allow:\n" + "\n".join(found)


def test_the_layer_rule_sees_a_wrong_arrow_and_lets_an_allowed_one_through():
    table = {"models": {"algo", "config.vllm_args"}, "envs": {"errors"}, "algo": set(), "config": set()}
    packages = {"models", "envs", "algo", "config", "errors"}
    imports = {
        "models.tiny_tools": {"envs.episode.EpisodeTokens", "algo.kl", "models.tiny"},  # envs: wrong way
        "models.engine": {"config.vllm_args.check", "config.schema.Config"},  # the schema is not allowed
        "envs.runner": {"errors.first_line", "numpy"},
        "algo.kl": {"algo.registry"},
        "tracking": {"errors"},  # no row
    }
    assert layer_violations(imports, table, packages) == [
        "grpo_ray.models.engine imports grpo_ray.config.schema.Config: models may import only "
        "['algo', 'config.vllm_args']",
        "grpo_ray.models.tiny_tools imports grpo_ray.envs.episode.EpisodeTokens: models may import only "
        "['algo', 'config.vllm_args']",
        "grpo_ray.tracking: its package 'tracking' has no row in MAY_IMPORT; add one",
    ]


def test_the_layers_run_one_way():
    table = {source: {package_of(target) for target in targets} - {source} for source, targets in MAY_IMPORT.items()}
    cycle = find_cycle(table)
    assert cycle is None, "MAY_IMPORT allows a cycle: " + " -> ".join(cycle)


def test_the_rollout_kind_is_read_nowhere_above_cluster():
    offenders = {}
    for module, path in MODULES.items():
        if within(module, ("cluster",)):
            continue
        kinds = sorted(t for t in import_targets(path) if within(t, ROLLOUT_KIND_MODULES))
        reads = [] if within(module, ("config",)) else groups_per_chunk_reads(path)
        if kinds or reads:
            offenders[module] = kinds + reads
    assert offenders == {}, f"the rollout kind read outside cluster/ (imports, `groups_per_chunk` reads): {offenders}"


def groups_per_chunk_reads(path: Path) -> list[str]:
    """ "line N" for every `x.groups_per_chunk` in the file: a read of the recipe's field (a parameter of
    that name is not one, nor the field's name in a list of them)."""
    return [
        f"line {node.lineno}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr == "groups_per_chunk"
    ]


def test_find_cycle_finds_one_and_only_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_cycles_between_packages():
    cycle = find_cycle(package_graph())
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle)


def module_graph() -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports, at module level or inside a function
    (a deferred import only hides a cycle). A package's __init__ is left out: it re-exports its
    modules by design."""
    return {
        module: same_package_imports(module, imported(path), set(MODULES))
        for module, path in MODULES.items()
        if path.name != "__init__.py"
    }


def same_package_imports(module: str, names: set[str], known: set[str]) -> set[str]:
    """The modules among `known` of `module`'s own package that the imported `names` reach."""
    package, targets = module.rpartition(".")[0], set()
    for name in names:
        if not name.startswith("grpo_ray."):
            continue
        target = name[len("grpo_ray.") :]
        while target and target not in known:  # "config.plans.plan_stages" -> "config.plans"
            target = target.rpartition(".")[0]
        if target and target != module and target.rpartition(".")[0] == package:
            targets.add(target)
    return targets


def test_no_cycles_between_modules_of_a_package():
    cycle = find_cycle(module_graph())
    assert cycle is None, "import cycle between modules: " + " -> ".join(cycle)


def test_the_module_graph_sees_a_cycle_through_a_deferred_import():
    # config/plans.py once imported training_plan inside a function, which imported plans at its top.
    deferred = import_names(ast.walk(ast.parse("def check():\n    from grpo_ray.config.b import f\n")))
    at_top = import_names(ast.walk(ast.parse("from grpo_ray.config.a import g\nimport grpo_ray.algo\n")))
    known = {"config.a", "config.b", "algo"}
    graph = {
        "config.a": same_package_imports("config.a", deferred, known),
        "config.b": same_package_imports("config.b", at_top, known),
    }
    assert graph == {"config.a": {"config.b"}, "config.b": {"config.a"}}
    assert find_cycle(graph) == ["config.a", "config.b", "config.a"]


def test_modules_are_short_enough_to_read():
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}, f"modules over {MAX_MODULE_LINES} lines: {long}"


def docstring_lines(node: ast.AST) -> int:
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first.end_lineno - first.lineno + 1
    return 0


def test_functions_are_short_enough_to_read():
    long = {}
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1 - docstring_lines(node)
                if lines > MAX_FUNCTION_LINES:
                    long[f"{module}.{node.name}"] = lines
    assert long == {}, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_unit_tests_import_no_ray():
    # A unit test module imports without Ray, directly or through grpo_ray modules that import it
    # at their top; a test that needs Ray running belongs in tests/integration.
    unit = PACKAGE.parent / "tests" / "unit"
    offenders = [
        str(path.relative_to(unit))
        for path in sorted(unit.rglob("test_*.py"))
        if "ray" in third_party(reachable_imports(path))
    ]
    assert offenders == [], f"unit tests that import Ray: {offenders}"


def reachable_imports(path: Path) -> set[str]:
    """Every module imported at module level by the file, following grpo_ray's own modules."""
    seen: set[str] = set()
    todo = list(top_level_imports(path))
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        module = name[len("grpo_ray.") :] if name.startswith("grpo_ray.") else None
        if module in MODULES:
            todo.extend(top_level_imports(MODULES[module]))
        elif name == "grpo_ray":
            todo.extend(top_level_imports(MODULES["__init__"]))
    return seen


def top_level_imports(path: Path) -> set[str]:
    """Modules imported at module level (an import inside a function runs only when called)."""
    return import_names(ast.parse(path.read_text()).body)


def ray_uses(path: Path) -> tuple[set[str], int]:
    """(the names read from `ray`, e.g. {"get", "wait"}; the number of `.remote(` calls) in a file."""
    names, remote_calls = set(), 0
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ray":
            names.add(node.attr)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "remote":
            remote_calls += 1
    return names, remote_calls


def test_actor_calls_and_ray_live_in_cluster_and_the_loops_few_lines():
    offenders = {}
    for module, path in MODULES.items():
        if within(module, ("cluster",)):
            continue
        names, remote_calls = ray_uses(path)
        allowed = LOOP_RAY_NAMES if module == "training.loop" else set()
        if names - allowed or remote_calls:
            offenders[module] = (sorted(names - allowed), remote_calls)
    assert offenders == {}, f"Ray calls outside cluster/ (ray names used, .remote( calls): {offenders}"


def test_the_ray_rule_sees_a_remote_call(tmp_path):
    path = tmp_path / "mod.py"
    path.write_text("import ray\nx = ray.get([a.f.remote(1)])\n")
    assert ray_uses(path) == ({"get"}, 1)


def test_the_readme_map_and_the_design_layout_name_every_package_and_top_level_module():
    root = PACKAGE.parent
    readme = (root / "README.md").read_text()
    readme_map = readme[readme.index("## A map of the code") :].split("```")[1]
    design = (root / "docs" / "design.md").read_text()
    layout = design[design.index("## Layout") : design.index("## Where a new thing goes")]
    names = sorted({p.name + "/" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()})
    names += sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    missing = {
        "README.md's map": [n for n in names if n not in readme_map],
        "docs/design.md's layout": [n for n in names if f"grpo_ray/{n}" not in layout],
    }
    assert missing == {"README.md's map": [], "docs/design.md's layout": []}, missing
