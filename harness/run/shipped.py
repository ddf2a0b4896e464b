"""Files a user names either by a shipped name or by a path: presets (``harness/run/presets/*.yaml``), published
tables (``results/published/*.yaml``), chat templates (``harness/run/templates/*.jinja``).

One rule for all three (:func:`find_shipped`; :func:`resolve_shipped` adds the error for a name that is neither): an
existing file with one of the kind's suffixes is taken as it is; otherwise the name is looked up as
``<folder>/<name><suffix>``. Example: ``find_shipped("demo", PRESET_DIR, (".yaml", ".yml"))`` ->
``.../presets/demo.yaml``; ``find_shipped("my.yaml", ...)`` -> ``my.yaml`` when that file exists.
"""

from __future__ import annotations

from pathlib import Path

from harness.measure.rundir import file_kind
from harness.schema import did_you_mean


def shipped_names(folder: Path, suffix: str) -> list[str]:
    """The names shipped in ``folder`` (file stems with ``suffix``), sorted."""
    return sorted(p.stem for p in folder.glob(f"*{suffix}"))


def find_shipped(name_or_path: str | Path, folder: Path, suffixes: tuple[str, ...]) -> Path | None:
    """The file ``name_or_path`` names (a path with one of ``suffixes``, or a shipped name in ``folder`` with the
    first suffix), or None when it names neither."""
    path = Path(name_or_path).expanduser()
    if path.suffix in suffixes and path.is_file():
        return path
    shipped = folder / f"{name_or_path}{suffixes[0]}"
    return shipped if shipped.is_file() else None


def resolve_shipped(name_or_path: str | Path, folder: Path, suffixes: tuple[str, ...], what: str, error: type,
                    shipped: str = "Shipped") -> Path:
    """:func:`find_shipped`, or ``error`` naming the unknown ``what`` with close shipped names. Example: ("demoo",
    PRESET_DIR, ...) -> "unknown preset 'demoo' (not a YAML file either). Did you mean 'demo'? Built-in: ..."."""
    path = find_shipped(name_or_path, folder, suffixes)
    if path is not None:
        return path
    given = Path(name_or_path).expanduser()
    if given.suffix in suffixes and given.exists():  # a FIFO would block the read, a directory fail it
        raise error(f"{what} {str(name_or_path)!r}: {file_kind(given.stat().st_mode)}, not a regular file")
    names = shipped_names(folder, suffixes[0])
    raise error(f"unknown {what} {str(name_or_path)!r} (not a YAML file either).{did_you_mean(name_or_path, names)} "
                f"{shipped}: {', '.join(names) or '(none)'}")
