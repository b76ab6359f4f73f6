"""Built-in architectures, built with random weights (nothing is downloaded)."""

from __future__ import annotations

from mxq.errors import UserError
from mxq.tasks.runtimes.mx import gluon

nn = gluon.nn
vision = gluon.model_zoo.vision


class ArchError(UserError):
    """An unknown architecture, or an input shape it cannot take."""


def _mlp(classes: int) -> gluon.HybridBlock:
    net = nn.HybridSequential()
    net.add(nn.Dense(128, activation="relu"), nn.Dense(64, activation="relu"), nn.Dense(classes))
    return net


def _lenet(classes: int) -> gluon.HybridBlock:
    """LeNet-style: two conv/pool stages (3x3, padded, so 8x8 digits fit), two dense layers."""
    net = nn.HybridSequential()
    net.add(nn.Conv2D(20, 3, padding=1, activation="relu"), nn.MaxPool2D(2),
            nn.Conv2D(50, 3, padding=1, activation="relu"), nn.MaxPool2D(2),
            nn.Flatten(), nn.Dense(128, activation="relu"), nn.Dense(classes))
    return net


def _resnet18(classes: int) -> gluon.HybridBlock:
    return vision.get_model("resnet18_v1", classes=classes, pretrained=False)


ARCHS = {"mlp": _mlp, "lenet": _lenet, "resnet18_v1": _resnet18}
# The smallest (H, W) each convolutional architecture accepts.
MIN_SIDE = {"lenet": 4, "resnet18_v1": 32}


def check_shape(arch: str, input_shape: tuple[int, ...]) -> None:
    if arch not in ARCHS:
        raise ArchError(f"unknown architecture {arch!r}; built-in: {', '.join(ARCHS)}")
    if any(d < 1 for d in input_shape) or not input_shape:
        raise ArchError(f"input shape {input_shape} must be positive sizes, e.g. 64 or 1,8,8")
    if arch in MIN_SIDE:
        side = MIN_SIDE[arch]
        if len(input_shape) != 3 or min(input_shape[1:]) < side:
            raise ArchError(f"{arch} takes images C,H,W with H and W at least {side}; "
                            f"got input shape {','.join(map(str, input_shape))}")
        if arch == "resnet18_v1" and input_shape[0] != 3:
            raise ArchError(f"resnet18_v1 takes 3-channel images; got {input_shape[0]} channels")


def build(arch: str, classes: int, input_shape: tuple[int, ...]) -> gluon.HybridBlock:
    check_shape(arch, input_shape)
    if classes < 2:
        raise ArchError(f"classes must be at least 2 (got {classes})")
    return ARCHS[arch](classes)
