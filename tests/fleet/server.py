"""A static HTTP server for a module repository, with faults a test switches per path.

Run as ``python server.py ROOT STATE``: serves ROOT on a free port of 127.0.0.1, prints the
port, and serves until killed. Each request is appended to ``STATE/requests.log`` (one
``GET /path`` line, written when the request arrives, before any fault). Before each
request ``STATE/faults.json`` is read (when present): ``{"<glob of the path>": {"mode":
..., "seconds": N}}`` with modes

- ``404`` / ``500``: that status, no body
- ``stall_headers``: say nothing for N seconds, then close
- ``stall_body``: headers and half the body, N seconds of silence, then the rest
- ``truncate``: the full Content-Length, half the body, then close
- ``corrupt``: the full length with one byte changed

Stdlib only, so a test starts it in a fraction of a second.
"""

from __future__ import annotations

import fnmatch
import json
import sys
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class RepositoryHandler(BaseHTTPRequestHandler):
    root: Path
    state: Path

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib name
        pass

    def _fault(self, path: str) -> dict[str, object]:
        try:
            faults = json.loads((self.state / "faults.json").read_text())
        except (OSError, ValueError):
            return {}
        return next((f for glob, f in faults.items() if fnmatch.fnmatchcase(path, glob)), {})

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        with open(self.state / "requests.log", "a") as log:
            log.write(f"GET {path}\n")
        fault = self._fault(path)
        mode = str(fault.get("mode", ""))
        seconds = float(fault.get("seconds", 0))  # type: ignore[arg-type]
        if mode in ("404", "500"):
            self.send_error(int(mode))
            return
        if mode == "stall_headers":
            time.sleep(seconds)
            self.close_connection = True
            return
        file = (self.root / path.lstrip("/")).resolve()
        if not file.is_file() or self.root not in file.parents:
            self.send_error(404)
            return
        body = file.read_bytes()
        half = len(body) // 2
        if mode == "corrupt":
            body = body[:half] + bytes([body[half] ^ 0xFF]) + body[half + 1 :]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if mode == "truncate":
            self.wfile.write(body[:half])
            self.close_connection = True
            return
        if mode == "stall_body":
            self.wfile.write(body[:half])
            self.wfile.flush()
            time.sleep(seconds)
            body = body[half:]
        self.wfile.write(body)


def main() -> None:
    root, state = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    RepositoryHandler.root = root
    RepositoryHandler.state = state
    server = ThreadingHTTPServer(("127.0.0.1", 0), RepositoryHandler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
