"""Static checks of the Dockerfile, .dockerignore and constraints.txt.

No Docker engine runs here, so the Dockerfile is parsed and its properties
asserted: pinned base image, non-root user, an entry point that exists,
sources present in the build context, pip installs bound to the constraints
file, the images holding vmsched's wheel (built in a stage of its own) and
never the source tree. constraints.txt is checked against vmsched's real dependency closure.

Run ``python tests/deploy/test_dockerfile.py --write-constraints`` to
regenerate constraints.txt from the installed environment.
"""

from __future__ import annotations

import fnmatch
import importlib
import json
import re
import shlex
import sys
import tomllib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

#: The repository (this file also runs as a script: --write-constraints)
ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
CONSTRAINTS = ROOT / "constraints.txt"
PYPROJECT = ROOT / "pyproject.toml"

#: Extras whose closure constraints.txt must pin (runtime is always included).
PINNED_EXTRAS = ("agent", "test")


# --- a small Dockerfile parser ----------------------------------------------
@dataclass
class Instruction:
    keyword: str
    args: str


@dataclass
class Stage:
    image: str  # after ARG substitution
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def _logical_lines(text: str) -> list[str]:
    lines: list[str] = []
    buf = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") and not buf:
            continue
        if stripped.startswith("#"):  # comment inside a continuation
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        if buf.strip():
            lines.append(buf.strip())
        buf = ""
    if buf.strip():
        lines.append(buf.strip())
    return lines


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in _logical_lines(text):
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        args = args.strip()
        if keyword == "FROM":
            words = [w for w in args.split() if not w.startswith("--")]
            image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: global_args[m.group(1) or m.group(2)], words[0])
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(image=image, name=name))
        elif not stages:
            assert keyword == "ARG", f"only ARG may precede the first FROM, found {keyword}"
            key, _, value = args.partition("=")
            global_args[key] = value
        else:
            stages[-1].instructions.append(Instruction(keyword, args))
    return global_args, stages


@pytest.fixture(scope="module")
def stages() -> dict[str, Stage]:
    _, parsed = parse_dockerfile(DOCKERFILE.read_text())
    named = {s.name: s for s in parsed if s.name}
    assert len(named) == len(parsed), "every stage should be named"
    return named


def _lineage(stage: Stage, stages: dict[str, Stage]) -> list[Stage]:
    """The stage and the stages it is built FROM, nearest first."""
    out = [stage]
    while out[-1].image in stages:
        out.append(stages[out[-1].image])
    return out


def _exec_form(instr: Instruction) -> list[str]:
    value = json.loads(instr.args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), instr.args
    return value


# --- base image --------------------------------------------------------------
def test_base_images_are_pinned(stages: dict[str, Stage]) -> None:
    external = {s.image for s in stages.values() if s.image not in stages}
    assert external, "no external base image found"
    for image in external:
        if "@sha256:" in image:
            assert re.search(r"@sha256:[0-9a-f]{64}$", image), image
            continue
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest", f"{image}: base image must carry an explicit tag"
        # a full version (3.11.13), not a moving one (3.11, 3, slim)
        assert re.match(r"^\d+\.\d+\.\d+(-[a-z0-9.-]+)?$", tag), f"{image}: tag {tag!r} is not a pinned version"
        assert "slim" in tag, f"{image}: expected a slim Python base"
        assert repo.endswith("python"), image
        assert tag.startswith("3.11."), f"{image}: vmsched targets Python 3.11"


def test_multi_stage_with_service_default_and_agent_target(stages: dict[str, Stage]) -> None:
    _, parsed = parse_dockerfile(DOCKERFILE.read_text())
    assert parsed[-1].name == "service", "the default (last) target must be the service image"
    assert "agent" in stages
    # final images are assembled from a builder: no compiler in them
    for target in ("service", "agent"):
        stage = stages[target]
        assert stage.all("COPY") and all("--from=" in c.args for c in stage.all("COPY")), target
        for run in (i for s in _lineage(stage, stages) for i in s.all("RUN")):
            assert not re.search(r"\b(gcc|libvirt-dev|build-essential)\b", run.args), (target, run.args)


# --- user --------------------------------------------------------------------
def _final_user(stage: Stage, stages: dict[str, Stage]) -> str | None:
    for s in _lineage(stage, stages):
        users = s.all("USER")
        if users:
            return users[-1].args
    return None


