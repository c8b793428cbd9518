"""The files below a landing folder, each link resolved before it is followed.

pyarrow's local ``FileSelector(recursive=True)`` follows every link and drops what it cannot
stat: a link back to its own folder (``loop -> ../date=D``) is listed again at every level
until the OS refuses (some 40 levels, so a day is read 41 times), and a dangling link vanishes
without a word. Here each link is resolved to its real path first, and each real file and folder
is listed once:

- a link that cannot be resolved (dangling, or a chain of links that loops), a link to a folder
  it sits in or one above it (a loop), or a link whose target leaves the data root is
  **broken**: the day fails naming it, whatever the not-parquet policy, since no policy makes
  it data;
- a second path to a file or folder already listed is an **alias** of the first: the same
  bytes, which the caller treats as a duplicate (:func:`resources.landing_files.list_landing`).

Links below a not-data name (``_temporary/``, ``.x.crc``) are listed as they are, never
followed or judged: those files are skipped whatever they point to. Object stores have no
links; their listing stays pyarrow's.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow.fs as pafs


@dataclass(frozen=True)
class Walked:
    """What :func:`list_files` found below a folder.

    Attributes:
        files: every file listed once, in path order (a link to a file under its own path).
        broken: path -> why the link cannot be read (dangling, a loop, outside the root).
        aliases: path -> the path already listed for the same real file or folder.
    """

    files: list[pafs.FileInfo] = field(default_factory=list)
    broken: dict[str, str] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)


def list_files(
    fs: pafs.FileSystem, folder: str, root: str, is_data: Callable[[str], bool]
) -> Walked:
    """Every file below ``folder`` (which exists), walked link-safely on a local disk.

    Args:
        fs: the folder's filesystem.
        folder: the folder to list.
        root: the data root no link may leave.
        is_data: whether a path relative to ``folder`` is data (else its links are not followed).
    """
    if not isinstance(fs, pafs.LocalFileSystem):
        entries = fs.get_file_info(pafs.FileSelector(folder, recursive=True))
        return Walked(sorted((e for e in entries if e.type == pafs.FileType.File), key=_path))
    return _Walk(folder, root, is_data).run()


def _path(info: pafs.FileInfo) -> str:
    return info.path


class _Walk:
    def __init__(self, folder: str, root: str, is_data: Callable[[str], bool]):
        self.folder, self.start, self.is_data = folder, len(folder) + 1, is_data
        self.root = os.path.realpath(root)
        self.files: list[pafs.FileInfo] = []
        self.broken: dict[str, str] = {}
        self.aliases: dict[str, str] = {}
        self.seen: dict[str, str] = {}  # real path -> the path it was first listed under

    def run(self) -> Walked:
        real = os.path.realpath(self.folder)
        if not self._inside(real):
            self.broken[self.folder] = f"a link to {real}, outside the data root {self.root}"
        else:
            self.seen[real] = self.folder
            self._visit(self.folder, (real,))
        return Walked(sorted(self.files, key=_path), self.broken, self.aliases)

    def _visit(self, directory: str, ancestors: tuple[str, ...]) -> None:
        with os.scandir(directory) as scan:
            entries = sorted(scan, key=lambda e: e.name)
        for entry in entries:
            path = f"{directory}/{entry.name}"
            if not self.is_data(path[self.start :]):
                self._list_as_is(entry, path, ancestors)
            elif entry.is_symlink():
                self._follow(path, ancestors)
            elif entry.is_dir(follow_symlinks=False):
                self._enter(path, os.path.join(ancestors[-1], entry.name), ancestors)
            elif entry.is_file(follow_symlinks=False):
                self._add_file(path, os.path.join(ancestors[-1], entry.name))

    def _list_as_is(self, entry: os.DirEntry, path: str, ancestors: tuple[str, ...]) -> None:
        """A not-data entry: listed to be skipped, never followed (a real folder is entered,
        so its files are counted as skipped)."""
        if entry.is_dir(follow_symlinks=False):
            self._visit(path, (*ancestors, os.path.join(ancestors[-1], entry.name)))
        elif entry.is_file(follow_symlinks=False) or entry.is_symlink():
            stat = entry.stat(follow_symlinks=False)
            self.files.append(_info(path, stat))

    def _follow(self, path: str, ancestors: tuple[str, ...]) -> None:
        target = os.readlink(path)
        try:
            os.stat(path)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                self.broken[path] = f"a symlink loop (-> {target}: its links never end)"
            else:
                self.broken[path] = f"a dangling link (-> {target}, which does not exist)"
            return
        real = os.path.realpath(path)
        if not self._inside(real):
            self.broken[path] = f"a link to {real}, outside the data root {self.root}"
        elif real in ancestors:
            self.broken[path] = (
                f"a symlink loop (-> {target}: it leads back to {self.seen[real]}, which holds it)"
            )
        elif ancestors[0].startswith(real + os.sep):
            # A folder above the one listed holds it: walked, it would list it again.
            self.broken[path] = f"a symlink loop (-> {target}: it leads to {real}, which holds it)"
        elif os.path.isdir(real):
            self._enter(path, real, ancestors)
        else:
            self._add_file(path, real)

    def _enter(self, path: str, real: str, ancestors: tuple[str, ...]) -> None:
        if real in self.seen:
            self.aliases[path] = self.seen[real]
            return
        self.seen[real] = path
        self._visit(path, (*ancestors, real))

    def _add_file(self, path: str, real: str) -> None:
        if real in self.seen:
            self.aliases[path] = self.seen[real]
            return
        self.seen[real] = path
        self.files.append(_info(path, os.stat(path)))

    def _inside(self, real: str) -> bool:
        return real == self.root or real.startswith(self.root + os.sep)


def _info(path: str, stat: os.stat_result) -> pafs.FileInfo:
    return pafs.FileInfo(path, pafs.FileType.File, size=stat.st_size, mtime_ns=stat.st_mtime_ns)
