"""`hare bench peers [MODEL_DIR]`: hare's bundle against the best CPU stacks for embeddings, side by side, in
this process, on the same texts and the same machine (issue 35).

Candidates (a candidate whose packages are missing, or fail to import or export, is skipped and the table
says why; with the dev dependencies only, hare and sentence-transformers' torch run):

    hare            hare's bundle with hare's own code: its tokenizer.json, container/runtime.py's OnnxModel
                    (hare's session options), tasks/ops.py's pad_batch, pooling and normalizing
    torch           sentence-transformers on PyTorch, fp32: the reference every cosine is taken against
    onnx            sentence-transformers backend="onnx" (Optimum's export), fp32
    onnx-int8       the same after export_dynamic_quantized_onnx_model (dynamic, per-channel int8 weights) with
                    the configuration this CPU calls for (avx512_vnni, avx512, avx2 or arm64)
    openvino        sentence-transformers backend="openvino" (Optimum Intel's export), fp32
    openvino-int8   the same after static int8 quantization, as export_static_quantized_openvino_model does it
                    (OVQuantizationConfig's defaults, inputs padded to 384 tokens) but calibrated on our own
                    texts: that function only calibrates on a dataset from the Hugging Face Hub
    fastembed       fastembed's TextEmbedding, fp32, on Optimum's ONNX export (what fastembed downloads for
                    this model is such an export; offline it is pointed at ours with specific_model_path)

Threads, for each: torch.set_num_threads (torch); SessionOptions.intra_op_num_threads (hare, onnx, onnx-int8;
each library's other session options as it sets them); INFERENCE_NUM_THREADS in ov_config (openvino,
openvino-int8; Optimum Intel's PERFORMANCE_HINT LATENCY kept); TextEmbedding(threads=) (fastembed). Every
ONNX Runtime and OpenVINO candidate loads one model per thread count.

Speed: texts of exactly `seq_len` tokens (special tokens included, bench/inputs.py), encoded in calls of
1 and of `batch` texts, each library's own encode call timed (tokenizing, inference, pooling, normalizing).
Figures: the p50 of a call at batch 1 (ms), and sentences a second at `batch` (texts over the summed call
times). Candidates are alternated in rounds (every slot, all candidates, then the next slot; the first
candidate rotates each round), each slot with its own warm-up calls, so that a drift in the machine's load
hits them all alike. The process's CPU time is kept per call (every thread's: on a busy machine the steadier
comparison) and over each slot's wall time (cores: a library that uses more threads than asked shows it).

Fidelity: `fidelity` texts of 3 to `fidelity_max` tokens, cut at exact token counts from prose in Python's
own documentation (pydoc_data, in the standard library: text that neither hare's validation set nor the
OpenVINO calibration set holds); each candidate's vectors against torch's: the 1st percentile and the mean
of the cosines.

Results go to the bench store (bench/store.py) as one run of kind "peers": a point per candidate, thread
count and batch (target = the candidate's key, load "in-process", client_cpu = cores used), the table and
the goal in the run's summary. Exports are kept under the bench cache (`--work`), one folder per model.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import json
import logging
import math
import os
import random
import re
import shutil
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from rich.markup import escape
from rich.table import Table
from tokenizers import Tokenizer

from bench.inputs import TextMaker, comet_texts, load_tokenizer
from bench.runner import Planned, make_point
from bench.stats import summarize
from bench.store import Store
from bench.subjects import cache_dir, manifest_hash
from bench.tables import fmt, wide_console
from container.bundle import MODEL_FILE, TOKENIZER_FILE, read_dense, read_manifest
from container.machine import describe, versions
from container.runtime import OnnxModel
from tasks.errors import InputError
from tasks.ops import cosine, normalize_vector, pad_batch, pool_tokens

Vectors = NDArray[np.float32]

CANDIDATES = ("hare", "torch", "onnx", "onnx-int8", "openvino", "openvino-int8", "fastembed")
LABELS = {
    "hare": "hare's bundle, hare's own runtime code",
    "torch": "sentence-transformers torch fp32 (reference)",
    "onnx": "sentence-transformers onnx fp32",
    "onnx-int8": "sentence-transformers onnx int8 (dynamic, per channel)",
    "openvino": "sentence-transformers openvino fp32",
    "openvino-int8": "sentence-transformers openvino int8 (static)",
    "fastembed": "fastembed fp32",
}
# The packages each candidate needs beyond hare's dev dependencies, as bench/peers-requirements.txt brings them.
NEEDS = {
    "hare": (),
    "torch": ("sentence_transformers", "torch"),
    "onnx": ("sentence_transformers", "optimum.onnxruntime"),
    "onnx-int8": ("sentence_transformers", "optimum.onnxruntime"),
    "openvino": ("sentence_transformers", "openvino", "optimum.intel"),
    "openvino-int8": ("sentence_transformers", "openvino", "optimum.intel", "nncf"),
    "fastembed": ("fastembed", "sentence_transformers", "optimum.onnxruntime"),
}
PACKAGES = ("hare", "onnxruntime", "tokenizers", "numpy", "torch", "transformers", "sentence-transformers", "optimum",
            "optimum-onnx", "optimum-intel", "openvino", "nncf", "fastembed", "huggingface-hub")  # fmt: skip
GOAL_P1 = 0.99  # the bar: peers whose cosine p1 to torch is at least this count for the goal
QUIET_LOGGERS = ("sentence_transformers", "transformers", "optimum", "nncf", "fastembed")
OV_NOTE = "openvino/hare-bench-calibration.txt"  # how the OpenVINO int8 export was calibrated, kept beside it
OV_CALIBRATION_LENGTH = 384  # export_static_quantized_openvino_model pads its calibration inputs to 384 tokens


class Skip(Exception):
    """A candidate that cannot run here; the message says why."""


@dataclass(frozen=True)
class PeersOptions:
    model_dir: Path  # the Hugging Face (sentence-transformers) folder every peer loads
    bundle: Path  # hare's bundle of it
    seq_len: int = 128  # tokens per text for speed
    batch: int = 32  # the throughput batch (batch 1 is always measured too)
    threads: tuple[int, ...] = (1, 2)
    rounds: int = 5
    seconds: float = 1.0  # recorded per slot and round
    warmup_calls: int = 2  # unrecorded calls before each slot
    min_calls: int = 2  # recorded calls per slot and round at least, however long they take
    fidelity: int = 200  # texts in the fidelity set
    fidelity_max: int = 200  # their longest, in tokens
    candidates: tuple[str, ...] = CANDIDATES
    int8_config: str | None = None  # sentence-transformers' name; None: from this CPU's flags
    ov_calibration: int | None = None  # OpenVINO calibration texts; None: OVQuantizationConfig's num_samples
    work: Path | None = None  # where exports are kept (default: the bench cache)
    name: str = ""


@dataclass
class Encoder:
    """One loaded candidate at one thread count: `encode` texts to vectors; `enter` before each slot."""

    encode: Callable[[list[str]], Vectors]
    enter: Callable[[], None] = lambda: None


@dataclass
class Slot:
    """What one candidate did at one thread count and batch, over every round."""

    latencies_ms: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)  # the process's CPU time per call, every thread's
    cpu_s: float = 0.0
    wall_s: float = 0.0


@dataclass
class Row:
    """One candidate's line of the table."""

    key: str
    label: str
    skipped: str = ""  # why it did not run ("" when it did)
    p50_ms: dict[int, float] = field(default_factory=dict)  # batch 1, by threads
    sentences_s: dict[int, float] = field(default_factory=dict)  # at the batch, by threads
    cores: dict[str, float] = field(default_factory=dict)  # "b1t2" -> cores used over the slot
    cpu_ms: dict[str, float] = field(default_factory=dict)  # "b1t2" -> p50 of the process's CPU ms per call
    cosine_p1: float = math.nan
    cosine_mean: float = math.nan
    cosine_min: float = math.nan

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "label": self.label,
            "skipped": self.skipped,
            "p50_ms": {str(k): v for k, v in self.p50_ms.items()},
            "sentences_s": {str(k): v for k, v in self.sentences_s.items()},
            "cores": self.cores,
            "cpu_ms": self.cpu_ms,
            "cosine_p1": _json(self.cosine_p1),
            "cosine_mean": _json(self.cosine_mean),
            "cosine_min": _json(self.cosine_min),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Row:
        return cls(
            key=data["key"],
            label=data["label"],
            skipped=data.get("skipped", ""),
            p50_ms={int(k): v for k, v in data.get("p50_ms", {}).items()},
            sentences_s={int(k): v for k, v in data.get("sentences_s", {}).items()},
            cores=dict(data.get("cores", {})),
            cpu_ms=dict(data.get("cpu_ms", {})),
            cosine_p1=_num(data.get("cosine_p1")),
            cosine_mean=_num(data.get("cosine_mean")),
            cosine_min=_num(data.get("cosine_min")),
        )


