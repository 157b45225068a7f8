"""The images' HEALTHCHECK: GET /health on the port the server listens on; exit 0 when it answers 200.

Python rather than curl, so that the slim image needs no extra package. The port comes from the server's
own settings (api/config.py), so the check follows `-e HARE_PORT=...` exactly as the server does; that costs
the settings module's imports (standard library and hare's small config helpers, no numpy or onnxruntime).
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

from api.config import Settings
from tasks.errors import InputError


def main() -> int:
    try:
        port = Settings.from_env().port
    except InputError as exc:  # the server refuses the same value at start
        print(f"healthcheck: {exc.message}", file=sys.stderr)
        return 1
    url = f"http://127.0.0.1:{port}/health"
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return 0 if response.status == 200 else 1
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"healthcheck: {url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
