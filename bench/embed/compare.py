#!/usr/bin/env python3
"""all-MiniLM-L6-v2 through sentence-transformers (PyTorch, CPU) and through
fastembed (onnxruntime), on the texts `fanfold bench embed` embedded, from the
same local model files (no model hub): texts/s, and each text's cosine against
fanfold's vector.

    python compare.py --texts T.jsonl --vectors V.f32 --model-dir DIR \
        --max-tokens 256 --threads 2 --out result.json

T.jsonl holds one JSON string per line; V.f32 is fanfold's vectors, float32
little-endian, one row of `dim` per text. `fanfold bench embed` runs this
script itself when FANFOLD_EMBED_COMPARE_PYTHON names a Python with the
packages (see bench/embed/README.md); it is not part of any test run.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np


def cosines(vectors, reference):
    a = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    b = reference / np.linalg.norm(reference, axis=1, keepdims=True)
    c = np.sum(a * b, axis=1)
    return {"min": float(c.min()), "mean": float(c.mean())}


def run_sentence_transformers(texts, model_dir, max_tokens, threads, batch):
    import torch
    from sentence_transformers import SentenceTransformer, models

    torch.set_num_threads(threads)
    word = models.Transformer(model_dir, max_seq_length=max_tokens)
    pooling = models.Pooling(word.get_word_embedding_dimension(), "mean")
    model = SentenceTransformer(modules=[word, pooling, models.Normalize()], device="cpu")
    model.encode(texts[:batch], batch_size=batch)  # warm-up, not timed
    started = time.perf_counter()
    vectors = model.encode(texts, batch_size=batch, convert_to_numpy=True)
    seconds = time.perf_counter() - started
    return vectors, seconds, f"torch {torch.__version__}"


def export_onnx(model_dir, out_dir):
    """The same safetensors weights, exported once to ONNX for onnxruntime."""
    import torch
    from transformers import AutoModel

    bert = AutoModel.from_pretrained(model_dir).eval()

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
            ).last_hidden_state

    model = Encoder().eval()
    ids = torch.ones((2, 16), dtype=torch.long)
    path = os.path.join(out_dir, "model.onnx")
    axes = {0: "batch", 1: "sequence"}
    torch.onnx.export(
        model,
        (ids, torch.ones_like(ids), torch.zeros_like(ids)),
        path,
        input_names=["input_ids", "attention_mask", "token_type_ids"],
        output_names=["last_hidden_state"],
        dynamic_axes={
            "input_ids": axes,
            "attention_mask": axes,
            "token_type_ids": axes,
            "last_hidden_state": axes,
        },
        opset_version=17,
        dynamo=False,
    )
    return path


def run_fastembed(texts, model_dir, onnx_dir, max_tokens, threads, batch):
    import fastembed
    from fastembed import TextEmbedding
    from fastembed.common.model_description import ModelSource, PoolingType

    for name in ("tokenizer.json", "config.json"):
        shutil.copy(os.path.join(model_dir, name), onnx_dir)
    with open(os.path.join(onnx_dir, "special_tokens_map.json"), "w") as f:
        json.dump({"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                   "unk_token": "[UNK]", "mask_token": "[MASK]"}, f)
    with open(os.path.join(onnx_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"model_max_length": max_tokens, "do_lower_case": True}, f)
    name = "local/all-MiniLM-L6-v2"
    TextEmbedding.add_custom_model(
        model=name,
        pooling=PoolingType.MEAN,
        normalization=True,
        sources=ModelSource(hf=name),
        dim=384,
        model_file="model.onnx",
    )
    model = TextEmbedding(model_name=name, specific_model_path=onnx_dir, threads=threads)
    list(model.embed(texts[:batch], batch_size=batch))  # warm-up, not timed
    started = time.perf_counter()
    vectors = np.array(list(model.embed(texts, batch_size=batch)))
    seconds = time.perf_counter() - started
    import onnxruntime

    return vectors, seconds, f"fastembed {fastembed.__version__}, onnxruntime {onnxruntime.__version__}"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--texts", required=True)
    p.add_argument("--vectors", required=True)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    with open(a.texts) as f:
        texts = [json.loads(line) for line in f]
    reference = np.fromfile(a.vectors, dtype="<f4").reshape(len(texts), -1)
    results = {}

    def attempt(label, fn):
        try:
            vectors, seconds, version = fn()
            results[label] = {
                "version": version,
                "seconds": seconds,
                "texts_per_s": len(texts) / seconds,
                "cosine": cosines(np.asarray(vectors, dtype=np.float64), reference),
            }
        except Exception as e:  # reported in the section, not hidden
            traceback.print_exc()
            results[label] = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
        print(label, results[label], file=sys.stderr, flush=True)

    attempt("sentence-transformers",
            lambda: run_sentence_transformers(texts, a.model_dir, a.max_tokens, a.threads, a.batch))
    with tempfile.TemporaryDirectory() as onnx_dir:
        def fast():
            export_onnx(a.model_dir, onnx_dir)
            return run_fastembed(texts, a.model_dir, onnx_dir, a.max_tokens, a.threads, a.batch)
        attempt("fastembed", fast)
    with open(a.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