def _num(value: Any) -> float:
    return math.nan if value is None else float(value)


def _json(value: float) -> float | None:
    """NaN (not measured) as null, so that the stored JSON is standard."""
    return None if math.isnan(value) else value


# -- texts ----------------------------------------------------------------------------------------------------


def prose(min_words: int = 12) -> list[str]:
    """Plain-prose paragraphs of Python's documentation (pydoc_data, standard library), whitespace folded."""
    import pydoc_data.topics

    out = []
    for topic in pydoc_data.topics.topics.values():
        for paragraph in topic.split("\n\n"):
            if paragraph.startswith(" "):  # code and indented examples
                continue
            text = " ".join(paragraph.split())
            if len(text.split()) >= min_words and re.fullmatch(r"[A-Za-z0-9 ,.;:()'\"-]+", text):
                out.append(text)
    return out


def fidelity_texts(tok: Tokenizer, count: int, longest: int = 200, shortest: int = 3, seed: int = 0) -> list[str]:
    """`count` texts whose encodings (special tokens included) run from `shortest` to `longest` tokens, spread
    evenly in log length; each a run of prose cut at a token boundary (so most counts are exact)."""
    paragraphs = prose()
    rng = random.Random(seed)
    special = len(tok.encode("").ids)
    out = []
    for i in range(count):
        frac = i / max(count - 1, 1)
        tokens = round(math.exp(math.log(shortest) + frac * (math.log(longest) - math.log(shortest))))
        body = max(tokens - special, 1)
        start = rng.randrange(len(paragraphs))
        text = ""
        for k in range(len(paragraphs)):  # as many paragraphs as the length needs
            text = (text + " " + paragraphs[(start + k) % len(paragraphs)]).strip()
            if len(tok.encode(text, add_special_tokens=False).ids) >= body:
                break
        enc = tok.encode(text, add_special_tokens=False)
        if len(enc.ids) > body:
            text = text[: enc.offsets[body - 1][1]]
        out.append(text)
    return out


