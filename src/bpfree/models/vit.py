"""A tiny Vision Transformer for 28x28 images, with optional deep visual prompts.

QZO-FF (Feng et al., NeurIPS 2024) §4.1–4.3 adapts a ViT-tiny backbone by linear probing,
full fine-tuning and deep visual-prompt tuning (D-VPT, Jia et al. 2022). :class:`TinyViT`
is the same architecture at MNIST scale (default: 16 patches of 7x7, width 64, 4 pre-norm
encoder blocks, ~140 k parameters) so that episode-level fine-tuning runs in seconds on
one CPU core.

Design choices, so that every forward-only estimator in bpfree can drive it:

* attention is written out (``nn.Linear`` q/k/v/projection, matmul, softmax) rather than
  ``nn.MultiheadAttention``/``scaled_dot_product_attention``: no fused fast paths, works
  under ``torch.func.vmap``/``functional_call``/``jvp``, and every weight is an
  ``nn.Linear`` that the quantisation and memory tools already understand;
* no dropout, no stochastic depth, no BatchNorm: ``forward`` is a deterministic function
  of the parameters and the input, in train and eval mode alike.

Deep VPT: with ``prompt_tokens=P > 0`` the model owns ``prompts`` of shape
``(depth, P, dim)``. Before encoder block ``l`` the token sequence is
``[cls, prompts[l], patch tokens]``; the P prompt outputs of block ``l-1`` are discarded
and replaced by ``prompts[l]`` (VPT-deep, Jia et al. 2022, Eq. 5–6). Prompts get no
positional embedding. ``features`` returns the final-normed cls token, which does attend
to the prompts, so the prompts change both ``features`` and ``forward``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["Attention", "Block", "TinyViT", "mnist_vit"]


class Attention(nn.Module):
    """Multi-head softmax self-attention, written with ``nn.Linear`` + matmul + softmax."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be divisible by heads ({heads})")
        self.heads = heads
        self.head_dim = dim // heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]                       # [B, H, N, hd]
        attn = torch.softmax((q @ k.transpose(-2, -1)) * self.scale, dim=-1)
        out = (attn @ v).transpose(1, 2).reshape(b, n, d)
        return self.proj(out)


class Block(nn.Module):
    """Pre-norm transformer encoder block: ``x + Attn(LN(x))``, then ``x + MLP(LN(x))``."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float = 2.0) -> None:
        super().__init__()
        hidden = int(round(dim * mlp_ratio))
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyViT(nn.Module):
    """ViT (Dosovitskiy et al. 2020) at MNIST scale, optionally with deep visual prompts.

    Args:
        image_size: side of the square input image (must be divisible by ``patch_size``).
        patch_size: side of a square patch; the patch embedding is a stride-``patch_size``
            ``Conv2d``.
        in_chans: input channels.
        dim: token width.
        depth: number of encoder blocks.
        heads: attention heads per block (``dim % heads == 0``).
        mlp_ratio: MLP hidden width / ``dim``.
        num_classes: outputs of the linear ``head``.
        prompt_tokens: P, the number of deep-VPT prompt tokens per layer (0: no prompts).

    Parameter names (used by :mod:`bpfree.training_modes`): ``patch_embed.*``,
    ``cls_token``, ``pos_embed``, ``prompts`` (only when P > 0), ``blocks.<i>.*``,
    ``norm.*`` (final LayerNorm) and ``head.*``.
    """

    def __init__(self, image_size: int = 28, patch_size: int = 7, in_chans: int = 1,
                 dim: int = 64, depth: int = 4, heads: int = 4, mlp_ratio: float = 2,
                 num_classes: int = 10, prompt_tokens: int = 0) -> None:
        super().__init__()
        for name, value in (("image_size", image_size), ("patch_size", patch_size),
                            ("in_chans", in_chans), ("dim", dim), ("depth", depth),
                            ("heads", heads), ("num_classes", num_classes)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if image_size % patch_size:
            raise ValueError(f"image_size ({image_size}) must be divisible by patch_size "
                             f"({patch_size})")
        if not isinstance(prompt_tokens, int) or isinstance(prompt_tokens, bool) \
                or prompt_tokens < 0:
            raise ValueError(f"prompt_tokens must be an int >= 0, got {prompt_tokens!r}")
        if mlp_ratio <= 0:
            raise ValueError(f"mlp_ratio must be > 0, got {mlp_ratio!r}")
        self.image_size, self.patch_size, self.in_chans = image_size, patch_size, in_chans
        self.dim, self.depth, self.prompt_tokens = dim, depth, prompt_tokens
        self.num_patches = (image_size // patch_size) ** 2
        self.num_features = dim

        self.patch_embed = nn.Conv2d(in_chans, dim, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + self.num_patches, dim))
        if prompt_tokens:
            self.prompts = nn.Parameter(torch.zeros(depth, prompt_tokens, dim))
        else:
            self.prompts = None
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """ViT/timm-style init: trunc-normal(0.02) tokens and Linear weights, zero biases;
        VPT's uniform init for the prompts (Jia et al. 2022, ``val = sqrt(6/(3·p²+d))``
        with the input channels in place of 3)."""
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.kaiming_uniform_(self.patch_embed.weight.view(self.dim, -1), a=math.sqrt(5))
        nn.init.zeros_(self.patch_embed.bias)
        if self.prompts is not None:
            self.reset_prompts()

    def reset_prompts(self) -> None:
        """Re-draw the prompts with VPT's uniform init (no-op without prompts)."""
        if self.prompts is None:
            return
        val = math.sqrt(6.0 / float(self.in_chans * self.patch_size ** 2 + self.dim))
        with torch.no_grad():
            self.prompts.uniform_(-val, val)

    def tokens(self, x: Tensor) -> Tensor:
        """Patch tokens with cls prepended and positional embedding added, [B, 1+N, dim]."""
        if x.ndim != 4 or x.shape[1:] != (self.in_chans, self.image_size, self.image_size):
            raise ValueError(f"expected input [B, {self.in_chans}, {self.image_size}, "
                             f"{self.image_size}], got {list(x.shape)}")
        patches = self.patch_embed(x).flatten(2).transpose(1, 2)          # [B, N, dim]
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        return torch.cat([cls, patches], dim=1) + self.pos_embed

    def features(self, x: Tensor) -> Tensor:
        """The final-normed cls embedding, [B, dim] (the few-shot feature)."""
        h = self.tokens(x)
        p = self.prompt_tokens
        for i, block in enumerate(self.blocks):
            if p:
                prompt = self.prompts[i].unsqueeze(0).expand(h.shape[0], -1, -1)
                # VPT-deep: drop the previous layer's prompt outputs, insert layer i's prompts.
                rest = h[:, 1:] if i == 0 else h[:, 1 + p:]
                h = torch.cat([h[:, :1], prompt, rest], dim=1)
            h = block(h)
        return self.norm(h[:, 0])

    def forward(self, x: Tensor) -> Tensor:
        """Head logits, [B, num_classes]."""
        return self.head(self.features(x))


def mnist_vit(num_classes: int = 10, prompt_tokens: int = 0) -> TinyViT:
    """The registry's ``mnist-vit``: TinyViT(28, patch 7, dim 64, depth 4, 4 heads)."""
    return TinyViT(num_classes=num_classes, prompt_tokens=prompt_tokens)
