"""Serves a model with the given hypura binary and checks one generation.

    python3 scripts/check-runtime.py HYPURA MODEL.gguf

Used by `check-install-deps.sh --runtime` inside a bare root that has only the
Dockerfile runtime stage's packages; standard library only (the root has no pip).
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

hypura, model = sys.argv[1], sys.argv[2]
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
env = dict(os.environ, HYPURA_CACHE_DIR=tempfile.mkdtemp())
log = tempfile.TemporaryFile()
server = subprocess.Popen(
    [hypura, "serve", "--port", str(port), "--gpu-budget", "0", model], env=env, stdout=log, stderr=log
)
try:
    url = f"http://127.0.0.1:{port}"
    for _ in range(240):
        try:
            urllib.request.urlopen(url, timeout=1)
            break
        except OSError:
            if server.poll() is not None:
                break
            time.sleep(0.5)
    body = {"model": os.path.basename(model)[: -len(".gguf")], "prompt": "Hi", "stream": False,
            "options": {"num_predict": 4, "temperature": 0}}
    request = urllib.request.Request(url + "/api/generate", json.dumps(body).encode())
    reply = json.load(urllib.request.urlopen(request, timeout=120))
    assert reply["done"] and reply["eval_count"] == 4, reply
    print("runtime stage answered:", repr(reply["response"]))
except Exception:
    log.seek(0)
    sys.stderr.write(log.read().decode(errors="replace")[-4000:])
    raise
finally:
    server.terminate()
    server.wait(timeout=60)
