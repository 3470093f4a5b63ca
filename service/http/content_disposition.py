"""`Content-Disposition: attachment` for a download, from any name (RFC 6266).

A name a tenant chose (a Tinker checkpoint's) may hold letters outside Latin-1 (which an HTTP
header cannot carry: a 500), CR or LF (a header split in two) or a quote (a name cut short).
So the name travels twice: exactly, UTF-8 and percent-encoded in `filename*` (RFC 8187), which
current clients read first; and as an ASCII stand-in in `filename`, for those that read only it.
"""

from __future__ import annotations

import re
import unicodedata
from urllib.parse import quote

# RFC 8187's attr-char beyond letters, digits and "-._~" (which `quote` keeps anyway)
_ATTR_CHARS = "!#$&+^`|"
# Not kept in the quoted fallback: controls, non-ASCII, the quote and backslash (which would
# need escaping), "%" (some clients decode it) and path separators.
_UNSAFE = re.compile(r'[^\x20-\x7e]|["\\%/]')


def attachment(filename: str) -> str:
    """The header's value for a download saved as `filename`."""
    decomposed = unicodedata.normalize("NFKD", filename)  # "é" -> "e" and its accent
    folded = "".join(c for c in decomposed if not unicodedata.combining(c))
    fallback = _UNSAFE.sub("_", folded) or "download"
    encoded = quote(filename, safe=_ATTR_CHARS, errors="surrogatepass")
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{encoded}"
