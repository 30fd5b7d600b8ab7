"""The third-party JavaScript the site serves itself: MathJax and Mermaid, pinned here only.

A reader may open the site with no network, so nothing is loaded from a CDN at view time. Each
package is pinned to an exact npm version and to the sha512 ``integrity`` that the npm registry's
metadata gives for its tarball. The tarball is downloaded from the registry, checked against that
integrity before anything in it is used, and only the files the site needs are extracted, with the
package's licence, into ``.cache/vendor/`` (git-ignored). The MkDocs hook (scripts/mkdocs_hooks.py)
calls :func:`ensure_all` on every build, which fetches what is missing, and publishes the files
under ``vendor/<package>/`` in the built site (the package's name without its npm scope).

    python scripts/vendor_assets.py                        # fetch into .cache/vendor/
    python scripts/vendor_assets.py --pin mermaid 11.17.2  # registry metadata for a new pin

To update a package: run ``--pin NAME VERSION``, copy the version and integrity it prints into
``PACKAGES`` below, and build the site; the hook fetches the new version.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import posixpath
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REGISTRY = "https://registry.npmjs.org"
ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = ROOT / ".cache" / "vendor"
SITE_PREFIX = "vendor"  # the files are published at vendor/<package>/... in the built site
TIMEOUT_S = 120


@dataclass(frozen=True)
class Package:
    """An npm package pinned by version and tarball integrity, and the files the site publishes.

    ``files`` maps a path in the tarball (below its ``package/`` folder) to a path below
    ``vendor/<name>/`` in the site; a path ending in ``/`` takes every file of that folder."""

    name: str
    version: str
    integrity: str  # "sha512-<base64>": the registry metadata's dist.integrity of the tarball
    files: tuple[tuple[str, str], ...]

    @property
    def site_name(self) -> str:
        """The folder below ``vendor/`` (and in the cache): the name without its npm scope."""
        return self.name.rsplit("/", 1)[-1]

    @property
    def tarball_url(self) -> str:
        return f"{REGISTRY}/{self.name}/-/{self.site_name}-{self.version}.tgz"

    @property
    def key(self) -> str:
        return f"{self.site_name}-{self.version}"


PACKAGES = (
    # MathJax 4 (docs/javascripts/mathjax.js is its configuration): version 4 breaks long in-line
    # formulas across lines, where version 3 let them run past a phone's column. The combined
    # component needs, at run time, the TeX extensions that "autoload" fetches when a page uses one
    # of their macros (\color, \cancel, \boldsymbol, ...), the accessibility components and the
    # speech worker with its rule files (sre/), which its menu and screen-reader support load, and
    # the font package below.
    Package("mathjax", "4.1.3",
            "sha512-BN/8Pkgn7G1pIDYJqd9md+JHsE/jydSYbyOZnSdSA0WziuVO8mRxdYiWFumkVVly/"
            "8U+hm9DpIIoWuvySverzw==",
            (("tex-mml-chtml.js", "tex-mml-chtml.js"),
             ("input/tex/extensions/", "input/tex/extensions/"),
             ("a11y/", "a11y/"),
             ("ui/", "ui/"),
             ("sre/", "sre/"),
             ("LICENSE", "LICENSE"))),
    # MathJax 4's default font (New Computer Modern): the CHTML web fonts and the character ranges
    # loaded on demand. Published at vendor/mathjax-newcm-font/, where the configuration's
    # `paths.fonts` (vendor/) makes MathJax look for it. The package ships no LICENSE file; its
    # package.json states the licence (Apache-2.0).
    Package("@mathjax/mathjax-newcm-font", "4.1.3",
            "sha512-gzAB3dFHilHX1l5x2xUqRL+1jDQt3Fyza1DkEMVXWC4E8SvsGdlgEza47HYi2WhVcgfkvf4zgUGzuhbq3P"
            "jlew==",
            (("chtml/woff2/", "chtml/woff2/"),
             ("chtml/dynamic/", "chtml/dynamic/"),
             ("package.json", "package.json"))),
    # Mermaid 11, the major version Material for MkDocs 9 loads; the IIFE build is one
    # self-contained file that defines the global `mermaid`, which Material then uses instead
    # of fetching its own.
    Package("mermaid", "11.17.2",
            "sha512-V6K3C8EBdEsPFZXSKMJe6ppQOENxuHARr9GvHX4hh47lAbhMRD9qf4oEK7LoaRQxULMa80/"
            "qt5gHO73aCleBBg==",
            (("dist/mermaid.min.js", "mermaid.min.js"),
             ("LICENSE", "LICENSE"))),
)


class VendorError(RuntimeError):
    """A package could not be fetched, verified or extracted."""


class IntegrityError(VendorError):
    """A tarball's digest is not the pinned integrity."""


def check_integrity(data: bytes, integrity: str, what: str = "tarball") -> None:
    """Raise IntegrityError unless ``data`` has the Subresource-Integrity digest ``integrity``."""
    algo, _, expected = integrity.partition("-")
    if algo not in ("sha512", "sha384", "sha256") or not expected:
        raise IntegrityError(f"{what}: unsupported integrity {integrity!r} (want sha512-<base64>)")
    got = base64.b64encode(hashlib.new(algo, data).digest()).decode()
    if got != expected:
        raise IntegrityError(f"{what}: integrity mismatch: pinned {integrity}, got {algo}-{got}")


