"""A small stand-in for the Hugging Face Hub on 127.0.0.1, serving dataset repositories from local
folders, for ``HF_ENDPOINT``. It answers exactly the calls ``huggingface_hub.HfFileSystem`` makes to
list and read a dataset repository (huggingface_hub 1.33):

- ``GET /api/datasets/ORG/NAME[/revision/REV]``: the repository's info (``HfApi.repo_info``), which
  HfFileSystem asks first to learn that the repository and revision exist;
- ``GET /api/datasets/ORG/NAME/tree/REV[/PATH]`` (``?recursive=``): a folder's entries (``list_repo_tree``);
- ``POST /api/datasets/ORG/NAME/paths-info/REV``: entries by path (``get_paths_info``, ``fs.info``);
- ``GET``/``HEAD /datasets/ORG/NAME/resolve/REV/PATH``: a file, with ``Range`` requests (reads);
- ``GET /api/agent-harnesses``: the registry huggingface_hub's user-agent detection reads (empty).

Errors as the Hub gives them (``X-Error-Code``: ``RepoNotFound``, ``RevisionNotFound``,
``EntryNotFound``; a private repository without its token: 401). Any other request is answered 501
and recorded in ``unexpected``: the tests assert it stays empty, so a ``huggingface_hub`` that calls
something else fails them loudly instead of passing.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

SHA = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Repo:
    revisions: dict[str, Path]  # revision name -> folder with the files
    private_token: str | None = None  # a private repository answers only this token


@dataclass
class HubServer:
    repos: dict[str, Repo]
    unexpected: list[str] = field(default_factory=list)
    calls: set[str] = field(default_factory=set)

    def start(self) -> str:
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub._serve(self, body=False)

            def do_GET(self):
                hub._serve(self, body=True)

            def do_POST(self):
                hub._serve(self, body=True)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._server.shutdown()

    # -- answers ------------------------------------------------------------------------------
    def _serve(self, h, body: bool) -> None:
        url = urlparse(h.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        try:
            if parts == ["api", "agent-harnesses"] and h.command == "GET":
                # huggingface_hub's user-agent detection reads this registry once a day: an empty one.
                self.calls.add("agent-harnesses")
                return self._json(h, {"standardEnvVars": [], "harnesses": {}})
            if parts[:2] == ["api", "datasets"] and len(parts) >= 4:
                repo_id, rest = "/".join(parts[2:4]), parts[4:]
                repo = self._repo(h, repo_id)
                if repo is None:
                    return
                if not rest or rest[0] == "revision":
                    folder = self._revision(h, repo, rest[1] if len(rest) > 1 else "main")
                    if folder is not None:
                        self.calls.add("repo_info")
                        files = [p.relative_to(folder).as_posix() for p in sorted(folder.rglob("*")) if p.is_file()]
                        self._json(h, {"id": repo_id, "_id": repo_id, "sha": SHA, "private": bool(repo.private_token),
                                       "siblings": [{"rfilename": f} for f in files], "tags": [], "downloads": 0,
                                       "likes": 0, "disabled": False, "gated": False})
                    return
                if rest[0] == "tree" and h.command == "GET" and len(rest) >= 2:
                    folder = self._revision(h, repo, rest[1])
                    if folder is not None:
                        self.calls.add("list_repo_tree")
                        where = folder.joinpath(*rest[2:]) if len(rest) > 2 else folder
                        if not where.is_dir():
                            return self._error(h, 404, "EntryNotFound", f"{'/'.join(rest[2:])} does not exist")
                        recursive = parse_qs(url.query).get("recursive", ["false"])[0].lower() == "true"
                        found = sorted(where.rglob("*") if recursive else where.iterdir())
                        self._json(h, [self._entry(folder, p) for p in found])
                    return
                if rest[0] == "paths-info" and h.command == "POST" and len(rest) >= 2:
                    folder = self._revision(h, repo, rest[1])
                    if folder is not None:
                        self.calls.add("get_paths_info")
                        length = int(h.headers.get("Content-Length") or 0)
                        raw = h.rfile.read(length).decode()
                        if h.headers.get("Content-Type", "").startswith("application/json"):
                            paths = json.loads(raw).get("paths", [])
                        else:
                            paths = parse_qs(raw).get("paths", [])
                        paths = [paths] if isinstance(paths, str) else paths
                        self._json(h, [self._entry(folder, folder / p) for p in paths if (folder / p).exists()])
                    return
            if parts[:1] == ["datasets"] and len(parts) >= 6 and parts[3] == "resolve" and h.command in ("GET", "HEAD"):
                repo = self._repo(h, "/".join(parts[1:3]))
                if repo is None:
                    return
                folder = self._revision(h, repo, parts[4])
                if folder is not None:
                    self.calls.add("resolve")
                    self._file(h, folder.joinpath(*parts[5:]), body)
                return
        except (BrokenPipeError, ConnectionResetError):
            return
        self.unexpected.append(f"{h.command} {h.path}")
        self._error(h, 501, "NotInTheStandIn", f"the stand-in Hub does not answer {h.command} {url.path}")

    def _repo(self, h, repo_id: str) -> Repo | None:
        repo = self.repos.get(repo_id)
        if repo is None:
            self._error(h, 404, "RepoNotFound", "Repository not found")
            return None
        token = (h.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
        if repo.private_token and token != repo.private_token:
            self._error(h, 401, "RepoNotFound", "Invalid credentials in Authorization header")
            return None
        return repo

    def _revision(self, h, repo: Repo, revision: str) -> Path | None:
        folder = repo.revisions.get(revision) or (repo.revisions.get("main") if revision == SHA else None)
        if folder is None:
            self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return folder

    @staticmethod
    def _entry(folder: Path, path: Path) -> dict:
        rel = path.relative_to(folder).as_posix()
        oid = hashlib.sha1(rel.encode()).hexdigest()
        if path.is_dir():
            return {"type": "directory", "oid": oid, "path": rel}
        return {"type": "file", "oid": oid, "size": path.stat().st_size, "path": rel}

    def _file(self, h, path: Path, body: bool) -> None:
        if not path.is_file():
            return self._error(h, 404, "EntryNotFound", "Entry not found")
        data = path.read_bytes()
        status, headers = 200, {}
        ranged = h.headers.get("Range") or h.headers.get("range")
        if ranged and ranged.startswith("bytes="):
            start_text, _, end_text = ranged[len("bytes="):].partition("-")
            start = int(start_text or 0)
            end = min(int(end_text), len(data) - 1) if end_text else len(data) - 1
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            data, status = data[start:end + 1], 206
        h.send_response(status)
        for key, value in {"Content-Type": "application/octet-stream", "Content-Length": str(len(data)),
                           "Accept-Ranges": "bytes", "ETag": f'"{hashlib.sha1(path.read_bytes()).hexdigest()}"',
                           "X-Repo-Commit": SHA, **headers}.items():
            h.send_header(key, value)
        h.end_headers()
        if body:
            h.wfile.write(data)

    @staticmethod
    def _json(h, payload) -> None:
        data = json.dumps(payload).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)

    @staticmethod
    def _error(h, status: int, code: str, message: str) -> None:
        data = json.dumps({"error": message}).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", message)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)
