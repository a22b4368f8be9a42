"""The DynamoDB tables refuse plain HTTP, and each function gets only the item actions its adapters use."""

from __future__ import annotations

from typing import Any

from tests.infrastructure.conftest import Synth
from tests.infrastructure.test_foundation import _as_list, _env, _statements


def _grants_on(synth: Synth, role: Any, table: Any) -> set[str]:
    """The actions a role's policies allow on one table (its ARN, or anything under it)."""
    role_id, table_id = synth.logical_id(role), synth.logical_id(table)
    actions: set[str] = set()
    for policy in synth.of_type("AWS::IAM::Policy").values():
        if {"Ref": role_id} not in policy["Properties"]["Roles"]:
            continue
        for statement in _statements(policy):
            if table_id in str(statement.get("Resource")):
                actions.update(_as_list(statement["Action"]))
    return actions


def test_every_table_denies_requests_that_are_not_over_tls(synth: Synth) -> None:
    tables = synth.of_type("AWS::DynamoDB::Table")
    assert len(tables) >= 3
    for name, table in tables.items():
        statements = table["Properties"]["ResourcePolicy"]["PolicyDocument"]["Statement"]
        assert {
            "Sid": "DenyPlainHttp",
            "Effect": "Deny",
            "Principal": {"AWS": "*"},
            "Action": "dynamodb:*",
            "Resource": "*",
            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
        } in statements, name


def test_the_front_door_only_updates_buckets_and_tallies(synth: Synth) -> None:
    state = synth.breakwater.tables.state
    assert _grants_on(synth, synth.breakwater.ingest.role, state) == {
        "dynamodb:UpdateItem",
        "dynamodb:ConditionCheckItem",
    }
    assert synth.breakwater.streaming is not None
    assert _grants_on(synth, synth.breakwater.streaming.events.role, state) == {"dynamodb:UpdateItem"}


def test_the_front_door_claims_idempotency_keys_and_the_workers_share_the_window(synth: Synth) -> None:
    keys = synth.breakwater.tables.idempotency
    assert _grants_on(synth, synth.breakwater.ingest.role, keys) == {
        "dynamodb:PutItem",
        "dynamodb:GetItem",
        "dynamodb:UpdateItem",
        "dynamodb:DeleteItem",
    }
    ingest, worker = _env(synth, synth.breakwater.ingest), _env(synth, synth.breakwater.consumers.live_worker)
    assert ingest["IDEMPOTENCY_TABLE_NAME"] == {"Ref": synth.logical_id(keys)}
    window = str(synth.config.ingest.idempotency_window_seconds)
    assert ingest["IDEMPOTENCY_WINDOW_SECONDS"] == worker["IDEMPOTENCY_TTL_SECONDS"] == window


def test_nobody_scans_or_deletes_state(synth: Synth) -> None:
    state = synth.breakwater.tables.state
    roles = {
        "worker": synth.breakwater.consumers.live_worker.role,
        "sideline": synth.breakwater.consumers.sideline_worker.role,
        "controller": synth.breakwater.control.controller.role,
        "redrive": synth.breakwater.control.redrive.role,
        "ingest": synth.breakwater.ingest.role,
    }
    grants = {name: _grants_on(synth, role, state) for name, role in roles.items()}
    assert all(grants.values()), grants
    assert not any("dynamodb:Scan" in actions for actions in grants.values())  # the controller reads an index
    assert not any("dynamodb:DeleteItem" in actions for actions in grants.values())
    assert not any(a.endswith("*") for actions in grants.values() for a in actions)
