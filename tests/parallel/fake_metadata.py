"""A stand-in for the GCE metadata server on 127.0.0.1, answering as the real one does.

It serves `/computeMetadata/v1/instance/attributes/<key>` from a dict, refuses a request
without the `Metadata-Flavor: Google` header (403, as the real server does), answers 404
for an attribute it does not have, and records every path asked for. Point attnmt at it
with GCE_METADATA_HOST=<address> (JAX's own detection with GCE_METADATA_IP=<address>).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ATTRIBUTES = "/computeMetadata/v1/instance/attributes/"


@dataclasses.dataclass
class FakeMetadata:
    address: str  # host:port
    requests: list[str]  # the paths asked for, in order


def _handler(attributes: Mapping[str, str], seen: list[str]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            key = self.path.removeprefix(ATTRIBUTES)
            if self.headers.get("Metadata-Flavor") != "Google":
                self._reply(403, "missing Metadata-Flavor header")
            elif self.path.startswith(ATTRIBUTES) and key in attributes:
                self._reply(200, attributes[key])
            else:
                self._reply(404, "not found")

        def _reply(self, code: int, text: str) -> None:
            body = text.encode()
            self.send_response(code)
            self.send_header("Metadata-Flavor", "Google")
            self.send_header("Content-Type", "application/text")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet: pytest shows what matters

    return Handler


@contextlib.contextmanager
def fake_metadata_server(attributes: Mapping[str, str]) -> Iterator[FakeMetadata]:
    """A running server for the `with` block's duration."""
    seen: list[str] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(attributes, seen))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield FakeMetadata(f"127.0.0.1:{server.server_address[1]}", seen)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
