"""Settings for a command: one readable line per bad value, misspelt names, secrets masked."""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from dotenv import dotenv_values
from pydantic import ValidationError

from server.settings import Settings

PREFIX = "THREADLINE_"
ENV_FILE = ".env"
# THREADLINE_* variables read by something other than Settings: the demo agent, the client
# and examples, the test suite and the deployment files. They are never warned about.
OTHER_VARIABLES = frozenset(
    {"DEMO_DELAY_MS", "TOKEN", "URL", "PUBLISH_PORT", "UPDATE_DOCS_SCREENSHOT", "ENV_FILE"}
)
OTHER_PREFIXES = ("TEST_", "DOCKER_")
# Setting names whose whole value is a secret, and the password inside any URL.
_SECRET_NAME = re.compile(r"(token|secret|password|key)$")
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@\s]*:)[^@/\s]+(?P<tail>@)", re.I)
MASK = "***"


class BadSettings(Exception):
    """Settings that failed validation: `lines` says what is wrong, one problem per line."""

    def __init__(self, lines: list[str], warnings: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines
        self.warnings = warnings  # unknown names: often why a value is wrong or missing


def env_file() -> Path | None:
    """The optional dotenv file: THREADLINE_ENV_FILE, else `.env` in the working directory."""
    path = Path(os.environ.get(PREFIX + "ENV_FILE", ENV_FILE))
    return path if path.is_file() else None


def _file_values(path: Path | None) -> dict[str, str]:
    if path is None:
        return {}
    return {k: v for k, v in dotenv_values(path).items() if k.startswith(PREFIX) and v is not None}


def known_names() -> list[str]:
    return [PREFIX + name.upper() for name in Settings.model_fields]


def unknown_variables(environ: Mapping[str, str]) -> Iterator[str]:
    """A warning per THREADLINE_* name that no setting reads, with the nearest known name."""
    known = known_names()
    for name in sorted(environ):
        rest = name.removeprefix(PREFIX)
        if not name.startswith(PREFIX) or name in known:
            continue
        if rest in OTHER_VARIABLES or rest.startswith(OTHER_PREFIXES):
            continue
        nearest = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"; did you mean {nearest[0]}?" if nearest else ""
        yield f"unknown setting {name} is ignored{hint}"


def _problem(error: Any, values: Mapping[str, str]) -> str:
    field = str(error["loc"][0]) if error.get("loc") else "?"
    variable = PREFIX + field.upper()
    given = values.get(variable)
    shown = f"={mask(field, given)!s}" if given is not None else ""
    return f"{variable}{shown}: {error['msg']}"


def load_settings(**overrides: Any) -> tuple[Settings, list[str]]:
    """The effective settings (`overrides`, then the environment, then the dotenv file, then
    defaults) and the warnings about them; BadSettings when a value is invalid."""
    path = env_file()
    from_file = _file_values(path)
    # The environment wins over the file, as pydantic-settings orders its sources.
    values = {**from_file, **{k: v for k, v in os.environ.items() if k.startswith(PREFIX)}}
    warnings = list(unknown_variables(values))
    try:
        settings = Settings(_env_file=path, **overrides)
    except ValidationError as exc:
        problems = [_problem(error, values) for error in exc.errors()]
        raise BadSettings(problems, warnings) from None
    return settings, warnings


def mask(field: str, value: Any) -> Any:
    """`value` with secrets hidden: a secret-named field's whole value, a URL's password."""
    if value is None or value == "":
        return value
    if _SECRET_NAME.search(field) and isinstance(value, str):
        return MASK
    if isinstance(value, str):
        return _URL_PASSWORD.sub(rf"\g<head>{MASK}\g<tail>", value)
    return value


def effective(settings: Settings) -> list[tuple[str, Any]]:
    """(variable name, masked value) of every setting, in declaration order."""
    dumped = settings.model_dump(mode="json")
    return [(PREFIX + name.upper(), mask(name, dumped[name])) for name in Settings.model_fields]