def speed_texts(maker: TextMaker, seq_len: int, batch: int, groups: int = 8) -> dict[int, list[list[str]]]:
    """Calls of 1 and of `batch` texts of exactly `seq_len` tokens, `groups` different ones of each."""
    texts = maker.texts(seq_len, groups * max(batch, 1))
    return {
        1: [[t] for t in texts[:groups]],
        batch: [texts[i * batch : (i + 1) * batch] for i in range(groups)],
    }


# -- candidates -----------------------------------------------------------------------------------------------


def int8_config_for(flags: Sequence[str], machine: str = "") -> str:
    """sentence-transformers' dynamic-quantization configuration for a CPU with these flags."""
    if "avx512_vnni" in flags or "amx_int8" in flags:
        return "avx512_vnni"
    if "avx512bw" in flags or "avx512f" in flags:
        return "avx512"
    if "avx2" in flags:
        return "avx2"
    if machine.lower() in ("aarch64", "arm64") or "asimddp" in flags:
        return "arm64"
    return "avx2"


def missing(key: str) -> str:
    """Why `key` cannot run here for want of a package ("" when everything it needs is installed)."""
    absent = [name for name in NEEDS[key] if _find(name) is None]
    if not absent:
        return ""
    return f"not installed: {', '.join(absent)} (docs/benchmarks.md, Peers, says how)"


def _find(module: str) -> Any:
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a parent package that is absent or broken
        return None


