"""The user's processor: their own directory of code, its requirements, settings, secrets and grants.

``Processor(directory="processor", handler="orders.process", ...)`` is handed to ``Breakwater``; the
live, sideline and FIFO workers run it under the contract of :mod:`breakwater.processor`. At synth,
the directory is bundled without Docker: copied, with its ``requirements.txt`` installed by pip for
Lambda's platform (``--platform manylinux2014_<arch> --only-binary=:all:``, so a dependency must
publish a wheel for it; pure-Python ones always do), and the workers' handlers added beside it.
"""

from __future__ import annotations

import hashlib
import keyword
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import jsii
from aws_cdk import AssetHashType, BundlingOptions, DockerImage, ILocalBundling
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_ssm as ssm

from breakwater_cdk.assets import HANDLERS, PY_EXCLUDE, VERSION
from breakwater_cdk.config import ConfigError

Grant = Callable[[iam.IGrantable], Any]
Secret = ssm.IParameter | secretsmanager.ISecret
WORKER_HANDLERS = ("worker", "fifo_worker")  # the handlers that run the processor, bundled with it
_PLATFORMS = {"arm64": "manylinux2014_aarch64", "x86_64": "manylinux2014_x86_64"}
_ENV_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
# Names the workers' own settings, Lambda or Powertools use: a processor's variable may not shadow them.
_RESERVED_PREFIXES = ("AWS_", "LAMBDA_", "POWERTOOLS_", "BREAKWATER_", "_")


@dataclass(frozen=True)
class Processor:
    """What the workers run for each admitted message.

    ``directory``: the processor's code (and an optional ``requirements.txt``); ``handler``:
    ``module.function`` inside it (``process(envelope, work) -> dict``); ``environment``: variables
    the workers get; ``secrets``: variable name -> SSM parameter or Secrets Manager secret, the
    variable holding its name (parameter) or ARN (secret), read granted; ``grants``: a callable, or
    a list of them, called with each worker's role (``table.grant_read_write_data``, ...).
    """

    directory: str | Path
    handler: str = "processor.process"
    environment: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, Secret] = field(default_factory=dict)
    grants: Grant | Sequence[Grant] = ()
    requirements: str = "requirements.txt"

    def __post_init__(self) -> None:
        directory = Path(self.directory)
        if not directory.is_dir():
            raise ConfigError(f"processor.directory = {str(self.directory)!r} is not a directory")
        module, _, function = self.handler.rpartition(".")
        parts = module.split(".") if module else []
        if not parts or not all(
            part.isidentifier() and not keyword.iskeyword(part) for part in [*parts, function]
        ):
            raise ConfigError(f"processor.handler = {self.handler!r} is not 'module.function'")
        path = directory.joinpath(*parts)
        if not path.with_suffix(".py").is_file() and not (path / "__init__.py").is_file():
            raise ConfigError(
                f"processor.handler = {self.handler!r}: no module {module!r} in {str(self.directory)!r}"
            )
        if parts[0] in {"breakwater", *WORKER_HANDLERS}:
            raise ConfigError(
                f"processor.handler = {self.handler!r}: the module {parts[0]!r} is the runtime library's"
            )
        for name in [*self.environment, *self.secrets]:
            if not _ENV_NAME.match(name) or name.upper().startswith(_RESERVED_PREFIXES):
                raise ConfigError(
                    f"processor.environment {name!r} is not a variable name a processor may set "
                    f"(letters, digits, '_'; not starting with {', '.join(_RESERVED_PREFIXES)})"
                )
        shared = sorted(set(self.environment) & set(self.secrets))
        if shared:
            raise ConfigError(f"processor.secrets {shared} are in processor.environment too")

    @property
    def all_grants(self) -> list[Grant]:
        return [self.grants] if callable(self.grants) else list(self.grants)

    def variables(self) -> dict[str, str]:
        """The workers' variables for the processor: its environment and its secrets' references."""
        values = dict(self.environment)
        for name, secret in self.secrets.items():
            # jsii interfaces are protocols isinstance cannot check: an SSM parameter has a name
            parameter_name = getattr(secret, "parameter_name", None)
            values[name] = str(parameter_name) if parameter_name is not None else _secret_arn(secret)
        return values

    def grant(self, grantee: iam.IGrantable) -> None:
        """Read on each secret, then the user's grants."""
        for secret in self.secrets.values():
            secret.grant_read(grantee)
        for grant in self.all_grants:
            grant(grantee)

    def code(self, *, runtime: str, architecture: str) -> lambda_.Code:
        """The workers' asset: the processor, its requirements for Lambda's platform, the handlers."""
        bundling = PipBundling(
            directory=Path(self.directory),
            requirements=self.requirements,
            platform=_PLATFORMS[architecture],
            python_version=runtime.removeprefix("python"),
        )
        return lambda_.Code.from_asset(
            str(self.directory),
            asset_hash_type=AssetHashType.CUSTOM,
            asset_hash=bundling.fingerprint(),
            bundling=BundlingOptions(
                # Never pulled: local bundling always succeeds or raises.
                image=DockerImage.from_registry("public.ecr.aws/sam/build-python3.13"),
                local=bundling,
            ),
        )


def _secret_arn(secret: Secret) -> str:
    """A Secrets Manager secret's ARN (what has no parameter name is one)."""
    return str(cast(secretsmanager.ISecret, secret).secret_arn)


@jsii.implements(ILocalBundling)
class PipBundling:
    """Copy the processor and the workers' handlers, pip-install its requirements for Lambda: no Docker."""

    def __init__(self, *, directory: Path, requirements: str, platform: str, python_version: str) -> None:
        self.directory = directory
        self.requirements = directory / requirements
        self.platform = platform
        self.python_version = python_version

    def fingerprint(self) -> str:
        """Changes with the processor's files, the handlers, the platform and the package's version."""
        digest = hashlib.sha256(f"{VERSION}|{self.platform}|{self.python_version}".encode())
        for root in (self.directory, *(HANDLERS / name for name in WORKER_HANDLERS)):
            for path in sorted(root.rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts:
                    digest.update(str(path.relative_to(root)).encode())
                    digest.update(path.read_bytes())
        return digest.hexdigest()

    def try_bundle(self, output_dir: str, *_: Any, **__: Any) -> bool:
        output = Path(output_dir)
        shutil.copytree(self.directory, output, dirs_exist_ok=True, ignore=PY_EXCLUDE)
        for name in WORKER_HANDLERS:
            shutil.copytree(HANDLERS / name, output / name, dirs_exist_ok=True, ignore=PY_EXCLUDE)
        if self.requirements.is_file():
            self.install(output)
        return True

    def install(self, output: Path) -> None:
        command = [
            sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
            "--requirement", str(self.requirements), "--target", str(output),
            "--platform", self.platform, "--implementation", "cp",
            "--python-version", self.python_version, "--only-binary=:all:", "--no-compile",
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, check=False)  # noqa: S603
        if result.returncode != 0:
            raise ConfigError(
                f"processor requirements {str(self.requirements)!r} did not install for Lambda "
                f"({self.platform}, Python {self.python_version}): {result.stderr.strip()[-2000:]}"
            )
