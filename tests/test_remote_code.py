"""Models with their own code: refused by default; with --trust-remote-code the code runs inside
`hare optimize` only, and the served bundle is plain ONNX that never imports it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from container.bundle import read_manifest
from hare.cli import main
from tests.tiny_models import make_model, make_remote_code_model

QUICK = ["--variants", "fp32", "--tune-lengths", "8", "--tune-batches", "1", "--tune-seconds", "0.02"]
SERVE = """
import asyncio, sys
import httpx
from api.web.app import create_app
from api.config import Settings

async def go():
    app = create_app(Settings.from_env({"HARE_BUNDLE": sys.argv[1], "HARE_WORKERS": "1"}))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://hare") as client:
            r = await client.post("/predict", json={"inputs": "hello world", "parameters": {"top_k": None}})
            print(r.status_code, r.text)
    loaded = [m for m in sys.modules if m.startswith(("torch", "transformers")) or "modeling_x" in m]
    print("loaded:", loaded)

asyncio.run(go())
"""


def test_remote_code_runs_at_build_time_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "imported.log"
    model = make_remote_code_model(tmp_path / "model", marker)
    out = tmp_path / "bundle"

    assert main(["optimize", str(model), "--task", "text-classification", "--out", str(out), *QUICK]) == 2
    assert "--trust-remote-code" in capsys.readouterr().err and not out.exists()
    assert not marker.exists()  # refused before any of the model's code was imported

    args = ["optimize", str(model), "--task", "text-classification", "--out", str(out), "--trust-remote-code"]
    assert main([*args, *QUICK]) == 0
    assert marker.read_text().count("imported") >= 1  # the model's own class built the graph
    manifest = read_manifest(out)
    assert manifest.source["trust_remote_code"] is True and manifest.model_type == "hare-custom"
    assert not list(out.glob("*.py"))

    marker.unlink()
    served = subprocess.run(
        [sys.executable, "-c", SERVE, str(out)], capture_output=True, text=True, check=False, timeout=120
    )
    assert served.stdout.startswith("200 "), served.stderr
    assert "loaded: []" in served.stdout  # no torch, no transformers, no model code in the server
    assert not marker.exists()


def test_the_custom_forward_is_what_the_bundle_computes(tmp_path: Path) -> None:
    """The custom class multiplies the logits by 3: the fp32 gate passed against it, so the graph has it."""
    import torch
    from transformers import AutoModelForSequenceClassification, BertForSequenceClassification

    from container.runtime import OnnxModel

    model = make_remote_code_model(tmp_path / "model", tmp_path / "imported.log")
    out = tmp_path / "bundle"
    assert (
        main(
            ["optimize", str(model), "--task", "text-classification", "--out", str(out), "--trust-remote-code", *QUICK]
        )
        == 0
    )
    custom = AutoModelForSequenceClassification.from_pretrained(str(model), trust_remote_code=True).eval()
    plain = BertForSequenceClassification.from_pretrained(str(model)).eval()
    ids = torch.tensor([[2, 10, 11, 12, 3]])
    feeds = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    with torch.inference_mode():
        expected, base = custom(**feeds).logits.numpy(), plain(**feeds).logits.numpy()
    onnx_model = OnnxModel(out / "model.onnx", output="logits")
    got = onnx_model.run({k: v.numpy() for k, v in feeds.items() if k in onnx_model.input_names})
    assert np.allclose(got, expected, atol=1e-4) and np.allclose(expected, 3 * base, atol=1e-5)


def test_a_remote_code_folder_of_a_family_transformers_now_has_builds_without_the_flag(tmp_path: Path) -> None:
    """NomicBERT, GTE and Jina v3 checkpoints carry an auto_map from before transformers 5 had their classes:
    transformers' own classes build them, no code of the folder runs, and --trust-remote-code is not needed."""
    model = make_model(tmp_path / "model", "text-classification", "nomic_bert")
    config = json.loads((model / "config.json").read_text())
    auto_map = {"AutoConfig": "configuration_hf_nomic_bert.NomicBertConfig"}
    auto_map |= {"AutoModelForSequenceClassification": "modeling_hf_nomic_bert.NomicBertForSequenceClassification"}
    (model / "config.json").write_text(json.dumps(config | {"auto_map": auto_map}))  # files it names are absent
    out = tmp_path / "bundle"
    assert main(["optimize", str(model), "--task", "text-classification", "--out", str(out), *QUICK]) == 0
    manifest = read_manifest(out)
    assert manifest.source["trust_remote_code"] is False and manifest.model_type == "nomic_bert"