def _module(name: str) -> Any:
    """A peer's module, untyped: the peers are optional, and their versions vary (see docs/benchmarks.md)."""
    return importlib.import_module(name)


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:240]}"


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The peers' own warnings and chatter off while they load and export (by their loggers' levels too:
    Optimum Intel's exporter lifts `logging.disable` as it finishes)."""
    previous = logging.root.manager.disable
    loggers = [logging.getLogger(name) for name in QUIET_LOGGERS]
    levels = [logger.level for logger in loggers]
    logging.disable(logging.WARNING)
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def weights_id(model_dir: Path) -> str:
    """A short id of the model's weights, naming its folder of exports."""
    digest = hashlib.sha256()
    files = sorted(p for p in model_dir.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
    for path in files or sorted(p for p in model_dir.iterdir() if p.is_file()):
        digest.update(path.name.encode())
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()[:16]


class Workspace:
    """The model folder, the exports made from it (kept in `work`, reused from run to run) and the loaders."""

    def __init__(self, options: PeersOptions, calibration: list[str]) -> None:
        self.options = options
        self.model_dir = options.model_dir
        self.work = options.work or cache_dir() / "peers" / weights_id(options.model_dir)
        self.calibration = calibration
        info = describe()
        self.int8 = options.int8_config or int8_config_for(info["flags"], os.uname().machine)
        self.notes: dict[str, str] = {}  # how each export was made, for the summary
        self._torch_model: Any = None
        self.made_here = False  # whether this run made the OpenVINO int8 export (else an earlier one did)

    # sentence-transformers --------------------------------------------------------------------------------

    def sentence_transformer(self, path: Path, backend: str = "torch", **model_kwargs: Any) -> Any:
        st = _module("sentence_transformers")
        with _quiet():
            return st.SentenceTransformer(
                str(path), device="cpu", backend=backend, model_kwargs=model_kwargs or None, local_files_only=True
            )

    def st_encoder(self, model: Any, enter: Callable[[], None] = lambda: None) -> Encoder:
        def encode(texts: list[str]) -> Vectors:
            vectors = model.encode(texts, batch_size=len(texts), convert_to_numpy=True, show_progress_bar=False)
            return np.asarray(vectors, dtype=np.float32)

        return Encoder(encode, enter)

    def export_folder(self, backend: str) -> Path:
        """`work/<backend>`: the model saved by sentence-transformers with its `backend` export inside."""
        folder = self.work / backend
        marker = folder / ("onnx/model.onnx" if backend == "onnx" else "openvino/openvino_model.xml")
        if marker.is_file():
            return folder
        tmp = self.work / f".{backend}-partial"
        shutil.rmtree(tmp, ignore_errors=True)
        model = self.sentence_transformer(self.model_dir, backend=backend)
        with _quiet():
            model.save_pretrained(str(tmp))
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
        return folder

    def onnx_int8_file(self) -> str:
        """export_dynamic_quantized_onnx_model with this CPU's configuration; the file name it wrote."""
        folder = self.export_folder("onnx")
        name = f"onnx/model_qint8_{self.int8}.onnx"
        if not (folder / name).is_file():
            model = self.sentence_transformer(folder, backend="onnx")
            with _quiet():
                _module("sentence_transformers").export_dynamic_quantized_onnx_model(model, self.int8, str(folder))
        self.notes["onnx-int8"] = f"export_dynamic_quantized_onnx_model(config={self.int8!r})"
        return name

    def openvino_int8_file(self) -> str:
        """Static int8 as export_static_quantized_openvino_model does it, calibrated on our own texts."""
        folder = self.export_folder("openvino")
        name = "openvino/openvino_model_qint8_quantized.xml"
        count = self.options.ov_calibration or len(self.calibration)
        if not (folder / name).is_file():
            self.made_here = True
            nncf = _module("nncf")
            intel = _module("optimum.intel")
            save_or_push_to_hub_model = _module("sentence_transformers.backend.utils").save_or_push_to_hub_model
            model = self.sentence_transformer(folder, backend="openvino")
            config = intel.OVQuantizationConfig()
            texts = self.calibration[:count]
            tokenized = model.tokenizer(
                texts, padding="max_length", max_length=OV_CALIBRATION_LENGTH, truncation=True, return_tensors="np"
            )
            names = [i.get_any_name() for i in model.transformers_model.model.inputs]
            samples = [{k: tokenized[k][i : i + 1] for k in names if k in tokenized} for i in range(len(texts))]
            quantizer = intel.OVQuantizer.from_pretrained(model.transformers_model)
            with _quiet():
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
        self.notes["openvino-int8"] = note.read_text() if note.is_file() else "made before its note was kept"
        if not self.made_here:
            self.notes["openvino-int8"] += f" (export kept in {folder})"
        return name

    def fastembed_folder(self) -> tuple[Path, str]:
        """A folder fastembed loads offline: Optimum's fp32 export and the tokenizer files; the custom name.

        fastembed truncates at the smaller of tokenizer_config.json's model_max_length and max_length; the
        tokenizer files sentence-transformers saves can say less than the model's max_seq_length (128 against
        256 for all-MiniLM-L6-v2), so the folder's config says max_seq_length, as sentence-transformers reads
        it (and as fastembed describes its own copy of all-MiniLM-L6-v2: 256 tokens)."""
        source = self.export_folder("onnx")
        folder = self.work / "fastembed"
        if not (folder / "model.onnx").is_file():
            tmp = self.work / ".fastembed-partial"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
                if (source / name).is_file():
                    shutil.copyfile(source / name, tmp / name)
            longest = max_seq_length(self.model_dir)
            config_file = tmp / "tokenizer_config.json"
            if config_file.is_file():
                config = json.loads(config_file.read_text())
                config.pop("max_length", None)  # the tokenizer's own truncation, not the model's
                if longest is not None:
                    config["model_max_length"] = longest
                config_file.write_text(json.dumps(config, indent=2))
            shutil.copyfile(source / "onnx" / "model.onnx", tmp / "model.onnx")
            shutil.rmtree(folder, ignore_errors=True)
            tmp.rename(folder)
        return folder, f"hare-bench/{self.model_dir.name}-{weights_id(self.model_dir)}"

    # loaders --------------------------------------------------------------------------------------------------

    def load(self, key: str, threads: int) -> Encoder:
        """`key` at `threads` threads; Skip when it cannot run here."""
        why = missing(key)
        if why:
            raise Skip(why)
        try:
            return getattr(self, "_" + key.replace("-", "_"))(threads)
        except Skip:
            raise
        except Exception as exc:  # an import that fails against these versions, an export that fails
            raise Skip(_reason(exc)) from exc

    def _hare(self, threads: int) -> Encoder:
        return Encoder(HareEncoder(self.options.bundle, threads))

    def _torch(self, threads: int) -> Encoder:
        import torch

        if self._torch_model is None:  # one model: torch's thread count is the process's, set before each slot
            self._torch_model = self.sentence_transformer(self.model_dir)
        return self.st_encoder(self._torch_model, lambda: torch.set_num_threads(threads))

    def _session_options(self, threads: int) -> Any:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        return options

    def _onnx(self, threads: int) -> Encoder:
        folder = self.export_folder("onnx")
        model = self.sentence_transformer(
            folder, backend="onnx", provider="CPUExecutionProvider", session_options=self._session_options(threads)
        )
        return self.st_encoder(model)

    def _onnx_int8(self, threads: int) -> Encoder:
        name = self.onnx_int8_file()
        model = self.sentence_transformer(
            self.export_folder("onnx"),
            backend="onnx",
            provider="CPUExecutionProvider",
            session_options=self._session_options(threads),
            file_name=name,
        )
        return self.st_encoder(model)

    def _openvino(self, threads: int) -> Encoder:
        folder = self.export_folder("openvino")
        model = self.sentence_transformer(folder, backend="openvino", ov_config={"INFERENCE_NUM_THREADS": threads})
        self.precision_note("openvino", model)
        return self.st_encoder(model)

    def precision_note(self, key: str, model: Any) -> None:
        """What OpenVINO computes in: its CPU plugin runs an fp32 model in bf16 where the CPU has bf16
        instructions (INFERENCE_PRECISION_HINT), unless told otherwise; the run records what it chose."""
        with contextlib.suppress(Exception):
            hint = model.transformers_model.request.get_property("INFERENCE_PRECISION_HINT")
            name = hint.get_type_name() if hasattr(hint, "get_type_name") else str(hint)
            self.notes[f"{key} compute"] = f"OpenVINO's INFERENCE_PRECISION_HINT on this CPU: {name}"

    def _openvino_int8(self, threads: int) -> Encoder:
        name = self.openvino_int8_file()
        model = self.sentence_transformer(
            self.export_folder("openvino"),
            backend="openvino",
            ov_config={"INFERENCE_NUM_THREADS": threads},
            file_name=name,
        )
        self.precision_note("openvino-int8", model)
        return self.st_encoder(model)

    def _fastembed(self, threads: int) -> Encoder:
        TextEmbedding = _module("fastembed").TextEmbedding
        description = _module("fastembed.common.model_description")
        ModelSource, PoolingType = description.ModelSource, description.PoolingType

        folder, name = self.fastembed_folder()
        pooling, normalize, dim = st_head(self.model_dir)
        poolings = {"mean": PoolingType.MEAN, "cls": PoolingType.CLS}
        if pooling not in poolings:
            raise Skip(f"fastembed pools by mean or CLS only, this model by {pooling}")
        with _quiet():
            if not any(m.get("model") == name for m in TextEmbedding.list_supported_models()):
                TextEmbedding.add_custom_model(
                    model=name,
                    pooling=poolings[pooling],
                    normalization=normalize,
                    sources=ModelSource(hf=name),
                    dim=dim,
                    model_file="model.onnx",
                )
            model = TextEmbedding(model_name=name, threads=threads, specific_model_path=str(folder))

        def encode(texts: list[str]) -> Vectors:
            return np.stack(list(model.embed(texts, batch_size=len(texts)))).astype(np.float32)

        return Encoder(encode)


def max_seq_length(model_dir: Path) -> int | None:
    """sentence-transformers' truncation length for the folder (sentence_bert_config.json), if it says one."""
    config = model_dir / "sentence_bert_config.json"
    value = json.loads(config.read_text()).get("max_seq_length") if config.is_file() else None
    return int(value) if value else None


def st_head(model_dir: Path) -> tuple[str, bool, int]:
    """The sentence-transformers folder's pooling mode, whether it normalizes, and the vector size."""
    modules = json.loads((model_dir / "modules.json").read_text()) if (model_dir / "modules.json").is_file() else []
    normalize = any(m.get("type", "").endswith("Normalize") for m in modules)
    pooling_dir = next((m.get("path", "") for m in modules if m.get("type", "").endswith("Pooling")), "1_Pooling")
    config_file = model_dir / pooling_dir / "config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    modes = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean", "pooling_mode_max_tokens": "max"}
    pooling = next((mode for k, mode in modes.items() if config.get(k)), "mean")
    dim = int(
        config.get("word_embedding_dimension") or json.loads((model_dir / "config.json").read_text())["hidden_size"]
    )
    return pooling, normalize, dim


