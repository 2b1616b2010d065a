"""Where one model replica's bytes live after a scenario's transforms, for the memory model.

A scenario's transforms change what one GPU holds: ``tensor_parallel`` t and
``pipeline_parallel`` p spread the weights and the KV cache over t·p GPUs; ``pim_offload`` moves
the offloaded weights, and with decode attention the KV cache, into PIM stacks beside each GPU;
``gpu`` puts the replica on another GPU (its memory); ``precision`` stores the weights in fewer
bytes (fp8, int8, int4 weight-only).
Each transform says so in :meth:`~whatif.transforms.base.Transform.placement`, folded over a
scenario by :func:`whatif.transforms.scenario.scenario_placement`; the memory model
(:func:`~whatif.transforms.parallel.memory.kv_capacity_tokens`) turns it into KV capacity.

>>> Placement().spread(tensor=8).spread(pipeline=2).label()
'tensor 8 x pipeline 2'
>>> Placement().kv_in(80e9, "attacc PIM stacks").label()
'KV in 80 GB of attacc PIM stacks per GPU'
>>> Placement().weights_out(8e9).spread(tensor=8).weights_moved_bytes   # moved before the split: 1/8 each
1000000000.0
>>> Placement().on("H200").weights_scaled(0.5).label()
'on H200, weights at 0.5x their recorded bytes'
>>> Placement().weights_out(8e9).weights_scaled(0.5).weights_moved_bytes   # fp8 after moving them: half
4000000000.0
"""
from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Placement:
    """``tensor`` × ``pipeline`` GPUs hold one replica; per GPU, ``kv_home_bytes`` of a memory
    beside it (``kv_home``, e.g. PIM stacks) hold the KV cache (0: the GPU's HBM does), and
    ``weights_moved_bytes`` of its weights live outside its HBM. ``device``: the catalog GPU each
    rank is ('' = the recorded one); ``weights_scale``: the weights' bytes over the recorded ones
    (a lower-precision storage)."""

    tensor: int = 1
    pipeline: int = 1
    kv_home_bytes: float = 0.0
    kv_home: str = ""
    weights_moved_bytes: float = 0.0
    device: str = ""
    weights_scale: float = 1.0

    def spread(self, *, tensor: int = 1, pipeline: int = 1) -> Placement:
        """The replica spread over ``tensor`` × ``pipeline`` times as many GPUs (each holds that
        much less of what was moved out of HBM before)."""
        return replace(self, tensor=self.tensor * tensor, pipeline=self.pipeline * pipeline,
                       weights_moved_bytes=self.weights_moved_bytes / (tensor * pipeline))

    @property
    def kv_outside_hbm(self) -> bool:
        """Whether the KV cache lives beside the GPU (``kv_in``), even in no bytes."""
        return bool(self.kv_home)

    def kv_in(self, nbytes: float, where: str) -> Placement:
        """The KV cache held in ``nbytes`` per GPU of ``where`` instead of HBM."""
        return replace(self, kv_home_bytes=float(nbytes), kv_home=where)

    def weights_out(self, nbytes: float) -> Placement:
        """``nbytes`` more of each GPU's weights held outside its HBM."""
        return replace(self, weights_moved_bytes=self.weights_moved_bytes + float(nbytes))

    def on(self, device: str) -> Placement:
        """The replica on ``device`` (a catalog name) instead."""
        return replace(self, device=str(device))

    def weights_scaled(self, factor: float) -> Placement:
        """The weights stored in ``factor`` × their bytes (of what they were before), those moved out
        of HBM before too."""
        return replace(self, weights_scale=self.weights_scale * float(factor),
                       weights_moved_bytes=self.weights_moved_bytes * float(factor))

    def label(self) -> str:
        parts = [f"on {self.device}"] if self.device else []
        if self.tensor > 1 or self.pipeline > 1:
            parts.append(f"tensor {self.tensor} x pipeline {self.pipeline}")
        if self.kv_outside_hbm:
            parts.append(f"KV in {self.kv_home_bytes / 1e9:.0f} GB of {self.kv_home} per GPU")
        if self.weights_moved_bytes > 0:
            parts.append(f"{self.weights_moved_bytes / 1e9:.1f} GB of weights outside HBM per GPU")
        if self.weights_scale != 1.0:
            parts.append(f"weights at {self.weights_scale:.3g}x their recorded bytes")
        return ", ".join(parts) or "one GPU"
