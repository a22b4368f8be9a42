"""examples/orders from the wheel alone: built, installed apart, synthesized without the repository on the
path, then run on the embedded AWS with its inventory service stubbed on 127.0.0.1 (the emulator's
``breakwater_local.processor_environment`` hook: the stack keeps the real URL).

Needs PyPI: the wheel's build backend, and the processor's own requirement (httpx) for Lambda's platform.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from breakwater.envelope import Envelope, new_envelope_id
from local.emulator.assembly import CloudAssembly
from local.emulator.runtime import LocalRuntime, RuntimeOptions
from tests.polling import wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "orders"
STOCK = {"widget": 10, "gizmo": 0}
PACKAGE_SOURCES = ("pyproject.toml", "README.md", "breakwater_cdk", "functions", "glue_jobs")


class _Inventory(BaseHTTPRequestHandler):
    asked: list[str] = []

    def do_GET(self) -> None:
        sku = self.path.rsplit("/", 1)[-1]
        _Inventory.asked.append(sku)
        body = json.dumps({"sku": sku, "available": STOCK.get(sku, 0)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture(scope="module")
def inventory() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Inventory)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600, **kwargs)  # noqa: S603
    assert result.returncode == 0, f"{command[:4]}: {result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel (built from a copy of the package's sources), installed alone into a directory."""
    source = tmp_path_factory.mktemp("package-source")
    for name in PACKAGE_SOURCES:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, source / name)
    dist, site = source / "dist", tmp_path_factory.mktemp("site")
    _run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(dist), str(source)]
    )
    (wheel,) = dist.glob("breakwater_cdk-*.whl")
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(wheel)])
    return site


def _example_env(site: Path, **extra: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    return {**env, "PYTHONPATH": str(site), "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20", **extra}


@pytest.fixture(scope="module")
def assembly(site: Path, tmp_path_factory: pytest.TempPathFactory) -> CloudAssembly:
    outdir = tmp_path_factory.mktemp("orders-cdk-out")
    _run([sys.executable, "app.py"], cwd=EXAMPLE, env=_example_env(site, CDK_OUTDIR=str(outdir)))
    template = json.loads((outdir / "Orders-dev.template.json").read_text(encoding="utf-8"))
    return CloudAssembly(directory=outdir, stack_name="Orders-dev", template=template)


def test_the_example_imports_breakwater_from_the_wheel_only(site: Path) -> None:
    probe = "import breakwater, breakwater_cdk; print(breakwater.__file__); print(breakwater_cdk.__file__)"
    found = _run([sys.executable, "-c", probe], cwd=EXAMPLE, env=_example_env(site)).stdout.split()
    assert found and all(path.startswith(str(site)) for path in found), found


def test_the_example_synthesizes_its_processor_with_its_dependency(assembly: CloudAssembly) -> None:
    workers = [
        resource
        for resource in assembly.resources("AWS::Lambda::Function").values()
        if resource["Properties"]["Environment"]["Variables"].get("PROCESSOR_HANDLER") == "orders.process"
    ]
    assert len(workers) == 2  # live and sideline (the example has no ordered workload)
    variables = workers[0]["Properties"]["Environment"]["Variables"]
    assert variables["INVENTORY_URL"] == "https://inventory.example.com"  # cdk.json's: no local stub deployed
    assert "BREAKWATER_LOCAL_WORK_MS" not in variables and "SIMULATED_WORK_MS" not in variables
    code = workers[0]["Properties"]["Code"]["S3Key"].removesuffix(".zip")
    bundle = assembly.directory / f"asset.{code}"
    assert (bundle / "orders.py").is_file() and (bundle / "httpx" / "__init__.py").is_file()


def test_the_example_runs_on_the_embedded_aws(
    assembly: CloudAssembly, inventory: str, tmp_path: Path
) -> None:
    options = RuntimeOptions(workdir=tmp_path / "runtime", start_api=False, start_schedules=False)
    # The processor alone (no simulated work), calling the stub instead of the real inventory.
    local = {"work_ms": 0, "processor_environment": {"INVENTORY_URL": inventory}}
    with LocalRuntime(context={"breakwater_local": local}, options=options, assembly=assembly) as runtime:
        assert runtime.deployment is not None
        outputs = runtime.deployment.outputs
        sqs, dynamodb = (
            runtime.aws.client("sqs", counted=False),
            runtime.aws.client("dynamodb", counted=False),
        )
        orders = {f"o-{index}": ("widget" if index % 2 else "gizmo") for index in range(6)}
        for order_id, sku in orders.items():
            envelope = Envelope(
                id=new_envelope_id(),
                tenant="acme",
                type="order.placed",
                payload={"order_id": order_id, "sku": sku, "quantity": 2},
                enqueued_at=int(time.time() * 1000),
            )
            sqs.send_message(QueueUrl=outputs["IntakeLive0QueueUrl"], MessageBody=envelope.to_json())

        table = outputs["OrdersTableName"]

        def written() -> list[dict[str, Any]]:
            return list(dynamodb.scan(TableName=table)["Items"])

        assert wait_for(lambda: len(written()) == len(orders), timeout=90), written()
        status = {item["order_id"]["S"]: item["status"]["S"] for item in written()}
    assert status == {
        order_id: "accepted" if sku == "widget" else "backordered" for order_id, sku in orders.items()
    }
    assert sorted(set(_Inventory.asked)) == ["gizmo", "widget"]
