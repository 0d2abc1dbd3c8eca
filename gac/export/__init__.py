"""``gac export``: a model gac loads (a gac checkpoint above all) as files serving engines run, each checked in its
engine before it counts as written.

* :mod:`.expressible` — which formats can hold a model, decided from its structure before any work;
* :mod:`.engines` — the packages each format needs (the ``gac[engines]`` extra);
* :mod:`.onnx` — an ONNX graph for onnxruntime (any checkpoint);
* :mod:`.gguf` — a GGUF file for llama.cpp (Llama-family models, pruned widths included), f32, f16 or quantized;
* :mod:`.hf` — a plain Hugging Face folder transformers loads without gac (what its configs can express).
"""