class HareEncoder:
    """hare's bundle with hare's own code: the bundle's tokenizer as the server loads it, OnnxModel with hare's
    session options, pad_batch, pooling, Dense modules and normalizing as the manifest says."""

    def __init__(self, bundle: Path, threads: int) -> None:
        manifest = read_manifest(bundle)
        if manifest.task != "feature-extraction":
            raise Skip(f"{bundle} serves {manifest.task}; the peers compare embedding models")
        self.model = OnnxModel(bundle / MODEL_FILE, manifest.target, threads, manifest.output)
        self.tok = Tokenizer.from_file(str(bundle / TOKENIZER_FILE))  # truncating at max_length, as served
        self.tok.no_padding()
        self.pooling = manifest.pooling or "mean"
        self.normalize = manifest.normalize
        self.dense = read_dense(bundle, manifest)
        self.prompt = manifest.prompts.get(manifest.default_prompt_name or "", "")
        self.pad_id = manifest.pad_id

    def __call__(self, texts: list[str]) -> Vectors:
        encodings = self.tok.encode_batch([self.prompt + t for t in texts] if self.prompt else texts)
        states = self.model.run(pad_batch(encodings, self.model.input_names, self.pad_id))
        vectors = []
        for row, encoding in zip(states, encodings, strict=True):  # as the server: padding trimmed, then pooled
            vector = pool_tokens(row[: len(encoding.ids)], self.pooling)
            for layer in self.dense:
                vector = layer(vector)
            vectors.append(normalize_vector(vector) if self.normalize else vector)
        return np.stack(vectors)


