"""Convolutional training workloads: ResNet-50/152, VGG-19, ShuffleNetV2 (ImageNet, 224x224).

Work per op follows from the layer shapes: a convolution of ``ci -> co`` channels with a ``k x k``
kernel over an ``ho x wo`` output costs ``2 N ho wo co ci k^2 / groups`` FLOPs. FP16 tensors.
"""

from __future__ import annotations

from opdvfs.workloads._oplist import OpList, backward_of, to_frame
from opdvfs.workloads.workload import Workload

__all__ = ["resnet", "shufflenetv2", "vgg19"]

B = 2


class _Net:
    """Tracks the activation shape while appending conv / norm / activation ops."""

    def __init__(self, batch: int, channels: int = 3, size: int = 224) -> None:
        self.o = OpList()
        self.n, self.c, self.hw = batch, channels, size
        self.params: list[tuple[str, int]] = []

    def _act(self, c: int | None = None, hw: int | None = None) -> int:
        return self.n * (c or self.c) * (hw or self.hw) ** 2

    def conv(self, name: str, co: int, k: int, stride: int = 1, groups: int = 1) -> None:
        ho = max(1, self.hw // stride)
        w = co * (self.c // groups) * k * k
        flops = 2 * self.n * ho * ho * co * (self.c // groups) * k * k
        self.o.add(name, "Conv2D", flops=flops, ld=(self._act() + w) * B, st=self._act(co, ho) * B)
        self.params.append((name, w))
        self.c, self.hw = co, ho

    def bn(self, name: str, relu: bool = True) -> None:
        a = self._act()
        self.o.add(name, "BNTraining", flops=8 * a, ld=a * B, st=a * B)
        self.params += [(f"{name}_gamma", self.c), (f"{name}_beta", self.c)]
        if relu:
            self.o.add(name.replace("bn", "relu"), "Relu", flops=a, ld=a * B, st=a * B)

    def add(self, name: str) -> None:
        a = self._act()
        self.o.add(name, "Add", flops=a, ld=2 * a * B, st=a * B)

    def pool(self, name: str, kind: str, k: int, stride: int) -> None:
        ho = max(1, self.hw // stride)
        self.o.add(
            name,
            kind,
            flops=self._act(self.c, ho) * k * k,
            ld=self._act() * B,
            st=self._act(self.c, ho) * B,
        )
        self.hw = ho

    def fc(self, name: str, out: int) -> None:
        features = self.c * self.hw * self.hw
        self.o.add(
            name,
            "MatMul",
            flops=2 * self.n * features * out,
            ld=(self.n * features + features * out) * B,
            st=self.n * out * B,
        )
        self.params.append((name, features * out))
        self.c, self.hw = out, 1

    def loss(self) -> None:
        self.o.add(
            "cross_entropy",
            "CrossEntropy",
            flops=5 * self.n * self.c,
            ld=self.n * self.c * B,
            st=self.n * 4,
        )

    def workload(self, name: str, description: str) -> Workload:
        fwd = self.o.ops
        opt = OpList()
        total = sum(n for _, n in self.params)
        opt.add(
            "grad_allreduce",
            "AllReduce",
            ld=total * B,
            st=total * B,
            stream="comm",
            phase="optimizer",
        )
        for pname, n in self.params:
            # SGD with momentum: reads weight, grad, momentum (fp32); writes weight, momentum.
            opt.add(
                f"{pname}.sgd",
                "Mul",
                flops=4 * n,
                ld=n * (B + B + 4),
                st=n * (B + 4),
                phase="optimizer",
            )
        meta = {"description": description, "batch": self.n, "params": total}
        return Workload(to_frame(fwd + backward_of(fwd) + opt.ops), name=name, meta=meta)


def resnet(depth: int, batch: int = 64) -> Workload:
    """Build a ResNet-50/101/152 training step (bottleneck blocks [3,4,6,3] ... [3,8,36,3])."""
    blocks = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}[depth]
    net = _Net(batch)
    net.conv("conv1", 64, 7, stride=2)
    net.bn("bn1")
    net.pool("maxpool", "MaxPool", 3, 2)
    for stage, (count, width) in enumerate(zip(blocks, (64, 128, 256, 512), strict=True)):
        for b in range(count):
            p = f"layer{stage + 1}.{b}."
            stride = 2 if (b == 0 and stage > 0) else 1
            c_in, hw_in = net.c, net.hw
            net.conv(p + "conv1", width, 1)
            net.bn(p + "bn1")
            net.conv(p + "conv2", width, 3, stride=stride)
            net.bn(p + "bn2")
            net.conv(p + "conv3", width * 4, 1)
            net.bn(p + "bn3", relu=False)
            if b == 0:
                c_out, hw_out = net.c, net.hw
                net.c, net.hw = c_in, hw_in
                net.conv(p + "downsample", width * 4, 1, stride=stride)
                net.bn(p + "downsample_bn", relu=False)
                net.c, net.hw = c_out, hw_out
            net.add(p + "residual")
            a = net._act()
            net.o.add(p + "relu", "Relu", flops=a, ld=a * B, st=a * B)
    net.pool("avgpool", "AvgPool", net.hw, net.hw)
    net.fc("fc", 1000)
    net.loss()
    return net.workload(f"resnet{depth}", f"ResNet-{depth} training, batch {batch}, 224x224")


def vgg19(batch: int = 64) -> Workload:
    """VGG-19 training step (16 conv + 3 fc layers)."""
    net = _Net(batch)
    # output channels of the 3x3 convs; 0 marks a 2x2 max-pool
    cfg: tuple[int, ...] = (64, 64, 0, 128, 128, 0, 256, 256, 256, 256, 0)
    cfg += (512, 512, 512, 512, 0) * 2
    i = 0
    for channels in cfg:
        if channels == 0:
            net.pool(f"pool{i}", "MaxPool", 2, 2)
            continue
        i += 1
        net.conv(f"conv{i}", channels, 3)
        a = net._act()
        net.o.add(f"relu{i}", "Relu", flops=a, ld=a * B, st=a * B)
    for j, out in enumerate((4096, 4096, 1000)):
        net.fc(f"fc{j + 1}", out)
        if j < 2:
            a = net._act()
            net.o.add(f"fc{j + 1}_relu", "Relu", flops=a, ld=a * B, st=a * B)
            net.o.add(f"fc{j + 1}_dropout", "Dropout", flops=2 * a, ld=a * B, st=a * (B + 1))
    net.loss()
    return net.workload("vgg19", f"VGG-19 training, batch {batch}, 224x224")


def shufflenetv2(batch: int = 128) -> Workload:
    """ShuffleNetV2 1.0x training step: stages of [4, 8, 4] units, channels 116/232/464."""
    net = _Net(batch)
    net.conv("conv1", 24, 3, stride=2)
    net.bn("bn1")
    net.pool("maxpool", "MaxPool", 3, 2)
    for stage, (units, ch) in enumerate(zip((4, 8, 4), (116, 232, 464), strict=True)):
        for u in range(units):
            p = f"stage{stage + 2}.{u}."
            down = u == 0
            half = ch // 2
            if not down:
                a = net._act()
                net.o.add(p + "split", "Split", ld=a * B, st=a * B)
                net.c = half
            else:
                c_in = net.c
            net.conv(p + "pw1", half, 1)
            net.bn(p + "bn1")
            net.conv(p + "dw", half, 3, stride=2 if down else 1, groups=half)
            net.bn(p + "bn2", relu=False)
            net.conv(p + "pw2", half, 1)
            net.bn(p + "bn3")
            if down:
                hw = net.hw
                net.c, net.hw = c_in, hw * 2
                net.conv(p + "branch_dw", c_in, 3, stride=2, groups=c_in)
                net.bn(p + "branch_bn1", relu=False)
                net.conv(p + "branch_pw", half, 1)
                net.bn(p + "branch_bn2")
            net.c = ch
            a = net._act()
            net.o.add(p + "concat", "Concat", ld=a * B, st=a * B)
            net.o.add(p + "shuffle", "ChannelShuffle", ld=a * B, st=a * B)
    net.conv("conv5", 1024, 1)
    net.bn("bn5")
    net.pool("avgpool", "AvgPool", net.hw, net.hw)
    net.fc("fc", 1000)
    net.loss()
    return net.workload("shufflenetv2", f"ShuffleNetV2 1.0x training, batch {batch}, 224x224")
