"""mypy on whatif's folders under the names they are installed as (`make lint` runs it).

setuptools installs the folders as one namespace through package-dir (core/ is whatif.core,
tracer/record/ is whatif.tracer.record, ...), and mypy cannot follow the editable install's
import hook: checked as plain files, core/kernels.py would be `core.kernels` and every
`from whatif.core ...` import an unchecked Any. This runs mypy with the `files` of
[tool.mypy] renamed after [tool.setuptools.package-dir], so each module is checked once,
imports between folders resolve to the real modules, and messages name the real files.

    python tools/typecheck.py [mypy options]
"""
from __future__ import annotations

import sys
from pathlib import Path

from mypy import build
from mypy.errors import CompileError
from mypy.fscache import FileSystemCache
from mypy.main import process_options
from mypy.modulefinder import BuildSource

if sys.version_info >= (3, 11):
    import tomllib
else:  # mypy depends on tomli before 3.11
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def package_dirs() -> dict[Path, str]:
    """Folder -> installed package name, from pyproject.toml."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {(ROOT / folder).resolve(): package
            for package, folder in config["tool"]["setuptools"]["package-dir"].items()}


def installed_name(path: Path, dirs: dict[Path, str]) -> str | None:
    """`core/kernels.py` -> `whatif.core.kernels`; None outside the mapped folders."""
    parts = [] if path.name == "__init__.py" else [path.stem]
    folder = path.parent
    while folder not in dirs:
        if folder == ROOT or folder == folder.parent:
            return None
        parts.insert(0, folder.name)
        folder = folder.parent
    return ".".join([dirs[folder], *parts])


def main(argv: list[str]) -> int:
    fscache = FileSystemCache()
    sources, options = process_options(argv, stdout=sys.stdout, stderr=sys.stderr, fscache=fscache)
    dirs = package_dirs()
    renamed = []
    for s in sources:
        name = installed_name(Path(s.path).resolve(), dirs) if s.path else None
        renamed.append(BuildSource(s.path, name, s.text, str(ROOT)) if name else s)
    try:
        messages = build.build(renamed, options, fscache=fscache, stdout=sys.stdout, stderr=sys.stderr).errors
    except CompileError as exc:  # a blocking error (syntax, duplicate module): mypy stops at it
        messages = exc.messages
    for line in messages:
        print(line)
    errors = [m for m in messages if ": error:" in m]
    if errors:
        files = len({m.split(":", 1)[0] for m in errors})
        print(f"Found {len(errors)} error{'s' * (len(errors) != 1)} in {files} file{'s' * (files != 1)} "
              f"(checked {len(renamed)} source files)")
        return 1
    print(f"Success: no issues found in {len(renamed)} source files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