# -- measuring ------------------------------------------------------------------------------------------------


def _slot(
    encoder: Encoder, calls: list[list[str]], options: PeersOptions, stop: threading.Event | None, into: Slot
) -> None:
    encoder.enter()
    for i in range(options.warmup_calls):
        encoder.encode(calls[i % len(calls)])
    deadline = time.perf_counter() + options.seconds
    cpu0, wall0 = time.process_time(), time.perf_counter()
    done = 0
    while done < options.min_calls or time.perf_counter() < deadline:
        if stop is not None and stop.is_set():
            break
        c0, t0 = time.process_time(), time.perf_counter()
        encoder.encode(calls[done % len(calls)])
        into.latencies_ms.append((time.perf_counter() - t0) * 1000.0)
        into.cpu_ms.append((time.process_time() - c0) * 1000.0)
        done += 1
    into.cpu_s += time.process_time() - cpu0
    into.wall_s += time.perf_counter() - wall0


def cosines(reference: Vectors, candidate: Vectors) -> NDArray[np.float32]:
    return cosine(np.asarray(reference, dtype=np.float32), np.asarray(candidate, dtype=np.float32))


def _encode_all(encoder: Encoder, texts: list[str], batch: int) -> Vectors:
    encoder.enter()
    return np.concatenate([encoder.encode(texts[i : i + batch]) for i in range(0, len(texts), batch)])


def _say(message: str) -> None:
    wide_console().print(message, style="dim")


