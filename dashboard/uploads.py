"""Uploaded traces and scenarios: size-capped, written as bytes into the upload folder, and
read only by a trace reader or the TOML parser (data only, nothing is executed or unpickled).
Which names are traces, and what their bytes must look like, is the trace readers' call
(:mod:`whatif.tracer.readers`)."""
from __future__ import annotations

import base64
import binascii
import hashlib
import re
from pathlib import Path

from whatif.core.errors import TraceError
from whatif.tracer import readers


class UploadError(ValueError):
    """An upload that is refused (too large, wrong type, not what its name says)."""


def decode(contents: str, max_bytes: int) -> bytes:
    """The bytes of a ``dcc.Upload`` data URL, refusing more than ``max_bytes``."""
    if not contents or "," not in contents:
        raise UploadError("empty upload")
    payload = contents.split(",", 1)[1]
    if len(payload) * 3 // 4 > max_bytes + 3:
        raise UploadError(f"upload larger than the limit of {max_bytes / 2**20:,.0f} MiB")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise UploadError("upload is not valid base64") from None
    if len(data) > max_bytes:
        raise UploadError(f"upload larger than the limit of {max_bytes / 2**20:,.0f} MiB")
    return data


def save_trace(upload_dir: Path, filename: str, contents: str, max_bytes: int) -> Path:
    """Check and store an uploaded trace file; returns its path inside ``upload_dir``."""
    name = Path(filename or "").name
    try:
        reader = readers.reader_for(name)
    except TraceError:
        raise UploadError(f"{name or 'upload'}: only trace files ({readers.accepted()}) can be uploaded") from None
    data = decode(contents, max_bytes)
    problem = reader.check_bytes(name, data)
    if problem:
        raise UploadError(f"{name}: {problem}")
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    folder = upload_dir / hashlib.sha1(data).hexdigest()[:12]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / safe
    path.write_bytes(data)
    return path
