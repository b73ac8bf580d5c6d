"""Media that requests name by URL: data URLs (base64), http(s) URLs of allowed hosts only (fetched
with a time and size limit), and local files only under an allowed directory. Each failure is a
ValueError that says what is wrong, for the API layer to return as a 400 naming the content part."""

from __future__ import annotations

import base64
import binascii
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from revolta.multimodal.image import decode_image


@dataclass
class MediaPolicy:
    allowed_domains: list[str] = field(default_factory=list)  # hosts whose http(s) URLs are fetched; none: no fetching
    local_path: str | None = None  # file:// URLs under this directory are read; none: no local files
    timeout_s: float = 10.0
    max_bytes: int = 32 << 20

    def host_allowed(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        return any(host == d.lower() or host.endswith("." + d.lower()) for d in self.allowed_domains)


def read_url(url: str, policy: MediaPolicy) -> bytes:
    """The bytes a media URL names, within the policy."""
    if url.startswith("data:"):
        head, sep, payload = url.partition(",")
        if not sep or ";base64" not in head:
            raise ValueError("a data URL must be base64 encoded (data:<type>;base64,<data>)")
        if len(payload) * 3 // 4 > policy.max_bytes:
            raise ValueError(f"the data URL holds more than {policy.max_bytes} bytes")
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("the data URL's base64 payload does not decode") from None
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme in ("http", "https"):
        if not policy.host_allowed(parsed.hostname or ""):
            raise ValueError(f"fetching media from '{parsed.hostname}' is not allowed (the server's "
                             "--allowed-media-domains names the hosts it fetches from)")
        return _fetch(url, policy)
    if parsed.scheme == "file":
        if policy.local_path is None:
            raise ValueError("local media files are not allowed (the server's --allowed-local-media-path names a "
                             "directory they may come from)")
        root = Path(policy.local_path).resolve()
        path = Path(urllib.parse.unquote(parsed.path)).resolve()
        if root != path and root not in path.parents:
            raise ValueError(f"'{path}' is outside the allowed local media path")
        if not path.is_file():
            raise ValueError(f"no file '{path}'")
        if path.stat().st_size > policy.max_bytes:
            raise ValueError(f"'{path}' is larger than {policy.max_bytes} bytes")
        return path.read_bytes()
    raise ValueError(f"unsupported media URL scheme '{parsed.scheme or url[:16]}' (data, http, https, file)")


def _fetch(url: str, policy: MediaPolicy) -> bytes:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"User-Agent": "revolta"}),
                                    timeout=policy.timeout_s) as r:
            declared = r.headers.get("Content-Length")
            if declared and declared.isdigit() and int(declared) > policy.max_bytes:
                raise ValueError(f"the media at {url} is {declared} bytes; at most {policy.max_bytes} are fetched")
            data = r.read(policy.max_bytes + 1)
    except urllib.error.HTTPError as e:
        raise ValueError(f"fetching {url} failed: HTTP {e.code}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        raise ValueError(f"fetching {url} failed: {getattr(e, 'reason', e)}") from None
    if len(data) > policy.max_bytes:
        raise ValueError(f"the media at {url} is larger than {policy.max_bytes} bytes")
    return data


def load_image(url: str, policy: MediaPolicy):
    """A PIL RGB image from a URL the policy allows."""
    return decode_image(read_url(url, policy))