def run_peers(
    options: PeersOptions,
    store: Store,
    stop: threading.Event | None = None,
    say: Callable[[str], None] = _say,
) -> tuple[int, list[Row]]:
    """Load every candidate, check its fidelity, time it in rounds; store and return the run id and rows."""
    unknown = sorted(set(options.candidates) - set(CANDIDATES))
    if unknown:
        raise InputError(f"unknown candidates {', '.join(unknown)}; choose among {', '.join(CANDIDATES)}")
    if "torch" not in options.candidates:
        raise InputError("the torch candidate is the reference every cosine is taken against: keep it")
    if options.batch < 2:
        raise InputError("--batch is the throughput batch: at least 2 (batch 1 is always measured)")
    manifest = read_manifest(options.bundle)
    tok = load_tokenizer(options.bundle / TOKENIZER_FILE)
    maker = TextMaker(tok)
    calls = speed_texts(maker, options.seq_len, options.batch)
    fidelity = fidelity_texts(tok, options.fidelity, options.fidelity_max)
    calibration = comet_texts(options.ov_calibration or 300, seed=1)
    space = Workspace(options, calibration)
    machine = describe()
    load_start = os.getloadavg()
    run_id = store.create_run(
        "peers",
        name=options.name,
        task=manifest.task,
        target=str(options.bundle),
        manifest_hash=manifest_hash(options.bundle),
        machine=machine,
        versions=versions(PACKAGES),
        settings={
            "model_dir": str(options.model_dir),
            "bundle": str(options.bundle),
            "variant": manifest.variant,
            "seq_len": options.seq_len,
            "batch": options.batch,
            "threads": list(options.threads),
            "rounds": options.rounds,
            "seconds": options.seconds,
            "warmup_calls": options.warmup_calls,
            "fidelity": options.fidelity,
            "fidelity_max": options.fidelity_max,
            "candidates": list(options.candidates),
            "int8_config": space.int8,
            "work": str(space.work),
        },
    )
    rows = {key: Row(key, LABELS[key]) for key in options.candidates}
    encoders: dict[tuple[str, int], Encoder] = {}
    status, message = "done", ""
    try:
        # Load each candidate at each thread count (exports happen here, once) and take its fidelity.
        reference: Vectors | None = None
        for key in ["torch", *[k for k in options.candidates if k != "torch"]]:
            row = rows[key]
            try:
                say(f"loading {key}")
                for threads in options.threads:
                    encoders[key, threads] = space.load(key, threads)
                vectors = _encode_all(encoders[key, max(options.threads)], fidelity, options.batch)
            except Skip as exc:
                row.skipped = str(exc)
                for threads in options.threads:
                    encoders.pop((key, threads), None)
                say(f"  skipped: {row.skipped}")
                if key == "torch":
                    raise InputError(f"the reference (sentence-transformers torch) cannot run: {exc}") from exc
                continue
            if reference is None:
                reference = vectors
            cos = cosines(reference, vectors)
            row.cosine_p1 = float(np.percentile(cos, 1))
            row.cosine_mean = float(cos.mean())
            row.cosine_min = float(cos.min())
        running = [k for k in options.candidates if not rows[k].skipped]
        slots = [(threads, batch) for batch in (1, options.batch) for threads in options.threads]
        results: dict[tuple[str, int, int], Slot] = {(k, t, b): Slot() for k in running for t, b in slots}
        for r in range(options.rounds):
            if stop is not None and stop.is_set():
                status, message = "cancelled", "stopped by a signal"
                break
            order = running[r % len(running) :] + running[: r % len(running)]
            say(f"round {r + 1}/{options.rounds}: {' '.join(order)}")
            for threads, batch in slots:
                for key in order:
                    _slot(encoders[key, threads], calls[batch], options, stop, results[key, threads, batch])
        idx = 0
        for key in running:
            row = rows[key]
            for threads, batch in slots:
                slot = results[key, threads, batch]
                if not slot.latencies_ms:
                    continue
                total_s = sum(slot.latencies_ms) / 1000.0
                if batch == 1:
                    row.p50_ms[threads] = summarize(slot.latencies_ms).p50
                else:
                    row.sentences_s[threads] = batch * len(slot.latencies_ms) / total_s
                row.cores[f"b{batch}t{threads}"] = slot.cpu_s / max(slot.wall_s, 1e-9)
                row.cpu_ms[f"b{batch}t{threads}"] = summarize(slot.cpu_ms).p50
                idx += 1
                store.add_point(_point(run_id, idx, key, threads, batch, options.seq_len, slot))
    except BaseException as exc:
        store.finish_run(run_id, "failed", _reason(exc))
        raise
    finally:
        encoders.clear()
    table = [rows[k] for k in options.candidates]
    load_end = os.getloadavg()
    store.update_run(
        run_id,
        summary={
            "peers": [r.to_dict() for r in table],
            "goal": goal(table, options.threads),
            "load_start": list(load_start),
            "load_end": list(load_end),
            "exports": space.notes,
            "fidelity_tokens": _lengths(tok, fidelity),
        },
    )
    store.finish_run(run_id, status, message)
    return run_id, table


def _lengths(tok: Tokenizer, texts: list[str]) -> dict[str, int]:
    counts = [len(e.ids) for e in tok.encode_batch(texts)]
    return {"texts": len(counts), "min": min(counts, default=0), "max": max(counts, default=0)}


def _point(run_id: int, idx: int, key: str, threads: int, batch: int, seq_len: int, slot: Slot) -> Any:
    planned = Planned(key, 1, threads, seq_len, batch, 1, 0.0)
    window = sum(slot.latencies_ms) / 1000.0
    return make_point(
        run_id,
        idx,
        key,
        "in-process",
        1,
        threads,
        planned,
        float(seq_len),
        window,
        len(slot.latencies_ms),
        len(slot.latencies_ms),
        {},
        summarize(slot.latencies_ms),
        server={},
        client_cpu=slot.cpu_s / max(slot.wall_s, 1e-9),
        extra={"candidate": LABELS[key], "cpu_ms_p50": summarize(slot.cpu_ms).p50},
    )


# -- the goal and the table -----------------------------------------------------------------------------------


