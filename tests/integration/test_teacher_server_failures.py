"""A teacher server that fails every scoring request stops a real run in one line (issue 54: an
HTTP teacher's failures are counted under its max_failure_rate, never silent), with the step's
figures in MLflow and nothing of the run left behind. The server is a real HTTP server started
here: it lists its model as vLLM's does, and answers every POST /v1/completions with a 503."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .conftest import ray_processes, run_cli, set_args


class Overloaded(BaseHTTPRequestHandler):
    def do_GET(self):
        self._send(200, {"object": "list", "data": [{"id": "tiny", "object": "model", "max_model_len": 128}]})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._send(503, {"error": {"message": "the server is overloaded"}})

    def _send(self, code: int, body: dict):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_a_teacher_server_that_fails_every_row_stops_the_run_in_one_line(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Overloaded)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        done = run_cli(
            "train",
            "configs/tiny.yaml",
            *set_args(
                f"output_dir={tmp_path}",
                "train.steps=2",
                "train.prompts_per_step=4",
                "train.eval_every=0",
                "data.eval_files=[]",
                f"distillation.teachers=[{{name: far, url: '{url}', tokenizer: tiny, max_retries: 1}}]",
            ),
        )
    finally:
        server.shutdown()
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    lines = [line for line in out.splitlines() if line.startswith("error: teacher far")]
    assert len(lines) == 1, out[-3000:]
    assert f"teacher far ({url}) failed on 32 of 32 rows this step" in lines[0], lines[0]
    assert "503" in lines[0] and "max_failure_rate" in lines[0], lines[0]
    assert "Traceback" not in out
    assert not ray_processes()
