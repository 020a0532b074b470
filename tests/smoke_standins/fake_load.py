"""Stand-in for `python -m sglang.bench_serving` in the smoke tests.

Refuses flags the real tool does not have (the list comes from the release sources), checks the
server's /health over loopback, then prints the summary block the test rendered from
benchmark/serving.py's own format calls and appends a result line to --output-file.
"""

import json
import os
import sys
import time
import urllib.request

config = json.load(open(os.environ["FAKE_CONFIG"]))["load"]
argv = sys.argv[1:]
unknown = [a for a in argv if a.startswith("--") and a not in config["flags"]]
if unknown:
    print(f"error: unrecognized arguments: {' '.join(unknown)}", file=sys.stderr)
    sys.exit(2)
opt = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
with open(config["pidfile"], "a") as fh:
    fh.write(f"load {os.getpid()}\n")
with urllib.request.urlopen(f"http://{opt['--host']}:{opt['--port']}/health", timeout=5) as resp:
    assert resp.status == 200
time.sleep(config.get("seconds", 0.3))
if config.get("hang"):
    time.sleep(300)
print(config["summary"], flush=True)
with open(opt["--output-file"], "a") as fh:
    fh.write(json.dumps(config["result"]) + "\n")
