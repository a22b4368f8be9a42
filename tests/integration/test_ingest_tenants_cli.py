"""bin/tenants against moto: the key it prints once is the key the authorizer accepts."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path

import pytest

from tests.integration.apigateway import ApiGateway

CLI = Path(__file__).resolve().parents[2] / "bin" / "tenants_cli.py"


@pytest.fixture
def cli():
    loader = importlib.machinery.SourceFileLoader("bin_tenants", str(CLI))
    spec = importlib.util.spec_from_loader("bin_tenants", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def run(cli, capsys, tenants_table, *args):
    code = cli.main([*args, "--table", tenants_table])
    out, err = capsys.readouterr()
    return code, out.strip(), err


def test_add_rotate_disable_enable_list(cli, capsys, tenants_table, api: ApiGateway, clock):
    code, key, err = run(cli, capsys, tenants_table, "add", "acme", "--tier", "premium")
    assert code == 0 and key.startswith("acme.") and "once" in err
    assert api.request(key, {"type": "t"}).status == 202

    code, _, err = run(cli, capsys, tenants_table, "add", "acme")
    assert code == 1 and "already exists" in err

    code, new_key, _ = run(cli, capsys, tenants_table, "rotate", "acme", "--overlap-seconds", "600")
    assert code == 0 and new_key != key
    clock.advance(6)
    assert api.request(new_key, {"type": "t"}).status == 202
    assert (
        api.request(key, {"type": "t"}).status == 202
    )  # the overlap uses wall time in the CLI: 600 s from now

    assert run(cli, capsys, tenants_table, "set-limits", "acme", "rate=3", "burst=4")[0] == 0
    assert run(cli, capsys, tenants_table, "disable", "acme")[0] == 0
    code, listing, _ = run(cli, capsys, tenants_table, "list")
    assert listing == "acme\tpremium\tdisabled rotating\tburst=4,rate=3"

    clock.advance(61)
    assert api.request(new_key, {"type": "t"}).status == 403
    assert run(cli, capsys, tenants_table, "enable", "acme")[0] == 0
    clock.advance(61)
    assert api.request(new_key, {"type": "t"}).status == 202


def test_errors_are_reported_not_raised(cli, capsys, tenants_table):
    assert run(cli, capsys, tenants_table, "rotate", "nobody")[0] == 1
    assert run(cli, capsys, tenants_table, "set-limits", "nobody", "rate=1")[0] == 1
    with pytest.raises(SystemExit, match=r"not in cdk\.json"):
        cli.main(["add", "acme", "--tier", "gold", "--table", tenants_table])
    with pytest.raises(SystemExit, match="must be a number"):
        cli.main(["set-limits", "acme", "rate=fast", "--table", tenants_table])
