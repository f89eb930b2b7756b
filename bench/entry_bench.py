"""Ways into an INT8 region through float data movement, on a GPU with TensorRT 8.6: which one stops the Q.

The float-entry rule leaves such a region float because TensorRT 8.6 moves a QuantizeLinear on float data
movement back to the fork (``edgeq rules float-entry``). This bench tries ways to keep the region INT8 with
the Q where the implicit engine quantizes (right before the convolutions), on the mirror without the rule
(``mirror-nofe``; ``static-clip`` from ``static-nofe``), at every QuantizeLinear lint names ``float-entry``:

- ``mirror-split``: one Q/DQ pair per reader, so the quantized tensor is itself a fork;
- ``mirror-clip``: ``Clip(x, -128 s, 127 s)`` before the Q (exact: the Q clamps there anyway), a layer that
  can write INT8;
- ``mirror-mul``: ``Mul(x, 1)`` before the Q, the same with a plain PointWise op.

All timed in alternating rounds against the implicit engine of the same lease, with ``mirror`` and
``static`` (the rule). Prints ``region_bench``'s lines::

    LD_LIBRARY_PATH=/opt/trt86/lib:/opt/trt86/stubs \\
        python bench/entry_bench.py --trtexec /opt/trt86/bin/trtexec --work /tmp/eb --budget 540

Resumable like ``zoo_bench``. Needs a GPU and TensorRT 8.6; no test runs it.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import region_bench as rb
import zoo_bench as zb

VARIANTS = ("implicit", "mirror", "mirror-split", "mirror-clip", "mirror-mul", "static", "static-clip")
ANCHORED = {"mirror-split": ("mirror-nofe", "split"), "mirror-clip": ("mirror-nofe", "clip"),
            "mirror-mul": ("mirror-nofe", "mul"), "static-clip": ("static-nofe", "clip")}


def entry_qs(graph):  # type: ignore[no-untyped-def]
    """The QuantizeLinear nodes lint names ``float-entry`` (a layer of their own)."""
    from edgeq.graph.trt86.regions import lint_float_entry

    by_name = {n.name: n for n in graph.nodes}
    return [by_name[h.nodes[0]] for h in lint_float_entry(graph, [], None)]  # type: ignore[arg-type]


def anchor(src: Path, dst: Path, how: str) -> int:
    """``src`` with every float-entry Q anchored ``how``; the number anchored."""
    import numpy as np
    import onnx
    import onnx_graphsurgeon as gs

    graph = gs.import_onnx(onnx.load(str(src)))
    qs = entry_qs(graph)
    for k, q in enumerate(qs):
        x, scale, zp = q.inputs[0], q.inputs[1], q.inputs[2]
        if how == "split":
            dqs = list(q.outputs[0].outputs)
            readers = [(dq, r) for dq in dqs for r in list(dq.outputs[0].outputs)]
            for j, (dq, r) in enumerate(readers[1:]):
                qo = gs.Variable(f"{q.name}_split{j}_q", dtype=np.int8, shape=x.shape)
                do = gs.Variable(f"{q.name}_split{j}_dq", dtype=np.float32, shape=x.shape)
                graph.nodes += [gs.Node("QuantizeLinear", f"{q.name}_split{j}", inputs=[x, scale, zp],
                                        outputs=[qo]),
                                gs.Node("DequantizeLinear", f"{q.name}_split{j}_DQ", inputs=[qo, scale, zp],
                                        outputs=[do])]
                r.inputs = [do if t is dq.outputs[0] else t for t in r.inputs]
        else:
            y = gs.Variable(f"{q.name}_anchor", dtype=np.float32, shape=x.shape)
            if how == "clip":
                s = float(np.asarray(scale.values))
                lo = gs.Constant(f"{q.name}_anchor_min", np.array(-128 * s, dtype=np.float32))
                hi = gs.Constant(f"{q.name}_anchor_max", np.array(127 * s, dtype=np.float32))
                graph.nodes.append(gs.Node("Clip", f"{q.name}_anchor_clip", inputs=[x, lo, hi], outputs=[y]))
            else:
                one = gs.Constant(f"{q.name}_anchor_one", np.array(1.0, dtype=np.float32))
                graph.nodes.append(gs.Node("Mul", f"{q.name}_anchor_mul", inputs=[x, one], outputs=[y]))
            q.inputs[0] = y
        print(f"{how} {k}: {q.name} ({x.name})")
    graph.cleanup().toposort()
    tmp = dst.with_suffix(".tmp")
    dst.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(gs.export_onnx(graph), str(tmp))
    tmp.replace(dst)
    return len(qs)


class Model(rb.Model):
    placements = VARIANTS

    def steps(self) -> list[zb.Step]:
        anchored = [zb.Step(f"quantize-{p}", self.name, "cpu", 20, (f"quantize-{src}",), self.q(p).is_file,
                            lambda p=p, src=src, how=how: self.anchored(p, src, how))
                    for p, (src, how) in ANCHORED.items()]
        return self.placed_steps() + anchored + self.engine_steps()

    def anchored(self, placement: str, src: str, how: str) -> None:
        n = anchor(self.q(src), self.q(placement), how)
        (self.dir / f"anchor.{placement}.txt").write_text(f"{n}\n")


if __name__ == "__main__":
    sys.exit(rb.main(Model, VARIANTS, "entry_bench", rounds=5, duration=3))
