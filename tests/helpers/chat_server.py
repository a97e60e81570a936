"""A real HTTP server on 127.0.0.1 speaking the chat-completions protocol (POST /v1/chat/completions),
its replies scripted by the test: the judges' client, retries and cache meet a real socket."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# (request body, Authorization header) -> (HTTP status, reply text)
Script = Callable[[dict, str], tuple[int, str]]


def completion(body: dict, text: str) -> dict:
    return {"id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": body.get("model", "judge"),
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


class ChatServer:
    """`requests`: every body received, in order (a retried request appears once per attempt)."""

    def __init__(self, script: Script, models_status: int = 404):
        """`models_status`: the status GET /models answers (the judge's reach; 404: a server without that route)."""
        self.script, self.requests, self.models_status = script, [], models_status
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                payload = json.dumps({"error": {"message": "GET " + self.path, "code": server.models_status}}).encode()
                self.send_response(server.models_status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                status, text = server.script(body, self.headers.get("Authorization", ""))
                payload = json.dumps(completion(body, text) if status == 200 else
                                     {"error": {"message": text, "type": "test", "code": status}}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                if status != 200:
                    self.send_header("retry-after-ms", "10")  # the client's backoff, kept short
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):  # quiet
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ChatServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def user_text(body: dict) -> str:
    return body["messages"][-1]["content"]


def benchmark_judge(body: dict, auth: str) -> tuple[int, str]:
    """Replies in each benchmark's format: LLaVA-Bench's two scores, MM-Vet's correctness."""
    text = user_text(body)
    if text.startswith("[Context]"):
        return 200, "8 6\nAssistant 2 is less detailed."
    if text.startswith("Compare the ground truth"):
        return 200, "0.5"
    return 400, f"unexpected prompt: {text[:80]}"
