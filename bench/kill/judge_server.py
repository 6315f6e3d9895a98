#!/usr/bin/env python3
"""A counting OpenAI-compatible judge for the shared-store drill.

Answers POST /v1/chat/completions with {"decision": "yes"} when the record
in the user message has "flag": true, after `delay_ms` (the record's own,
else --delay-ms). Counts every request by unit id and writes the counts to
--counts as JSON when it receives SIGTERM. Prints its port on stdout.
"""
import argparse
import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

calls = {}
lock = threading.Lock()


def record_of(content):
    """The unit id and record of a map stage's user message."""
    if not content.startswith("Record "):
        return None
    head, _, _ = content[len("Record "):].partition(":")
    _, _, rest = content.partition("```json\n")
    record, _, _ = rest.rpartition("\n```")
    try:
        return head.strip('"'), json.loads(record)
    except ValueError:
        return None


class Judge(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    delay_ms = 40

    def log_message(self, *args):
        pass

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        try:
            body = json.loads(self.rfile.read(length))
        except ValueError:
            body = {}
        if self.path.rstrip("/") != "/v1/chat/completions":
            return self.reply(404, {"error": {"message": "no route " + self.path}})
        user = next((m.get("content") for m in body.get("messages", [])
                     if m.get("role") == "user"), "")
        parsed = record_of(user if isinstance(user, str) else "")
        if parsed is None:
            return self.reply(400, {"error": {"message": "unrecognised request"}})
        unit, record = parsed
        with lock:
            calls[unit] = calls.get(unit, 0) + 1
        time.sleep(record.get("delay_ms", self.delay_ms) / 1000)
        answer = json.dumps({"decision": "yes" if record.get("flag") is True else "no"})
        self.reply(200, {
            "id": "chatcmpl-drill", "object": "chat.completion", "model": body.get("model", "m"),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": answer}}],
            "usage": {"prompt_tokens": len(user) // 4, "completion_tokens": 4,
                      "total_tokens": len(user) // 4 + 4},
        })

    def do_GET(self):
        self.reply(404, {"error": {"message": "no route " + self.path}})


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--counts", required=True)
    p.add_argument("--delay-ms", type=int, default=40)
    p.add_argument("--port", type=int, default=0, help="0: any free port")
    args = p.parse_args()
    Judge.delay_ms = args.delay_ms
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Judge)
    server.daemon_threads = True

    def stop(*_):
        with lock:
            with open(args.counts, "w") as f:
                json.dump(calls, f)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