@pytest.mark.parametrize("target", ["service", "agent"])
def test_runs_as_non_root_numeric_user(stages: dict[str, Stage], target: str) -> None:
    user = _final_user(stages[target], stages)
    assert user is not None, f"{target}: no USER (would run as root)"
    uid, _, gid = user.partition(":")
    # numeric, so Kubernetes' runAsNonRoot can verify it without /etc/passwd
    assert uid.isdigit() and int(uid) != 0, f"{target}: USER {user!r} must be a non-zero numeric uid"
    assert not gid or (gid.isdigit() and int(gid) != 0), user
    # ... and that uid really exists in the image
    runs = " ".join(i.args for s in _lineage(stages[target], stages) for i in s.all("RUN"))
    assert re.search(rf"useradd\b[^&;]*--uid {uid}\b", runs), f"{target}: uid {uid} is never created"


# --- entry point -------------------------------------------------------------
def _entrypoint(stage: Stage, stages: dict[str, Stage]) -> list[str]:
    for s in _lineage(stage, stages):
        eps = s.all("ENTRYPOINT")
        if eps:
            return _exec_form(eps[-1])
    raise AssertionError(f"stage {stage.name} has no ENTRYPOINT")


@pytest.mark.parametrize("target", ["service", "agent"])
def test_entrypoint_is_the_vmsched_console_script(stages: dict[str, Stage], target: str) -> None:
    ep = _entrypoint(stages[target], stages)
    assert "vmsched" in ep, ep
    assert ep[-1] == "vmsched", f"{ep}: the command (CMD / container args) must follow `vmsched`"
    scripts = tomllib.loads(PYPROJECT.read_text())["project"]["scripts"]
    assert "vmsched" in scripts, "pyproject.toml declares no `vmsched` console script"
    # the console script's target really exists
    module, _, attr = scripts["vmsched"].partition(":")
    assert callable(getattr(importlib.import_module(module), attr))
    # and the image puts the virtualenv (where pip installs the script) on PATH
    env = " ".join(i.args for s in _lineage(stages[target], stages) for i in s.all("ENV"))
    assert "PATH=/opt/vmsched/bin:" in env
    cmd = stages[target].all("CMD")
    assert cmd, f"{target}: no default CMD"
    sub = _exec_form(cmd[-1])[0]
    assert sub in {"run", "agent"}, sub


def test_agent_image_installs_libvirt_python(stages: dict[str, Stage]) -> None:
    agent_runs = " ".join(i.args for s in _lineage(stages["agent"], stages) for i in s.all("RUN"))
    assert "libvirt0" in agent_runs, "agent image needs the libvirt client library at run time"
    builder = next(c for c in stages["agent"].all("COPY") if "--from=" in c.args)
    src_stage = stages[re.search(r"--from=(\S+)", builder.args).group(1)]
    builder_runs = " ".join(i.args for s in _lineage(src_stage, stages) for i in s.all("RUN"))
    assert re.search(r"pip install[^&;]*libvirt-python", builder_runs)
    service_runs = " ".join(
        i.args
        for s in _lineage(stages[re.search(r"--from=(\S+)", stages["service"].all("COPY")[0].args).group(1)], stages)
        for i in s.all("RUN")
    )
    assert "libvirt" not in service_runs, "the service image must not carry libvirt"


# --- build context -----------------------------------------------------------
def _dockerignore() -> list[tuple[bool, str]]:
    rules = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        rules.append((negate, line.lstrip("!").strip("/")))
    return rules


def _ignored(path: str, rules: list[tuple[bool, str]]) -> bool:
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for negate, pattern in rules:
        regex = fnmatch.translate(pattern).replace(".*", "[^/]*").replace("[^/]*[^/]*", ".*")
        if pattern.startswith("**/"):
            hit = any(fnmatch.fnmatch(c.split("/")[-1], pattern[3:]) for c in candidates)
        else:
            hit = any(re.match(regex, c) for c in candidates)
        if hit:
            ignored = not negate
    return ignored


def test_copied_sources_exist_and_are_in_the_build_context(stages: dict[str, Stage]) -> None:
    rules = _dockerignore()
    copied: list[str] = []
    for stage in stages.values():
        for copy in stage.all("COPY"):
            if "--from=" in copy.args:
                continue
            words = [w for w in shlex.split(copy.args) if not w.startswith("--")]
            copied += words[:-1]
    assert copied
    for src in copied:
        assert (ROOT / src).exists(), f"COPY {src}: no such file in the repository"
        assert not _ignored(src, rules), f"COPY {src}: excluded by .dockerignore"
    for secret in (".env", ".git", ".venv", "deploy/vmsched.env"):
        assert _ignored(secret, rules), f"{secret} must stay out of the build context"


