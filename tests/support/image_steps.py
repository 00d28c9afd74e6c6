"""The Dockerfile's own steps, replayed into a folder that stands for the image's filesystem.

No container runtime here can pull the base image, so ``replay(dockerfile, root, ...)`` does what the build
would do, instruction by instruction, read from the Dockerfile itself: WORKDIR, the files each COPY names
(filtered by .dockerignore), each command of each RUN (the virtualenv, its pip install, the system user, the
folders and their owner), ENV, USER, VOLUME, HEALTHCHECK and ENTRYPOINT. Every absolute path of the image
lands under ``root``. A RUN command it does not know fails the replay, so a new build step cannot go
unchecked; the base image's system packages (apt-get) are taken as given and only listed.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import attrs
from dockerfile_parse import DockerfileParser

from tests.support.installed import give_to, run


class UnknownStep(AssertionError):
    """The Dockerfile does something the replay does not reproduce."""


@attrs.define
class Image:
    """What the replayed build left: the image's environment, user, volumes and commands, with every image
    path mapped under ``root``."""

    root: Path
    workdir: str = "/"
    env: dict[str, str] = attrs.Factory(dict)
    users: dict[str, tuple[int, str]] = attrs.Factory(dict)  # name -> (uid, home)
    user: str = "root"
    volumes: list[str] = attrs.Factory(list)
    exposed: list[int] = attrs.Factory(list)
    healthcheck: list[str] = attrs.Factory(list)
    entrypoint: list[str] = attrs.Factory(list)
    apt_packages: list[str] = attrs.Factory(list)
    copied: list[str] = attrs.Factory(list)

    def path(self, image_path: str) -> Path:
        """Where an image path lies here (relative paths start at the WORKDIR)."""
        full = PurePosixPath(self.workdir) / image_path
        return self.root / str(full).lstrip("/")

    @property
    def uid(self) -> int:
        return 0 if self.user in ("root", "0") else self.users[self.user][0]

    def home(self) -> Path:
        return self.path(self.users[self.user][1]) if self.user in self.users else self.path("/root")

    def run_env(self, base_path: str, **overrides: str) -> dict[str, str]:
        """The environment a container of this image starts with: its ENV (image paths mapped), HOME from
        its user, and ``overrides`` as ``docker run -e`` gives them."""
        env = {"HOME": str(self.home()), "LANG": "C.UTF-8"}
        for name, value in self.env.items():
            env[name] = self._mapped_value(name, value, base_path)
        env.update(overrides)
        return env

    def _mapped_value(self, name: str, value: str, base_path: str) -> str:
        if name == "PATH":
            parts = []
            for part in value.split(":"):
                if part == "$PATH":
                    parts.append(base_path)
                elif part.startswith("/"):
                    parts.append(str(self.path(part)))
                elif part:
                    parts.append(part)
            return ":".join(parts)
        return str(self.path(value)) if value.startswith("/") else value

    def which(self, command: str, env: dict[str, str]) -> str:
        """``command`` looked up on the container's PATH."""
        found = shutil.which(command, path=env["PATH"])
        if found is None:
            raise AssertionError(f"{command} is not on the image's PATH {env['PATH']}")
        return found


def _ignored(patterns: list[str]) -> Callable[[Path, str], bool]:
    """A .dockerignore test for a path relative to the build context."""

    def test(relative: Path, name: str) -> bool:
        path = str(relative / name) if str(relative) != "." else name
        for pattern in patterns:
            if fnmatch.fnmatch(path, pattern) or (
                pattern.startswith("**/") and fnmatch.fnmatch(name, pattern.removeprefix("**/"))
            ):
                return True
        return False

    return test


def _dockerignore(context: Path) -> list[str]:
    file = context / ".dockerignore"
    if not file.is_file():
        return []
    return [
        line.strip().rstrip("/")
        for line in file.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]


