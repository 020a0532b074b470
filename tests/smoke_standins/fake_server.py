"""Stand-in for `python -m sglang.launch_server` in the smoke tests (no GPU, no model).

Replays log lines the test rendered from upstream's own format strings, serves /health on the
--host/--port it was given, and can crash the way the PR's reports describe. Behaviour comes
from the JSON file named by $FAKE_CONFIG, per mode ("on" when SGLANG_OPT_USE_ONLINE_COMPRESS=1).
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

config = json.load(open(os.environ["FAKE_CONFIG"]))
mode = "on" if os.environ.get("SGLANG_OPT_USE_ONLINE_COMPRESS") == "1" else "off"
cfg = config["modes"][mode]

parser = argparse.ArgumentParser()
parser.add_argument("--host")
parser.add_argument("--port", type=int)
parser.add_argument("--model-path")
args, _rest = parser.parse_known_args()
assert args.host == "127.0.0.1", args.host  # loopback only

with open(config["envfile"], "a") as fh:
    fh.write(json.dumps({"mode": mode, "argv": sys.argv[1:],
                         "env": {k: v for k, v in os.environ.items() if k.startswith("SGLANG_")}}) + "\n")
with open(config["pidfile"], "a") as fh:
    fh.write(f"server {os.getpid()}\n")
    if cfg.get("grandchild"):
        # Leaves our process group (setsid), as a badly behaved helper would.
        child = subprocess.Popen(["sleep", "300"], start_new_session=True)
        fh.write(f"grandchild {child.pid}\n")

start = time.monotonic()
healthy_at = start + cfg.get("health_delay", 0.0)


class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path == "/health" and time.monotonic() >= healthy_at
        self.send_response(200 if ok else 503)
        self.end_headers()

    def log_message(self, *a):
        pass


server = ThreadingHTTPServer((args.host, args.port), Health)
threading.Thread(target=server.serve_forever, daemon=True).start()


def say(line):
    print(line, flush=True)


for line in cfg.get("startup_lines", []):
    say(line)
while time.monotonic() < healthy_at:
    time.sleep(0.05)
say(config["ready_line"])
crash = cfg.get("crash")
i = 0
while True:
    if crash and time.monotonic() - healthy_at >= crash["after"]:
        for line in crash["lines"]:
            say(line)
        if "exit" in crash:
            sys.stdout.flush()
            os._exit(crash["exit"])
        crash = None
    lines = cfg.get("decode_lines", [])
    if lines:
        say(lines[i % len(lines)])
        i += 1
    time.sleep(cfg.get("decode_every", 0.2))
