#!/usr/bin/env python3
"""A counting reverse proxy for an OpenAI-compatible server (stdlib only).

Point both fanfold and DocETL at this proxy so that requests and tokens are
counted the same, neutral way on both sides: the numbers come from the
server's own `usage` field, not from either client's bookkeeping.

    python3 usage_proxy.py --listen 127.0.0.1:8081 --upstream 127.0.0.1:8080 \
        --log /tmp/usage.jsonl [--tag docetl] [--log-bodies]

Every request is forwarded as is (method, path, query, headers, body) and
the upstream's answer is passed back whole, error statuses included. The
proxy buffers each answer, so it is meant for non-streaming use; a streamed
(SSE) answer still goes through, delivered in one piece at the end.

For each POST to a path ending in /chat/completions (or /completions) it
appends one JSON line to the log:

    {"t_start": 1717000000.123, "t_end": 1717000001.456, "seconds": 1.333,
     "path": "/v1/chat/completions", "status": 200,
     "prompt_tokens": 612, "completion_tokens": 41, "total_tokens": 653,
     "user_agent": "OpenAI/Python 1.x", "tag": "docetl"}

`tag` is --tag, or the request's X-Bench-Tag header when it has one.
With --log-bodies the line also has "request" (the JSON body sent) and
"response" (the JSON body received), for looking at prompts.
Other paths (e.g. /v1/models) are forwarded but not logged.
"""

import argparse
import http.client
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Headers that describe one hop, not the message: never forwarded.
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "trailers",
    "transfer-encoding",
    "upgrade",
}


def _split_hostport(s, default_host="127.0.0.1"):
    host, _, port = s.rpartition(":")
    return (host or default_host), int(port)


def _usage_of(body: bytes):
    """The `usage` object of a JSON answer, or of the last SSE chunk that has one."""
    try:
        return json.loads(body).get("usage") or {}
    except (ValueError, AttributeError):
        pass
    usage = {}
    for line in body.splitlines():
        if line.startswith(b"data:"):
            try:
                u = json.loads(line[5:].strip()).get("usage")
            except (ValueError, AttributeError):
                continue
            if u:
                usage = u
    return usage


class Proxy(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive to the client; every reply has Content-Length
    server_version = "usage-proxy"
    cfg = None  # set in main()
    log_lock = threading.Lock()

    def log_message(self, fmt, *args):  # quiet: the JSONL log is the record
        if self.cfg.verbose:
            sys.stderr.write("%s - %s\n" % (self.address_string(), fmt % args))

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()  # CRLF after each chunk
            return b"".join(chunks)
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _reply(self, status, reason, headers, body: bytes):
        self.send_response(status, reason)
        for k, v in headers:
            # send_response already wrote this proxy's Server and Date.
            if k.lower() not in HOP_BY_HOP and k.lower() not in ("content-length", "server", "date"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _forward(self):
        cfg = self.cfg
        t_start = time.time()
        body = self._read_body()
        headers = {}
        for k, v in self.headers.items():
            if k.lower() in HOP_BY_HOP or k.lower() in ("host", "content-length"):
                continue
            headers[k] = v
        headers["Host"] = "%s:%d" % (cfg.up_host, cfg.up_port)
        headers["Accept-Encoding"] = "identity"  # the proxy must read the usage
        if body or self.command in ("POST", "PUT", "PATCH"):
            headers["Content-Length"] = str(len(body))

        try:
            conn = http.client.HTTPConnection(cfg.up_host, cfg.up_port, timeout=cfg.timeout)
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            resp_body = resp.read()  # undoes chunked transfer encoding
            status, reason, resp_headers = resp.status, resp.reason, resp.getheaders()
            conn.close()
        except (OSError, http.client.HTTPException) as e:
            status, reason = 502, "Bad Gateway"
            resp_headers = [("Content-Type", "application/json")]
            resp_body = json.dumps(
                {"error": {"message": "usage_proxy: upstream failed: %s" % e, "type": "proxy_error"}}
            ).encode()
        t_end = time.time()

        try:
            self._reply(status, reason, resp_headers, resp_body)
        finally:
            path = self.path.split("?", 1)[0]
            if self.command == "POST" and path.endswith("completions"):
                self._log(t_start, t_end, path, status, body, resp_body)

    def _log(self, t_start, t_end, path, status, body, resp_body):
        usage = _usage_of(resp_body) if status == 200 else {}
        rec = {
            "t_start": round(t_start, 4),
            "t_end": round(t_end, 4),
            "seconds": round(t_end - t_start, 4),
            "path": path,
            "status": status,
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens"),
            "total_tokens": usage.get("total_tokens"),
            "user_agent": self.headers.get("User-Agent"),
            "tag": self.headers.get("X-Bench-Tag") or self.cfg.tag,
        }
        if self.cfg.log_bodies:
            for key, raw in (("request", body), ("response", resp_body)):
                try:
                    rec[key] = json.loads(raw)
                except ValueError:
                    rec[key] = raw.decode("utf-8", "replace")
        line = json.dumps(rec, ensure_ascii=False) + "\n"
        with self.log_lock, open(self.cfg.log, "a", encoding="utf-8") as f:
            f.write(line)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _forward


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", default="127.0.0.1:8081", help="host:port to listen on")
    ap.add_argument("--upstream", default="127.0.0.1:8080", help="host:port of the server")
    ap.add_argument("--log", required=True, help="JSONL file to append to")
    ap.add_argument("--tag", default=None, help="tag for every line (X-Bench-Tag overrides)")
    ap.add_argument("--log-bodies", action="store_true", help="also log request and response bodies")
    ap.add_argument("--timeout", type=float, default=900.0, help="upstream timeout, seconds")
    ap.add_argument("--verbose", action="store_true", help="print an access log to stderr")
    cfg = ap.parse_args()
    cfg.up_host, cfg.up_port = _split_hostport(cfg.upstream)
    Proxy.cfg = cfg
    host, port = _split_hostport(cfg.listen)
    srv = ThreadingHTTPServer((host, port), Proxy)
    srv.daemon_threads = True
    print("usage_proxy: %s:%d -> %s:%d, log %s" % (host, port, cfg.up_host, cfg.up_port, cfg.log),
          file=sys.stderr, flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()


if __name__ == "__main__":
    main()
