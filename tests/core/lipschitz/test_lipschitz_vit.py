"""Lipschitz constants of a ViT layer (and one head) on image patches: the "image" input source."""
import argparse

import pytest
import torch

from digit_vit import skip_without_digits  # noqa: E402

skip_without_digits()

from desktop_app.core import lipschitz as lip  # noqa: E402
from desktop_app.core.checkpoints import new_model  # noqa: E402
from desktop_app.core.families.vit import preset  # noqa: E402


@pytest.fixture(scope="module")
def vit():
    """A tiny random digit ViT: 8 x 8, one channel, patch 2 (16 patches + [CLS]), 2 layers x 2 heads, d 8."""
    cfg = preset(d_model=8, n_layers=2, n_heads=2, d_ff=16, image_size=8, patch_size=2, num_channels=1,
                 vocab_size=10, lm_head=True)
    return new_model(cfg, seed=0).double()


def _spec(vit, **kw):
    return lip.build_sweep_spec(dict(function=lip.MODEL, data="image", model=vit, lengths=(2, 5, 17), samples=2,
                                     tol=1e-9, **kw))


@pytest.mark.parametrize("layer, head", [(0, None), (1, None), (1, 0)])
def test_image_patches_against_the_exact_jacobian(vit, layer, head):
    spec = _spec(vit, layer=layer, head=head)
    fmap = lip.sweep_function(spec)
    inputs_at = lip.get_source("image", lip.MODEL).inputs(lip.SourceContext(spec, fmap, [2, 5, 17], None))
    for n in (2, 5, 17):
        X, est = inputs_at(n)
        assert est is None and X.shape == (2, n, 8)
        # [CLS] is every subset's first row; the full length is the whole image's layer input
        assert torch.equal(X[:, 0], inputs_at(17)[0][:, 0])
        exact = lip.exact_jacobian_norm(fmap, X)
        assert torch.allclose(lip.spectral_norm(fmap, X, tol=1e-10).sigma, exact, rtol=1e-5)
    result = lip.run_sweep(spec)
    assert [r.n for r in result.lengths] == [2, 5, 17]
    X17, _ = inputs_at(17)
    assert result.lengths[-1].lipschitz == pytest.approx(lip.exact_jacobian_norm(fmap, X17).numpy(), rel=1e-5)
    assert "image" in result.label


def test_the_whole_image_is_the_traced_layer_input(vit):
    from desktop_app.core.training.image_tasks import digits_split, load_digits, pixel_settings
    from desktop_app.core.vit import preprocess_image

    spec = _spec(vit, layer=1)
    X, _ = lip.get_source("image", lip.MODEL).inputs(
        lip.SourceContext(spec, lip.sweep_function(spec), [17], None))(17)
    images, _ = load_digits()
    first = digits_split(len(images))[1][0]  # the first held-out digit is the first sample
    pixels = torch.from_numpy(preprocess_image(images[first], pixel_settings(8, 1), 1))[None].double()
    _, trace = vit.run_with_trace(pixels, names=("blocks.1.attn.input",), compute_logits=False)
    assert torch.allclose(X[0], trace["blocks.1.attn.input"][0])


def test_bad_lengths_and_text_models_are_one_line(vit):
    with pytest.raises(ValueError, match=r"n = 32 outside 1 \.\. 17: this ViT reads \[CLS\] \+ 16 patches"):
        lip.run_sweep(lip.build_sweep_spec(dict(function=lip.MODEL, data="image", model=vit, lengths=(8, 32),
                                                samples=1)))
    from desktop_app.core.config import ModelConfig
    text = new_model(ModelConfig(vocab_size=11, d_model=8, n_layers=1, n_heads=2, d_ff=16, context_length=8),
                     seed=0)
    with pytest.raises(ValueError, match="needs a vision transformer"):
        lip.run_sweep(lip.build_sweep_spec(dict(function=lip.MODEL, data="image", model=text, lengths=(4,),
                                                samples=1)))


def test_the_cli_offers_image_patches():
    from desktop_app.commands import lipschitz as command

    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers())
    sub = parser._subparsers._group_actions[0].choices["lipschitz"]
    assert "image" in next(a for a in sub._actions if a.dest == "data").choices
    assert "image patches" in [s.label for s in lip.sources_for(lip.MODEL)]
