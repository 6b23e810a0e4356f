#!/usr/bin/env python3
"""Tiny mock LLM upstream for the Envoy mechanics experiments (loopback only).

usage: mock.py PORT NAME LOGFILE [DEFAULT_MODE]
Mode per request: header `x-mode-<NAME>`, else `x-mode`, else DEFAULT_MODE (default `ok`).
  ok              200 JSON echo {served_by, headers, body}
  <3-digit code>  that status with a JSON body
  sse             200 text/event-stream, headers at once, a chunk every 300 ms for 3 s
  stall           sleep x-stall-ms (default 3000) before the headers, then ok
  silent          headers + one chunk, then 5 s of silence, then a last chunk
  close           read the request, close the socket without answering (reset)
  slow            sleep 800 ms then ok (shadow concurrency tests)
Every request is logged as one JSON line to LOGFILE (t, name, mode, path, headers, body).
"""
import http.server, json, sys, time, threading

PORT, NAME, LOG = int(sys.argv[1]), sys.argv[2], sys.argv[3]
DEFAULT = sys.argv[4] if len(sys.argv) > 4 else "ok"
lock = threading.Lock()


class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _body(self):
        n = int(self.headers.get("content-length", 0) or 0)
        if n:
            return self.rfile.read(n)
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        return b""

    def _send(self, code, obj, extra=()):
        out = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.send_header("x-served-by", NAME)
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(out)

    def _chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def handle_one(self):
        body = self._body()
        hdrs = {k.lower(): v for k, v in self.headers.items()}
        mode = hdrs.get("x-mode-" + NAME.lower()) or hdrs.get("x-mode") or DEFAULT
        with lock, open(LOG, "a") as f:
            f.write(json.dumps({"t": time.time(), "name": NAME, "mode": mode, "path": self.path,
                                "headers": hdrs, "body": body.decode("utf-8", "replace")}) + "\n")
        echo = {"served_by": NAME, "headers": hdrs, "body": body.decode("utf-8", "replace")}
        if mode == "ok":
            return self._send(200, echo)
        if mode.isdigit():
            return self._send(int(mode), {"error": {"message": f"mock {NAME} says {mode}", "type": "mock"}})
        if mode == "stall":
            time.sleep(int(hdrs.get("x-stall-ms", "3000")) / 1000)
            return self._send(200, echo)
        if mode == "slow":
            time.sleep(0.8)
            return self._send(200, echo)
        if mode == "close":
            self.close_connection = True
            try:
                import socket
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if mode in ("sse", "silent"):
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.send_header("x-served-by", NAME)
            self.end_headers()
            self.wfile.flush()
            try:
                if mode == "sse":
                    for i in range(10):
                        time.sleep(0.3)
                        self._chunk(f"data: {{\"i\":{i},\"from\":\"{NAME}\"}}\n\n".encode())
                else:
                    self._chunk(b"data: first\n\n")
                    time.sleep(5)
                    self._chunk(b"data: late\n\n")
                self._chunk(b"data: [DONE]\n\n")
                self._chunk(b"")
            except (BrokenPipeError, ConnectionResetError):
                pass
            return
        return self._send(500, {"error": "unknown mode " + mode})

    do_GET = do_POST = handle_one


class S(http.server.ThreadingHTTPServer):
    def handle_error(self, *a):  # clients (Envoy) hanging up mid-response are expected here
        pass


S.request_queue_size = 128
srv = S(("127.0.0.1", PORT), H)
srv.daemon_threads = True
srv.serve_forever()
