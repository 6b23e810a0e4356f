#!/usr/bin/env python3
"""A stand-in for an OpenAI-compatible engine (vLLM, LiteLLM): answers every POST with a chat
completion that names this server and echoes the model it was sent, so the example can show where
each request went; GET /health answers 200 once it listens (run.sh waits on it).
Usage: mock_engine.py NAME PORT"""
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NAME, PORT = sys.argv[1], int(sys.argv[2])


class Engine(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            model = json.loads(body).get("model")
        except ValueError:
            model = None
        out = json.dumps({
            "id": "cmpl-mock", "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": f"served by {NAME}"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("x-mock-engine", NAME)
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", PORT), Engine).serve_forever()
