"""The small untrained digit ViT folder the ViT tests open (8 x 8, one channel, patch 2: 16 patches +
[CLS]; 2 layers x 3 heads; ten classes), with its preprocessor_config.json. Tests in any folder
import it as `from digit_vit import save_digit_vit` (tests/ is on the path, as for fake_hf_cache)."""
from __future__ import annotations

import json
from pathlib import Path


def save_digit_vit(folder: Path, labels: bool = True) -> Path:
    from desktop_app.core.checkpoints import new_model, save_model_folder
    from desktop_app.core.families.vit import preset
    from desktop_app.core.training.image_tasks import pixel_settings, preprocessor_config

    extra = {"id2label": {str(i): f"digit {i}" for i in range(10)}} if labels else {}
    cfg = preset(d_model=24, n_layers=2, n_heads=3, d_ff=48, image_size=8, patch_size=2, num_channels=1,
                 vocab_size=10, lm_head=True, extra=extra)
    save_model_folder(new_model(cfg, seed=0), folder, extra_files={
        "preprocessor_config.json": json.dumps(preprocessor_config(pixel_settings(8, 1))).encode()})
    return folder


def skip_without_digits() -> None:
    """Skip (a module, or one test) when scikit-learn's copy of the digits is not installed. Looked up
    without importing scikit-learn, as the app does (core.training.image_tasks.load_digits)."""
    import pytest
    from importlib.util import find_spec

    if find_spec("sklearn") is None:
        pytest.skip("the digits need scikit-learn installed", allow_module_level=True)
