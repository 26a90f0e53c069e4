"""ViT: patches of a square image after a learned [CLS], learned positions, the classifier on [CLS]."""
import torch
import transformers


def tiny_config(image_size=32, patch_size=8, num_channels=3, num_labels=5, **kw):
    return transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                  image_size=image_size, patch_size=patch_size, num_channels=num_channels,
                                  num_labels=num_labels, **kw)


def vivid(hf):
    """A randomly initialised [CLS] and positions are near zero: made to count (and the biases). Returns hf."""
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "cls_token" in name or "position_embeddings" in name or name.endswith("bias"):
                p.normal_(0.0, 0.5)
    return hf


CASES = {"classifier": lambda: vivid(transformers.ViTForImageClassification(tiny_config()))}
