"""Google's discovery documents of the Cloud TPU API, served as the real API serves them.

The documents are Google's own, as google-api-python-client (a dependency of tpuops) ships them in
``googleapiclient/discovery_cache/documents/`` (``tpu.v1.json``, ``tpu.v2.json``): read from the installed
package, never copied into this one. Discovery-based clients load them: TensorFlow 2.9's TPU client
(``TPUClusterResolver(tpu=NAME)``) builds its ``tpu`` ``v1`` service from the URL in
``TPU_API_DISCOVERY_URL``, else from Google's. The emulator answers both the per-API URL
(``/$discovery/rest?version=V``) and the directory one (``/discovery/v1/apis/tpu/V/rest``) with the document
whose root URL is the emulator itself, so every call the client then makes comes here. No token is asked:
discovery documents are public.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

_DIRECTORY_PATH = re.compile(r"^/discovery/v1/apis/tpu/(?P<version>[^/]+)/rest$")
VERSIONS = ("v1", "v2")


@functools.cache
def _stored(version: str) -> str:
    from importlib import resources

    return (resources.files("googleapiclient.discovery_cache") / "documents" / f"tpu.{version}.json").read_text(
        encoding="utf-8")


def requested_version(path: str, query: dict[str, str]) -> str | None:
    """The API version a discovery request asks for, or None when ``path`` is no discovery URL."""
    if path == "/$discovery/rest":
        return query.get("version", "")
    match = _DIRECTORY_PATH.match(path)
    return match["version"] if match else None


def document(version: str, root_url: str) -> dict[str, Any] | None:
    """The ``tpu`` ``version`` document with every call sent to ``root_url`` (``http://host:port/``), or None."""
    if version not in VERSIONS:
        return None
    doc = json.loads(_stored(version))
    doc["rootUrl"] = doc["baseUrl"] = doc["mtlsRootUrl"] = root_url
    return doc