def test_every_pip_install_is_constrained(stages: dict[str, Stage]) -> None:
    installs = [
        cmd
        for stage in stages.values()
        for run in stage.all("RUN")
        for cmd in re.split(r"&&|;", run.args)
        if re.search(r"\bpip install\b", cmd)
    ]
    assert installs
    for cmd in installs:
        assert "-c constraints.txt" in cmd, f"unconstrained pip install: {cmd.strip()}"
    copied = " ".join(c.args for s in stages.values() for c in s.all("COPY"))
    assert "constraints.txt" in copied


# --- the wheel -----------------------------------------------------------------
#: pip options that take a value (the value is not a thing to install).
_PIP_VALUE_OPTIONS = {"-c", "--constraint", "-r", "--requirement", "-w", "--wheel-dir", "-t", "--target",
                      "-i", "--index-url", "--extra-index-url", "-f", "--find-links", "--prefix", "--root"}


def _pip_commands(stage: Stage, verb: str) -> list[list[str]]:
    """The words after ``pip VERB`` of each such command in the stage's RUN instructions."""
    out = []
    for run in stage.all("RUN"):
        lexer = shlex.shlex(run.args, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
        # simple commands, cut at control operators; a redirection ends a command's words
        commands: list[list[str]] = [[]]
        for token in tokens:
            if token in ("&&", "||", ";", "|", "&"):
                commands.append([])
            else:
                commands[-1].append(token)
        for words in commands:
            words = words[:next((i for i, w in enumerate(words) if w[0] in "<>"), len(words))]
            for i, word in enumerate(words[:-1]):
                if re.fullmatch(r"(\S*/)?pip3?", word) and words[i + 1] == verb:
                    out.append(words[i + 2:])
    return out


def _operands(words: list[str]) -> list[str]:
    """What a pip command installs or builds: its words that are neither options nor their values."""
    out, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in _PIP_VALUE_OPTIONS:
            skip = True
        elif not word.startswith("-"):
            out.append(word)
    return out


def _wheel_dirs(stage: Stage) -> list[str]:
    """The folders the stage builds wheels into (``pip wheel --wheel-dir DIR``)."""
    dirs = []
    for words in _pip_commands(stage, "wheel"):
        for i, word in enumerate(words[:-1]):
            if word in ("-w", "--wheel-dir"):
                dirs.append(words[i + 1].rstrip("/"))
    return dirs


def _copies_from(stage: Stage) -> list[tuple[str, str, str]]:
    """(stage, source, destination) of each ``COPY --from=stage``."""
    out = []
    for copy in stage.all("COPY"):
        m = re.search(r"--from=(\S+)", copy.args)
        if m:
            src, dest = [w for w in shlex.split(copy.args) if not w.startswith("--")]
            out.append((m.group(1), src.rstrip("/"), dest.rstrip("/")))
    return out


@pytest.mark.parametrize("target", ["service", "agent"])
def test_images_install_the_built_wheel_not_the_source_tree(stages: dict[str, Stage], target: str) -> None:
    # the image holds only the virtualenv its builder made: no sources, no wheel folder
    copies = _copies_from(stages[target])
    assert [(src, dest) for _, src, dest in copies] == [("/opt/vmsched", "/opt/vmsched")], copies
    builder = _lineage(stages[copies[0][0]], stages)
    installs = [words for s in builder for words in _pip_commands(s, "install")]
    assert installs, f"{target}: its builder installs nothing"
    for words in installs:
        assert "-e" not in words and "--editable" not in words, words
        for operand in _operands(words):
            # a requirement by name, or a wheel: never a folder (".", "/src") of sources
            assert operand.endswith(".whl") or re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?(\[[\w,-]+\])?", operand), (
                f"{target}: pip install {operand}: install the built wheel, not a source tree")
    wheels = [(words, op) for words in installs for op in _operands(words) if op.endswith(".whl")]
    assert len(wheels) == 1, f"{target}: vmsched's wheel should be installed once: {wheels}"
    words, wheel = wheels[0]
    assert re.fullmatch(r"\S+/vmsched-[^/]*\.whl", wheel), wheel
    assert "-c" in words and words[words.index("-c") + 1] == "constraints.txt", words
    # ... a wheel that another stage built and this builder copied in
    folder = wheel.rsplit("/", 1)[0]
    made = [(name, src) for s in builder for name, src, dest in _copies_from(s) if dest == folder]
    assert len(made) == 1, f"{target}: nothing copies a wheel into {folder}"
    name, src = made[0]
    assert name in stages and src in _wheel_dirs(stages[name]), f"stage {name} builds no wheel into {src}"


