"""Runs the official openai Node client (openai@6) against m3serve: tests/server/node/
openai_client_test.cjs (chat, completions) on the tiny model and the scripted-model server, and
responses_client_test.cjs (/v1/responses) on the tiny model, the bundled small model and the
scripted-model server.

Installs the pinned client (node/package-lock.json) with `npm ci` into NODE_DEPS_DIR (a build
folder, so the source tree stays clean) unless it is already there. Exits 77 (CTest: skipped)
when npm cannot reach its registry, so an offline machine reports the test as skipped, not
passed.
"""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from live_server import LiveServer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ.get("M3SERVE_BIN", "build/bin/m3serve")
SCRIPTED = os.environ.get("SCRIPTED_SERVER_BIN", "build/tests/server/scripted_server")
MODEL = os.environ.get("M3SERVE_MODEL", "models/minimax-m3-tiny")
SMALL_MODEL = "models/minimax-m3-small"
DEPS = os.environ.get("NODE_DEPS_DIR", "build/node_client_test")


def install_client(package_dir=os.path.join(HERE, "node"), deps=DEPS):
    """`npm ci` of package_dir's package.json + package-lock.json into `deps` (once per lock)."""
    lock = os.path.join(package_dir, "package-lock.json")
    marker = os.path.join(deps, "node_modules", ".m3-lock")
    want = open(lock).read()
    if os.path.exists(marker) and open(marker).read() == want:
        return True
    os.makedirs(deps, exist_ok=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copy(os.path.join(package_dir, name), os.path.join(deps, name))
    try:
        p = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=deps, capture_output=True, text=True,
                           timeout=600)
    except FileNotFoundError:
        print("npm is not installed")
        return False
    if p.returncode != 0:
        print(p.stdout + p.stderr)
        return False
    with open(marker, "w") as f:
        f.write(want)
    return True


def main():
    if not install_client():
        print("SKIPPED: npm could not install the openai client (npm missing or offline?)")
        return 77
    parsers = ["--reasoning-parser", "minimax_m3", "--tool-call-parser", "minimax_m3", "--enable-auto-tool-choice",
               "--enable-prompt-tokens-details", "--disable-log-stats"]
    real = LiveServer([BIN, "serve", MODEL, "--host", "127.0.0.1", "--port", "0", "--served-model-name", "tiny",
                       "--max-model-len", "1024"] + parsers)
    small = LiveServer([BIN, "serve", SMALL_MODEL, "--host", "127.0.0.1", "--port", "0", "--served-model-name",
                        "small", "--max-model-len", "1024", "--kv-cache-dtype", "nvfp4"] + parsers)
    # --port 0: the scripted server's default is 8000, which another process may hold.
    scripted = LiveServer([SCRIPTED, "--model-dir", MODEL, "--port", "0",
                           "--replies", os.path.join(HERE, "scripted_replies.json"),
                           "--reasoning-parser", "minimax_m3", "--tool-call-parser", "minimax_m3",
                           "--enable-auto-tool-choice", "--enable-prompt-tokens-details"])
    try:
        env = dict(os.environ, NODE_PATH=os.path.abspath(os.path.join(DEPS, "node_modules")),
                   M3SERVE_URL="http://127.0.0.1:%d" % real.port, M3SERVE_SMALL_URL="http://127.0.0.1:%d" % small.port,
                   SCRIPTED_URL="http://127.0.0.1:%d" % scripted.port)
        failed = 0
        for script in ("openai_client_test.cjs", "responses_client_test.cjs"):
            print("== " + script, flush=True)
            p = subprocess.run(["node", os.path.join(HERE, "node", script)], env=env, timeout=300)
            failed += p.returncode != 0
        return 1 if failed else 0
    finally:
        for server in (real, small, scripted):
            if server.stop() != 0:
                print(server.log_text())


if __name__ == "__main__":
    sys.exit(main())
