"""mmdetection's PAFPN with `act_cfg=dict(type='ReLU')`: every ConvModule ends in a ReLU, and the
bottom-up path adds in place, `inter_outs[i + 1] += self.downsample_convs[i](inter_outs[i])`, into the
output of an fpn_conv, which ReLU saved, so training raises in backward. The fixing PR rewrote the in-place
sums out of place. The top-down `laterals[i - 1] += F.interpolate(...)` of the same forward is shown in its
fixed form here (crash_21 has it as the culprit) so that the file has a single culprit; ConvModule is
Conv2d followed by ReLU.

Source: https://github.com/open-mmlab/mmdetection/pull/9450
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

KIND = "crash"
FIXABLE = True
SOURCE = "https://github.com/open-mmlab/mmdetection/pull/9450"


def conv_module(in_channels: int, out_channels: int, kernel_size: int, stride: int = 1) -> nn.Sequential:
    padding = kernel_size // 2
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding), nn.ReLU())


class PAFPN(nn.Module):
    def __init__(self, in_channels: list[int], out_channels: int) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.lateral_convs = nn.ModuleList([conv_module(c, out_channels, 1) for c in in_channels])
        self.fpn_convs = nn.ModuleList([conv_module(out_channels, out_channels, 3) for _ in in_channels])
        self.downsample_convs = nn.ModuleList()
        self.pafpn_convs = nn.ModuleList()
        for _ in range(1, len(in_channels)):
            self.downsample_convs.append(conv_module(out_channels, out_channels, 3, stride=2))
            self.pafpn_convs.append(conv_module(out_channels, out_channels, 3))

    def forward(self, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        assert len(inputs) == len(self.in_channels)

        # build laterals
        laterals = [lateral_conv(inputs[i]) for i, lateral_conv in enumerate(self.lateral_convs)]

        # build top-down path
        used_backbone_levels = len(laterals)
        for i in range(used_backbone_levels - 1, 0, -1):
            prev_shape = laterals[i - 1].shape[2:]
            laterals[i - 1] = laterals[i - 1] + F.interpolate(laterals[i], size=prev_shape, mode="nearest")

        # build outputs
        # part 1: from original levels
        inter_outs = [self.fpn_convs[i](laterals[i]) for i in range(used_backbone_levels)]

        # part 2: add bottom-up path
        for i in range(0, used_backbone_levels - 1):
            inter_outs[i + 1] += self.downsample_convs[i](inter_outs[i])  # CULPRIT

        outs = []
        outs.append(inter_outs[0])
        outs.extend([self.pafpn_convs[i - 1](inter_outs[i]) for i in range(1, used_backbone_levels)])
        return tuple(outs)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.neck = PAFPN([2, 3], 2)

    def forward(self, c3: torch.Tensor, c4: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.neck((c3, c4))


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(1, 2, 8, 8, generator=g), torch.randn(1, 3, 4, 4, generator=g))
