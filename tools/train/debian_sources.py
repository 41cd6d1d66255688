#!/usr/bin/env python3
"""More Python source for the small model's corpus: the .py files of Debian packages the GPU
machine's own site-packages do not already hold (a different version of the same package would be
a near-duplicate of files there, and could copy held-out files into the train split).

Runs on a Debian machine with apt (not the GPU machine, which has no package registry):
  1. `apt-get download` of PACKAGES (exact versions recorded), `dpkg-deb -x` of each;
  2. every *.py of 200 B .. 1 MB, sorted walk; exact duplicates dropped (sha1);
  3. a package over PER_PACKAGE_MB keeps the files with the smallest sha1 up to the cap (a
     content-random subsample), so that one large package (ansible) does not set the style;
  4. writes OUT (a .tar.xz of <package>/<path inside the package>) and OUT.json (packages, versions,
     counts, the archive's sha256).
corpus.py --extra DIR reads the unpacked archive into the train split only, and drops any file that
could leak the held-out split (its docstring says how).

Usage: python3 tools/train/debian_sources.py --out build/debian-py.tar.xz
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

# Large, well-written Python code bases in different domains (web, networking, cloud services,
# science, build tools, editors' tooling, an e-book manager), none of them in the GPU machine's
# site-packages.
PACKAGES = [
    "ansible", "python3-django", "python3-twisted", "mercurial-common", "python3-sqlalchemy",
    "python3-biopython", "python3-astropy", "python3-nova", "python3-neutron", "python3-cinder",
    "python3-heat", "python3-sphinx", "python3-docutils", "python3-dask", "python3-tornado",
    "python3-mypy", "python3-astroid", "python3-nltk", "buildbot", "scons", "calibre",
    "python3-ipython", "python3-jedi", "python3-parso", "python3-openstackclient", "python3-keystone",
    "python3-glance", "python3-novaclient",
]
PER_PACKAGE_MB = 40
MIN_BYTES, MAX_BYTES = 200, 1_000_000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    t0 = time.time()
    out = Path(args.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        debs = Path(tmp) / "debs"
        debs.mkdir()
        subprocess.run(["apt-get", "download", *PACKAGES], cwd=debs, check=True)
        info = {"built_by": "tools/train/debian_sources.py", "per_package_mb": PER_PACKAGE_MB, "packages": []}
        seen = set()
        with tarfile.open(out, "w:xz", preset=9) as tar:
            for deb in sorted(debs.glob("*.deb")):
                name, version = deb.name.split("_")[:2]
                root = Path(tmp) / "x" / name
                root.mkdir(parents=True)
                subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
                files = []
                for dirpath, dirnames, filenames in os.walk(root):
                    dirnames.sort()
                    for f in sorted(filenames):
                        p = Path(dirpath) / f
                        if not f.endswith(".py") or p.is_symlink():
                            continue
                        data = p.read_bytes()
                        sha = hashlib.sha1(data).hexdigest()
                        if not (MIN_BYTES <= len(data) <= MAX_BYTES) or sha in seen:
                            continue
                        seen.add(sha)
                        files.append((sha, p, len(data)))
                total, kept = 0, []
                for sha, p, n in sorted(files):
                    if total + n > PER_PACKAGE_MB * 2**20:
                        continue
                    kept.append(p)
                    total += n
                for p in sorted(kept):
                    tar.add(p, arcname=f"{name}/{p.relative_to(root)}", recursive=False)
                info["packages"].append({"name": name, "version": version, "files": len(files),
                                         "kept_files": len(kept), "kept_bytes": total})
                print(f"{name} {version}: {len(kept)} / {len(files)} files, {total / 2**20:.1f} MiB", flush=True)
    info["sha256"] = hashlib.sha256(out.read_bytes()).hexdigest()
    info["archive_bytes"] = out.stat().st_size
    info["seconds"] = round(time.time() - t0, 1)
    Path(str(out) + ".json").write_text(json.dumps(info, indent=1))
    print(f"{out}: {info['archive_bytes'] / 2**20:.1f} MiB, "
          f"{sum(p['kept_bytes'] for p in info['packages']) / 2**20:.1f} MiB of source; {info['seconds']} s")


if __name__ == "__main__":
    sys.exit(main())
