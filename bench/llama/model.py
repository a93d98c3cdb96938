#!/usr/bin/env python3
"""Writes a small llama-architecture model with random weights as GGUF.

The tokenizer is a real one: the vocabulary-only GGUF files in llama.cpp's
tree (models/ggml-vocab-*.gguf) carry it, so prompts tokenize as they would
on a real model of that family, and prefix blocks fall where they would.
The weights are random (seeded), so answers are noise; prefill cost, the KV
cache, prompt caching across slots, /metrics and usage are the engine's own.

    model.py VOCAB.gguf OUT.gguf [--layers 4] [--dim 256] [--ff 1024] [--heads 4]
"""
import argparse

import gguf
import numpy as np

COPIED = ("tokenizer.ggml.",)


def copy_tokenizer(reader, writer):
    """Copies every tokenizer.* field of the vocabulary file."""
    for name, field in reader.fields.items():
        if not name.startswith(COPIED):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            sub = field.types[1]
            if sub == gguf.GGUFValueType.STRING:
                values = [bytes(field.parts[i]).decode("utf-8", "surrogateescape") for i in field.data]
            else:
                values = [field.parts[i].tolist()[0] for i in field.data]
            writer.add_array(name, values)
        elif kind == gguf.GGUFValueType.STRING:
            writer.add_string(name, bytes(field.parts[field.data[0]]).decode())
        else:
            value = field.parts[field.data[0]].tolist()[0]
            writer.add_key_value(name, value, kind)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("vocab")
    p.add_argument("out")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--ff", type=int, default=1024)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--context", type=int, default=32768)
    p.add_argument("--seed", type=int, default=7)
    a = p.parse_args()

    reader = gguf.GGUFReader(a.vocab)
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    rng = np.random.default_rng(a.seed)

    def weights(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)

    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name("magpie-random")
    w.add_context_length(a.context)
    w.add_embedding_length(a.dim)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(a.ff)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.heads)
    w.add_rope_dimension_count(a.dim // a.heads)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    copy_tokenizer(reader, w)

    w.add_tensor("token_embd.weight", weights(vocab, a.dim))
    w.add_tensor("output_norm.weight", np.ones(a.dim, dtype=np.float32))
    for i in range(a.layers):
        blk = f"blk.{i}."
        w.add_tensor(blk + "attn_norm.weight", np.ones(a.dim, dtype=np.float32))
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(blk + part + ".weight", weights(a.dim, a.dim))
        w.add_tensor(blk + "ffn_norm.weight", np.ones(a.dim, dtype=np.float32))
        w.add_tensor(blk + "ffn_gate.weight", weights(a.ff, a.dim))
        w.add_tensor(blk + "ffn_up.weight", weights(a.ff, a.dim))
        w.add_tensor(blk + "ffn_down.weight", weights(a.dim, a.ff))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
