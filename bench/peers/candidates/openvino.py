"""sentence-transformers' OpenVINO candidates: `openvino` (Optimum Intel's export, fp32) and `openvino-int8`
(static int8 as export_static_quantized_openvino_model makes it, but calibrated on our own texts: that
function only calibrates on a dataset from the Hugging Face Hub)."""

from __future__ import annotations

import contextlib
from typing import Any

from bench.peers.candidates.base import Encoder, module, quiet
from bench.peers.candidates.sentence_transformers import export_folder, sentence_transformer, st_encoder
from bench.peers.candidates.workspace import Workspace

OV_NOTE = "openvino/hare-bench-calibration.txt"  # how the OpenVINO int8 export was calibrated, kept beside it
OV_CALIBRATION_LENGTH = 384  # export_static_quantized_openvino_model pads its calibration inputs to 384 tokens


def load_openvino(space: Workspace, threads: int) -> Encoder:
    folder = export_folder(space, "openvino")
    model = sentence_transformer(folder, backend="openvino", ov_config={"INFERENCE_NUM_THREADS": threads})
    precision_note(space, "openvino", model)
    return st_encoder(model)


def load_openvino_int8(space: Workspace, threads: int) -> Encoder:
    name = openvino_int8_file(space)
    model = sentence_transformer(
        export_folder(space, "openvino"),
        backend="openvino",
        ov_config={"INFERENCE_NUM_THREADS": threads},
        file_name=name,
    )
    precision_note(space, "openvino-int8", model)
    return st_encoder(model)


def precision_note(space: Workspace, key: str, model: Any) -> None:
    """What OpenVINO computes in: its CPU plugin runs an fp32 model in bf16 where the CPU has bf16
    instructions (INFERENCE_PRECISION_HINT), unless told otherwise; the run records what it chose."""
    with contextlib.suppress(Exception):
        hint = model.transformers_model.request.get_property("INFERENCE_PRECISION_HINT")
        name = hint.get_type_name() if hasattr(hint, "get_type_name") else str(hint)
        space.notes[f"{key} compute"] = f"OpenVINO's INFERENCE_PRECISION_HINT on this CPU: {name}"


def openvino_int8_file(space: Workspace) -> str:
    """Static int8 as export_static_quantized_openvino_model does it, calibrated on our own texts."""
    folder = export_folder(space, "openvino")
    name = "openvino/openvino_model_qint8_quantized.xml"
    count = space.options.ov_calibration or len(space.calibration)
    if not (folder / name).is_file():
        space.made_here = True
        nncf = module("nncf")
        intel = module("optimum.intel")
        save_or_push_to_hub_model = module("sentence_transformers.backend.utils").save_or_push_to_hub_model
        model = sentence_transformer(folder, backend="openvino")
        config = intel.OVQuantizationConfig()
        texts = space.calibration[:count]
        tokenized = model.tokenizer(
            texts, padding="max_length", max_length=OV_CALIBRATION_LENGTH, truncation=True, return_tensors="np"
        )
        names = [i.get_any_name() for i in model.transformers_model.model.inputs]
        samples = [{k: tokenized[k][i : i + 1] for k in names if k in tokenized} for i in range(len(texts))]
        quantizer = intel.OVQuantizer.from_pretrained(model.transformers_model)
        with quiet():
            save_or_push_to_hub_model(
                export_function=lambda save_dir: quantizer.quantize(
                    nncf.Dataset(samples),
                    save_directory=save_dir,
                    ov_config=intel.OVConfig(quantization_config=config),
                ),
                export_function_name="export_static_quantized_openvino_model",
                config=config,
                model_name_or_path=str(folder),
                file_suffix="qint8_quantized",
                backend="openvino",
                model=model,
            )
        (folder / OV_NOTE).write_text(
            f"OVQuantizationConfig() defaults; {count} calibration texts of our own offered (45-55-word windows "
            f"of bench/inputs.py's sentences, padded to {OV_CALIBRATION_LENGTH} tokens; NNCF takes its default "
            "subset of them), where export_static_quantized_openvino_model would take glue/sst2 from the Hub"
        )
    note = folder / OV_NOTE
    space.notes["openvino-int8"] = note.read_text() if note.is_file() else "made before its note was kept"
    if not space.made_here:
        space.notes["openvino-int8"] += f" (export kept in {folder})"
    return name