def test_only_the_wheel_stage_holds_the_sources(stages: dict[str, Stage]) -> None:
    sources = {"vmsched", "gateway", "services", "plugins"}
    holders = set()
    for stage in stages.values():
        for copy in stage.all("COPY"):
            words = [w for w in shlex.split(copy.args) if not w.startswith("--")]
            if "--from=" not in copy.args and sources & {w.strip("./") for w in words[:-1]}:
                holders.add(stage.name)
    assert holders and all(_wheel_dirs(stages[h]) for h in holders), holders
    assert not holders & {s.name for t in ("service", "agent") for s in _lineage(stages[t], stages)}


# --- constraints.txt -----------------------------------------------------------
def dependency_closure(extras: tuple[str, ...]) -> dict[str, tuple[str, list[Requirement]]]:
    """canonical name -> (installed version, requirements that pulled it in)."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    roots = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        roots += [Requirement(r) for r in project["optional-dependencies"][extra]]
    pulled: dict[str, list[Requirement]] = {}
    extras_of: dict[str, set[str]] = {}
    stack = list(roots)
    while stack:
        req = stack.pop()
        name = canonicalize_name(req.name)
        known = name in extras_of
        new_extras = set(req.extras) - extras_of.get(name, set())
        pulled.setdefault(name, []).append(req)
        if known and not new_extras:
            continue
        extras_of.setdefault(name, set()).update(req.extras)
        dist = metadata.distribution(req.name)
        for spec in dist.requires or []:
            dep = Requirement(spec)
            envs = [{"extra": e} for e in (extras_of[name] or {""})]
            if dep.marker is None or any(dep.marker.evaluate(env) for env in envs):
                stack.append(dep)
    return {n: (metadata.version(n), reqs) for n, reqs in pulled.items()}


def read_constraints() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9._-]+)==([A-Za-z0-9.+!-]+)", line)
        assert m, f"constraints.txt: {line!r} is not an exact `name==version` pin"
        name = canonicalize_name(m.group(1))
        assert name not in pins, f"constraints.txt pins {name} twice"
        pins[name] = m.group(2)
    return pins


def test_constraints_pin_the_whole_dependency_closure() -> None:
    pins = read_constraints()
    closure = dependency_closure(PINNED_EXTRAS)
    missing = sorted(set(closure) - set(pins))
    assert not missing, f"unpinned dependencies: {missing} (regenerate constraints.txt)"
    for name, (_, reqs) in closure.items():
        for req in reqs:
            assert Version(pins[name]) in req.specifier, f"{name}=={pins[name]} violates {req}"
    # nothing outside the closure (stale pins hide removed dependencies)
    extra = sorted(set(pins) - set(closure))
    assert not extra, f"constraints.txt pins packages vmsched does not depend on: {extra}"


def render_constraints() -> str:
    sections = [("runtime", ()), *[(e, (e,)) for e in PINNED_EXTRAS]]
    header = CONSTRAINTS.read_text().split("\n\n", 1)[0] if CONSTRAINTS.exists() else "# constraints"
    out = [header, ""]
    done: set[str] = set()
    for label, extras in sections:
        closure = dependency_closure(extras)
        new = sorted(set(closure) - done)
        if not new:
            continue
        out.append(f"# --- {label} ---" if label == "runtime" else f"# --- [{label}] extra ---")
        out += [f"{metadata.distribution(n).metadata['Name']}=={closure[n][0]}" for n in new]
        out.append("")
        done |= set(new)
    return "\n".join(out)


if __name__ == "__main__":
    if sys.argv[1:] == ["--write-constraints"]:
        CONSTRAINTS.write_text(render_constraints())
        print(f"wrote {CONSTRAINTS}")
    else:
        sys.exit(pytest.main([__file__, "-q"]))