def download(url: str) -> bytes:
    """The body of ``url`` (network errors are VendorError)."""
    req = urllib.request.Request(url, headers={"User-Agent": "kernels-measured vendor_assets"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
            return resp.read()
    except OSError as err:  # URLError, HTTPError and timeouts are all OSErrors
        raise VendorError(f"cannot download {url}: {err}") from err


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _select(pkg: Package, data: bytes) -> dict[str, bytes]:
    """The files ``pkg.files`` names, from the verified tarball ``data``: {site path: content}."""
    out: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        for src, dest in pkg.files:
            found = 0
            for m in members:
                name = posixpath.normpath(m.name)
                if not name.startswith("package/"):
                    continue
                rel = name[len("package/"):]
                if src.endswith("/"):
                    if not rel.startswith(src):
                        continue
                    target = dest + rel[len(src):]
                elif rel == src:
                    target = dest
                else:
                    continue
                if target.startswith("/") or ".." in target.split("/"):
                    raise VendorError(f"{pkg.key}: unsafe path {m.name!r} in the tarball")
                out[target] = tar.extractfile(m).read()
                found += 1
            if not found:
                raise VendorError(f"{pkg.key}: the tarball has no {src!r} "
                                  "(did the package's layout change?)")
    return out


def _stamp_path(pkg: Package, cache_dir: Path) -> Path:
    return cache_dir / f"{pkg.key}.json"


def _cached(pkg: Package, cache_dir: Path) -> dict[str, str] | None:
    """{site path: sha256} of a complete, unaltered extraction of ``pkg``, or None."""
    try:
        stamp = json.loads(_stamp_path(pkg, cache_dir).read_text())
    except (OSError, ValueError):
        return None
    if stamp.get("integrity") != pkg.integrity or stamp.get("spec") != [list(f) for f in pkg.files]:
        return None
    root = cache_dir / pkg.key
    files = stamp.get("files", {})
    for rel, digest in files.items():
        path = root / rel
        if not path.is_file() or _sha256(path) != digest:
            return None
    return files


def fetch(pkg: Package, cache_dir: Path = CACHE_DIR) -> dict[str, Path]:
    """Make sure ``pkg``'s files are in the cache; return {path below vendor/NAME/: cached file}.

    The tarball (kept in the cache, downloaded when missing) is checked against the pinned
    integrity before anything is extracted; a cached tarball that fails the check is deleted."""
    cache_dir = Path(cache_dir)
    root = cache_dir / pkg.key
    files = _cached(pkg, cache_dir)
    if files is None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tarball = cache_dir / f"{pkg.key}.tgz"
        if tarball.is_file():
            data = tarball.read_bytes()
            try:
                check_integrity(data, pkg.integrity, f"{tarball}")
            except IntegrityError:
                tarball.unlink()
                raise
        else:
            data = download(pkg.tarball_url)
            check_integrity(data, pkg.integrity, pkg.tarball_url)
            tmp = tarball.with_suffix(".tgz.part")
            tmp.write_bytes(data)
            tmp.replace(tarball)
        selected = _select(pkg, data)
        staging = Path(tempfile.mkdtemp(prefix=f".{pkg.key}-", dir=cache_dir))
        staging.chmod(0o755)  # mkdtemp's 0700 would otherwise be the folder's mode
        try:
            for rel, content in selected.items():
                path = staging / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(content)
            shutil.rmtree(root, ignore_errors=True)
            staging.replace(root)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        files = {rel: hashlib.sha256(content).hexdigest()
                 for rel, content in sorted(selected.items())}
        stamp = {"name": pkg.name, "version": pkg.version, "integrity": pkg.integrity,
                 "spec": [list(f) for f in pkg.files], "files": files}
        _stamp_path(pkg, cache_dir).write_text(json.dumps(stamp, indent=1) + "\n")
    return {rel: root / rel for rel in files}


def ensure_all(cache_dir: Path = CACHE_DIR, packages=PACKAGES) -> dict[str, Path]:
    """Every pinned package in the cache: {path in the site (vendor/NAME/...): cached file}, NAME
    without the npm scope."""
    out = {}
    for pkg in packages:
        for rel, path in fetch(pkg, cache_dir).items():
            out[f"{SITE_PREFIX}/{pkg.site_name}/{rel}"] = path
    return out


def registry_pin(name: str, version: str) -> dict:
    """The registry metadata a pin needs: exact version, tarball address, integrity and licence."""
    meta = json.loads(download(f"{REGISTRY}/{name}/{version}"))
    dist = meta["dist"]
    return {"name": meta["name"], "version": meta["version"], "tarball": dist["tarball"],
            "integrity": dist["integrity"], "license": meta.get("license")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pin", nargs=2, metavar=("NAME", "VERSION"),
                        help="print the registry's version and integrity for a pin; fetch nothing")
    parser.add_argument("--cache", type=Path, default=CACHE_DIR, help=f"default: {CACHE_DIR}")
    args = parser.parse_args(argv)
    try:
        if args.pin:
            print(json.dumps(registry_pin(*args.pin), indent=2))
            return 0
        for pkg in PACKAGES:
            files = fetch(pkg, args.cache)
            size = sum(p.stat().st_size for p in files.values())
            print(f"{pkg.name} {pkg.version}: {len(files)} files, {size / 1e6:.2f} MB "
                  f"in {args.cache / pkg.key}")
    except VendorError as err:
        print(f"vendor_assets: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