def _copy(image: Image, context: Path, value: str) -> None:
    parts = shlex.split(value)
    if any(p.startswith("--") for p in parts):
        raise UnknownStep(f"COPY {value}: options are not replayed")
    *sources, dest = parts
    ignored = _ignored(_dockerignore(context))
    target = image.path(dest)
    for source in sources:
        origin = context / source
        if not origin.exists():
            raise AssertionError(f"COPY {value}: {source} is not in the build context")
        image.copied.append(source)
        if origin.is_dir():
            into = target if len(sources) == 1 and not dest.endswith("/") else target / origin.name

            def skip(folder: str, names: list[str]) -> set[str]:
                relative = Path(folder).relative_to(context)
                return {n for n in names if ignored(relative, n)}

            shutil.copytree(origin, into, ignore=skip, dirs_exist_ok=True)
        else:
            into = target / origin.name if dest.endswith("/") or len(sources) > 1 else target
            into.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, into)


def _run(image: Image, value: str, python: str, base_path: str) -> None:
    for command in value.split("&&"):
        words = shlex.split(command)
        if not words:
            continue
        _run_one(image, words, python, base_path)


def _option(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


def _run_one(image: Image, words: list[str], python: str, base_path: str) -> None:
    program = words[0]
    if program == "apt-get":
        if words[1] == "install":
            image.apt_packages += [w for w in words[2:] if not w.startswith("-")]
        return
    if program == "rm" and all(w.startswith("/var/lib/apt") or w.startswith("-") for w in words[1:]):
        return
    if program == "python3" and words[1:3] == ["-m", "venv"] and len(words) == 4:
        run([python, "-m", "venv", str(image.path(words[3]))])
        return
    if program.endswith("/bin/pip") and words[1] == "install":
        env = image.run_env(base_path)
        env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONSTRAINT", "PIP_CERT"):
            if name in os.environ:
                env[name] = os.environ[name]
        run([str(image.path(program)), *words[1:]], cwd=image.path("."), env=env)
        return
    if program == "useradd":
        name = words[-1]
        image.users[name] = (int(_option(words, "--uid")), _option(words, "--home-dir"))
        return
    if program == "mkdir" and words[1] == "-p":
        for folder in words[2:]:
            image.path(folder).mkdir(parents=True, exist_ok=True)
        return
    if program == "chown" and len(words) == 3:
        uid = image.users[words[1]][0]
        give_to(image.path(words[2]), uid)
        return
    raise UnknownStep(f"RUN {' '.join(words)}: this build step is not replayed by {__name__}")


def replay(dockerfile: Path, root: Path, *, python: str, base_path: str) -> Image:
    """Replay the build of ``dockerfile`` (its folder is the build context) into ``root``; ``python`` plays
    the image's python3, ``base_path`` the base image's PATH."""
    parser = DockerfileParser(str(dockerfile))
    context = dockerfile.parent
    image = Image(root)
    for item in parser.structure:
        instruction, value = item["instruction"], item["value"]
        if instruction in ("COMMENT", "ARG", "FROM"):
            continue
        if instruction == "WORKDIR":
            image.workdir = str(PurePosixPath(image.workdir) / value)
            image.path(".").mkdir(parents=True, exist_ok=True)
        elif instruction == "COPY":
            _copy(image, context, value)
        elif instruction == "RUN":
            _run(image, value, python, base_path)
        elif instruction == "ENV":
            for word in shlex.split(value, posix=True) if "=" in value else []:
                name, _, setting = word.partition("=")
                image.env[name] = setting
        elif instruction == "USER":
            image.user = value.strip()
        elif instruction == "VOLUME":
            image.volumes += json.loads(value) if value.strip().startswith("[") else value.split()
        elif instruction == "EXPOSE":
            image.exposed += [int(p.split("/")[0]) for p in value.split()]
        elif instruction == "HEALTHCHECK":
            image.healthcheck = json.loads(value.split("CMD", 1)[1])
        elif instruction == "ENTRYPOINT":
            image.entrypoint = json.loads(value)
        else:
            raise UnknownStep(f"{instruction} {value}: not replayed by {__name__}")
    return image
