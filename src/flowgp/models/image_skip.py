"""Image-shaped deep-GP layers: the convolutional skip-layer connection (CSC) of CNF-DGP §IV-B.

A hidden layer of a DGP (Salimbeni & Deisenroth 2017) is f_ℓ(x) = m_ℓ(x) + g_ℓ(x) with g_ℓ a zero-mean GP and
m_ℓ the skip-layer connection that carries the input forward (a fixed linear projection in DSVI). For images
CNF-DGP replaces the projection by a trainable 3×3 convolution: the layer's outputs keep the image layout
(channels × height × width, flattened row-major as torch does), and m_ℓ mixes each pixel only with its
neighbours, so the part of the layer that the GP does not have to learn respects the pixels' neighbourhoods.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ConvSkip", "check_image_shape"]


def check_image_shape(image_shape, num_features: int | None = None) -> tuple[int, int, int]:
    """`image_shape` as a (C, H, W) tuple of positive ints (ValueError/TypeError naming the argument), and,
    given `num_features`, matching C·H·W = num_features (X holds the images as flat rows)."""
    if isinstance(image_shape, (str, bytes)) or not hasattr(image_shape, "__len__") or len(image_shape) != 3:
        raise TypeError(f"image_shape must be (channels, height, width), e.g. (1, 28, 28), got {image_shape!r}")
    shape = []
    for value in image_shape:
        if isinstance(value, bool) or not isinstance(value, int) and not (hasattr(value, "__index__")):
            raise TypeError(f"image_shape must hold three positive integers, got {image_shape!r}")
        if int(value) < 1:
            raise ValueError(f"image_shape must hold three positive integers, got {image_shape!r}")
        shape.append(int(value))
    c, h, w = shape
    if num_features is not None and c * h * w != int(num_features):
        raise ValueError(f"image_shape {tuple(shape)} has C·H·W = {c * h * w} pixels but X has {num_features} "
                         "features; X must hold each image flattened as a row in (C, H, W) order")
    return c, h, w


class ConvSkip(nn.Module):
    """m(x) = conv2d(x as [C_in, H, W], W, padding 1) flattened: the CSC mean of a hidden image layer.

    x [..., N, C_in·H·W] -> [..., N, C_out·H·W]; the weight [C_out, C_in, k, k] (k = 3, no bias) is trained. It
    starts at the identity where C_out = C_in (centre tap = I), as DSVI's linear skip starts at the identity
    when the widths match, so a fresh layer passes its input through; otherwise at the centre-tap average.
    """

    def __init__(self, in_channels: int, out_channels: int, height: int, width: int, kernel_size: int = 3,
                 dtype=None, device=None):
        super().__init__()
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be a positive odd integer (the output keeps the size), got {kernel_size}")
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.height, self.width = int(height), int(width)
        weight = torch.zeros(self.out_channels, self.in_channels, kernel_size, kernel_size,
                             dtype=torch.float64 if dtype is None else dtype, device=device)
        centre = kernel_size // 2
        if self.out_channels == self.in_channels:
            weight[:, :, centre, centre] = torch.eye(self.in_channels, dtype=weight.dtype)
        else:
            weight[:, :, centre, centre] = 1.0 / math.sqrt(self.in_channels)
        self.weight = nn.Parameter(weight)

    @property
    def in_features(self) -> int:
        return self.in_channels * self.height * self.width

    @property
    def out_features(self) -> int:
        return self.out_channels * self.height * self.width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x must have {self.in_features} = {self.in_channels}x{self.height}x{self.width} "
                             f"features in its last axis, got {tuple(x.shape)}")
        lead = x.shape[:-1]
        images = x.reshape(-1, self.in_channels, self.height, self.width)
        out = F.conv2d(images, self.weight, padding=self.weight.shape[-1] // 2)
        return out.reshape(lead + (self.out_features,))

    def extra_repr(self) -> str:
        return (f"{self.in_channels}x{self.height}x{self.width} -> {self.out_channels}x{self.height}x{self.width}, "
                f"kernel {self.weight.shape[-1]}x{self.weight.shape[-1]}")
