"""The run folder: checking it is free (or ``--force``) before the program starts."""
from __future__ import annotations

from pathlib import Path

from ..kineto import KinetoReader
from ..readers import OLD_RUN_META_NAME, RUN_META_NAME
from .errors import OutputExistsError, RecordError
from .processes import is_record_name
from .trace_file import trace_file_name

META_NAME = RUN_META_NAME


def _recording_files(folder: Path) -> list[Path]:
    """What a recording writes: Kineto JSON traces, its metadata (``meta.jsonc``, or an older
    recording's ``meta.json``) and the children's records and lock (:mod:`.processes`)."""
    return sorted(p for p in folder.iterdir()
                  if p.is_file() and (p.name.endswith(KinetoReader.suffixes) or p.name == RUN_META_NAME
                                      or is_record_name(p.name)))


def prepare_output(folder: Path, rank: int, world_size: int, force: bool) -> None:
    """Create ``folder`` or check it is free for this rank; with ``force`` delete what a previous
    recording left there (trace files and its metadata; nothing else is touched).

    One process: the folder must not exist or be empty. Several ranks share one folder, so each
    rank only checks for its own trace file (and rank 0 for the metadata, new or old name).
    """
    try:
        _prepare(folder, rank, world_size, force)
    except OSError as exc:      # a path under a file, no permission, a full disk
        raise RecordError(f"{folder}: cannot be used as the output folder ({exc.strerror or exc})") from None


def _prepare(folder: Path, rank: int, world_size: int, force: bool) -> None:
    if folder.exists() and not folder.is_dir():
        raise RecordError(f"{folder}: output path exists and is not a folder")
    if folder.is_dir():
        if world_size > 1:
            own = [folder / trace_file_name(rank)] + ([folder / META_NAME, folder / OLD_RUN_META_NAME]
                                                      if rank == 0 else [])
            taken = [p for p in own if p.exists()]
            if taken and not force:
                raise OutputExistsError(folder, f"{taken[0].name} of an earlier recording")
        else:
            entries = sorted(folder.iterdir())
            if entries and not force:
                raise OutputExistsError(folder, f"{len(entries)} file(s), e.g. {entries[0].name}")
            taken = _recording_files(folder)
        for path in taken:
            path.unlink()
    folder.mkdir(parents=True, exist_ok=True)
