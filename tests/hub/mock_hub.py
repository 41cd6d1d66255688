#!/usr/bin/env python3
"""A stand-in for the Hugging Face Hub on 127.0.0.1, for the download tests (never a remote host).

Serves each --repo OWNER/NAME=DIR (the files of DIR) as huggingface_hub sees the Hub:
  GET /api/models/{repo}/revision/{rev}?blobs=true  -> {"sha", "siblings": [{rfilename, size, blobId, lfs}]}
  GET /{repo}/resolve/{rev}/{path}                    -> the file (HTTP Range answered with 206)
Revisions: main, the tag v1 and the commit hash itself; others get 404 RevisionNotFound. *.safetensors
files are LFS files (sha256 listed). Faults, for the tests: --drop-once / --drop-always PATH (the
connection closes half way through that file; once, or every time), --bad-sha256 PATH (the listing
gives a wrong hash), --gated REPO (401 unless 'Authorization: Bearer --token'), --redirect (files
answer 302 to http://localhost:PORT/cdn/..., another host name, as the Hub sends LFS files to its
CDN), --extra-files (the listing also holds files m3serve must not fetch: .bin, .gguf, an image,
a subfolder), --tls-cert/--tls-key (HTTPS). Every request is appended to --log as a JSON line
(path, range, authorization). Prints "PORT n" once listening."""
import argparse
import hashlib
import http.server
import json
import os
import ssl
import sys
import threading
import urllib.parse

EXTRA_FILES = {
    "pytorch_model.bin": b"not for m3serve\n" * 64,
    "model.gguf": b"GGUF" * 64,
    "images/logo.png": b"\x89PNG" * 16,
    "original/consolidated.safetensors": b"\x00" * 128,
    "README.md": b"# a model card\n",
}


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    def __init__(self, name, folder, extra):
        self.name = name
        self.files = {}
        for entry in sorted(os.listdir(folder)):
            path = os.path.join(folder, entry)
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    self.files[entry] = f.read()
        if extra:
            self.files.update(EXTRA_FILES)
        self.commit = hashlib.sha1(("commit of " + name).encode()).hexdigest()

    def listing(self, bad_sha256):
        siblings = []
        for path, data in self.files.items():
            entry = {"rfilename": path, "size": len(data)}
            if path.endswith(".safetensors"):
                sha = hashlib.sha256(data).hexdigest()
                if path in bad_sha256:
                    sha = hashlib.sha256(b"something else").hexdigest()
                pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {len(data)}\n"
                entry["blobId"] = git_blob_id(pointer.encode())
                entry["lfs"] = {"sha256": sha, "size": len(data), "pointerSize": len(pointer)}
            else:
                entry["blobId"] = git_blob_id(data)
            siblings.append(entry)
        return {"id": self.name, "modelId": self.name, "sha": self.commit, "siblings": siblings}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", action="append", default=[])
    parser.add_argument("--log", required=True)
    parser.add_argument("--drop-once", action="append", default=[])
    parser.add_argument("--drop-always", action="append", default=[])
    parser.add_argument("--bad-sha256", action="append", default=[])
    parser.add_argument("--gated", action="append", default=[])
    parser.add_argument("--token", default="")
    parser.add_argument("--redirect", action="store_true")
    parser.add_argument("--extra-files", action="store_true")
    parser.add_argument("--tls-cert")
    parser.add_argument("--tls-key")
    args = parser.parse_args()

    repos = {}
    for spec in args.repo:
        name, folder = spec.split("=", 1)
        repos[name] = Repo(name, folder, args.extra_files)
    dropped = set()
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def record(self):
            with lock, open(args.log, "a") as log:
                log.write(json.dumps({"path": self.path, "range": self.headers.get("Range"),
                                      "authorization": self.headers.get("Authorization")}) + "\n")

        def answer(self, status, body=b"", headers=()):
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def find_repo(self, parts):
            # parts: [owner, name, ...] or [name, ...]
            for n in (2, 1):
                name = "/".join(parts[:n])
                if name in repos:
                    return repos[name], parts[n:]
            return None, None

        def revision_ok(self, repo, revision):
            return revision in ("main", "v1", repo.commit)

        def allowed(self, repo):
            if repo.name not in args.gated:
                return True
            if self.headers.get("Authorization") == f"Bearer {args.token}" and args.token:
                return True
            self.answer(401, b'{"error": "Access to this model is restricted"}',
                        [("X-Error-Code", "GatedRepo"), ("X-Error-Message", "Access to model is restricted.")])
            return False

        def do_GET(self):
            self.record()
            url = urllib.parse.urlsplit(self.path)
            parts = [urllib.parse.unquote(p) for p in url.path.strip("/").split("/")]
            if parts[:2] == ["api", "models"]:
                repo, rest = self.find_repo(parts[2:])
                if repo is None:
                    return self.answer(404, b'{"error": "Repository not found"}', [("X-Error-Code", "RepoNotFound")])
                if not self.allowed(repo):
                    return
                if len(rest) != 2 or rest[0] != "revision" or not self.revision_ok(repo, rest[1]):
                    return self.answer(404, b'{"error": "Invalid rev id"}', [("X-Error-Code", "RevisionNotFound")])
                return self.answer(200, json.dumps(repo.listing(args.bad_sha256)).encode(),
                                   [("Content-Type", "application/json")])
            if parts[0] == "cdn":
                repo, rest = self.find_repo(parts[1:])
                return self.send_file(repo, "/".join(rest))
            repo, rest = self.find_repo(parts)
            if repo is None or len(rest) < 3 or rest[0] != "resolve":
                return self.answer(404, b"not found", [("X-Error-Code", "RepoNotFound")])
            if not self.allowed(repo):
                return
            if not self.revision_ok(repo, rest[1]):
                return self.answer(404, b"no such revision", [("X-Error-Code", "RevisionNotFound")])
            path = "/".join(rest[2:])
            if path not in repo.files:
                return self.answer(404, b"no such file", [("X-Error-Code", "EntryNotFound")])
            if args.redirect:
                port = self.server.server_address[1]
                scheme = "https" if args.tls_cert else "http"
                return self.answer(302, b"", [("Location", f"{scheme}://localhost:{port}/cdn/{repo.name}/{path}"),
                                              ("X-Repo-Commit", repo.commit)])
            return self.send_file(repo, path)

        def send_file(self, repo, path):
            data = repo.files[path]
            start = 0
            status = 200
            headers = [("ETag", '"%s"' % git_blob_id(data)), ("X-Repo-Commit", repo.commit)]
            requested = self.headers.get("Range")
            if requested and requested.startswith("bytes=") and requested.endswith("-"):
                start = int(requested[len("bytes="):-1])
                if start >= len(data):
                    return self.answer(416, b"", [("Content-Range", f"bytes */{len(data)}")])
                status = 206
                headers.append(("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}"))
            body = data[start:]
            with lock:
                drop = path in args.drop_always or (path in args.drop_once and path not in dropped)
                dropped.add(path)
            if not drop:
                return self.answer(status, body, headers)
            # Promise the whole body, send half, and hang up.
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if args.tls_cert:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.tls_cert, args.tls_key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
