"""Weights: synthetic (counter-based, reproducible on the GPU) and safetensors checkpoints.

A weight set is a dict name -> numpy array in the *stored* form of its spec's storage:
bf16 as uint16 bits, e4m3 as uint8 codes, e2m1x2 as uint8 bytes (two codes, low nibble first),
f32 as float32."""

STORAGE_DTYPES = {"bf16": "uint16", "f32": "float32", "e4m3": "uint8", "e2m1x2": "uint8", "i32": "int32"}
