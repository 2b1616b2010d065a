"""Uploaded traces and scenarios: size-capped, written as bytes into the upload folder, and
read only by a trace reader or the TOML parser (data only, nothing is executed or unpickled).
Which names are traces, and what their bytes must look like, is the trace readers' call
(:mod:`whatif.tracer.readers`).

A trace is uploaded by ``POST /_whatif/upload?name=FILE`` with the file as the request body
(``assets/upload.js`` sends it from the Runs page): :func:`store_upload` streams it to disk in
chunks, so a server holds at most a chunk per upload whatever the file's size, and the reader's
bounded-memory check (:meth:`~whatif.tracer.readers.TraceReader.check_file`: a gzip bomb, a
corrupt or truncated stream) runs on the stored file before the run is added. Scenarios are
small (:data:`MAX_SCENARIO_BYTES` in the builder) and arrive inside a callback (:func:`decode`).
"""
from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import io
import os
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import flask
from werkzeug.exceptions import RequestEntityTooLarge

from whatif.core.errors import TraceError
from whatif.core.limits import OVER_INFLATE_CAP
from whatif.tracer import readers

if TYPE_CHECKING:
    from .state import RunStore

UPLOAD_ROUTE = "/_whatif/upload"
CHUNK_BYTES = 1 << 20


class UploadError(ValueError):
    """An upload that is refused (too large, wrong type, not what its name says)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def decode(contents: str, max_bytes: int) -> bytes:
    """The bytes of a ``dcc.Upload`` data URL, refusing more than ``max_bytes``."""
    if not contents or "," not in contents:
        raise UploadError("empty upload")
    payload = contents.split(",", 1)[1]
    if len(payload) * 3 // 4 > max_bytes + 3:
        raise _too_large(max_bytes)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise UploadError("upload is not valid base64") from None
    if len(data) > max_bytes:
        raise _too_large(max_bytes)
    return data


def _too_large(max_bytes: int) -> UploadError:
    return UploadError(f"upload larger than the limit of {max_bytes / 2**20:,.0f} MiB", status=413)


def store_upload(upload_dir: Path, filename: str, read: Callable[[int], bytes], max_bytes: int) -> Path:
    """Stream an uploaded trace into ``upload_dir/<content hash>/<safe name>`` and check it.

    Parameters
    ----------
    upload_dir : the dashboard's upload folder.
    filename : the name the browser gave (only its last component is used, made safe).
    read : reads up to n bytes of the upload (``request.stream.read``); b"" at its end.
    max_bytes : the largest upload accepted.

    Raises
    ------
    UploadError
        The name is not a trace file's, the upload is empty, larger than ``max_bytes``, or its
        bytes are not what the name says (including a gzip that inflates past the reader's cap).
        Nothing stays on disk.

    >>> import io, tempfile
    >>> up = Path(tempfile.mkdtemp())
    >>> store_upload(up, "t.json", io.BytesIO(b'{"traceEvents": []}').read, 1 << 20).name
    't.json'
    """
    name = Path(filename or "").name
    try:
        reader = readers.reader_for(name)
    except TraceError:
        raise UploadError(f"{name or 'upload'}: only trace files ({readers.accepted()}) can be uploaded") from None
    upload_dir.mkdir(parents=True, exist_ok=True)
    tmp = upload_dir / f".upload-{uuid.uuid4().hex}.part"
    try:
        digest, size = _stream_to(tmp, read, max_bytes, lambda head: reader.check_bytes(name, head), name)
        if size == 0:
            raise UploadError(f"{name}: empty upload")
        problem = reader.check_file(name, tmp)
        if problem:
            raise UploadError(f"{name}: {problem}", status=413 if problem.startswith(OVER_INFLATE_CAP) else 400)
        folder = upload_dir / digest[:12]
        folder.mkdir(exist_ok=True)
        path = folder / re.sub(r"[^A-Za-z0-9._-]", "_", name)
        os.replace(tmp, path)
        return path
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def _stream_to(tmp: Path, read: Callable[[int], bytes], max_bytes: int,
               check_head: Callable[[bytes], str | None], name: str) -> tuple[str, int]:
    digest, size = hashlib.sha1(), 0
    with open(tmp, "wb") as f:
        while chunk := read(CHUNK_BYTES):
            if size == 0 and (problem := check_head(chunk)):
                raise UploadError(f"{name}: {problem}")
            size += len(chunk)
            if size > max_bytes:
                raise _too_large(max_bytes)
            digest.update(chunk)
            f.write(chunk)
    return digest.hexdigest(), size


def save_trace(upload_dir: Path, filename: str, contents: str, max_bytes: int) -> Path:
    """Check and store a trace given as a data URL (Python callers; the browser streams to
    :data:`UPLOAD_ROUTE`); returns its path inside ``upload_dir``."""
    return store_upload(upload_dir, filename, io.BytesIO(decode(contents, max_bytes)).read, max_bytes)


def add_upload_route(server: flask.Flask, store: RunStore) -> None:
    """``POST UPLOAD_ROUTE?name=FILE``: the body streamed to the upload folder (:func:`store_upload`)
    and added as a run; answers ``{"run": id, "label": …}`` or ``{"error": one line}`` (400, or 413
    when too large). The request's own size limit is the store's upload limit (the app's limit
    for every other request is far smaller)."""
    @server.post(UPLOAD_ROUTE)
    def upload() -> tuple[flask.Response, int]:
        flask.request.max_content_length = store.max_upload_bytes
        name = flask.request.args.get("name", "")
        try:
            if (flask.request.content_length or 0) > store.max_upload_bytes:
                raise _too_large(store.max_upload_bytes)
            path = store_upload(store.upload_dir, name, flask.request.stream.read, store.max_upload_bytes)
            run = store.add_path(path)[0]
        except UploadError as exc:
            return flask.jsonify(error=str(exc)), exc.status
        except RequestEntityTooLarge:
            return flask.jsonify(error=str(_too_large(store.max_upload_bytes))), 413
        except (OSError, ValueError) as exc:
            return flask.jsonify(error=f"{Path(name).name or 'upload'}: {exc}"), 400
        return flask.jsonify(run=run.id, label=run.label), 200
