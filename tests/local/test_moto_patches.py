"""The patches of moto as a whole: each declared once, installed and undone by one call, for one moto.

The patches of each service have their own module (``test_moto_patches_<service>.py``).
"""

from __future__ import annotations

from typing import Any

import pytest
from moto.dynamodb import models as dynamodb_models

from local.emulator import moto_patches
from local.emulator.moto_patches import Kind, MotoVersionError
from local.emulator.moto_patches.patch import ABSENT

SERVICES = {"sqs", "kinesis", "dynamodb", "lambda", "server"}


def attributes() -> dict[tuple[int, str], Any]:
    """What every patched attribute is now, by (id of its target, name)."""
    return {
        (id(r.target), r.attribute): vars(r.target).get(r.attribute, ABSENT)
        for patch in moto_patches.declared()
        for r in patch.replaces
    }


def test_every_patch_is_declared_once_with_its_kind_and_what_it_corrects() -> None:
    patches = moto_patches.declared()
    names = [patch.name for patch in patches]
    assert len(names) == len(set(names))
    for patch in patches:
        assert patch.name.split(".")[0] in SERVICES
        assert patch.kind in set(Kind)
        assert len(patch.corrects) > 40 and patch.replaces
    assert {patch.kind for patch in patches} == {Kind.CORRECTNESS, Kind.SPEED}


def test_one_call_installs_them_and_one_call_gives_moto_as_released_back() -> None:
    with moto_patches.removed():
        released = attributes()
        assert moto_patches.installed_names() == ()
        added = moto_patches.install()
        assert set(added) == {patch.name for patch in moto_patches.declared()}
        assert moto_patches.install() == ()  # idempotent
        now = attributes()
        assert all(now[key] is not released[key] for key in released)
        assert set(moto_patches.uninstall()) == set(added)
        after = attributes()
        assert all(after[key] is released[key] for key in released)


def test_kinds_select_the_patches() -> None:
    with moto_patches.removed(), moto_patches.installed(kinds={Kind.CORRECTNESS}):
        kinds = {p.name: p.kind for p in moto_patches.declared()}
        installed = moto_patches.installed_names()
        assert installed and {kinds[name] for name in installed} == {Kind.CORRECTNESS}
        with moto_patches.installed(kinds={"speed"}):
            assert set(moto_patches.installed_names()) == set(kinds)
        assert moto_patches.installed_names() == installed


def test_a_patch_undone_under_another_leaves_the_other_on_moto_as_released() -> None:
    released = dynamodb_models.DynamoDBBackend.__dict__["transact_write_items"]

    def layers() -> list[Any]:
        method, found = dynamodb_models.DynamoDBBackend.__dict__["transact_write_items"], []
        while method is not released:
            found.append(method)
            method = method.__wrapped__
        return found

    with moto_patches.removed():
        moto_patches.install(
            names={"dynamodb.serialized_item_operations", "dynamodb.transaction_item_backups"}
        )
        assert len(layers()) == 2  # the backups wrap the serialized operation
        moto_patches.uninstall(names={"dynamodb.serialized_item_operations"})
        assert len(layers()) == 1
        moto_patches.install(names={"dynamodb.serialized_item_operations"})
        assert len(layers()) == 2
        moto_patches.uninstall()
        assert layers() == []


def test_another_moto_is_refused_naming_both_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(moto_patches, "installed_moto_version", lambda: "5.3.0")
    with pytest.raises(MotoVersionError, match=r"written for moto 5\.2\.5, but moto 5\.3\.0 is installed"):
        moto_patches.install()
    assert moto_patches.MOTO_VERSION == "5.2.5"


def test_a_name_that_is_no_patch_is_refused() -> None:
    with pytest.raises(KeyError, match=r"sqs\.no_such_patch"):
        moto_patches.install(names={"sqs.no_such_patch"})
