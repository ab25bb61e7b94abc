"""Make ``converter_cnn.tflite``: a small int8 CNN written by TensorFlow's own TFLite converter.

The fuzz tests of issue 34 mutate a *converter-made* file (not one from bpfree's writer), so
that every byte layout the converter produces (its flatbuffer field order, signature defs,
metadata, buffer alignment, per-channel quantization, the MEAN of global pooling) is flipped.
The file is committed; this script records how it was made. TensorFlow is not a dependency
of bpfree: run it in a separate environment,

    python -m venv /tmp/tf && /tmp/tf/bin/pip install tensorflow-cpu
    /tmp/tf/bin/python tests/data/make_converter_cnn.py

Random weights (seed 0) and a random representative set: the fuzz needs the converter's
structure, not a trained model. The graph is the MCUNet / MobileNetV2 pattern in miniature:
a stride-2 3x3 conv, an inverted-residual block with a residual ADD (1x1 expand, 3x3
depthwise, 1x1 project), global average pooling and a dense classifier, ReLU6 throughout,
int8 input and output.
"""

from pathlib import Path

import numpy as np
import tensorflow as tf

OUT = Path(__file__).with_name("converter_cnn.tflite")


def build() -> tf.keras.Model:
    tf.keras.utils.set_random_seed(0)
    L = tf.keras.layers
    x = L.Input((16, 16, 3), batch_size=1, name="x")
    h = L.Conv2D(8, 3, strides=2, padding="same", activation="relu6")(x)
    b = L.Conv2D(16, 1, activation="relu6")(h)
    b = L.DepthwiseConv2D(3, padding="same", activation="relu6")(b)
    b = L.Conv2D(8, 1)(b)
    h = L.Add()([h, b])
    h = L.GlobalAveragePooling2D()(h)
    y = L.Dense(10)(h)
    return tf.keras.Model(x, y)


def convert(model: tf.keras.Model) -> bytes:
    rng = np.random.default_rng(0)

    def representative():
        for _ in range(32):
            yield [rng.uniform(-1, 1, (1, 16, 16, 3)).astype(np.float32)]

    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = representative
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = tf.int8
    conv.inference_output_type = tf.int8
    return conv.convert()


if __name__ == "__main__":
    data = convert(build())
    OUT.write_bytes(data)
    print(f"{OUT}: {len(data)} bytes, TensorFlow {tf.__version__}")