def goal(rows: Sequence[Row], threads: Sequence[int]) -> list[dict[str, Any]]:
    """The issue's goal, per figure: hare at least as fast as the fastest peer whose cosine p1 is >= 0.99."""
    hare = next((r for r in rows if r.key == "hare" and not r.skipped), None)
    peers = [r for r in rows if r.key != "hare" and not r.skipped and r.cosine_p1 >= GOAL_P1]
    out = []
    for figure in ("p50_ms", "sentences_s"):
        lower_better = figure == "p50_ms"
        for t in threads:
            ours = getattr(hare, figure).get(t) if hare else None
            theirs = [(getattr(p, figure)[t], p.key) for p in peers if t in getattr(p, figure)]
            best = (min if lower_better else max)(theirs, default=None)
            met = None
            if ours is not None and best is not None:
                met = ours <= best[0] if lower_better else ours >= best[0]
            out.append(
                {
                    "figure": "batch 1 p50 ms" if lower_better else "batch sentences/s",
                    "threads": t,
                    "hare": ours,
                    "best_peer": best[1] if best else None,
                    "peer": best[0] if best else None,
                    "met": met,
                }
            )
    return out


def peers_table(rows: Sequence[Row], threads: Sequence[int], batch: int, seq_len: int) -> Table:
    table = Table(title=f"hare against its peers: {seq_len}-token texts, in process")
    table.add_column("candidate")
    for t in threads:
        table.add_column(f"{t} thread{'s' if t > 1 else ''} p50 ms", justify="right")
    for t in threads:
        table.add_column(f"sentences/s, batch {batch}, {t} thread{'s' if t > 1 else ''}", justify="right")
    table.add_column("cosine p1 to torch", justify="right")
    table.add_column("cosine mean", justify="right")
    table.add_column("skipped because", overflow="fold", max_width=48)
    for r in rows:
        if r.skipped:
            table.add_row(r.label, *(["-"] * (2 * len(threads) + 2)), escape(r.skipped))
            continue
        table.add_row(
            r.label,
            *(fmt(r.p50_ms.get(t), 1) for t in threads),
            *(fmt(r.sentences_s.get(t), 1) for t in threads),
            fmt(r.cosine_p1, 4),
            fmt(r.cosine_mean, 4),
            "",
        )
    table.caption = "p50: one text per call; cosine: the fidelity set's vectors against sentence-transformers torch"
    return table


def cpu_table(rows: Sequence[Row], threads: Sequence[int], batch: int) -> Table:
    """CPU time per call (the process's, every thread's): what each call cost, whatever share of the cores the
    machine's other load left it; on a busy machine a steadier comparison than wall time, at 1 thread above all."""
    table = Table(title="CPU time per call, p50 ms (the process's, all threads), and cores used")
    table.add_column("candidate")
    slots = [(b, t) for b in (1, batch) for t in threads]
    for b, t in slots:
        table.add_column(f"batch {b}, {t} thread{'s' if t > 1 else ''}", justify="right")
    for r in rows:
        if r.skipped:
            continue
        cells = []
        for b, t in slots:
            key = f"b{b}t{t}"
            cells.append(f"{fmt(r.cpu_ms.get(key), 1)} ({fmt(r.cores.get(key), 2)})")
        table.add_row(r.key, *cells)
    table.caption = "in brackets: the process's CPU time over the slots' wall time, in cores"
    return table


def goal_table(goals: Sequence[dict[str, Any]]) -> Table:
    table = Table(title=f"goal: hare at least as fast as the fastest peer with cosine p1 >= {GOAL_P1}")
    for col in ("figure", "threads", "hare", "fastest such peer", "peer", "met"):
        table.add_column(col, justify="left" if col in ("figure", "fastest such peer") else "right")
    for g in goals:
        met = "-" if g["met"] is None else ("[green]yes[/]" if g["met"] else "[red]no[/]")
        table.add_row(g["figure"], str(g["threads"]), fmt(g["hare"]), g["best_peer"] or "-", fmt(g["peer"]), met)
    return table


def print_peers(summary: dict[str, Any], settings: dict[str, Any]) -> None:
    """The run's table, goal and load, from its stored summary (`hare bench peers` and `hare bench show`)."""
    console = wide_console()
    rows = [Row.from_dict(r) for r in summary.get("peers", [])]
    threads = [int(t) for t in settings.get("threads", [1, 2])]
    batch = int(settings.get("batch", 32))
    console.print(peers_table(rows, threads, batch, int(settings.get("seq_len", 128))))
    if any(r.cpu_ms for r in rows):
        console.print(cpu_table(rows, threads, batch))
    if summary.get("goal"):
        console.print(goal_table(summary["goal"]))
    start, end = summary.get("load_start"), summary.get("load_end")
    if start and end:
        console.print(f"load average (1, 5, 15 min): {_loads(start)} at the start, {_loads(end)} at the end")
    for key, note in summary.get("exports", {}).items():
        console.print(f"{key}: {escape(note)}")


def _loads(values: Sequence[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)
