"""Runs tests/server/node_anthropic/anthropic_client_test.cjs (the official @anthropic-ai/sdk Node
client) against m3serve's /v1/messages on the tiny and the small bundled models and on the
scripted-model server.

Installs the pinned client (node_anthropic/package-lock.json) with `npm ci` into
ANTHROPIC_NODE_DEPS_DIR (a build folder) unless it is already there. Exits 77 (CTest: skipped)
when npm cannot reach its registry.
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from live_server import LiveServer  # noqa: E402
from run_node_test import install_client  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ.get("M3SERVE_BIN", "build/bin/m3serve")
SCRIPTED = os.environ.get("SCRIPTED_SERVER_BIN", "build/tests/server/scripted_server")
DEPS = os.environ.get("ANTHROPIC_NODE_DEPS_DIR", "build/anthropic_client_test")
API_KEY = "sk-m3-anthropic-test"
PARSERS = ["--reasoning-parser", "minimax_m3", "--tool-call-parser", "minimax_m3", "--enable-auto-tool-choice"]


def serve(model_dir, name, extra=()):
    return LiveServer([BIN, "serve", model_dir, "--host", "127.0.0.1", "--port", "0", "--served-model-name", name,
                       "--max-model-len", "1024", "--disable-log-stats"] + PARSERS + list(extra))


def main():
    if not install_client(os.path.join(HERE, "node_anthropic"), DEPS):
        print("SKIPPED: npm could not install @anthropic-ai/sdk (npm missing or offline?)")
        return 77
    servers = []
    try:
        servers.append(serve("models/minimax-m3-tiny", "tiny", ["--api-key", API_KEY]))
        servers.append(serve("models/minimax-m3-small", "small"))
        servers.append(LiveServer([SCRIPTED, "--model-dir", "models/minimax-m3-tiny", "--port", "0",
                                   "--served-model-name", "scripted",
                                   "--replies", os.path.join(HERE, "anthropic_replies.json")] + PARSERS))
        tiny, small, scripted = servers
        env = dict(os.environ, NODE_PATH=os.path.abspath(os.path.join(DEPS, "node_modules")), API_KEY=API_KEY,
                   TINY_URL="http://127.0.0.1:%d" % tiny.port, SMALL_URL="http://127.0.0.1:%d" % small.port,
                   SCRIPTED_URL="http://127.0.0.1:%d" % scripted.port)
        p = subprocess.run(["node", os.path.join(HERE, "node_anthropic", "anthropic_client_test.cjs")], env=env,
                           timeout=300)
        return p.returncode
    finally:
        for server in servers:
            if server.stop() != 0:
                print(server.log_text())


if __name__ == "__main__":
    sys.exit(main())
